#!/usr/bin/env bash
# The router under thousands of concurrent streams: a default `tandem up` (stories260K, one
# prefill and one decode worker), then for each row N clients from one address (as behind an
# ingress) open their connections at once, each sending a streaming /v1/completions of
# max_tokens 200 (greedy, ignore_eos) and reading it to the end (bench/serving/concurrency.py).
# Then, per GRPC_CLIENTS row, as many gRPC Generate streams on the router's public port
# (bench/serving/grpc_concurrency.cc, 64 connections). Per row: requests done / refused (a
# status with Retry-After, RESOURCE_EXHAUSTED or UNAVAILABLE) / failed (anything else, a closed
# connection included), streams in flight at once, TTFT p50/p99, inter-token p99, the router's
# CPU seconds, its RSS and threads at idle and at peak. Prints one line per row and writes
# bench/results/concurrency.json.
#   bench/serving/concurrency.sh                 HTTP and gRPC rows of 1000, 5000, 10000 clients
#   CLIENTS="1000 2000" GRPC_CLIENTS="" bench/serving/concurrency.sh
# The client needs a descriptor per connection: the shell's hard limit on open files must pass
# the largest row (the script raises the soft limit to it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
CLIENTS=${CLIENTS-"1000 5000 10000"}
GRPC_CLIENTS=${GRPC_CLIENTS-"1000 5000 10000"}
MAX_TOKENS=${MAX_TOKENS:-200}
bench_name=concurrency EXTRA_TARGETS=grpc_concurrency
source bench/serving/up_stories.sh

for n in $CLIENTS; do
  python3 bench/serving/concurrency.py --url "$url" --model stories260K --clients "$n" \
    --max-tokens "$MAX_TOKENS" --router-pid "$router_pid" --out "$out/row-$n.json"
done
for n in $GRPC_CLIENTS; do
  "$bin/grpc_concurrency" --target "$grpc_target" --clients "$n" --max-tokens "$MAX_TOKENS" \
    --router-pid "$router_pid" --out "$out/grpc-$n.json"
done

mkdir -p bench/results
python3 - "$out" "$(date -u +%F)" "$(git rev-parse --short HEAD)" \
  "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$CLIENTS" "$GRPC_CLIENTS" <<'PY'
import json, sys
out, date, commit, cpu, cores, http_rows, grpc_rows = sys.argv[1:]
doc = {"date": date, "commit": commit, "cpu": cpu, "cores": int(cores),
       "setup": "tandem up (stories260K, 1 prefill + 1 decode worker, default flags); every "
                "client from 127.0.0.1; streaming /v1/completions (HTTP rows) or gRPC Generate "
                "streams over 64 connections (gRPC rows), max_tokens 200, greedy",
       "rows": [json.load(open(f"{out}/row-{n}.json")) for n in http_rows.split()],
       "grpc_rows": [json.load(open(f"{out}/grpc-{n}.json")) for n in grpc_rows.split()]}
json.dump(doc, open("bench/results/concurrency.json", "w"), indent=1)
print("wrote bench/results/concurrency.json")
PY
