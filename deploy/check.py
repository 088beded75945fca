"""Checks what deploy/ ships, as it would run. Run by deploy/check.sh:

    check.py TIERGATE_BINARY

- Kubernetes: both shapes (single/, replicated/), alone and with the monitoring
  component, rendered by `kubectl kustomize` and validated by `kubernetes-validate
  --strict` against every version in K8S_VERSIONS; then, in what they render: the
  command that runs (the image's ENTRYPOINT + the container's command/args) is
  `tiergate serve`, and `tiergate serve --check` accepts the container's environment
  with the ConfigMap's policy; probes, ports, volumes, security context, the stop's
  timing, the admin port's own Service and NetworkPolicy, and each shape's promise
  about jobs (single: one replica, embedded queue on a claim; replicated: the Kafka queue,
  brokers from the ConfigMap, one name per pod, an HPA); the PrometheusRule holds the
  rules of prometheus/alerts.yml.
- compose: the same for the tiergate service (command, environment, mounts), and the
  wiring of Kafka, Prometheus, Alertmanager and Grafana.
- Dockerfile: non-root, health check, listeners, entrypoint.

`check.py --write-rules` rewrites k8s/monitoring/prometheusrule.yaml from alerts.yml.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import yaml

HERE = Path(__file__).resolve().parent
K8S = HERE / "k8s"
K8S_VERSIONS = ["1.30.0", "1.34.0"]  # the preStop sleep action needs 1.30 (beta, on by default)
PORTS = {"HTTP": 8000, "GRPC": 8001, "METRICS": 8002}
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)
    return ok


def prometheus_rule():
    """The PrometheusRule object for alerts.yml's groups."""
    rules = yaml.safe_load((HERE / "prometheus/alerts.yml").read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "tiergate"},
        "spec": {"groups": rules["groups"]},
    }


if sys.argv[1:] == ["--write-rules"]:
    header = "# Generated from deploy/prometheus/alerts.yml by `python3 deploy/check.py --write-rules`.\n"
    text = yaml.safe_dump(prometheus_rule(), sort_keys=False, width=120)
    (K8S / "monitoring/prometheusrule.yaml").write_text(header + text)
    sys.exit(0)

TIERGATE = sys.argv[1]
VALIDATE = str(Path(sys.executable).with_name("kubernetes-validate"))


# --- what the image runs ---
dockerfile = (HERE / "Dockerfile").read_text()


def instruction(name):
    """The last exec-form (JSON list) value of a Dockerfile instruction."""
    found = re.findall(rf"^{name} (\[.*\])\s*$", dockerfile, re.M)
    return json.loads(found[-1]) if found else None


ENTRYPOINT, CMD = instruction("ENTRYPOINT"), instruction("CMD")
IMAGE_ENV = dict(re.findall(r"(TIERGATE_[A-Z_]+|TMPDIR)=(\S+)", dockerfile))
check(ENTRYPOINT == ["tiergate"], f"Dockerfile: ENTRYPOINT is {ENTRYPOINT}, not [\"tiergate\"]")
check(CMD == ["serve"], f"Dockerfile: CMD is {CMD}, not [\"serve\"]")
check(re.search(r"^USER (?!root|0\b)\S+", dockerfile, re.M) is not None, "Dockerfile: runs as root")
check(re.search(r'^HEALTHCHECK .*CMD \["tiergate", "health"\]$', dockerfile, re.M) is not None,
      "Dockerfile: the HEALTHCHECK is not `tiergate health` (the image has no curl)")
for door, port in PORTS.items():
    check(IMAGE_ENV.get(f"TIERGATE_LISTEN__{door}") == f"0.0.0.0:{port}", f"Dockerfile: {door} does not listen on {port}")
    check(str(port) in re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1), f"Dockerfile: {port} is not exposed")
volumes = json.loads(re.search(r"^VOLUME (\[.*\])$", dockerfile, re.M).group(1))
check(IMAGE_ENV.get("TIERGATE_DATA_DIR") in volumes and "/tmp" in volumes, "Dockerfile: the data and temp directories are not volumes")


def runs(command, args):
    """What a container runs: its command (else the image's ENTRYPOINT), then its args
    (else the image's CMD, unless the command was replaced)."""
    if command is not None:
        return list(command) + list(args or [])
    return ENTRYPOINT + (list(args) if args is not None else CMD)


def serve_check(where, argv, env, policies):
    """Runs `argv --check` as the container would start it, with its environment (the
    image's, then its own), the policy files it mounts, and scratch directories."""
    check(argv[:2] == ["tiergate", "serve"], f"{where}: runs {shlex.join(argv)}, not `tiergate serve ...`")
    with tempfile.TemporaryDirectory() as d:
        for name, text in policies.items():
            Path(d, name).write_text(text)
        full = {**IMAGE_ENV, **env, "TIERGATE_POLICY_DIR": d, "TIERGATE_DATA_DIR": str(Path(d, "data"))}
        full = {k: v for k, v in full.items() if v is not None}
        full["PATH"] = os.environ["PATH"]
        run = subprocess.run([TIERGATE, *argv[1:], "--check"], env=full, capture_output=True, text=True)
        check(run.returncode == 0, f"{where}: `{shlex.join(argv)}` would not start:\n{run.stdout}{run.stderr}")


def seconds(text):
    return float(re.fullmatch(r"(\d+(?:\.\d+)?)s", text).group(1))


def endpoints(policy_text):
    """Every backend host a policy names."""
    return {urlparse(u).hostname for u in re.findall(r'"((?:http|grpc)://[^"]+)"', policy_text)}


# --- Kubernetes ---
def render(shape, monitoring=False):
    """The objects `kubectl kustomize` renders for a shape, with the monitoring component
    when asked (through a kustomization of our own, in a scratch directory)."""
    with tempfile.TemporaryDirectory() as d:
        target = K8S / shape
        if monitoring:
            rel = lambda p: os.path.relpath(p, d)
            Path(d, "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel(K8S / shape)],
                "components": [rel(K8S / "monitoring")],
            }))
            target = Path(d)
        out = subprocess.run(["kubectl", "kustomize", str(target)], capture_output=True, text=True)
        if not check(out.returncode == 0, f"k8s {shape}: kubectl kustomize failed:\n{out.stderr}"):
            return {}, ""
        return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}, out.stdout


def validate(name, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        for version in K8S_VERSIONS:
            run = subprocess.run([VALIDATE, "--strict", "--quiet", "-k", version, f.name], capture_output=True, text=True)
            # Custom resources (the monitoring component) have no schema here: a warning.
            errors = [l for l in (run.stdout + run.stderr).splitlines() if l.startswith("ERROR")]
            check(run.returncode == 0 and not errors, f"k8s {name}: not valid for Kubernetes {version}:\n" + "\n".join(errors or [run.stdout + run.stderr]))


def check_pod(shape, objs, workload):
    pod = workload["spec"]["template"]["spec"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    check(workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"k8s {shape}: the selector misses the pod's labels")
    [c] = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    secret_env = {e["name"]: e["valueFrom"] for e in c["env"] if "valueFrom" in e}
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    configmap = objs[("ConfigMap", "tiergate-policies")]["data"]
    argv = runs(c.get("command"), c.get("args"))
    serve_check(f"k8s {shape}", argv, {k: v for k, v in env.items() if v is not None}, configmap)
    for door, port in PORTS.items():
        check(env.get(f"TIERGATE_LISTEN__{door}", IMAGE_ENV.get(f"TIERGATE_LISTEN__{door}")) == f"0.0.0.0:{port}", f"k8s {shape}: {door} does not listen on {port}")
        check(port in named.values(), f"k8s {shape}: container port {port} is not declared")
    check(env.get("TIERGATE_LISTEN__ADMIN") == f"0.0.0.0:{named.get('admin')}", f"k8s {shape}: the admin port is not the admin listener")
    check(secret_env.get("TIERGATE_ADMIN__TOKEN", {}).get("secretKeyRef", {}).get("name") == "tiergate-admin", f"k8s {shape}: the admin token is not from the tiergate-admin Secret")
    for probe, path in [("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready"), ("startupProbe", "/v2/health/live")]:
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path, f"k8s {shape}: {probe} is not on {path}")
        check(named.get(get.get("port"), get.get("port")) == PORTS["HTTP"], f"k8s {shape}: {probe} is not on the HTTP port")
    # The stop: preStop sleep (the drain delay here), then the gateway's own timeout.
    sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    timeout = seconds(env.get("TIERGATE_SHUTDOWN__TIMEOUT", "25s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(sleep is not None, f"k8s {shape}: no preStop sleep")
    check(sleep is not None and sleep + timeout + seconds(env.get("TIERGATE_SHUTDOWN__DRAIN_DELAY", "5s")) < grace,
          f"k8s {shape}: terminationGracePeriodSeconds ({grace}) does not cover preStop ({sleep}) + drain + timeout ({timeout})")
    # Security: non-root, read-only root, writable data and temp directories only.
    sc, psc = c.get("securityContext", {}), pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, f"k8s {shape}: the pod may run as root")
    check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False, f"k8s {shape}: the root file system is writable or privileges may grow")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"k8s {shape}: capabilities are not dropped")
    check(pod.get("automountServiceAccountToken") is False, f"k8s {shape}: a service account token is mounted")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    data_dir = env.get("TIERGATE_DATA_DIR", IMAGE_ENV["TIERGATE_DATA_DIR"])
    for path in [data_dir, env.get("TMPDIR", "/tmp")]:
        m = mounts.get(path)
        check(m is not None and not m.get("readOnly") and (m["name"] in volumes or m["name"] in claims), f"k8s {shape}: nothing writable is mounted at {path}")
    policy_mount = mounts.get(env.get("TIERGATE_POLICY_DIR", IMAGE_ENV["TIERGATE_POLICY_DIR"]))
    check(policy_mount is not None and volumes.get(policy_mount["name"], {}).get("configMap", {}).get("name") == "tiergate-policies",
          f"k8s {shape}: the policy ConfigMap is not mounted at TIERGATE_POLICY_DIR")
    for text in configmap.values():
        for host in endpoints(text):
            allow = env["TIERGATE_BACKENDS__ALLOW"].split(",")
            check(any(a == host or (a.startswith("*.") and host.endswith(a[1:])) for a in allow), f"k8s {shape}: {host} is not in TIERGATE_BACKENDS__ALLOW")
    # Services: the data ports on one, the admin port alone on its own; the
    # NetworkPolicy opens the admin port to admin clients only.
    service, admin = objs[("Service", "tiergate")], objs[("Service", "tiergate-admin")]
    for svc in (service, admin):
        check(svc["spec"]["selector"].items() <= labels.items(), f"k8s {shape}: Service {svc['metadata']['name']} selects no tiergate pod")
        for port in svc["spec"]["ports"]:
            check(named.get(port["targetPort"]) == port["port"], f"k8s {shape}: Service port {port['name']} targets another port")
    check({p["name"] for p in service["spec"]["ports"]} == {"http", "grpc", "metrics"}, f"k8s {shape}: the data Service is not exactly the data and metrics ports")
    check([p["name"] for p in admin["spec"]["ports"]] == ["admin"], f"k8s {shape}: the admin Service carries more than the admin port")
    netpol = objs[("NetworkPolicy", "tiergate")]["spec"]
    check(netpol["podSelector"]["matchLabels"].items() <= labels.items(), f"k8s {shape}: the NetworkPolicy selects no tiergate pod")
    for rule in netpol["ingress"]:
        opens_admin = any(p["port"] in ("admin", named.get("admin")) for p in rule.get("ports", []))
        check(not opens_admin or rule.get("from"), f"k8s {shape}: the NetworkPolicy opens the admin port to everyone")
        for peer in rule.get("from", []):
            check("app.kubernetes.io/name" not in peer.get("podSelector", {}).get("matchLabels", {}), f"k8s {shape}: the admin clients' selector names tiergate's own labels")
    pdb = objs[("PodDisruptionBudget", "tiergate")]["spec"]
    check(pdb["selector"]["matchLabels"].items() <= labels.items(), f"k8s {shape}: the PodDisruptionBudget selects no tiergate pod")
    return env, volumes, claims


for monitoring in (False, True):
    for shape in ("single", "replicated"):
        name = shape + (" + monitoring" if monitoring else "")
        objs, text = render(shape, monitoring)
        if not objs:
            continue
        validate(name, text)
        if monitoring:
            rule = objs.get(("PrometheusRule", "tiergate"))
            check(rule is not None and rule["spec"] == prometheus_rule()["spec"],
                  "k8s monitoring: the PrometheusRule differs from prometheus/alerts.yml (run `python3 deploy/check.py --write-rules`)")
            monitor = objs.get(("ServiceMonitor", "tiergate"), {}).get("spec", {})
            check(monitor.get("selector", {}).get("matchLabels", {}).items() <= objs[("Service", "tiergate")]["metadata"]["labels"].items()
                  and [e["port"] for e in monitor.get("endpoints", [])] == ["metrics"], "k8s monitoring: the ServiceMonitor does not scrape the metrics port")
            continue
        kind = "StatefulSet" if shape == "single" else "Deployment"
        workload = objs.get((kind, "tiergate"))
        if not check(workload is not None, f"k8s {shape}: no {kind} tiergate"):
            continue
        env, volumes, claims = check_pod(shape, objs, workload)
        data_volume = next(m["name"] for m in workload["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == env["TIERGATE_DATA_DIR"])
        if shape == "single":
            check(workload["spec"]["replicas"] == 1, "k8s single: the embedded queue is one process's file: one replica")
            check(env.get("TIERGATE_OFFLINE__QUEUE", "embedded") == "embedded", "k8s single: not on the embedded queue")
            check(data_volume in claims, "k8s single: the data directory is not on a PersistentVolumeClaim (jobs would die with the pod)")
            check(("HorizontalPodAutoscaler", "tiergate") not in objs, "k8s single: an HPA would add replicas to a one-replica store")
        else:
            check(env.get("TIERGATE_OFFLINE__QUEUE") == "kafka", "k8s replicated: replicas need the Kafka queue (offline.queue = \"kafka\")")
            c = workload["spec"]["template"]["spec"]["containers"][0]
            refs = {e["name"]: e.get("valueFrom", {}) for e in c["env"]}
            brokers = refs.get("TIERGATE_KAFKA__BROKERS", {}).get("configMapKeyRef", {})
            check(brokers.get("name") in {n for k, n in objs if k == "ConfigMap"} and brokers.get("key") in objs.get(("ConfigMap", brokers.get("name")), {}).get("data", {}),
                  "k8s replicated: the brokers do not come from the shipped ConfigMap")
            check(refs.get("TIERGATE_KAFKA__QUEUE__REPLICA", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name", "k8s replicated: replicas are not named after their pods")
            hpa = objs.get(("HorizontalPodAutoscaler", "tiergate"), {}).get("spec", {})
            check(hpa.get("scaleTargetRef", {}).get("name") == "tiergate" and hpa.get("scaleTargetRef", {}).get("kind") == "Deployment", "k8s replicated: no HPA on the Deployment")
            check(hpa.get("minReplicas", 0) >= 2, "k8s replicated: fewer than two replicas")


# --- compose ---
compose = yaml.safe_load((HERE / "docker-compose.yml").read_text())
services = compose["services"]
for name in ["tiergate", "triton-realtime", "triton-batch", "kafka", "kafka-topics", "prometheus", "alertmanager", "grafana"]:
    check(name in services, f"compose: no service {name}")
gw = services["tiergate"]
env = {k: str(v) for k, v in gw["environment"].items()}
mounts = {m.split(":")[1]: m.split(":")[0] for m in gw["volumes"]}
compose_policies = {p.name: p.read_text() for p in (HERE / mounts[env["TIERGATE_POLICY_DIR"]]).glob("*.toml")}
argv = runs(gw.get("entrypoint"), gw.get("command"))
config_file = argv[argv.index("--config") + 1] if "--config" in argv else None
sources = []
if check(config_file in mounts, "compose: the --config file is not mounted"):
    with tempfile.TemporaryDirectory() as d:
        local = Path(d, "tiergate.toml")
        local.write_text((HERE / mounts[config_file]).read_text())
        serve_check("compose", [a if a != config_file else str(local) for a in argv], env, compose_policies)
        sources = tomllib.loads(local.read_text())["kafka"]["sources"]
for door, port in PORTS.items():
    check(f"{port}:{port}" in gw["ports"], f"compose: port {port} is not published")
check(gw["healthcheck"]["test"][1:3] == ["tiergate", "health"], "compose: the health check is not `tiergate health`")
check(gw.get("read_only") is True and "/tmp" in gw.get("tmpfs", []), "compose: tiergate's root is writable or it has no /tmp")
check(seconds(gw["stop_grace_period"]) > seconds(env["TIERGATE_SHUTDOWN__TIMEOUT"]), "compose: stop_grace_period does not cover the drain")
for text in compose_policies.values():
    for host in endpoints(text):
        check(host in services, f"compose: the policy names {host}, which is no service")
for name in ["triton-realtime", "triton-batch"]:
    check(gw["depends_on"][name]["condition"] == "service_healthy", f"compose: tiergate does not wait for {name}")
    for volume in services[name]["volumes"]:
        check((HERE / volume.split(":")[0]).is_dir(), f"compose: {name} mounts a missing {volume}")
# Kafka: the queue and the source on the broker, the topics made before tiergate starts.
check(env.get("TIERGATE_OFFLINE__QUEUE") == "kafka" and env.get("TIERGATE_KAFKA__BROKERS", "").split(":")[0] == "kafka", "compose: the offline queue is not on the kafka service")
check(gw["depends_on"].get("kafka-topics", {}).get("condition") == "service_completed_successfully", "compose: tiergate does not wait for its topics")
topics = " ".join(services["kafka-topics"]["command"])
for topic in ["tiergate-jobs", "tiergate-job-states"] + [s[k] for s in sources for k in ("input", "output")]:
    check(f"--topic {topic}" in topics, f"compose: the topic {topic} is never created")
check("cleanup.policy=compact" in topics.split("tiergate-job-states", 1)[1].split("\n", 1)[0], "compose: the job-state topic is not compacted")
# Prometheus -> Alertmanager, Grafana -> Prometheus.
prom = yaml.safe_load((HERE / "prometheus/prometheus.yml").read_text())
targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
check(f"tiergate:{PORTS['METRICS']}" in targets, "prometheus: tiergate's metrics port is not scraped")
am_targets = [t for am in prom.get("alerting", {}).get("alertmanagers", []) for sc in am["static_configs"] for t in sc["targets"]]
check(am_targets == ["alertmanager:9093"], "prometheus: alerts are not sent to the alertmanager service")
prom_mounts = {m.split(":")[1]: m.split(":")[0] for m in services["prometheus"]["volumes"]}
check(all(f"/etc/prometheus/{r}" in prom_mounts for r in prom["rule_files"]), "compose: prometheus's rule files are not mounted")
am = services["alertmanager"]
am_mounts = {m.split(":")[1]: m.split(":")[0] for m in am["volumes"]}
am_config = next(a.split("=", 1)[1] for a in am["command"] if a.startswith("--config.file="))
check(am_config in am_mounts and (HERE / am_mounts[am_config]).exists(), "compose: alertmanager's config is not mounted")
for volume in services["prometheus"]["volumes"] + services["grafana"]["volumes"] + am["volumes"]:
    check((HERE / volume.split(":")[0]).exists(), f"compose: a missing file is mounted: {volume}")
provider = yaml.safe_load((HERE / "grafana/provisioning/dashboards/tiergate.yml").read_text())
grafana_mounts = {m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"]}
check(provider["providers"][0]["options"]["path"] in grafana_mounts, "grafana: the dashboard provider's path is not mounted")
source = yaml.safe_load((HERE / "grafana/provisioning/datasources/prometheus.yml").read_text())
check(urlparse(source["datasources"][0]["url"]).hostname == "prometheus", "grafana: the data source is not the prometheus service")
dashboard = json.loads((HERE / "grafana/dashboards/tiergate.json").read_text())
titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
for row in ["Real-time tier", "Micro-batch tier", "Offline (acceptance) tier", "Shadow candidates", "Prediction cache"]:
    check(row in titles, f"grafana: no row for {row}")

# --- scaling a pool on the capacity signal (k8s/autoscaling) ---
# KEDA's ScaledObject is validated against KEDA's CRD schema as npm's
# @kubernetes-models/keda carries it (generated from KEDA's CRDs; installed by check.sh,
# KEDA_MODELS names its node_modules), and its keys against the fields KEDA documents
# (the schema lets unknown keys through).
SCALED_OBJECT_FIELDS = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
                        "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"}
TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "useCachedMetrics", "authenticationRef"}
PROMETHEUS_FIELDS = {"serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
                     "customHeaders", "ignoreNullValues", "unsafeSsl", "timeout"}
KEDA_VALIDATE = """
const {ScaledObject} = require(process.env.KEDA_MODELS + "/@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject");
const version = require(process.env.KEDA_MODELS + "/@kubernetes-models/keda/package.json").version;
let failed = 0;
for (const o of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  try { new ScaledObject(o).validate(); } catch (e) { failed = 1; console.log(o.metadata.name + ": " + e.message); }
}
if (!failed) console.log(version);
process.exit(failed);
"""
policy_routes = {}
for text in yaml.safe_load((K8S / "base/policies.yaml").read_text())["data"].values():
    policy_routes.update(tomllib.loads(text).get("routes", {}))
autoscaled = {}
for way in ("keda", "hpa"):
    objs, text = render(f"autoscaling/{way}")
    if not objs:
        continue
    validate(f"autoscaling/{way}", text)
    triton = objs.get(("Deployment", "triton-realtime"))
    service = objs.get(("Service", "triton-realtime"))
    if not check(triton is not None and service is not None, f"k8s autoscaling/{way}: no triton-realtime Deployment and Service"):
        continue
    # The Service is the one the example policy's real-time pool sends to.
    host = f"{service['metadata']['name']}.{service['metadata'].get('namespace')}.svc.cluster.local"
    pools = {r: p for r, p in policy_routes.items() if any(urlparse(u).hostname == host for u in p.get("realtime", {}).get("endpoints", []))}
    check(len(pools) == 1, f"k8s autoscaling/{way}: no route's real-time pool sends to {host}")
    check(service["spec"]["selector"].items() <= triton["spec"]["template"]["metadata"]["labels"].items(), f"k8s autoscaling/{way}: the Service selects no Triton pod")
    if way == "keda":
        so = objs.get(("ScaledObject", "triton-realtime"))
        if not check(so is not None, "k8s autoscaling/keda: no ScaledObject"):
            continue
        spec = so["spec"]
        check(set(spec) <= SCALED_OBJECT_FIELDS, f"k8s autoscaling/keda: ScaledObject fields KEDA does not document: {set(spec) - SCALED_OBJECT_FIELDS}")
        for trigger in spec["triggers"]:
            check(set(trigger) <= TRIGGER_FIELDS, f"k8s autoscaling/keda: trigger fields KEDA does not document: {set(trigger) - TRIGGER_FIELDS}")
            check(trigger["type"] != "prometheus" or set(trigger["metadata"]) <= PROMETHEUS_FIELDS,
                  f"k8s autoscaling/keda: prometheus trigger fields KEDA does not document: {set(trigger['metadata']) - PROMETHEUS_FIELDS}")
        run = subprocess.run(["node", "-e", KEDA_VALIDATE], input=json.dumps([so]), capture_output=True, text=True)
        check(run.returncode == 0, f"k8s autoscaling/keda: the ScaledObject fails KEDA's CRD schema:\n{run.stdout}{run.stderr}")
        keda_models = run.stdout.strip()
        target, [trigger] = spec["scaleTargetRef"], spec["triggers"]
        query, kind = trigger["metadata"]["query"], trigger.get("metricType")
        check(kind == "AverageValue" and float(trigger["metadata"]["threshold"]) == 1.0, "k8s autoscaling/keda: not one replica per endpoint needed (AverageValue, threshold 1)")
    else:
        hpa = objs.get(("HorizontalPodAutoscaler", "triton-realtime"))
        if not check(hpa is not None, "k8s autoscaling/hpa: no HorizontalPodAutoscaler"):
            continue
        target, [metric] = hpa["spec"]["scaleTargetRef"], hpa["spec"]["metrics"]
        ext = metric["external"]
        labels = ext["metric"]["selector"]["matchLabels"]
        query = f'{ext["metric"]["name"]}{{route="{labels.get("route")}",tier="{labels.get("tier")}"}}'
        check(ext["target"] == {"type": "AverageValue", "averageValue": "1"}, "k8s autoscaling/hpa: not one replica per endpoint needed (AverageValue 1)")
        rules = yaml.safe_load((K8S / "autoscaling/hpa/prometheus-adapter-rules.yaml").read_text())["externalRules"]
        check(any(r["name"]["as"] == ext["metric"]["name"] and r["seriesQuery"].startswith(ext["metric"]["name"]) and "sum(" in r["metricsQuery"] for r in rules),
              "k8s autoscaling/hpa: prometheus-adapter's rules do not serve the metric, summed over the gateway replicas")
    check(target.get("kind") == "Deployment" and target.get("name") == "triton-realtime", f"k8s autoscaling/{way}: it does not scale the Triton Deployment")
    route = next(iter(pools), None)
    check(f'tiergate_endpoints_needed{{route="{route}",tier="realtime"}}' in query, f"k8s autoscaling/{way}: it does not read the capacity signal of route {route}'s real-time pool: {query}")
    autoscaled[way] = True

if problems:
    print("deploy/ problems:\n- " + "\n- ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"deploy/: Kubernetes single and replicated (with and without monitoring) valid for {', '.join(K8S_VERSIONS)} and start as `tiergate serve`; "
      f"compose ({len(services)} services) wired; Dockerfile checked; the Triton pool's autoscalers "
      f"({', '.join(autoscaled)}) read the capacity signal, the ScaledObject valid against KEDA's CRD schema "
      f"(@kubernetes-models/keda {keda_models}, from KEDA's CRDs) and KEDA's documented fields")
