#!/usr/bin/env bash
# Decode capacity at 8k context with sliding-window layers keeping only their window: Gemma 3
# 270M (five sliding layers of window 512 to one global) in a decode worker's KV budget, its
# KV kept whole per layer against kept in layer groups whose sliding blocks go once behind the
# window (engine/kv/block_table.h). The decode worker's own sizing and scheduler run the
# requests (bench/kv_window_capacity_bench.cc); nothing is computed on the model.
#
#   bench/capacity/window.sh [KV_BYTES] [CONTEXT] [OUT]
#
# Defaults: 4 GiB of f32 KV, 8192-token sequences (7680 prompt + 512 generated), 200 requests.
# Writes OUT (bench/results/kv_window_capacity.json) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
kv_bytes=${1:-4294967296}
context=${2:-8192}
out=${3:-bench/results/kv_window_capacity.json}
gguf="$(bash scripts/fetch_model.sh --gemma3)"
"$BUILD/bin/kv_window_capacity_bench" --model "$gguf" --kv-bytes "$kv_bytes" \
  --context "$context" --max-tokens 512 --requests "${REQUESTS:-200}" --out "$out"
