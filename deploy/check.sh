#!/usr/bin/env bash
# Checks what can be checked here of deploy/ (run by scripts/test):
#   - the alerting rules pass `promtool check rules` and their unit tests, and the
#     Prometheus config passes `promtool check config` (promtool from the distribution's
#     prometheus package, installed here when missing);
#   - the compose file, the Kubernetes manifests and the Dockerfile agree on ports,
#     health paths, the policy directory and the backend allowlist, and the policies
#     they ship pass `tiergate policy check` (deploy/check.py, PyYAML in a venv).
# The dashboard's metric names are checked against a live scrape by tests/observability.rs.
#
#   deploy/check.sh PATH_TO_TIERGATE_BINARY
set -euo pipefail
cd "$(dirname "$0")"
TIERGATE=$(realpath "${1:?usage: deploy/check.sh PATH_TO_TIERGATE_BINARY}")

if ! command -v promtool >/dev/null; then
  echo "installing promtool (Debian's prometheus package)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package may start its own server; this machine only needs promtool.
  pkill -x prometheus 2>/dev/null || true
fi
(cd prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml && promtool check config prometheus.yml)

VENV=$(../tests/conformance/venv.sh deploy)
"$VENV/bin/python" check.py "$TIERGATE"
