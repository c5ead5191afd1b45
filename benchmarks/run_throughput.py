"""Training throughput of finished runs over time, from their own logs (no GPU needed).

Each run's ``metrics.jsonl`` logs tokens/s per optimizer step. This script adds up the step times into a
training clock and prints the median tokens/s in each WINDOW seconds of it, one row per run. Runs trained
side by side on one GPU (``suite run --per-gpu M``) show the level of M at once in their bulk and higher
levels at their ends, when the others had finished or were still starting.

Usage:  python benchmarks/run_throughput.py RESULTS_DIR [--window 30] [--only PATTERN ...]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
from pathlib import Path


def windows(metrics: Path, window: float) -> tuple[list[float | None], float]:
    """Median tokens/s per window of the training clock (None for a window in which no step ended: a step
    longer than the window spans it), and the clock's total (s)."""
    clock, last, bins = 0.0, 0, {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "tokens_per_s" not in row:
            continue
        clock += (row["tokens"] - last) / row["tokens_per_s"]  # this step's seconds
        last = row["tokens"]
        bins.setdefault(int(clock // window), []).append(row["tokens_per_s"])
    return [
        statistics.median(bins[k]) if k in bins else None for k in range(max(bins, default=-1) + 1)
    ], clock


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a suite folder (runs/<run_id>/metrics.jsonl)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of training per column")
    ap.add_argument("--only", nargs="*", default=["*"], help="run ids (shell patterns)")
    args = ap.parse_args(argv)
    files = sorted((args.results / "runs").glob("*/metrics.jsonl"))
    files = [f for f in files if any(fnmatch.fnmatch(f.parent.name, p) for p in args.only)]
    if not files:
        ap.error(f"no runs/*/metrics.jsonl under {args.results}")
    rows = [(f.parent.name, *windows(f, args.window)) for f in files]
    n = max(len(w) for _, w, _ in rows)
    print(f"median tokens/s (thousands) per {args.window:g} s of training")
    print("| " + " | ".join(["run", "train s", *(f"{i * args.window:g}-" for i in range(n))]) + " |")
    print("|---|---|" + "---|" * n)
    for name, w, clock in rows:
        cells = ["" if v is None else f"{v / 1000:.0f}" for v in w] + [""] * (n - len(w))
        print("| " + " | ".join([name, f"{clock:.0f}", *cells]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
