#!/usr/bin/env bash
# Creates (or reuses) a Python virtual environment for the conformance tests and prints
# its path: `venv.sh NAME` installs requirements-NAME.txt (tritonclient, mlserver, openai,
# pytriton). Peers get separate environments because they pin different protobuf and
# grpcio versions. It uses the distribution's Python 3.11 (installing it and venv support
# with apt-get when missing): PyTriton's bundled Triton links the system's libpython3.11.
# Environments live outside the clone ($CONFORMANCE_VENVS, default /var/tmp/tiergate-venvs; not a TIERGATE_* name,
# which `tiergate serve` would read as a startup setting)
# and are rebuilt whenever their requirements file changes.
set -euo pipefail
cd "$(dirname "$0")"
NAME=${1:?usage: venv.sh tritonclient|mlserver|pytriton|openai|llama|deploy|litellm}
REQ=requirements-$NAME.txt
[ -f "$REQ" ] || { echo "no $REQ" >&2; exit 2; }
VENV=${CONFORMANCE_VENVS:-/var/tmp/tiergate-venvs}/$NAME
PY=/usr/bin/python3.11
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9   # one builder at a time; the others wait and reuse its work
{
  if [ ! -x "$PY" ] || ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update -qq
    apt-get install -y -qq python3.11 python3.11-venv
  fi
  want=$(sha256sum "$REQ" | cut -d' ' -f1)
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
    echo "$want" > "$VENV/.requirements.sha256"
  fi
} >&2
echo "$VENV"
