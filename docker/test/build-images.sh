#!/usr/bin/env bash
# Build every image of the cpu profile without Docker Hub (as root, engine from engine.sh):
#
#   eval "$(docker/test/engine.sh start)"
#   docker/test/build-images.sh            # from the repository root
#
# 1. local/bookworm:base    debootstrap --variant=minbase bookworm, then `docker import`
# 2. local/python:3.11-bookworm-torch
#                           python3 + venv + the host's locally added CA certificates (outbound
#                           TLS may go through a proxy only they trust) + the host's torch CPU
#                           wheel from pip's find-links folder, with an image-wide pip.conf
# 3. mgrpo/<target>:TAG     docker/Dockerfile, build args only (PYTHON_IMAGE, TORCH_CPU_INDEX_URL)
# 4. local/postgres:bookworm, local/rabbitmq:bookworm
#                           PostgreSQL and RabbitMQ stand-ins (docker/test/postgres, rabbitmq)
#
# Steps 1-2 are skipped when their image exists; 3-4 rely on the build cache. Heavy steps run
# under `nice` (MGRPO_DEPLOY_NICE, default 15). Builds use the host network. Prints each step's
# time. What it does not do: build the CUDA targets (their torch comes from the PyTorch CUDA
# index; see docs/deploy.md).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${MGRPO_DEPLOY_CACHE:-/var/cache/mgrpo-deploy}
MIRROR=${MGRPO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NICE=(nice -n "${MGRPO_DEPLOY_NICE:-15}")
PYPI_INDEX=${MGRPO_DEPLOY_PYPI_INDEX:-https://pypi.org/simple}
TAG=${DEPLOY_IMAGE_TAG:-0.1.0}
TARGETS=${MGRPO_DEPLOY_TARGETS:-"sandbox migrate planner planner-worker control subagent trainer"}
BASE=local/bookworm:base
PYTHON=local/python:3.11-bookworm-torch

step() {  # name command...
  local t0=$SECONDS; echo "build: $1 ..." >&2
  shift; "$@"
  echo "build: done in $((SECONDS - t0)) s" >&2
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

base_image() {
  have_image "$BASE" && return
  local rootfs=$CACHE/rootfs
  rm -rf "$rootfs"
  "${NICE[@]}" debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | docker import - "$BASE" >/dev/null
  rm -rf "$rootfs"
}

torch_wheel() {  # the host's torch CPU wheel, from pip's find-links
  local links
  links=$(pip3 config get global.find-links 2>/dev/null || true)
  for dir in $links /opt/wheels; do
    ls "${dir#file://}"/torch-*+cpu-cp311-*.whl 2>/dev/null | head -1 && return
  done
}

python_image() {
  have_image "$PYTHON" && return
  local ctx=$CACHE/python-context wheel
  wheel=$(torch_wheel)
  [ -n "$wheel" ] || { echo "build: no torch CPU wheel in pip's find-links" >&2; exit 1; }
  rm -rf "$ctx" && mkdir -p "$ctx/certs" "$ctx/wheels"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/certs/" 2>/dev/null || true
  cp "$wheel" "$ctx/wheels/"
  cp "$ROOT/docker/test/python.Dockerfile" "$ctx/Dockerfile"
  "${NICE[@]}" docker build -q --network host --build-arg BASE="$BASE" -t "$PYTHON" "$ctx" >/dev/null
  rm -rf "$ctx"
}

project_images() {
  for target in $TARGETS; do
    "${NICE[@]}" docker build -q --network host -f "$ROOT/docker/Dockerfile" --target "$target" \
      --build-arg PYTHON_IMAGE="$PYTHON" --build-arg TORCH_CPU_INDEX_URL="$PYPI_INDEX" \
      -t "mgrpo/$target:$TAG" "$ROOT" >/dev/null
  done
}

stand_ins() {
  for name in postgres rabbitmq; do
    "${NICE[@]}" docker build -q --network host --build-arg BASE="$BASE" \
      -t "local/$name:bookworm" "$ROOT/docker/test/$name" >/dev/null
  done
}

step "base image $BASE (debootstrap)" base_image
step "python image $PYTHON" python_image
step "stand-ins local/postgres:bookworm local/rabbitmq:bookworm" stand_ins
step "project images ($TARGETS)" project_images
