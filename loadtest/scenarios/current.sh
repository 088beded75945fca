#!/usr/bin/env bash
# The current figures: runs every headline scenario once, as docs/performance.md states
# them, then writes the table at the top of docs/performance.md (between its
# `current:begin` and `current:end` markers) from their summaries
# (loadtest/scenarios/current.py). About an hour on 2 cores; nothing else should run.
#
#   loadtest/scenarios/current.sh            run everything, then write the table
#   loadtest/scenarios/current.sh --table    only rewrite the table from the last run
#
# Writes each scenario's results to $OUT/NAME (default target/loadtest/current).
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/current}
mkdir -p "$OUT"

run() { # NAME SCRIPT [ARGS...]: one scenario, its output kept beside its results
  local name=$1 script=$2
  shift 2
  echo "== $name: loadtest/scenarios/$script $*" >&2
  mkdir -p "$OUT/$name"
  date -u +%Y-%m-%d > "$OUT/$name/date"
  echo "loadtest/scenarios/$script $*" > "$OUT/$name/command"
  OUT="$OUT/$name" "loadtest/scenarios/$script" "$@" > "$OUT/$name/stdout.txt"
}

if [ "${1:-}" != "--table" ]; then
  run overhead overhead.sh 200 30s 6
  run instructions instructions_per_request.sh 500
  run micro_batch micro_batch.sh
  run isolation isolation.sh
  run burst burst.sh
  run offline_backlog offline_backlog.sh
  run shadow shadow.sh
  run cache cache.sh
  run fairness fairness.sh
  run bands bands.sh
  run streams streams.sh 20s
  run stream_overhead stream_overhead.sh 20s
  run llm_isolation llm_isolation.sh 90s
  LONG_PREFILL=48 run llm_isolation_long48 llm_isolation.sh 90s
  echo "LONG_PREFILL=48 loadtest/scenarios/llm_isolation.sh 90s" > "$OUT/llm_isolation_long48/command"
  run completions_merge completions_merge.sh 30s
  STREAM=1 run completions_merge_streamed completions_merge.sh 30s
  echo "STREAM=1 loadtest/scenarios/completions_merge.sh 30s" > "$OUT/completions_merge_streamed/command"
  run capacity capacity.sh
  run console_overhead console_overhead.sh
fi
python3 loadtest/scenarios/current.py "$OUT" docs/performance.md
