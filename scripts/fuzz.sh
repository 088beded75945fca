#!/usr/bin/env bash
# Fuzzes every parser of untrusted input (fuzz/fuzz_targets: KServe JSON, the binary
# tensor extension, gRPC messages, request headers, Batch API lines and uploads, policy
# TOML, cache keys and tenants) with libFuzzer, each for SECONDS (default 20), starting from the committed seed
# corpus in fuzz/corpus. Installs cargo-fuzz (for the nightly toolchain, which these
# machines have) into /var/tmp/tiergate-fuzz the first time and builds there, outside
# the clone; what a run learns (new inputs) stays there too, and a crash's input is
# kept under /var/tmp/tiergate-fuzz/artifacts/TARGET/ and printed.
#
#   scripts/fuzz.sh            # every target, 20 s each (the test command runs this)
#   scripts/fuzz.sh 600        # a longer run: 10 minutes each
#   scripts/fuzz.sh 60 multipart batch_lines   # some targets only
#   scripts/fuzz.sh build      # install and build only (the test command does it early)
#
# The targets are built at LLVM's first optimisation level (FUZZ_OPT_LEVEL, default 1):
# half the build of full optimisation, enough for the test command's 20 s a target;
# FUZZ_OPT_LEVEL=3 for long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-20}
shift || true
BUILD_ONLY=
if [ "$SECONDS_EACH" = build ]; then BUILD_ONLY=1 SECONDS_EACH=0; fi
CACHE=${TIERGATE_FUZZ_CACHE:-/var/tmp/tiergate-fuzz}
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(kserve_json binary_tensors grpc_message headers batch_lines multipart policy_toml cache_key lean_head)
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
  exit 1
fi
if [ ! -x "$CACHE/tools/bin/cargo-fuzz" ]; then
  echo "fuzz: installing cargo-fuzz into $CACHE/tools (once)" >&2
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo +nightly install cargo-fuzz --locked --quiet --root "$CACHE/tools"
fi
export PATH="$CACHE/tools/bin:$PATH"
export CARGO_TARGET_DIR="$CACHE/target"
export CARGO_PROFILE_RELEASE_OPT_LEVEL=${FUZZ_OPT_LEVEL:-1}

cd fuzz
# No sanitizer: the code under test is safe Rust; what a run looks for is a panic, a
# hang or unbounded memory. (`-s address` works too, for a longer run.)
cargo +nightly fuzz build -s none
if [ -n "$BUILD_ONLY" ]; then exit 0; fi
# Each target on one core: as many at once as the machine has cores.
fuzz_one() {
  local target=$1
  local work="$CACHE/corpus/$target" artifacts="$CACHE/artifacts/$target/"
  mkdir -p "$work" "$artifacts"
  local log="$CACHE/$target.log"
  if cargo +nightly fuzz run -s none "$target" "$work" "corpus/$target" -- \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    local runs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $target: $runs inputs in ${SECONDS_EACH}s, no failure"
  else
    echo "fuzz: $target FAILED; the input is in $artifacts (log: $log):" >&2
    tail -30 "$log" >&2
    return 1
  fi
}
failed=0
running=()
for target in "${TARGETS[@]}"; do
  if [ ${#running[@]} -ge "$(nproc)" ]; then
    wait "${running[0]}" || failed=1
    running=("${running[@]:1}")
  fi
  fuzz_one "$target" & running+=($!)
done
for pid in "${running[@]}"; do wait "$pid" || failed=1; done
exit $failed
