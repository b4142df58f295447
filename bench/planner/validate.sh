#!/usr/bin/env bash
# Validation of the capacity planner: for several configurations of the local CPU cluster,
# `tandem bench` against `tandem up` (measured) and `tandem plan simulate` (predicted) with the
# same workload flags, then a table of TTFT and TPOT p50/p90, predicted vs measured, with the
# relative error (target: within 15%). Every configuration is measured twice: the difference
# between the two runs is the machine's own noise.
#
#   bench/planner/validate.sh [OUT_DIR]        (default bench/results/planner)
#
# Steps: writes a random-weight stories15M (bf16) once; calibrates the `local` profile per
# model in rounds around the measured runs (`tandem plan calibrate --in-situ`: before the
# first runs, between the two passes, after the second; the host's speed drifts 10-20% within
# minutes, so the profile is one fit to the rounds' mean, `--refit A --refit B --refit C`, into
# OUT_DIR/local-MODEL.json, each round's report kept as calibration-MODEL-rN.json); measures
# every configuration below twice, one pass of all of them after another; predicts; and last
# calibrates the default local profile. Knobs (environment):
#   BUILD_DIR (build), CONFIGS (all: a space-separated subset of the names below),
#   REQUESTS (multiplier for the request counts, default 1), CALIBRATIONS (rounds: 3, as above;
#   2: before and after; 1: before only), SKIP_CALIBRATE=1 (reuse the profiles in OUT_DIR),
#   SKIP_MEASURE=1 (reuse the measured runs in OUT_DIR: predictions only, seconds),
#   ALSO_MEASURED="DIR..." (earlier validation folders whose measured runs of the same
#   configurations join the mean the predictions are held against: less of one run's noise; the
#   table's "runs" column counts them).
# Writes OUT_DIR/measured-NAME-{a,b}.json, predicted-NAME.json, validation.json and validation.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build}
OUT=${1:-bench/results/planner}
mkdir -p "$OUT"
bin="$BUILD/bin"
shared="$(bash scripts/fetch_model.sh)"
tok="$shared/models/stories260K/tok512.bin"  # prompts are token ids; the router needs one
s260k="$shared/models/stories260K/stories260K.bin"
s15m="$OUT/stories15M-random"
[ -f "$s15m/config.json" ] || "$bin/tandem" model random --shape stories15M --dtype bf16 --out "$s15m"
MULT=${REQUESTS:-1}

# name model dtype prefill decode bench-workload-flags...
CONFIG_LINES=(
  "s260k-1p1d-r4      $s260k f32  1 1 --rate 4  --num-requests 60  --input-len 64 --output-len 64"
  "s260k-1p1d-r12-mix $s260k f32  1 1 --rate 12 --num-requests 120 --input-len uniform:32:384 --output-len uniform:16:96"
  "s260k-1p2d-r12-mix $s260k f32  1 2 --rate 12 --num-requests 120 --input-len uniform:32:384 --output-len uniform:16:96"
  "s15m-1p1d-r2       $s15m  bf16 1 1 --rate 2  --num-requests 40  --input-len 64 --output-len 48"
  "s15m-1p2d-r3-logn  $s15m  bf16 1 2 --rate 3  --num-requests 60  --input-len lognormal:64:0.6:max=180 --output-len uniform:16:64"
  "s15m-1p1d-c4       $s15m  bf16 1 1 --concurrency 4 --num-requests 160 --input-len 96 --output-len 32"
)

cluster_pid=""
cleanup() { if [ -n "$cluster_pid" ]; then kill "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
# start_cluster MODEL PREFILL DECODE: `tandem up` in the background; sets router.
start_cluster() {
  local log
  log="$(mktemp)"
  "$bin/tandem" up --model "$1" --tokenizer "$tok" --prefill "$2" --decode "$3" >"$log" 2>/dev/null &
  cluster_pid=$!
  router=""
  for _ in $(seq 1 600); do
    router="$(sed -n 's/^ready router=//p' "$log" | head -1)"
    [ -n "$router" ] && break
    sleep 0.1
  done
  rm -f "$log"
  [ -n "$router" ] || { echo "tandem up did not start" >&2; exit 1; }
}
stop_cluster() {
  kill "$cluster_pid"
  wait "$cluster_pid" 2>/dev/null || true
  cluster_pid=""
}

ROUNDS=${CALIBRATIONS:-3}
case "$ROUNDS" in 1 | 2 | 3) ;; *) echo "CALIBRATIONS must be 1, 2 or 3" >&2; exit 2 ;; esac
calibrate=1
[ "${SKIP_CALIBRATE:-0}" = 1 ] && calibrate=0
rounds_done=0
# calibration_round: one in-situ calibration of each model (step times from the forward pass,
# then a 1P1D cluster of the model for the decode and prefill steps and the request path's
# overheads), its report kept as OUT_DIR/calibration-MODEL-rN.json.
calibration_round() {
  [ "$calibrate" = 1 ] || return 0
  rounds_done=$((rounds_done + 1))
  echo "== calibration round $rounds_done of $ROUNDS" >&2
  for m in stories260K stories15M; do
    local model="$s260k"
    [ "$m" = stories15M ] && model="$s15m"
    "$bin/tandem" plan calibrate --model "$model" --tokenizer "$tok" --in-situ \
      --out "$OUT/local-$m-r$rounds_done.json" --report "$OUT/calibration-$m-r$rounds_done.json" \
      2> >(grep -v '^\[tandem-server\]' >&2)
  done
}
# fit_rounds: each model's profile, one fit to the mean of its rounds' measured workloads (one
# round: that round's profile as it is).
fit_rounds() {
  [ "$calibrate" = 1 ] || return 0
  for m in stories260K stories15M; do
    if [ "$rounds_done" = 1 ]; then
      cp "$OUT/local-$m-r1.json" "$OUT/local-$m.json"
      cp "$OUT/calibration-$m-r1.json" "$OUT/calibration-$m.json"
      continue
    fi
    local model="$s260k" refits=()
    [ "$m" = stories15M ] && model="$s15m"
    for r in $(seq 1 "$rounds_done"); do refits+=(--refit "$OUT/calibration-$m-r$r.json"); done
    "$bin/tandem" plan calibrate "${refits[@]}" --model "$model" --out "$OUT/local-$m.json" \
      --report "$OUT/calibration-$m.json" >/dev/null
  done
}

# The configurations: name model dtype prefill decode, and the workload flags (--num-requests
# scaled by REQUESTS).
names=()
declare -A cfg_model cfg_dtype cfg_prefill cfg_decode cfg_flags
for line in "${CONFIG_LINES[@]}"; do
  read -r name model dtype prefill decode rest <<<"$line"
  if [ -n "${CONFIGS:-}" ] && [[ " $CONFIGS " != *" $name "* ]]; then continue; fi
  # shellcheck disable=SC2206
  flags=($rest)
  for i in "${!flags[@]}"; do
    if [ "${flags[$i]}" = --num-requests ]; then
      flags[$((i + 1))]=$(python3 -c "print(max(1, round(${flags[$((i + 1))]} * $MULT)))")
    fi
  done
  names+=("$name")
  cfg_model[$name]=$model cfg_dtype[$name]=$dtype cfg_prefill[$name]=$prefill
  cfg_decode[$name]=$decode cfg_flags[$name]="${flags[*]}"
done

# measure_pass RUN: every configuration once, each on a fresh cluster with the same requests
# (how far pass a and pass b differ is the machine's own noise, the floor for the prediction's
# error).
measure_pass() {
  for name in "${names[@]}"; do
    [ "${SKIP_MEASURE:-0}" = 1 ] && [ -f "$OUT/measured-$name-$1.json" ] && continue
    # shellcheck disable=SC2206
    local flags=(${cfg_flags[$name]})
    echo "== $name run $1: ${cfg_prefill[$name]}P${cfg_decode[$name]}D ${flags[*]}" >&2
    start_cluster "${cfg_model[$name]}" "${cfg_prefill[$name]}" "${cfg_decode[$name]}"
    "$bin/tandem" bench --router "$router" "${flags[@]}" --warmup 4 --seed 1 --no-progress \
      --json "$OUT/measured-$name-$1.json" >"$OUT/measured-$name-$1.txt"
    stop_cluster
  done
}

calibration_round
measure_pass a
[ "$ROUNDS" = 3 ] && calibration_round
measure_pass b
[ "$ROUNDS" -ge 2 ] && calibration_round
fit_rounds

# Predicted: the same workload flags, on the model's profile.
for name in "${names[@]}"; do
  # shellcheck disable=SC2206
  flags=(${cfg_flags[$name]})
  profile="$OUT/local-stories260K.json"
  [ "${cfg_model[$name]}" = "$s15m" ] && profile="$OUT/local-stories15M.json"
  "$bin/tandem" plan simulate --model "${cfg_model[$name]}" --hardware "$profile" \
    --dtype "${cfg_dtype[$name]}" --prefill "${cfg_prefill[$name]}" \
    --decode "${cfg_decode[$name]}" "${flags[@]}" --warmup 4 --seed 1 \
    --json "$OUT/predicted-$name.json" >"$OUT/predicted-$name.txt"
done

if [ "$calibrate" = 1 ]; then
  # The default `local` profile (`--hardware local`): the forward pass of both models, in situ
  # on the first.
  "$bin/tandem" plan calibrate --model "$s260k" --model "$s15m" --tokenizer "$tok" --in-situ \
    2> >(grep -v '^\[tandem-server\]' >&2)
fi

python3 - "$OUT" "${ALSO_MEASURED:-}" "${names[@]}" <<'PY'
import json, os, sys
out, also, names = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
rows, table = [], []
table.append(f"{'configuration':<22}{'metric':<10}{'run a ms':>10}{'run b ms':>10}{'b vs a':>8}"
             f"{'runs':>5}{'predicted':>11}{'error':>8}")
within = repeat_within = total = 0


def workload(run):  # the flags a run was made with (the router's address aside)
    return {k: v for k, v in run["config"].items() if k != "router"}


for n in names:
    runs = {r: json.load(open(f"{out}/measured-{n}-{r}.json")) for r in "ab"}
    predicted = json.load(open(f"{out}/predicted-{n}.json"))
    pw = workload(predicted)
    for r, run in runs.items():
        mw = workload(run)
        if mw != pw:
            diff = ", ".join(f"{k} {mw.get(k)} against {pw.get(k)}" for k in sorted(set(mw) | set(pw))
                             if mw.get(k) != pw.get(k))
            sys.exit(f"{out}/measured-{n}-{r}.json was measured with other flags than the "
                     f"prediction's ({diff}): measure again, or leave {n} out of CONFIGS")
    a, b, p = runs["a"]["summary"], runs["b"]["summary"], predicted["summary"]
    others = []
    for d in also:
        for r in "ab":
            path = f"{d}/measured-{n}-{r}.json"
            if not os.path.exists(path):
                continue
            run = json.load(open(path))
            if workload(run) == pw:
                others.append(run["summary"])
            else:
                print(f"left out {path}: measured with other flags", file=sys.stderr)
    for metric in ("ttft_s", "tpot_s"):
        for q in ("p50", "p90"):
            av, bv, pv = a[metric][q] * 1e3, b[metric][q] * 1e3, p[metric][q] * 1e3
            runs = [av, bv] + [o[metric][q] * 1e3 for o in others]
            mv = sum(runs) / len(runs)  # the prediction is held against the runs' mean
            err = (pv - mv) / mv if mv > 0 else float("nan")
            rep = (bv - av) / av if av > 0 else float("nan")
            total += 1
            within += abs(err) <= 0.15
            repeat_within += abs(rep) <= 0.15
            label = metric[:4].upper() + " " + q
            table.append(f"{n:<22}{label:<10}{av:>10.2f}{bv:>10.2f}{100 * rep:>7.1f}%"
                         f"{len(runs):>5}{pv:>11.2f}{100 * err:>7.1f}%")
            rows.append({"config": n, "metric": label, "run_a_ms": av, "run_b_ms": bv,
                         "runs": len(runs), "measured_ms": mv, "predicted_ms": pv,
                         "error": err, "repeat_error": rep})
table.append(f"predicted within 15% of the measured mean: {within} of {total}; "
             f"run b within 15% of run a: {repeat_within} of {total}")
text = "\n".join(table)
print(text)
open(f"{out}/validation.txt", "w").write(text + "\n")
json.dump({"rows": rows, "within_15pct": within, "repeat_within_15pct": repeat_within,
           "total": total}, open(f"{out}/validation.json", "w"), indent=1)
PY
