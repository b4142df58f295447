#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, the TANDEM_FUZZ build) in
# build-fuzz/, writes their seed corpora from the real model, tokenizers and valid frames, and
# runs each target for SECONDS_PER_TARGET (default 20). Prints executions per second and
# findings; exits 1 when any target crashes (its reproducer is in build-fuzz/fuzz-findings/).
#
#   scripts/fuzz.sh [--unit-tests] [SECONDS_PER_TARGET]
#     --unit-tests  also build the unit tests of that build (engine, kernels, kv_transfer,
#                   tokenizer, chat template; no gRPC servers) and run them under ASan + UBSan
#                   first: the sanitizer step of scripts/test.sh.
#   FUZZ_TARGETS  the targets to run (default: all of them)
#   FUZZ_BUILD_DIR  build folder (default: build-fuzz); JOBS: parallel jobs (default: cores)
#
# Reproduce a finding: build-fuzz/bin/<target> build-fuzz/fuzz-findings/<target>-crash-...
# The corpus each run grows is kept in build-fuzz/fuzz-corpus/<target>/ for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."

UNIT_TESTS=0
if [ "${1:-}" = "--unit-tests" ]; then
  UNIT_TESTS=1
  shift
fi
SECONDS_PER_TARGET=${1:-20}
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
ALL_TARGETS="safetensors_fuzzer gguf_fuzzer llama2c_fuzzer hf_config_fuzzer tokenizer_json_fuzzer
  tokenizer_encode_fuzzer ingress_fuzzer kv_wire_fuzzer chat_template_fuzzer http_request_fuzzer
  json_schema_fuzzer"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}

bash scripts/setup.sh
bash scripts/fetch_model.sh >/dev/null
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DTANDEM_SHARED_DIR="$(bash scripts/fetch_model.sh --shared-dir)" -DTANDEM_SMOLLM2_GGUF=OFF -DTANDEM_GEMMA3_GGUF=OFF \
  >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
if [ -x /usr/bin/llvm-symbolizer-14 ]; then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/bin/llvm-symbolizer-14}
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "$UNIT_TESTS" = 1 ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS"
  ctest --test-dir "$BUILD_DIR" -j "$JOBS" --timeout 600 --output-on-failure
else
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz_seeds $TARGETS
fi

SEEDS="$BUILD_DIR/fuzz-seeds"
FINDINGS="$BUILD_DIR/fuzz-findings"
rm -rf "$SEEDS"
mkdir -p "$FINDINGS" "$BUILD_DIR/fuzz-logs"
"$BUILD_DIR/bin/fuzz_seeds" "$SEEDS"

# One target: libFuzzer runs it on one thread for SECONDS_PER_TARGET, its exit status kept
# beside its log. JOBS targets run at once.
fuzz_target() {
  local t=$1 rc=0
  mkdir -p "$BUILD_DIR/fuzz-corpus/$t"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s" >&2
  "$BUILD_DIR/bin/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$FINDINGS/$t-" "$BUILD_DIR/fuzz-corpus/$t" \
    "$SEEDS/$t" >"$BUILD_DIR/fuzz-logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$BUILD_DIR/fuzz-logs/$t.rc"
}
running=0
for t in $TARGETS; do
  fuzz_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=()
summary=()
for t in $TARGETS; do
  log="$BUILD_DIR/fuzz-logs/$t.log"
  rc=$(cat "$BUILD_DIR/fuzz-logs/$t.rc")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    summary+=("$(printf '%-24s %10s runs %8s exec/s  cov %6s  CRASH (rc %d, see %s)' "$t" \
      "${runs:-?}" "${rate:-?}" "${cov:-?}" "$rc" "$log")")
    echo "---- $t: last lines of $log ----" >&2
    tail -n 40 "$log" >&2
  else
    summary+=("$(printf '%-24s %10s runs %8s exec/s  cov %6s  no findings' "$t" "${runs:-?}" \
      "${rate:-?}" "${cov:-?}")")
  fi
done

echo "fuzz: ${SECONDS_PER_TARGET}s per target ($BUILD_DIR/fuzz-logs/)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers in $FINDINGS/)" >&2
  exit 1
fi
