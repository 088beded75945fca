#!/usr/bin/env bash
# The prediction cache, in one interleaved run: the same simulated model (resnet50-trt,
# one instance) called directly, through the bare hyper proxy (loadtest's `bare_proxy`,
# a pass-through), through tiergate with the route's cache off, and through tiergate with
# it on, at RATE/s where DISTINCT% of the requests ask a question never asked before and
# the rest ask the same one (so the cache can reach a (100 - DISTINCT)% hit ratio). The
# results: each target's p50 and p99; the backend calls each gateway made (from its
# metrics) and their ratio; the hit ratio; a hit's latency (the cached gateway's p50)
# against the pass-through's.
#
#   loadtest/scenarios/cache.sh [RATE] [DISTINCT] [DURATION] [ROUNDS]   (defaults: 1000 10 20s 2)
#
# The default rate is near the one simulated instance's capacity (about 1,300 one-row calls/s
# alone; less with the load generator on the same cores), where the misses' tail shows
# what the cache takes off the backend.
#
# Writes to $OUT (default target/loadtest/cache): summary.txt, results.json, and the
# gateways' metrics.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-1000}
DISTINCT=${2:-10}
DURATION=${3:-20s}
ROUNDS=${4:-2}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/cache}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh

SIM=$(free_port); BARE=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-trt --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
"$BIN/bare_proxy" "127.0.0.1:$BARE" "127.0.0.1:$SIM" 2>"$WORK/bare.log" & PIDS+=($!)

# gateway NAME HTTP_PORT METRICS_PORT CACHE(true|false) ADMIN_PORT: writes its policy and starts it.
gateway() {
  local name=$1 http=$2 metrics=$3 cache=$4 admin=$5
  mkdir -p "$WORK/$name/policy"
  cat > "$WORK/$name/policy/route.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
[routes.resnet50.flags]
realtime = true
cache = $cache
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:$SIM"]
max_concurrency = 1024
[routes.resnet50.cache]
ttl = "10m"
TOML
  start_gateway "$name" "$http" "$metrics" "$admin"
}
OFF=$(free_port); OFF_M=$(free_port); ON=$(free_port); ON_M=$(free_port); OFF_A=$(free_port); ON_A=$(free_port)
gateway off "$OFF" "$OFF_M" false "$OFF_A"
gateway on "$ON" "$ON_M" true "$ON_A"
for port in "$SIM" "$OFF" "$ON"; do wait_ready "$port" /v2/health/ready 10; done
wait_port "$BARE" 10

mkdir -p "$OUT"
"$BIN/loadtest" compare --model resnet50 --rows 1 --cols 16 --budget-ms 250 --rate "$RATE" --distinct "$DISTINCT" \
  --duration "$DURATION" --rounds "$ROUNDS" --timeout 10s \
  --target "direct=http://127.0.0.1:$SIM" --target "bare_hyper=http://127.0.0.1:$BARE" \
  --target "cache_off=http://127.0.0.1:$OFF" --target "cache_on=http://127.0.0.1:$ON" \
  --json "$OUT/results.json" > "$OUT/compare.txt"
for side in off on; do
  port=$OFF_M; [ "$side" = on ] && port=$ON_M
  curl -fs "http://127.0.0.1:$port/metrics" | grep '^tiergate_\(backend_duration_seconds_count\|cache_lookups_total\)' \
    > "$OUT/metrics_$side.txt" || true
done
# What each gateway's usage ledger says of the same run (tiergate usage, as an operator reads it).
for side in off on; do
  admin=$OFF_A; [ "$side" = on ] && admin=$ON_A
  usage_json "$admin" > "$OUT/usage_$side.json"
  TIERGATE_ADMIN_TOKEN=$ADMIN_TOKEN "$BIN/tiergate" usage --admin "http://127.0.0.1:$admin" --since 1h > "$OUT/usage_$side.txt"
done

python3 - "$OUT" "$RATE" "$DISTINCT" <<'PY' | tee "$OUT/summary.txt"
import json, re, sys
out, rate, distinct = sys.argv[1:4]
results = json.load(open(f"{out}/results.json"))
def metric(side, name, label=""):
    total = 0.0
    for line in open(f"{out}/metrics_{side}.txt"):
        if line.startswith(name) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
print(f"{rate}/s, {distinct}% of requests asking a new question (the rest one repeated), budget 250 ms")
print(f"{'target':<11} {'p50 ms':>7} {'p99 ms':>7} {'ok':>7}")
p = {}
for t in results["targets"]:
    s = t["summary"]
    p[t["name"]] = (s["latency_ms"]["p50"], s["latency_ms"]["p99"])
    print(f"{t['name']:<11} {s['latency_ms']['p50']:>7.2f} {s['latency_ms']['p99']:>7.2f} {s['status_counts'].get('200', 0):>7}")
calls = {side: metric(side, "tiergate_backend_duration_seconds_count", 'tier="realtime"') for side in ("off", "on")}
hits = metric("on", "tiergate_cache_lookups_total", 'result="hit"') + metric("on", "tiergate_cache_lookups_total", 'result="coalesced"')
lookups = metric("on", "tiergate_cache_lookups_total")
print(f"backend calls: cache off {calls['off']:.0f}, on {calls['on']:.0f}: {calls['off'] / max(calls['on'], 1):.1f}x fewer (target >= 9x)")
print(f"hit ratio {hits / max(lookups, 1):.3f} ({hits:.0f} of {lookups:.0f} lookups, coalesced included)")
print(f"p99: cache off {p['cache_off'][1]:.2f} ms, on {p['cache_on'][1]:.2f} ms: ratio {p['cache_on'][1] / p['cache_off'][1]:.3f}")
print(f"a hit (cache on, p50) {p['cache_on'][0]:.2f} ms against the bare proxy's pass-through p50 {p['bare_hyper'][0]:.2f} ms "
      f"and the backend called directly {p['direct'][0]:.2f} ms")
# The usage ledger's view of the same run: requests answered per backend call on each side.
ledger = {side: json.load(open(f"{out}/usage_{side}.json"))["total"] for side in ("off", "on")}
per_call = {side: ledger[side]["requests_per_call"] or 0 for side in ("off", "on")}
ratio = per_call["on"] / max(per_call["off"], 1e-9)
measured = calls['off'] / max(calls['on'], 1)
print(f"usage ledger: {per_call['on']:.2f} requests per backend call with the cache, {per_call['off']:.2f} without: "
      f"{ratio:.1f}x fewer calls (the metrics above: {measured:.1f}x; {100 * (ratio / measured - 1):+.1f}%); "
      f"saved by the cache {ledger['on']['saved_cache_seconds']:.2f} s + dedupe {ledger['on']['saved_dedupe_seconds']:.2f} s "
      f"of backend time against {ledger['on']['used_seconds']:.2f} s used")
PY
