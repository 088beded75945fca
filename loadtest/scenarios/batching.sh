#!/usr/bin/env bash
# The micro-batch gain curve (goodput and p99 against offered load, per request vs
# micro-batched) for the simulator's three cost profiles, one after the other: each is
# loadtest/scenarios/micro_batch.sh with that profile, its own rates (spanning its
# batched capacity) and a per-request rate above its 1/t(1).
#
#   loadtest/scenarios/batching.sh [DURATION]        (default 15s per point)
#
# Writes to $OUT (default target/loadtest/batching): one directory per profile (its
# summary.txt, gain.svg, JSON and plots) and summary.txt with the three tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-15s}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/batching}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
# profile | rates | per-request rate (above 1/t(1): eager 132/s, trt 1305/s, bert 1493/s)
while IFS='|' read -r PROFILE RATES PER; do
  echo "== $PROFILE" >&2
  OUT="$OUT/$PROFILE" PROFILE="$PROFILE" PER_REQUEST_RATE="$PER" \
    loadtest/scenarios/micro_batch.sh "$RATES" "$DURATION" > /dev/null < /dev/null
  { cat "$OUT/$PROFILE/summary.txt"; echo; } >> "$OUT/summary.txt"
done <<'TABLE'
resnet50-eager|1000 2500 4000 5500|200
resnet50-trt|1000 2000 3000 4000|2000
bert-base-trt|1000 2000 3000 4000|2000
TABLE
cat "$OUT/summary.txt"
