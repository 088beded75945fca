#!/usr/bin/env bash
# Checks deploy/ by running what it ships (run by scripts/test):
#   - the alerting rules pass `promtool check rules` and their unit tests, the Prometheus
#     config `promtool check config`, the Alertmanager config `amtool check-config`;
#   - deploy/check.py: both Kubernetes shapes rendered (kubectl kustomize) and validated
#     strictly (kubernetes-validate, two Kubernetes versions), what they and compose
#     would run checked with `tiergate serve --check`, the wiring cross-checked; the
#     Triton pool's autoscalers on the capacity signal (KEDA's ScaledObject against
#     KEDA's CRD schema from npm's @kubernetes-models/keda, and an HPA);
#   - deploy/alerts_test.py: Prometheus and Alertmanager against a running gateway, a
#     backend stopped and brought back, the alerts fired and resolved;
#   - deploy/image_test.py: the image built with podman and run read-only: every tier,
#     the Batch API, SIGTERM under load.
# The distribution's packages it needs are installed here when missing, with their
# services kept from starting. The dashboard's metric names are checked against a live
# scrape by tests/it/observability.rs.
#
#   deploy/check.sh PATH_TO_TIERGATE_BINARY
set -euo pipefail
cd "$(dirname "$0")"
TIERGATE=$(realpath "${1:?usage: deploy/check.sh PATH_TO_TIERGATE_BINARY}")

# Debian packages, as command:package.
NEEDED=(promtool:prometheus prometheus:prometheus prometheus-alertmanager:prometheus-alertmanager
        amtool:prometheus-alertmanager podman:podman runc:runc catatonit:catatonit mmdebstrap:mmdebstrap
        node:nodejs npm:npm)
missing=()
for pair in "${NEEDED[@]}"; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  ../scripts/apt-install.sh "${missing[@]}"
fi
command -v kubectl >/dev/null || { echo "deploy/check.sh: kubectl (for kubectl kustomize) is not installed" >&2; exit 1; }

(cd prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml && promtool check config prometheus.yml)
amtool check-config prometheus/alertmanager.yml

# KEDA's CRD schema, from the npm registry, kept outside the clone.
KEDA_MODELS_VERSION=0.4.2
NPM_DIR=${TIERGATE_NPM:-/var/tmp/tiergate-npm}/keda-$KEDA_MODELS_VERSION
if [ ! -f "$NPM_DIR/node_modules/@kubernetes-models/keda/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund --no-save "@kubernetes-models/keda@$KEDA_MODELS_VERSION")
fi
export KEDA_MODELS="$NPM_DIR/node_modules"

VENV=$(../tests/conformance/venv.sh deploy)
"$VENV/bin/python" check.py "$TIERGATE"
"$VENV/bin/python" alerts_test.py "$TIERGATE" "$(command -v prometheus)" "$(command -v prometheus-alertmanager)"
"$VENV/bin/python" image_test.py "$TIERGATE"
