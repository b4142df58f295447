#!/usr/bin/env bash
# Packs a CUDA build made on this (Debian) machine for a GPU machine that has the CUDA driver and
# toolkit but not this project's Debian libraries (gRPC, Abseil, prometheus-cpp, ...), so the
# device check needs no compiler time there:
#   scripts/gpu_bundle.sh BUILD_DIR BUNDLE.tar.xz
# makes one archive holding
#   bin/     the CUDA test and benchmark binaries, tandem and tandem-server (stripped),
#            libtandem_cuda.so and libtandem_nccl.so
#   lib/     every shared library they need beyond glibc, libstdc++ and the CUDA libraries
#   shared/  the model and the oracles (models/stories260K, testdata)
#   paths    the folders compiled into the tests (TANDEM_SHARED_DIR, TANDEM_BIN_DIR,
#            TANDEM_SOURCE_DIR): scripts/gpu_check.sh links them to the unpacked bundle; and
#            TANDEM_COMMIT, the commit built (benchmarks record it in their JSON).
# On the GPU machine: GPU_CHECK_PREBUILT=BUNDLE.tar.xz bash scripts/gpu_check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: gpu_bundle.sh BUILD_DIR BUNDLE.tar.xz}
out=${2:?usage: gpu_bundle.sh BUILD_DIR BUNDLE.tar.xz}
cache="$build/CMakeCache.txt"
[[ -f "$cache" ]] || { echo "no $cache" >&2; exit 1; }
grep -q '^TANDEM_CUDA:STRING=ON' "$cache" || { echo "$build is not a TANDEM_CUDA=ON build" >&2; exit 1; }
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$cache"; }
shared_dir=$(cache_value TANDEM_SHARED_DIR)
source_dir=$(cache_value CMAKE_HOME_DIRECTORY)
bin_dir="$(cd "$build" && pwd)/bin"

binaries=(kernels_test kv_transfer_test cuda_model_test cuda_engines_test cuda_model_bench
  cuda_kv_bench kv_transfer_bench tandem tandem-server)
plugins=(libtandem_cuda.so libtandem_nccl.so)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/shared/models"
for b in "${binaries[@]}" "${plugins[@]}"; do
  [[ -f "$bin_dir/$b" ]] || { echo "missing $bin_dir/$b (build it first)" >&2; exit 1; }
  cp "$bin_dir/$b" "$stage/bin/"
  strip --strip-debug "$stage/bin/$b"
done
# Shared libraries: everything ldd resolves except the C/C++ runtime (the GPU machine's own,
# newer) and the CUDA libraries (the GPU machine's toolkit).
system='^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia)[.-]'
for b in "${binaries[@]}" "${plugins[@]}"; do
  ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $system ]]; then cp -L "$path" "$stage/lib/$name"; fi
done
cp -r "$shared_dir/models/stories260K" "$stage/shared/models/"
cp -r "$shared_dir/testdata" "$stage/shared/"
chmod -R u+w "$stage/shared"
commit=$(git -C "$source_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git -C "$source_dir" diff --quiet HEAD 2>/dev/null; then commit="$commit-dirty"; fi
printf 'TANDEM_SHARED_DIR=%s\nTANDEM_BIN_DIR=%s\nTANDEM_SOURCE_DIR=%s\nTANDEM_COMMIT=%s\n' \
  "$shared_dir" "$bin_dir" "$source_dir" "$commit" >"$stage/paths"
tar -C "$stage" -cJf "$out" .
echo "$out: $(du -h "$out" | cut -f1) ($(ls "$stage/lib" | wc -l) libraries)"
