#!/usr/bin/env bash
# Builds llama.cpp's TARGETS (llama-bench, llama-server, ...) from source in a scratch folder
# ($SCRATCH, default /tmp/tandem-llamacpp), never inside the repository: the llama-cpp-python
# source package of a pinned version vendors llama.cpp. Targets already built are kept.
#   bench/llamacpp/build.sh TARGET...
set -euo pipefail
SCRATCH=${SCRATCH:-/tmp/tandem-llamacpp}
VERSION=0.3.36
missing=()
for t in "$@"; do [ -x "$SCRATCH/build/bin/$t" ] || missing+=("$t"); done
[ ${#missing[@]} -eq 0 ] && exit 0
mkdir -p "$SCRATCH"
if [ ! -d "$SCRATCH/llama_cpp_python-$VERSION" ]; then
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" \
    -d "$SCRATCH"
  tar xzf "$SCRATCH/llama_cpp_python-$VERSION.tar.gz" -C "$SCRATCH"
fi
cmake -S "$SCRATCH/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$SCRATCH/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$SCRATCH/build" -j "$(nproc)" --target "${missing[@]}" >/dev/null
