#!/usr/bin/env bash
# LLM isolation: what a bulk flood does to interactive chat streams, on the simulator's
# continuous-batching engine (`tiergate sim`, PROFILE, default llm-8b-a100: Llama-3-8B
# under vLLM on one A100; a step costs 8 ms + 0.05 ms a sequence it computes, a
# prompt's prefill 0.083 ms a token, at most 2,048 tokens a step with the decodes
# (vLLM V1's chunked prefill); 256 sequences; 440,000 tokens of KV cache; admission and
# preemption as vLLM's).
#
# Interactive: chat streams of a short prompt and TOKENS (100) tokens, RATE (2) a second,
# open loop (`loadtest streams --rate`), each with a 1 s budget (the real-time tier).
# Bulk: prompts of 2,000 words (a token each) and 500 tokens, at 10× the interactive
# token rate: sent straight to the engine in (a) as an open-loop flood, and through
# the Batch API (one file, drained as fast as the batch pool's window lets it) in
# (b) and (c). Five phases of DURATION (default 90s), each on fresh engines:
#
#   alone     (d) the interactive streams alone, through tiergate (real-time pool A)
#   max       the bulk lines alone through tiergate's window on batch pool B: the
#             batch pool's maximum, in tokens a second
#   direct    (a) no gateway, one shared engine: the streams and the flood straight to A
#   separate  (b) tiergate, separate pools: streams on A, the Batch API lines on B
#   shared    (c) tiergate, one shared pool held back: streams on A, the lines through
#             the window onto A too, held back while the streams' mean time to first
#             token is above INTERACTIVE_TTFT (default 60ms)
#
# The batch pool's window: max_sequences 256 (the engine's), max_tokens_in_flight
# 440000 (its KV cache), vLLM's signals every 250 ms. Reports the interactive TTFT p50
# and p99 and TPOT p99 of each phase divided by alone's, the bulk tokens a second divided
# by the batch pool's maximum (for shared: by the spare capacity, the maximum less the
# interactive streams' tokens a second), and the tokens and money the Batch API lines
# saved against the real-time price (the usage ledger, [usage.prices]: real time
# 0.20/0.60, offline 0.10/0.30 USD per million prompt/completion tokens). Goals: separate
# TTFT p99 ≤ 1.10× alone with bulk ≥ 0.90 of the maximum; shared TTFT p99 ≤ 1.5× alone
# with bulk ≥ 0.7 of the spare capacity.
#
# With ENGINE=llama-server, the same phases at small scale on llama.cpp's server (built by
# scripts/llama-server.sh) with 4 slots, on the tiny random-weight model
# tests/conformance/gguf_model.py writes (a byte a token, about 9 ms a token on one
# core), each server pinned to a core of its own (A on the first, B on the last):
# interactive RATE (0.5) a second of TOKENS (16) tokens, bulk prompts of 500 bytes and 64
# tokens; the window max_sequences 4, max_tokens_in_flight 4096 (the server's context),
# llama-server's signals; held back above 150ms.
#
# CHUNK=N gives the simulator's engines N tokens a step in place of the profile's 2,048
# (`tiergate sim --max-batched-tokens`, vLLM's `max_num_batched_tokens`): the engine
# setting that decides how long an interactive call can wait behind a bulk prompt's
# prefill on one shared pool. LONG_PREFILL=N has them prefill a prompt longer than N
# tokens one at a time, N tokens a step, so shorter prompts pass it
# (`--long-prefill-tokens`, vLLM's `long_prefill_token_threshold` with
# `max_long_partial_prefills` 1).
#
#   loadtest/scenarios/llm_isolation.sh [DURATION]
#   CHUNK=256 loadtest/scenarios/llm_isolation.sh [DURATION]
#   LONG_PREFILL=48 loadtest/scenarios/llm_isolation.sh [DURATION]   (one shared pool's goal met)
#   ENGINE=llama-server loadtest/scenarios/llm_isolation.sh [DURATION]
#
# Writes to $OUT (default target/loadtest/llm_isolation): summary.txt, results.json,
# each phase's JSON and its TTFT-over-time plot (PHASE/ttft_over_time.svg).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${1:-90s}
ENGINE=${ENGINE:-sim}
case $ENGINE in
  sim)
    RATE=${RATE:-2} TOKENS=${TOKENS:-100} PROFILE=${PROFILE:-llm-8b-a100} INTERACTIVE_TTFT=${INTERACTIVE_TTFT:-60ms}
    CHUNK=${CHUNK:-} LONG_PREFILL=${LONG_PREFILL:-}
    BULK_WORDS=2000 BULK_TOKENS=500 MAX_SEQUENCES=256 MAX_TOKENS=440000 SIGNALS=vllm ;;
  llama-server)
    RATE=${RATE:-0.5} TOKENS=${TOKENS:-16} PROFILE="llama-server, 4 slots, a tiny model" INTERACTIVE_TTFT=${INTERACTIVE_TTFT:-150ms}
    # "word " is 5 bytes: 500 tokens.
    BULK_WORDS=100 BULK_TOKENS=64 MAX_SEQUENCES=4 MAX_TOKENS=4096 SIGNALS=llama_server ;;
  *) echo "ENGINE is sim or llama-server" >&2; exit 2 ;;
esac
BULK_RATE=$(python3 -c "print($RATE * $TOKENS * 10 / $BULK_TOKENS)")
SECONDS_LONG=$(python3 -c "import re; d='$DURATION'; print(int(re.match(r'(\d+)', d).group(1)) * (60 if d.endswith('m') else 1))")
# Lines enough that the window never runs dry within a phase.
BULK_LINES=${BULK_LINES:-$(python3 -c "print(int($BULK_RATE * $SECONDS_LONG * 2))")}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/llm_isolation${ENGINE#sim}${CHUNK:+-chunk$CHUNK}${LONG_PREFILL:+-long$LONG_PREFILL}}
OUT=${OUT%-}

cargo build --profile dist --quiet -p tiergate -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh
mkdir -p "$OUT"

PHASE_PIDS=()
stop_phase() { for p in "${PHASE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; PHASE_PIDS=(); }

if [ "$ENGINE" = llama-server ]; then
  LLAMA=$(scripts/llama-server.sh)
  "$(tests/conformance/venv.sh llama)/bin/python" tests/conformance/gguf_model.py "$WORK/tiny.gguf"
fi
CORES=$(nproc)

# engine_start VAR A|B: a fresh engine on a free port, its port in VAR (llama-server: A
# pinned to the first core, B to the last).
engine_start() {
  local port; port=$(free_port)
  case $ENGINE in
    sim)
      "$BIN/tiergate" sim --http "127.0.0.1:$port" --model "llama:$PROFILE" ${CHUNK:+--max-batched-tokens "$CHUNK"} \
        ${LONG_PREFILL:+--long-prefill-tokens "$LONG_PREFILL"} \
        2>>"$WORK/engine.log" & ;;
    llama-server)
      local core=0; [ "$2" = A ] || core=$((CORES - 1))
      taskset -c "$core" "$LLAMA" -m "$WORK/tiny.gguf" --host 127.0.0.1 --port "$port" -np 4 -c 4096 -t 1 \
        --metrics --alias llama >>"$WORK/engine.log" 2>&1 & ;;
  esac
  PIDS+=($!); PHASE_PIDS+=($!)
  case $ENGINE in
    sim) wait_ready "$port" /v2/health/ready ;;
    llama-server) wait_ready "$port" /health 120 ;;
  esac
  printf -v "$1" '%s' "$port"
}

# generated PORT: the tokens the engine on PORT has generated.
generated() {
  curl -fs "http://127.0.0.1:$1/metrics" \
    | awk '/^(vllm:generation_tokens_total|llamacpp:tokens_predicted_total)/ { s += $2 } END { print s + 0 }'
}

# gateway_start NAME REALTIME_PORT BATCH_PORT EXTRA_WINDOW_LINES: tiergate with route
# `chat` (real time on the first engine, its batch pool and window on the second);
# sets GW and GW_ADMIN.
gateway_start() {
  local name=$1 rt=$2 batch=$3 extra=$4 metrics
  mkdir -p "$WORK/$name/policy"
  cat > "$WORK/$name/policy/chat.toml" <<TOML
[usage.prices]
currency = "USD"
realtime = { prompt = 0.20, completion = 0.60 }
offline = { prompt = 0.10, completion = 0.30 }

[routes.chat]
models = ["llama"]
paths = ["/v1/chat/completions"]
realtime_below = "2s"
[routes.chat.flags]
realtime = true
micro_batch = true
offline = true
[routes.chat.realtime]
endpoints = ["http://127.0.0.1:$rt"]
[routes.chat.micro_batch]
endpoints = ["http://127.0.0.1:$batch"]
max_batch = 256
queue_capacity = 4096
[routes.chat.micro_batch.window]
max_sequences = $MAX_SEQUENCES
max_tokens_in_flight = $MAX_TOKENS
signals = "$SIGNALS"
signal_interval = "250ms"
$extra
TOML
  GW=$(free_port); metrics=$(free_port); GW_ADMIN=$(free_port)
  TIERGATE_OFFLINE__MAX_FILE_LINES=$((BULK_LINES + 1)) start_gateway "$name" "$GW" "$metrics" "$GW_ADMIN"
  PHASE_PIDS+=("${PIDS[-1]}")
  wait_ready "$GW" /v2/health/ready
}

# bulk_file PATH N: a Batch API input file of N bulk chat calls.
bulk_file() {
  python3 - "$1" "$2" "$BULK_WORDS" "$BULK_TOKENS" <<'PY'
import json, sys
path, n, words, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(path, "w") as f:
    for i in range(n):
        body = {"model": "llama", "max_tokens": tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"summary {i}: " + "word " * (words - 2)}]}
        f.write(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
PY
}
bulk_file "$WORK/bulk.jsonl" "$BULK_LINES"

# submit_bulk: the bulk file as a batch on the gateway at $GW.
submit_bulk() {
  local file
  file=$(curl -fs -F purpose=batch -F "file=@$WORK/bulk.jsonl" "http://127.0.0.1:$GW/v1/files" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  curl -fs -H 'content-type: application/json' "http://127.0.0.1:$GW/v1/batches" \
    -d "{\"input_file_id\":\"$file\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" >/dev/null
}

INTERACTIVE=(--model llama --ignore-eos --rate "$RATE" --tokens "$TOKENS" --duration "$DURATION" --header x-tiergate-budget-ms:1000)
# interactive PHASE URL: the streams against URL for the phase.
interactive() {
  "$BIN/loadtest" streams --url "$2" "${INTERACTIVE[@]}" --label "$1" --json "$OUT/$1.json" --plot "$OUT/$1" \
    > "$OUT/$1.txt" 2>/dev/null
  cat "$OUT/$1.txt" >&2
}

# Each phase's bulk tokens a second: what its engine generated over the phase, less the
# interactive streams' tokens when they shared it.
: > "$WORK/bulk_rates"

echo "alone: $RATE streams/s of $TOKENS tokens through tiergate, nothing else" >&2
engine_start A A; engine_start B B
gateway_start alone "$A" "$B" ""
interactive alone "http://127.0.0.1:$GW"
stop_phase

echo "max: the bulk lines alone through the window on the batch pool" >&2
engine_start A A; engine_start B B
gateway_start max "$A" "$B" ""
submit_bulk
sleep 5 # the first lines' prefill
before=$(generated "$B"); sleep "$SECONDS_LONG"; after=$(generated "$B")
echo "max $(( (after - before) / SECONDS_LONG ))" >> "$WORK/bulk_rates"
usage_json "$GW_ADMIN" > "$OUT/max_usage.json" || true
stop_phase

echo "direct (a): the streams and a flood of $BULK_RATE bulk streams/s straight to one engine" >&2
engine_start A A
"$BIN/loadtest" streams --url "http://127.0.0.1:$A" --model llama --rate "$BULK_RATE" --tokens "$BULK_TOKENS" --ignore-eos \
  --prompt-words "$BULK_WORDS" --duration "$DURATION" --label bulk --json "$OUT/direct_bulk.json" > /dev/null 2>&1 &
FLOOD=$!; PIDS+=($FLOOD)
sleep 5
before=$(generated "$A")
interactive direct "http://127.0.0.1:$A"
after=$(generated "$A")
echo "direct $(python3 -c "import json; r=json.load(open('$OUT/direct.json')); print(int(($after - $before - r['events']) / $SECONDS_LONG))")" >> "$WORK/bulk_rates"
kill "$FLOOD" 2>/dev/null || true
stop_phase

echo "separate (b): the streams on pool A, the Batch API lines on pool B" >&2
engine_start A A; engine_start B B
gateway_start separate "$A" "$B" ""
submit_bulk
sleep 5
before=$(generated "$B")
interactive separate "http://127.0.0.1:$GW"
after=$(generated "$B")
echo "separate $(( (after - before) / SECONDS_LONG ))" >> "$WORK/bulk_rates"
usage_json "$GW_ADMIN" > "$OUT/separate_usage.json" || true
stop_phase

echo "shared (c): the streams and the lines on one pool, held back above $INTERACTIVE_TTFT" >&2
engine_start A A
gateway_start shared "$A" "$A" "interactive_ttft = \"$INTERACTIVE_TTFT\""
submit_bulk
sleep 5
before=$(generated "$A")
interactive shared "http://127.0.0.1:$GW"
after=$(generated "$A")
echo "shared $(python3 -c "import json; r=json.load(open('$OUT/shared.json')); print(int(($after - $before - r['events']) / $SECONDS_LONG))")" >> "$WORK/bulk_rates"
usage_json "$GW_ADMIN" > "$OUT/shared_usage.json" || true
stop_phase

python3 - "$OUT" "$WORK/bulk_rates" "$RATE" "$TOKENS" "$DURATION" "$PROFILE${CHUNK:+ with $CHUNK tokens a step}${LONG_PREFILL:+, long prompts one at a time $LONG_PREFILL tokens a step}" "$BULK_WORDS" "$BULK_TOKENS" "$ENGINE" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
out, rates_path, rate, tokens, duration, profile, words, bulk_tokens, engine = sys.argv[1:10]
prompt = f"{int(words):,}-token" if engine == "sim" else f"{int(words) * 5:,}-byte"
rates = dict(line.split() for line in open(rates_path) if line.strip())
rates = {k: float(v) for k, v in rates.items()}
phase = {p: json.load(open(os.path.join(out, f"{p}.json"))) for p in ["alone", "direct", "separate", "shared"]}
alone = phase["alone"]
interactive_tps = alone["events_per_second"]
maximum = rates["max"]
spare = max(maximum - interactive_tps, 1.0)
print(f"LLM isolation, {profile}, {rate} interactive streams/s of {tokens} tokens, bulk {prompt} prompts and {bulk_tokens} tokens at 10x, {duration} a phase")
print(f"alone: TTFT p50 {alone['ttft_us'][0]/1e3:.1f} ms, p99 {alone['ttft_us'][1]/1e3:.1f} ms, TPOT p99 {alone['tpot_us'][1]/1e3:.1f} ms; batch pool maximum {maximum:.0f} bulk tokens/s")
results = {"alone": alone, "max_tokens_per_second": maximum, "phases": {}}
for name, label in [("direct", "(a) no gateway, one shared engine"), ("separate", "(b) tiergate, separate pools"),
                    ("shared", "(c) tiergate, one pool held back")]:
    r = phase[name]
    ttft50 = r["ttft_us"][0] / alone["ttft_us"][0]
    ttft99 = r["ttft_us"][1] / alone["ttft_us"][1]
    tpot99 = r["tpot_us"][1] / alone["tpot_us"][1]
    against = spare if name == "shared" else maximum
    bulk = rates[name] / against
    of = "spare capacity" if name == "shared" else "the batch pool's maximum"
    failed = r["failed"]
    print(f"{label}: TTFT p50 x{ttft50:.2f}, p99 x{ttft99:.2f}, TPOT p99 x{tpot99:.2f}; bulk {rates[name]:.0f} tokens/s = {bulk:.2f} of {of}; {failed} streams failed")
    results["phases"][name] = {"ttft_p50_ratio": ttft50, "ttft_p99_ratio": ttft99, "tpot_p99_ratio": tpot99,
                               "bulk_tokens_per_second": rates[name], "bulk_ratio": bulk, "failed": failed}
for name in ["separate", "shared"]:
    path = os.path.join(out, f"{name}_usage.json")
    try:
        usage = json.load(open(path))
    except (OSError, ValueError):
        continue
    total = usage.get("total", {})
    cost = total.get("token_cost") or {}
    print(f"{name}: {total.get('prompt_tokens', 0):,} prompt and {total.get('completion_tokens', 0):,} output tokens; "
          f"cost {cost.get('used', 0):.4f} {cost.get('currency', '')}, {cost.get('saved', 0):.4f} saved against the real-time price")
    results["phases"][name]["usage"] = total
b, c = results["phases"]["separate"], results["phases"]["shared"]
print(f"goal (b) TTFT p99 <= 1.10x alone and bulk >= 0.90 of the maximum: {'met' if b['ttft_p99_ratio'] <= 1.10 and b['bulk_ratio'] >= 0.90 else 'not met'}")
print(f"goal (c) TTFT p99 <= 1.5x alone and bulk >= 0.7 of spare capacity: {'met' if c['ttft_p99_ratio'] <= 1.5 and c['bulk_ratio'] >= 0.7 else 'not met'}")
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=2)
PY
