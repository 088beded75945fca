"""Checks that deploy/ hangs together: docker-compose.yml, k8s/ and the Dockerfile agree
on ports, health paths, the policy directory and the backend allowlist, and the policies
they ship pass `tiergate policy check`. Run by deploy/check.sh: check.py TIERGATE_BINARY."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import yaml

HERE = Path(__file__).resolve().parent
TIERGATE = sys.argv[1]
PORTS = {"HTTP": 8000, "GRPC": 8001, "METRICS": 8002}
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


def endpoints(policy_text):
    """Every backend host a policy names."""
    return {urlparse(u).hostname for u in re.findall(r'"((?:http|grpc)://[^"]+)"', policy_text)}


def allowed(host, allow):
    return any(a == "*" or a == host or (a.startswith("*.") and host.endswith(a[1:])) for a in allow)


def policy_check(files, where):
    """Runs `tiergate policy check` on {name: text}; the gateway refuses what fails."""
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            Path(d, name).write_text(text)
        run = subprocess.run([TIERGATE, "policy", "check", d], capture_output=True, text=True)
        check(run.returncode == 0, f"{where}: tiergate policy check failed:\n{run.stdout}{run.stderr}")


def listen_port(env, door):
    value = env.get(f"TIERGATE_LISTEN__{door}", "")
    return int(value.rsplit(":", 1)[1]) if ":" in value else None


# --- docker-compose.yml ---
compose = yaml.safe_load((HERE / "docker-compose.yml").read_text())
services = compose["services"]
for name in ["tiergate", "triton-realtime", "triton-batch", "kafka", "prometheus", "grafana"]:
    check(name in services, f"compose: no service {name}")
gw = services["tiergate"]
env = gw["environment"]
for door, port in PORTS.items():
    check(listen_port(env, door) == port, f"compose: TIERGATE_LISTEN__{door} is not on {port}")
    check(f"{port}:{port}" in gw["ports"], f"compose: port {port} is not published")
check("/v2/health/ready" in " ".join(gw["healthcheck"]["test"]), "compose: the health check is not /v2/health/ready")
mounts = {m.split(":")[1]: m.split(":")[0] for m in gw["volumes"]}
policy_src = mounts.get(env["TIERGATE_POLICY_DIR"])
check(policy_src is not None, "compose: nothing is mounted at TIERGATE_POLICY_DIR")
compose_policies = {p.name: p.read_text() for p in (HERE / policy_src).glob("*.toml")} if policy_src else {}
check(bool(compose_policies), "compose: the mounted policy directory has no policy")
policy_check(compose_policies, "compose policies")
allow = env["TIERGATE_BACKENDS__ALLOW"].split(",")
for text in compose_policies.values():
    for host in endpoints(text):
        check(host in services, f"compose: the policy names {host}, which is no service")
        check(allowed(host, allow), f"compose: {host} is not in TIERGATE_BACKENDS__ALLOW")
for name in ["triton-realtime", "triton-batch"]:
    check("/v2/health/ready" in " ".join(services[name]["healthcheck"]["test"]), f"compose: {name} has no readiness check")
    check(services["tiergate"]["depends_on"][name]["condition"] == "service_healthy", f"compose: tiergate does not wait for {name}")
    for volume in services[name]["volumes"]:
        check((HERE / volume.split(":")[0]).is_dir(), f"compose: {name} mounts a missing {volume}")
for volume in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
    check((HERE / volume.split(":")[0]).exists(), f"compose: a missing file is mounted: {volume}")

# --- Prometheus and Grafana wiring ---
prom = yaml.safe_load((HERE / "prometheus/prometheus.yml").read_text())
targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
check(f"tiergate:{PORTS['METRICS']}" in targets, "prometheus: tiergate's metrics port is not scraped")
provider = yaml.safe_load((HERE / "grafana/provisioning/dashboards/tiergate.yml").read_text())
dash_dir = provider["providers"][0]["options"]["path"]
grafana_mounts = {m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"]}
check(dash_dir in grafana_mounts, "grafana: the dashboard provider's path is not mounted")
source = yaml.safe_load((HERE / "grafana/provisioning/datasources/prometheus.yml").read_text())
check(urlparse(source["datasources"][0]["url"]).hostname == "prometheus", "grafana: the data source is not the prometheus service")
dashboard = json.loads((HERE / "grafana/dashboards/tiergate.json").read_text())
titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
for row in ["Real-time tier", "Micro-batch tier", "Offline (acceptance) tier"]:
    check(row in titles, f"grafana: no row for {row}")

# --- Kubernetes ---
kust = yaml.safe_load((HERE / "k8s/kustomization.yaml").read_text())
docs = {}
for resource in kust["resources"]:
    for doc in yaml.safe_load_all((HERE / "k8s" / resource).read_text()):
        docs[doc["kind"]] = doc
for kind in ["ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]:
    check(kind in docs, f"k8s: no {kind}")
deploy = docs["Deployment"]
pod = deploy["spec"]["template"]["spec"]
container = pod["containers"][0]
kenv = {e["name"]: e["value"] for e in container["env"]}
named = {p["name"]: p["containerPort"] for p in container["ports"]}
for door, port in PORTS.items():
    check(listen_port(kenv, door) == port, f"k8s: TIERGATE_LISTEN__{door} is not on {port}")
    check(port in named.values(), f"k8s: container port {port} is not declared")
for probe, path in [("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready"), ("startupProbe", "/v2/health/live")]:
    get = container[probe]["httpGet"]
    check(get["path"] == path, f"k8s: {probe} is not on {path}")
    check(named.get(get["port"], get["port"]) == PORTS["HTTP"], f"k8s: {probe} is not on the HTTP port")
check("requests" in container["resources"], "k8s: no resource requests")
check(pod["securityContext"].get("runAsNonRoot") is True, "k8s: the pod may run as root")
annotations = deploy["spec"]["template"]["metadata"]["annotations"]
check(int(annotations["prometheus.io/port"]) == PORTS["METRICS"], "k8s: the scrape annotation is not the metrics port")
mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
volumes = {v["name"]: v for v in pod["volumes"]}
config_volume = [n for n, v in volumes.items() if "configMap" in v]
check(len(config_volume) == 1 and mount.get(config_volume[0]) == kenv["TIERGATE_POLICY_DIR"], "k8s: the ConfigMap is not mounted at TIERGATE_POLICY_DIR")
check(volumes[config_volume[0]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"], "k8s: the mounted ConfigMap is not the shipped one")
check(mount.get("data") == kenv["TIERGATE_DATA_DIR"], "k8s: the data volume is not at TIERGATE_DATA_DIR")
policy_check(docs["ConfigMap"]["data"], "k8s ConfigMap")
for text in docs["ConfigMap"]["data"].values():
    for host in endpoints(text):
        check(allowed(host, kenv["TIERGATE_BACKENDS__ALLOW"].split(",")), f"k8s: {host} is not in TIERGATE_BACKENDS__ALLOW")
labels = deploy["spec"]["template"]["metadata"]["labels"]
for kind in ["Service", "PodDisruptionBudget"]:
    spec = docs[kind]["spec"]
    selector = spec["selector"].get("matchLabels", spec["selector"])
    check(all(labels.get(k) == v for k, v in selector.items()), f"k8s: the {kind} selects no tiergate pod")
for port in docs["Service"]["spec"]["ports"]:
    check(port["targetPort"] in named, f"k8s: Service port {port['name']} targets an undeclared port")
    check(named.get(port["targetPort"]) == port["port"], f"k8s: Service port {port['name']} changes the port number")
check(docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"], "k8s: the HPA scales something else")

# --- Dockerfile ---
dockerfile = (HERE / "Dockerfile").read_text()
check(re.search(r"^USER (?!root)\S+", dockerfile, re.M) is not None, "Dockerfile: runs as root")
check("/v2/health/ready" in dockerfile, "Dockerfile: the HEALTHCHECK is not /v2/health/ready")
for door, port in PORTS.items():
    check(f"TIERGATE_LISTEN__{door}=0.0.0.0:{port}" in dockerfile, f"Dockerfile: {door} does not listen on {port}")
    check(str(port) in re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1), f"Dockerfile: {port} is not exposed")

if problems:
    print("deploy/ problems:\n- " + "\n- ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"deploy/: compose ({len(services)} services), {len(docs)} Kubernetes objects, Dockerfile and shipped policies agree")
