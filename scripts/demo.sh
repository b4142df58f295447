#!/usr/bin/env bash
# The README's main job: set up the machine, build Tandem, start a local disaggregated cluster
# (router + 1 prefill + 1 decode worker, tcp KV transfer, CPU) on the bundled stories260K model,
# answer a prompt through the router, and stop the cluster.
# Extra arguments go to `tandem generate` (e.g. --prompt "The cat" --temperature 0).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/setup.sh
shared="$(bash scripts/fetch_model.sh)"
if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SHARED_DIR="$shared" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target tandem tandem-server
model="$shared/models/stories260K"

log="$(mktemp)"
"$BUILD_DIR/bin/tandem" up --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" \
  --prefill 1 --decode 1 >"$log" 2>&1 &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -f "$log"' EXIT
router=""
for _ in $(seq 1 300); do
  router="$(sed -n 's/^ready router=//p' "$log")"
  [ -n "$router" ] && break
  kill -0 $cluster 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$router" ] || { echo "the cluster did not become ready" >&2; cat "$log" >&2; exit 1; }
echo "[demo] cluster ready: router at $router (1 prefill + 1 decode worker)" >&2
if [ $# -eq 0 ]; then set -- --max-tokens 120; fi
case " $* " in *" --prompt"*) ;; *) set -- --prompt "Once upon a time" "$@" ;; esac
"$BUILD_DIR/bin/tandem" generate --router "$router" "$@"
