"""The autoscaler's part in loadtest/scenarios/capacity.sh, played as KEDA (through the
HPA it drives) would: every POLL seconds it reads the gateway's capacity signal (the
`tiergate_endpoints_needed` series Prometheus would scrape), asks for ceil(needed ÷ 1)
endpoints (an AverageValue target of 1, within the HPA's 10% tolerance), scales up at
once (at most doubling, or 4 more, a poll, as the HPA's default scale-up policy) and down
no faster than the ScaledObject in deploy/k8s/autoscaling/keda/ says (the highest
recommendation of the last STABILIZE seconds, one endpoint a minute); it starts or stops
simulator instances and puts them in the route's real-time pool through the admin API
(with the pool's `max_concurrency`, 8 calls an endpoint, so what one endpoint cannot
answer in time is shed at the gateway rather than left to time out at the backend).
Every second it also records the signal and the pool's size.

    autoscale.py TIERGATE_BIN METRICS_PORT ADMIN_PORT TOKEN ROUTE SECONDS OUT_JSON

Stops the simulators it started (by PID) before it exits.
"""

import json
import math
import os
import signal as signals
import socket
import subprocess
import sys
import time
import urllib.request

BIN, METRICS, ADMIN, TOKEN, ROUTE, SECONDS, OUT = sys.argv[1:8]
SECONDS = float(SECONDS)
POLL = 15.0
STABILIZE = 120.0  # scaleDown.stabilizationWindowSeconds of the ScaledObject
DOWN_EVERY = 60.0  # scaleDown policy: one pod per 60 s
TOLERANCE = 0.1  # the HPA's default
MIN, MAX = 1, 8
PROFILE = os.environ.get("PROFILE", "resnet50-eager")
PER_ENDPOINT = 8  # resnet50-eager's 7.6 ms a call: 8 queued answer within 61 ms


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ready(port, limit=10.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit(f"simulator on {port} never became ready")


sims = []  # (port, Popen), oldest first


def start_sim():
    port = free_port()
    log = open(os.path.join(os.path.dirname(OUT), f"sim{port}.log"), "w")
    proc = subprocess.Popen([BIN, "sim", "--http", f"127.0.0.1:{port}", "--model", f"resnet50:{PROFILE}",
                             "--instances", "1"], stdout=subprocess.DEVNULL, stderr=log)
    ready(port)
    sims.append((port, proc))


def stop_sim():
    port, proc = sims.pop()
    proc.terminate()
    proc.wait(timeout=10)


def set_pool():
    # The pool's limit grows with it: PER_ENDPOINT calls each, as many as one instance
    # answers within the budget (more would wait at the backend past their deadline).
    endpoints = [f"http://127.0.0.1:{port}" for port, _ in sims]
    body = json.dumps({"realtime": {"endpoints": endpoints, "max_concurrency": PER_ENDPOINT * len(endpoints)}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{ADMIN}/admin/routes/{ROUTE}", data=body, method="PATCH",
                                 headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json",
                                          "x-tiergate-actor": "capacity.sh"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200, r.read()


def signal():
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS}/metrics", timeout=2) as r:
        text = r.read().decode()
    prefix = f'tiergate_endpoints_needed{{route="{ROUTE}",tier="realtime"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


def main():
    # The pool starts with the one endpoint the scenario's policy names (started here).
    start_sim()
    set_pool()
    open(OUT + ".ready", "w").close()
    start = time.monotonic()
    timeline, decisions, recommendations = [], [], []
    last_poll, last_down = -POLL, -DOWN_EVERY
    while (now := time.monotonic() - start) < SECONDS:
        needed = signal()
        timeline.append({"t": round(now, 3), "needed": needed, "endpoints": len(sims)})
        if needed is not None and now - last_poll >= POLL:
            last_poll = now
            current = len(sims)
            ratio = needed / current
            wanted = current if abs(ratio - 1) <= TOLERANCE else max(MIN, min(MAX, math.ceil(needed)))
            recommendations.append((now, wanted))
            recommendations[:] = [(t, w) for t, w in recommendations if now - t <= STABILIZE]
            if wanted > current:
                target = min(wanted, max(2 * current, current + 4))
            else:
                # Down: the highest recommendation of the window, one endpoint at a time.
                target = max(w for _, w in recommendations)
                if target < current and now - last_down >= DOWN_EVERY:
                    target, last_down = current - 1, now
                else:
                    target = current
            if target != current:
                while len(sims) < target:
                    start_sim()
                if target < current:
                    # Out of the pool first, then stopped: no call is cut.
                    kept = sims[:target]
                    gone = sims[target:]
                    sims[:] = kept
                    set_pool()
                    time.sleep(1)
                    for port, proc in gone:
                        proc.terminate()
                        proc.wait(timeout=10)
                else:
                    set_pool()
                decisions.append({"t": round(now, 3), "needed": needed, "from": current, "to": target})
                print(f"t={now:6.1f}s needed {needed:.2f}: {current} -> {target} endpoints", file=sys.stderr)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start - now)))
    json.dump({"timeline": timeline, "decisions": decisions, "poll_s": POLL, "stabilize_s": STABILIZE},
              open(OUT, "w"), indent=1)


# Stopped early (the scenario's cleanup): the simulators are still stopped.
signals.signal(signals.SIGTERM, lambda *_: sys.exit(1))
try:
    main()
finally:
    while sims:
        stop_sim()
