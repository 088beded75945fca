#!/usr/bin/env bash
# Shadow scoring's cost to callers, in one interleaved run: two gateways in front of the
# same simulated primary pools (resnet50-trt: a real-time instance and a batch
# instance), one with the route's shadow off and one mirroring 100% of its real-time
# calls and micro-batches to a candidate three times slower (--slowdown 3, one
# instance). Each phase runs real-time load (RT_RATE/s, one row, budget 100 ms) and a
# micro-batch load (BATCH_RATE/s, one row, budget 1 s) together for DURATION; the setups
# alternate for ROUNDS rounds. The results: real-time p99 with the shadow on divided by
# p99 with it off, and micro-batch goodput (200s per second) on divided by off; the
# shadow's compared and dropped calls from the gateway's metrics.
#
#   loadtest/scenarios/shadow.sh [RT_RATE] [BATCH_RATE] [DURATION] [ROUNDS]   (defaults: 300 1500 15s 2)
#
# Writes to $OUT (default target/loadtest/shadow): summary.txt, results.json and each
# phase's JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
RT_RATE=${1:-300}
BATCH_RATE=${2:-1500}
DURATION=${3:-15s}
ROUNDS=${4:-2}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/shadow}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh

RT=$(free_port); BATCH=$(free_port); CANDIDATE=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$RT" --model resnet50:resnet50-trt --instances 1 2>"$WORK/rt.log" & PIDS+=($!)
"$BIN/tiergate" sim --http "127.0.0.1:$BATCH" --model resnet50:resnet50-trt --instances 1 2>"$WORK/batch.log" & PIDS+=($!)
"$BIN/tiergate" sim --http "127.0.0.1:$CANDIDATE" --model resnet50:resnet50-trt --instances 1 --slowdown 3 \
  2>"$WORK/candidate.log" & PIDS+=($!)

# gateway NAME HTTP_PORT METRICS_PORT SHADOW(true|false): writes its policy and starts it.
gateway() {
  local name=$1 http=$2 metrics=$3 shadow=$4
  mkdir -p "$WORK/$name/policy"
  cat > "$WORK/$name/policy/route.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
[routes.resnet50.flags]
realtime = true
micro_batch = true
shadow = $shadow
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:$RT"]
max_concurrency = 1024
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$BATCH"]
max_batch = 64
max_wait = "50ms"
max_in_flight = 2
queue_capacity = 8192
[routes.resnet50.shadow]
percent = 100
tiers = ["realtime", "micro_batch"]
budget = "2s"
[routes.resnet50.shadow.candidate]
endpoints = ["http://127.0.0.1:$CANDIDATE"]
max_concurrency = 64
TOML
  start_gateway "$name" "$http" "$metrics"
}
OFF=$(free_port); OFF_M=$(free_port); ON=$(free_port); ON_M=$(free_port)
gateway off "$OFF" "$OFF_M" false
gateway on "$ON" "$ON_M" true
for port in "$RT" "$BATCH" "$CANDIDATE" "$OFF" "$ON"; do wait_ready "$port" /v2/health/ready 10; done

SECS=${DURATION%s}
COMMON=(--model resnet50 --rows 1 --cols 16 --binary --timeout 30s)
mkdir -p "$OUT"
: > "$WORK/phases"
for ROUND in $(seq 1 "$ROUNDS"); do
  ORDER="off on"; [ $((ROUND % 2)) -eq 0 ] && ORDER="on off"
  for SETUP in $ORDER; do
    PORT=$OFF; [ "$SETUP" = on ] && PORT=$ON
    URL="http://127.0.0.1:$PORT"
    echo "round $ROUND, shadow $SETUP: real-time $RT_RATE/s and micro-batch $BATCH_RATE/s" >&2
    # The batch load starts first and ends last, so it covers the whole measured window.
    "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rate "$BATCH_RATE" --budget-ms 1000 --duration "$((SECS + 3))s" \
      --warmup 1s --label "batch_${SETUP}_$ROUND" --json "$OUT/batch_${SETUP}_$ROUND.json" > /dev/null &
    LOAD=$!
    "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rate "$RT_RATE" --budget-ms 100 --duration "$DURATION" --warmup 2s \
      --label "rt_${SETUP}_$ROUND" --json "$OUT/rt_${SETUP}_$ROUND.json" > /dev/null
    wait "$LOAD"
    echo "$SETUP $ROUND" >> "$WORK/phases"
  done
done
curl -fs "http://127.0.0.1:$ON_M/metrics" | grep '^tiergate_shadow_\(compared\|dropped\)_total' > "$OUT/shadow_metrics.txt" || true

python3 - "$OUT" "$WORK/phases" "$RT_RATE" "$BATCH_RATE" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases, rt, batch = sys.argv[1:5]
print(f"real-time {rt}/s (budget 100 ms) with micro-batch {batch}/s (budget 1 s); shadow off, or 100% to a candidate 3x slower")
print(f"{'shadow':<6} {'round':>5} {'rt p50':>7} {'rt p99':>7} {'rt non-200':>10} {'batch ok/s':>10} {'batch p99':>9}")
seen = {}
for line in open(phases):
    setup, rnd = line.split()
    r = json.load(open(f"{out}/rt_{setup}_{rnd}.json"))
    b = json.load(open(f"{out}/batch_{setup}_{rnd}.json"))
    bad = r["completed"] - r["status_counts"].get("200", 0)
    ok = b["achieved_rps"] * b["status_counts"].get("200", 0) / max(b["completed"], 1)
    print(f"{setup:<6} {rnd:>5} {r['latency_ms']['p50']:>7.2f} {r['latency_ms']['p99']:>7.2f} {bad:>10} {ok:>10.0f} {b['latency_ms']['p99']:>9.1f}")
    seen.setdefault(setup, []).append((r["latency_ms"]["p99"], ok))
mean = lambda xs: sum(xs) / len(xs)
p99 = {s: mean([x[0] for x in v]) for s, v in seen.items()}
goodput = {s: mean([x[1] for x in v]) for s, v in seen.items()}
result = {
    "rt_p99_off_ms": p99["off"], "rt_p99_on_ms": p99["on"], "rt_p99_ratio": p99["on"] / p99["off"],
    "batch_goodput_off": goodput["off"], "batch_goodput_on": goodput["on"],
    "batch_goodput_ratio": goodput["on"] / goodput["off"],
}
print(f"real-time p99: shadow off {p99['off']:.2f} ms, on {p99['on']:.2f} ms: ratio {result['rt_p99_ratio']:.3f} (target <= 1.05)")
print(f"micro-batch goodput: off {goodput['off']:.0f}/s, on {goodput['on']:.0f}/s: ratio {result['batch_goodput_ratio']:.3f} (target >= 0.95)")
print("shadow calls:", " ".join(l.strip() for l in open(f"{out}/shadow_metrics.txt")))
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
PY
