#!/usr/bin/env bash
# Makes FlashInfer's attention headers available to the CUDA build and prints their folder.
# FlashInfer (Apache-2.0) is the kernel library vLLM, SGLang and TensorRT-LLM serve with; its
# CUDA templates ship inside the flashinfer-python wheel on PyPI. The wheel is fetched once
# (pip download --no-deps; plain curl from PyPI where pip is missing), checked against its
# sha256, and only what the build compiles is kept, in $TANDEM_MODEL_CACHE (default
# ~/.cache/tandem)/flashinfer-VERSION:
#   include/flashinfer/        the attention templates (headers only; nothing of FlashInfer's
#                              Python, JIT or prebuilt kernels)
#   cccl/libcudacxx/include/   the CCCL they build against (newer than CUDA 13.0's own)
#   licenses/                  the wheel's license files
# Nothing of it is committed to the project. Exit 1 when it cannot be fetched.
set -euo pipefail
version=0.7.4
sha=a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32
wheel_name="flashinfer_python-$version-py3-none-any.whl"
cache="${TANDEM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}"
dir="$cache/flashinfer-$version"
if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$cache"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching flashinfer-python $version (its CUDA attention headers; a 101 MB wheel) from PyPI" >&2
if ! python3 -m pip download --no-deps --quiet --disable-pip-version-check --only-binary=:all: \
    "flashinfer-python==$version" -d "$tmp" >&2 2>/dev/null; then
  url="$(curl -fsSL https://pypi.org/simple/flashinfer-python/ |
    grep -o "https://[^\"#]*$wheel_name" | head -1)"
  [ -n "$url" ] || { echo "fetch_flashinfer: $wheel_name not found on PyPI" >&2; exit 1; }
  curl -fsSL -o "$tmp/$wheel_name" "$url"
fi
if ! echo "$sha  $tmp/$wheel_name" | sha256sum -c - >/dev/null 2>&1; then
  echo "fetch_flashinfer: $wheel_name does not have sha256 $sha" >&2
  exit 1
fi
rm -rf "$dir.part"
python3 - "$tmp/$wheel_name" "$dir.part" <<'PY'
import os, sys, zipfile
keep = {"flashinfer/data/include/flashinfer/": "include/flashinfer/",
        "flashinfer/data/cccl/libcudacxx/include/": "cccl/libcudacxx/include/"}
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.endswith("/"):
            continue
        if ".dist-info/licenses/" in name:
            out = "licenses/" + name.split(".dist-info/licenses/", 1)[1]
        else:
            out = next((dst + name[len(src):] for src, dst in keep.items()
                        if name.startswith(src)), None)
        if out is None:
            continue
        path = os.path.join(sys.argv[2], out)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as src, open(path, "wb") as dst:
            dst.write(src.read())
PY
touch "$dir.part/.complete"
rm -rf "$dir"
mv "$dir.part" "$dir"
echo "$dir"
