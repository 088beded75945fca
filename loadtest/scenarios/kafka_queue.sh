#!/usr/bin/env bash
# Jobs per second through the Kafka queue (offline.queue = "kafka"), with one gateway
# replica and then two, in one run, against a tansu broker on loopback (installed once
# by scripts/tansu.sh; in-memory storage) and the simulator (`instant` model, so the
# queue, not the backend, is what is measured). Per setup, on fresh topics (4
# partitions each):
#   - submit: async submissions (Prefer: respond-async) offered at SUBMIT_RATE/s for
#     DURATION, split evenly over the replicas; acknowledged (202) only once the brokers
#     have the job; then the time until every one of them has succeeded;
#   - drain: one Batch API file of BATCH lines, created at the first replica; the time
#     until the batch is completed.
#
#   loadtest/scenarios/kafka_queue.sh [SUBMIT_RATE] [DURATION] [BATCH]    (defaults: 500 10s 20000)
#
# Writes to $OUT (default target/loadtest/kafka_queue): summary.txt and JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
SUBMIT_RATE=${1:-500}
DURATION=${2:-10s}
BATCH=${3:-20000}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/loadtest/kafka_queue}

TANSU=$(scripts/tansu.sh)
cargo build --profile dist --quiet -p tiergate --features tiergate/kafka -p loadtest
BIN=$TARGET_DIR/dist
. loadtest/scenarios/lib.sh
mkdir -p "$OUT"
: > "$WORK/results"

SIM=$(free_port)
"$BIN/tiergate" sim --http "127.0.0.1:$SIM" --model m:instant 2>"$WORK/sim.log" & PIDS+=($!)
wait_ready "$SIM" /v2/health/ready
mkdir -p "$WORK/policy"
cat > "$WORK/policy/jobs.toml" <<TOML
[routes.m]
models = ["m"]
[routes.m.flags]
offline = true
micro_batch = true
[routes.m.realtime]
endpoints = ["http://127.0.0.1:$SIM"]
[routes.m.micro_batch]
endpoints = ["http://127.0.0.1:$SIM"]
max_batch = 64
max_wait = "5ms"
TOML
python3 - "$WORK/batch.jsonl" "$BATCH" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [i % 100] * 4}]}
        f.write(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v2/models/m/infer", "body": body}) + "\n")
PY

# succeeded PORT: jobs the replica's view shows succeeded (every replica sees all jobs).
succeeded() { curl -fs "http://127.0.0.1:$1/metrics" | sed -n 's/^tiergate_offline_jobs{state="succeeded"} //p'; }

for REPLICAS in 1 2; do
  echo "setup: $REPLICAS replica(s)" >&2
  BROKER=$(free_port)
  "$TANSU" broker --listener-url "tcp://127.0.0.1:$BROKER" --advertised-listener-url "tcp://127.0.0.1:$BROKER" \
    --storage-engine memory://tansu/ >/dev/null 2>&1 & TANSU_PID=$!; PIDS+=($TANSU_PID)
  wait_port "$BROKER"
  for TOPIC in jobs states; do
    "$TANSU" topic create --broker "tcp://127.0.0.1:$BROKER" --partitions 4 "$TOPIC" >/dev/null
  done
  HTTP=(); METRICS=(); GWPIDS=()
  for R in $(seq 1 "$REPLICAS"); do
    H=$(free_port); G=$(free_port); M=$(free_port)
    NO_COLOR=1 TIERGATE_OFFLINE__QUEUE=kafka TIERGATE_KAFKA__BROKERS="127.0.0.1:$BROKER" \
      TIERGATE_KAFKA__QUEUE__JOBS=jobs TIERGATE_KAFKA__QUEUE__STATES=states TIERGATE_KAFKA__QUEUE__REPLICA="r$R" \
      TIERGATE_OFFLINE__MAX_FILE_LINES=$((BATCH + 1)) \
      "$BIN/tiergate" serve --policy-dir "$WORK/policy" --data-dir "$WORK/data-$REPLICAS-$R" \
      --http "127.0.0.1:$H" --grpc "127.0.0.1:$G" --metrics "127.0.0.1:$M" 2>"$WORK/gw-$REPLICAS-$R.log" &
    GWPIDS+=($!); PIDS+=($!)
    wait_ready "$H" /v2/health/ready 60
    HTTP+=("$H"); METRICS+=("$M")
  done
  # Until every replica reads its share of the jobs topic (ownership settles in ~2 s).
  for _ in $(seq 1 300); do
    OWNED=0
    for R in $(seq 1 "$REPLICAS"); do
      grep -a "partitions of the jobs topic assigned" "$WORK/gw-$REPLICAS-$R.log" | tail -1 | grep -qv 'partitions=\[\]' \
        && OWNED=$((OWNED + 1))
    done
    [ "$OWNED" = "$REPLICAS" ] && break
    sleep 0.1
  done

  echo "  submit: $SUBMIT_RATE/s for $DURATION" >&2
  START=$(date +%s.%N)
  LOADS=()
  for R in $(seq 1 "$REPLICAS"); do
    "$BIN/loadtest" run --url "http://127.0.0.1:${HTTP[$((R - 1))]}" --model m --rows 1 --cols 4 \
      --rate $((SUBMIT_RATE / REPLICAS)) --duration "$DURATION" --warmup 0s --timeout 30s \
      --header prefer:respond-async --label "submit_${REPLICAS}_$R" --json "$OUT/submit_${REPLICAS}_$R.json" >/dev/null &
    LOADS+=($!)
  done
  wait "${LOADS[@]}"
  ACKED=$(python3 -c "import json,sys; print(sum(json.load(open(f)).get('status_counts',{}).get('202',0) for f in sys.argv[1:]))" \
    "$OUT"/submit_"${REPLICAS}"_*.json)
  for _ in $(seq 1 3000); do
    [ "$(succeeded "${METRICS[0]}")" = "$ACKED" ] && break
    sleep 0.1
  done
  SUBMIT_END=$(date +%s.%N)

  echo "  drain: a batch of $BATCH" >&2
  FILE=$(curl -fs -F purpose=batch -F "file=@$WORK/batch.jsonl" "http://127.0.0.1:${HTTP[0]}/v1/files" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  DRAIN_START=$(date +%s.%N)
  ID=$(curl -fs -H 'content-type: application/json' "http://127.0.0.1:${HTTP[0]}/v1/batches" \
    -d "{\"input_file_id\":\"$FILE\",\"endpoint\":\"/v2/models/m/infer\",\"completion_window\":\"24h\"}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  CREATED=$(date +%s.%N)
  for _ in $(seq 1 6000); do
    STATUS=$(curl -fs "http://127.0.0.1:${HTTP[0]}/v1/batches/$ID" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
    [ "$STATUS" = completed ] && break
    sleep 0.1
  done
  DRAIN_END=$(date +%s.%N)
  PER=()
  for R in $(seq 1 "$REPLICAS"); do
    PER+=("$(curl -fs "http://127.0.0.1:${METRICS[$((R - 1))]}/metrics" \
      | sed -n 's/^tiergate_offline_attempts_total{route="m",result="succeeded"} //p')")
  done
  echo "$REPLICAS $ACKED $START $SUBMIT_END $DRAIN_START $CREATED $DRAIN_END $STATUS ${PER[*]}" >> "$WORK/results"
  for P in "${GWPIDS[@]}" "$TANSU_PID"; do kill "$P" 2>/dev/null || true; wait "$P" 2>/dev/null || true; done
done

python3 - "$OUT" "$WORK/results" "$SUBMIT_RATE" "$DURATION" "$BATCH" <<'PY' | tee "$OUT/summary.txt"
import glob, json, sys
out, results, rate, duration, batch = sys.argv[1:6]
print(f"Kafka queue (tansu, memory storage; 4 partitions): submit {rate}/s for {duration}, then drain a batch of {batch}")
print(f"{'replicas':>8} {'acked':>6} {'ack p50 ms':>10} {'ack p99 ms':>10} {'submit->done jobs/s':>19} "
      f"{'batch create s':>14} {'batch jobs/s':>12} {'status':>9}  jobs run per replica")
jobs = {}
for line in open(results):
    f = line.split()
    n, acked = int(f[0]), int(f[1])
    start, submit_end, drain_start, created, drain_end = map(float, f[2:7])
    status, per = f[7], f[8:]
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/submit_{n}_*.json"))]
    p50 = max(r["latency_ms"]["p50"] for r in runs)
    p99 = max(r["latency_ms"]["p99"] for r in runs)
    jobs[n] = int(batch) / (drain_end - drain_start)
    print(f"{n:>8} {acked:>6} {p50:>10.1f} {p99:>10.1f} {acked / (submit_end - start):>19.0f} "
          f"{created - drain_start:>14.1f} {jobs[n]:>12.0f} {status:>9}  {' '.join(per)}")
if 1 in jobs and 2 in jobs:
    print(f"batch drain, 2 replicas / 1 replica: {jobs[2] / jobs[1]:.2f}")
PY
