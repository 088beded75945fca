#!/usr/bin/env bash
# Build times as a newcomer meets them, for each build profile: from a fresh clone of
# this checkout with an empty cargo home (every crate downloaded) and an empty target
# directory, then again after one source file is touched.
#
#   release  `cargo run --release -- demo`, timed until the demo prints its last line
#            (the quickstart's first command: build, start, the lines to try)
#   dist     `cargo build --profile dist --bin tiergate` (what the container image,
#            the load-test scenarios and the instructions figure use)
#
#   loadtest/scenarios/build_times.sh [PROFILE...]      (default: release dist)
#
# Nothing else should run meanwhile. Writes $OUT (default
# target/loadtest/build_times)/summary.txt. The demo binds its usual ports (8000-8003,
# 9100, 9101); they must be free.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROFILES=("$@")
[ ${#PROFILES[@]} -gt 0 ] || PROFILES=(release dist)
OUT=${OUT:-$ROOT/${CARGO_TARGET_DIR:-target}/loadtest/build_times}
WORK=$(mktemp -d /var/tmp/tiergate-build-times.XXXXXX)
DEMO=
cleanup() {
  if [ -n "$DEMO" ]; then kill -TERM "$DEMO" 2>/dev/null || true; wait "$DEMO" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT"

# fresh NAME: a clone and an empty cargo home and target directory for NAME.
fresh() {
  git clone -q "$ROOT" "$WORK/$1"
  export CARGO_HOME=$WORK/$1-cargo-home CARGO_TARGET_DIR=$WORK/$1-target
  mkdir -p "$CARGO_HOME"
  cd "$WORK/$1"
}

# demo: seconds from `cargo run --release -- demo` until the demo prints its last line.
demo() {
  local start=$SECONDS
  cargo run --release --locked -- demo >"$WORK/demo.out" 2>"$WORK/demo.err" &
  DEMO=$!
  until grep -q "^Ctrl-C to stop" "$WORK/demo.out" 2>/dev/null; do
    if ! kill -0 "$DEMO" 2>/dev/null; then
      echo "the demo ended early:" >&2; tail -20 "$WORK/demo.err" >&2; exit 1
    fi
    sleep 0.2
  done
  local took=$((SECONDS - start))
  # `cargo run` replaces itself with the demo (exec), so $DEMO is the demo: stop it as
  # Ctrl-C would (and any child, should cargo have spawned it instead).
  stop_children "$DEMO"
  kill -TERM "$DEMO" 2>/dev/null || true
  wait "$DEMO" 2>/dev/null || true
  DEMO=
  echo "$took"
}

# stop_children PID: SIGTERM to PID's children (cargo's: the demo), by PID.
stop_children() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do kill -TERM "$child" 2>/dev/null || true; done
}

# built COMMAND...: seconds COMMAND takes.
built() {
  local start=$SECONDS
  "$@" >"$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log" >&2; exit 1; }
  echo $((SECONDS - start))
}

{
  echo "Build times from a fresh clone on $(nproc) cores ($(rustc --version))"
  for profile in "${PROFILES[@]}"; do
    fresh "$profile"
    case $profile in
      release)
        cold=$(demo)
        touch src/classify.rs
        warm=$(demo)
        echo "release: cargo run --release -- demo, ready in ${cold}s cold (downloads included), ${warm}s with one file touched"
        ;;
      dist)
        cold=$(built cargo build --profile dist --locked --bin tiergate)
        touch src/classify.rs
        warm=$(built cargo build --profile dist --locked --bin tiergate)
        echo "dist: cargo build --profile dist --bin tiergate, ${cold}s cold (downloads included), ${warm}s with one file touched"
        ;;
      *) echo "unknown profile $profile (release, dist)" >&2; exit 2 ;;
    esac
    cd "$ROOT"
  done
} | tee "$OUT/summary.txt"
