#!/usr/bin/env bash
# Disaggregated vs colocated on one machine, for one model:
#   TTFT of a long prompt (one request at a time: prefill + KV transfer + first token), and
#   output tokens/s with 32 requests in flight,
# through `tandem-server --role=all` and through router + 1 prefill + 1 decode (tcp transport).
#   bench/disagg/run.sh MODEL [PROMPT_TOKENS] [OUT_DIR]
# MODEL: stories260K (the bundled checkpoint) or a shape for `tandem model random` (f32),
# e.g. stories110M. Writes OUT_DIR/MODEL-{colocated,1p1d}-{ttft,load}.json and a summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
bin="$BUILD/bin"
name=${1:-stories260K}
prompt=${2:-500}
OUT=${3:-bench/results/disagg}
mkdir -p "$OUT"
shared="$(bash scripts/fetch_model.sh)"
tok="$shared/models/stories260K/tok512.bin"
if [ "$name" = stories260K ]; then
  model="$shared/models/stories260K/stories260K.bin"
else
  model="$OUT/$name-random"
  [ -f "$model/config.json" ] || "$bin/tandem" model random --shape "$name" --dtype f32 --out "$model"
fi

# The cluster's secret: internal calls and KV connections prove it.
secret="$(mktemp)"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap 'cleanup; rm -f "$secret"' EXIT
start() {  # start ROLE [flags...]: sets ADDR (its gRPC address) and INTERNAL (its internal one)
  local role=$1
  shift
  local log
  log="$(mktemp)"
  "$bin/tandem-server" --role="$role" --model "$model" --tokenizer "$tok" \
    --cluster-secret-file "$secret" "$@" >"$log" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 1 400); do
    ADDR="$(sed -n 's/^listening //p' "$log" | head -1)"
    INTERNAL="$(sed -n 's/^internal //p' "$log" | head -1)"
    if [ -n "$INTERNAL" ]; then rm -f "$log"; return; fi
    sleep 0.05
  done
  echo "tandem-server --role=$role did not start" >&2
  exit 1
}
measure() {  # measure LABEL ROUTER
  sleep 1
  "$bin/tandem" bench --router "$2" --concurrency 1 --input-len "$prompt" --output-len 1 \
    --num-requests 6 --warmup 1 --no-progress --json "$OUT/$name-$1-ttft.json" >/dev/null
  "$bin/tandem" bench --router "$2" --concurrency 32 --input-len 64 --output-len 128 \
    --num-requests 64 --warmup 4 --no-progress --json "$OUT/$name-$1-load.json" >/dev/null
}
start all
measure colocated "$ADDR"
cleanup
start router --heartbeat-ms 200
router=$ADDR
registry=$INTERNAL
start prefill --router "$registry"
start decode --router "$registry"
measure 1p1d "$router"
cleanup
python3 - "$OUT" "$name" "$prompt" <<'PY'
import json, sys
out, name, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = {"model": name, "prompt_tokens": prompt}
for mode in ("colocated", "1p1d"):
    t = json.load(open(f"{out}/{name}-{mode}-ttft.json"))["summary"]
    l = json.load(open(f"{out}/{name}-{mode}-load.json"))["summary"]
    s[mode] = {"ttft_p50_ms": round(t["ttft_s"]["p50"] * 1e3, 2),
               "ttft_mean_ms": round(t["ttft_s"]["mean"] * 1e3, 2),
               "output_tokens_per_s_at_32": round(l["output_token_throughput"], 1),
               "tpot_p50_ms_at_32": round(l["tpot_s"]["p50"] * 1e3, 2)}
json.dump(s, open(f"{out}/{name}-summary.json", "w"), indent=2)
print(json.dumps(s, indent=2))
PY
