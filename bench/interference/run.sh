#!/usr/bin/env bash
# The interference experiment: does splitting prefill from decode keep decode latency steady
# when bursts of long prompts arrive? Same two CPU cores, same model, same workload:
#   colocated:      tandem-server --role=all (one process, 2 threads)
#   disaggregated:  router + 1 prefill worker (1 thread) + 1 decode worker (1 thread)
# Workload, run twice with the same seeds: a steady decode stream (closed loop, 4 in flight,
# 16-token prompts, 150-token outputs) plus bursts of long prompts (gamma arrivals with
# burstiness 0.25, 200-token prompts, 4-token outputs).
# Model: random weights of a real shape (f32), written once into the output folder.
# The colocated server runs three times: the steady stream alone (its idle pace), with the bursts
# (the prefill taking turns with decode steps, kernels/cpu/core_share.h), and with the bursts and
# --colocated-prefill-share 0 (the two engines' loops interleaved unmanaged).
# Writes OUT/{colocated,colocated-unshared,disaggregated}-{steady,bursts}.json,
# OUT/colocated-idle-steady.json, OUT/interference.svg and OUT/summary.json (TPOT and
# inter-token latency of the steady stream, TTFT of the bursts).
#   bench/interference/run.sh [OUT_DIR]      (default bench/results/interference)
# Knobs (environment): SHAPE (stories15M), BURST_PROMPT (200 tokens), STEADY_OUTPUT (150),
# STEADY_REQUESTS (24), BURSTS (12), BURST_RATE (1.5 req/s).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
OUT=${1:-bench/results/interference}
mkdir -p "$OUT"
bin="$BUILD/bin"
shared="$(bash scripts/fetch_model.sh)"
tok="$shared/models/stories260K/tok512.bin"  # prompts are token ids; the router needs one
SHAPE=${SHAPE:-stories15M}
BURST_PROMPT=${BURST_PROMPT:-200}
STEADY_OUTPUT=${STEADY_OUTPUT:-150}
STEADY_REQUESTS=${STEADY_REQUESTS:-24}
BURSTS=${BURSTS:-12}
BURST_RATE=${BURST_RATE:-1.5}
model="$OUT/$SHAPE-random"
[ -f "$model/config.json" ] || "$bin/tandem" model random --shape "$SHAPE" --dtype f32 --out "$model"

# The cluster's secret: internal calls and KV connections prove it.
secret="$(mktemp)"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap 'cleanup; rm -f "$secret"' EXIT

# start ROLE THREADS [flags...]: starts tandem-server; sets ADDR to its address and INTERNAL to its
# internal one. (Not run in a
# command substitution, so the pid lands in this shell's list.)
start() {
  local role=$1 threads=$2
  shift 2
  local log
  log="$(mktemp)"
  TANDEM_NUM_THREADS=$threads "$bin/tandem-server" --role="$role" --model "$model" --tokenizer "$tok" \
    --cluster-secret-file "$secret" "$@" >"$log" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 1 200); do
    local addr
    addr="$(sed -n 's/^listening //p' "$log" | head -1 | cut -d' ' -f1)"
    INTERNAL="$(sed -n 's/^internal //p' "$log" | head -1)"
    if [ -n "$INTERNAL" ]; then ADDR=$addr; rm -f "$log"; return; fi
    sleep 0.05
  done
  echo "tandem-server --role=$role did not start" >&2
  exit 1
}

# workload NAME ROUTER [idle]: the steady stream, with the bursts unless "idle".
workload() {
  local name=$1 router=$2 idle=${3:-}
  sleep 1  # registration
  "$bin/tandem" bench --router "$router" --concurrency 4 --input-len 16 --output-len "$STEADY_OUTPUT" \
    --num-requests "$STEADY_REQUESTS" --seed 1 --no-progress --json "$OUT/$name-steady.json" >"$OUT/$name-steady.txt" &
  local steady=$!
  if [ -z "$idle" ]; then
    "$bin/tandem" bench --router "$router" --rate "$BURST_RATE" --arrival gamma --burstiness 0.25 \
      --input-len "$BURST_PROMPT" --output-len 4 --num-requests "$BURSTS" --seed 2 --no-progress \
      --json "$OUT/$name-bursts.json" >"$OUT/$name-bursts.txt"
  fi
  wait $steady
  echo "== $name: steady decode stream"; cat "$OUT/$name-steady.txt"
  if [ -z "$idle" ]; then echo "== $name: prompt bursts"; cat "$OUT/$name-bursts.txt"; fi
}

start all 2
workload colocated-idle "$ADDR" idle
workload colocated "$ADDR"
cleanup
pids=()
start all 2 --colocated-prefill-share 0
workload colocated-unshared "$ADDR"
cleanup
pids=()

start router 1 --heartbeat-ms 200
router=$ADDR
registry=$INTERNAL
start prefill 1 --router "$registry"
start decode 1 --router "$registry"
workload disaggregated "$router"

"$bin/tandem" bench report "$OUT/colocated-steady.json" "$OUT/disaggregated-steady.json" \
  --label "colocated: steady decode" --label "disaggregated: steady decode" \
  --svg "$OUT/interference.svg" >/dev/null
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
s = {"shape": os.environ.get("SHAPE", "stories15M"),
     "burst_prompt_tokens": int(os.environ.get("BURST_PROMPT", "200"))}
for mode in ("colocated-idle", "colocated", "colocated-unshared", "disaggregated"):
    steady = json.load(open(f"{out}/{mode}-steady.json"))["summary"]
    s[mode] = {"steady_tpot_p99_ms": steady["tpot_s"]["p99"] * 1e3,
               "steady_tpot_p50_ms": steady["tpot_s"]["p50"] * 1e3,
               "steady_itl_p90_ms": steady["itl_s"]["p90"] * 1e3,
               "steady_itl_p99_ms": steady["itl_s"]["p99"] * 1e3}
    if mode != "colocated-idle":
        bursts = json.load(open(f"{out}/{mode}-bursts.json"))["summary"]
        s[mode].update({"bursts_ttft_p99_ms": bursts["ttft_s"]["p99"] * 1e3,
                        "bursts_ttft_p50_ms": bursts["ttft_s"]["p50"] * 1e3})
idle = s["colocated-idle"]["steady_itl_p90_ms"]
for mode in ("colocated", "colocated-unshared", "disaggregated"):
    s[mode]["steady_itl_p90_over_idle"] = s[mode]["steady_itl_p90_ms"] / idle
json.dump(s, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(s, indent=2))
PY
