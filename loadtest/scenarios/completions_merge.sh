#!/usr/bin/env bash
# Completions coalesced: what merging callers' `/v1/completions` calls into one call
# with `prompt: [...]` (json_adapter = "openai_completions") saves, against the same
# calls sent one per call on the same batch pool, on two engines in turn:
#
#   sim           the simulator's continuous-batching engine (`llm-8b-a100`)
#   llama-server  llama.cpp's server (scripts/llama-server.sh), 4 slots, the tiny
#                 random-weight model of tests/conformance/gguf_model.py, one thread
#                 pinned to the last core
#
# Load: calls at a steady rate (open loop, Poisson arrivals, a thread a call; RATE_SIM
# 20 and RATE_LLAMA 8 a second), each its own short prompt, MAX_TOKENS tokens at temperature
# 0, a 5 s budget (the micro-batch tier), for DURATION a phase; the batch pool has 2
# calls in flight at most (`max_in_flight`), so callers wait, and merge, while both
# are busy. Reports per engine and phase: calls answered and failed, backend calls
# (tiergate_backend_duration_seconds' count) per caller's call, the engine's CPU and
# tiergate's CPU per call answered (their /proc times over the phase), and latency
# p50 / p99. With STREAM=1 every call is streamed (`"stream": true`): a merged batch's
# one stream is cut into a stream per caller, and a call is answered when its stream
# ends with `[DONE]` and carries its own choice only; latency is then to the stream's
# end, and time to its first token is reported beside it.
#
#   loadtest/scenarios/completions_merge.sh [DURATION]    # default 30s; ENGINES="sim llama-server"; STREAM=1
#
# Writes $OUT (default target/loadtest/completions_merge): summary.txt, results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-30s}
RATE_SIM=${RATE_SIM:-20}
RATE_LLAMA=${RATE_LLAMA:-8}
MAX_TOKENS=${MAX_TOKENS:-8}
ENGINES=${ENGINES:-sim llama-server}
STREAM=${STREAM:-0}
SECONDS_LONG=${DURATION%s}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/completions_merge$([ "$STREAM" = 1 ] && echo _streamed)}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh
mkdir -p "$OUT"
: > "$WORK/results.jsonl"

case " $ENGINES " in
  *" llama-server "*)
    LLAMA=$(scripts/llama-server.sh)
    "$(tests/conformance/venv.sh llama)/bin/python" tests/conformance/gguf_model.py "$WORK/tiny.gguf" ;;
esac

# engine_start ENGINE: a fresh engine on a free port; sets ENGINE_PORT and ENGINE_PID.
engine_start() {
  ENGINE_PORT=$(free_port)
  case $1 in
    sim)
      "$BIN/tiergate" sim --http "127.0.0.1:$ENGINE_PORT" --model "m:llm-8b-a100" 2>>"$WORK/engine.log" &
      ENGINE_PID=$!; PIDS+=($!)
      wait_ready "$ENGINE_PORT" /v2/health/ready ;;
    llama-server)
      taskset -c "$(( $(nproc) - 1 ))" "$LLAMA" -m "$WORK/tiny.gguf" --host 127.0.0.1 --port "$ENGINE_PORT" \
        -np 4 -c 4096 -t 1 --metrics --alias m >>"$WORK/engine.log" 2>&1 &
      ENGINE_PID=$!; PIDS+=($!)
      wait_ready "$ENGINE_PORT" /health 120 ;;
  esac
}

# cpu_ms PID: the process's user and system time so far, in milliseconds.
cpu_ms() {
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
}

# backend_calls METRICS_PORT: the calls tiergate sent its backends.
backend_calls() {
  curl -fs "http://127.0.0.1:$1/metrics" | awk '/^tiergate_backend_duration_seconds_count/ { s += $2 } END { print s + 0 }'
}

# phase ENGINE NAME ADAPTER_LINE: the load through a fresh gateway on a fresh engine.
phase() {
  local engine=$1 name=$2 adapter=$3 gw metrics before_engine before_gw before_calls rate=$RATE_SIM
  [ "$engine" = sim ] || rate=$RATE_LLAMA
  engine_start "$engine"
  mkdir -p "$WORK/$engine-$name/policy"
  cat > "$WORK/$engine-$name/policy/cmpl.toml" <<TOML
[routes.cmpl]
models = ["m"]
paths = ["/v1/completions"]
realtime_below = "200ms"
[routes.cmpl.flags]
realtime = false
micro_batch = true
[routes.cmpl.micro_batch]
endpoints = ["http://127.0.0.1:$ENGINE_PORT"]
max_batch = 16
max_in_flight = 2
$adapter
TOML
  gw=$(free_port); metrics=$(free_port)
  start_gateway "$engine-$name" "$gw" "$metrics"
  local gw_pid=${PIDS[-1]}
  wait_ready "$gw" /v2/health/ready
  before_engine=$(cpu_ms "$ENGINE_PID"); before_gw=$(cpu_ms "$gw_pid"); before_calls=$(backend_calls "$metrics")
  python3 - "$gw" "$rate" "$SECONDS_LONG" "$MAX_TOKENS" "$STREAM" > "$WORK/load.json" <<'PY'
import http.client, json, random, sys, threading, time
port, rate, seconds, max_tokens = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
stream = sys.argv[5] == "1"
took, firsts, failed, lock = [], [], {}, threading.Lock()
def streamed(r, due):
    """A stream's first-token time, when it ends with [DONE] and is one choice's (index 0)."""
    first, done, indexes = None, False, set()
    for line in r:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        for choice in chunk.get("choices") or []:
            indexes.add(choice["index"])
            if choice.get("text") and first is None:
                first = time.monotonic() - due
    return first if done and indexes == {0} else None
def one(i, due):
    body = {"model": "m", "prompt": f"caller {i} asks about the gateway", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    if stream:
        body["stream"] = True
    first = None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"content-type": "application/json", "x-tiergate-budget-ms": "5000"})
        r = c.getresponse()
        if stream and r.status == 200:
            first = streamed(r, due)
            ok = first is not None
        else:
            data = r.read()
            ok = r.status == 200 and len(json.loads(data)["choices"]) == 1
        c.close()
        why = None if ok else str(r.status)
    except Exception as e:
        why = type(e).__name__
    with lock:
        if why is None:
            took.append(time.monotonic() - due)
            if first is not None:
                firsts.append(first)
        else:
            failed[why] = failed.get(why, 0) + 1
# Poisson arrivals (a fixed seed): callers come in clumps, as they do.
random.seed(1); start = time.monotonic(); threads = []; due = start
for i in range(int(rate * seconds)):
    due += random.expovariate(rate)
    time.sleep(max(0.0, due - time.monotonic()))
    t = threading.Thread(target=one, args=(i, due)); t.start(); threads.append(t)
for t in threads:
    t.join()
took.sort(); firsts.sort()
q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else 0.0
print(json.dumps({"rate": rate, "answered": len(took), "failed": failed, "p50_ms": q(took, 0.5), "p99_ms": q(took, 0.99),
                  "ttft_p50_ms": q(firsts, 0.5), "ttft_p99_ms": q(firsts, 0.99)}))
PY
  python3 - "$engine" "$name" "$(backend_calls "$metrics")" "$before_calls" "$(cpu_ms "$ENGINE_PID")" "$before_engine" \
    "$(cpu_ms "$gw_pid")" "$before_gw" "$WORK/load.json" >> "$WORK/results.jsonl" <<'PY'
import json, sys
engine, name = sys.argv[1:3]
calls, calls0, e1, e0, g1, g0 = map(float, sys.argv[3:9])
load = json.load(open(sys.argv[9]))
n = max(load["answered"] + sum(load["failed"].values()), 1)
answered = max(load["answered"], 1)
print(json.dumps({"engine": engine, "phase": name, **load, "backend_calls": calls - calls0,
                  "calls_per_request": (calls - calls0) / n, "engine_cpu_ms_per_request": (e1 - e0) / answered,
                  "gateway_cpu_ms_per_request": (g1 - g0) / answered}))
PY
  kill "$gw_pid" "$ENGINE_PID" 2>/dev/null || true
  wait "$gw_pid" "$ENGINE_PID" 2>/dev/null || true
}

for engine in $ENGINES; do
  echo "$engine: one call each" >&2
  phase "$engine" one ""
  echo "$engine: merged" >&2
  phase "$engine" merged 'json_adapter = "openai_completions"'
done

python3 - "$WORK/results.jsonl" "$OUT" "$MAX_TOKENS" "$DURATION" "$STREAM" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, tokens, duration, stream = sys.argv[2:6]
kind = "streamed calls" if stream == "1" else "calls"
print(f"Completions coalesced: {kind} of {tokens} tokens, open loop, {duration} a phase, 2 backend calls in flight at most")
by = {}
for r in rows:
    by.setdefault(r["engine"], {})[r["phase"]] = r
    ttft = f"; first token p50 {r['ttft_p50_ms']:.0f} ms, p99 {r['ttft_p99_ms']:.0f} ms" if stream == "1" else ""
    print(f"{r['engine']} {r['phase']} ({r['rate']:g}/s): {r['answered']} answered, failed {r['failed'] or 0}; "
          f"{r['calls_per_request']:.3f} backend calls a call; engine CPU {r['engine_cpu_ms_per_request']:.2f} ms "
          f"and tiergate CPU {r['gateway_cpu_ms_per_request']:.2f} ms a call; p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms{ttft}")
for engine, p in by.items():
    if "one" in p and "merged" in p:
        one, merged = p["one"], p["merged"]
        calls = one["calls_per_request"] / max(merged["calls_per_request"], 1e-9)
        cpu = merged["engine_cpu_ms_per_request"] / max(one["engine_cpu_ms_per_request"], 1e-9)
        print(f"{engine}: merged, {calls:.1f}x fewer backend calls; the engine's CPU a call answered x{cpu:.2f} of one call each")
json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=2)
PY
