"""The alert round trip, for real: a gateway in front of a simulated backend, the
distribution's Prometheus scraping it with deploy/prometheus/alerts.yml, and its
Alertmanager routing with deploy/prometheus/alertmanager.yml to a webhook of ours.
The backend is stopped: TiergatePoolDown (the backend-down page) and TiergateSLOBurnFast
(the SLO page) must reach Alertmanager's API and the page receiver; the backend comes
back: TiergatePoolDown must resolve, in the API and as a resolved notification.

    alerts_test.py TIERGATE_BINARY PROMETHEUS ALERTMANAGER

The rules and routes are the shipped ones with the waits shortened so a run takes
about a minute: every `for:` becomes 2s, Alertmanager's group waits 1s, Prometheus
scrapes and evaluates every second. Every process is ours, started here on loopback
ports picked here, and stopped by its PID.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
TIERGATE, PROMETHEUS, ALERTMANAGER = sys.argv[1:4]
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def until(what, limit, pred):
    """Polls `pred` every 250 ms until it returns something true; fails after `limit` s."""
    end = time.monotonic() + limit
    while True:
        try:
            got = pred()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise SystemExit(f"alerts: {what} did not happen within {limit} s")
        time.sleep(0.25)


class Processes:
    """Processes started here, stopped by PID (SIGTERM, then SIGKILL) in reverse order."""

    def __init__(self, logs):
        self.running, self.logs = [], logs

    def start(self, name, argv, env=None):
        log = open(self.logs / f"{name}.log", "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.running.append((name, p))
        return p

    def stop(self, p):
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()

    def stop_all(self):
        for _, p in reversed(self.running):
            self.stop(p)


class Webhook(BaseHTTPRequestHandler):
    """Alertmanager's receivers post here: /page and /ticket."""

    received = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Webhook.received.append((self.path.strip("/"), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def notified(receiver, alert, status):
    return any(r == receiver and any(a["labels"]["alertname"] == alert and a["status"] == status for a in body["alerts"])
               for r, body in Webhook.received)


def main():
    work = Path(tempfile.mkdtemp(prefix="tiergate-alerts-"))
    procs = Processes(work)
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    sim, http, grpc, metrics, prom, am = (free_port() for _ in range(6))
    try:
        # The gateway and its backend.
        sim_argv = [TIERGATE, "sim", "--http", f"127.0.0.1:{sim}", "--model", "m:instant"]
        backend = procs.start("sim", sim_argv)
        policies = work / "policies"
        policies.mkdir()
        (policies / "alerts.toml").write_text(
            f'[routes.r]\nmodels = ["m"]\n[routes.r.realtime]\nendpoints = ["http://127.0.0.1:{sim}"]\n'
            '[routes.r.realtime.health]\neject_after = 1\neject_for = "1m"\ncheck_interval = "200ms"\n')
        env = {"PATH": os.environ["PATH"], "TIERGATE_POLICY_DIR": str(policies), "TIERGATE_DATA_DIR": str(work / "data"),
               "TIERGATE_LISTEN__HTTP": f"127.0.0.1:{http}", "TIERGATE_LISTEN__GRPC": f"127.0.0.1:{grpc}",
               "TIERGATE_LISTEN__METRICS": f"127.0.0.1:{metrics}"}
        procs.start("tiergate", [TIERGATE, "serve"], env)
        until("the gateway is ready", 30, lambda: urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status == 200)

        # Real-time traffic throughout, so the SLO has something to measure.
        stop = threading.Event()

        def traffic():
            while not stop.is_set():
                req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/m/infer", data=BODY,
                                             headers={"content-type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=2).read()
                except OSError:
                    pass
                time.sleep(0.02)

        threading.Thread(target=traffic, daemon=True).start()

        # Prometheus with the shipped rules, Alertmanager with the shipped routes.
        rules = re.sub(r"^(\s+)for: \S+$", r"\1for: 2s", (HERE / "prometheus/alerts.yml").read_text(), flags=re.M)
        (work / "alerts.yml").write_text(rules)
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "alerts.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am}"]}]}]},
            "scrape_configs": [{"job_name": "tiergate", "static_configs": [{"targets": [f"127.0.0.1:{metrics}"]}]}],
        }))
        routing = yaml.safe_load((HERE / "prometheus/alertmanager.yml").read_text())
        for route in [routing["route"], *routing["route"].get("routes", [])]:
            route.update({"group_wait": "1s", "group_interval": "1s"})
        for receiver in routing["receivers"]:
            url = f"http://127.0.0.1:{hook.server_port}/{receiver['name']}"
            receiver["webhook_configs"] = [{"url": url, "send_resolved": True}]
        (work / "alertmanager.yml").write_text(yaml.safe_dump(routing))
        procs.start("alertmanager", [ALERTMANAGER, f"--config.file={work / 'alertmanager.yml'}", f"--storage.path={work / 'am'}",
                                     f"--web.listen-address=127.0.0.1:{am}", "--cluster.listen-address="])
        procs.start("prometheus", [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom}", "--rules.alert.resend-delay=1s"])
        until("Prometheus scrapes the gateway", 60, lambda: any(
            r["value"][1] == "1" for r in get_json(f"http://127.0.0.1:{prom}/api/v1/query?query=up")["data"]["result"]))
        until("real-time requests are counted for the SLO", 30, lambda: get_json(
            f"http://127.0.0.1:{prom}/api/v1/query?query=tiergate_slo_requests_total")["data"]["result"])

        def active():
            return {a["labels"]["alertname"]: a for a in get_json(f"http://127.0.0.1:{am}/api/v2/alerts")}

        # The backend goes down.
        t0 = time.monotonic()
        procs.stop(backend)
        firing = until("TiergatePoolDown and TiergateSLOBurnFast reach Alertmanager", 90,
                       lambda: (lambda a: a if {"TiergatePoolDown", "TiergateSLOBurnFast"} <= a.keys() else None)(active()))
        down = firing["TiergatePoolDown"]
        assert down["labels"]["route"] == "r" and down["labels"]["tier"] == "realtime", down
        assert firing["TiergateSLOBurnFast"]["labels"]["tier"] == "realtime", firing["TiergateSLOBurnFast"]
        until("the page receiver is notified", 30, lambda: notified("page", "TiergatePoolDown", "firing")
              and notified("page", "TiergateSLOBurnFast", "firing"))
        fired = time.monotonic() - t0

        # It comes back on the same port: a passing check ends the ejection.
        t1 = time.monotonic()
        procs.start("sim-again", sim_argv)
        until("TiergatePoolDown resolves in Alertmanager", 90, lambda: "TiergatePoolDown" not in active())
        until("the page receiver is told it resolved", 30, lambda: notified("page", "TiergatePoolDown", "resolved"))
        print(f"alerts: TiergatePoolDown and TiergateSLOBurnFast reached Alertmanager and the page receiver "
              f"{fired:.1f} s after the backend stopped; TiergatePoolDown resolved {time.monotonic() - t1:.1f} s after it returned")
        stop.set()
    except BaseException:
        for log in sorted(work.glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        raise
    finally:
        procs.stop_all()
        hook.shutdown()


main()
