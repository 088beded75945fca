#!/usr/bin/env bash
# A step in load on a route whose real-time pool an autoscaler sizes on the capacity
# signal: RATE requests/s (one row, budget 100 ms) for 60 s, 5x RATE for 90 s, RATE
# again for 150 s, against simulated endpoints (resnet50-eager, one instance each:
# t(1) = 7.6 ms, so RATE=60 keeps one endpoint 46% busy) behind one gateway whose pool
# starts with one endpoint (and `max_concurrency` 8: eight calls an
# endpoint, raised with the pool). loadtest/scenarios/autoscale.py plays KEDA's part (see
# deploy/k8s/autoscaling/keda/): every 15 s it reads `tiergate_endpoints_needed`, starts
# or stops simulators and puts them in the pool through the admin API (scale-up at once,
# scale-down after a 120 s stabilization, one endpoint a minute). The pool's [capacity]
# window is 15 s, its target utilisation the default 0.7.
#
# Reports: how long the signal takes to show the new need after the step (to 90% of its
# level over the step's last 30 s), how long until every later second's p99 is within
# the budget, endpoint-seconds used against a fixed pool sized for the peak, and what
# the requests refused meanwhile got (statuses; every 429/503 of tiergate carries
# Retry-After) and whether any 200 came past its budget.
#
#   loadtest/scenarios/capacity.sh [RATE]        (default 60)
#
# Writes to $OUT (default target/loadtest/capacity): summary.txt, results.json,
# load.json (the load's per-second series) and autoscale.json (the signal each second).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-60}
PEAK=$((RATE * 5))
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/capacity}
STEPS="60s@$RATE,90s@$PEAK,150s@$RATE"
TOTAL=300

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh
mkdir -p "$OUT"

# The gateway: one route, its real-time pool set by the autoscaler (a placeholder
# endpoint until it starts the first simulator).
HTTP=$(free_port); METRICS=$(free_port); ADMIN=$(free_port)
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
mkdir -p "$WORK/gw/policy"
cat > "$WORK/gw/policy/resnet50.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:$(free_port)"]
max_concurrency = 8
[routes.resnet50.realtime.capacity]
window = "15s"
TOML
# The tiers aim at 90% of each budget, the rest left for the way to and from the client
# (limits.budget_reserve, as burst.sh): the load generator shares the cores.
TIERGATE_LIMITS__BUDGET_RESERVE=0.1 TIERGATE_LISTEN__ADMIN="127.0.0.1:$ADMIN" TIERGATE_ADMIN__TOKEN="$TOKEN" \
  "$BIN/tiergate" serve --policy-dir "$WORK/gw/policy" --data-dir "$WORK/gw/data" \
  --http "127.0.0.1:$HTTP" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$METRICS" 2>"$WORK/gw/gw.log" &
PIDS+=($!)
wait_ready "$HTTP" /v2/health/live 10

python3 loadtest/scenarios/autoscale.py "$BIN/tiergate" "$METRICS" "$ADMIN" "$TOKEN" resnet50 "$((TOTAL + 5))" \
  "$OUT/autoscale.json" 2> >(tee "$OUT/autoscale.log" >&2) &
SCALER=$!
PIDS+=($SCALER)
# The first endpoint in the pool before the load starts.
for _ in $(seq 1 500); do [ -e "$OUT/autoscale.json.ready" ] && break; sleep 0.02; done
[ -e "$OUT/autoscale.json.ready" ] || { echo "the autoscaler never set the pool" >&2; exit 1; }
rm -f "$OUT/autoscale.json.ready"

echo "load: $STEPS (one row, budget 100 ms)" >&2
"$BIN/loadtest" run --url "http://127.0.0.1:$HTTP" --model resnet50 --rows 1 --cols 16 --binary --budget-ms 100 \
  --timeout 5s --rate "$RATE" --schedule "steps:$STEPS" --duration "${TOTAL}s" --warmup 0s \
  --label capacity --json "$OUT/load.json" > /dev/null
wait "$SCALER"

python3 - "$OUT" "$RATE" "$PEAK" <<'PY' | tee "$OUT/summary.txt"
import json, math, sys
out, rate, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = json.load(open(f"{out}/load.json"))
scale = json.load(open(f"{out}/autoscale.json"))
timeline = scale["timeline"]
step_at, back_at, end = 60, 150, 300
series = {s["second"]: s for s in load["series"]}
# The signal: its level over the step's last 30 s, and when it first reached 90% of it.
level = [p["needed"] for p in timeline if back_at - 30 <= p["t"] < back_at and p["needed"] is not None]
level = sum(level) / len(level)
shown = next(p["t"] for p in timeline if p["t"] >= step_at and (p["needed"] or 0) >= 0.9 * level)
# p99 back within the budget: the first second of the step after which every second is.
late = [s for s in range(step_at, back_at) if series.get(s, {}).get("p99_ms", 0) > 100 or series.get(s, {}).get("errors", 0)]
recovered = (max(late) + 1 - step_at) if late else 0
# Endpoint-seconds: the pool as scaled, against a fixed pool the size of its peak.
used = sum(p["endpoints"] for p in timeline[:end])
peak_size = max(p["endpoints"] for p in timeline[:end])
fixed = peak_size * min(end, len(timeline))
ok = load["status_counts"].get("200", 0)
past_budget = ok - (load["ok_within_budget"] or 0)
refused = {k: v for k, v in load["status_counts"].items() if k != "200"}
result = {
    "rate": rate, "peak_rate": peak, "signal_level_at_peak": level, "signal_shown_after_s": shown - step_at,
    "p99_within_budget_after_s": recovered, "endpoints_at_peak": peak_size, "endpoint_seconds": used,
    "endpoint_seconds_fixed_pool": fixed, "endpoint_seconds_saved_percent": 100 * (1 - used / fixed),
    "requests": load["scheduled"], "ok": ok, "ok_past_budget": past_budget, "refused": refused,
    "transport_errors": load["errors"], "decisions": scale["decisions"],
    "expected_peak_need": peak * 0.007585 / 0.7,
}
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
print(f"steps {rate}/s for 60 s, {peak}/s for 90 s, {rate}/s for 150 s; one row, budget 100 ms; resnet50-eager endpoints")
print(f"signal at the peak: {level:.2f} endpoints (rate x t(1) / 0.7 = {result['expected_peak_need']:.2f})")
print(f"signal showed the new need {shown - step_at:.0f} s after the step (window 15 s)")
print(f"p99 within the budget {recovered} s after the step (the autoscaler polls every 15 s)")
print(f"endpoints: {peak_size} at the peak; {used} endpoint-seconds against {fixed} for a fixed pool of {peak_size} "
      f"({result['endpoint_seconds_saved_percent']:.0f}% saved)")
print(f"requests: {load['scheduled']}, 200: {ok} ({past_budget} past the budget), refused: {refused or 'none'}, "
      f"transport errors: {load['errors'] or 'none'}")
for d in scale["decisions"]:
    print(f"  t={d['t']:6.1f} s  needed {d['needed']:.2f}: {d['from']} -> {d['to']} endpoints")
PY
