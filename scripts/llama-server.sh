#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (an OpenAI-compatible LLM server) from the llama.cpp
# tree vendored in the PyPI sdist of llama-cpp-python, into a cache outside the clone
# ($LLAMA_CACHE, default /var/tmp/tiergate-llama), once, and prints the binary's path.
# The build takes about 6 minutes on 2 cores; later runs reuse it. The LLM peer tests
# start it on loopback themselves (tests/peers/llama.rs) on a tiny model they write.
set -euo pipefail
ROOT=${LLAMA_CACHE:-/var/tmp/tiergate-llama}
VERSION=0.3.36
BIN=$ROOT/bin/llama-server
mkdir -p "$ROOT"
exec 9>"$ROOT.lock"
flock 9 # one builder at a time
if [ ! -x "$BIN" ] || [ "$(cat "$ROOT/.version" 2>/dev/null)" != "$VERSION" ]; then
  echo "building llama-server from llama-cpp-python $VERSION into $ROOT (once; about 6 minutes on 2 cores)" >&2
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    "$(dirname "$0")/apt-install.sh" cmake g++ make >&2
  fi
  venv=$("$(dirname "$0")/../tests/conformance/venv.sh" llama)
  work=$ROOT/build
  rm -rf "$work"
  mkdir -p "$work"
  # The one package, as source (its wheel would be a Python binding, not the server).
  "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$work" >&2
  tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
  src=$work/llama_cpp_python-$VERSION/vendor/llama.cpp
  # No web UI (its prebuilt default downloads one), no OpenSSL, portable code.
  cmake -S "$src" -B "$work/out" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF >&2
  cmake --build "$work/out" --target llama-server -j"$(nproc)" >&2
  mkdir -p "$ROOT/bin"
  cp "$work/out/bin/llama-server" "$BIN.new"
  mv "$BIN.new" "$BIN"
  rm -rf "$work"
  echo "$VERSION" > "$ROOT/.version"
fi
echo "$BIN"
