#!/usr/bin/env bash
# build-wheels.sh: build, on the host, the wheels that compose/Dockerfile installs.
#
# The broker image installs replog and its runtime dependencies with
# `pip install --no-index --find-links`, so its build needs no network (no registry, no
# TLS proxy, works the same in an air-gapped site) and no compiler. This script makes that
# wheel set from the current checkout, without the spark/dev extras:
#   replog (from pyproject.toml) and its dependencies (kazoo among them).
#
# Usage:  compose/build-wheels.sh [WHEEL_DIR]      (default: build/wheels/ at the repo root,
#         then: docker build -f compose/Dockerfile -t replog:latest .
#         build/ is gitignored; the root .dockerignore lets build/wheels/ into the context)
# Environment:
#   PYTHON       the interpreter whose pip builds the wheels (default: .venv/bin/python of
#                the checkout if it exists, else python3). It must be CPython of the image's
#                minor version, since binary wheels (pyzmq, msgpack, PyYAML) are per version.
#   IMAGE_PYTHON the image's Python minor version (default 3.11, as python:3.11-slim)
#   EXTRA_REQS   further requirements added to the set (default: none)
#
# The sources are copied to a temporary directory first: building in the checkout would
# write build/lib and *.egg-info there, and a stale build/lib can carry modules deleted
# since into the wheel.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/build/wheels}
IMAGE_PYTHON=${IMAGE_PYTHON:-3.11}
EXTRA_REQS=${EXTRA_REQS:-}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi

log() { printf '[build-wheels] %s\n' "$*"; }
T0=$SECONDS

have=$("$PYTHON" -c 'import sys, platform; print("%s %d.%d" % (platform.python_implementation(), *sys.version_info[:2]))')
if [ "$have" != "CPython $IMAGE_PYTHON" ]; then
  echo "$PYTHON is $have; the image runs CPython $IMAGE_PYTHON (set PYTHON=...)" >&2
  exit 1
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The project as pyproject.toml describes it: its metadata files and the top-level
# packages that [tool.setuptools.packages.find] include names (common*, master*, ...).
mkdir -p "$TMP/src"
"$PYTHON" - "$REPO" "$TMP/src" <<'PY'
import fnmatch, os, shutil, sys, tomllib
repo, dst = sys.argv[1:3]
with open(os.path.join(repo, "pyproject.toml"), "rb") as f:
    meta = tomllib.load(f)
find = meta.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
include = find.get("include", ["*"])
ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
for name in sorted(os.listdir(repo)):
    src = os.path.join(repo, name)
    if os.path.isdir(src) and any(fnmatch.fnmatch(name, p) for p in include):
        if os.path.exists(os.path.join(src, "__init__.py")):
            shutil.copytree(src, os.path.join(dst, name), ignore=ignore)
readme = meta.get("project", {}).get("readme")
files = ["pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "LICENSE", "LICENSE.txt"]
if isinstance(readme, str):
    files.append(readme)
for name in files:
    if os.path.isfile(os.path.join(repo, name)):
        shutil.copy2(os.path.join(repo, name), dst)
print("[build-wheels] sources:", " ".join(sorted(os.listdir(dst))))
PY

log "pip wheel with $PYTHON ($have) -> $OUT"
# shellcheck disable=SC2086  # EXTRA_REQS is a list of requirements
"$PYTHON" -m pip wheel --quiet --wheel-dir "$TMP/wheels" "$TMP/src" $EXTRA_REQS

# Replace the whole directory, so no wheel of an older build is left for pip to choose.
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
cp -r "$TMP/wheels" "$OUT"

# Binary wheels must be manylinux ones for this Python (a linux_* wheel was compiled here
# and is tied to this machine's libraries).
bad=$(find "$OUT" -name '*.whl' ! -name '*-none-any.whl' ! -name "*-cp${IMAGE_PYTHON/./}-*manylinux*" -printf '%f\n')
if [ -n "$bad" ]; then
  log "warning: wheels built on this machine, check they fit the image: $bad"
fi
log "$(find "$OUT" -name '*.whl' | wc -l) wheels, $(du -sh "$OUT" | cut -f1), in $((SECONDS - T0)) s:"
find "$OUT" -name '*.whl' -printf '  %f\n' | sort
