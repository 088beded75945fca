#!/usr/bin/env bash
# What the console costs the data plane, in one run: two tiergate gateways alike (one
# worker thread, the admin API on, the console's history sampled once a second), in
# front of the same simulator; `console_open` has the console polling it as its pages
# do, open on all of them at once (every 2 s: the history since its last sample, the
# policy, the pools' endpoints, the micro-batch queues and the offline queue),
# `console_closed` has nobody looking. The simulator called directly beside them. Open
# loop, targets interleaved in short rounds, latency from the intended send time.
#
#   loadtest/scenarios/console_overhead.sh [RATE] [DURATION] [ROUNDS]   (defaults: 200 60s 30)
#
# Builds tiergate and loadtest with the dist profile; writes $OUT (default
# target/loadtest/console_overhead): summary.txt (loadtest's table, then the p99s of
# the open and closed gateways and their ratio) and results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200}
DURATION=${2:-60s}
ROUNDS=${3:-30}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/console_overhead}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-trt 2>"$WORK/sim.log" & PIDS+=($!)
realtime_policy "http://127.0.0.1:$SIM"
declare -A HTTP ADMIN
for name in console_closed console_open; do
  HTTP[$name]=$(free_port); ADMIN[$name]=$(free_port)
  TIERGATE_THREADS__WORKERS=1 TIERGATE_LISTEN__ADMIN="127.0.0.1:${ADMIN[$name]}" TIERGATE_ADMIN__TOKEN="$ADMIN_TOKEN" \
    "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/$name" \
    --http "127.0.0.1:${HTTP[$name]}" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$(free_port)" \
    2>"$WORK/$name.log" & PIDS+=($!)
done
wait_ready "$SIM" /v2/health/ready
for name in console_closed console_open; do wait_ready "${HTTP[$name]}" /v2/health/ready; done

# The open console: what its pages ask, every 2 s, for as long as the run lasts.
(
  since=0
  while true; do
    answer=$(curl -fs -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:${ADMIN[console_open]}/admin/stats?since=$since")
    since=$(python3 -c 'import json, sys; s = json.load(sys.stdin)["samples"]; print(s[-1]["at_ms"] if s else sys.argv[1])' "$since" <<<"$answer")
    for page in policy backends batching "offline?limit=100"; do
      curl -fs -o /dev/null -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:${ADMIN[console_open]}/admin/$page"
    done
    echo polled >>"$WORK/polls"
    sleep 2
  done
) & PIDS+=($!)

mkdir -p "$OUT"
"$BIN/loadtest" compare --target "direct=http://127.0.0.1:$SIM" \
  --target "console_closed=http://127.0.0.1:${HTTP[console_closed]}" \
  --target "console_open=http://127.0.0.1:${HTTP[console_open]}" \
  --model resnet50 --rate "$RATE" --duration "$DURATION" --rounds "$ROUNDS" \
  --budget-ms 200 --json "$OUT/results.json" | tee "$OUT/summary.txt"

python3 - "$OUT/results.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
targets = {t["name"]: t for t in json.load(open(sys.argv[1]))["targets"]}
p99 = lambda name: targets[name]["summary"]["latency_ms"]["p99"]
closed, opened = p99("console_closed"), p99("console_open")
print(f"\nreal-time p99 with the console polling / without it: {opened / closed:.3f} ({closed:.2f} -> {opened:.2f} ms)")
PY
# Every poll answered (a refused one would have ended the poller): how many there were.
polls=$(wc -l <"$WORK/polls" 2>/dev/null || echo 0)
echo "console polls answered: $polls (every page's calls, every 2 s)" | tee -a "$OUT/summary.txt"
[ "$polls" -gt 0 ]
