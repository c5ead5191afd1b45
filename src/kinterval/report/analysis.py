"""Contrasts from loaded results (paper §4 "Statistics", App. C.3): every number the tables and figures show.

Each condition is paired with the softmax run of the same seed, data and checkpoint (same training tokens);
single-seed contrasts get circular block-bootstrap CIs over validation blocks, multi-seed ones the seed
summary (mean, seed SD, t interval), exact sign-permutation p and BH q.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from kinterval.report.results import Point
from kinterval.stats import (
    bh_q,
    block_bootstrap_ci,
    factorial_2x2,
    k_trend_slopes,
    label_single_seed,
    permutation_p_exact,
    seed_summary,
)

N_RESAMPLES = 4000
FACTORIAL = {"mm_w": "minmax-weight", "mm_p": "minmax-prob", "fwm_w": "fwm-weight", "fwm_p": "fwm-prob"}


def _ci(x: np.ndarray) -> tuple[float, float]:
    if x.size < 2:
        return float("nan"), float("nan")
    r = block_bootstrap_ci(x, block=min(16, x.size), n_resamples=N_RESAMPLES)
    return r.lo, r.hi


def softmax_index(points: list[Point]) -> dict:
    """(seed, data key, tokens) -> softmax point."""
    return {(p.seed, p.data_key, p.tokens): p for p in points if p.operator in ("softmax", "sdpa")}


def paired_deltas(points: list[Point], reference: list[Point] | None = None) -> list[dict]:
    """ΔNLL (condition - same-seed softmax) per block for every non-softmax point that has a reference."""
    ref = softmax_index(reference if reference is not None else points)
    rows = []
    for p in points:
        if p.operator in ("softmax", "sdpa"):
            continue
        s = ref.get((p.seed, p.data_key, p.tokens))
        if s is None:
            continue
        rows.append({"point": p, "softmax": s, "d": p.nll - s.nll})
    return rows


def final_only(deltas: list[dict]) -> list[dict]:
    last: dict[str, dict] = {}
    for r in deltas:
        rid = r["point"].run_id
        if rid not in last or r["point"].step > last[rid]["point"].step:
            last[rid] = r
    return list(last.values())


def delta_table(deltas: list[dict]) -> list[dict]:
    """One row per condition at its final checkpoint: per-seed block-bootstrap CIs, or the seed summary."""
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in final_only(deltas):
        by_op[r["point"].operator].append(r)
    rows = []
    for op, rs in by_op.items():
        rs.sort(key=lambda r: r["point"].seed)
        p0 = rs[0]["point"]
        row = {
            "operator": op,
            "group": p0.group,
            "family": p0.family,
            "K": p0.K,
            "tokens": p0.tokens,
            "seeds": [r["point"].seed for r in rs],
            "nll": float(np.mean([r["point"].mean for r in rs])),
            "softmax_nll": float(np.mean([r["softmax"].mean for r in rs])),
        }
        if len(rs) == 1:
            d = rs[0]["d"]
            lo, hi = _ci(d)
            lab = label_single_seed(lo, hi) if np.isfinite(lo) else None
            row.update(
                delta=float(d.mean()),
                lo=lo,
                hi=hi,
                interval="block bootstrap",
                separated=bool(lab.separated) if lab else False,
            )
        else:
            ss = seed_summary([float(r["d"].mean()) for r in rs])
            row.update(
                delta=ss.mean,
                lo=ss.lo,
                hi=ss.hi,
                sd=ss.sd,
                interval=f"t ({ss.df} df)",
                p=permutation_p_exact([float(r["d"].mean()) for r in rs]),
            )
        rows.append(row)
    rows.sort(key=lambda r: (r["family"], r["K"] or 0, r["operator"]))
    ps = [r.get("p") for r in rows]
    if any(p is not None for p in ps):
        idx = [i for i, p in enumerate(ps) if p is not None]
        for i, q in zip(idx, bh_q([ps[i] for i in idx])):
            rows[i]["q"] = float(q)
    return rows


def trajectories(deltas: list[dict]) -> dict[str, list[tuple[int, float, float, float]]]:
    """operator -> [(tokens, mean ΔNLL over seeds, lo, hi)] (block bootstrap CI for one seed, t for more)."""
    acc: dict[str, dict[int, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for r in deltas:
        acc[r["point"].operator][r["point"].tokens].append(r["d"])
    out = {}
    for op, by_t in acc.items():
        pts = []
        for t in sorted(by_t):
            ds = by_t[t]
            if len(ds) == 1:
                lo, hi = _ci(ds[0])
                pts.append((t, float(ds[0].mean()), lo, hi))
            else:
                ss = seed_summary([float(d.mean()) for d in ds])
                pts.append((t, ss.mean, ss.lo, ss.hi))
        out[op] = pts
    return out


def factorial_effects(points: list[Point]) -> list[dict]:
    """2x2 calibration x surrogate effects (FWM - MinMax, Prob - Weight, interaction) per K at the final
    checkpoint; per seed per block, then a block bootstrap (one seed) or the seed summary (several)."""
    finals: dict[tuple, Point] = {}
    for p in points:
        a = p.axes
        if a.get("reconstruction") != "nearest" or a.get("range_grad") != "full" or a.get("tau") != 6.0:
            continue
        key = (f"{a['calibration']}-{a['surrogate']}", p.K, p.seed, a.get("arithmetic"))
        if key not in finals or p.step > finals[key].step:
            finals[key] = p
    rows = []
    for arith, K in sorted({(k[3], k[1]) for k in finals}, key=lambda x: (str(x[0]), x[1])):
        per_seed = []
        for seed in sorted({k[2] for k in finals}):
            cells = {c: finals.get((fam, K, seed, arith)) for c, fam in FACTORIAL.items()}
            if all(v is not None for v in cells.values()) and len({v.nll.size for v in cells.values()}) == 1:
                per_seed.append(factorial_2x2(**{c: v.nll for c, v in cells.items()}))
        if not per_seed:
            continue
        for effect in ("calibration", "surrogate", "interaction"):
            series = [getattr(f, effect) for f in per_seed]
            if len(series) == 1:
                lo, hi = _ci(series[0])
                rows.append(
                    {
                        "K": K,
                        "effect": effect,
                        "estimate": float(series[0].mean()),
                        "lo": lo,
                        "hi": hi,
                        "n_seeds": 1,
                    }
                )
            else:
                ss = seed_summary([float(x.mean()) for x in series])
                rows.append(
                    {
                        "K": K,
                        "effect": effect,
                        "estimate": ss.mean,
                        "lo": ss.lo,
                        "hi": ss.hi,
                        "sd": ss.sd,
                        "n_seeds": ss.n,
                    }
                )
    return rows


def k_trends(deltas: list[dict]) -> list[dict]:
    """Slope of ΔNLL against log2 K per family at the final checkpoint (nats per doubling of K)."""
    fam: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in final_only(deltas):
        p = r["point"]
        if p.K is not None:
            fam[p.family][p.seed][p.K] = float(r["d"].mean())
    rows = []
    for f, by_seed in sorted(fam.items()):
        Ks = sorted(set.intersection(*[set(v) for v in by_seed.values()]))
        if len(Ks) < 2:
            continue
        d = np.array([[by_seed[s][k] for k in Ks] for s in sorted(by_seed)])
        if d.shape[0] >= 2:
            kt = k_trend_slopes(Ks, d)
            rows.append(
                {
                    "family": f,
                    "K": Ks,
                    "n_seeds": d.shape[0],
                    "slope": kt.summary.mean,
                    "lo": kt.summary.lo,
                    "hi": kt.summary.hi,
                    "sd": kt.summary.sd,
                }
            )
        else:
            x = np.log2(Ks)
            xc = x - x.mean()
            rows.append(
                {
                    "family": f,
                    "K": Ks,
                    "n_seeds": 1,
                    "slope": float(d[0] @ xc / (xc @ xc)),
                    "lo": float("nan"),
                    "hi": float("nan"),
                }
            )
    return rows


def cross_suite(tables: dict[str, list[dict]]) -> list[dict]:
    """operator -> {suite: (delta, lo, hi)} for operators present in at least one suite."""
    ops: dict[str, dict] = defaultdict(dict)
    for suite, rows in tables.items():
        for r in rows:
            ops[r["operator"]][suite] = (r["delta"], r["lo"], r["hi"])
    return [{"operator": op, "by_suite": v} for op, v in sorted(ops.items())]


def detach_pairs(deltas: list[dict]) -> dict[str, dict[str, list]]:
    """For each modified-gradient operator (range_grad != full) with a full-gradient twin in the results:
    {"<op>": {"modified": trajectory, "full": trajectory}}."""
    traj = trajectories(deltas)
    out = {}
    for op in traj:
        if "range_grad=" not in op:
            continue
        base, _, extra = op.partition("[")
        rest = [x for x in extra.rstrip("]").split(",") if x and not x.startswith("range_grad=")]
        full = base + (f"[{','.join(rest)}]" if rest else "")
        if full in traj:
            out[op] = {"modified": traj[op], "full": traj[full], "full_operator": full}
    return out
