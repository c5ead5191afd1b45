"""Attention options across models (``mini`` and ``mini-modern`` reported together): each run of a model
with attention options (grouped-query heads, softcap, sinks, rotary positions) against the run of the same
operator and seed of the same model without them, trained under the same protocol otherwise, on the same
data, and evaluated on the same blocks at the same checkpoint. Per validation block:

* the option effect of an operator, ``op[options] − op[none]``;
* the change of its penalty, ``(op − softmax)[options] − (op − softmax)[none]``: does the option widen
  (> 0) or narrow (< 0) the operator's gap to softmax?

Each is a contrast under the one rule (:func:`~kinterval.report.analysis.core.estimate`) at the endpoint both
settings reached; BH q over the rows of one comparison (options, base model, budget, data, tag)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from kinterval.model.config import ATTENTION_OPTIONS
from kinterval.report.analysis.core import (
    Pair,
    Row,
    _row_from_pairs,
    _sort_key,
    apply_bh,
    at_endpoint,
    design_of,
    estimate,
)
from kinterval.report.results import REFERENCES, Point

OPTION_FIELDS = frozenset(f"model.{name}" for name in ATTENTION_OPTIONS)


@dataclass
class OptionEffect:
    """One operator's option effect (``effect``: ``op[options] − op[none]``; its ``key`` is the run with the
    options) and, for an operator other than softmax with softmax in both models, the change of its penalty
    (``penalty``: ``(op − softmax)[options] − (op − softmax)[none]``; None otherwise)."""

    options: str  # "2KV sinks rope10000"
    base: str  # the model without them ("6L 6H d384")
    effect: Row
    penalty: Row | None = None


def _twin(p: Point) -> tuple:
    """What a run with options and its twin without them share: all but the model's label and options."""
    rest = tuple(x for x in p.protocol if x[0] not in OPTION_FIELDS)
    return (p.operator, p.seed, p.budget, p.data, p.tag, p.tokens, p.train_data, rest)


def option_effects(points: list[Point], unpaired: dict[str, str] | None = None) -> list[OptionEffect]:
    """Every operator run with attention options that has a twin without them (see the module docstring), at
    the endpoint of each comparison; runs of a comparison without a pair there are listed in ``unpaired``."""
    plain = {_twin(p): p for p in points if not p.options}  # the twin has the primary tag too
    groups: dict[tuple, list[Pair]] = defaultdict(list)
    for p in points:
        if p.primary and p.options and (b := plain.get(_twin(p))) is not None:
            groups[(p.key, b.model)].append(Pair(p, b))
    pairs = {
        k: at_endpoint(ps, "the attention-option effects", unpaired, lambda x: x.point)
        for k, ps in groups.items()
    }
    pairs = {k: ps for k, ps in pairs.items() if ps}
    # each seed's softmax pair at each checkpoint: (its key, the model without options, seed, tokens) -> pair
    reference = {
        (key, base, x.point.seed, x.point.tokens): x
        for (key, base), ps in pairs.items()
        if key.operator in REFERENCES
        for x in ps
    }
    out = []
    for (key, base), ps in pairs.items():
        options = " ".join(ps[0].point.options)
        effect = _row_from_pairs(f"{key.operator}: {options} − none", ps, key=key)
        penalty = None
        if key.operator not in REFERENCES:
            penalty = _penalty(key, base, ps, reference, options)
        out.append(OptionEffect(options, base, effect, penalty))
    out.sort(key=lambda e: (e.base, _sort_key(e.effect)))
    family = lambda r: (r.key.setting(), r.contrast.rpartition(":")[2])  # noqa: E731
    apply_bh([e.effect for e in out], family)
    apply_bh([e.penalty for e in out if e.penalty is not None], family)
    return out


def _penalty(key, base, pairs: list[Pair], reference: dict, options: str) -> Row | None:
    """``(op − softmax)[options] − (op − softmax)[none]`` per block over the seeds whose softmax runs of both
    models reached the same checkpoint (softmax or sdpa, whichever the model with options has); None without
    one."""
    per_seed, used = {}, []
    for x in pairs:
        ref = next(
            (
                reference[k]
                for op in REFERENCES
                if (k := (replace(key, operator=op), base, x.point.seed, x.point.tokens)) in reference
            ),
            None,
        )
        if ref is None:
            continue
        per_seed[x.point.seed] = (x.point.nll - ref.point.nll) - (x.control.nll - ref.control.nll)
        used.append((x, ref))
    if not per_seed:
        return None
    what = f"{key.operator} − softmax: {options} − none"
    p0 = pairs[0].point
    return Row(
        contrast=what,
        key=key,
        seeds=tuple(sorted(per_seed)),
        est=estimate(per_seed, f"{what} [{p0.tag}, {p0.tokens} tokens]"),
        tokens=p0.tokens,
        K=p0.K,
        family=p0.family,
        group=p0.group,
        nll=float(np.mean([x.point.mean - r.point.mean for x, r in used])),  # the penalty with the options
        control_nll=float(np.mean([x.control.mean - r.control.mean for x, r in used])),  # and without
        design=design_of(x.point for x, _ in used),
    )
