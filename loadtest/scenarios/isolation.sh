#!/usr/bin/env bash
# Isolation: real-time latency alone, then with a micro-batch flood and an offline
# backlog running against the same gateway, for three setups on the same simulated GPUs
# (resnet50-trt, two instances in all):
#
#   separate  tiergate with its tiers on separate pools: real-time on one simulator
#             instance, micro-batch and offline on another; the flood and the backlog
#             arrive at its bulk door (listen.bulk_http, served by the batch threads)
#             unless FLOOD_DOOR=main sends them to the HTTP door with the real-time calls;
#   shared    one pool serving everything (as a one-pool gateway, or nginx, would):
#             tiergate with micro-batching off, every request on one simulator with
#             both instances; the offline backlog drains through the same pool;
#   direct    the control: the real-time calls go straight to the separate setup's
#             real-time simulator, no gateway in their path, while the same flood and
#             backlog go through the separate setup's batch side. What the flood does
#             to these calls is what it does to the machine; separate ÷ direct is what
#             tiergate's real-time side adds to that.
#
# Real-time: RT_RATE/s, one row, budget 100 ms. Flood: FLOOD_RATE/s, one row, budget
# 1 s. Backlog: a Batch API file of BACKLOG requests (default 20,000), which must still
# be draining when the phase ends: a phase whose backlog ran out is measured again with
# twice as many (and so every later phase), so a faster machine gets a bigger backlog
# rather than a quiet end of phase. Each phase is measured for DURATION; the setups
# take turns for ROUNDS rounds, each round starting one setup later. The result is
# real-time p99 with the flood divided by real-time p99 alone, per setup and round, with
# its mean, spread and worst round.
#
#   loadtest/scenarios/isolation.sh [RT_RATE] [FLOOD_RATE] [DURATION] [ROUNDS]   (defaults: 300 1500 15s 5)
#
# The machine's own floor, measured in every round beside the gateways: how late a thread
# on the real-time side wakes from a 1 ms sleep (wakeup_probe, PROBE seconds, default
# 10) with the batch side idle, then with one busy loop on the batch side and nothing
# else running. A virtual machine whose vCPUs share host cores loses time on one vCPU
# when the other is busy (the hypervisor's steal time, reported beside every real-time
# phase); no process inside the machine can keep that out, so the gateways' ratios are
# read beside the machine's own.
#
# On a real deployment the flood's callers and the batch pool's GPUs are other machines.
# Here they share the machine with the gateway. CPUS says how they are kept apart:
#
#   split (default; needs 2 CPUs)  CPU 0 runs the real-time side: the gateways' doors and
#          real-time threads (threads.realtime_cpus = "0", one worker), the real-time
#          load generator and the real-time simulators (the shared setup's too). CPU 1
#          runs the batch side: the gateways' batch threads (threads.batch_cpus = "1"),
#          the flood's load generator and the separate setup's batch simulator. The
#          separate setup's bulk door runs on CPU 1 with the batch threads; the shared
#          setup has one door, on CPU 0 (so has the separate one with FLOOD_DOOR=main).
#   nice   nothing is pinned; the flood's load generator (both setups) and the separate
#          setup's batch simulator run under `nice -n $STANDIN_NICE` (default 10), and
#          the gateways' batch threads at threads.batch_nice = $BATCH_NICE (default 10;
#          the gateway's own default is 0, see docs/performance.md, Bursts).
#
# Writes to $OUT (default target/loadtest/isolation): summary.txt, results.json, each
# phase's JSON and plots (latency over time, latency by percentile).
set -euo pipefail
cd "$(dirname "$0")/../.."
RT_RATE=${1:-300}
FLOOD_RATE=${2:-1500}
DURATION=${3:-15s}
ROUNDS=${4:-5}
BACKLOG=${BACKLOG:-20000}
PROBE=${PROBE:-10}
CPUS=${CPUS:-split}
FLOOD_DOOR=${FLOOD_DOOR:-bulk}
case $FLOOD_DOOR in bulk|main) ;; *) echo "FLOOD_DOOR is bulk or main, not $FLOOD_DOOR" >&2; exit 2 ;; esac
case $CPUS in
  split)
    [ "$(nproc)" -ge 2 ] || { echo "CPUS=split needs 2 CPUs; run with CPUS=nice" >&2; exit 2; }
    RT_SIDE=(taskset -c 0); BATCH_SIDE=(taskset -c 1); STANDIN_NICE=${STANDIN_NICE:-0}; RT_CPU=0
    export TIERGATE_THREADS__REALTIME_CPUS=0 TIERGATE_THREADS__BATCH_CPUS=1 TIERGATE_THREADS__WORKERS=1
    export TIERGATE_THREADS__BATCH_NICE=${BATCH_NICE:-0} ;;
  nice)
    RT_SIDE=(); BATCH_SIDE=(); STANDIN_NICE=${STANDIN_NICE:-10}; RT_CPU=all
    export TIERGATE_THREADS__BATCH_NICE=${BATCH_NICE:-10} ;;
  *) echo "CPUS is split or nice, not $CPUS" >&2; exit 2 ;;
esac
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/isolation}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh

RT=$(free_port); BATCH=$(free_port); SHARED=$(free_port)
"${RT_SIDE[@]}" "$BIN/tiergate" sim --http "127.0.0.1:$RT" --model resnet50:resnet50-trt --instances 1 2>"$WORK/rt.log" & PIDS+=($!)
"${BATCH_SIDE[@]}" nice -n "$STANDIN_NICE" "$BIN/tiergate" sim --http "127.0.0.1:$BATCH" --model resnet50:resnet50-trt --instances 1 2>"$WORK/batch.log" & PIDS+=($!)
"${RT_SIDE[@]}" "$BIN/tiergate" sim --http "127.0.0.1:$SHARED" --model resnet50:resnet50-trt --instances 2 2>"$WORK/shared.log" & PIDS+=($!)

# gateway NAME HTTP_PORT REALTIME_POOL BATCH_POOL MICRO_BATCH [ARGS...]: writes its policy and starts it.
gateway() {
  local name=$1 http=$2 rt=$3 batch=$4 micro=$5 grpc metrics
  shift 5
  grpc=$(free_port); metrics=$(free_port)
  mkdir -p "$WORK/$name/policy"
  cat > "$WORK/$name/policy/route.toml" <<TOML
[routes.resnet50]
models = ["resnet50"]
realtime_below = "300ms"
offline_from = "30s"
[routes.resnet50.flags]
realtime = true
micro_batch = $micro
offline = true
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:$rt"]
max_concurrency = 1024
[routes.resnet50.micro_batch]
endpoints = ["http://127.0.0.1:$batch"]
max_batch = 64
max_wait = "50ms"
max_in_flight = 2
queue_capacity = 8192
TOML
  TIERGATE_OFFLINE__MAX_FILE_LINES=1000000 \
    "$BIN/tiergate" serve --policy-dir "$WORK/$name/policy" --data-dir "$WORK/$name/data" \
    --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" --metrics "127.0.0.1:$metrics" "$@" 2>"$WORK/$name/gw.log" &
  PIDS+=($!)
}
SEPARATE=$(free_port); ONE=$(free_port); BULK=$(free_port)
gateway separate "$SEPARATE" "$RT" "$BATCH" true --bulk-http "127.0.0.1:$BULK"
gateway shared "$ONE" "$SHARED" "$SHARED" false
for port in "$RT" "$BATCH" "$SHARED" "$SEPARATE" "$ONE" "$BULK"; do wait_ready "$port" /v2/health/ready 10; done

backlog_file "$WORK/backlog.jsonl" "$BACKLOG"

SECS=${DURATION%s}
COMMON=(--model resnet50 --rows 1 --cols 16 --binary --timeout 30s)
mkdir -p "$OUT"
: > "$WORK/phases"
: > "$WORK/steal"
# measured NAME COMMAND...: runs it, then notes the steal time on the real-time side.
measured() {
  local name=$1 ticks start
  shift
  ticks=$(steal_ticks "$RT_CPU"); start=$(date +%s.%N)
  "$@"
  echo "$name $(( $(steal_ticks "$RT_CPU") - ticks )) $start $(date +%s.%N)" >> "$WORK/steal"
}
for ROUND in $(seq 1 "$ROUNDS"); do
  echo "round $ROUND, the machine: a 1 ms sleep on the real-time side, the batch side idle, then busy" >&2
  measured "machine_idle_$ROUND" wakeup_probe "$PROBE" "$OUT/machine_idle_$ROUND.json" "${RT_SIDE[@]}"
  "${BATCH_SIDE[@]}" nice -n "$STANDIN_NICE" sh -c 'while :; do :; done' & BUSY=$!
  measured "machine_busy_$ROUND" wakeup_probe "$PROBE" "$OUT/machine_busy_$ROUND.json" "${RT_SIDE[@]}"
  kill "$BUSY"; wait "$BUSY" 2>/dev/null || true
  SETUPS=(separate shared direct)
  for I in 0 1 2; do
    SETUP=${SETUPS[$(( (ROUND - 1 + I) % 3 ))]} # each round starts one setup later
    case $SETUP in
      separate) URL="http://127.0.0.1:$SEPARATE"; BULK_URL=$URL ;;
      shared) URL="http://127.0.0.1:$ONE"; BULK_URL=$URL ;;
      direct) URL="http://127.0.0.1:$RT"; BULK_URL="http://127.0.0.1:$SEPARATE" ;;
    esac
    [ "$SETUP" != shared ] && [ "$FLOOD_DOOR" = bulk ] && BULK_URL="http://127.0.0.1:$BULK"
    echo "round $ROUND, $SETUP: real-time alone" >&2
    measured "${SETUP}_alone_$ROUND" "${RT_SIDE[@]}" "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rate "$RT_RATE" --budget-ms 100 --duration "$DURATION" --warmup 2s \
      --label "${SETUP}_alone_$ROUND" --json "$OUT/${SETUP}_alone_$ROUND.json" --plot "$OUT/${SETUP}_alone_$ROUND" > /dev/null
    while true; do
      echo "round $ROUND, $SETUP: real-time with a flood of $FLOOD_RATE/s and a backlog of $BACKLOG" >&2
      FILE=$(curl -fs -F purpose=batch -F "file=@$WORK/backlog.jsonl" "$BULK_URL/v1/files" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
      B=$(curl -fs -H 'content-type: application/json' "$BULK_URL/v1/batches" \
        -d "{\"input_file_id\":\"$FILE\",\"endpoint\":\"/v2/models/resnet50/infer\",\"completion_window\":\"24h\"}" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
      # The flood starts first and ends last, so it covers the whole measured window.
      "${BATCH_SIDE[@]}" nice -n "$STANDIN_NICE" "$BIN/loadtest" run --url "$BULK_URL" "${COMMON[@]}" --rate "$FLOOD_RATE" --budget-ms 1000 \
        --duration "$((SECS + 4))s" --warmup 1s --label "${SETUP}_flood_$ROUND" --json "$OUT/${SETUP}_floodload_$ROUND.json" > /dev/null &
      FLOOD=$!
      sleep 2 # the flood and the backlog reach a steady state (load shaping, not synchronisation)
      measured "${SETUP}_flood_$ROUND" "${RT_SIDE[@]}" "$BIN/loadtest" run --url "$URL" "${COMMON[@]}" --rate "$RT_RATE" --budget-ms 100 --duration "$DURATION" --warmup 1s \
        --label "${SETUP}_flood_$ROUND" --json "$OUT/${SETUP}_flood_$ROUND.json" --plot "$OUT/${SETUP}_flood_$ROUND" > /dev/null
      wait "$FLOOD"
      # Ended (completed or failed) when the flood, which outlasts the window, ended.
      DONE=$(curl -fs "$BULK_URL/v1/batches/$B" | python3 -c 'import json,sys; c = json.load(sys.stdin)["request_counts"]; print(c["completed"] + c["failed"])')
      curl -fs -X POST "$BULK_URL/v1/batches/$B/cancel" > /dev/null
      for _ in $(seq 1 600); do
        curl -fs "$BULK_URL/v1/batches/$B" | grep -q '"status": *"cancelled"' && break
        sleep 0.1
      done
      [ "$DONE" -lt "$BACKLOG" ] && break
      BACKLOG=$((BACKLOG * 2))
      echo "round $ROUND, $SETUP: the backlog ran out during the phase; measured again with $BACKLOG" >&2
      backlog_file "$WORK/backlog.jsonl" "$BACKLOG"
    done
    echo "$SETUP $ROUND $DONE $BACKLOG" >> "$WORK/phases"
  done
done

python3 - "$OUT" "$WORK/phases" "$RT_RATE" "$FLOOD_RATE" "$SECS" "$CPUS" "$FLOOD_DOOR" "$WORK/steal" "$RT_CPU" <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics, sys
out, phases, rt, flood, secs, cpus, door, steal_file, rt_cpu = sys.argv[1:10]
tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
steal = {}  # phase name -> ms the hypervisor kept from the real-time side per second
for line in open(steal_file):
    name, ticks, start, end = line.split()
    steal[name] = int(ticks) * tick_ms / (float(end) - float(start))
print(f"real-time {rt}/s (budget 100 ms) alone, then with a micro-batch flood of {flood}/s (budget 1 s) and an offline backlog still draining at the end of every phase; CPUS={cpus} FLOOD_DOOR={door}")
print(f"steal: ms per second the hypervisor kept from the real-time side (CPU {rt_cpu}) during the phase; "
      "the machine's rows give a 1 ms sleep's lateness, not a request's latency")
print(f"{'setup':<9} {'round':>5} {'phase':<6} {'rt p50':>7} {'rt p99':>7} {'rt p99.9':>8} {'rt non-200':>10} {'flood ok/s':>10} {'flood p99':>9} {'offline done':>17} {'steal':>6}")
machine = []
for rnd in sorted({int(line.split()[1]) for line in open(phases)}):
    m = {phase: json.load(open(f"{out}/machine_{phase}_{rnd}.json")) for phase in ("idle", "busy")}
    for phase in ("idle", "busy"):
        w = m[phase]
        print(f"{'machine':<9} {rnd:>5} {phase:<6} {w['p50_ms']:>7.2f} {w['p99_ms']:>7.2f} {w['p999_ms']:>8.2f} {'-':>10} {'-':>10} {'-':>9} {'-':>17} {steal[f'machine_{phase}_{rnd}']:>6.1f}")
    machine.append(m["busy"]["p99_ms"] / m["idle"]["p99_ms"])
results = {}
for line in open(phases):
    setup, rnd, done, backlog = line.split()
    p99 = {}
    for phase in ("alone", "flood"):
        s = json.load(open(f"{out}/{setup}_{phase}_{rnd}.json"))
        lat = s["latency_ms"]
        bad = s["completed"] - s["status_counts"].get("200", 0)
        fl, fp99, od = "-", "-", "-"
        if phase == "flood":
            f = json.load(open(f"{out}/{setup}_floodload_{rnd}.json"))
            fl = f"{f['achieved_rps'] * f['status_counts'].get('200', 0) / max(f['completed'], 1):.0f}"
            fp99 = f"{f['latency_ms']['p99']:.1f}"
            od = f"{done} of {backlog}"
        print(f"{setup:<9} {rnd:>5} {phase:<6} {lat['p50']:>7.2f} {lat['p99']:>7.2f} {lat['p999']:>8.2f} {bad:>10} {fl:>10} {fp99:>9} {od:>17} {steal[f'{setup}_{phase}_{rnd}']:>6.1f}")
        p99[phase] = lat["p99"]
    results.setdefault(setup, []).append((p99["alone"], p99["flood"]))
summary = {}
for setup, r in results.items():
    ratios = [f / a for a, f in r]
    alone, flooded = statistics.mean(a for a, _ in r), statistics.mean(f for _, f in r)
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    summary[setup] = {
        "rt_p99_alone_ms": alone, "rt_p99_flood_ms": flooded, "ratio": flooded / alone,
        "round_ratios": ratios, "ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_stdev": spread,
    }
    print(f"{setup}: real-time p99 alone {alone:.2f} ms, with the flood {flooded:.2f} ms: ratio {flooded / alone:.2f}; "
          f"per round {', '.join(f'{x:.2f}' for x in ratios)} (min {min(ratios):.2f}, max {max(ratios):.2f}, "
          f"stdev {spread:.2f}); every round <= 1.10: {'yes' if max(ratios) <= 1.10 else 'no'}")
summary["machine"] = {"round_ratios": machine, "ratio_min": min(machine), "ratio_max": max(machine)}
if "direct" in summary and "separate" in summary:
    over = [t / d for t, d in zip(summary["separate"]["round_ratios"], summary["direct"]["round_ratios"])]
    summary["separate_over_direct"] = over
    print(f"separate ÷ direct (what tiergate's real-time side adds to what the flood does to the machine): "
          f"per round {', '.join(f'{x:.2f}' for x in over)} (min {min(over):.2f}, max {max(over):.2f})")
print(f"the machine itself (a 1 ms sleep's lateness, p99, with a busy loop on the batch side ÷ idle): "
      f"per round {', '.join(f'{x:.2f}' for x in machine)} (min {min(machine):.2f}, max {max(machine):.2f})")
json.dump(summary, open(f"{out}/results.json", "w"), indent=2)
PY
