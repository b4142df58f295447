#!/usr/bin/env bash
# Sets up the machine (Debian packages), builds Tandem and runs every test. This is the
# README's test command and exactly what CI (.ci/run) calls.
#   BUILD_DIR   build folder (default: build)
#   TANDEM_CUDA AUTO|ON|OFF  build the CUDA library (default AUTO: when nvcc exists)
#   JOBS        parallel build/test jobs (default: number of cores)
#   TANDEM_SKIP_SANITIZE=1  skip the sanitizer step (unit tests under ASan + UBSan, fuzzing)
#   TANDEM_SKIP_CONTAINER=1 skip the container check (scripts/container_check.sh, beside the
#                           build and tests; its output in $BUILD_DIR/container_check.log)
#   TANDEM_FUZZ_SECONDS     seconds per fuzz target in that step (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

bash scripts/setup.sh
bash scripts/fetch_model.sh >/dev/null
# The real GGUF models the GGUF tests check against transformers' fixtures (they skip, saying
# so, where one cannot be fetched).
SMOLLM2="$(bash scripts/fetch_model.sh --smollm2 || true)"
[ -n "$SMOLLM2" ] || echo "test: SmolLM2 GGUF not fetched; its tests will be skipped" >&2
GEMMA3="$(bash scripts/fetch_model.sh --gemma3 || true)"
[ -n "$GEMMA3" ] || echo "test: Gemma 3 GGUF not fetched; its tests will be skipped" >&2

# The container check (the CPU image built from deploy/docker/Dockerfile and run as the
# Kubernetes manifests run it) runs beside the build and the tests: its downloads overlap the
# build, and its image build runs at the lowest CPU priority, on the cycles the tests leave idle.
container_pid=""
if [ "${TANDEM_SKIP_CONTAINER:-0}" != 1 ]; then
  mkdir -p "$BUILD_DIR"
  CONTAINER_BUILD_NICE=19 setsid bash scripts/container_check.sh \
    >"$BUILD_DIR/container_check.log" 2>&1 &
  container_pid=$!  # its own process group: stopped with everything it started if a step fails
  trap 'kill -- "-$container_pid" 2>/dev/null || true' EXIT
fi

# nvcc lives in /usr/local/cuda/bin on the CUDA images without being on every PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_CUDA="${TANDEM_CUDA:-AUTO}" -DTANDEM_SHARED_DIR="$(bash scripts/fetch_model.sh --shared-dir)" \
  -DTANDEM_SMOLLM2_GGUF="$SMOLLM2" -DTANDEM_GEMMA3_GGUF="$GEMMA3"
cmake --build "$BUILD_DIR" -j "$JOBS"
# The layout rules (docs/development.md): folders without a cycle, no function over 150 lines.
"${TANDEM_TOOLS_VENV:-$HOME/.cache/tandem/tools-venv}/bin/python" scripts/check_layout.py
ctest --test-dir "$BUILD_DIR" -j "$JOBS" --output-on-failure

# The sanitizer step: the parsers' and data structures' unit tests built by clang with ASan +
# UBSan (build-fuzz/, no gRPC code) and every fuzz target for a few seconds.
if [ "${TANDEM_SKIP_SANITIZE:-0}" != 1 ]; then
  JOBS="$JOBS" bash scripts/fuzz.sh --unit-tests "${TANDEM_FUZZ_SECONDS:-10}"
fi

if [ -n "$container_pid" ]; then
  container_rc=0
  wait "$container_pid" || container_rc=$?
  trap - EXIT
  cat "$BUILD_DIR/container_check.log" >&2
  [ "$container_rc" -eq 0 ]
fi
