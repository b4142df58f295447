#!/usr/bin/env bash
# Speculative decoding (prompt lookup) in `tandem generate`, batch 1, on SmolLM2-135M-Instruct
# (Q4_1 GGUF): decode tokens/s with and without, best of RUNS passes each, for a copy-heavy
# prompt (copy a given text) and a free-form one (a story), greedy. Prints the figures and
# writes bench/results/speculative.json.
#   bench/speculative/run.sh [RUNS] [SPEC_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-3}
K=${2:-4}
BIN=${BIN:-build/bin/tandem}
MODEL=$(bash scripts/fetch_model.sh --smollm2)
mkdir -p bench/results
copy=$'<|im_start|>user\nCopy this text exactly: The quick brown fox jumps over the lazy dog near the river bank, while the old farmer watches from his porch and sips his morning coffee slowly. Birds sing in the tall oak trees, and the sun rises above the misty hills.<|im_end|>\n<|im_start|>assistant\n'
free=$'<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n'
out=$(mktemp)
for workload in copy free; do
  prompt=${!workload}
  for run in $(seq "$RUNS"); do
    # Alternate the two modes so that the machine's drift hits both alike.
    for mode in plain spec; do
      flags=()
      [ "$mode" = spec ] && flags=(--speculative ngram --spec-tokens "$K")
      line=$("$BIN" generate --model "$MODEL" --prompt "$prompt" --temperature 0 --max-tokens 128 \
        "${flags[@]}" 2>&1 >/dev/null | tr '\n' ' ')
      echo "$workload $mode $line" >>"$out"
    done
  done
done
python3 - "$out" "$RUNS" "$K" "$(date -u +%F)" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, re, sys
path, runs, k, date, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
best, acc = {}, {}
for line in open(path):
    workload, mode = line.split()[:2]
    tps = float(re.search(r"decode ([0-9.]+) tokens/s", line).group(1))
    best[(workload, mode)] = max(best.get((workload, mode), 0), tps)
    m = re.search(r"(\d+) tokens proposed, (\d+) accepted", line)
    if m:
        acc[workload] = int(m.group(2)) / max(1, int(m.group(1)))
rows = []
for w in ("copy", "free"):
    plain, spec = best[(w, "plain")], best[(w, "spec")]
    rows.append({"workload": w, "plain_tokens_per_s": plain, "spec_tokens_per_s": spec,
                 "speedup": spec / plain, "acceptance": acc.get(w, 0.0)})
    print(f"{w:5s} plain {plain:7.1f} tok/s  speculative {spec:7.1f} tok/s  "
          f"speed-up {spec / plain:.2f}x  acceptance {100 * acc.get(w, 0):.0f}%")
json.dump({"date": date, "cpu": cpu, "command": f"bench/speculative/run.sh {runs} {k}",
           "model": "SmolLM2-135M-Instruct Q4_1", "batch": 1, "spec_tokens": k, "runs": runs,
           "results": rows}, open("bench/results/speculative.json", "w"), indent=2)
print("wrote bench/results/speculative.json")
PY
rm -f "$out"
