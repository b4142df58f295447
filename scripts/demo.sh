#!/usr/bin/env bash
# The README's main job: set up the machine, build Tandem, and answer a prompt with the bundled
# stories260K model. Extra arguments go to `tandem generate` (e.g. --prompt "The cat").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/setup.sh
shared="$(bash scripts/fetch_model.sh)"
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SHARED_DIR="$shared" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target tandem
model="$shared/models/stories260K"
if [ $# -eq 0 ]; then set -- --prompt "Once upon a time" --max-tokens 120; fi
exec "$BUILD_DIR/bin/tandem" generate --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" "$@"
