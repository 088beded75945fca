#!/usr/bin/env bash
# Builds tiergate's container image (deploy/Dockerfile) with podman, or docker when
# podman is missing, and prints its tag.
#
#   deploy/image.sh [TAG]                          a dist build (whole-program optimised) of this checkout, then the image
#   IMAGE_BINARY=path deploy/image.sh [TAG]        around a binary built already (the test uses its own)
#   IMAGE_BASE=image deploy/image.sh [TAG]         on another base (default debian:bookworm-slim)
#
# The image is built around a binary compiled here, from a small context (the
# Dockerfile, the binary, the demo policy), so the build needs no Rust image and no
# registry but the base's. TAG defaults to localhost/tiergate:latest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=${1:-localhost/tiergate:latest}
BINARY=${IMAGE_BINARY:-}
if [ -z "$BINARY" ]; then
  echo "building the dist binary (with Kafka support)" >&2
  (cd "$ROOT" && cargo build --profile dist --locked --features kafka --bin tiergate >&2)
  BINARY=${CARGO_TARGET_DIR:-$ROOT/target}/dist/tiergate
fi
[ -x "$BINARY" ] || { echo "deploy/image.sh: no executable at $BINARY" >&2; exit 2; }

CONTEXT=$(mktemp -d)
trap 'rm -rf "$CONTEXT"' EXIT
install -D -m 0755 "$BINARY" "$CONTEXT/prebuilt/tiergate"
install -D -m 0644 "$ROOT/policies/demo.toml" "$CONTEXT/policies/demo.toml"
install -m 0644 "$ROOT/deploy/Dockerfile" "$CONTEXT/Dockerfile"

args=(--build-arg BINARY=prebuilt -t "$TAG" -f "$CONTEXT/Dockerfile")
[ -n "${IMAGE_BASE:-}" ] && args+=(--build-arg "BASE=$IMAGE_BASE")
if command -v podman >/dev/null; then
  # Docker's image format keeps the HEALTHCHECK; runc and cgroupfs work on hosts without
  # systemd and with hybrid cgroups; the ulimits stay within this machine's hard limits.
  podman --runtime runc --cgroup-manager=cgroupfs build --format docker "${args[@]}" --network=host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$CONTEXT" >&2
else
  docker build "${args[@]}" "$CONTEXT" >&2
fi
echo "$TAG"
