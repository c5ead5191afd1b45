"""Seed robustness of the condition ordering (§5, App. D): Kendall's W and pairwise Spearman of the ΔNLL rows
over seeds, Spearman of the condition-mean ΔNLL against final geometry (fig:widthgap), and the within-run
Spearman of row span against ΔNLL along training (App. D, score geometry along training)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kinterval.report.analysis.core import Row, designed_full, key_order
from kinterval.report.results import Key, Point


@dataclass
class RankStats:
    """Reproducibility of the condition ordering over seeds (§5, App. D) and cross-condition associations of
    the condition-mean ΔNLL with geometry (Figure widthgap): descriptive, not causal."""

    setting: tuple
    seeds: tuple[int, ...]
    conditions: tuple[str, ...]
    kendall_w: float | None  # over seeds (raters) and conditions
    pairwise_spearman: tuple[float, ...]  # every seed pair
    spearman_h: tuple[float, float] | None  # (rho, p) of mean ΔNLL against native width h
    spearman_span: tuple[float, float] | None  # (rho, p) against row span


def ranked_rows(delta: list[Row], unpaired: dict[str, str] | None = None) -> dict[tuple, list[Row]]:
    """Setting -> the ΔNLL rows its rank statistics (and fig:widthgap) use: the designed full-gradient
    conditions with a K (the paper's "25 approximate conditions of a designed grid"; a modified backward such
    as ``range_grad=detach`` is a different experiment, not a grid point) run on the setting's most common
    seed set of several seeds (suite D's five seeds, not a supplementary single-seed run evaluated on the
    same data), or every such row of a setting with no row of several seeds. A condition left out for its
    other seed set (e.g. a seed that stopped early) is listed in ``unpaired``, where one is given."""
    by_setting: dict[tuple, list[Row]] = defaultdict(list)
    for r in delta:
        if r.key is not None and designed_full(r.key):
            by_setting[r.key.setting()].append(r)
    out = {}
    for setting, rows in sorted(by_setting.items(), key=str):
        sets = [r.seeds for r in rows if len(r.seeds) >= 2]
        if sets:
            seeds = max(sorted(set(sets)), key=sets.count)
            for r in rows:
                if r.seeds != seeds and unpaired is not None:
                    ids, used = ",".join(map(str, r.seeds)), ",".join(map(str, seeds))
                    where = (
                        f"{setting[0]} tokens, {setting[1].split(' ')[0]}, {setting[2]}"  # budget, data, tag
                    )
                    unpaired[f"{r.key.operator} ({ids}; {where}) in the rank statistics and widthgap"] = (
                        f"its ΔNLL row has seeds {ids}; the setting's ranks use seeds {used}"
                    )
            rows = [r for r in rows if r.seeds == seeds]
        out[setting] = rows
    return out


def rank_statistics(
    delta: list[Row], geometry: dict[Key, dict[str, float]], unpaired: dict[str, str] | None = None
) -> list[RankStats]:
    """Per setting: Kendall's W and pairwise Spearman over the seeds every condition has, and Spearman of the
    condition-mean ΔNLL against final h and span (conditions with geometry). What is undefined is left out,
    not an error: W when every seed ties all conditions, a seed pair's rho when one of the two ties them all,
    a Spearman against geometry when the ΔNLL or the metric is the same for every condition."""
    from kinterval.stats import kendall_w, pairwise_spearman, spearman

    out = []
    for setting, rows in ranked_rows(delta, unpaired).items():
        seeds = list(rows[0].seeds) if len(rows[0].seeds) >= 2 else []
        w, pw = None, ()
        if len(seeds) >= 2 and len(rows) >= 3:
            scores = np.array([[r.est.per_seed[r.seeds.index(s)] for r in rows] for s in seeds])
            varied = scores[np.ptp(scores, axis=1) > 0]  # a seed that ties every condition ranks nothing
            w = kendall_w(scores) if len(varied) else None
            pw = tuple(float(x) for x in pairwise_spearman(varied)) if len(varied) >= 2 else ()

        def assoc(metric, rows=rows):
            pts = [(geometry[r.key][metric], r.est.mean) for r in rows if metric in geometry.get(r.key, {})]
            if len(pts) < 3 or len({x for x, _ in pts}) < 2 or len({y for _, y in pts}) < 2:
                return None
            res = spearman([x for x, _ in pts], [y for _, y in pts])
            return (res.rho, res.p)

        out.append(
            RankStats(
                setting, tuple(seeds), tuple(r.key.operator for r in rows), w, pw, assoc("h"), assoc("span")
            )
        )
    return out


@dataclass
class WithinRun:
    """Within-run association of row span with the NLL gap along training (App. D: "Within-run Spearman
    between span and the NLL gap over the 10 checkpoints of the 250M MinMax-Weight run is about 0.9"):
    per seed of the condition, Spearman (rho, p) over that run's checkpoints of its layer-mean span against
    its ΔNLL vs the same-seed softmax at the same checkpoint. Descriptive, as the paper's."""

    key: Key
    seeds: tuple[int, ...]
    checkpoints: tuple[int, ...]  # per seed: how many checkpoints have both a ΔNLL and a finite span
    rho: tuple[float | None, ...]  # per seed; None below 3 checkpoints or where span or ΔNLL is constant
    p: tuple[float | None, ...]  # per seed: the permutation p of :func:`kinterval.stats.spearman`


def within_run_spearman(trajectories: dict[Key, list[Row]], points: list[Point]) -> list[WithinRun]:
    """One :class:`WithinRun` per condition line of ``trajectories`` (:func:`trajectories`: its ΔNLL rows by
    checkpoint, the per-seed values in ``est.per_seed``) with at least one seed whose run has a geometry
    probe at 3 or more of those checkpoints; the spans are the primary evaluations' (``points``)."""
    from kinterval.stats import spearman

    span = {
        (p.key, p.seed, p.tokens): p.geometry["span"]
        for p in points
        if p.primary and p.geometry.get("span") is not None and np.isfinite(p.geometry["span"])
    }
    out = []
    for key, rows in sorted(trajectories.items(), key=lambda kv: key_order(kv[0])):
        seeds = sorted({s for r in rows for s in r.seeds})
        n, rho, pv = [], [], []
        for s in seeds:
            pts = [(span[(key, s, r.tokens)], r.est.per_seed[r.seeds.index(s)])
                   for r in rows if s in r.seeds and (key, s, r.tokens) in span]  # fmt: skip
            n.append(len(pts))
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            if len(pts) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
                rho.append(None), pv.append(None)
                continue
            res = spearman(xs, ys)
            rho.append(float(res.rho)), pv.append(float(res.p))
        if any(c >= 3 for c in n):
            out.append(WithinRun(key, tuple(seeds), tuple(n), tuple(rho), tuple(pv)))
    return out
