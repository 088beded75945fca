"""The container image, built and run: deploy/image.sh builds it around the given
binary on a Debian base made here from the distribution's packages (no registry is
reachable), and podman runs it in a pod beside two simulated pools from the same image,
with a read-only root file system and only the data volume writable (no /tmp), as a
Kubernetes pod with readOnlyRootFilesystem has. Then, against the running container:

- the image's user, entrypoint, command, volumes and health check; ready, and the
  HEALTHCHECK passes;
- one request through each tier, and the Batch API: a 5,000-line batch created and
  cancelled, a small one run to completion, no store error logged;
- SIGTERM under load in every tier: readiness 503 at once, new requests still served
  during the drain delay, then every request either answered (200/202) or refused at
  connect once the door closed, never reset; exit 0; after a restart on the same
  volume every accepted offline job succeeds.

    image_test.py TIERGATE_BINARY

Podman runs with runc and cgroupfs and ulimits within this machine's hard limits
(a containers.conf of our own, through CONTAINERS_CONF). The base root file system is
cached outside the clone ($IMAGE_CACHE, default /var/tmp/tiergate-image).
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BINARY = sys.argv[1]
CACHE = Path(os.environ.get("IMAGE_CACHE", "/var/tmp/tiergate-image"))
BASE = "localhost/tiergate-base:bookworm"
NAME = f"tiergate-test-{os.getpid()}"
TAG = f"localhost/tiergate:{NAME}"
INFER = "/v2/models/resnet50/infer"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
TIERS = {  # headers that put a demo.toml request on each tier
    "realtime": {"x-tiergate-budget-ms": "250"},
    "micro_batch": {"x-tiergate-budget-ms": "5000"},
    "offline": {"prefer": "respond-async"},
}


def sh(*argv, check=True, capture=True):
    run = subprocess.run(argv, capture_output=capture, text=True)
    if check and run.returncode != 0:
        raise SystemExit(f"image: `{' '.join(argv)}` failed ({run.returncode}):\n{run.stdout}{run.stderr}")
    return run


def podman(*args, check=True):
    return sh("podman", *args, check=check)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what, limit, pred):
    end = time.monotonic() + limit
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > end:
            raise SystemExit(f"image: {what} did not happen within {limit} s")
        time.sleep(0.1)


class Door:
    """The gateway's HTTP door as a client outside the pod sees it, one connection per call."""

    def __init__(self, port):
        self.port = port

    def call(self, method, path, body=None, headers=None):
        """(status, headers, body), or the name of how it failed: `refused` at connect,
        else the exception (a reset, a closed connection...)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.connect()
        except ConnectionRefusedError:
            return "refused"
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        except Exception as e:  # every way an exchange can break is an outcome here
            return type(e).__name__
        finally:
            conn.close()

    def status(self, path):
        got = self.call("GET", path)
        return got[0] if isinstance(got, tuple) else got

    def infer(self, tier):
        return self.call("POST", INFER, BODY, {"content-type": "application/json", **TIERS[tier]})


def base_image():
    """The base image, imported from a cached minbase root file system of the
    distribution's own release (made with mmdebstrap on first use)."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    rootfs = CACHE / "bookworm-minbase.tar"
    if not rootfs.exists():
        print(f"image: making the base root file system {rootfs} (mmdebstrap, once)", file=sys.stderr)
        partial = CACHE / "bookworm-minbase.partial.tar"  # mmdebstrap writes a tar for a .tar name
        sh("mmdebstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(partial), capture=False)
        partial.rename(rootfs)
    podman("import", str(rootfs), BASE)


def check_image():
    [info] = json.loads(podman("image", "inspect", TAG).stdout)
    config = info["Config"]
    assert config["User"] == "10001:10001", config["User"]
    assert config["Entrypoint"] == ["tiergate"] and config["Cmd"] == ["serve"], (config["Entrypoint"], config["Cmd"])
    assert set(config["Volumes"]) == {"/var/lib/tiergate", "/tmp"}, config["Volumes"]
    assert info["Healthcheck"]["Test"] == ["CMD", "tiergate", "health"], info.get("Healthcheck")


def start_gateway(pod, volume, name):
    """The gateway as the image starts it, with a read-only root and only the data volume."""
    podman("run", "-d", "--pod", pod, "--name", name, "--read-only", "--read-only-tmpfs=false", "--image-volume=ignore",
           "-v", f"{volume}:/var/lib/tiergate", "-e", "TIERGATE_SHUTDOWN__DRAIN_DELAY=2s", TAG)


def logs(name):
    run = podman("logs", name, check=False)
    return [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("{")]


def tiers_once(door):
    for tier in TIERS:
        got = door.infer(tier)
        assert isinstance(got, tuple), f"{tier}: {got}"
        status, headers, body = got
        assert status == (202 if tier == "offline" else 200), f"{tier}: {status} {body[:300]}"
        assert headers.get("x-tiergate-tier") == tier, (tier, headers)
        if tier == "offline":
            job = headers["location"]
            until("the offline job succeeds", 30, lambda: door.status(job) == 200)


def batch_api(door):
    """A 5,000-line batch created and cancelled (large updates in one commit), then a
    small one run to completion."""
    def upload(lines):
        content = "\n".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": INFER, "body": json.loads(BODY)})
                            for i in range(lines))
        b = "tiergate-image-test"
        body = (f"--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: "
                f"form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{content}\r\n--{b}--\r\n").encode()
        status, _, answer = door.call("POST", "/v1/files", body, {"content-type": f"multipart/form-data; boundary={b}"})
        assert status == 200, answer
        spec = {"input_file_id": json.loads(answer)["id"], "endpoint": INFER, "completion_window": "24h"}
        status, _, answer = door.call("POST", "/v1/batches", json.dumps(spec).encode(), {"content-type": "application/json"})
        assert status == 200, answer
        return json.loads(answer)["id"]

    big = upload(5000)
    status, _, answer = door.call("POST", f"/v1/batches/{big}/cancel")
    assert status == 200, f"cancel: {status} {answer[:300]}"
    small = upload(20)

    def completed():
        status, _, answer = door.call("GET", f"/v1/batches/{small}")
        return status == 200 and json.loads(answer)["status"] == "completed"
    until("a 20-line batch completes", 60, completed)


def drain(door, pod, volume, gateway):
    """SIGTERM with load in every tier; returns a summary line."""
    outcomes, jobs, stop = [], [], threading.Event()
    lock = threading.Lock()

    def load(tier):
        while not stop.is_set():
            started = time.monotonic()
            got = door.infer(tier)
            with lock:
                outcomes.append((tier, started, time.monotonic(), got if isinstance(got, str) else got[0]))
                if isinstance(got, tuple) and got[0] == 202:
                    jobs.append(got[1]["location"])
            if got == "refused":
                return  # the door has closed: a load balancer would have moved on

    threads = [threading.Thread(target=load, args=(t,)) for t in TIERS for _ in range(3)]
    for t in threads:
        t.start()
    until("load in every tier", 30, lambda: {o[0] for o in outcomes if o[3] in (200, 202)} == set(TIERS))
    signalled = time.monotonic()
    podman("kill", "--signal", "TERM", gateway)
    until("readiness turns 503", 1, lambda: door.status("/v2/health/ready") == 503)
    exited = podman("wait", gateway).stdout.strip()
    stop.set()
    for t in threads:
        t.join(40)
    took = time.monotonic() - signalled
    assert exited == "0", f"the gateway exited with {exited}"
    bad = [o for o in outcomes if o[3] not in (200, 202, "refused")]
    assert not bad, f"requests neither answered nor refused at connect: {bad[:10]}"
    closed = min((o[1] for o in outcomes if o[3] == "refused"), default=None)
    assert closed is not None, "the door never closed"
    for tier in TIERS:
        during = [o for o in outcomes if o[0] == tier and signalled < o[1] < closed and o[3] in (200, 202)]
        assert during, f"{tier}: nothing new was served during the drain delay"
    open_at_close = [o for o in outcomes if o[1] < closed < o[2] and o[3] in (200, 202)]
    assert {o[0] for o in open_at_close} >= {"realtime", "micro_batch"}, f"requests open as the door closed: {open_at_close}"
    assert any('"message":"stopped"' in line for line in logs(gateway)), logs(gateway)[-5:]

    # Every accepted job runs after a restart on the same volume.
    podman("rm", gateway)
    start_gateway(pod, volume, gateway)
    until("the restarted gateway is ready", 30, lambda: door.status("/v2/health/ready") == 200)
    until(f"all {len(jobs)} accepted jobs succeed", 90, lambda: all(door.status(j) == 200 for j in jobs))
    answered = sum(1 for o in outcomes if o[3] in (200, 202))
    return (f"SIGTERM under load: {answered} requests answered ({len(open_at_close)} open as the door closed), "
            f"the rest refused at connect, none reset; exit 0 after {took:.1f} s; {len(jobs)} offline jobs all ran")


def main():
    with tempfile.TemporaryDirectory() as d:
        conf = Path(d, "containers.conf")
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
                        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
        os.environ["CONTAINERS_CONF"] = str(conf)
        version = podman("--version").stdout.strip()
        base_image()
        env = {**os.environ, "IMAGE_BINARY": BINARY, "IMAGE_BASE": BASE}
        build = subprocess.run([str(HERE / "image.sh"), TAG], env=env, capture_output=True, text=True)
        if build.returncode != 0:
            raise SystemExit(f"image: deploy/image.sh failed:\n{build.stderr}")
        pod, volume, gateway = NAME, f"{NAME}-data", f"{NAME}-gateway"
        port = free_port()
        try:
            check_image()
            podman("volume", "create", volume)
            podman("pod", "create", "--name", pod, "-p", f"127.0.0.1:{port}:8000")
            # demo.toml's pools, from the same image: real time on :9100, batch on :9101.
            podman("run", "-d", "--pod", pod, "--name", f"{NAME}-rt", TAG, "sim", "--http", "127.0.0.1:9100",
                   "--model", "resnet50:resnet50-trt", "--model", "bert:bert-base-trt", "--instances", "16",
                   "--stall-rate", "1", "--stall", "100ms")
            podman("run", "-d", "--pod", pod, "--name", f"{NAME}-batch", TAG, "sim", "--http", "127.0.0.1:9101",
                   "--model", "resnet50:resnet50-trt", "--instances", "2", "--stall-rate", "1", "--stall", "200ms")
            start_gateway(pod, volume, gateway)
            door = Door(port)
            until("the gateway is ready", 60, lambda: door.status("/v2/health/ready") == 200)
            assert podman("healthcheck", "run", gateway, check=False).returncode == 0, "the image's HEALTHCHECK fails"
            tiers_once(door)
            batch_api(door)
            errors = [line for line in logs(gateway) if '"level":"ERROR"' in line]
            assert not errors, errors
            summary = drain(door, pod, volume, gateway)
            print(f"image: {version} (runc) ran {TAG} (built from {BINARY}) with a read-only root file system and only "
                  f"its data volume writable: ready, HEALTHCHECK, every tier, the Batch API; {summary}")
        except BaseException:
            for name in (gateway, f"{NAME}-rt", f"{NAME}-batch"):
                print(f"--- {name} (last lines)\n" + "\n".join(logs(name)[-10:]), file=sys.stderr)
            raise
        finally:
            podman("pod", "rm", "-f", pod, check=False)
            podman("volume", "rm", "-f", volume, check=False)
            podman("rmi", "-f", TAG, check=False)


main()
