#!/usr/bin/env bash
# Decode capacity at a fixed KV budget: how many sequences one decode worker runs at once, and
# what that buys in output tokens/s, with KV reserved for prompt + max_tokens at admission
# (--kv-admission=reserve, f32) against blocks on demand (f32, bf16, fp8).
#
#   bench/capacity/run.sh [NUM_REQUESTS] [RATE] [OUT_DIR]
#
# One router, one prefill worker and one decode worker (one thread each, on their own core
# where the machine has two) on random weights of the stories110M shape. The decode worker
# gets KV_BYTES (default 256 MiB). Workload: prompts of 256 tokens, outputs log-normal around
# 128 tokens, every request declaring max_tokens 1024 (capped by the 1024-token context) and
# ending at its output length, sent open loop at RATE req/s (default 1.0, about what the prefill
# worker sustains) so the decode worker is saturated. The router queues what does not fit.
# While each run lasts, the decode worker's running sequences are sampled from its /metrics.
# Writes OUT_DIR/<mode>.json (tandem bench) and OUT_DIR/summary.json, and prints the summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
bin="$BUILD/bin"
n=${1:-60}
rate=${2:-1.0}
OUT=${3:-bench/results/capacity}
KV_BYTES=${KV_BYTES:-268435456}
MODES=${MODES:-"reserve-f32 on-demand-f32 on-demand-bf16 on-demand-fp8"}
mkdir -p "$OUT"
shared="$(bash scripts/fetch_model.sh)"
tok="$shared/models/stories260K/tok512.bin"
model="$OUT/stories110M-random"
[ -f "$model/config.json" ] || "$bin/tandem" model random --shape stories110M --dtype f32 --out "$model"

cores=$(nproc)
pin() {  # pin CORE: a command prefix running on that core when there are two or more
  if [ "$cores" -ge 2 ] && command -v taskset >/dev/null; then echo "taskset -c $1"; fi
}
secret="$(mktemp)"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap 'cleanup; rm -f "$secret"' EXIT
start() {  # start CORE ROLE [flags...]: sets ADDR, INTERNAL and METRICS of the started process
  local core=$1 role=$2
  shift 2
  local log
  log="$(mktemp)"
  # shellcheck disable=SC2046
  TANDEM_NUM_THREADS=1 $(pin "$core") "$bin/tandem-server" --role="$role" --model "$model" \
    --tokenizer "$tok" --cluster-secret-file "$secret" "$@" >"$log" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 1 600); do
    ADDR="$(sed -n 's/^listening //p' "$log" | head -1)"
    INTERNAL="$(sed -n 's/^internal //p' "$log" | head -1)"
    METRICS="$(sed -n 's/^metrics //p' "$log" | head -1)"
    if [ -n "$METRICS" ]; then rm -f "$log"; return; fi
    sleep 0.05
  done
  echo "tandem-server --role=$role did not start" >&2
  exit 1
}

for mode in $MODES; do
  admission=${mode%-*}
  dtype=${mode##*-}
  start 0 router --heartbeat-ms 100 --queue-timeout-ms 3600000 --max-queued 4096
  router=$ADDR
  registry=$INTERNAL
  start 0 prefill --router "$registry" --kv-dtype "$dtype"
  start 1 decode --router "$registry" --kv-dtype "$dtype" --kv-admission "$admission" \
    --kv-bytes "$KV_BYTES"
  decode_metrics=$METRICS
  sleep 1
  # The running sequences, sampled every 100 ms while the run lasts.
  (while true; do
    curl -s "http://$decode_metrics/metrics" | sed -n 's/^tandem_num_requests_running{.*} //p'
    sleep 0.1
  done) >"$OUT/$mode-running.txt" &
  sampler=$!
  echo "[capacity] $mode: $n requests at $rate req/s" >&2
  "$bin/tandem" bench --router "$router" --rate "$rate" --arrival poisson --input-len 256 \
    --output-len lognormal:128:0.6:max=768 --max-tokens 1024 --num-requests "$n" --warmup 2 \
    --seed 11 --no-progress --json "$OUT/$mode.json" >/dev/null
  kill "$sampler"
  wait "$sampler" 2>/dev/null || true
  curl -s "http://$decode_metrics/metrics" >"$OUT/$mode-metrics.txt"
  cleanup
done

python3 - "$OUT" "$KV_BYTES" "$rate" $MODES <<'PY'
import json, re, sys
out, kv_bytes, rate, modes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]

def metric(text, name):
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else 0.0

summary = {"model": "stories110M (random weights)", "kv_bytes": kv_bytes, "rate_req_s": rate,
           "workload": "prompt 256, output lognormal:128:0.6, max_tokens 1024", "modes": {}}
for mode in modes:
    b = json.load(open(f"{out}/{mode}.json"))["summary"]
    text = open(f"{out}/{mode}-metrics.txt").read()
    running = [float(x) for x in open(f"{out}/{mode}-running.txt").read().split()]
    steps = metric(text, "tandem_decode_batch_size_count")
    info = re.search(r'^tandem_cache_config_info\{([^}]*)\}', text, re.M)
    blocks = re.search(r'num_blocks="(\d+)"', info.group(1)).group(1) if info else "?"
    summary["modes"][mode] = {
        "kv_blocks": int(blocks) if blocks != "?" else None,
        "peak_running": max(running, default=0),
        # Time-weighted, over the samples with a sequence running.
        "mean_running": round(sum(busy) / len(busy), 2) if (busy := [r for r in running if r > 0])
        else 0,
        "mean_running_per_step": round(metric(text, "tandem_decode_batch_size_sum") / steps, 2)
        if steps else 0,
        "output_tokens_per_s": round(b["output_token_throughput"], 1),
        "tpot_p50_ms": round(b["tpot_s"]["p50"] * 1e3, 1),
        "tpot_p99_ms": round(b["tpot_s"]["p99"] * 1e3, 1),
        "completed": b["completed"],
        "preemptions": metric(text, "tandem_num_preemptions_total"),
    }
base = summary["modes"].get("reserve-f32")
if base:
    for mode, m in summary["modes"].items():
        m["peak_running_vs_reserve"] = round(m["peak_running"] / max(base["peak_running"], 1), 2)
        m["mean_running_vs_reserve"] = round(m["mean_running"] / max(base["mean_running"], 1e-9),
                                             2)
        m["tokens_per_s_vs_reserve"] = round(m["output_tokens_per_s"] /
                                             max(base["output_tokens_per_s"], 1e-9), 2)
        m["tpot_p99_vs_reserve"] = round(m["tpot_p99_ms"] / max(base["tpot_p99_ms"], 1e-9), 2)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
