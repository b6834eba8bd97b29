#!/usr/bin/env bash
# offline-images.sh: make the base images our Dockerfiles start FROM without Docker Hub.
#
# When to use it
#   On a machine whose Docker engine cannot pull from Docker Hub: an air-gapped site with
#   only a Debian mirror, or our own machines, where the package registries are the only
#   thing reachable. Where `docker pull python:3.11-slim` works, you do not need this
#   script: the official images are used as they are.
#
# What it makes (each skipped when an image with that tag already exists, unless --force)
#   python:3.11-slim   Debian bookworm (debootstrap --variant=minbase) with python3,
#                      python3-venv, python3-pip, ca-certificates (and passwd, for useradd),
#                      with bookworm-updates/-security applied, imported with
#                      `docker import`. As in the official image, `python3`, `python`,
#                      `pip`/`pip3`, `python3 -m pip` and `python3 -m venv` work, pip
#                      installs system-wide (PEP 668's EXTERNALLY-MANAGED marker is removed)
#                      and LANG=C.UTF-8. So compose/Dockerfile builds unchanged.
#   zookeeper:3.8      `docker build compose/zookeeper` FROM that local base: Debian's
#                      ZooKeeper 3.8 jars and a headless JRE, with an entrypoint that takes
#                      the official image's variables (ZOO_MY_ID, ZOO_SERVERS, ...). So a
#                      compose file naming `zookeeper:3.8` works whether that tag was pulled
#                      from Docker Hub or built here. Its build runs apt-get inside the build
#                      container against the same Debian mirror (plain HTTP, so no TLS proxy
#                      or CA question); set ZK_BUILD_NETWORK=host if containers on the
#                      bridge cannot reach the mirror.
#   Neither image needs any network at run time.
#
# Usage (as root; the Docker daemon must be running):
#   compose/offline-images.sh [--force] [--only base|zookeeper] [--mirror URL]
# Environment:
#   MIRROR           Debian mirror for debootstrap and for the images' apt sources
#                    (default: the one this machine's apt uses for bookworm; else
#                    http://deb.debian.org/debian). For an air-gapped site, its local mirror.
#   SECURITY_MIRROR  mirror of bookworm-security (default: the one this machine's apt uses,
#                    else derived from MIRROR for deb.debian.org); "none" to leave it out.
#   BASE_TAG         default python:3.11-slim        ZK_TAG   default zookeeper:3.8
#   CACHE_DIR        .deb cache reused by later runs (default /var/cache/replog-offline-images)
#   ZK_BUILD_NETWORK docker build --network for the ZooKeeper image (default: bridge;
#                    "host" if the bridge cannot reach the mirror)
#
# It is idempotent: run it again and it only prints that both images are there.
set -euo pipefail

SUITE=bookworm
BASE_TAG=${BASE_TAG:-python:3.11-slim}
ZK_TAG=${ZK_TAG:-zookeeper:3.8}
CACHE_DIR=${CACHE_DIR:-/var/cache/replog-offline-images}
ZK_BUILD_NETWORK=${ZK_BUILD_NETWORK:-}
# Packages of the Python base (their Depends come along; Recommends such as
# build-essential do not: debootstrap installs no Recommends, so there is no compiler).
BASE_PACKAGES=python3,python3-venv,python3-pip,ca-certificates,passwd
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

FORCE=0
ONLY=all
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --only) ONLY=${2:?--only needs base or zookeeper}; shift ;;
    --mirror) MIRROR=${2:?--mirror needs a URL}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$ONLY" in all|base|zookeeper) ;; *) echo "--only: base or zookeeper" >&2; exit 2 ;; esac

log() { printf '[offline-images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
# Run a step and print how long it took: timed "label" command args...
timed() {
  local label=$1 t0=$SECONDS; shift
  log "$label ..."
  "$@"
  log "$label: done in $((SECONDS - t0)) s"
}

[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap and chroot need it)" >&2; exit 1; }
command -v docker >/dev/null || { echo "no docker CLI (apt-get install docker.io)" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "the Docker daemon does not answer (start dockerd)" >&2; exit 1; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The mirror this machine's apt uses for a suite: deb822 *.sources first, then one-line lists.
apt_mirror_for() {
  local suite=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$suite" 'BEGIN { RS = ""; FS = "\n" }
      {
        types = uris = suites = ""
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^Types:/)  types  = " " substr($i, 7) " "
          if ($i ~ /^URIs:/)   uris   = substr($i, 6)
          if ($i ~ /^Suites:/) suites = " " substr($i, 8) " "
        }
        if (types ~ / deb / && suites ~ (" " suite " ")) {
          split(uris, u, " "); for (k in u) if (u[k] != "") { print u[k]; exit }
        }
      }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && cat "$f"
  done | sed -e 's/#.*//' -e 's/\[[^]]*\]//' \
    | awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2 }'
}

resolve_mirrors() {
  if [ -z "${MIRROR:-}" ]; then
    MIRROR=$(apt_mirror_for "$SUITE" | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
  fi
  MIRROR=${MIRROR%/}
  if [ -z "${SECURITY_MIRROR:-}" ]; then
    SECURITY_MIRROR=$(apt_mirror_for "$SUITE-security" | head -n1 || true)
    if [ -z "$SECURITY_MIRROR" ]; then
      case "$MIRROR" in
        */debian) SECURITY_MIRROR=${MIRROR}-security ;;
        *) SECURITY_MIRROR=none ;;
      esac
    fi
  fi
  SECURITY_MIRROR=${SECURITY_MIRROR%/}
  log "Debian mirror: $MIRROR  security: $SECURITY_MIRROR"
}

ensure_debootstrap() {
  if ! command -v debootstrap >/dev/null; then
    timed "installing debootstrap" sh -c \
      'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap'
  fi
}

ROOTFS=
cleanup() {
  if [ -n "$ROOTFS" ] && [ -d "$ROOTFS" ]; then
    umount "$ROOTFS/proc" 2>/dev/null || true
    rm -rf --one-file-system "$ROOTFS"
  fi
}
trap cleanup EXIT

in_root() { chroot "$ROOTFS" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive "$@"; }

# Apt sources, the security updates and the settings of Debian's own Docker images.
configure_rootfs() {
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' \
      "$MIRROR" "$SUITE" "$SUITE"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ "$SECURITY_MIRROR" != none ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' \
        "$SECURITY_MIRROR" "$SUITE"
      printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
  } >"$ROOTFS/etc/apt/sources.list.d/debian.sources"
  : >"$ROOTFS/etc/apt/sources.list"
  # No daemons started by package scripts in the chroot or in image builds.
  printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
  chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
  # As debian:bookworm-slim: no docs, man pages or translations from later installs,
  # apt caches cleaned after each install, no Recommends or Suggests.
  cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf 'Acquire::Languages "none";\n' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$ROOTFS/etc/apt/apt.conf.d/docker-no-recommends"

  mount -t proc proc "$ROOTFS/proc"
  local out=$CACHE_DIR/chroot-apt.log
  if ! { in_root apt-get update && in_root apt-get -y -o Dpkg::Use-Pty=0 dist-upgrade \
         && in_root apt-get clean; } >"$out" 2>&1; then
    tail -n 30 "$out" >&2
    echo "apt-get in the new root failed (whole log: $out)" >&2
    exit 1
  fi
  umount "$ROOTFS/proc"

  # pip installs system-wide as in the official image (whose Python is not Debian's).
  rm -f "${ROOTFS:?}"/usr/lib/python3*/EXTERNALLY-MANAGED
  # python and pip resolve as in the official image: /usr/local/bin first on PATH.
  ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
  [ -e "$ROOTFS/usr/bin/pip" ] || ln -sf /usr/bin/pip3 "$ROOTFS/usr/local/bin/pip"

  # What the image must not carry: the host's resolver and identity, caches, logs.
  find "$ROOTFS/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "${ROOTFS:?}"/usr/share/man/* "${ROOTFS:?}"/usr/share/info/* \
    "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/*.bin "${ROOTFS:?}"/var/cache/debconf/*-old \
    "${ROOTFS:?}"/var/log/*.log "${ROOTFS:?}"/var/log/apt/* "${ROOTFS:?}"/tmp/* "${ROOTFS:?}"/var/tmp/* \
    "${ROOTFS:?}"/dev/*
  find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  rm -f "$ROOTFS/etc/resolv.conf" "$ROOTFS/etc/hostname"
  : >"$ROOTFS/etc/machine-id"
}

run_debootstrap() {
  local out=$CACHE_DIR/debootstrap.log
  if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" \
      --cache-dir="$CACHE_DIR/debootstrap" "$SUITE" "$ROOTFS" "$MIRROR" >"$out" 2>&1; then
    tail -n 30 "$out" >&2
    echo "debootstrap failed (whole log: $out)" >&2
    exit 1
  fi
}

import_rootfs() {
  local pyver=$1
  tar -C "$ROOTFS" --numeric-owner -c . | docker import \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8" \
    --change "ENV PYTHON_VERSION=$pyver" \
    --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase, Python $pyver (replog compose/offline-images.sh)\"" \
    --change 'CMD ["python3"]' \
    -m "compose/offline-images.sh from $MIRROR" - "$BASE_TAG" >/dev/null
}

build_base() {
  if image_exists "$BASE_TAG" && [ "$FORCE" = 0 ]; then
    log "$BASE_TAG exists ($(docker image inspect -f '{{.Id}}' "$BASE_TAG" | cut -c8-19)): skipped (--force rebuilds it)"
    return
  fi
  local t0=$SECONDS
  ensure_debootstrap
  resolve_mirrors
  mkdir -p "$CACHE_DIR/debootstrap"
  ROOTFS=$(mktemp -d /var/tmp/replog-rootfs.XXXXXX)
  chmod 0755 "$ROOTFS"
  timed "debootstrap --variant=minbase $SUITE ($BASE_PACKAGES)" run_debootstrap
  timed "security updates and slim settings" configure_rootfs
  local pyver
  pyver=$(in_root python3 -c 'import platform; print(platform.python_version())')
  timed "docker import as $BASE_TAG (Python $pyver)" import_rootfs "$pyver"
  cleanup
  ROOTFS=
  # The same checks the Dockerfiles rely on.
  docker run --rm "$BASE_TAG" sh -ec '
    python3 -m pip --version >/dev/null; python -V >/dev/null; pip --version >/dev/null
    python3 -m venv /tmp/v && /tmp/v/bin/python -m pip --version >/dev/null
    ! command -v gcc && ! command -v cc' >/dev/null
  log "$BASE_TAG built in $((SECONDS - t0)) s: $(docker image ls --format '{{.Size}}' "$BASE_TAG")"
}

build_zookeeper() {
  if image_exists "$ZK_TAG" && [ "$FORCE" = 0 ]; then
    log "$ZK_TAG exists ($(docker image inspect -f '{{.Id}}' "$ZK_TAG" | cut -c8-19)): skipped (--force rebuilds it)"
    return
  fi
  image_exists "$BASE_TAG" || { echo "$BASE_TAG is missing: run without --only" >&2; exit 1; }
  local t0=$SECONDS args=()  # extra docker build arguments
  if [ -n "$ZK_BUILD_NETWORK" ]; then args+=(--network "$ZK_BUILD_NETWORK"); fi
  # --force means a fresh apt-get (new security updates), not the build cache's layer.
  if [ "$FORCE" = 1 ]; then args+=(--no-cache); fi
  timed "docker build $HERE/zookeeper -t $ZK_TAG (FROM $BASE_TAG)" \
    docker build "${args[@]}" --build-arg "BASE=$BASE_TAG" -t "$ZK_TAG" "$HERE/zookeeper"
  log "$ZK_TAG built in $((SECONDS - t0)) s: $(docker image ls --format '{{.Size}}' "$ZK_TAG")"
}

T0=$SECONDS
case "$ONLY" in
  all) build_base; build_zookeeper ;;
  base) build_base ;;
  zookeeper) build_zookeeper ;;
esac
log "finished in $((SECONDS - T0)) s"
docker image ls --format '  {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' \
  | grep -E "^  ($BASE_TAG|$ZK_TAG) " || true
