#!/usr/bin/env bash
# Speculative decoding by prompt lookup on SmolLM2-135M-Instruct (Q4_1 GGUF), greedy, with and
# without, for a copy-heavy workload (copy a given text) and a free-form one (a story):
#   1. `tandem generate`, batch 1: decode tokens/s, best of RUNS passes each;
#   2. colocated `tandem-server --role=all` processes, plain and speculating, driven in turn by
#      `tandem bench` at 1 and 8 requests in flight (8 different prompts of each workload):
#      decode tokens/s per stream (1 / mean TPOT) and output tokens/s over all streams, best of
#      RUNS passes each;
# with the acceptance rate (proposals kept over proposals scored). Prints the figures and writes
# bench/results/speculative.json.
#   bench/speculative/run.sh [RUNS] [SPEC_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-3}
K=${2:-4}
BIN=${BIN:-build/bin}
MODEL=$(bash scripts/fetch_model.sh --smollm2)
mkdir -p bench/results
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill $server_pid 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

chat() { printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$1"; }
copy_texts=(
  "The quick brown fox jumps over the lazy dog near the river bank, while the old farmer watches from his porch and sips his morning coffee slowly. Birds sing in the tall oak trees, and the sun rises above the misty hills."
  "Every morning the baker opens her small shop at six, sets out fresh loaves of rye and wheat, and greets the first customers by name before the street fills with traffic."
  "The library on the corner keeps its doors open until nine, and students gather at the long wooden tables to study, whispering about exams and sharing notes under the green lamps."
  "A light rain fell over the harbor as the fishing boats returned, their decks full of nets and crates, while gulls circled overhead and the lighthouse blinked through the grey evening."
  "Our team meets every Tuesday to review the plan for the next release, check the open bugs, and decide which features are ready to ship and which need another week of work."
  "The mountain trail climbs through pine forest for three miles, crosses a wooden bridge over a cold stream, and ends at a quiet lake where hikers rest and eat their lunch."
  "In the old train station the clock still runs five minutes late, the benches are worn smooth, and a man plays the violin near the ticket office for the travelers who pass."
  "The garden behind the house has rows of tomatoes, beans and peppers, a bed of yellow flowers by the fence, and a small pond where frogs sing loudly on warm summer nights."
)
free_topics=("a robot who learns to paint" "a lost cat finding its way home" "a girl who builds a kite"
  "a dragon afraid of the dark" "two friends on a sailing trip" "a village that loses its bell"
  "a boy who talks to trees" "a baker who wins a contest")
: >"$work/copy.jsonl"
: >"$work/free.jsonl"
for t in "${copy_texts[@]}"; do
  python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "output_tokens": 48}))' \
    "$(chat "Copy this text exactly: $t")" >>"$work/copy.jsonl"
done
for t in "${free_topics[@]}"; do
  python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "output_tokens": 128}))' \
    "$(chat "Write a short story about $t.")" >>"$work/free.jsonl"
done

# 1. tandem generate, batch 1.
gen=$work/generate.txt
: >"$gen"
for workload in copy free; do
  prompt=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["prompt"], end="")' \
    "$work/$workload.jsonl")
  for run in $(seq "$RUNS"); do
    # Alternate the two modes so that the machine's drift hits both alike.
    for mode in plain spec; do
      flags=()
      [ "$mode" = spec ] && flags=(--speculative ngram --spec-tokens "$K")
      line=$("$BIN/tandem" generate --model "$MODEL" --prompt "$prompt" --temperature 0 \
        --max-tokens 128 "${flags[@]}" 2>&1 >/dev/null | tr '\n' ' ')
      echo "$workload $mode $line" >>"$gen"
    done
  done
done

# 2. Colocated servers, plain and speculating, both up at once (the idle one waits on a condition
# variable) and driven in turn, so that the machine's drift hits both alike.
declare -A router metrics pids
start_server() {  # MODE FLAGS...
  local mode=$1
  shift
  "$BIN/tandem-server" --role=all --model "$MODEL" --port 0 "$@" >"$work/$mode.out" \
    2>"$work/$mode.err" &
  pids[$mode]=$!
  for _ in $(seq 600); do
    grep -q '^metrics ' "$work/$mode.out" 2>/dev/null && break
    sleep 0.1
  done
  router[$mode]=$(sed -n 's/^listening //p' "$work/$mode.out")
  metrics[$mode]=$(sed -n 's/^metrics //p' "$work/$mode.out")
  [ -n "${router[$mode]}" ] || { cat "$work/$mode.err" >&2; exit 1; }
}
metric() {  # MODE NAME: the sum of a counter's series on that server
  curl -s "http://${metrics[$1]}/metrics" |
    awk -v m="$2" '$1 == m || index($1, m "{") == 1 {s += $2} END {printf "%d\n", s}'
}
start_server plain
start_server spec --speculative ngram --spec-tokens "$K"
server_pid="${pids[plain]} ${pids[spec]}"
served=$work/served.txt
: >"$served"
for workload in copy free; do
  for conc in 1 8; do
    for run in $(seq "$RUNS"); do
      for mode in plain spec; do
        p0=$(metric "$mode" tandem_spec_decode_num_draft_tokens_total)
        a0=$(metric "$mode" tandem_spec_decode_num_accepted_tokens_total)
        "$BIN/tandem" bench --router "${router[$mode]}" --trace "$work/$workload.jsonl" \
          --concurrency "$conc" --num-requests 8 --no-progress --json "$work/run.json" \
          >/dev/null 2>&1
        p1=$(metric "$mode" tandem_spec_decode_num_draft_tokens_total)
        a1=$(metric "$mode" tandem_spec_decode_num_accepted_tokens_total)
        python3 - "$work/run.json" "$workload" "$mode" "$conc" "$((p1 - p0))" "$((a1 - a0))" \
          >>"$served" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(sys.argv[2], sys.argv[3], sys.argv[4], 1 / s["tpot_s"]["mean"], s["output_token_throughput"],
      sys.argv[5], sys.argv[6], s["completed"])
PY
      done
    done
  done
done
kill ${pids[plain]} ${pids[spec]}
wait ${pids[plain]} ${pids[spec]} || true
server_pid=

python3 - "$gen" "$served" "$RUNS" "$K" "$(date -u +%F)" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, re, sys
gen, served, runs, k, date, cpu = sys.argv[1:3] + [int(sys.argv[3]), int(sys.argv[4])] + sys.argv[5:7]
best, acc = {}, {}
for line in open(gen):
    workload, mode = line.split()[:2]
    tps = float(re.search(r"decode ([0-9.]+) tokens/s", line).group(1))
    best[(workload, mode)] = max(best.get((workload, mode), 0), tps)
    m = re.search(r"(\d+) tokens proposed, (\d+) accepted", line)
    if m:
        acc[workload] = int(m.group(2)) / max(1, int(m.group(1)))
generate = []
print(f"tandem generate, batch 1, K={k}, best of {runs}:")
for w in ("copy", "free"):
    plain, spec = best[(w, "plain")], best[(w, "spec")]
    generate.append({"workload": w, "plain_tokens_per_s": plain, "spec_tokens_per_s": spec,
                     "speedup": spec / plain, "acceptance": acc.get(w, 0.0)})
    print(f"  {w:5s} plain {plain:7.1f} tok/s  speculative {spec:7.1f} tok/s  "
          f"speed-up {spec / plain:.2f}x  acceptance {100 * acc.get(w, 0):.0f}%")
stream, total, props, kept = {}, {}, {}, {}
for line in open(served):
    w, mode, conc, tps, out, p, a, done = line.split()
    key = (w, mode, int(conc))
    if int(done) != 8:
        sys.exit(f"a bench run completed {done} of 8 requests")
    stream[key] = max(stream.get(key, 0), float(tps))
    total[key] = max(total.get(key, 0), float(out))
    props[key] = props.get(key, 0) + int(p)
    kept[key] = kept.get(key, 0) + int(a)
server = []
print(f"tandem-server --role=all, K={k}, best of {runs} (per stream: 1 / mean TPOT):")
for w in ("copy", "free"):
    for conc in (1, 8):
        p, s = (w, "plain", conc), (w, "spec", conc)
        a = kept[s] / max(1, props[s])
        server.append({"workload": w, "concurrency": conc,
                       "plain_stream_tokens_per_s": stream[p], "spec_stream_tokens_per_s": stream[s],
                       "stream_speedup": stream[s] / stream[p],
                       "plain_output_tokens_per_s": total[p], "spec_output_tokens_per_s": total[s],
                       "output_speedup": total[s] / total[p], "acceptance": a})
        print(f"  {w:5s} x{conc}: per stream {stream[p]:6.1f} -> {stream[s]:6.1f} tok/s "
              f"({stream[s] / stream[p]:.2f}x), all streams {total[p]:6.1f} -> {total[s]:6.1f} "
              f"tok/s ({total[s] / total[p]:.2f}x), acceptance {100 * a:.0f}%")
json.dump({"date": date, "cpu": cpu, "command": f"bench/speculative/run.sh {runs} {k}",
           "model": "SmolLM2-135M-Instruct Q4_1", "spec_tokens": k, "runs": runs,
           "generate_batch1": generate, "server": server},
          open("bench/results/speculative.json", "w"), indent=2)
print("wrote bench/results/speculative.json")
PY
