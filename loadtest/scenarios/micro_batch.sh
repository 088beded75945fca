#!/usr/bin/env bash
# The micro-batch tier's gain, in one run: the simulator with the resnet50-eager profile
# (t(B) = 7.5 ms + 0.085 ms x B) on ONE instance, served per request (called directly,
# open loop above its capacity) and through tiergate's micro-batch tier at several
# offered rates, one row per request, budget 1 s.
#
#   loadtest/scenarios/micro_batch.sh [RATES] [DURATION]      (defaults: "1000 2500 4000 4500 5500" 20s)
#   MAX_BATCH=64 IN_FLIGHT=2 loadtest/scenarios/micro_batch.sh ...
#
# Builds tiergate and loadtest in release mode and writes to $OUT (default
# target/loadtest/micro_batch): summary.txt (the table below), one JSON and one plot
# directory per run. Columns: goodput (200s per second, ended inside the window), its fraction of the cost
# model's maximum B/t(B) at max_batch, its gain over per-request serving (measured in
# the same run), p50/p99 against the budget, refusals (429/503) and deadline misses (504),
# and the mean batch size from the gateway's metrics.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATES=${1:-"1000 2500 4000 4500 5500"}
DURATION=${2:-20s}
MAX_BATCH=${MAX_BATCH:-64}
IN_FLIGHT=${IN_FLIGHT:-2}
BUDGET_MS=${BUDGET_MS:-1000}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/micro_batch}

cargo build --release --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/release

. loadtest/scenarios/lib.sh

SIM=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port)


"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-eager --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/micro_batch.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
[routes.resnet50.flags]
realtime = false
micro_batch = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = $MAX_BATCH
max_wait = "250ms"
max_in_flight = $IN_FLIGHT
queue_capacity = 4096
TOML
"$BIN/tiergate" serve --policy-dir "$WORK/policy" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

mkdir -p "$OUT"
LOAD=(--model resnet50 --rows 1 --cols 16 --binary --warmup 3s --timeout 30s)
batch_rows() { curl -fs "http://127.0.0.1:$GWM/metrics" | awk -v k="$1" '$1 == "tiergate_batch_rows_" k "{route=\"resnet50\"}" {print $2}'; }

echo "per request: the simulator called directly, open loop above its capacity" >&2
"$BIN/loadtest" run --url "http://127.0.0.1:$SIM" --rate 200 --duration "$DURATION" "${LOAD[@]}" \
  --label per_request --json "$OUT/per_request.json" --plot "$OUT/per_request" > "$OUT/per_request.txt"

: > "$WORK/batches"
for RATE in $RATES; do
  echo "micro-batch tier at $RATE/s" >&2
  SUM0=$(batch_rows sum); COUNT0=$(batch_rows count)
  "$BIN/loadtest" run --url "http://127.0.0.1:$GW" --rate "$RATE" --duration "$DURATION" --budget-ms "$BUDGET_MS" \
    "${LOAD[@]}" --label "micro_batch_$RATE" --json "$OUT/micro_batch_$RATE.json" --plot "$OUT/micro_batch_$RATE" \
    > "$OUT/micro_batch_$RATE.txt"
  echo "$RATE ${SUM0:-0} ${COUNT0:-0} $(batch_rows sum) $(batch_rows count)" >> "$WORK/batches"
done

python3 - "$OUT" "$MAX_BATCH" "$IN_FLIGHT" "$BUDGET_MS" "$WORK/batches" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, max_batch, in_flight, budget, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
a, b = 7.5, 0.085  # resnet50-eager, ms
t = lambda n: a + b * n
theory = max_batch / t(max_batch) * 1000
per = json.load(open(f"{out}/per_request.json"))
# Goodput: responses that ended inside the measured window, times the share that were 200s.
goodput = lambda s: s["achieved_rps"] * s["status_counts"].get("200", 0) / max(s["completed"], 1)
per_rps = goodput(per)
print(f"resnet50-eager, 1 instance: t(B) = {a} ms + {b} ms x B; max_batch {max_batch}, max_in_flight {in_flight}, budget {budget:.0f} ms")
print(f"theoretical maximum B/t(B) = {theory:.0f} rows/s; per request 1/t(1) = {1000 / t(1):.1f}/s")
print(f"per request (direct, offered {per['offered_rps']:.0f}/s): goodput {per_rps:.1f}/s, p99 {per['latency_ms']['p99']:.0f} ms")
print()
print(f"{'offered/s':>9} {'goodput/s':>9} {'of max':>6} {'gain':>6} {'p50 ms':>7} {'p99 ms':>7} {'429':>5} {'503':>5} {'504':>5} {'other':>5} {'rows/batch':>10}")
for line in open(batches):
    rate, s0, c0, s1, c1 = line.split()
    s = json.load(open(f"{out}/micro_batch_{rate}.json"))
    counts = s["status_counts"]
    g = goodput(s)
    other = s["failures"] - sum(counts.get(k, 0) for k in ("429", "503", "504"))
    mean = (float(s1) - float(s0)) / max(float(c1) - float(c0), 1)
    print(f"{s['offered_rps']:>9.0f} {g:>9.0f} {g / theory:>6.2f} {g / per_rps:>5.1f}x {s['latency_ms']['p50']:>7.1f} "
          f"{s['latency_ms']['p99']:>7.1f} {counts.get('429', 0):>5} {counts.get('503', 0):>5} {counts.get('504', 0):>5} "
          f"{other:>5} {mean:>10.1f}")
PY
