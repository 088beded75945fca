#!/usr/bin/env bash
# What callers see when one endpoint fails, with retries and hedging off and on, in one
# run: three simulated endpoints (resnet50-trt, one instance each) behind two gateways
# whose real-time pools hold all three: `off` (`retry.on = []`, `max_retries = 0`, no
# hedge) and `on` (the retry defaults and `[hedge]` with its defaults: after the pool's
# learned p95, within 2% more calls). Both take RATE requests/s (one row, budget 200 ms)
# at the same time, so each fault falls on both alike. Phases of DURATION each, every
# endpoint healthy again (and no circuit open) between them:
#
#   no_fault     nothing happens
#   kill         3 s in, kill -9 of endpoint 2 (started again after the phase)
#   stop         3 s in, SIGSTOP of endpoint 2 for 5 s
#   unavailable  3 s in, endpoint 2 answers 503 for 10 s (POST /sim/faults)
#   slow         endpoint 2 runs 10x slower the whole phase
#   rolling      3 s in, a rolling restart: each endpoint in turn SIGTERM, started
#                again, ready, then 3 s to the next
#
# After an unrecorded 10 s warm-up of both. Per phase and gateway: caller errors (any status but 200, or no answer), 200s past
# their budget, p50 and p99 (from the intended send time), p99 against the no-fault
# phase, and extra backend calls (retries and hedges sent, from the gateway's metrics)
# per 100 requests.
#
#   loadtest/scenarios/faults.sh [RATE] [DURATION]          (defaults: 500 20s)
#
# Writes to $OUT (default target/loadtest/faults): summary.txt, results.json and each
# phase's JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-500}
DURATION=${2:-20s}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/faults}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh

# The endpoints are started, stopped and started again here: their PIDs are kept apart
# from PIDS and stopped on exit too.
SIM_PORTS=("$(free_port)" "$(free_port)" "$(free_port)")
SIM_PIDS=("" "" "")
stop_sims() {
  for p in "${SIM_PIDS[@]}"; do
    [ -z "$p" ] || { kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; }
  done
}
trap 'stop_sims; cleanup' EXIT

# start_sim I: endpoint I on its port, until ready.
start_sim() {
  "$BIN/tiergate" sim --http "127.0.0.1:${SIM_PORTS[$1]}" --model resnet50:resnet50-trt --instances 1 \
    2>>"$WORK/sim$1.log" &
  SIM_PIDS[$1]=$!
  wait_ready "${SIM_PORTS[$1]}" /v2/health/ready 10
}
# stop_sim SIGNAL I: sends SIGNAL to endpoint I and waits until it has exited.
stop_sim() {
  local pid=${SIM_PIDS[$2]}
  kill "-$1" "$pid"
  wait "$pid" 2>/dev/null || true
  SIM_PIDS[$2]=""
}
# faults I JSON: sets endpoint I's simulated faults.
faults() { curl -fs -o /dev/null -X POST -d "$2" "http://127.0.0.1:${SIM_PORTS[$1]}/sim/faults"; }

for i in 0 1 2; do start_sim "$i"; done

ENDPOINTS=$(printf '"http://127.0.0.1:%s", ' "${SIM_PORTS[@]}")
# gateway NAME RETRY_AND_HEDGE_TABLES: writes its policy and starts it.
gateway() {
  mkdir -p "$WORK/$1/policy"
  cat > "$WORK/$1/policy/route.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
[routes.resnet50.realtime]
endpoints = [${ENDPOINTS%, }]
max_concurrency = 1024
[routes.resnet50.realtime.health]
check_interval = "1s"
$2
TOML
  start_gateway "$1" "$3" "$4"
}
OFF=$(free_port); OFF_M=$(free_port); ON=$(free_port); ON_M=$(free_port)
gateway off $'[routes.resnet50.realtime.retry]\non = []\nmax_retries = 0' "$OFF" "$OFF_M"
gateway on '[routes.resnet50.realtime.hedge]' "$ON" "$ON_M"
for port in "$OFF" "$ON"; do wait_ready "$port" /v2/health/ready 10; done

# extra METRICS_PORT: retries and hedges sent so far by the gateway.
extra() {
  curl -fs "http://127.0.0.1:$1/metrics" |
    awk '/^tiergate_backend_retries_total\{/ {n += $NF} /^tiergate_backend_hedges_total\{.*outcome="sent"/ {n += $NF} END {print n + 0}'
}
# settled: no circuit of either gateway open (each endpoint back in its pool, or
# half-open after a passing check: the next call probes it).
settled() {
  for _ in $(seq 1 300); do
    local open
    open=$( { curl -fs "http://127.0.0.1:$OFF_M/metrics"; curl -fs "http://127.0.0.1:$ON_M/metrics"; } |
      awk '/^tiergate_backend_circuit_state\{/ && $NF == 1 {n++} END {print n + 0}')
    [ "$open" = 0 ] && return 0
    sleep 0.1
  done
  echo "the circuits never closed" >&2; return 1
}

SECS=${DURATION%s}
COMMON=(--model resnet50 --rows 1 --cols 16 --binary --budget-ms 200 --timeout 5s --rate "$RATE"
        --duration "$DURATION" --warmup 1s)
mkdir -p "$OUT"
: > "$WORK/extra"

# phase NAME FAULT: both loads for the phase's length while FAULT runs (it starts as the
# warmup does, so "3 s in" is 2 s into the measured window), then every endpoint is
# made healthy again.
phase() {
  local name=$1 fault=$2 off_before on_before
  echo "phase $name: $RATE/s on each gateway for $DURATION" >&2
  off_before=$(extra "$OFF_M"); on_before=$(extra "$ON_M")
  "$BIN/loadtest" run --url "http://127.0.0.1:$OFF" "${COMMON[@]}" --label "off_$name" --json "$OUT/off_$name.json" \
    > /dev/null &
  local off_load=$!
  "$BIN/loadtest" run --url "http://127.0.0.1:$ON" "${COMMON[@]}" --label "on_$name" --json "$OUT/on_$name.json" \
    > /dev/null &
  local on_load=$!
  "$fault"
  wait "$off_load" "$on_load"
  echo "$name $(( $(extra "$OFF_M") - off_before )) $(( $(extra "$ON_M") - on_before ))" >> "$WORK/extra"
  for i in 0 1 2; do
    [ -n "${SIM_PIDS[$i]}" ] || start_sim "$i"
    faults "$i" '{"unavailable": false, "slow": 1}'
  done
  settled
}

no_fault() { :; }
kill_one() { sleep 3; stop_sim KILL 1; }
stop_one() { sleep 3; kill -STOP "${SIM_PIDS[1]}"; sleep 5; kill -CONT "${SIM_PIDS[1]}"; }
unavailable_one() { sleep 3; faults 1 '{"unavailable": true}'; sleep 10; faults 1 '{"unavailable": false}'; }
slow_one() { faults 1 '{"slow": 10}'; }
rolling() {
  sleep 3
  for i in 0 1 2; do
    stop_sim TERM "$i"; start_sim "$i"; sleep 3
  done
}

# Both gateways and the endpoints warmed up first (connections, learned costs, p95s),
# unrecorded, so the no-fault phase is as warm as the rest.
WARMING=()
for port in "$OFF" "$ON"; do
  "$BIN/loadtest" run --url "http://127.0.0.1:$port" "${COMMON[@]/$DURATION/10s}" > /dev/null 2>&1 &
  WARMING+=($!)
done
wait "${WARMING[@]}"
phase no_fault no_fault
phase kill kill_one
phase stop stop_one
phase unavailable unavailable_one
phase slow slow_one
phase rolling rolling

python3 - "$OUT" "$WORK/extra" "$RATE" "$DURATION" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, extra_file, rate, duration = sys.argv[1:5]
extra = {}
for line in open(extra_file):
    name, off, on = line.split()
    extra[name] = {"off": int(off), "on": int(on)}
phases = list(extra)
print(f"{rate}/s on each gateway for {duration} per phase, one row, budget 200 ms; three endpoints, one faulted")
print(f"{'phase':<12} {'gateway':<7} {'requests':>8} {'errors':>7} {'200 late':>8} {'p50 ms':>7} {'p99 ms':>7} {'p99/none':>8} {'extra %':>7}")
results = {}
for name in phases:
    for setup in ("off", "on"):
        r = json.load(open(f"{out}/{setup}_{name}.json"))
        base = json.load(open(f"{out}/{setup}_no_fault.json"))
        ok = r["status_counts"].get("200", 0)
        errors = r["scheduled"] - ok
        late = ok - (r["ok_within_budget"] or 0)
        p99, base_p99 = r["latency_ms"]["p99"], base["latency_ms"]["p99"]
        extra_pct = 100.0 * extra[name][setup] / max(r["completed"], 1)
        results.setdefault(name, {})[setup] = {
            "requests": r["scheduled"], "errors": errors, "ok_past_budget": late,
            "p50_ms": r["latency_ms"]["p50"], "p99_ms": p99, "p99_vs_no_fault": p99 / base_p99,
            "extra_calls": extra[name][setup], "extra_calls_percent": extra_pct,
        }
        print(f"{name:<12} {setup:<7} {r['scheduled']:>8} {errors:>7} {late:>8} {r['latency_ms']['p50']:>7.2f} "
              f"{p99:>7.2f} {p99 / base_p99:>8.2f} {extra_pct:>7.2f}")
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
PY
