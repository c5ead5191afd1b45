"""Seed robustness of the condition ordering (§5, App. D): Kendall's W and pairwise Spearman of the ΔNLL rows
over seeds, and Spearman of the condition-mean ΔNLL against final geometry (fig:widthgap)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kinterval.report.analysis.core import Row, designed_full
from kinterval.report.results import Key


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
