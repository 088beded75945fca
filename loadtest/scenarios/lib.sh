# Shared by the scenario scripts (sourced, not run): a scratch directory and the
# processes started in it, stopped on exit; free ports; waiting for servers.
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_port PORT: until something accepts TCP connections on it (5 s at most).
wait_port() {
  for _ in $(seq 1 250); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.02
  done
  echo "port $1 never opened" >&2; return 1
}

# wait_ready PORT PATH [SECONDS]: until GET PATH answers 2xx (5 s unless told).
wait_ready() {
  local tries=$(( ${3:-5} * 50 ))
  for _ in $(seq 1 "$tries"); do
    curl -fs -o /dev/null "http://127.0.0.1:$1$2" && return 0
    sleep 0.02
  done
  echo "port $1 never became ready" >&2; return 1
}

# backlog_file PATH N: a Batch API input file of N one-row resnet50 requests.
backlog_file() {
  python3 - "$1" "$2" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [i % 100] * 16}]}
        f.write(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v2/models/resnet50/infer", "body": body}) + "\n")
PY
}
