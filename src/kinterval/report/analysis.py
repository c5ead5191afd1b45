"""Contrasts from loaded results (paper §4 "Statistics", App. C.3): every number the tables and figures show.

Every run is paired with its same-seed control (softmax, or the full-gradient twin of a modified backward) of
the same model at the same token budget, data, evaluation tag and checkpoint, across all the folders given.
A contrast is computed per validation block and per seed; :func:`estimate` then applies the paper's one rule:
one seed gives a circular block-bootstrap CI over blocks (evaluation sampling only), several seeds the seed
summary (mean of the per-seed contrasts, seed SD, t interval, exact sign-permutation p). Several seeds are
pooled only within a designed seed set (suite D's five seeds, ``mini`` with ``mini-seeds``): a supplementary
run's seeds are replications, not a seed distribution, and each is its own row (``Key.seed``; App. F "a
three-seed pool mixes lineages"). Every table row is a :class:`Row`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from kinterval.eval.graddiag import DECOMP
from kinterval.ops import OperatorSpec
from kinterval.report.results import Key, Point
from kinterval.stats import (
    FACTORIAL_WEIGHTS,
    bh_q,
    block_bootstrap_ci,
    block_length,
    permutation_p_exact,
    permutation_p_random,
    seed_summary,
)
from kinterval.stats.bootstrap import circular_block_means
from kinterval.stats.seeds import MAX_EXACT_N

N_RESAMPLES = 4000
MARGIN = 0.01  # single-seed interpretation margin in nats (paper §4)
FACTORIAL = {
    "mm_w": ("minmax", "weight"),
    "mm_p": ("minmax", "prob"),
    "fwm_w": ("fwm", "weight"),
    "fwm_p": ("fwm", "prob"),
}


@dataclass(frozen=True)
class Estimate:
    """A contrast's estimate and 95% interval under the one rule (see :func:`estimate`)."""

    mean: float
    lo: float
    hi: float
    interval: str  # "block bootstrap" (one seed) or "t (n-1 df)" (several)
    n_seeds: int
    per_seed: tuple[float, ...]  # the per-seed mean contrasts
    eval_se: float | None = None  # mean over seeds of the block-bootstrap SE (evaluation sampling)
    sd: float | None = None  # seed SD (several seeds)
    p: float | None = None  # exact sign-permutation p (several seeds), percentile-bootstrap p (one seed)
    block: int | None = None  # the block bootstrap's block length (stats.block_length: 16, or n // 2 below
    # 32 blocks); with several seeds of different lengths, the shortest series' block

    @property
    def excludes_zero(self) -> bool:
        return bool(np.isfinite(self.lo) and (self.lo > 0 or self.hi < 0))

    @property
    def separated(self) -> bool:
        """Single-seed label of the paper: CI lower bound above +0.01 nats."""
        return bool(np.isfinite(self.lo) and self.lo > MARGIN)

    @property
    def within_margin(self) -> bool:
        """The CI lies wholly inside (-0.01, +0.01) nats."""
        return bool(np.isfinite(self.lo) and -MARGIN < self.lo and self.hi < MARGIN)


def estimate(per_seed: Mapping[int, np.ndarray], what: str = "contrast") -> Estimate:
    """The one rule: ``per_seed`` maps seed -> per-block contrast (blocks in evaluation order).

    One seed: mean over blocks with a circular moving-block bootstrap CI (4000 resamples, block 16, or
    ``n // 2`` for ``n < 32`` blocks: :func:`kinterval.stats.block_length`, recorded in ``block``).
    Several seeds: the per-seed means' seed summary (mean, SD, t interval with n-1 df) and the exact
    sign-flip permutation p. Either way ``eval_se`` is the block-bootstrap SE, averaged over seeds.
    ``ValueError`` naming ``what``, the seed and the block: a non-finite value, or one seed with one block
    (no interval).
    """
    if not per_seed:
        raise ValueError(f"{what}: estimate needs at least one seed's contrast")
    series = [np.asarray(per_seed[s], dtype=np.float64) for s in sorted(per_seed)]
    for s, x in zip(sorted(per_seed), series):
        if x.ndim != 1 or x.size == 0:
            raise ValueError(
                f"{what}, seed {s}: the per-block contrast must be a non-empty 1-D array, got {x.shape}"
            )
        if not np.all(np.isfinite(x)):
            i = int(np.flatnonzero(~np.isfinite(x))[0])
            raise ValueError(f"{what}, seed {s}: the per-block contrast is not finite ({x[i]}) at block {i}")
    if len(series) == 1 and series[0].size < 2:
        raise ValueError(
            f"{what}, seed {sorted(per_seed)[0]}: one seed with one validation block has no interval (the "
            "block bootstrap needs two blocks); evaluate more blocks or more seeds"
        )
    blocks = [block_length(x.size) if x.size >= 2 else None for x in series]
    boots = [
        block_bootstrap_ci(x, block=b, n_resamples=N_RESAMPLES) if b is not None else None
        for x, b in zip(series, blocks)
    ]
    eval_se = None if any(b is None for b in boots) else float(np.mean([b.se for b in boots]))
    block = None if any(b is None for b in blocks) else min(blocks)
    means = tuple(float(x.mean()) for x in series)
    if len(series) == 1:
        b = boots[0]  # percentile-bootstrap p: BH over single-seed conditions
        return Estimate(means[0], b.lo, b.hi, "block bootstrap", 1, means, eval_se, p=b.p, block=block)
    ss = seed_summary(means)
    p = permutation_p_exact(means) if len(means) <= MAX_EXACT_N else permutation_p_random(means)
    return Estimate(ss.mean, ss.lo, ss.hi, f"t ({ss.df} df)", ss.n, means, eval_se, ss.sd, p, block)


@dataclass
class Row:
    """One row of any table: what is contrasted, for which key, and its :class:`Estimate`."""

    contrast: str  # e.g. "lerp-k32 − softmax", "interaction"
    key: Key | None  # the condition (None for rows that pool several conditions)
    seeds: tuple[int, ...]
    est: Estimate
    tokens: int = 0  # training tokens at the checkpoint
    K: int | None = None
    family: str = ""
    group: str = ""
    nll: float | None = None  # the condition's mean NLL, mean over seeds
    nll_sd: float | None = None  # its seed SD (several seeds)
    control_nll: float | None = None  # its control's mean NLL, mean over seeds
    q: float | None = None  # BH q within the table's family
    design: tuple = ()  # the condition's design (:func:`design_of`): its BH family within a setting
    recovery: float | None = None  # gap recovery (detach pairs), path ratio (tail decomposition)
    recovery_lo: float | None = None  # its 95% interval, where one is computed (the path ratio)
    recovery_hi: float | None = None
    note: str = ""
    max_abs: float | None = None  # the largest |Δ| of one block over the seeds (substituted − native)


@dataclass
class Pair:
    """A run's checkpoint and its same-seed control at the same budget, data, tag and training tokens."""

    point: Point
    control: Point

    @property
    def d(self) -> np.ndarray:
        return self.point.nll - self.control.nll


@dataclass
class Pairing:
    """Paired checkpoints and the runs left out (``unpaired``: run -> reason): those with no valid control,
    and those a row built from these pairs left out for want of a pair at its endpoint (``at_endpoint``)."""

    pairs: list[Pair]
    unpaired: dict[str, str] = field(default_factory=dict)


def _index(points: Iterable[Point]) -> dict[tuple, Point]:
    return {(*p.identity, p.tag, p.tokens): p for p in points}


def _control_tags(tag: str) -> list[str]:
    """The control's tag: the same one, or, for an operator-substitution evaluation (``__op-``), the native
    one (a softmax run evaluated through softmax is its native evaluation)."""
    base = "__".join(x for x in tag.split("__") if not x.startswith("op-"))
    return [tag] if base == tag else [tag, base]


def full_twin(operator: str) -> str | None:
    """The full-gradient twin of a modified-backward operator (``lerp-k32[range_grad=detach]`` ->
    ``lerp-k32``), None for an operator with the full gradient."""
    spec = _spec(operator)
    if spec.range_grad == "full":
        return None
    return OperatorSpec.parse(spec, range_grad="full").full_name


def _spec(operator: str) -> OperatorSpec:
    return OperatorSpec.parse("softmax") if operator == "sdpa" else OperatorSpec.from_full_name(operator)


def pair_controls(points: list[Point], control_of) -> Pairing:
    """Pair each point with the point of operator ``control_of(operator)`` (None: not to be paired) with the
    same model, seed, budget, data, tag and checkpoint tokens; runs with no such control anywhere are
    listed."""
    idx = _index(points)
    by_op: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        by_op[p.operator].append(p)
    out, missing = Pairing([]), {}
    for p in points:
        ctrl_op = control_of(p.operator)
        if ctrl_op is None:
            continue
        hit = next(
            (
                idx[k]
                for t in _control_tags(p.tag)
                if (k := (p.model, ctrl_op, p.seed, p.budget, p.data, t, p.tokens)) in idx
            ),
            None,
        )
        if hit is not None:
            out.pairs.append(Pair(p, hit))
            continue
        cands = [c for c in by_op.get(ctrl_op, []) if c.seed == p.seed]
        if not cands:
            why = f"no {ctrl_op} run with seed {p.seed}"
        elif not any(c.model == p.model for c in cands):
            models = sorted({c.model for c in cands})
            why = f"{ctrl_op} seed {p.seed} is another model ({models}, not {p.model})"
        elif not any(c.budget == p.budget for c in cands):
            why = f"{ctrl_op} seed {p.seed} has another token budget ({sorted({c.budget for c in cands})})"
        elif not any(c.data == p.data for c in cands):
            why = f"{ctrl_op} seed {p.seed} was evaluated on other data"
        else:
            why = f"{ctrl_op} seed {p.seed} has no evaluation at {p.tokens} tokens, tag {p.tag}"
        missing.setdefault((p.suite, p.run_id, p.tag, ctrl_op), why)
    # A run paired at some checkpoint is not "unpaired" because another checkpoint lacks its control.
    paired = {(x.point.suite, x.point.run_id, x.point.tag, x.control.operator) for x in out.pairs}
    # run id -> the suites with a run of that name (C and D both have softmax-s1337): then the suite names it
    suites_of = defaultdict(set)
    for p in points:
        suites_of[p.run_id].add(p.suite)
    for (suite, run, tag, ctrl), why in missing.items():
        if (suite, run, tag, ctrl) not in paired:
            name = run if len(suites_of[run]) == 1 else f"{suite}/{run}"
            out.unpaired[f"{name} [{tag}] vs {ctrl}"] = why
    return out


def softmax_pairs(points: list[Point]) -> Pairing:
    """Every non-softmax point with its same-seed softmax control."""
    return pair_controls(points, lambda op: None if op in ("softmax", "sdpa") else "softmax")


def final(items, run=lambda x: x) -> list:
    """The last checkpoint of each (run, tag) among ``items`` (points or pairs)."""
    last: dict[tuple, object] = {}
    for x in items:
        p = run(x)
        k = (*p.identity, p.tag)
        if k not in last or p.step > run(last[k]).step:
            last[k] = x
    return list(last.values())


def _left_out(unpaired: dict[str, str] | None, run: str, reason: str) -> None:
    """Record a run left out of a row in ``unpaired`` (run -> reason); without one, raise."""
    if unpaired is None:
        raise ValueError(f"{run}: {reason}")
    unpaired.setdefault(run, reason)


def at_endpoint(items, what: str, unpaired: dict[str, str] | None = None, run=lambda x: x) -> list:
    """The items (points, or pairs with ``run=lambda x: x.point``) of one row or contrast at its endpoint: the
    largest training-token count any of them reached. Each run (model, operator, seed, budget, data, tag)
    without an item there is left out, so that a crashed run's earlier checkpoint never joins the endpoint,
    and is listed in ``unpaired`` as "RUN [tag] in WHAT" -> reason (``ValueError`` when ``unpaired`` is
    None)."""
    items = list(items)
    if not items:
        return []
    end = max(run(x).tokens for x in items)
    by_run: dict[tuple, list] = defaultdict(list)
    for x in items:
        p = run(x)
        by_run[(*p.identity, p.tag)].append(x)
    out = []
    for xs in by_run.values():
        hit = next((x for x in xs if run(x).tokens == end), None)
        if hit is not None:
            out.append(hit)
            continue
        last = max((run(x) for x in xs), key=lambda p: p.tokens)
        paired = "paired " if isinstance(xs[0], Pair) else ""
        why = f"no {paired}evaluation at the endpoint ({end} training tokens); its last is at {last.tokens}"
        if last.stopped is not None:
            why = f"stopped by a non-finite loss at step {last.stopped[0]} ({last.stopped[1]} tokens); {why}"
        _left_out(unpaired, f"{last.run_id} [{last.tag}] in {what}", why)
    return out


def stopped_runs(points: Iterable[Point], unevaluated: dict[str, dict] | None = None) -> dict[str, dict]:
    """The runs the trainer stopped with a non-finite loss: run -> operator, seed, the step and training
    tokens of that loss, the run's budget and its last evaluated checkpoint (tokens, mean NLL; None for a
    run of ``unevaluated``, stopped before its first checkpoint: ``SuiteResults.stopped_unevaluated``)."""
    last: dict[str, Point] = {}
    for p in points:
        if p.stopped is not None and (p.run_id not in last or p.tokens > last[p.run_id].tokens):
            last[p.run_id] = p
    out = {
        rid: dict(
            operator=p.operator,
            seed=p.seed,
            step=p.stopped[0],
            tokens=p.stopped[1],
            budget=p.budget,
            last_evaluated_tokens=p.tokens,
            last_mean_nll=p.mean,
        )
        for rid, p in last.items()
    }
    for rid, s in (unevaluated or {}).items():
        keep = ("operator", "seed", "step", "tokens", "budget")
        out.setdefault(rid, {**{k: s[k] for k in keep}, "last_evaluated_tokens": None, "last_mean_nll": None})
    return dict(sorted(out.items()))


def design_of(points: Iterable[Point]) -> tuple:
    """The design of a condition's points: the seeds the loaded manifests plan for it (``Point.design_seeds``,
    a run that crashed or was never evaluated included), or, for points built without a manifest, the suites
    they come from. Never the seeds realized at a row's endpoint."""
    points = list(points)
    if points and all(p.design_seeds for p in points):
        return ("seeds", tuple(sorted({s for p in points for s in p.design_seeds})))
    return ("suites", tuple(sorted({p.suite for p in points})))


def _row_from_pairs(contrast: str, pairs: list[Pair], key: Key | None = None, **kw) -> Row:
    pairs = sorted(pairs, key=lambda x: x.point.seed)
    p0 = pairs[0].point
    tokens = {t for x in pairs for t in (x.point.tokens, x.control.tokens)}
    if len(tokens) != 1:  # callers pass the pairs of one checkpoint (at_endpoint or one trajectory point)
        raise ValueError(f"{contrast}: pairs at different training tokens {sorted(tokens)} in one row")
    return Row(
        contrast=contrast,
        key=key or p0.key,
        seeds=tuple(x.point.seed for x in pairs),
        est=estimate({x.point.seed: x.d for x in pairs}, f"{contrast} [{p0.tag}, {p0.tokens} tokens]"),
        tokens=p0.tokens,
        K=p0.K,
        family=p0.family,
        group=p0.group,
        nll=float(np.mean([x.point.mean for x in pairs])),
        nll_sd=float(np.std([x.point.mean for x in pairs], ddof=1)) if len(pairs) > 1 else None,
        control_nll=float(np.mean([x.control.mean for x in pairs])),
        design=design_of(x.point for x in pairs),
        **kw,
    )


# The paper's order of operator families (tab:seedend, tab:endpoints): softmax, the exponential baselines
# (no K), LERP, the four factorial cells, resolved calibration; an unknown family after them.
FAMILY_ORDER = (
    "lerp",
    "minmax-weight",
    "minmax-prob",
    "fwm-weight",
    "fwm-prob",
    "resolved-weight",
    "resolved-prob",
)


def operator_order(name: str) -> tuple:
    """Sort key of an operator (``lerp-k16``) or family (``fwm-prob[arithmetic=historical]``) name, the order
    of every table: the operators without overrides first, then each set of overrides (``range_grad``,
    ``arithmetic``...); within them the family in the paper's order and K ascending (K4 before K16)."""
    base, _, mods = name.partition("[")
    m = re.fullmatch(r"(.+)-k(\d+)", base)
    family, K = (m.group(1), int(m.group(2))) if m else (base, 0)
    if base in ("softmax", "sdpa"):
        rank = 0
    elif family in FAMILY_ORDER:
        rank = 2 + FAMILY_ORDER.index(family)
    else:
        rank = 1 if m is None else 2 + len(FAMILY_ORDER)  # a baseline (no K); an unknown family with a K
    return (bool(mods), rank, mods, K, name)


def key_order(k: Key) -> tuple:
    """Sort key of a condition: its setting, :func:`operator_order`, then a supplementary row's seed."""
    return (k.setting(), operator_order(k.operator), k.seed is not None, k.seed or 0)


def _sort_key(r: Row):
    k = r.key
    if k is None:
        return ((0, "", "", ""), operator_order(r.contrast), (), r.seeds, r.tokens)
    return (k.setting(), operator_order(k.operator), k.seed is not None, k.seed or 0, r.seeds, r.tokens)


def apply_bh(rows: list[Row], family=lambda r: (r.key.setting(), r.design)) -> None:
    """BH q over the rows of each family that have a p. The default family is the paper's: the conditions of
    one token budget, data and evaluation tag (corpus and forward mode) of one design, the seeds the suite
    planned for them (suite D's 25 conditions; suite A's 14 per corpus and mode): a condition whose run of
    one seed crashed or is missing at the endpoint stays in its family, and a supplementary single-seed run
    (planned on other seeds) does not join it. See :func:`design_of`."""
    fam: dict = defaultdict(list)
    for r in rows:
        if r.est.p is not None:
            fam[family(r)].append(r)
    for rs in fam.values():
        for r, q in zip(rs, bh_q([r.est.p for r in rs])):
            r.q = float(q)


def _endpoint_groups(pairing: Pairing, what: str) -> dict[Key, list[Pair]]:
    """key -> its pairs at the key's endpoint (:func:`at_endpoint`); runs without a pair there are added to
    ``pairing.unpaired``."""
    groups: dict[Key, list[Pair]] = defaultdict(list)
    for x in pairing.pairs:
        groups[x.point.key].append(x)
    out = {k: at_endpoint(ps, what, pairing.unpaired, lambda x: x.point) for k, ps in groups.items()}
    return {k: ps for k, ps in out.items() if ps}


def delta_table(pairing: Pairing) -> list[Row]:
    """Endpoint ΔNLL vs same-seed softmax, one row per key, every seed at the key's endpoint (runs without an
    evaluation there go to ``pairing.unpaired``): a designed condition pools its seeds (tab:seedend), a
    supplementary run is one row per seed (tab:detachrep, tab:lowprec); BH q across the conditions of each
    setting."""
    groups = _endpoint_groups(pairing, "ΔNLL vs softmax")
    rows = [_row_from_pairs(f"{k.operator} − softmax", ps) for k, ps in groups.items()]
    rows.sort(key=_sort_key)
    apply_bh(rows)
    return rows


@dataclass
class ReferenceRow:
    """The exact-softmax control of a setting (the first row of tab:seedend and tab:endpoints): its mean NLL
    over seeds at its endpoint and the seed SD; ``key.seed`` set for the row of one seed."""

    key: Key
    seeds: tuple[int, ...]
    tokens: int
    nll: float
    nll_sd: float | None  # several seeds
    per_seed: tuple[float, ...]


def softmax_rows(points: list[Point], seeds: dict[tuple, set[int]] | None = None) -> list[ReferenceRow]:
    """The reference runs (softmax, sdpa) of each key at its endpoint (:func:`at_endpoint`; a run stopped
    early is left out, as in the ΔNLL rows). ``seeds``: setting -> seeds gives instead one row per seed for
    those seeds only (the controls of :func:`seed_references`)."""
    groups: dict[Key, list[Point]] = defaultdict(list)
    for p in points:
        if not (p.primary and p.is_reference):
            continue
        if seeds is None:
            groups[p.key].append(p)
        elif p.seed in seeds.get(p.key.setting(), ()):
            groups[replace(p.key, seed=p.seed)].append(p)
    rows = []
    for k, ps in groups.items():
        ps = sorted(at_endpoint(ps, "the softmax reference", {}), key=lambda p: p.seed)
        nll = tuple(p.mean for p in ps)
        sd = float(np.std(nll, ddof=1)) if len(nll) > 1 else None
        rows.append(ReferenceRow(k, tuple(p.seed for p in ps), ps[0].tokens, float(np.mean(nll)), sd, nll))
    return sorted(rows, key=lambda r: (r.key.setting(), r.key.operator, r.seeds))


def seed_references(pairing: Pairing) -> list[Row]:
    """The same-seed references of the supplementary runs: at each seed and setting where a per-seed run
    (:attr:`Point.per_seed`) is paired, every designed condition's ΔNLL vs softmax at that one seed, a block
    bootstrap row at the condition's endpoint (tab:detach "full-gradient − softmax" at seed 1337,
    tab:lowprec's seed-7 LERP and MinMax rows, tab:taildecomp's seed-1337 MinMax and FWM). The designed rows
    themselves pool their seeds (:func:`delta_table`); a run left out here is listed there."""
    wanted = {(x.point.key.setting(), x.point.seed) for x in pairing.pairs if x.point.per_seed}
    groups: dict[Key, list[Pair]] = defaultdict(list)
    for x in pairing.pairs:
        p = x.point
        if not p.per_seed and (p.key.setting(), p.seed) in wanted:
            groups[replace(p.key, seed=p.seed)].append(x)
    rows = []
    for k, ps in groups.items():
        kept = at_endpoint(ps, "the same-seed references", {}, lambda x: x.point)
        if kept:
            rows.append(_row_from_pairs(f"{k.operator} − softmax", kept, key=k))
    return sorted(rows, key=_sort_key)


def trajectories(pairing: Pairing) -> dict[Key, list[Row]]:
    """key -> one row per evaluated checkpoint (the same rule at every checkpoint)."""
    acc: dict[Key, dict[int, list[Pair]]] = defaultdict(lambda: defaultdict(list))
    for x in pairing.pairs:
        acc[x.point.key][x.point.tokens].append(x)
    return {
        k: [_row_from_pairs(f"{k.operator} − {by_t[t][0].control.operator}", by_t[t]) for t in sorted(by_t)]
        for k, by_t in acc.items()
    }


def _cells(points: list[Point], unpaired: dict[str, str] | None) -> dict[tuple, dict[str, dict[int, Point]]]:
    """Endpoint factorial cells: (setting, lineage, K, arithmetic, range_grad, FWM tau) -> cell -> seed ->
    point, for every design with at least two cells (a simple effect; the main effects need all four).

    The lineage is ``Key.seed``: None for a designed seed set, the seed for a supplementary run. The FWM
    cells carry their own tau (from the spec); MinMax has no tau and joins every FWM tau, or, with no FWM cell
    at its K, makes a MinMax-only design (tau None). The cells of a design are taken at one endpoint
    (:func:`at_endpoint`); a run without it goes to ``unpaired``.
    """
    raw: dict[tuple, dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        s = p.spec
        if s.reconstruction != "nearest" or s.calibration not in ("minmax", "fwm"):
            continue
        cell = next(c for c, cs in FACTORIAL.items() if cs == (s.calibration, s.surrogate))
        tau = s.tau if s.calibration == "fwm" else None
        raw[(p.key.setting(), p.key.seed, s.K, s.arithmetic, s.range_grad, tau)][cell].append(p)
    with_fwm = {k[:-1] for k in raw if k[-1] is not None}
    out = {}
    for (*where, tau), cells in raw.items():
        if tau is None and tuple(where) in with_fwm:
            continue  # MinMax joins the FWM designs of its K
        design = {**raw.get((*where, None), {}), **cells}
        if len(design) < 2:
            continue
        K, arith, rg = where[2:]
        what = f"factorial K{K} ({_design_name(arith, rg, tau)})"
        kept = {id(p) for p in at_endpoint([p for ps in design.values() for p in ps], what, unpaired)}
        out[(*where, tau)] = {c: {p.seed: p for p in ps if id(p) in kept} for c, ps in design.items()}
    return out


def _design_name(arith: str, rg: str, tau) -> str:
    return f"arithmetic={arith}, range_grad={rg}" + ("" if tau is None else f", tau={tau:g}")


SIMPLE_EFFECTS = {
    "Prob − Weight under MinMax": {"mm_p": 1.0, "mm_w": -1.0},
    "Prob − Weight under FWM": {"fwm_p": 1.0, "fwm_w": -1.0},
    "FWM − MinMax under Weight-STE": {"fwm_w": 1.0, "mm_w": -1.0},
    "FWM − MinMax under Prob-STE": {"fwm_p": 1.0, "mm_p": -1.0},
}
VS_LERP = {"mm_w": "MinMax–Weight", "fwm_w": "FWM–Weight", "fwm_p": "FWM–Prob"}


def factorial_effects(points: list[Point], unpaired: dict[str, str] | None = None) -> list[Row]:
    """The 2x2 calibration x surrogate factorial (App. C.3, Table 3 / tab:crossfull / tab:seedfact), per seed
    and block: per K the main effects and interaction (±1/2 weights) where all four cells exist, each simple
    effect wherever its two cells exist (suites A and C have FWM − MinMax under Weight-STE at K16 without the
    Prob-STE cells) and the ΔNLL-vs-LERP contrasts (cell − LERP at the same K and seed); over K the pooled row
    (each effect averaged over K) and the K× rows (effect at K minus effect at the smallest K).

    Every value is at the design's endpoint, the largest training-token count its cells reached; a run
    without an evaluation there (a cell, or the LERP run of a seed) is listed in ``unpaired`` (run ->
    reason), or raises ``ValueError`` when ``unpaired`` is None."""
    lerp: dict[tuple, dict[int, Point]] = defaultdict(dict)  # (setting, K, seed) -> tokens -> point
    for p in points:
        if p.operator == f"lerp-k{p.K}":
            lerp[(p.key.setting(), p.K, p.seed)][p.tokens] = p
    rows: list[Row] = []
    by_design: dict[tuple, dict[int, dict[str, dict[int, np.ndarray]]]] = defaultdict(dict)
    cells_by_design = _cells(points, unpaired)
    for (setting, lineage, K, arith, rg, tau), cells in sorted(
        cells_by_design.items(), key=lambda kv: str(kv[0])
    ):
        cells = {c: v for c, v in cells.items() if v}
        if not cells:
            continue

        def common(cs, cells=cells) -> list[int]:
            """The seeds every cell of ``cs`` has, with one block count."""
            seeds = sorted(set.intersection(*(set(cells[c]) for c in cs)))
            return [s for s in seeds if len({cells[c][s].nll.size for c in cs}) == 1]

        full = common(FACTORIAL) if set(cells) == set(FACTORIAL) else []
        design = _design_name(arith, rg, tau)
        tokens = next(iter(next(iter(cells.values())).values())).tokens

        def row(name, per_seed, K=K, setting=setting, lineage=lineage, design=design, tokens=tokens):
            return Row(
                contrast=name,
                key=Key(f"factorial K{K}", *setting, seed=lineage),
                seeds=tuple(sorted(per_seed)),
                est=estimate(per_seed, f"factorial {name} K{K} ({design}, {tokens} tokens)"),
                K=K,
                family=design,
                tokens=tokens,
            )

        effects = {}
        for name, w in {**FACTORIAL_WEIGHTS, **SIMPLE_EFFECTS}.items():
            if full:
                seeds = full
            elif name in SIMPLE_EFFECTS and set(w) <= set(cells):
                seeds = common(w)  # a simple effect needs its two cells only
            else:
                continue  # the main effects and interaction need all four
            if seeds:
                effects[name] = {s: sum(a * cells[c][s].nll for c, a in w.items()) for s in seeds}
                rows.append(row(name, effects[name]))
        ref = {}  # seed -> the LERP run at the design's endpoint
        for s in full or sorted(set().union(*cells.values())):
            by_tokens = lerp.get((setting, K, s), {})
            if tokens in by_tokens:
                ref[s] = by_tokens[tokens]
            elif by_tokens:
                last = by_tokens[max(by_tokens)]
                _left_out(
                    unpaired,
                    f"{last.run_id} [{last.tag}] in factorial K{K} − LERP ({design})",
                    f"no evaluation at the endpoint ({tokens} training tokens); its last is at {last.tokens}",
                )
        for c, label in VS_LERP.items():
            per_seed = {
                s: cells[c][s].nll - ref[s].nll
                for s in (full or cells.get(c, {}))
                if s in ref and ref[s].nll.size == cells[c][s].nll.size
            }
            if per_seed:
                rows.append(row(f"{label} K{K} − LERP K{K}", per_seed))
        if full:
            by_design[(setting, lineage, design, tokens)][K] = {e: effects[e] for e in FACTORIAL_WEIGHTS}
    for (setting, lineage, design, tokens), by_K in by_design.items():
        if len(by_K) < 2:
            continue
        Ks = sorted(by_K)
        for effect in FACTORIAL_WEIGHTS:
            seeds = sorted(set.intersection(*(set(by_K[K][effect]) for K in Ks)))
            if not seeds:
                continue
            pooled = {s: np.mean([by_K[K][effect][s] for K in Ks], axis=0) for s in seeds}
            rows.append(
                Row(
                    effect,
                    Key("factorial, pooled over K", *setting, seed=lineage),
                    tuple(seeds),
                    estimate(pooled),
                    K=None,
                    family=design,
                    tokens=tokens,
                    note=",".join(map(str, Ks)),
                )
            )
            if effect == "interaction":
                continue
            for K in Ks[1:]:
                diff = {s: by_K[K][effect][s] - by_K[Ks[0]][effect][s] for s in seeds}
                rows.append(
                    Row(
                        f"K×{effect} (K{K} − K{Ks[0]})",
                        Key("factorial, K×", *setting, seed=lineage),
                        tuple(seeds),
                        estimate(diff),
                        K=K,
                        family=design,
                        tokens=tokens,
                    )
                )

    def order(r: Row):
        kind = 2 if "K×" in r.key.operator else 1 if "pooled" in r.key.operator else 0
        return (str(r.key.setting()), str(r.key.seed), r.family, kind, r.K or 0)

    rows.sort(key=order)  # stable: the effects keep their order within a K
    return rows


def k_trends(pairing: Pairing) -> list[Row]:
    """Slope of ΔNLL against log2 K per family (nats per doubling of K) at the family's endpoint (runs without
    a pair there go to ``pairing.unpaired``): a per-block contrast with weights
    ``(x_k - mean x) / sum (x - mean x)^2``, ``x = log2 K``, fitted per seed (a supplementary run's seed its
    own row, ``Key.seed``)."""
    by_family: dict[tuple, list[Pair]] = defaultdict(list)
    for x in pairing.pairs:
        if x.point.K is not None:
            by_family[(x.point.key.setting(), x.point.key.seed, x.point.family)].append(x)
    fam: dict[tuple, dict[int, dict[int, Pair]]] = defaultdict(lambda: defaultdict(dict))
    ends: dict[tuple, int] = {}
    for where, pairs in by_family.items():
        for x in at_endpoint(pairs, f"K trend of {where[-1]}", pairing.unpaired, lambda x: x.point):
            fam[where][x.point.seed][x.point.K] = x
            ends[where] = x.point.tokens
    rows = []
    by_order = sorted(fam.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), operator_order(kv[0][2])))
    for (setting, lineage, family), all_seeds in by_order:
        # The K values of the seed with the most of them (the lowest such seed on a tie), and every seed
        # that has them all: extra seeds of one K alone (e.g. a second folder adding seeds to K = 32 only)
        # must not shrink the fit to fewer than two K values.
        widest = max(sorted(all_seeds), key=lambda s: len(all_seeds[s]))
        Ks = sorted(all_seeds[widest])
        if len(Ks) < 2:
            continue
        by_seed = {s: v for s, v in all_seeds.items() if set(Ks) <= set(v)}
        xc = np.log2(Ks) - np.log2(Ks).mean()
        c = xc / (xc @ xc)
        per_seed = {s: sum(ck * by_seed[s][k].d for ck, k in zip(c, Ks)) for s in by_seed}
        rows.append(
            Row(
                contrast="slope vs log2 K",
                key=Key(family, *setting, seed=lineage),
                seeds=tuple(sorted(per_seed)),
                est=estimate(per_seed, f"K trend of {family} ({ends[(setting, lineage, family)]} tokens)"),
                tokens=ends[(setting, lineage, family)],
                family=family,
                note=",".join(map(str, Ks)),
            )
        )
    return rows


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


def condition(k: Key) -> str:
    """A row's condition: its operator, and the seed of a supplementary run's row."""
    return k.operator if k.seed is None else f"{k.operator}, seed {k.seed}"


def cross_setting(rows: list[Row]) -> tuple[list[tuple], dict[str, dict[tuple, Row]]]:
    """The settings (budget, data, tag, model) of ``rows`` and condition (:func:`condition`) -> setting ->
    row: a cross-suite table (tab:cross, tab:crossfull: suites C and D are two settings, one per model)."""
    settings = sorted({r.key.setting() for r in rows})
    table: dict[str, dict[tuple, Row]] = defaultdict(dict)
    for r in rows:
        table[condition(r.key)][r.key.setting()] = r
    order = {condition(r.key): key_order(r.key)[1:] for r in rows}
    return settings, dict(sorted(table.items(), key=lambda kv: order[kv[0]]))


def final_geometry(
    points: list[Point], unpaired: dict[str, str] | None = None
) -> dict[Key, dict[str, float]]:
    """Layer-mean geometry at each key's endpoint, averaged over seeds (finite values only): the paper's
    "averaged over layers and seeds at the 100M endpoint". Every seed is at one checkpoint
    (:func:`at_endpoint`, the largest training-token count the key's geometry probes reached, as in the ΔNLL
    rows it is set against); a run whose last probe is earlier is left out and listed in ``unpaired``
    (``ValueError`` when None)."""
    by_key: dict[Key, list[Point]] = defaultdict(list)
    for p in points:
        if p.primary and p.geometry:
            by_key[p.key].append(p)
    acc = {k: [p.geometry for p in at_endpoint(ps, "geometry", unpaired)] for k, ps in by_key.items()}
    out = {}
    for k, gs in acc.items():
        vals = {m: [g[m] for g in gs if g.get(m) is not None and np.isfinite(g[m])] for m in gs[0]}
        out[k] = {m: float(np.mean(v)) for m, v in vals.items() if v}
    return out


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


def ranked_rows(delta: list[Row]) -> dict[tuple, list[Row]]:
    """Setting -> the ΔNLL rows its rank statistics (and fig:widthgap) use: the conditions run on the
    setting's most common seed set of several seeds (suite D's five seeds, not a supplementary single-seed
    run evaluated on the same data), or every row of a setting with no row of several seeds."""
    by_setting: dict[tuple, list[Row]] = defaultdict(list)
    for r in delta:
        by_setting[r.key.setting()].append(r)
    out = {}
    for setting, rows in sorted(by_setting.items(), key=str):
        sets = [r.seeds for r in rows if len(r.seeds) >= 2]
        if sets:
            seeds = max(sorted(set(sets)), key=sets.count)
            rows = [r for r in rows if r.seeds == seeds]
        out[setting] = rows
    return out


def rank_statistics(delta: list[Row], geometry: dict[Key, dict[str, float]]) -> list[RankStats]:
    """Per setting: Kendall's W and pairwise Spearman over the seeds every condition has, and Spearman of the
    condition-mean ΔNLL against final h and span (conditions with geometry)."""
    from kinterval.stats import kendall_w, pairwise_spearman, spearman

    out = []
    for setting, rows in ranked_rows(delta).items():
        seeds = list(rows[0].seeds) if len(rows[0].seeds) >= 2 else []
        w, pw = None, ()
        if len(seeds) >= 2 and len(rows) >= 3:
            scores = np.array([[r.est.per_seed[r.seeds.index(s)] for r in rows] for s in seeds])
            w, pw = kendall_w(scores), tuple(float(x) for x in pairwise_spearman(scores))

        def assoc(metric, rows=rows):
            pts = [(geometry[r.key][metric], r.est.mean) for r in rows if metric in geometry.get(r.key, {})]
            if len(pts) < 3 or len({x for x, _ in pts}) < 2:
                return None
            res = spearman([x for x, _ in pts], [y for _, y in pts])
            return (res.rho, res.p)

        out.append(
            RankStats(
                setting, tuple(seeds), tuple(r.key.operator for r in rows), w, pw, assoc("h"), assoc("span")
            )
        )
    return out


# The trailing window of the clip statistics: the paper's "98% of steps clipped over the last 1.5B tokens" of
# a 2.5B-token run (App. D), the last 60% of the training tokens
CLIP_TAIL = 0.6


@dataclass
class ClipRow:
    """Gradient-clipping and gradient-norm statistics of training (from ``metrics.jsonl``), per condition:
    the fraction of all steps whose gradient norm was clipped (mean over seeds, and per seed), and per seed
    the clipped fraction of the logged steps in the last ``CLIP_TAIL`` of the training tokens, the final and
    the largest logged pre-clip gradient norm and the largest train-loss rise between consecutive logs (§5:
    "45% of steps clipped"; App. D: "98% of steps clipped over the last 1.5B tokens", "single-step gradient
    norms of 10^4", "final pre-clip gradient norms", "largest train-loss increase between consecutive logs";
    App. F: "final logged gradient norms"). None: not logged."""

    key: Key
    seeds: tuple[int, ...]
    mean: float
    per_seed: tuple[float, ...]
    tail: tuple[float | None, ...] = ()
    final_norm: tuple[float | None, ...] = ()
    max_norm: tuple[float | None, ...] = ()
    max_loss_rise: tuple[float | None, ...] = ()


def _run_clip_stats(rows: list[dict]) -> dict:
    """One run's statistics from its training rows (those with ``clipped_frac``), in step order."""
    norms = [float(r["grad_norm"]) for r in rows if r.get("grad_norm") is not None]
    budget = max((r.get("tokens", 0) for r in rows), default=0)
    tail = [r["clipped"] for r in rows if "clipped" in r and r.get("tokens", 0) > (1 - CLIP_TAIL) * budget]
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    rises = [b - a for a, b in zip(losses, losses[1:])]
    return dict(
        frac=float(rows[-1]["clipped_frac"]),
        tail=float(np.mean(tail)) if tail else None,
        final_norm=norms[-1] if norms else None,
        max_norm=max(norms) if norms else None,
        max_loss_rise=max(rises) if rises else None,
    )


def clip_fractions(points: list[Point], logs: dict[tuple, list[dict]]) -> list[ClipRow]:
    """``logs``: (suite, run_id) -> metrics rows. The whole-run fraction is the last logged ``clipped_frac``
    of each run: the fraction of all its steps since step 0 whose gradient norm was clipped, kept across
    resumes (the trainer stores the count in each checkpoint; resumed from a checkpoint older than that
    count: the steps since then). The other statistics read the logged rows, one per ``log.every`` steps."""
    acc: dict[Key, dict[int, dict]] = defaultdict(dict)
    for p in final([p for p in points if p.primary]):
        rows = [r for r in logs.get((p.suite, p.run_id), []) if "clipped_frac" in r]
        if rows:
            acc[p.key][p.seed] = _run_clip_stats(sorted(rows, key=lambda r: r.get("step", 0)))
    out = []
    for k, v in sorted(acc.items(), key=lambda kv: key_order(kv[0])):
        seeds = tuple(sorted(v))
        # per seed, in ClipRow's field order: per_seed (frac), tail, final_norm, max_norm, max_loss_rise
        per = {name: tuple(v[s][name] for s in seeds) for name in next(iter(v.values()))}
        out.append(ClipRow(k, seeds, float(np.mean(per["frac"])), *per.values()))
    return out


GRAD_TERMS = DECOMP  # the terms `kinterval graddiag` writes


@dataclass
class GradDecompRow:
    """tab:graddecomp: the fixed-upstream decomposition of the score gradient at one checkpoint of one run
    (``kinterval graddiag``), layer means: norm ratios of the self / M / m terms to g_full, the relative error
    of each modified backward, and the zero-sum residual of the implemented score gradient."""

    suite: str
    run_id: str
    operator: str
    seed: int
    step: int
    tokens: int
    n_blocks: int
    terms: dict[str, float]  # GRAD_TERMS -> layer mean (absent when graddiag ran without the decomposition)
    zero_sum_residual: float
    rows_above_1e_3: float


def gradient_decomposition(results) -> list[GradDecompRow]:
    """One row per (run, checkpoint) with a ``kinterval graddiag`` output, by (operator, seed, tokens)."""
    rows = []
    for res in results:
        entry = {r["run_id"]: r for r in res.manifest["runs"]}
        for run_id, diags in res.graddiag.items():
            op, seed = entry[run_id]["operator"], int(entry[run_id]["seed"])
            for d in diags:
                m = d.get("mean")
                where = (int(d["step"]), int(d.get("tokens", 0)), int(d.get("n_blocks", 0)))
                missing = [
                    k
                    for k in ("zero_sum_residual", "rows_above_1e-3")
                    if not isinstance(m, dict) or k not in m
                ]
                if missing:
                    folder = res.dir / entry[run_id]["run_dir"] / "diagnostics" / "graddiag"
                    raise ValueError(
                        f"{folder}: the output of step {where[0]} has no {', '.join(map(repr, missing))} in "
                        "'mean'; rerun `kinterval graddiag` on that checkpoint"
                    )
                terms = {k: float(m[k]) for k in GRAD_TERMS if k in m}
                residual = (float(m["zero_sum_residual"]), float(m["rows_above_1e-3"]))
                rows.append(GradDecompRow(res.suite, run_id, op, seed, *where, terms, *residual))
    return sorted(rows, key=lambda x: (x.operator, x.seed, x.tokens, x.suite))


def _heldout_groups(points: list[Point], unpaired: dict[str, str] | None) -> dict[Key, list[Pair]]:
    """Held-out key -> its pairs with the same-seed softmax evaluated the same way, at the key's endpoint."""
    others = [p for p in points if not p.primary]
    if not others:
        return {}
    refs = [p for p in points if p.is_reference]
    pairing = softmax_pairs(others + [p for p in refs if p.primary] + [p for p in refs if not p.primary])
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
    from kinterval.stats import cluster_bootstrap_ci

    groups = _heldout_groups(points, unpaired)
    if not groups:
        return []
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
            d = a["doc_nll"] / a["doc_tokens"] - b["doc_nll"] / b["doc_tokens"]
            c = cluster_bootstrap_ci(d, a["doc_ids"], weights=a["doc_tokens"], n_resamples=N_RESAMPLES)
            r.est = Estimate(c.mean, c.lo, c.hi, "document-cluster bootstrap", 1, (c.mean,), c.se, p=c.p)
        rows.append(r)
    rows.sort(key=_sort_key)
    apply_bh(rows)
    # tab:subst "diff": the same weights through exact softmax minus their native forward, per block and seed
    # (tab:strictaudit, tab:rounding: the same frozen checkpoint under another arithmetic, with the largest
    # |Δ| of one block). The native evaluation is the run's own one with the tag without ``__op-``: a held-out
    # one (``test__ptb``) or, for the suite's own split (``val__op-...``), its primary evaluation.
    idx = _index(points)
    for k, ps in sorted(groups.items(), key=lambda kv: key_order(kv[0])):
        base = _control_tags(k.tag)[-1]
        native = {x.point.seed: idx.get((*x.point.identity, base, x.point.tokens)) for x in ps}
        per_seed = {
            x.point.seed: x.point.nll - native[x.point.seed].nll
            for x in ps
            if native[x.point.seed] is not None and native[x.point.seed].nll.size == x.point.nll.size
        }
        if base != k.tag and per_seed:
            seeds, tokens = tuple(sorted(per_seed)), ps[0].point.tokens
            r = Row("substituted − native forward", k, seeds, estimate(per_seed), tokens)
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


def path_ratio_ci(minmax, resolved, fwm, level: float = 0.95) -> tuple[float, float, float]:
    """The path ratio (MinMax − resolved) / (MinMax − FWM) of the mean NLLs with a percentile interval from
    the circular block bootstrap over validation blocks (4000 resamples, block ``stats.block_length(n)``:
    16, or ``n // 2`` below 32 blocks; evaluation sampling only).
    The three runs' per-block NLL are resampled together: numerator and denominator use the same block starts
    (the same generator seed and draw shapes). Resamples with a zero denominator are dropped. Returns
    (ratio, lo, hi); NaN where the denominator of the means is 0."""
    mm, res, fwm = (np.asarray(x, dtype=np.float64) for x in (minmax, resolved, fwm))
    if not (mm.shape == res.shape == fwm.shape) or mm.ndim != 1 or mm.size < 2:
        raise ValueError(
            f"path ratio needs three per-block series of one length >= 2, got {mm.shape}, "
            f"{res.shape}, {fwm.shape}"
        )
    gap = float(mm.mean() - fwm.mean())
    if gap == 0:
        return float("nan"), float("nan"), float("nan")
    block = block_length(mm.size)
    num = circular_block_means(mm - res, block, N_RESAMPLES, np.random.default_rng(0))
    den = circular_block_means(mm - fwm, block, N_RESAMPLES, np.random.default_rng(0))
    ok = den != 0
    lo, hi = np.quantile(num[ok] / den[ok], [(1 - level) / 2, (1 + level) / 2])
    return float(mm.mean() - res.mean()) / gap, float(lo), float(hi)


def tail_decomposition(points: list[Point], unpaired: dict[str, str] | None = None) -> list[Row]:
    """App. D.4 (tab:taildecomp): each resolved-calibration run against the same-seed MinMax and FWM runs of
    its surrogate, K, arithmetic and setting: each of the three − the same-seed softmax (where it was
    evaluated at their endpoint), MinMax − resolved (untruncated fixed-step calibration contrast) and
    resolved − FWM (tail-policy contrast), per block, one seed each (block bootstrap); the path ratio
    (MinMax − resolved) / (MinMax − FWM) of the means is in ``recovery``, its block-bootstrap interval
    (:func:`path_ratio_ci`) in ``recovery_lo``, ``recovery_hi``. The three runs are taken at their common
    endpoint; one without an evaluation there goes to ``unpaired`` (``ValueError`` when it is None)."""
    runs: dict[tuple, list[Point]] = defaultdict(list)  # every checkpoint of each run
    for p in points:
        s = p.spec
        if p.primary and s.reconstruction == "nearest" and s.calibration in ("minmax", "fwm", "resolved"):
            runs[
                (s.calibration, s.surrogate, s.K, s.arithmetic, s.range_grad, p.seed, p.key.setting())
            ].append(p)
    softmax = {(*p.identity, p.tag, p.tokens): p for p in points if p.primary and p.operator == "softmax"}
    rows = []

    def order(kv):  # setting, then Weight-STE before Prob-STE (tab:taildecomp), K ascending
        cal, sur, K, *_, seed, setting = kv[0]
        return (setting, sur != "weight", K or 0, str(kv[0]))

    for (cal, *rest), res_run in sorted(runs.items(), key=order):
        mm_run, fwm_run = runs.get(("minmax", *rest)), runs.get(("fwm", *rest))
        if cal != "resolved" or mm_run is None or fwm_run is None:
            continue
        kept = at_endpoint(res_run + mm_run + fwm_run, "the tail decomposition", unpaired)
        by_cal = {p.spec.calibration: p for p in kept}
        if len(by_cal) != 3:
            continue
        mm, res, fwm = by_cal["minmax"], by_cal["resolved"], by_cal["fwm"]
        if not (mm.nll.size == fwm.nll.size == res.nll.size):
            continue
        ratio, lo, hi = path_ratio_ci(mm.nll, res.nll, fwm.nll)
        soft = softmax.get((res.model, "softmax", res.seed, res.budget, res.data, res.tag, res.tokens))
        for name, p in (("MinMax", mm), ("FWM", fwm), ("resolved", res)):
            if soft is not None and soft.nll.size == p.nll.size:
                d = p.nll - soft.nll
                est = estimate({p.seed: d}, f"{p.run_id} − softmax ({p.tokens} tokens)")
                contrast = f"{name} − softmax ({res.spec.surrogate}-STE, K{res.K})"
                rows.append(Row(contrast, p.key, (p.seed,), est, p.tokens, p.K, p.family, nll=p.mean))
        for name, d in (("MinMax − resolved", mm.nll - res.nll), ("resolved − FWM", res.nll - fwm.nll)):
            rows.append(
                Row(
                    f"{name} ({res.spec.surrogate}-STE, K{res.K})",
                    res.key,
                    (res.seed,),
                    estimate({res.seed: d}, f"{name} of {res.run_id} ({res.tokens} tokens)"),
                    tokens=res.tokens,
                    K=res.K,
                    family=res.family,
                    recovery=ratio if np.isfinite(ratio) else None,
                    recovery_lo=lo if np.isfinite(lo) else None,
                    recovery_hi=hi if np.isfinite(hi) else None,
                )
            )
    return rows


@dataclass
class ValidationPair:
    """Logged validation rows (``"event": "validation"`` of metrics.jsonl) of a modified-backward run and its
    same-seed full-gradient twin at the training tokens both logged (fig:detach a, b; fig:detachextra)."""

    key: Key  # the modified run's condition
    control: str  # the full-gradient twin's operator
    seed: int
    tokens: list[int]
    val_loss: list[float]
    control_val_loss: list[float]
    row_span: list[float]
    control_row_span: list[float]

    @property
    def diff(self) -> list[float]:
        """Validation loss, modified − full, at each logged token count."""
        return [a - b for a, b in zip(self.val_loss, self.control_val_loss)]


def _validation_rows(rows: list[dict]) -> dict[int, dict]:
    return {int(r["tokens"]): r for r in rows if r.get("event") == "validation" and "val_loss" in r}


def validation_pairs(pairing: Pairing, logs: dict[tuple, list[dict]]) -> tuple[list[ValidationPair], dict]:
    """The logged validation trajectories of each pair of ``pairing`` (``detach_pairs``' pairing: modified
    run -> same-seed full twin); ``logs``: (suite, run_id) -> metrics rows. Returns the pairs and the runs
    skipped (run -> reason): either run without validation rows, or no token count logged by both."""
    out, skipped = [], {}
    for x in sorted(final(pairing.pairs, lambda x: x.point), key=lambda x: (x.point.run_id, x.point.tag)):
        if not x.point.primary:
            continue
        run_id = x.point.run_id
        own = _validation_rows(logs.get((x.point.suite, x.point.run_id), []))
        ctrl = _validation_rows(logs.get((x.control.suite, x.control.run_id), []))
        name = f"{run_id} vs {x.control.run_id}"
        if not own or not ctrl:
            skipped[name] = (
                f"no validation rows in metrics.jsonl of {run_id if not own else x.control.run_id}"
            )
            continue
        ts = sorted(set(own) & set(ctrl))
        if not ts:
            skipped[name] = "no training-token count logged by both runs"
            continue
        out.append(
            ValidationPair(
                x.point.key,
                x.control.operator,
                x.point.seed,
                ts,
                [float(own[t]["val_loss"]) for t in ts],
                [float(ctrl[t]["val_loss"]) for t in ts],
                [float(own[t].get("row_span", float("nan"))) for t in ts],
                [float(ctrl[t].get("row_span", float("nan"))) for t in ts],
            )
        )
    return out, skipped


def factorial_cells(rows: list[Row]) -> dict[tuple, dict[int, dict[str, Row]]]:
    """fig:2x2: the endpoint ΔNLL-vs-softmax rows (``delta_table``) of the four factorial cells (``mm_w``,
    ``mm_p``, ``fwm_w``, ``fwm_p``) per (setting, arithmetic) and K, for the K with all four cells, and the
    LERP row of that setting and K (``lerp``, any arithmetic) where there is one. Only full-gradient runs with
    no override besides the arithmetic enter, and only designed rows (a supplementary run's row of one seed is
    not a factorial design)."""
    cells: dict[tuple, dict[int, dict[str, Row]]] = defaultdict(lambda: defaultdict(dict))
    lerp: dict[tuple, Row] = {}
    for r in rows:
        op = r.key.operator
        if op in ("softmax", "sdpa") or r.key.seed is not None:
            continue
        s = _spec(op)
        if s.K is None or OperatorSpec.parse(op.partition("[")[0], arithmetic=s.arithmetic) != s:
            continue
        if s.reconstruction == "lerp":
            lerp[(r.key.setting(), s.K)] = r
            continue
        cell = next((c for c, cs in FACTORIAL.items() if cs == (s.calibration, s.surrogate)), None)
        if cell is not None:
            cells[(r.key.setting(), s.arithmetic)][s.K][cell] = r
    out = {}
    for (setting, arith), by_K in sorted(cells.items(), key=str):
        full = {K: dict(cs) for K, cs in sorted(by_K.items()) if set(cs) == set(FACTORIAL)}
        for K, cs in full.items():
            if (setting, K) in lerp:
                cs["lerp"] = lerp[(setting, K)]
        if full:
            out[(setting, arith)] = full
    return out


SURROGATE_EFFECTS = {"MinMax": "Prob − Weight under MinMax", "FWM": "Prob − Weight under FWM"}


def surrogate_effects(fac: list[Row], cells: dict[int, dict[str, Row]]) -> dict[str, dict[int, Row]]:
    """fig:2x2 (d): the surrogate effect Prob − Weight against K under each calibration (``MinMax``,
    ``FWM``), paired by seed: the simple-effect rows of :func:`factorial_effects` (``fac``) of the design
    whose cells are ``cells`` (one (setting, arithmetic) entry of :func:`factorial_cells`: its setting,
    arithmetic and FWM tau, full gradient, the designed seed set). A K with no such row is absent."""
    any_cell = next(iter(next(iter(cells.values())).values()))
    fwm = _spec(next(cs["fwm_w"] for cs in cells.values()).key.operator)
    design = _design_name(fwm.arithmetic, "full", fwm.tau)
    out: dict[str, dict[int, Row]] = {}
    for cal, name in SURROGATE_EFFECTS.items():
        by_K = {
            r.K: r
            for r in fac
            if r.contrast == name
            and r.K is not None
            and r.key.operator == f"factorial K{r.K}"
            and r.key.seed is None
            and r.key.setting() == any_cell.key.setting()
            and r.family == design
        }
        if by_K:
            out[cal] = dict(sorted(by_K.items()))
    return out


@dataclass
class KPanels:
    """fig:k for one setting: (a) each designed full-gradient condition's endpoint ΔNLL vs softmax by family
    and K, at the K measured only; (b) the K = ``K`` conditions' ΔNLL vs softmax along training; (c) each
    Nearest condition at K = ``K`` minus the same-seed LERP at that K along training. ``not_run``: panel
    letter -> why it has nothing to show (its runs are absent)."""

    setting: tuple
    K: int
    final: dict[str, dict[int, Row]]  # (a) family -> K -> endpoint row
    gap: dict[str, list[Row]]  # (b) operator -> one row per checkpoint
    vs_lerp: dict[str, list[Row]]  # (c) operator -> one row per checkpoint (operator − lerp-kK)
    not_run: dict[str, str] = field(default_factory=dict)


def _designed_full(k: Key) -> bool:
    """A designed (not supplementary per-seed) full-gradient condition with a K."""
    return k.seed is None and _spec(k.operator).K is not None and full_twin(k.operator) is None


def k_panels(points: list[Point], delta: list[Row], traj: dict[Key, list[Row]], K: int = 4) -> KPanels | None:
    """fig:k (124M @ 2.5B in the paper) for the longest-horizon setting among the designed full-gradient
    conditions with a K in ``delta`` (:func:`delta_table`; a tie: the setting with more of them): (a) their
    endpoint rows, (b) the K = ``K`` rows of ``traj`` (:func:`trajectories` of the softmax pairing), (c) each
    Nearest condition at K with no override besides the arithmetic minus the same-seed ``lerp-kK`` (the LERP
    reference of :func:`factorial_effects`) at every checkpoint both reached, per block, under the one rule
    (:func:`estimate`). None without such a setting."""
    rows = [r for r in delta if _designed_full(r.key)]
    if not rows:
        return None
    setting = max(
        {r.key.setting() for r in rows}, key=lambda s: (s[0], sum(r.key.setting() == s for r in rows))
    )
    final: dict[str, dict[int, Row]] = defaultdict(dict)
    for r in rows:
        if r.key.setting() == setting:
            final[r.family][r.K] = r
    final = {
        f: dict(sorted(v.items())) for f, v in sorted(final.items(), key=lambda kv: operator_order(kv[0]))
    }
    gap = {
        k.operator: v
        for k, v in sorted(traj.items(), key=lambda kv: key_order(kv[0]))
        if k.setting() == setting and _designed_full(k) and _spec(k.operator).K == K
    }
    lerp = f"lerp-k{K}"

    def control_of(op: str) -> str | None:
        s = _spec(op)
        plain = OperatorSpec.parse(op.partition("[")[0], arithmetic=s.arithmetic) == s
        return (
            lerp if s.K == K and s.reconstruction == "nearest" and s.range_grad == "full" and plain else None
        )

    here = [p for p in points if p.primary and p.key.setting() == setting and p.key.seed is None]
    pairing = pair_controls(here, control_of)
    vs_lerp = {
        k.operator: v for k, v in sorted(trajectories(pairing).items(), key=lambda kv: key_order(kv[0]))
    }
    not_run = {}
    if not gap:
        not_run["b"] = f"no K={K} condition"
    if not vs_lerp:
        nearest = sorted({p.operator for p in here if control_of(p.operator)})
        if not nearest:
            not_run["c"] = f"no Nearest condition at K={K}"
        elif not any(p.operator == lerp for p in here):
            not_run["c"] = f"no {lerp} run to pair with {', '.join(nearest)}"
        else:
            not_run["c"] = "; ".join(f"{run}: {why}" for run, why in pairing.unpaired.items())
    return KPanels(setting, K, final, gap, vs_lerp, not_run)


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
    from kinterval.eval.evaluate import safe_operator

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
