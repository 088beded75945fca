#!/usr/bin/env bash
# Creates (or reuses) the Python virtual environment of the conformance tests and prints
# its path. It uses the distribution's Python 3.11 (installing it and venv support with
# apt-get when missing), because a later peer (PyTriton's bundled Triton) links the
# system's libpython3.11. The venv lives outside the clone ($TIERGATE_VENV, default
# /var/tmp/tiergate-venv) and is rebuilt whenever requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TIERGATE_VENV:-/var/tmp/tiergate-venv}
PY=/usr/bin/python3.11
{
  if [ ! -x "$PY" ] || ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update -qq
    apt-get install -y -qq python3.11 python3.11-venv
  fi
  want=$(sha256sum requirements.txt | cut -d' ' -f1)
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
    echo "$want" > "$VENV/.requirements.sha256"
  fi
} >&2
echo "$VENV"
