#!/usr/bin/env python3
"""Tandem against the PyTorch peer of the same run, row by row: reads cuda_model_bench.json and
torch_peer.json (bench/gpu/torch_peer.py), prints a table of Tandem / PyTorch speed (above 1:
Tandem is faster) with the goals of the GPU work, and writes the rows to --out.

Goals checked: prefill at 2048 and 8192 tokens at least 1.2x PyTorch; prefill at 512 tokens no
slower than --baseline-512-ms (the figure before the change); decode at batch 256 at least 60%
of the HBM bound.
"""
import argparse
import json
import sys


def by(rows, key):
    return {r[key]: r for r in rows or [] if r.get(key) is not None}


def rows_of(tandem, torch, baseline_512_ms):
    out = []
    tp, pp = by(tandem.get("prefill"), "tokens"), by(torch.get("prefill"), "tokens")
    for n in sorted(set(tp) | set(pp)):
        t, p = tp.get(n, {}).get("ms"), pp.get(n, {}).get("ms")
        ratio = p / t if t and p else None
        goal, met = None, None
        if n in (2048, 8192):
            goal, met = ">= 1.2x PyTorch", ratio is not None and ratio >= 1.2
        elif n == 512 and baseline_512_ms:
            goal, met = f"<= {baseline_512_ms} ms", t is not None and t <= baseline_512_ms
        out.append({"row": f"prefill {n}", "tandem_ms": t, "torch_ms": p, "speed_ratio": ratio,
                    "goal": goal, "met": met})
    td, pd = by(tandem.get("decode"), "batch"), by(torch.get("decode"), "batch")
    for b in sorted(set(td) | set(pd)):
        t, p = td.get(b, {}).get("step_ms"), pd.get(b, {}).get("step_ms")
        frac = td.get(b, {}).get("fraction_of_bound")
        goal, met = None, None
        if b == 256:
            goal, met = ">= 60% of HBM bound", frac is not None and frac >= 0.6
        out.append({"row": f"decode b{b}", "tandem_ms": t, "torch_ms": p,
                    "speed_ratio": p / t if t and p else None, "fraction_of_bound": frac,
                    "goal": goal, "met": met})
    return out


def fmt(x, spec, width):
    return ("-" if x is None else format(x, spec)).rjust(width)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tandem")
    ap.add_argument("torch")
    ap.add_argument("--out", default="bench/results/gpu_vs_torch.json")
    ap.add_argument("--baseline-512-ms", type=float, default=19.8)
    args = ap.parse_args()
    tandem = json.load(open(args.tandem))
    try:
        torch = json.load(open(args.torch))
    except (OSError, ValueError) as e:
        print(f"compare: no PyTorch figures ({e}); Tandem's alone")
        torch = {}
    rows = rows_of(tandem, torch, args.baseline_512_ms)
    print(f"{'row':14s} {'Tandem ms':>10s} {'PyTorch ms':>11s} {'Tandem/PyTorch':>15s}  goal")
    for r in rows:
        goal = "" if r["goal"] is None else f"{r['goal']}: {'met' if r['met'] else 'NOT met'}"
        ratio = None if r["speed_ratio"] is None else f"{r['speed_ratio']:.2f}x"
        print(f"{r['row']:14s} {fmt(r['tandem_ms'], '.2f', 10)} {fmt(r['torch_ms'], '.2f', 11)} "
              f"{fmt(ratio, 's', 15)}  {goal}")
    with open(args.out, "w") as f:
        json.dump({"tandem": tandem, "torch": torch, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
