"""tab:strict (App. C.2 (iii)): the strict-forward replication of the K=4 factorial cells at one seed, at the
training evaluator, at each secondary evaluator and against the historical-arithmetic runs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kinterval.ops import OperatorSpec
from kinterval.report.analysis.core import Estimate, _control_tags, estimate
from kinterval.report.analysis.factorial import FACTORIAL
from kinterval.report.results import Point
from kinterval.stats import FACTORIAL_WEIGHTS

# tab:strict (App. C.2 (iii)): the strict-forward replication of the K=4 factorial cells at one seed.
STRICT_GROUPS = (
    "strict pairs, training evaluator",
    "strict pairs, secondary evaluator",
    "historical comparisons (frozen weights)",
    "background: historical runs only",
)
_STRICT_PAIRS = (  # contrast -> weight of each cell (FACTORIAL names); interaction as in tab:cross
    ("MinMax: Prob − Weight (strict pair)", {"mm_p": 1.0, "mm_w": -1.0}),
    ("FWM: Prob − Weight (strict pair)", {"fwm_p": 1.0, "fwm_w": -1.0}),
    ("Interaction (FWM_P − FWM_W) − (MM_P − MM_W)", FACTORIAL_WEIGHTS["interaction"]),
)
_CAL = (("MinMax", "mm"), ("FWM", "fwm"))


@dataclass
class StrictRow:
    """One row of tab:strict: a contrast of the evaluations ``terms`` (``+1 operator [tag]``) taken at one
    evaluator (``evaluator``: the evaluation tag, the folder under ``RUN/eval/``) and at the strict runs'
    endpoint, per validation block, one seed (block bootstrap); ``est`` None and ``why`` set when a run or
    an evaluation it needs is absent ("not run")."""

    group: str  # one of STRICT_GROUPS
    contrast: str
    seed: int | None
    K: int
    evaluator: str  # "-" when not run
    est: Estimate | None
    tokens: int = 0
    terms: tuple[str, ...] = ()
    why: str = ""
    devices: tuple[str, ...] = ()  # the device models its evaluations recorded (none in older files)


def _strict_cell(p: Point) -> str | None:
    """The factorial cell (``mm_w``...) of a Nearest MinMax/FWM run with no override besides the arithmetic
    (full gradient, the default FWM tau), else None."""
    s = p.spec
    if s.reconstruction != "nearest" or s.calibration not in ("minmax", "fwm"):
        return None
    if OperatorSpec.parse(p.operator.partition("[")[0], arithmetic=s.arithmetic) != s:
        return None
    return next(c for c, cs in FACTORIAL.items() if cs == (s.calibration, s.surrogate))


def _cell_op(cell: str, K: int, arithmetic: str) -> str:
    cal, sur = FACTORIAL[cell]
    return OperatorSpec.parse(f"{cal}-{sur}-k{K}", arithmetic=arithmetic).full_name


def _runs_through(p: Point, op: str) -> bool:
    """Whether the evaluation ``p`` ran the forward of operator ``op`` (full name): its recorded
    ``operator_used``, or the ``op-`` part of its tag (``kinterval eval --operator``), or its own operator."""
    from kinterval.model import safe_operator

    if p.operator_used and p.operator_used != p.operator:
        return p.operator_used == op
    ops = [x[3:] for x in p.tag.split("__") if x.startswith("op-")]
    return ops[-1] == safe_operator(op) if ops else p.operator == op


def strict_table(points: list[Point]) -> list[StrictRow]:
    """tab:strict for each seed (and K) of the supplementary strict-arithmetic factorial cells
    (:attr:`Point.per_seed` runs, ``arithmetic=strict``; the paper: K=4, seed 7), every contrast per
    validation block at the strict runs' endpoint (the largest training-token count their own evaluations
    reached) under the one rule (:func:`estimate`: one seed, block bootstrap):

    1. the strict pairs at the runs' own evaluation (the training evaluator): Prob − Weight under MinMax and
       under FWM and the interaction (FWM_P − FWM_W) − (MM_P − MM_W);
    2. the same at each secondary evaluator: another evaluation folder of the same checkpoints on the same
       data and blocks, without an operator override (``kinterval eval --out RUN/eval/TAG``);
    3. against the same-seed historical-arithmetic runs of the same model, budget and data (suite D), on
       frozen weights: new Prob − historical Prob evaluated through the strict forward (``kinterval eval
       --operator`` with the strict operator), new strict Weight − historical Weight, and historical Prob
       native − through the strict forward;
    4. background: historical Prob − historical Weight at that seed.

    Evaluations are combined only within one evaluator: the same tag, or its ``__op-`` override (a tag names
    one evaluator for every run that carries it). Rows 3 and 4 are given at each evaluator where all their
    evaluations exist. A contrast whose runs or evaluations are absent is one row with ``est`` None and the
    reason in ``why`` ("not run"), never dropped; without any strict run every row is "not run"."""
    strict = [p for p in points if p.per_seed and p.spec.arithmetic == "strict" and _strict_cell(p)]
    lineages: dict[tuple, list[Point]] = defaultdict(list)
    for p in strict:
        if p.primary:
            lineages[(p.model, p.budget, p.data, p.seed, p.K)].append(p)
    if not lineages:
        why = "no strict-arithmetic factorial run of one seed (the supplementary group strict-forward)"
        return [
            StrictRow(g, name, None, 4, "-", None, why=why)
            for g, names in zip(STRICT_GROUPS, _strict_contrasts())
            for name in names
        ]
    rows = []
    for (*_, seed, K), own in sorted(lineages.items(), key=lambda kv: str(kv[0])):
        rows += _strict_lineage(points, own, seed, K)
    return rows


def _strict_contrasts() -> tuple[tuple[str, ...], ...]:
    """The contrast names of each of STRICT_GROUPS."""
    pairs = tuple(n for n, _ in _STRICT_PAIRS)
    hist = tuple(
        f"{cal}: {what}"
        for what in (
            "new Prob − historical Prob, strict forward on both",
            "new strict Weight − historical Weight",
            "historical Prob, native − strict forward",
        )
        for cal, _ in _CAL
    )
    return pairs, pairs, hist, tuple(f"{cal}: historical Prob − historical Weight" for cal, _ in _CAL)


def _strict_lineage(points: list[Point], own: list[Point], seed: int, K: int) -> list[StrictRow]:
    """tab:strict for one seed and K (:func:`strict_table`); ``own``: the strict runs' primary points."""
    p0 = own[0]
    primary_tag = p0.tag
    end = max(p.tokens for p in own)
    # every evaluation of a factorial cell of this seed, model, budget and data (blocks), any arithmetic
    runs = [
        p
        for p in points
        if (p.model, p.budget, p.data, p.seed, p.K) == (p0.model, p0.budget, p0.data, seed, K)
        and _strict_cell(p)
    ]

    def base(tag: str) -> str:  # the evaluator of a tag: the tag without its operator override
        return _control_tags(tag)[-1]

    def find(cell: str, arith: str, tag: str, forward: str | None = None) -> Point | str:
        """The evaluation of the cell's run in ``arith`` at ``tag`` through ``forward`` (None: its own), at
        the endpoint; or why there is none."""
        op = _cell_op(cell, K, arith)
        mine = [p for p in runs if p.operator == op]
        if not mine:
            return f"no {op} run with seed {seed}"
        at_end = [p for p in mine if p.tokens == end]
        if not at_end:
            last = max(p.tokens for p in mine)
            return f"{op} seed {seed}: no evaluation at {end} training tokens (its last: {last})"
        fwd = forward or op
        hit = next((p for p in at_end if base(p.tag) == tag and _runs_through(p, fwd)), None)
        if hit is not None:
            return hit
        if fwd == op:
            return f"{op} seed {seed}: no evaluation [{tag}]"
        return f"{op} seed {seed}: no evaluation through {fwd} [{tag}] (`kinterval eval --operator '{fwd}'`)"

    def contrast(group, name, tag, terms) -> StrictRow:
        """``terms``: (weight, cell, arithmetic, forward) combined per block at evaluator ``tag``."""
        found = [(w, find(c, a, tag, _cell_op(f, K, "strict") if f else None)) for w, c, a, f in terms]
        missing = [x for _, x in found if isinstance(x, str)]
        if missing:
            return StrictRow(group, name, seed, K, "-", None, end, why="; ".join(dict.fromkeys(missing)))
        d = sum(w * p.nll for w, p in found)
        est = estimate({seed: d}, f"tab:strict {name}, seed {seed} [{tag}, {end} tokens]")
        shown = tuple(f"{w:+g} {p.operator} [{p.tag}]" for w, p in found)
        devices = tuple(sorted({p.device_name for _, p in found if p.device_name}))
        return StrictRow(group, name, seed, K, tag, est, end, shown, devices=devices)

    def at_evaluators(group, name, tags, terms) -> list[StrictRow]:
        """The contrast at each evaluator of ``tags`` with all its evaluations; else one "not run" row with
        the reason at the first."""
        done = [r for t in tags if (r := contrast(group, name, t, terms)).est is not None]
        return done or [contrast(group, name, tags[0], terms)]

    g1, g2, g3, g4 = STRICT_GROUPS
    pair_terms = [[(w, c, "strict", None) for c, w in ws.items()] for _, ws in _STRICT_PAIRS]
    rows = [contrast(g1, n, primary_tag, t) for (n, _), t in zip(_STRICT_PAIRS, pair_terms)]
    # a secondary evaluator: a strict run's evaluation on the same data without an operator override
    native = {p.tag for p in runs if p.tokens == end and base(p.tag) == p.tag}
    secondary = sorted({p.tag for p in runs if p.spec.arithmetic == "strict"} & native - {primary_tag})
    if not secondary:
        why = (
            f"no second evaluation of the strict runs: an evaluation folder other than {primary_tag!r} on "
            "the same data, without an operator override (`kinterval eval --out RUN/eval/TAG`)"
        )
        rows += [StrictRow(g2, n, seed, K, "-", None, end, why=why) for n, _ in _STRICT_PAIRS]
    for tag in secondary:
        rows += [contrast(g2, n, tag, t) for (n, _), t in zip(_STRICT_PAIRS, pair_terms)]
    tags = [primary_tag, *sorted(native - {primary_tag})]
    names3, names4 = _strict_contrasts()[2:]
    terms3 = [[(1.0, f"{c}_p", "strict", None), (-1.0, f"{c}_p", "historical", f"{c}_p")] for _, c in _CAL]
    terms3 += [[(1.0, f"{c}_w", "strict", None), (-1.0, f"{c}_w", "historical", None)] for _, c in _CAL]
    terms3 += [
        [(1.0, f"{c}_p", "historical", None), (-1.0, f"{c}_p", "historical", f"{c}_p")] for _, c in _CAL
    ]
    for name, terms in zip(names3, terms3):
        rows += at_evaluators(g3, name, tags, terms)
    for name, (_, c) in zip(names4, _CAL):
        rows += at_evaluators(
            g4, name, tags, [(1.0, f"{c}_p", "historical", None), (-1.0, f"{c}_w", "historical", None)]
        )
    return rows
