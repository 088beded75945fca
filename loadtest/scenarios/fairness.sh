#!/usr/bin/env bash
# Fair shares between tenants on one batch pool: tenant B's latency and deadline
# attainment alone, beside tenant A at its share, and beside A flooding at ten times its
# share; then the same flood sent as B's own tenant (what a pool without fair shares
# sees: one queue). The simulator has the resnet50-eager profile (t(B) = 7.5 ms +
# 0.085 ms x B) on one instance; the route has max_batch 64, 2 batches in flight (about
# 4,900 rows/s), 4,096 rows of queue and its tenants named by x-api-key.
#
#   B: B_RATE/s (default 500), one row per request, budget B_BUDGET_MS (default 200).
#   A: 16 rows per request, budget 1 s; at its share it sends half the pool's rows
#      (A_SHARE_RATE/s requests, default 155, 2,480 rows/s), flooding ten times that.
#
#   loadtest/scenarios/fairness.sh [DURATION] [ROUNDS]      (defaults: 15s 2)
#
# Phases alternate in order within each round. Writes to $OUT (default
# target/loadtest/fairness): summary.txt, results.json, each phase's JSON (B's, and A's
# as *_a_*.json). Attainment is B's 200s within budget (from the intended send time)
# over B's requests.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-15s}
ROUNDS=${2:-2}
B_RATE=${B_RATE:-500}
B_BUDGET_MS=${B_BUDGET_MS:-200}
A_SHARE_RATE=${A_SHARE_RATE:-155}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/fairness}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist

. loadtest/scenarios/lib.sh

SIM=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model "resnet50:resnet50-eager" --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/fairness.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "50ms"
[routes.resnet50.flags]
realtime = false
micro_batch = true
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = 64
max_in_flight = 2
queue_capacity = 4096
tenant_header = "x-api-key"
TOML
# Both tenants' load comes from one address, as from behind a load balancer.
TIERGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT=0 \
  "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data" --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

SECS=${DURATION%s}
URL="http://127.0.0.1:$GW"
COMMON=(--model resnet50 --cols 16 --binary --timeout 30s)
mkdir -p "$OUT"
: > "$WORK/phases"
# phase: A's requests per second (0: none) and the tenant A's load is sent as.
phase() {
  local name=$1 a_rate=$2 a_key=$3 round=$4
  echo "round $round: $name" >&2
  local A=""
  if [ "$a_rate" -gt 0 ]; then
    # A starts first and ends last, so it covers B's whole measured window.
    "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rows 16 --rate "$a_rate" --budget-ms 1000 \
      --header "x-api-key:$a_key" --duration "$((SECS + 4))s" --warmup 1s \
      --label "${name}_a_$round" --json "$OUT/${name}_a_$round.json" > /dev/null &
    A=$!
    sleep 2 # A reaches a steady state (load shaping, not synchronisation)
  fi
  "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rows 1 --rate "$B_RATE" --budget-ms "$B_BUDGET_MS" \
    --header "x-api-key:tenant-b" --duration "$DURATION" --warmup 1s \
    --label "${name}_$round" --json "$OUT/${name}_$round.json" > /dev/null
  if [ -n "$A" ]; then wait "$A"; fi
  echo "$name $round" >> "$WORK/phases"
}
FLOOD_RATE=$((A_SHARE_RATE * 10))
for ROUND in $(seq 1 "$ROUNDS"); do
  phase alone 0 - "$ROUND"
  phase at_share "$A_SHARE_RATE" tenant-a "$ROUND"
  phase flood "$FLOOD_RATE" tenant-a "$ROUND"
  phase one_tenant "$FLOOD_RATE" tenant-b "$ROUND"
done

python3 - "$OUT" "$WORK/phases" "$B_RATE" "$B_BUDGET_MS" "$A_SHARE_RATE" "$FLOOD_RATE" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, phases, b_rate, budget, share, flood = sys.argv[1:7]
print(f"tenant B {b_rate}/s x 1 row (budget {budget} ms); tenant A 16 rows per request at its share ({share}/s) "
      f"or flooding ({flood}/s, 10x); one_tenant: the flood sent under B's own key")
print(f"{'phase':<11} {'round':>5} {'B p50':>7} {'B p99':>7} {'B in budget':>11} {'B 429/503':>9} {'A rows ok/s':>11}")
results = {}
for line in open(phases):
    name, rnd = line.split()
    s = json.load(open(f"{out}/{name}_{rnd}.json"))
    attained = (s["ok_within_budget"] or 0) / max(s["scheduled"], 1)
    refused = s["status_counts"].get("429", 0) + s["status_counts"].get("503", 0)
    a_rows = "-"
    if name != "alone":
        a = json.load(open(f"{out}/{name}_a_{rnd}.json"))
        a_rows = f"{16 * a['achieved_rps'] * a['status_counts'].get('200', 0) / max(a['completed'], 1):.0f}"
    lat = s["latency_ms"]
    print(f"{name:<11} {rnd:>5} {lat['p50']:>7.2f} {lat['p99']:>7.2f} {attained:>11.4f} {refused:>9} {a_rows:>11}")
    results.setdefault(name, []).append({"p99": lat["p99"], "attained": attained})
summary = {}
for name, r in results.items():
    summary[name] = {
        "b_p99_ms": [x["p99"] for x in r],
        "b_attained": [x["attained"] for x in r],
    }
alone, share_, flood_ = summary["alone"], summary["at_share"], summary["flood"]
rounds = len(alone["b_p99_ms"])
for i in range(rounds):
    a, s, f = alone["b_p99_ms"][i], share_["b_p99_ms"][i], flood_["b_p99_ms"][i]
    att = flood_["b_attained"][i] / max(alone["b_attained"][i], 1e-9)
    print(f"round {i + 1}: B's p99 flood / alone {f / a:.2f}, flood / A at its share {f / s:.2f}; "
          f"B's attainment flood / alone {att:.4f}; as one tenant {summary['one_tenant']['b_attained'][i]:.4f}")
json.dump(summary, open(f"{out}/results.json", "w"), indent=2)
PY
