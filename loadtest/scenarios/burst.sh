#!/usr/bin/env bash
# Bursts: micro-batch traffic at BASE/s (one row, budget 1 s) with a spike to 20x BASE
# for one second every ten, against tiergate in front of one simulated GPU
# (resnet50-eager, one instance: about 5,000 rows/s at full batches, below the spike).
# During a spike the gateway must shed what it cannot serve in time (429 when the
# queue is full, 503 when the learned cost says the budget cannot be met), keep its
# memory bounded, serve every admitted request within its budget, and recover after.
#
#   loadtest/scenarios/burst.sh [BASE] [DURATION]        (defaults: 300 40s)
#
# RESERVE (default 0.1) is the gateway's limits.budget_reserve: the share of each budget
# its tiers leave for the time outside it (the spike's connections waiting to be read,
# the answers to be written). RESERVE=0 aims at the whole budget.
#
# CPUS=split (needs 2 CPUs) runs the load generator alone on the last CPU and the
# gateway and the simulator on the others, as the callers would be other machines;
# CPUS=shared (the default) lets them all share every CPU, so the generator's own
# sends fall behind in a spike (its send lag is in the summary).
#
# Writes to $OUT (default target/loadtest/burst): summary.txt, burst.json, rss.txt and
# fds.txt (the gateway's resident memory and open descriptors every 100 ms) and plots.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:-300}
DURATION=${2:-40s}
RESERVE=${RESERVE:-0.1}
CPUS=${CPUS:-shared}
PEAK=$((BASE * 20))
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/burst}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh
cpu_sides "$CPUS"
SERVER_SIDE=("${MOST_CPUS[@]}"); CLIENT_SIDE=("${LAST_CPU[@]}")

SIM=$(free_port); GW=$(free_port); GWG=$(free_port); GWM=$(free_port)
"${SERVER_SIDE[@]}" "$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model resnet50:resnet50-eager --instances 1 2>"$WORK/sim.log" & PIDS+=($!)
mkdir -p "$WORK/policy"
cat > "$WORK/policy/burst.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
[routes.resnet50.flags]
realtime = true
micro_batch = true
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:$SIM"]
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = 64
max_wait = "50ms"
max_in_flight = 2
queue_capacity = 4096
TOML
TIERGATE_LIMITS__BUDGET_RESERVE=$RESERVE "${SERVER_SIDE[@]}" "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data" \
  --http "127.0.0.1:$GW" --grpc "127.0.0.1:$GWG" --metrics "127.0.0.1:$GWM" 2>"$WORK/gw.log" & GWPID=$!
PIDS+=($GWPID)
wait_ready "$SIM" /v2/health/ready
wait_ready "$GW" /v2/health/ready

mkdir -p "$OUT"
# Resident memory of the gateway (KiB) and its open descriptors (client connections,
# backend connections and files) every 100 ms while the load runs.
( while kill -0 "$GWPID" 2>/dev/null; do
    awk '/^VmRSS:/ { print $2 }' "/proc/$GWPID/status" 2>/dev/null || true
    sleep 0.1
  done ) > "$OUT/rss.txt" & PIDS+=($!)
( while kill -0 "$GWPID" 2>/dev/null; do
    ls "/proc/$GWPID/fd" 2>/dev/null | wc -l
    sleep 0.1
  done ) > "$OUT/fds.txt" & PIDS+=($!)

"${CLIENT_SIDE[@]}" "$BIN/loadtest" run --url "http://127.0.0.1:$GW" --model resnet50 --rows 1 --cols 16 --binary \
  --rate "$BASE" --schedule "burst:peak=$PEAK,every=10s,for=1s" --duration "$DURATION" --warmup 2s \
  --budget-ms 1000 --timeout 30s --label burst --json "$OUT/burst.json" --plot "$OUT" > /dev/null
curl -fs "http://127.0.0.1:$GWM/metrics" > "$OUT/metrics.txt"

python3 - "$OUT" "$BASE" "$PEAK" "$RESERVE" "$CPUS" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out, base, peak, reserve, cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
s = json.load(open(f"{out}/burst.json"))
st = s["status_counts"]
ok = st.get("200", 0)
shed = {k: v for k, v in st.items() if k in ("429", "503")}
admitted = sum(v for k, v in st.items() if k not in ("429", "503"))
within = s["ok_within_budget"]
rss = [int(x) for x in open(f"{out}/rss.txt").read().split() if x.isdigit()]
print(f"micro-batch {base}/s with 1 s spikes to {peak}/s every 10 s (budget 1 s), resnet50-eager x1, budget_reserve {reserve}, CPUS={cpus}")
print(f"requests {s['completed']}: served 200 {ok}, shed {shed}, other {dict((k, v) for k, v in st.items() if k not in ('200', '429', '503'))}, transport errors {s['errors']}")
print(f"admitted (not shed) {admitted}; served within the 1 s budget: {within} of {admitted} = {100 * within / max(admitted, 1):.2f}%")
print(f"served latency ms: p50 {s['ok_latency_ms']['p50']:.1f}, p99 {s['ok_latency_ms']['p99']:.1f}, max {s['ok_latency_ms']['max']:.1f}")
lag = s["send_lag_ms"]
print(f"load generator's send lag ms (sent after the intended time; counted in the latency): p99 {lag['p99']:.1f}, max {lag['max']:.1f}")
print(f"gateway resident memory: peak {max(rss) / 1024:.1f} MiB, at rest {min(rss) / 1024:.1f} MiB ({len(rss)} samples)")
fds = [int(x) for x in open(f"{out}/fds.txt").read().split() if x.isdigit()]
print(f"gateway open descriptors (connections and files): peak {max(fds)}, at rest {min(fds)}")
# Recovery: p99 per second, the second before each spike against the seconds after it.
series = {x["second"]: x for x in s["series"]}
spikes = [t for t in range(8, len(series), 10)]
for t in spikes:
    before = series.get(t - 1, {}).get("p99_ms", float("nan"))
    during = series.get(t, {}).get("p99_ms", float("nan"))
    after = [series.get(t + k, {}).get("p99_ms", float("nan")) for k in (1, 2, 3)]
    print(f"spike at {t:>2} s: p99 before {before:.1f} ms, during {during:.1f} ms, then " + ", ".join(f"{a:.1f}" for a in after) + " ms")
PY
