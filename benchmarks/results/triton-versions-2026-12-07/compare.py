"""Compare kernel_resources.py tables of several Triton versions (the files triton-3.X.md beside this
script): per kernel and Triton version, the longest loop's instructions relative to Triton 3.6 (the same
tile), and the spills. Usage: python compare.py"""

import statistics
import sys
from pathlib import Path

here = Path(__file__).parent
tables = {}
for f in sorted(here.glob("triton-3.*.md")):
    rows = {}
    for line in f.read_text().splitlines():
        c = [x.strip() for x in line.split("|")[1:-1]]
        if len(c) >= 13 and c[0] in ("fwd", "infer", "dq", "dkdv", "fused"):
            rows[tuple(c[:5])] = dict(regs=c[5], spill=c[6], loop=int(c[8]), loops=c[12])
    tables[f.stem.split("-")[1]] = rows
base = tables.pop("3.6")
print("| kernel | Triton | rows | longest loop / 3.6's: median (min-max) | rows with spills (3.6: n) |")
print("|---|---|---|---|---|")
for kernel in ("fwd", "dq", "dkdv", "fused"):
    keys = [k for k in base if k[0] == kernel]
    for version, rows in tables.items():
        ratios = [rows[k]["loop"] / base[k]["loop"] for k in keys if k in rows]
        if len(ratios) < len(keys):
            sys.exit(f"{version}: {len(keys) - len(ratios)} {kernel} rows missing")
        spills = sum(rows[k]["spill"] not in ("0/0",) for k in keys)
        spills0 = sum(base[k]["spill"] not in ("0/0",) for k in keys)
        print(
            f"| {kernel} | {version} | {len(keys)} | {statistics.median(ratios):.3f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {spills} ({spills0}) |"
        )
