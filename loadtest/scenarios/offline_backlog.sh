#!/usr/bin/env bash
# Micro-batch latency with and without an offline backlog draining through the same
# batch pool, in one run: the simulator with resnet50-eager on ONE instance behind
# tiergate (micro_batch and offline on), micro-batch traffic at RATE/s (one row, budget
# 1 s), phases alternating: alone, then with a Batch API backlog of BACKLOG requests
# draining on the pool's spare capacity (cancelled after the phase), ROUNDS times. First,
# async submissions (Prefer: respond-async) at SUBMIT_RATE/s, acknowledged only once
# durable.
#
#   loadtest/scenarios/offline_backlog.sh [RATE] [DURATION] [ROUNDS]    (defaults: 2000 15s 2)
#
# Writes to $OUT (default target/loadtest/offline_backlog): summary.txt, JSON and plots.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-2000}
DURATION=${2:-15s}
ROUNDS=${3:-2}
BACKLOG=${BACKLOG:-60000}
SUBMIT_RATE=${SUBMIT_RATE:-2000}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/offline_backlog}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh

SIM=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-eager --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/backlog.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
offline_from = "30s"
[routes.resnet50.flags]
realtime = false
micro_batch = true
offline = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = 64
max_wait = "250ms"
max_in_flight = 2
queue_capacity = 4096
TOML
TIERGATE_OFFLINE__MAX_FILE_LINES=$((BACKLOG + 1)) \
  "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data" \
  --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

backlog_file "$WORK/backlog.jsonl" "$BACKLOG"
FILE=$(curl -fs -F purpose=batch -F "file=@$WORK/backlog.jsonl" "http://127.0.0.1:$GW/v1/files" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')

mkdir -p "$OUT"
echo "async submissions at $SUBMIT_RATE/s (on an empty store, before the phases)" >&2
"$BIN/loadtest" run --url "http://127.0.0.1:$GW" --model resnet50 --rows 1 --cols 16 --rate "$SUBMIT_RATE" \
  --duration 10s --warmup 2s --header prefer:respond-async --label submit --json "$OUT/submit.json" > /dev/null
# Let those jobs drain before the phases start.
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$GWM/metrics" | grep -q '^tiergate_offline_jobs{state="queued"} 0$' && break
  sleep 0.1
done
LOAD=(--url "http://127.0.0.1:$GW" --model resnet50 --rows 1 --cols 16 --binary --rate "$RATE" --duration "$DURATION"
      --warmup 3s --budget-ms 1000 --timeout 30s)
batch_field() { curl -fs "http://127.0.0.1:$GW/v1/batches/$1" | python3 -c "import json,sys; b=json.load(sys.stdin); print($2)"; }
: > "$WORK/phases"
for ROUND in $(seq 1 "$ROUNDS"); do
  echo "round $ROUND: micro-batch alone" >&2
  "$BIN/loadtest" run "${LOAD[@]}" --label "alone_$ROUND" --json "$OUT/alone_$ROUND.json" --plot "$OUT/alone_$ROUND" > /dev/null
  echo "alone_$ROUND - 0" >> "$WORK/phases"
  echo "round $ROUND: micro-batch with a backlog of $BACKLOG offline requests" >&2
  BATCH=$(curl -fs -H 'content-type: application/json' "http://127.0.0.1:$GW/v1/batches" \
    -d "{\"input_file_id\":\"$FILE\",\"endpoint\":\"/v2/models/resnet50/infer\",\"completion_window\":\"24h\"}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  START=$(date +%s.%N)
  "$BIN/loadtest" run "${LOAD[@]}" --label "backlog_$ROUND" --json "$OUT/backlog_$ROUND.json" --plot "$OUT/backlog_$ROUND" > /dev/null
  DONE=$(batch_field "$BATCH" 'b["request_counts"]["completed"]')
  ELAPSED=$(python3 -c "import time; print(time.time() - $START)")
  echo "backlog_$ROUND $DONE $ELAPSED" >> "$WORK/phases"
  curl -fs -X POST "http://127.0.0.1:$GW/v1/batches/$BATCH/cancel" > /dev/null
  for _ in $(seq 1 600); do
    [ "$(batch_field "$BATCH" 'b["status"]')" = cancelled ] && break
    sleep 0.1
  done
done


python3 - "$OUT" "$WORK/phases" "$RATE" "$BACKLOG" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases, rate, backlog = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
print(f"micro-batch at {rate}/s (1 row, budget 1 s) on resnet50-eager x1, alone and with {backlog} offline requests draining")
print(f"{'phase':<10} {'goodput/s':>9} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} {'non-200':>7} {'offline done/s':>14}")
p99 = {"alone": [], "backlog": []}
for line in open(phases):
    name, done, elapsed = line.split()
    s = json.load(open(f"{out}/{name}.json"))
    lat = s["latency_ms"]
    bad = s["completed"] - s["status_counts"].get("200", 0)
    good = s["achieved_rps"] * s["status_counts"].get("200", 0) / max(s["completed"], 1)
    drained = f"{float(done) / float(elapsed):.0f}" if name.startswith("backlog") else "-"
    print(f"{name:<10} {good:>9.0f} {lat['p50']:>7.1f} {lat['p90']:>7.1f} {lat['p99']:>7.1f} {lat['p999']:>8.1f} {bad:>7} {drained:>14}")
    p99[name.split("_")[0]].append(lat["p99"])
a, b = sum(p99["alone"]) / len(p99["alone"]), sum(p99["backlog"]) / len(p99["backlog"])
print(f"mean p99: alone {a:.1f} ms, with backlog {b:.1f} ms: ratio {b / a:.2f}")
s = json.load(open(f"{out}/submit.json"))
print(f"async submissions: offered {s['offered_rps']:.0f}/s, acknowledged (202) {s['status_counts'].get('202', 0)}, "
      f"achieved {s['achieved_rps']:.0f}/s, ack p50 {s['latency_ms']['p50']:.2f} ms, p99 {s['latency_ms']['p99']:.2f} ms")
PY
