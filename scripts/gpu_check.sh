#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU (run through the device tool in one call):
# builds with CUDA, runs the CUDA twin tests and the CPU tests, and writes results under $OUT.
#   OUT   folder for logs and JSON (default: ./gpu_out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
{
  nvidia-smi || true
  nvcc --version || true
} >"$OUT/device.txt" 2>&1
BUILD_DIR=build-gpu
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure.log" 2>&1 || { echo "configure failed"; tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
# The CUDA twins must run (not skip) here.
"$BUILD_DIR/bin/kernels_test" --gtest_filter='CudaTwin*' --gtest_output="json:$OUT/cuda_twin.json" \
  >"$OUT/cuda_twin.log" 2>&1
rc=$?
if grep -q '^\[  SKIPPED \]' "$OUT/cuda_twin.log"; then echo "CUDA twins skipped on a GPU machine"; rc=3; fi
ctest --test-dir "$BUILD_DIR" -j 8 --output-on-failure >"$OUT/ctest.log" 2>&1 || rc=$((rc == 0 ? 4 : rc))
"$BUILD_DIR/bin/engine_bench" --out "$OUT/engine_bench.json" >"$OUT/engine_bench.log" 2>&1 || true
tail -5 "$OUT/cuda_twin.log"
tail -3 "$OUT/ctest.log"
exit $rc
