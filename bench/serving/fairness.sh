#!/usr/bin/env bash
# A victim's latency beside hostile clients of another tenant: a default `tandem up`
# (stories260K, one prefill and one decode worker), the victim connecting from 127.0.0.2 and
# the hostile clients from 127.0.0.1, so the router sees two tenants. The hostile clients run in
# a process of their own (bench/serving/fairness.py, asyncio). Two rows:
#   flooding tenant: the victim sends VICTIM streaming /v1/completions (max_tokens 8, greedy) one
#     after another, 50 ms apart, and times connect to the first token, alone and then beside
#     FLOOD clients that keep non-streaming requests of 200 tokens (ignore_eos) open at all
#     times (the victim starts 3 s into the flood); ROUNDS rounds, alternating. Per round TTFT
#     p50/p90/p99/max alone and beside, and pooled p50/p99 with the ratio beside/alone.
#   slow readers: 100 streaming requests (n 8, max_tokens 400, ignore_eos) whose client never
#     reads and 70 that read 64 bytes every 5 s (small receive buffers, so the router's writes
#     stall soon); 2 s later the victim sends 20 non-streaming requests one by one: their
#     statuses and min/p50/max seconds.
# The flood's clients wait 100 ms after a refusal or a failure before sending again. Before each
# alone run and each row the script waits until the router's /metrics (the listener of the
# `metrics router=` line) shows no request waiting or running. Prints one line per row and
# writes bench/results/fairness.json.
#   bench/serving/fairness.sh                    1000 flood clients, 100 victim requests, 3 rounds
#   FLOOD=5000 VICTIM=50 ROUNDS=1 bench/serving/fairness.sh
# The flood needs a descriptor per connection: the shell's hard limit on open files must pass
# FLOOD (the script raises the soft limit to it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
FLOOD=${FLOOD:-1000}
VICTIM=${VICTIM:-100}
ROUNDS=${ROUNDS:-3}
bench_name=fairness
source bench/serving/up_stories.sh

python3 bench/serving/fairness.py flooding --url "$url" --flood "$FLOOD" --victim "$VICTIM" \
  --rounds "$ROUNDS" --metrics "$metrics" --out "$out/flooding.json"
python3 bench/serving/fairness.py slow-readers --url "$url" --metrics "$metrics" \
  --out "$out/slow-readers.json"

mkdir -p bench/results
python3 - "$out" "$(date -u +%F)" "$(git rev-parse --short HEAD)" \
  "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" <<'PY'
import json, sys
out, date, commit, cpu, cores = sys.argv[1:]
doc = {"date": date, "commit": commit, "cpu": cpu, "cores": int(cores),
       "setup": "tandem up (stories260K, 1 prefill + 1 decode worker, default flags); the "
                "victim connects from 127.0.0.2, the hostile clients (a separate process) from "
                "127.0.0.1: two tenants. Flooding tenant: victim streaming /v1/completions "
                "(max_tokens 8, greedy) one by one 50 ms apart, TTFT from connect, alone and "
                "beside a flood of non-streaming max_tokens 200 ignore_eos requests kept open. "
                "Slow readers: 100 streaming n 8 max_tokens 400 ignore_eos requests never read "
                "and 70 read 64 bytes every 5 s; victim non-streaming max_tokens 8, one by one",
       "rows": [json.load(open(f"{out}/{name}.json")) for name in ("flooding", "slow-readers")]}
json.dump(doc, open("bench/results/fairness.json", "w"), indent=1)
print("wrote bench/results/fairness.json")
PY
