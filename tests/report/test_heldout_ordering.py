"""Layer 1 held-out statistics: Spearman of the held-out ΔNLL ordering with the in-domain one, and the
split-half fluctuation (blocks, or documents for a document-clustered evaluation), on in-memory points with
planted values; no held-out evaluation gives no table."""

from __future__ import annotations

import numpy as np
import pytest

from kinterval.report import analysis as A
from kinterval.report import tables as T
from kinterval.report.results import Point

N = 40  # held-out blocks
OPS = ["lerp-k2", "lerp-k4", "lerp-k16", "minmax-weight-k4", "fwm-weight-k4"]


def point(op, seed, nll, *, tag="val", data="d", primary=True, **kw):
    where = (data, tag, 64, len(nll))
    return Point("s", f"{op}-s{seed}", "g", op, seed, 1000, 10, 1000, tag, where, nll, primary=primary, **kw)


def halves(level: float, split: float, n: int = N) -> np.ndarray:
    """Per-block ΔNLL with mean ``level`` whose first half minus second half is ``split``."""
    return np.r_[np.full(n // 2, level + split / 2), np.full(n - n // 2, level - split / 2)]


def _points(in_domain: dict, held: dict, seed: int = 7) -> list[Point]:
    """Softmax and each condition on the suite's own validation (ΔNLL ``in_domain[op]``, constant per block)
    and on PTB (per-block ΔNLL ``held[op]``); a condition absent from ``in_domain`` has no own evaluation."""
    rng = np.random.default_rng(seed)
    val, ptb = rng.normal(4.0, 0.2, 48), rng.normal(5.0, 0.3, N)
    pts = [point("softmax", seed, val)]
    pts.append(point("softmax", seed, ptb, tag="test__ptb", data="ptb", primary=False))
    for op, d in in_domain.items():
        pts.append(point(op, seed, val + d + rng.normal(0, 1e-3, 48)))
    for op, d in held.items():
        pts.append(point(op, seed, ptb + d, tag="test__ptb", data="ptb", primary=False))
    return pts


def _ordering(pts):
    delta = A.delta_table(A.softmax_pairs([p for p in pts if p.primary]))
    return A.heldout_ordering(pts, A.heldout_table(pts), delta)


def test_held_out_ordering_with_one_pair_reversed():
    """In domain the five conditions rank 1..5; held out the last two swap places. By hand: rank differences
    (0, 0, 0, 1, -1), sum d^2 = 2, rho = 1 - 6 * 2 / (5 * (25 - 1)) = 0.9. A sixth condition without an own
    evaluation is left out of the Spearman but has its split half."""
    in_domain = dict(zip(OPS, [0.05, 0.10, 0.20, 0.40, 0.80]))
    level = dict(zip(OPS, [0.06, 0.11, 0.25, 0.90, 0.70]))  # ranks 1, 2, 3, 5, 4
    split = dict(zip(OPS, [0.01, -0.03, 0.0, 0.02, 0.005]))
    held = {op: halves(level[op], split[op]) for op in OPS} | {"fwm-prob-k4": halves(0.3, -0.05)}
    (o,) = _ordering(_points(in_domain, held))
    assert o.setting == (1000, "ptb:test__ptb (T=64, 40 blocks)", "test__ptb", "")  # no model: no manifest
    assert sorted(o.conditions) == sorted(OPS)
    assert dict(zip(o.conditions, o.heldout)) == pytest.approx(level)
    assert dict(zip(o.conditions, o.in_domain)) == pytest.approx(in_domain, abs=1e-3)
    assert o.spearman[0] == pytest.approx(0.9)
    assert o.unit == "blocks"
    want = split | {"fwm-prob-k4": -0.05}
    assert o.split_half == pytest.approx(want)
    assert o.fluctuation_max == pytest.approx(0.05)
    assert o.fluctuation_mean == pytest.approx(np.mean(np.abs(list(want.values()))))
    headers, (row,) = T.heldout_ordering_rows([o])
    cells = dict(zip(headers, row))
    assert cells["Conditions"] == "5 of 6"
    assert cells["Spearman with in-domain ΔNLL (p)"].startswith("+0.900 (")
    assert cells["Split-half fluctuation: largest (condition)"] == "0.0500 (fwm-prob-k4)"
    assert cells["Split-half fluctuation: mean"] == f"{np.mean(np.abs(list(want.values()))):.4f}"


def test_same_ordering_is_one_and_a_later_in_domain_endpoint_is_left_out():
    in_domain = dict(zip(OPS, [0.05, 0.10, 0.20, 0.40, 0.80]))
    pts = _points(in_domain, {op: halves(v, 0.0) for op, v in in_domain.items()})
    (o,) = _ordering(pts)
    assert o.spearman[0] == pytest.approx(1.0) and o.fluctuation_max == pytest.approx(0.0, abs=1e-12)
    # held-out evaluations of an earlier checkpoint than the in-domain endpoint: not "the same endpoint"
    for p in pts:
        if p.primary:
            p.tokens, p.step = 2000, 20
    (o,) = _ordering(pts)
    assert o.conditions == () and o.spearman is None and len(o.split_half) == 5


def test_split_half_over_seeds_is_their_mean():
    pts = _points({"lerp-k4": 0.1}, {"lerp-k4": halves(0.1, 0.02)}, seed=7)
    pts += _points({"lerp-k4": 0.1}, {"lerp-k4": halves(0.1, 0.06)}, seed=42)
    (o,) = _ordering(pts)
    assert o.split_half == {"lerp-k4": pytest.approx(0.04)} and o.spearman is None


def test_document_clustered_split_half_is_token_weighted_over_documents():
    """Five documents, tokens (10, 30, 20, 40, 50), per-document ΔNLL (0.1, 0.2, 0.0, 0.3, 0.1): the first
    half (2 documents) is (1 + 6) / 40 = 0.175, the second (0 + 12 + 5) / 110; the split half is their
    difference, 0.175 - 17/110 = 0.0204545..."""
    tokens = np.array([10.0, 30.0, 20.0, 40.0, 50.0])
    d = np.array([0.1, 0.2, 0.0, 0.3, 0.1])
    ids = np.arange(5)
    base = 4.0 + 0.1 * np.arange(5)
    pts = _points({"lerp-k4": 0.1}, {"lerp-k4": np.full(N, 0.2)})
    ctrl, cond = (p for p in pts if not p.primary)
    ctrl.docs = {"doc_ids": ids, "doc_nll": base * tokens, "doc_tokens": tokens}
    cond.docs = {"doc_ids": ids, "doc_nll": (base + d) * tokens, "doc_tokens": tokens}
    (pair,) = A.softmax_pairs([ctrl, cond]).pairs
    assert A.split_half(pair) == pytest.approx(0.175 - 17 / 110, rel=1e-12)
    (o,) = _ordering(pts)
    assert o.unit == "documents" and o.fluctuation_max == pytest.approx(0.0204545454, rel=1e-8)
    assert o.heldout == pytest.approx([np.sum(d * tokens) / tokens.sum()])  # the document-cluster estimate


def test_no_held_out_evaluation_gives_no_ordering():
    pts = [p for p in _points({"lerp-k4": 0.1}, {"lerp-k4": np.full(N, 0.2)}) if p.primary]
    assert A.heldout_table(pts) == [] and _ordering(pts) == []
    assert T.heldout_ordering_rows([]) == (T.heldout_ordering_rows([])[0], [])


def test_a_substitution_evaluation_enters_the_ordering_once_by_its_delta_vs_softmax():
    """Softmax and lerp-k4 evaluated through another forward on their own split (``val__op-...``): the
    held-out table has both the ΔNLL vs softmax and the substituted − native row of that key; the ordering
    takes the condition once, by its ΔNLL vs the same-seed softmax evaluated the same way."""
    rng = np.random.default_rng(21)
    val = rng.normal(4.0, 0.2, 48)
    tag = "val__op-lerp-k8"

    def pt(op, nll, t="val"):
        return Point(
            "s", f"{op}-s7", "g", op, 7, 1000, 10, 1000, t, ("d", "val", 64, 48), nll, primary=t == "val"
        )

    pts = [pt("softmax", val), pt("lerp-k4", val + 0.05)]
    pts += [pt("softmax", val + 0.01, tag), pt("lerp-k4", val + 0.08, tag)]
    held = A.heldout_table(pts)
    assert {r.contrast for r in held} == {"lerp-k4 − softmax", "substituted − native forward"}
    (o,) = A.heldout_ordering(pts, held, A.delta_table(A.softmax_pairs([p for p in pts if p.primary])))
    assert (
        o.conditions == ("lerp-k4",)
        and o.heldout == pytest.approx((0.07,))
        and o.in_domain == pytest.approx((0.05,))
    )


def test_held_out_evaluations_without_a_control_are_listed_not_dropped():
    """Softmax evaluated on PTB at an earlier checkpoint than the conditions: every PTB row vanished from
    heldout.md, with nothing in unpaired.md."""
    from dataclasses import replace

    pts = _points({"lerp-k4": 0.1}, {"lerp-k4": halves(0.1, 0.0), "lerp-k16": halves(0.2, 0.0)})
    pts = [replace(p, tokens=500) if p.operator == "softmax" and not p.primary else p for p in pts]
    unpaired: dict[str, str] = {}
    assert A.heldout_table(pts, unpaired) == []
    assert set(unpaired) == {"lerp-k4-s7 [test__ptb] vs softmax", "lerp-k16-s7 [test__ptb] vs softmax"}
    assert "softmax seed 7 has no evaluation at 1000 tokens" in unpaired["lerp-k4-s7 [test__ptb] vs softmax"]


def test_a_softmax_run_not_evaluated_at_its_endpoint_is_listed_not_an_index_error():
    """The softmax reference row of a run with no evaluation at its last checkpoint raised IndexError."""
    from dataclasses import replace

    pts = [replace(p, reached=2000) if p.operator == "softmax" else p for p in _points({"lerp-k4": 0.1}, {})]
    unpaired: dict[str, str] = {}
    assert A.softmax_rows(pts, unpaired=unpaired) == []
    assert list(unpaired) == ["softmax-s7 [val] in the softmax reference"]
