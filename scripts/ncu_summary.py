#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name.

Usage: ncu_summary.py NCU.csv [TOP]   Prints the TOP (default 25) kernels by total time: launches,
total and mean microseconds and the share of all profiled kernel time.
"""
import csv
import sys
from collections import defaultdict


def main() -> int:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own notes are not CSV
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        name = row["Kernel Name"][:90]
        total[name] += value * scale
        count[name] += 1
    grand = sum(total.values()) or 1.0
    print(f"{'total us':>12} {'share':>6} {'launches':>8} {'mean us':>10}  kernel")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{t:12.1f} {100 * t / grand:5.1f}% {count[name]:8d} {t / count[name]:10.2f}  {name}")
    print(f"{grand:12.1f} total over {sum(count.values())} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
