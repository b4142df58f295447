#!/usr/bin/env bash
# Tandem's CPU engine against llama.cpp on the same GGUF weights, same machine, same run.
#
# llama.cpp is built from source in a scratch folder by bench/llamacpp/build.sh ($SCRATCH,
# default /tmp/tandem-llamacpp; the llama-cpp-python source package vendors it), never inside
# the repository. The default chat
# model (SmolLM2-135M-Instruct Q4_1) is re-typed with llama-quantize into F32, F16, BF16, Q8_0,
# Q4_0 and Q4_K files, and both engines run each file as stored:
#   decode_b1    llama-bench tg64               engine_bench decode_b1
#   decode_b32   llama-batched-bench, 32 x 16   engine_bench decode_b32
#   prefill_512  llama-bench pp512              engine_bench prefill_512
# Prints a table of tokens/s and the ratio Tandem / llama.cpp per cell, and writes
# bench/results/llamacpp_compare.json. Each engine's figure is its best of its repetitions and
# of RUNS whole passes over the types (default 2: shared machines drift by 10-50% within
# minutes, so a pass alone can favour either engine); the JSON also keeps each pass's ratio.
#   RUNS=N bench/llamacpp/run.sh [THREADS] [TYPES]   (TYPES default "F32 F16 BF16 Q8_0 Q4_0 Q4_K")
# MODEL picks the GGUF (the type "stored" is the file itself, run as it is):
#   MODEL=gemma3    Gemma 3 270M Q4_K_M (scripts/fetch_model.sh --gemma3: Q5_0/Q8_0/Q4_K/Q6_K
#                   tensors), TYPES default "stored", bench/results/llamacpp_compare_gemma3.json;
#   MODEL=qwen1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M (scripts/fetch_model.sh --qwen1.5b, 1.1 GB:
#                   Q4_K and Q6_K tensors), TYPES default "stored",
#                   bench/results/llamacpp_compare_qwen1.5b.json;
#   MODEL=PATH      any GGUF file, TYPES default "stored", llamacpp_compare_<file name>.json.
# Cases beside decode_b1 and prefill_512: decode of 8 and 32 sequences (llama-batched-bench
# -npl 8,32, 64-token prompts, 16 tokens each). TANDEM_CPU_ISA=avx2 runs Tandem's AVX2 kernels
# (kernels/cpu/cpu_ops.h); llama.cpp keeps its native build. The fraction of the bandwidth (or
# FLOP) roofline measured in the same run is printed beside each Tandem figure.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${1:-$(nproc)}
MODEL=${MODEL:-smollm2}
gguf=""
case "$MODEL" in
  smollm2) TYPES=${2:-F32 F16 BF16 Q8_0 Q4_0 Q4_K}; model_name="SmolLM2-135M-Instruct"
    result=bench/results/llamacpp_compare.json ;;
  gemma3) TYPES=${2:-stored}; model_name="Gemma 3 270M (Q4_K_M as stored)"
    result=bench/results/llamacpp_compare_gemma3.json ;;
  qwen1.5b) TYPES=${2:-stored}; model_name="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M as stored)"
    result=bench/results/llamacpp_compare_qwen1.5b.json ;;
  *.gguf)
    [ -f "$MODEL" ] || { echo "MODEL: no file $MODEL" >&2; exit 2; }
    gguf="$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")"
    TYPES=${2:-stored}; model_name="$(basename "$MODEL")"
    MODEL="$(basename "$MODEL" .gguf)"
    result="bench/results/llamacpp_compare_$MODEL.json" ;;
  *) echo "MODEL must be smollm2, gemma3, qwen1.5b or a path to a .gguf file" >&2; exit 2 ;;
esac
SCRATCH=${SCRATCH:-/tmp/tandem-llamacpp}
RUNS=${RUNS:-2}
BUILD_DIR=${BUILD_DIR:-build}
[ -n "$gguf" ] || gguf="$(bash scripts/fetch_model.sh "--$MODEL")"
mkdir -p "$SCRATCH" bench/results
bin="$SCRATCH/build/bin"
SCRATCH="$SCRATCH" bash bench/llamacpp/build.sh llama-bench llama-batched-bench llama-quantize
cmake --build "$BUILD_DIR" --target engine_bench >/dev/null

for run in $(seq "$RUNS"); do
  for t in $TYPES; do
    file="$SCRATCH/$MODEL-$t.gguf"
    if [ "$t" = stored ]; then
      file="$gguf"
    elif [ ! -f "$file" ]; then
      "$bin/llama-quantize" --allow-requantize "$gguf" "$file" "$t" >/dev/null 2>&1
    fi
    # llama.cpp repacks weights for its CPU kernels by default; where that path crashes (its
    # batched Q4_K kernels do on some AVX-512/AMX hosts), that measurement is repeated without
    # repacking and the JSON says so (llamacpp_repack false). Decode and prefill run apart, so
    # that each keeps repacking where it works.
    rm -f "$SCRATCH/norepack-$MODEL-$t-$run"
    llama_run() {  # OUT NOREPACK_FLAG COMMAND...
      local out=$1 flag=$2
      shift 2
      if ! "$@" >"$out" 2>/dev/null; then
        echo "llama.cpp failed on $t with repacked weights ($(basename "$1")); rerun with $flag" >&2
        touch "$SCRATCH/norepack-$MODEL-$t-$run"
        "$@" $flag >"$out" 2>/dev/null
      fi
    }
    llama_run "$SCRATCH/llama-tg-$MODEL-$t-$run.json" "--repack 0" \
      "$bin/llama-bench" -m "$file" -t "$THREADS" -p 0 -n 64 -r 3 -o json
    llama_run "$SCRATCH/llama-pp-$MODEL-$t-$run.json" "--repack 0" \
      "$bin/llama-bench" -m "$file" -t "$THREADS" -p 512 -n 0 -r 3 -o json
    llama_run "$SCRATCH/batched-$MODEL-$t-$run.jsonl" "--no-repack" \
      "$bin/llama-batched-bench" -m "$file" -t "$THREADS" -c 4096 -b 2048 -ub 512 -npp 64 \
      -ntg 16 -npl 8,32 --output-format jsonl
    "$BUILD_DIR/bin/engine_bench" --models "$file" --dtypes native --threads "$THREADS" \
      --cases decode_b1,decode_b8,decode_b32,prefill_512 \
      --out "$SCRATCH/tandem-$MODEL-$t-$run.json" >/dev/null
  done
done

python3 - "$SCRATCH" "$THREADS" "$RUNS" "$(date -u +%F)" "$(lscpu | sed -n 's/^Model name: *//p')" \
  "$MODEL" "$model_name" "$result" $TYPES <<'PY'
import json, os, sys
scratch, threads, runs, date, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
model, model_name, result = sys.argv[6:9]
types = sys.argv[9:]


def llama_of(t, run):
    llama = {}
    rows = (json.load(open(f"{scratch}/llama-tg-{model}-{t}-{run}.json")) +
            json.load(open(f"{scratch}/llama-pp-{model}-{t}-{run}.json")))
    for r in rows:
        if r.get("n_prompt") == 512 and r.get("n_gen") == 0:
            llama["prefill_512"] = r["avg_ts"]
        if r.get("n_gen") == 64 and r.get("n_prompt") == 0:
            llama["decode_b1"] = r["avg_ts"]
    for line in open(f"{scratch}/batched-{model}-{t}-{run}.jsonl"):
        if line.strip() and json.loads(line).get("pl") in (8, 32):
            llama[f"decode_b{json.loads(line)['pl']}"] = json.loads(line)["speed_tg"]
    return llama


cells = []
print(f"{'type':6} {'case':12} {'tandem tok/s':>13} {'llama.cpp':>10} {'ratio':>6}  roofline  (ratio of each pass)")
for t in types:
    passes = [(llama_of(t, run), json.load(open(f"{scratch}/tandem-{model}-{t}-{run}.json")))
              for run in range(1, runs + 1)]
    ours = passes[-1][1]
    for i, r in enumerate(ours["results"]):
        case = r["case"]
        mine = [p[1]["results"][i] for p in passes]
        best = max(mine, key=lambda m: m["tokens_per_s"])
        theirs = max((p[0].get(case) or 0 for p in passes), default=0) or None
        ratio = best["tokens_per_s"] / theirs if theirs else None
        per_pass = [m["tokens_per_s"] / p[0][case] for m, p in zip(mine, passes) if p[0].get(case)]
        repack = not any(os.path.exists(f"{scratch}/norepack-{model}-{t}-{run}")
                         for run in range(1, runs + 1))
        cells.append({"type": t, "case": case, "tandem_tokens_per_s": best["tokens_per_s"],
                      "llamacpp_repack": repack,
                      "llamacpp_tokens_per_s": theirs, "ratio": ratio, "ratio_per_pass": per_pass,
                      "fraction_of_roofline": best["fraction_of_roofline"],
                      "bound": best["bound"], "tandem_isa": ours["isa"]})
        print(f"{t:6} {case:12} {best['tokens_per_s']:13.1f} {theirs or 0:10.1f} "
              f"{ratio or 0:6.2f}  {100 * best['fraction_of_roofline']:.0f}% ({best['bound']})"
              f"  passes {' '.join(f'{x:.2f}' for x in per_pass)}")
out = {"benchmark": "llamacpp_compare", "date": date, "cpu": cpu,
       "command": f"MODEL={model} RUNS={runs} bench/llamacpp/run.sh {threads}", "model": model_name,
       "threads": threads, "runs": runs, "tandem_isa": ours["isa"],
       "llamacpp": "llama-cpp-python 0.3.36 vendored llama.cpp, GGML_NATIVE", "cells": cells}
json.dump(out, open(result, "w"), indent=1)
print(f"wrote {result}")
PY
