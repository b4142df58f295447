#!/usr/bin/env bash
# Sets up the machine (Debian packages), builds Tandem and runs every test. This is the
# README's test command and exactly what CI (.ci/run) calls.
#   BUILD_DIR   build folder (default: build)
#   TANDEM_CUDA AUTO|ON|OFF  build the CUDA library (default AUTO: when nvcc exists)
#   JOBS        parallel build/test jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

bash scripts/setup.sh
bash scripts/fetch_model.sh >/dev/null

# nvcc lives in /usr/local/cuda/bin on the CUDA images without being on every PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_CUDA="${TANDEM_CUDA:-AUTO}" -DTANDEM_SHARED_DIR="$(bash scripts/fetch_model.sh --shared-dir)"
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" -j "$JOBS" --output-on-failure
