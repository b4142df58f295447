#!/usr/bin/env bash
# The planner's validation over many calibrations at once, without measuring anything: every
# folder `validate.sh` filled (its calibration reports and measured runs) is calibrated again
# with the current code (`tandem plan calibrate --refit`, from the workloads that calibration
# measured), its configurations predicted, and the predictions held against the mean of the
# measured runs of every folder. One validation run is one calibration, itself a sample of a
# noisy machine; this shows how a change to the fit or the simulator does across all of them.
#
#   bench/planner/revalidate.sh OUT_DIR DIR...
#
# Writes OUT_DIR/<DIR's name>/ (the refitted profiles, predictions, validation.{txt,json}) and
# OUT_DIR/summary.txt: per calibration the figures within 15% of 24 and the mean |error|; per
# figure the mean and spread of the error over the calibrations; and how often a single measured
# run is within 15% of the mean of all of them (the machine's own reproducibility).
# About 2.5 minutes per folder on 2 cores (its two refits, 50-100 s each, two at a time).
# KEEP_SHARING=1 refits each report on the sharing of the host its profile holds
# (`--keep-sharing`, about an eighth of the time): to screen a change to the request path's fit
# before the full search. CONFIGS (validate.sh's) limits the configurations: validate.sh refuses
# to hold a prediction against runs of other flags (folders whose c4 loop ran another number of
# requests).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR DIR..." >&2; exit 2; }
BUILD=${BUILD_DIR:-build}
OUT=$1
shift
dirs=()
for d in "$@"; do dirs+=("$(cd "$d" && pwd)"); done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
shared="$(bash scripts/fetch_model.sh)"
s260k="$shared/models/stories260K/stories260K.bin"

keep=""
[ "${KEEP_SHARING:-0}" = 1 ] && keep=--keep-sharing
# The refits, two at a time (each is one thread).
for d in "${dirs[@]}"; do
  o="$OUT/$(basename "$d")"
  mkdir -p "$o"
  ln -sfn "$d/stories15M-random" "$o/stories15M-random"
  for f in "$d"/measured-*.json; do ln -sf "$f" "$o/"; done
  for m in stories260K stories15M; do
    model="$s260k"
    [ "$m" = stories15M ] && model="$d/stories15M-random"
    printf '%s\0' "$BUILD/bin/tandem plan calibrate --refit $d/calibration-$m.json --model $model --out $o/local-$m.json --report $o/calibration-$m.json $keep >$o/refit-$m.log 2>&1"
  done
done | xargs -0 -P2 -I{} bash -c '{} || { echo "failed: {}" >&2; exit 255; }'

for d in "${dirs[@]}"; do
  o="$OUT/$(basename "$d")"
  others=()
  for e in "${dirs[@]}"; do [ "$e" = "$d" ] || others+=("$e"); done
  SKIP_CALIBRATE=1 SKIP_MEASURE=1 ALSO_MEASURED="${others[*]}" BUILD_DIR="$BUILD" \
    bash bench/planner/validate.sh "$o" >/dev/null 2>"$o/validate.log" ||
    { cat "$o/validate.log" >&2; exit 1; }
done

python3 - "$OUT" "${dirs[@]}" <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics as st, sys
out, dirs = sys.argv[1], sys.argv[2:]
cells, within, errs = {}, [], []
for d in dirs:
    v = json.load(open(os.path.join(out, os.path.basename(d), "validation.json")))
    e = [abs(r["error"]) for r in v["rows"]]
    within.append(v["within_15pct"])
    errs.append(100 * st.mean(e))
    print(f"{os.path.basename(d):<12}{v['within_15pct']:>3} of {v['total']} within 15%, "
          f"mean |error| {errs[-1]:.1f}%, largest {100 * max(e):.0f}%")
    for r in v["rows"]:
        cells.setdefault((r["config"], r["metric"]), []).append(r)
print(f"over {len(dirs)} calibrations: {st.mean(within):.1f} of {v['total']} within 15% on average "
      f"(from {min(within)} to {max(within)}), mean |error| {st.mean(errs):.1f}%")
print(f"{'configuration':<22}{'metric':<10}{'measured ms':>12}{'error mean':>11}{'sd':>6}"
      f"{'calibrations within':>21}{'one run within':>16}")
runs_within = runs_total = 0
for (config, metric), rows in cells.items():
    e = [100 * r["error"] for r in rows]
    mean_ms = rows[0]["measured_ms"]  # every folder's runs: the same mean
    # One measured run against the mean of all: how reproducible the figure is.
    key = ("ttft_s" if metric.startswith("TTFT") else "tpot_s", metric[-3:].lower())
    one = [json.load(open(f"{d}/measured-{config}-{r}.json"))["summary"][key[0]][key[1]] * 1e3
           for d in dirs for r in "ab" if os.path.exists(f"{d}/measured-{config}-{r}.json")]
    near = sum(abs(x - mean_ms) <= 0.15 * mean_ms for x in one)
    runs_within += near
    runs_total += len(one)
    print(f"{config:<22}{metric:<10}{mean_ms:>12.2f}{st.mean(e):>+10.1f}%{st.pstdev(e):>5.0f}%"
          f"{sum(abs(x) <= 15 for x in e):>14} of {len(e):<4}{near:>9} of {len(one)}")
print(f"a single measured run within 15% of the mean of all: {runs_within} of {runs_total} "
      f"({100 * runs_within / max(1, runs_total):.0f}%)")
PY
