#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU (run through the device tool in one call;
# budget: under 8 minutes on one H200). Builds with CUDA for sm_90 only (or, with
# GPU_CHECK_PREBUILT=BUNDLE.tar.xz, unpacks a build made elsewhere by scripts/gpu_bundle.sh),
# runs every CUDA test and writes logs and JSON results under $OUT (or the folder given as $1):
#   device.txt            nvidia-smi, nvcc, the CUDA libraries found
#   cuda_twin.json/.log   every kernel against its CPU twin (kernels_test CudaTwin*/CudaOpsTwin*/
#                         CudaGemmAttentionTwin*/CudaKvDtypeTwin*: bf16/fp8 KV, FlashInfer)
#   cuda_kv_bench.json    KV pack/unpack GB/s on the GPU
#   cuda_model.json/.log  the device model against the CPU model (stories260K f32/bf16, block
#                         sizes 16/64, graph replay vs plain steps, KV pack); cuda_engines.json:
#                         the prefill/decode engines on --device=cuda against the CPU engine
#   cuda_model_bench.json decode step time (batch 1/8/64/256) vs the HBM bound and prefill
#                         TFLOP/s (512/2048/8192 tokens) of a Llama-3-8B-shaped random bf16 model
#                         with a bf16 KV cache (FlashInfer attention); cuda_model_bench_f32kv.json:
#                         the same with an f32 KV cache (the hand-written kernels)
#   torch_peer.json       the same shape in PyTorch (transformers + SDPA) on the same GPU;
#   gpu_vs_torch.json/.txt  Tandem / PyTorch per row, with the goals met or not
#   nccl.json/.log        the NCCL transport: fake-communicator logic, the real library's loader,
#                         a lonely rank's abort and device staging (1 GPU), the 2-GPU transfers
#                         (raw and through the KvSender/KvReceiver transport; skipped on 1 GPU)
#   kv_transfer_bench.json/.log  KV transfer GB/s: tcp, local, nccl over the fake, and nccl
#                         GPU1->GPU0 (null with the reason on 1 GPU)
#   ncu.txt               with GPU_CHECK_PROFILE=1: per-kernel times of decode and prefill steps
#   e2e.log               `tandem generate --device=cuda` and a `tandem up --device cuda` cluster
#                         answering the stories260K prompt, against the CPU's greedy text
#   ctest.log             the rest of the suite, if time is left (stage limited by timeout; not
#                         in the prebuilt mode)
#   (all in results.tar.gz, beside summary.json)
#   summary.json          per stage: exit code, tests run / failed / skipped, seconds
# Exit code: 0 when every stage passed and no CUDA twin skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT=${1:-${OUT:-gpu_out}}
mkdir -p "$FINAL_OUT"
# Every log lands in one folder, packed into results.tar.gz at the end (plus summary.json).
OUT="$FINAL_OUT/results"
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
  cp "$OUT/summary.json" "$FINAL_OUT/"
  tar -C "$OUT" -czf "$FINAL_OUT/results.tar.gz" . && rm -rf "$OUT"
  exit "$1"
}
rc=0
PREBUILT=${GPU_CHECK_PREBUILT:-}
if [[ -n "$PREBUILT" ]]; then
  # A bundle from scripts/gpu_bundle.sh: unpack it, put the folders compiled into the tests
  # where they point (links to the bundle), and find the CUDA and NCCL libraries here.
  s=$(date +%s)
  bundle=$(mktemp -d /tmp/tandem-bundle.XXXXXX)
  tar -C "$bundle" -xJf "$PREBUILT" || { echo "cannot unpack $PREBUILT"; finish 1; }
  while IFS='=' read -r key dir; do
    case "$key" in
      TANDEM_SHARED_DIR) target="$bundle/shared" ;;
      TANDEM_BIN_DIR) target="$bundle/bin" ;;
      TANDEM_SOURCE_DIR) target="$PWD" ;;
      TANDEM_COMMIT) export TANDEM_COMMIT="$dir"; continue ;;
      *) continue ;;
    esac
    if [[ ! -e "$dir" ]]; then mkdir -p "$(dirname "$dir")" && ln -s "$target" "$dir"; fi
  done <"$bundle/paths"
  BIN="$bundle/bin"
  libdirs="$bundle/lib"
  for lib in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
    found=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ /opt/ \
      -name "$lib" 2>/dev/null | head -1)
    if [[ -n "$found" ]]; then libdirs="$libdirs:$(dirname "$found")"; fi
  done
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$BIN/libtandem_cuda.so" "$BIN/libtandem_nccl.so" "$BIN/cuda_model_test" | grep -E 'not found|cublas|cudart|nccl|:$'
  } >>"$OUT/device.txt" 2>&1
  record unpack 0 $(($(date +%s) - s))
else
  s=$(date +%s)
  TANDEM_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if ! git diff --quiet HEAD 2>/dev/null; then TANDEM_COMMIT="$TANDEM_COMMIT-dirty"; fi
  export TANDEM_COMMIT
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTANDEM_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1
  c=$?
  record configure $c $(($(date +%s) - s))
  if [[ $c -ne 0 ]]; then tail -30 "$OUT/configure.log"; finish 1; fi
  # Only what the CUDA checks need first; the rest of the suite afterwards if time allows.
  s=$(date +%s)
  targets=(tandem_cuda kernels_test kv_transfer_test cuda_kv_bench kv_transfer_bench
    cuda_model_test cuda_model_bench)
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
  BIN="$BUILD_DIR/bin"
fi

# A gtest binary as a stage: name, timeout, binary, rc on failure, extra args.
gtest_stage() {
  local name=$1 limit=$2 bin=$3 fail_rc=$4
  shift 4
  local s c
  s=$(date +%s)
  timeout "$limit" "$BIN/$bin" "$@" --gtest_output="json:$OUT/$name.json" >"$OUT/$name.log" 2>&1
  c=$?
  record "$name" $c $(($(date +%s) - s)) "$OUT/$name.json"
  [[ $c -ne 0 ]] && rc=$fail_rc
  # The 2-GPU NCCL tests skip themselves where one GPU is visible: expected, not a failure.
  if [[ "$name" == nccl && "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -lt 2 ]]; then
    :
  elif grep -q '^\[  SKIPPED \]' "$OUT/$name.log"; then
    echo "$name: tests skipped on a GPU machine"
    grep -A2 '^\[  SKIPPED \]' "$OUT/$name.log" | head -6
    rc=3
  fi
  echo "== $name rc=$c"
  grep -E '^\[  (FAILED|PASSED) |Failure|error' "$OUT/$name.log" | head -20
}
gtest_stage cuda_twin 120 kernels_test 2 \
  --gtest_filter='CudaTwin*:CudaOpsTwin*:CudaGemmAttentionTwin*:CudaKvDtypeTwin*'
gtest_stage cuda_model 120 cuda_model_test 6

# The engines pull in more of the tree (metrics, transports): built on their own when building
# here, within what is left of 4 minutes.
if [[ -z "$PREBUILT" ]]; then
  left=$((240 - ($(date +%s) - T0)))
  if ((left > 30)); then
    timeout "$left" cmake --build "$BUILD_DIR" -j "$JOBS" --target cuda_engines_test tandem \
      tandem-server >"$OUT/build_engines.log" 2>&1
  fi
fi
if [[ -x "$BIN/cuda_engines_test" ]]; then
  gtest_stage cuda_engines 120 cuda_engines_test 6
else
  record cuda_engines -1 0
fi

# End to end: greedy text of the CPU, of `tandem generate --device cuda` and of a local
# disaggregated cluster on the GPU (`tandem up --device cuda`), which must agree.
if [[ -n "$PREBUILT" ]]; then
  shared="$bundle/shared"
else
  shared=$(sed -n 's/^TANDEM_SHARED_DIR:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
fi
e2e() {
  local m="$shared/models/stories260K" router="" cluster i
  local args=(--prompt "Once upon a time" --max-tokens 200 --temperature 0)
  timeout 60 "$BIN/tandem" generate --model "$m/stories260K.bin" --tokenizer "$m/tok512.bin" "${args[@]}" \
    --device cpu >"$OUT/e2e_cpu.txt" || return 1
  timeout 60 "$BIN/tandem" generate --model "$m/stories260K.bin" --tokenizer "$m/tok512.bin" "${args[@]}" \
    --device cuda >"$OUT/e2e_cuda.txt" || return 2
  "$BIN/tandem" up --model "$m/stories260K.bin" --tokenizer "$m/tok512.bin" --prefill 1 \
    --decode 1 --device cuda >"$OUT/e2e_cluster.log" 2>&1 &
  cluster=$!
  for i in $(seq 1 300); do
    router=$(sed -n 's/^ready router=//p' "$OUT/e2e_cluster.log")
    [[ -n "$router" ]] && break
    kill -0 $cluster 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z "$router" ]]; then
    kill -INT $cluster 2>/dev/null
    return 3
  fi
  timeout 60 "$BIN/tandem" generate --router "$router" "${args[@]}" >"$OUT/e2e_cluster.txt"
  local g=$?
  kill -INT $cluster 2>/dev/null
  wait $cluster 2>/dev/null
  [[ $g -eq 0 ]] || return 4
  cmp -s "$OUT/e2e_cpu.txt" "$OUT/e2e_cuda.txt" || return 5
  cmp -s "$OUT/e2e_cpu.txt" "$OUT/e2e_cluster.txt" || return 6
}
if [[ -x "$BIN/tandem" && -x "$BIN/tandem-server" ]]; then
  s=$(date +%s)
  e2e >"$OUT/e2e.log" 2>&1
  c=$?
  record e2e $c $(($(date +%s) - s))
  [[ $c -ne 0 && $rc -eq 0 ]] && rc=9
  echo "== e2e rc=$c (1 cpu, 2 cuda generate, 3 cluster start, 4 cluster generate, 5/6 text differs)"
  for f in e2e_cpu.txt e2e_cuda.txt e2e_cluster.txt; do
    echo "-- $f: $(head -c 300 "$OUT/$f" 2>/dev/null | tr '\n' ' ')"
  done
  tail -5 "$OUT/e2e.log"
else
  record e2e -1 0
fi

s=$(date +%s)
timeout 150 "$BIN/cuda_model_bench" --out "$OUT/cuda_model_bench.json" \
  >"$OUT/cuda_model_bench.log" 2>&1
c=$?
record cuda_model_bench $c $(($(date +%s) - s))
[[ $c -ne 0 && $rc -eq 0 ]] && rc=7
cat "$OUT/cuda_model_bench.log"
# The PyTorch peer on the same GPU in the same run (bench/gpu/torch_peer.py: the same model shape,
# SDPA attention, cuBLAS GEMMs, graph-replayed decode steps), and Tandem / PyTorch per row with
# the goals (bench/gpu/compare.py; gpu_vs_torch.json).
s=$(date +%s)
timeout 240 python3 bench/gpu/torch_peer.py --out "$OUT/torch_peer.json" >"$OUT/torch_peer.log" 2>&1
c=$?
record torch_peer $c $(($(date +%s) - s))
cat "$OUT/torch_peer.log"
echo "== Tandem against PyTorch, this run (above 1x: Tandem faster):"
python3 bench/gpu/compare.py "$OUT/cuda_model_bench.json" "$OUT/torch_peer.json" \
  --out "$OUT/gpu_vs_torch.json" 2>&1 | tee "$OUT/gpu_vs_torch.txt"
# The same model with an f32 KV cache (the hand-written attention kernels), for comparison.
echo "== f32 KV cache (hand-written attention):"
timeout 90 "$BIN/cuda_model_bench" --kv-dtype f32 --batches 64,256 --prefill 2048,8192 \
  --out "$OUT/cuda_model_bench_f32kv.json" 2>&1 | grep -E "decode|prefill"
# The same decode steps with cuBLAS for every GEMM (TANDEM_CUDA_GEMV=0), for comparison.
echo "== decode with cuBLAS instead of the bf16 GEMV (TANDEM_CUDA_GEMV=0):"
TANDEM_CUDA_GEMV=0 timeout 60 "$BIN/cuda_model_bench" --batches 1,8 --prefill "" \
  --out "$OUT/cuda_model_bench_cublas.json" 2>&1 | grep decode
s=$(date +%s)
timeout 60 "$BIN/cuda_kv_bench" --out "$OUT/cuda_kv_bench.json" >"$OUT/cuda_kv_bench.log" 2>&1
c=$?
record cuda_kv_bench $c $(($(date +%s) - s))
cat "$OUT/cuda_kv_bench.log"
gtest_stage nccl 90 kv_transfer_test 4 --gtest_filter='Nccl*'
s=$(date +%s)
timeout 60 "$BIN/kv_transfer_bench" --prompts 5 --out "$OUT/kv_transfer_bench.json" \
  >"$OUT/kv_transfer_bench.log" 2>&1
c=$?
record kv_transfer_bench $c $(($(date +%s) - s))
[[ $c -ne 0 && $rc -eq 0 ]] && rc=6
grep -i nccl "$OUT/kv_transfer_bench.log"

# compute-sanitizer's memcheck over the device model's tests, within what is left of 6 minutes
# (where the tool exists and the runtime lets it read the device).
left=$((360 - ($(date +%s) - T0)))
if command -v compute-sanitizer >/dev/null && ((left > 45)); then
  s=$(date +%s)
  timeout "$left" compute-sanitizer --tool memcheck --error-exitcode 99 \
    "$BIN/cuda_model_test" --gtest_filter='CudaModelTest.Stories260KF32MatchesCpuBlock16:CudaModelTest.GraphReplayEqualsPlainSteps:CudaModelTest.BadSteps*' \
    >"$OUT/memcheck.log" 2>&1
  c=$?
  record memcheck $c $(($(date +%s) - s))
  echo "== memcheck rc=$c"
  grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUT/memcheck.log" | head -10
  [[ $c -eq 99 && $rc -eq 0 ]] && rc=8
fi

# GPU_CHECK_PROFILE=1: kernel times of the bench's decode (batch 1 and 64) and prefill (512 and
# 2048 tokens) steps on a 2-layer model under Nsight Compute, summed per kernel (ncu.txt).
if [[ "${GPU_CHECK_PROFILE:-0}" == 1 ]] && command -v ncu >/dev/null; then
  for part in "--batches 1 --prefill 512" "--batches 64 --prefill 2048"; do
    s=$(date +%s)
    # shellcheck disable=SC2086
    timeout 120 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
      "$BIN/cuda_model_bench" --layers 2 $part --out "$OUT/profile_bench.json" \
      >"$OUT/ncu_raw.csv" 2>"$OUT/ncu_err.log"
    c=$?
    record "profile" $c $(($(date +%s) - s))
    {
      echo "== ncu: cuda_model_bench --layers 2 $part (rc $c)"
      python3 scripts/ncu_summary.py "$OUT/ncu_raw.csv" 20
    } >>"$OUT/ncu.txt" 2>&1
    rm -f "$OUT/ncu_raw.csv"
  done
  cat "$OUT/ncu.txt"
fi

# The rest of the suite (when building here), within what is left of 7 minutes.
# GPU_CHECK_CUDA_ONLY=1 stops after the CUDA stages (for trying the script without a GPU).
left=$((420 - ($(date +%s) - T0)))
if [[ -z "$PREBUILT" && "${GPU_CHECK_CUDA_ONLY:-0}" != 1 ]] && ((left > 60)); then
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
