"""Modified backward against its same-seed full-gradient twin (tab:detach, tab:detachrep, tab:e1): modified −
full per checkpoint, the gap recovery, and each single-channel run − its same-seed detach run."""

from __future__ import annotations

import numpy as np

from kinterval.ops import OperatorSpec
from kinterval.report.analysis.core import (
    Pairing,
    Row,
    _endpoint_groups,
    _row_from_pairs,
    _sort_key,
    _spec,
    full_twin,
    pair_controls,
    trajectories,
)
from kinterval.report.results import Point


def detach_pairs(points: list[Point]) -> tuple[list[Row], Pairing]:
    """Each modified-backward run (``range_grad`` detach, max_only, min_only, p1) against its same-seed
    full-gradient twin, per checkpoint, with a per-block CI of modified − full; at the final checkpoint the
    gap recovery ``(NLL_detach - NLL_x) / (NLL_detach - NLL_full)`` where a same-seed detach run exists (mean
    over the row's seeds). A supplementary run is one row per seed (tab:detach, tab:detachrep, tab:e1: each
    seed its block-bootstrap CI and its own gap recovery); a designed seed set (``mini`` with ``mini-seeds``)
    pools its seeds."""
    pairing = pair_controls(points, full_twin)
    mean_of = {(*p.identity, p.tag, p.tokens): p.mean for p in points}
    rows = []
    for k, traj in trajectories(pairing).items():
        for r in traj:
            r.contrast = f"{k.operator} − {full_twin(k.operator)}"
        last = traj[-1]
        spec = _spec(k.operator)
        detach = OperatorSpec.parse(spec, range_grad="detach").full_name
        rec, data = [], next(p.data for p in points if p.key == k)
        for s in last.seeds:
            det, full, own = (
                mean_of.get((k.model, op, s, k.budget, data, k.tag, last.tokens))
                for op in (detach, full_twin(k.operator), k.operator)
            )
            if None not in (det, full, own) and det != full:
                rec.append((det - own) / (det - full))
        if len(rec) == len(last.seeds):
            last.recovery = float(np.mean(rec))
        rows.extend(traj)
    # tab:e1 "− detach": each single-channel / projected run against its same-seed detach run
    vs_detach = pair_controls(
        points,
        lambda op: (
            None
            if _spec(op).range_grad in ("full", "detach")
            else OperatorSpec.parse(_spec(op), range_grad="detach").full_name
        ),
    )
    # runs without a pair at the endpoint are listed with the pairing's other unpaired runs
    at_end = _endpoint_groups(
        Pairing(vs_detach.pairs, pairing.unpaired), "the comparison with its detach run"
    )
    for k, ps in at_end.items():
        rows.append(_row_from_pairs(f"{k.operator} − {ps[0].control.operator}", ps))
    rows.sort(key=_sort_key)
    return rows, pairing
