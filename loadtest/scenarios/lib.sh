# Shared by the scenario scripts (sourced, not run): a scratch directory and the
# processes started in it, stopped on exit; free ports; waiting for servers.
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# start_gateway NAME HTTP_PORT METRICS_PORT [ADMIN_PORT]: `tiergate serve` on
# $WORK/NAME/policy (which the caller writes), its store in $WORK/NAME/data, its log
# $WORK/NAME/gw.log; with ADMIN_PORT, its admin API there, with the token $ADMIN_TOKEN.
start_gateway() {
  local name=$1 http=$2 metrics=$3 admin=${4:-} grpc
  grpc=$(free_port)
  local env=()
  [ -z "$admin" ] || env=(TIERGATE_LISTEN__ADMIN="127.0.0.1:$admin" TIERGATE_ADMIN__TOKEN="$ADMIN_TOKEN")
  env "${env[@]}" "$BIN/tiergate" serve --policy-dir "$WORK/$name/policy" --data-dir "$WORK/$name/data" \
    --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" --metrics "127.0.0.1:$metrics" 2>"$WORK/$name/gw.log" &
  PIDS+=($!)
}
# The admin token of the gateways a scenario starts with an admin port.
ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
# usage_json ADMIN_PORT: the gateway's usage ledger since the last hour, by route and tier.
usage_json() {
  curl -fs -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:$1/admin/usage?since=1h&by=route,tier"
}
# one_worker_gateway BINARY PORT NAME: `BINARY serve` with one worker thread on PORT,
# the realtime_policy in $WORK/policy, its store in $WORK/NAME, its log $WORK/NAME.log;
# prints its PID (the caller adds it to PIDS).
one_worker_gateway() {
  TIERGATE_THREADS__WORKERS=1 "$1" serve --policy-dir "$WORK/policy" --data-dir "$WORK/$3" \
    --http "127.0.0.1:$2" --grpc "127.0.0.1:$(free_port)" --metrics "127.0.0.1:$(free_port)" >/dev/null 2>"$WORK/$3.log" &
  echo $!
}
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

# cpu_sides shared|split: sets the command prefixes MOST_CPUS and LAST_CPU. split (2 CPUs
# or more): taskset to every CPU but the last, and to the last; shared: both empty.
cpu_sides() {
  case $1 in
    shared) MOST_CPUS=(); LAST_CPU=() ;;
    split)
      local last=$(($(nproc) - 1))
      [ "$last" -ge 1 ] || { echo "CPUS=split needs 2 CPUs" >&2; exit 2; }
      MOST_CPUS=(taskset -c "0-$((last - 1))"); LAST_CPU=(taskset -c "$last") ;;
    *) echo "CPUS is shared or split, not $1" >&2; exit 2 ;;
  esac
}

# realtime_policy BACKEND_URL: $WORK/policy with one real-time-only route for resnet50.
realtime_policy() {
  mkdir -p "$WORK/policy"
  printf '[routes.resnet50]\nmodels = ["resnet50"]\n[routes.resnet50.realtime]\nendpoints = ["%s"]\nmax_concurrency = 1024\n' \
    "$1" > "$WORK/policy/realtime.toml"
}

# relay_policy SIM_PORT MAX_CONCURRENCY [EXTRA]: $WORK/gw/policy/llm.toml, the LLM
# streams scenarios' route: model llama on OpenAI's chat path, the simulator at SIM_PORT
# as its real-time pool, a first token within 2 s (a stream that joins the simulator's
# running step waits for it, then a step for its first token: up to 200 ms), EXTRA
# lines added to the pool's table.
relay_policy() {
  mkdir -p "$WORK/gw/policy"
  printf '[routes.llama]\nmodels = ["llama"]\npaths = ["/v1/chat/completions"]\ndefault_budget = "2s"\nrealtime_below = "5s"\n[routes.llama.realtime]\nendpoints = ["http://127.0.0.1:%s"]\nmax_concurrency = %s\n%s\n' \
    "$1" "$2" "${3:-}" > "$WORK/gw/policy/llm.toml"
}

# start_nginx PORT BACKEND_PORT http|grpc [COMMAND PREFIX...]: nginx with one worker as a
# reverse proxy on PORT to the backend (HTTP/1.1 with upstream keep-alive, or gRPC over
# h2c), config in $WORK, started under the prefix (e.g. taskset -c 0) when one is given.
# Over HTTP, bodies up to 64 MiB (tiergate's default limit) pass through as they arrive
# (no request or answer buffering, which would spill a large tensor to disk), as a
# platform team configures nginx in front of model servers.
start_nginx() {
  nginx_config "$1" "$2" "$3"
  "${@:4}" nginx -c "$WORK/nginx/nginx.conf" & PIDS+=($!)
}

# nginx_worker: the PID of start_nginx's worker process (the master's only child),
# where nginx's work happens.
nginx_worker() { pgrep -P "$(cat "$WORK/nginx/nginx.pid")" | head -1; }

# nginx_config PORT BACKEND_PORT http|grpc: writes start_nginx's config to $WORK/nginx/nginx.conf.
nginx_config() {
  local site
  if [ "$3" = grpc ]; then
    site="upstream sim { server 127.0.0.1:$2; keepalive 64; }
  server { listen 127.0.0.1:$1 http2; location / { grpc_pass grpc://sim; } }"
  else
    site="upstream sim { server 127.0.0.1:$2; keepalive 64; }
  server {
    listen 127.0.0.1:$1;
    location / { proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection \"\";
                 client_max_body_size 64m; proxy_request_buffering off; proxy_buffering off; }
  }"
  fi
  mkdir -p "$WORK/nginx"
  cat > "$WORK/nginx/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections ${NGINX_CONNECTIONS:-1024}; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body; proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fcgi; uwsgi_temp_path $WORK/nginx/uwsgi; scgi_temp_path $WORK/nginx/scgi;
  $site
}
NGINX
}

# haproxy_config PORT BACKEND_PORT: HAProxy in front of the simulator as a platform team
# runs it for comparison: one thread, keep-alive on both sides, idle server connections
# reused by any request (`http-reuse always`), no logging; in the foreground (`-db`).
haproxy_config() {
  mkdir -p "$WORK/haproxy"
  cat > "$WORK/haproxy/haproxy.cfg" <<HAPROXY
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$1
  default_backend sim
backend sim
  server sim 127.0.0.1:$2 maxconn 64
HAPROXY
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

# steal_ticks CPU|all: the time the hypervisor has kept from that CPU (or from every CPU)
# since boot, in USER_HZ ticks (/proc/stat's steal column; 0 on bare metal).
steal_ticks() {
  local row=cpu$1; [ "$1" = all ] && row=cpu
  awk -v row="$row" '$1 == row { print $9 }' /proc/stat
}

# wakeup_probe SECONDS JSON [COMMAND PREFIX...]: how late a thread wakes from a 1 ms
# sleep, again and again for SECONDS, under the prefix (e.g. taskset -c 0): the
# machine's own scheduling noise, with no gateway in it. Writes p50/p99/p99.9 lateness
# in ms to JSON.
wakeup_probe() {
  local secs=$1 json=$2
  shift 2
  "$@" python3 - "$secs" "$json" <<'PY'
import json, sys, time
secs, out = float(sys.argv[1]), sys.argv[2]
late, end = [], time.monotonic() + secs
while time.monotonic() < end:
    t = time.perf_counter()
    time.sleep(0.001)
    late.append((time.perf_counter() - t - 0.001) * 1000)
late.sort()
at = lambda q: late[min(len(late) - 1, int(q * len(late)))]
json.dump({"samples": len(late), "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999)}, open(out, "w"))
PY
}
