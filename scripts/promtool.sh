#!/usr/bin/env bash
# Prints the path of promtool, with which tests/it/observability.rs lints a live scrape of
# the gateway's /metrics (`promtool check metrics`). It is Debian's, from the prometheus
# package, installed when missing (scripts/apt-install.sh keeps its service from starting).
set -euo pipefail
command -v promtool >/dev/null || "$(dirname "$0")/apt-install.sh" prometheus
command -v promtool
