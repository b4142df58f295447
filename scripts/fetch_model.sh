#!/usr/bin/env bash
# Makes the default model (stories260K, with its tok512 tokenizer) available and prints the
# folder that holds models/ and testdata/.
#   ../shared beside the checkout (developer machines and CI): used as it is.
#   elsewhere: downloaded once into ./models/stories260K from its public home (Karpathy's
#   tinyllamas on Hugging Face); model data is never committed to the project.
# With --shared-dir it only prints the folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
shared="$(cd "$root/.." && pwd)/shared"
if [ -f "$shared/models/stories260K/stories260K.bin" ]; then
  echo "$shared"
  exit 0
fi
local_dir="$root/models"
if [ "${1:-}" != "--shared-dir" ] && [ ! -f "$local_dir/models/stories260K/stories260K.bin" ]; then
  mkdir -p "$local_dir/models/stories260K"
  base="https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K"
  for f in stories260K.bin tok512.bin; do
    echo "fetching $f" >&2
    curl -fsSL -o "$local_dir/models/stories260K/$f" "$base/$f"
  done
  echo "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  $local_dir/models/stories260K/stories260K.bin" | sha256sum -c - >&2
fi
echo "$local_dir"
