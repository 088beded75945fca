#!/usr/bin/env bash
# Installs the tansu Kafka-protocol broker from crates.io into a cache outside the
# clone ($TANSU_CACHE, default /var/tmp/tiergate-tansu), once, and prints the binary's
# path. The build takes 14–21 minutes on 2 cores; later runs reuse it. The Kafka tests
# start it on loopback themselves (tests/it/kafka.rs).
set -euo pipefail
ROOT=${TANSU_CACHE:-/var/tmp/tiergate-tansu}
VERSION=0.6.0
BIN=$ROOT/bin/tansu
mkdir -p "$ROOT"
exec 9>"$ROOT.lock"
flock 9 # one builder at a time
if [ ! -x "$BIN" ] || [ "$(cat "$ROOT/.version" 2>/dev/null)" != "$VERSION" ]; then
  echo "installing tansu $VERSION into $ROOT (once; 14-21 minutes on 2 cores)" >&2
  # Light optimisation: the tests send it thousands of records, not millions, and the
  # build takes a third less.
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_TARGET_DIR=$ROOT/build cargo install tansu --version "$VERSION" --locked \
    --features dynostore,libsql --root "$ROOT" --force >&2
  rm -rf "$ROOT/build"
  echo "$VERSION" > "$ROOT/.version"
fi
echo "$BIN"
