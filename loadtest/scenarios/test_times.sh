#!/usr/bin/env bash
# How long the README's test command takes, as CI meets it: `.ci/run` on a fresh clone of
# this checkout, first cold (no cache of the project's outside the clone: build targets,
# tansu, cargo-fuzz, Python environments, the image's root file system; an empty cargo
# home, so every crate is downloaded), then warm (a fresh clone at the same path, every
# cache filled by the cold run).
#
#   loadtest/scenarios/test_times.sh             # cold, then warm
#   PACKAGES=remove loadtest/scenarios/test_times.sh
#       # also removes the Debian packages the suite installs first (redis-tools,
#       # prometheus, prometheus-alertmanager, podman, runc, catatonit, mmdebstrap), as a
#       # fresh machine lacks them, and pip's download cache is set aside meanwhile
#
# It deletes /var/tmp/tiergate-* (the caches the suite makes). Nothing else should run
# meanwhile. Writes $OUT (default target/loadtest/test_times)/summary.txt and each
# run's log beside it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/${CARGO_TARGET_DIR:-target}/loadtest/test_times}
WORK=$(mktemp -d /var/tmp/test-times.XXXXXX)
mkdir -p "$OUT"
pip_aside=
cleanup() {
  if [ -n "$pip_aside" ]; then mv "$pip_aside" "$HOME/.cache/pip" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

rm -rf /var/tmp/tiergate-*
if [ "${PACKAGES:-}" = remove ]; then
  apt-get remove -y -q redis-tools prometheus prometheus-alertmanager podman runc catatonit mmdebstrap \
    >"$OUT/apt-remove.log" 2>&1
  if [ -d "$HOME/.cache/pip" ]; then
    pip_aside=$WORK/pip-cache
    mv "$HOME/.cache/pip" "$pip_aside"
  fi
fi
export CARGO_HOME=$WORK/cargo-home
mkdir -p "$CARGO_HOME"

# run NAME: .ci/run on a fresh clone at $WORK/clone; prints its seconds.
run() {
  rm -rf "$WORK/clone"
  git clone -q "$ROOT" "$WORK/clone"
  local start=$SECONDS
  (cd "$WORK/clone" && .ci/run) >"$OUT/$1.log" 2>&1 || { tail -30 "$OUT/$1.log" >&2; exit 1; }
  echo $((SECONDS - start))
}

cold=$(run cold)
warm=$(run warm)
{
  echo "scripts/test (.ci/run) from a fresh clone on $(nproc) cores: ${cold}s cold, ${warm}s warm"
  grep -h '^tests:' "$OUT/warm.log"
} | tee "$OUT/summary.txt"
