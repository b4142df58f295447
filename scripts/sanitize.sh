#!/usr/bin/env bash
# Builds the whole tree with AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA, no
# benchmarks) in build-asan/ and runs every test under them, server processes included.
# About 11 minutes of compile on 2 cores; not part of .ci/run yet.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=OFF \
  -DTANDEM_BUILD_BENCH=OFF -DTANDEM_SHARED_DIR="$(bash scripts/fetch_model.sh --shared-dir)" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan -j "$(nproc)" --timeout 300 --output-on-failure
