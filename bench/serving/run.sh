#!/usr/bin/env bash
# The whole serving stack under load, beside llama.cpp's llama-server on the same machine, the
# same GGUF (SmolLM2-135M-Instruct Q4_1) and the same client (bench/serving/client.py: streaming
# /v1/completions, greedy, ignore_eos, max_tokens 128, distinct prompts):
#   llama-server   -np 16 -c 16384, every core
#   --role=all     tandem-server, one process
#   tandem up      a router, 1 prefill and 1 decode worker (tcp KV transfer), default flags
# Rows: prompts of about 200 and 1000 tokens at 1, 4 and 16 requests in flight (32 requests a
# row; 8 at concurrency 1). Each system runs every row in turn, systems one after the other,
# RUNS passes (default 2; the best pass per cell is kept, every pass is in the JSON). Prints a
# table of tokens/s, failures, TTFT and inter-token latency percentiles per system and writes
# bench/results/serving_compare.json.
#
# llama.cpp is built from source in a scratch folder by bench/llamacpp/build.sh ($SCRATCH,
# default /tmp/tandem-llamacpp), never inside the repository.
#   RUNS=N bench/serving/run.sh
#   SYSTEMS="role-all tandem-up" bench/serving/run.sh   reruns those systems only, keeping the
#                                                       others' results of the last run
set -euo pipefail
cd "$(dirname "$0")/../.."
SCRATCH=${SCRATCH:-/tmp/tandem-llamacpp}
RUNS=${RUNS:-2}
BUILD_DIR=${BUILD_DIR:-build}
THREADS=$(nproc)
gguf="$(bash scripts/fetch_model.sh --smollm2)"
bin="$BUILD_DIR/bin"
mkdir -p "$SCRATCH" bench/results
out="$SCRATCH/serving"
ALL_SYSTEMS="llama-server role-all tandem-up"
SYSTEMS=${SYSTEMS:-$ALL_SYSTEMS}
[ "$SYSTEMS" = "$ALL_SYSTEMS" ] && rm -rf "$out"
mkdir -p "$out"
SCRATCH="$SCRATCH" bash bench/llamacpp/build.sh llama-server
cmake --build "$BUILD_DIR" --target tandem tandem-server >/dev/null

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # URL PATH: until it answers 200 (120 s)
  for _ in $(seq 1 1200); do
    if curl -fs "$1$2" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "serving: $1 did not come up" >&2
  return 1
}

served_model() {  # URL: the id /v1/models lists first
  curl -fs "$1/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])'
}

# start SYSTEM: starts it and sets URL and MODEL.
start() {
  case "$1" in
    llama-server)
      local port
      port=$(free_port)
      "$SCRATCH/build/bin/llama-server" -m "$gguf" -np 16 -c 16384 -t "$THREADS" \
        --host 127.0.0.1 --port "$port" >"$out/llama-server.log" 2>&1 &
      pids+=($!)
      URL="http://127.0.0.1:$port"
      MODEL=smollm2
      wait_http "$URL" /health
      ;;
    role-all)
      "$bin/tandem-server" --role=all --model "$gguf" --host 127.0.0.1 --port 0 --http-port 0 \
        >"$out/role-all.out" 2>"$out/role-all.log" &
      pids+=($!)
      for _ in $(seq 1 1200); do
        URL="$(sed -n 's/^http \(.*\)$/http:\/\/\1/p' "$out/role-all.out" | head -1)"
        [ -n "$URL" ] && break
        sleep 0.1
      done
      wait_http "$URL" /health
      MODEL=$(served_model "$URL")
      ;;
    tandem-up)
      "$bin/tandem" up --model "$gguf" --prefill 1 --decode 1 >"$out/up.out" 2>"$out/up.log" &
      pids+=($!)
      for _ in $(seq 1 1200); do
        URL="$(sed -n 's/^http router=\(.*\)$/http:\/\/\1/p' "$out/up.out" | head -1)"
        [ -n "$URL" ] && break
        sleep 0.1
      done
      wait_http "$URL" /health
      MODEL=$(served_model "$URL")
      ;;
  esac
}

for run in $(seq "$RUNS"); do
  for system in $SYSTEMS; do
    start "$system"
    first=0  # each row its own prompts: none was seen by the server before
    for words in 160 800; do
      for conc in 1 4 16; do
        n=32
        [ "$conc" = 1 ] && n=8
        printf '%-12s pass %d, ~%d-word prompts, %2d in flight: ' "$system" "$run" "$words" "$conc"
        python3 bench/serving/client.py --url "$URL" --model "$MODEL" --requests "$n" \
          --concurrency "$conc" --prompt-words "$words" --max-tokens 128 --first "$first" \
          --out "$out/$system-$words-$conc-$run.json"
        first=$((first + n))
      done
    done
    stop_all
  done
done

python3 - "$out" "$RUNS" "$(date -u +%F)" "$(lscpu | sed -n 's/^Model name: *//p')" "$THREADS" <<'PY'
import json, sys
out, runs, date, cpu, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
systems = ["llama-server", "role-all", "tandem-up"]
rows = []
for words in (160, 800):
    for conc in (1, 4, 16):
        row = {"prompt_words": words, "concurrency": conc, "systems": {}}
        for s in systems:
            passes = [json.load(open(f"{out}/{s}-{words}-{conc}-{r}.json"))["summary"]
                      for r in range(1, runs + 1)]
            best = max(passes, key=lambda p: (-p["failed"], p["tokens_per_s"]))
            row["systems"][s] = {"best": best, "passes": passes}
        rows.append(row)
f = lambda x, spec=".2f": "-" if x is None else format(x, spec)  # noqa: E731
print(f"{'prompt':>7} {'conc':>4} | " + " | ".join(f"{s:>36}" for s in systems))
print(f"{'':>7} {'':>4} | " + " | ".join(f"{'tok/s fail ttft50 itl50 itl90':>36}" for _ in systems))
for row in rows:
    cells = []
    for s in systems:
        b = row["systems"][s]["best"]
        cells.append(f"{b['tokens_per_s']:7.1f} {b['failed']:4d} {f(b['ttft_p50']):>6} "
                     f"{f(b['itl_p50'], '.3f'):>6} {f(b['itl_p90'], '.3f'):>6}".rjust(36))
    print(f"{row['prompt_words']:>7} {row['concurrency']:>4} | " + " | ".join(cells))
    base = row["systems"]["llama-server"]["best"]["tokens_per_s"]
    row["ratio_to_llama_server"] = {
        s: (row["systems"][s]["best"]["tokens_per_s"] / base if base else None) for s in systems[1:]}
json.dump({"benchmark": "serving_compare", "date": date, "cpu": cpu, "threads": int(threads),
           "command": f"RUNS={runs} bench/serving/run.sh", "model": "SmolLM2-135M-Instruct Q4_1",
           "client": "bench/serving/client.py (streaming /v1/completions, max_tokens 128)",
           "rows": rows}, open("bench/results/serving_compare.json", "w"), indent=1)
print("wrote bench/results/serving_compare.json")
PY
