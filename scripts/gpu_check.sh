#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU (run through the device tool in one call;
# budget: under 8 minutes on one H200). Builds with CUDA for sm_90 only, runs every CUDA test and
# writes logs and JSON results under $OUT (or the folder given as $1):
#   device.txt            nvidia-smi, nvcc
#   cuda_twin.json/.log   every kernel against its CPU twin (kernels_test CudaTwin*/CudaOpsTwin*/
#                         CudaGemmAttentionTwin*)
#   cuda_kv_bench.json    KV pack/unpack GB/s on the GPU
#   cuda_model.json/.log  the device model against the CPU model (stories260K f32/bf16, block
#                         sizes 16/64, graph replay vs plain steps, KV pack); cuda_engines.json:
#                         the prefill/decode engines on --device=cuda against the CPU engine
#   cuda_model_bench.json decode step time (batch 1/8/64/256) vs the HBM bound and prefill
#                         TFLOP/s (512/2048/8192 tokens) of a Llama-3-8B-shaped random bf16 model
#   nccl.json/.log        the NCCL transport: fake-communicator logic, the real library's loader,
#                         a lonely rank's abort and device staging (1 GPU), the 2-GPU transfers
#                         (raw and through the KvSender/KvReceiver transport; skipped on 1 GPU)
#   kv_transfer_bench.json/.log  KV transfer GB/s: tcp, local, nccl over the fake, and nccl
#                         GPU1->GPU0 (null with the reason on 1 GPU)
#   ctest.log             the rest of the suite, if time is left (stage limited by timeout)
#   summary.json          per stage: exit code, tests run / failed / skipped, seconds
# Exit code: 0 when every stage passed and no CUDA twin skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu_out}}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
T0=$(date +%s)
{
  nvidia-smi || true
  nvcc --version || true
} >"$OUT/device.txt" 2>&1
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=$(nproc)
stage_json=()
record() {  # name rc seconds [gtest json]
  local tests=0 failures=0 skipped=0
  if [[ -n "${4:-}" && -f "$4" ]]; then
    tests=$(python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d.get('tests',0))" "$4" 2>/dev/null || echo 0)
    failures=$(python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d.get('failures',0))" "$4" 2>/dev/null || echo 0)
    skipped=$(grep -c '"result": "SKIPPED"' "$4" 2>/dev/null || true)
  fi
  stage_json+=("{\"stage\":\"$1\",\"rc\":$2,\"seconds\":$3,\"tests\":$tests,\"failures\":$failures,\"skipped\":${skipped:-0}}")
}
finish() {
  local IFS=,
  echo "{\"total_seconds\":$(($(date +%s) - T0)),\"stages\":[${stage_json[*]}]}" >"$OUT/summary.json"
  cat "$OUT/summary.json"
  exit "$1"
}
rc=0
s=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTANDEM_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1
c=$?
record configure $c $(($(date +%s) - s))
if [[ $c -ne 0 ]]; then tail -30 "$OUT/configure.log"; finish 1; fi
# Only what the CUDA checks need first; the rest of the suite afterwards if time allows.
s=$(date +%s)
targets=(tandem_cuda kernels_test kv_transfer_test cuda_kv_bench kv_transfer_bench cuda_model_test
  cuda_model_bench)
# libtandem_nccl.so exists only where nccl.h and libnccl were found.
if cmake --build "$BUILD_DIR" --target help 2>/dev/null | grep -q '^tandem_nccl:'; then
  targets+=(tandem_nccl)
else
  echo "NCCL not found: libtandem_nccl.so not built" | tee -a "$OUT/device.txt"
fi
timeout 300 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >"$OUT/build.log" 2>&1
c=$?
record build_cuda $c $(($(date +%s) - s))
if [[ $c -ne 0 ]]; then tail -30 "$OUT/build.log"; finish 1; fi

s=$(date +%s)
timeout 120 "$BUILD_DIR/bin/kernels_test" --gtest_filter='CudaTwin*:CudaOpsTwin*:CudaGemmAttentionTwin*' \
  --gtest_output="json:$OUT/cuda_twin.json" >"$OUT/cuda_twin.log" 2>&1
c=$?
record cuda_twin $c $(($(date +%s) - s)) "$OUT/cuda_twin.json"
[[ $c -ne 0 ]] && rc=2
if grep -q '^\[  SKIPPED \]' "$OUT/cuda_twin.log"; then
  echo "CUDA twins skipped on a GPU machine"
  rc=3
fi

s=$(date +%s)
timeout 120 "$BUILD_DIR/bin/cuda_model_test" --gtest_output="json:$OUT/cuda_model.json" \
  >"$OUT/cuda_model.log" 2>&1
c=$?
record cuda_model $c $(($(date +%s) - s)) "$OUT/cuda_model.json"
[[ $c -ne 0 ]] && rc=6
if grep -q '^\[  SKIPPED \]' "$OUT/cuda_model.log"; then
  echo "CUDA model tests skipped on a GPU machine"
  rc=3
fi

s=$(date +%s)
timeout 120 "$BUILD_DIR/bin/kv_transfer_test" --gtest_filter='Nccl*' \
  --gtest_output="json:$OUT/nccl.json" >"$OUT/nccl.log" 2>&1
c=$?
record nccl $c $(($(date +%s) - s)) "$OUT/nccl.json"
[[ $c -ne 0 ]] && rc=4
s=$(date +%s)
timeout 60 "$BUILD_DIR/bin/kv_transfer_bench" --prompts 5 --out "$OUT/kv_transfer_bench.json" \
  >"$OUT/kv_transfer_bench.log" 2>&1
c=$?
record kv_transfer_bench $c $(($(date +%s) - s))
[[ $c -ne 0 && $rc -eq 0 ]] && rc=6
s=$(date +%s)
timeout 60 "$BUILD_DIR/bin/cuda_kv_bench" --out "$OUT/cuda_kv_bench.json" >"$OUT/cuda_kv_bench.log" 2>&1
c=$?
record cuda_kv_bench $c $(($(date +%s) - s))
cat "$OUT/cuda_kv_bench.log"
s=$(date +%s)
timeout 150 "$BUILD_DIR/bin/cuda_model_bench" --out "$OUT/cuda_model_bench.json" \
  >"$OUT/cuda_model_bench.log" 2>&1
c=$?
record cuda_model_bench $c $(($(date +%s) - s))
[[ $c -ne 0 && $rc -eq 0 ]] && rc=7
cat "$OUT/cuda_model_bench.log"
# The engines pull in more of the tree (metrics, transports): built on their own, after the
# kernel stages, within what is left of 6.5 minutes.
left=$((390 - ($(date +%s) - T0)))
if ((left > 60)); then
  s=$(date +%s)
  timeout "$left" bash -c "cmake --build '$BUILD_DIR' -j '$JOBS' --target cuda_engines_test \
      >'$OUT/build_engines.log' 2>&1 &&
    '$BUILD_DIR/bin/cuda_engines_test' --gtest_output='json:$OUT/cuda_engines.json' \
      >'$OUT/cuda_engines.log' 2>&1"
  c=$?
  record cuda_engines $c $(($(date +%s) - s)) "$OUT/cuda_engines.json"
  [[ $c -ne 0 ]] && rc=6
else
  record cuda_engines -1 0
fi
if grep -q '^\[  SKIPPED \]' "$OUT/cuda_engines.log" 2>/dev/null; then
  echo "CUDA engine tests skipped on a GPU machine"
  rc=3
fi
tail -5 "$OUT/cuda_model.log"
tail -3 "$OUT/cuda_engines.log" 2>/dev/null
tail -5 "$OUT/cuda_twin.log"
tail -3 "$OUT/nccl.log"
grep -i nccl "$OUT/kv_transfer_bench.log"

# The rest of the suite, within what is left of 7 minutes.
# GPU_CHECK_CUDA_ONLY=1 stops after the CUDA stages (for trying the script without a GPU).
left=$((420 - ($(date +%s) - T0)))
if [[ "${GPU_CHECK_CUDA_ONLY:-0}" != 1 ]] && ((left > 60)); then
  s=$(date +%s)
  timeout "$left" bash -c "cmake --build '$BUILD_DIR' -j '$JOBS' >'$OUT/build_all.log' 2>&1 &&
    ctest --test-dir '$BUILD_DIR' -j 8 --timeout 120 --output-on-failure -E 'Nccl|Cuda' \
      >'$OUT/ctest.log' 2>&1"
  c=$?
  record ctest $c $(($(date +%s) - s))
  [[ $c -ne 0 && $rc -eq 0 ]] && rc=5
  tail -3 "$OUT/ctest.log" 2>/dev/null
else
  record ctest -1 0
fi
finish $rc
