"""Held-out and operator-substitution evaluations (App. C.3 layer 1; tab:nearci, tab:subst, tab:strictaudit):
ΔNLL vs the same-seed softmax evaluated the same way, the substituted forward against the native one,
split-half fluctuation and the held-out ordering against the in-domain one."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kinterval.ops.spec import OperatorSpec
from kinterval.report.analysis.core import (
    N_RESAMPLES,
    Estimate,
    Pair,
    Row,
    _control_tags,
    _index,
    _left_out,
    _row_from_pairs,
    _sort_key,
    apply_bh,
    at_endpoint,
    estimate,
    key_order,
    softmax_pairs,
)
from kinterval.report.results import Key, Point


def _heldout_groups(points: list[Point], unpaired: dict[str, str] | None) -> dict[Key, list[Pair]]:
    """Held-out key -> its pairs with the same-seed softmax evaluated the same way, at the key's endpoint."""
    others = [p for p in points if not p.primary]
    if not others:
        return {}
    refs = [p for p in points if p.is_reference]
    pairing = softmax_pairs(others + [p for p in refs if p.primary] + [p for p in refs if not p.primary])
    for run, why in pairing.unpaired.items():  # evaluations with no control at all (only held-out ones here)
        _left_out(unpaired, run, why)
    by_key: dict[Key, list[Pair]] = defaultdict(list)
    for x in pairing.pairs:
        if not x.point.primary:
            by_key[x.point.key].append(x)
    groups = {
        k: at_endpoint(ps, "held-out ΔNLL vs softmax", unpaired, lambda x: x.point)
        for k, ps in by_key.items()
    }
    return {k: ps for k, ps in groups.items() if ps}


def heldout_table(points: list[Point], unpaired: dict[str, str] | None = None) -> list[Row]:
    """Held-out and operator-substitution evaluations (``eval/<tag>/``, not the suite's own split): ΔNLL vs
    the same-seed softmax evaluated the same way, at each key's endpoint (a run without a pair there goes to
    ``unpaired``; ``ValueError`` when it is None). With document clusters (C4) the per-document differences
    get a document-cluster bootstrap (token-weighted); BH q within each corpus and forward mode (tag), the
    paper's family of conditions per corpus and mode (App. C.3)."""

    groups = _heldout_groups(points, unpaired)
    rows = []
    for k, ps in groups.items():
        r = _row_from_pairs(f"{k.operator} − softmax", ps)
        for (
            x
        ) in ps:  # the same data and blocks give the same documents: different ids are a broken evaluation
            if (
                x.point.docs
                and x.control.docs
                and not np.array_equal(x.point.docs["doc_ids"], x.control.docs["doc_ids"])
            ):
                raise ValueError(
                    f"{x.point.run_id} [{x.point.tag}] and its control {x.control.run_id} [{x.control.tag}]: "
                    "different document ids on the same data; re-evaluate both with --doc-clusters"
                )
        a, b = ps[0].point.docs, ps[0].control.docs
        if len(ps) == 1 and a and b:
            r.est = _documents(a, b, f"{r.contrast} [{ps[0].point.tag}], {ps[0].point.run_id}")
        rows.append(r)
    rows.sort(key=_sort_key)
    apply_bh(rows)
    return rows + _substitution_rows(points, unpaired)


def _documents(a: dict, b: dict, what: str) -> Estimate:
    """One seed's a − b per document (token-weighted NLL of each document, C4's unit: App. C.3) with its
    document-cluster bootstrap; the two evaluations hold the same documents."""
    from kinterval.stats import cluster_bootstrap_ci

    d = a["doc_nll"] / a["doc_tokens"] - b["doc_nll"] / b["doc_tokens"]
    try:
        c = cluster_bootstrap_ci(
            d, a["doc_ids"], weights=a["doc_tokens"], n_resamples=N_RESAMPLES, name="documents"
        )
    except ValueError as e:
        raise ValueError(
            f"{what}: no document-cluster interval ({e}); evaluate more blocks (--max-blocks) or more seeds"
        ) from None
    return Estimate(c.mean, c.lo, c.hi, "document-cluster bootstrap", 1, (c.mean,), c.se, p=c.p)


SUBSTITUTED = "substituted − native forward"  # tab:subst "diff": another operator on the same weights
AUDIT = "native − substituted forward"  # tab:strictaudit, tab:rounding: the same forward, other arithmetic


def _through(p: Point) -> OperatorSpec:
    """The operator whose forward the evaluation ``p`` ran in place of its own: the recorded
    ``operator_used``, or the ``op-`` part of its tag (``safe_operator``'s form of the full name,
    ``fwm-weight-k4.arithmetic-strict``, ``fwm-prob-k4.tau-5.5``)."""
    if p.operator_used and p.operator_used != p.operator:
        return OperatorSpec.from_full_name(p.operator_used)
    safe = [x[3:] for x in p.tag.split("__") if x.startswith("op-")][-1]
    base, *overrides = re.split(r"\.(?=(?:tau|range_grad|arithmetic)-)", safe)
    items = [o.replace("-", "=", 1) for o in overrides]
    return OperatorSpec.from_full_name(f"{base}[{','.join(items)}]" if items else base)


def _forward(spec: OperatorSpec) -> tuple:
    """What fixes an operator's hard forward in exact arithmetic: a baseline's kind; a K-interval operator's
    calibration, reconstruction, K and tau. The surrogate, arithmetic and range_grad change its backward and
    its rounding only (Weight-STE, eq. (3), and Prob-STE, eq. (4), share the forward P = P^N)."""
    return (spec.kind, spec.calibration, spec.reconstruction, spec.K, spec.tau)


def _substitution_rows(points: list[Point], unpaired: dict[str, str] | None) -> list[Row]:
    """The same weights through another forward against their native forward, per block and seed, at each
    key's endpoint, with the largest |Δ| of one block. The paper's sign depends on the table: tab:subst
    ("diff", e.g. softmax substituted) is substituted − native; a forward audit, whose substitute has the
    same hard forward in exact arithmetic (another arithmetic or surrogate: tab:strictaudit "historical native
    minus direct hard forward", tab:rounding "Prob-STE frozen code minus the Weight-STE-expression
    evaluator"), is native − substituted. The native evaluation is the run's own one with the tag without
    ``__op-``: a held-out one (``test__ptb``) or, for the suite's own split (``val__op-...``), its primary
    evaluation. Every run counts, a softmax run through a K-interval forward too: the contrast needs no
    control. A run evaluated through its own operator (``val__op-softmax`` of a softmax run) has none."""
    from kinterval.model import safe_operator

    by_key: dict[Key, list[Point]] = defaultdict(list)
    for p in points:
        forward = [x[3:] for x in p.tag.split("__") if x.startswith("op-")]
        if not p.primary and forward and forward[-1] != safe_operator(p.operator):
            by_key[p.key].append(p)
    idx = _index(points)
    rows = []
    for k, ps in sorted(by_key.items(), key=lambda kv: key_order(kv[0])):
        base = _control_tags(k.tag)[-1]
        audit = _forward(_through(ps[0])) == _forward(OperatorSpec.from_full_name(k.operator))
        contrast = AUDIT if audit else SUBSTITUTED
        per_seed, tokens, docs = {}, 0, []
        for p in at_endpoint(ps, contrast, unpaired):
            native = idx.get((*p.identity, base, p.tokens))
            if native is not None and native.nll.size == p.nll.size:
                per_seed[p.seed], tokens = (native.nll - p.nll if audit else p.nll - native.nll), p.tokens
                docs.append((native.docs, p.docs) if audit else (p.docs, native.docs))
        if per_seed:
            est = estimate(per_seed)
            (a, b), *more = docs
            if not more and a and b and np.array_equal(a["doc_ids"], b["doc_ids"]):  # as heldout_table's rows
                est = _documents(a, b, f"{contrast} [{k.tag}], {k.operator}")
            r = Row(contrast, k, tuple(sorted(per_seed)), est, tokens)
            r.max_abs = float(max(np.abs(d).max() for d in per_seed.values()))
            rows.append(r)
    return rows


def split_half(pair: Pair) -> float:
    """ΔNLL vs softmax on the first half of the evaluation units minus that on the second half (first half:
    the first ``n // 2`` units): blocks in evaluation order, or, for a document-clustered evaluation,
    documents in data order (token-weighted, as the held-out estimate)."""
    a, b = pair.point.docs, pair.control.docs
    d, w = (a["doc_nll"] - b["doc_nll"], a["doc_tokens"]) if a and b else (pair.d, np.ones(pair.d.size))
    if d.size < 2:
        raise ValueError(f"{pair.point.run_id} [{pair.point.tag}]: split half needs two evaluation units")
    h = d.size // 2
    return float(d[:h].sum() / np.sum(w[:h]) - d[h:].sum() / np.sum(w[h:]))


@dataclass
class HeldoutOrdering:
    """Layer 1 per held-out corpus and forward mode (App. C.3): the Spearman correlation of the conditions'
    held-out ΔNLL with their in-domain ΔNLL, and the split-half fluctuation (descriptive; no test)."""

    setting: tuple  # (budget, held-out data, tag)
    conditions: tuple[str, ...]  # with an in-domain row at the same endpoint: the Spearman's conditions
    heldout: tuple[float, ...]  # their held-out ΔNLL (the heldout.md rows)
    in_domain: tuple[float, ...]  # their in-domain ΔNLL (the delta.md rows)
    spearman: tuple[float, float] | None  # (rho, p); None below 3 conditions or for a constant ordering
    unit: str  # the split-half units: "blocks" or "documents"
    split_half: dict[str, float]  # every held-out condition -> first-half − second-half ΔNLL, mean over seeds
    fluctuation_max: float  # the largest |split_half| over conditions
    fluctuation_mean: float  # the mean |split_half|


def heldout_ordering(
    points: list[Point], held: list[Row], delta: list[Row], unpaired: dict[str, str] | None = None
) -> list[HeldoutOrdering]:
    """Per held-out setting (corpus and forward mode, ``held`` from :func:`heldout_table`): Spearman of the
    conditions' held-out ΔNLL against their in-domain ΔNLL (``delta`` from :func:`delta_table`: the row of
    the runs' own evaluation at the same training tokens; conditions without one are left out of it), and the
    split-half fluctuation of :func:`split_half` (the paper gives its values, not its aggregate: we report the
    largest and the mean |first half − second half| over the conditions)."""
    from kinterval.stats import spearman

    groups = _heldout_groups(points, unpaired)

    own = {(p.suite, p.run_id): p.key for p in points if p.primary}
    in_domain = {r.key: r for r in delta}
    by_setting: dict[tuple, list[Row]] = defaultdict(list)
    for r in held:
        if r.key in groups and r.contrast == f"{r.key.operator} − softmax":
            by_setting[r.key.setting()].append(r)
    out = []
    for setting, rows in sorted(by_setting.items(), key=str):
        both = []
        for r in rows:
            keys = {own.get((x.point.suite, x.point.run_id)) for x in groups[r.key]}
            d = in_domain.get(keys.pop()) if len(keys) == 1 else None
            if d is not None and d.tokens == r.tokens:
                both.append((r.key.operator, r.est.mean, d.est.mean))
        x, y = [h for _, h, _ in both], [i for _, _, i in both]
        rho = None
        if len(both) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
            res = spearman(x, y)
            rho = (res.rho, res.p)
        halves = {r.key.operator: float(np.mean([split_half(p) for p in groups[r.key]])) for r in rows}
        pairs = [x for r in rows for x in groups[r.key]]
        units = {"documents" if x.point.docs and x.control.docs else "blocks" for x in pairs}
        out.append(
            HeldoutOrdering(
                setting,
                tuple(c for c, _, _ in both),
                tuple(x),
                tuple(y),
                rho,
                " + ".join(sorted(units)),
                halves,
                float(max(abs(v) for v in halves.values())),
                float(np.mean([abs(v) for v in halves.values()])),
            )
        )
    return out
