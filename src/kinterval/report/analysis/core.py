"""The one rule and the pairing (paper §4 "Statistics"): :class:`Estimate` and :func:`estimate`, each run
with its same-seed control, the endpoint of a row, the order of every table, BH q, and the ΔNLL-vs-softmax
rows (tab:seedend, tab:endpoints, tab:cross) with their references, trajectories and endpoint geometry."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from kinterval.ops import OperatorSpec
from kinterval.ops.catalog import FAMILY_FORMS
from kinterval.report.results import Key, Point
from kinterval.stats import (
    bh_q,
    block_bootstrap_ci,
    block_length,
    permutation_p_exact,
    permutation_p_random,
    seed_summary,
)
from kinterval.stats.seeds import MAX_EXACT_N

N_RESAMPLES = 4000
MARGIN = 0.01  # single-seed interpretation margin in nats (paper §4)


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
    series = []
    for s in sorted(per_seed):
        try:
            series.append(np.asarray(per_seed[s], dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"{what}, seed {s}: the per-block contrast is not numeric") from None
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


def designed_full(k: Key) -> bool:
    """A designed (not supplementary per-seed) full-gradient condition with a K: what the paper's
    cross-condition statistics range over (the grid of fig:k, fig:widthgap and Kendall's W)."""
    return k.seed is None and _spec(k.operator).K is not None and full_twin(k.operator) is None


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
            why = f"{ctrl_op} seed {p.seed} is another model or protocol ({models}, not {p.model})"
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


def at_endpoint(
    items, what: str, unpaired: dict[str, str] | None = None, run=lambda x: x, early: bool = False
) -> list:
    """The items (points, or pairs with ``run=lambda x: x.point``) of one row or contrast at its endpoint: the
    largest training-token count any of them reached (evaluated, or its last checkpoint: ``Point.reached``, so
    that a run trained to the end but not yet evaluated there does not move the row to an earlier
    checkpoint). Each run (model, operator, seed, budget, data, tag)
    without an item there is left out, so that a crashed run's earlier checkpoint never joins the endpoint,
    and is listed in ``unpaired`` as "RUN [tag] in WHAT" -> reason (``ValueError`` when ``unpaired`` is
    None). Where no run reached its budget (still training, or stopped), every run is left out, unless
    ``early``: then the row is at the largest count reached, which the caller names."""
    items = list(items)
    if not items:
        return []
    end = max(max(run(x).tokens, run(x).reached) for x in items)
    by_run: dict[tuple, list] = defaultdict(list)
    for x in items:
        p = run(x)
        by_run[(*p.identity, p.tag)].append(x)
    if not early and end < max(run(x).budget for x in items):
        # no run of the row trained to its budget (the tokens of its last planned checkpoint): still training,
        # or stopped; a table row at an earlier checkpoint would pass for the endpoint (``early``: the caller
        # names the tokens it is at, as a claim's "500 of 1000 tokens")
        for xs in by_run.values():
            p = max((run(x) for x in xs), key=lambda p: max(p.tokens, p.reached))
            why = (
                f"not trained to its endpoint: its last checkpoint is at {max(p.tokens, p.reached)} of "
                f"{p.budget} training tokens"
            )
            if p.stopped is not None:
                why = f"stopped by a non-finite loss at step {p.stopped[0]} ({p.stopped[1]} tokens); {why}"
            _left_out(unpaired, f"{p.run_id} [{p.tag}] in {what}", why)
        return []
    out = []
    for xs in by_run.values():
        hit = next((x for x in xs if run(x).tokens == end), None)
        if hit is not None:
            out.append(hit)
            continue
        last = max((run(x) for x in xs), key=lambda p: p.tokens)
        paired = "paired " if isinstance(xs[0], Pair) else ""
        # the same run evaluated at the endpoint on other blocks (e.g. a --max-blocks evaluation): say so
        other = sorted(
            {run(x).data[3] for x in items if run(x).tokens == end and _same_run(run(x), last)}
            - {last.data[3]}
        )
        on = f" on {last.data[3]} blocks" if other else ""
        why = (
            f"no {paired}evaluation{on} at the endpoint ({end} training tokens); its last is at {last.tokens}"
        )
        if other:
            why += f" (at the endpoint it is evaluated on {', '.join(map(str, other))} blocks)"
        if last.stopped is not None:
            why = f"stopped by a non-finite loss at step {last.stopped[0]} ({last.stopped[1]} tokens); {why}"
        _left_out(unpaired, f"{last.run_id} [{last.tag}] in {what}", why)
    return out


def _same_run(a, b) -> bool:
    """Whether two points are of one run and evaluation tag, on any evaluation data (``identity`` ends with
    the data)."""
    return a.identity[:-1] == b.identity[:-1] and a.tag == b.tag


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
# (no K), LERP (and its FWM / resolved calibrations), the four factorial cells, resolved calibration: the
# catalog's order, so that a family the catalog gains is never sorted as unknown.
FAMILY_ORDER = tuple(form.removesuffix("-k{K}") for form in FAMILY_FORMS)


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


def softmax_rows(
    points: list[Point], seeds: dict[tuple, set[int]] | None = None, unpaired: dict[str, str] | None = None
) -> list[ReferenceRow]:
    """The reference runs (softmax, sdpa) of each key at its endpoint (:func:`at_endpoint`; a run stopped
    early, or not evaluated at its last checkpoint, is left out, as in the ΔNLL rows, and listed in
    ``unpaired``; a key none of whose runs is left has no row). ``seeds``: setting -> seeds gives instead one
    row per seed for those seeds only (the controls of :func:`seed_references`)."""
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
        ps = sorted(at_endpoint(ps, "the softmax reference", {} if unpaired is None else unpaired),
                    key=lambda p: p.seed)  # fmt: skip
        if not ps:
            continue
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
    """key -> one row per evaluated checkpoint (the same rule at every checkpoint). A run of the line without
    a pair at some of its checkpoints is listed in ``pairing.unpaired`` (:func:`note_partial_line`)."""
    acc: dict[Key, dict[int, list[Pair]]] = defaultdict(lambda: defaultdict(list))
    for x in pairing.pairs:
        acc[x.point.key][x.point.tokens].append(x)
    for by_t in acc.values():
        note_partial_line({t: [x.point for x in xs] for t, xs in by_t.items()}, "the ΔNLL trajectory",
                          pairing.unpaired)  # fmt: skip
    return {
        k: [_row_from_pairs(f"{k.operator} − {by_t[t][0].control.operator}", by_t[t]) for t in sorted(by_t)]
        for k, by_t in acc.items()
    }


def note_partial_line(
    by_t: dict[int, list[Point]], what: str, unpaired: dict[str, str], item: str = "paired evaluation"
) -> None:
    """A figure line's point at a checkpoint is the mean over the seeds there: where one of the line's runs
    has no item at a checkpoint that others have, the point is of fewer seeds (a run that stopped early, or
    was not evaluated there). Each such run is listed in ``unpaired`` with the checkpoints it lacks."""
    runs = {p.seed: p for ps in by_t.values() for p in ps}
    for seed, p in sorted(runs.items()):
        missing = [t for t in sorted(by_t) if seed not in {q.seed for q in by_t[t]}]
        if missing:
            at = ", ".join(map(str, missing))
            unpaired[f"{p.run_id} [{p.tag}] in {what}"] = (
                f"no {item} at {at} training tokens: the line's point there is the mean of the other seeds"
            )


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


def geometry_groups(points: list[Point]) -> dict[Key, list[Point]]:
    """The primary evaluations with a geometry probe, by key; and, for a modified-backward run of one seed
    whose full-gradient twin has more seeds, the twin's run of that seed as a key of its own (``lerp-k32,
    seed 1337``): the paper sets a detach record against the full run of its own seed ("detached vs full",
    tab:e1's span, fig:e1 b, d), not against the mean over the twin's seeds."""
    by_key: dict[Key, list[Point]] = defaultdict(list)
    for p in points:
        if p.primary and p.geometry:
            by_key[p.key].append(p)
    for k, ps in list(by_key.items()):
        seeds, twin_op = {p.seed for p in ps}, full_twin(k.operator)
        if twin_op is None or len(seeds) != 1:
            continue
        twin = replace(k, operator=twin_op, seed=seeds.pop())
        pooled = by_key.get(replace(twin, seed=None), [])
        if twin not in by_key and {p.seed for p in pooled} != {twin.seed}:
            by_key[twin] = [p for p in pooled if p.seed == twin.seed]
    return {k: ps for k, ps in by_key.items() if ps}


def final_geometry(
    points: list[Point], unpaired: dict[str, str] | None = None
) -> dict[Key, dict[str, float]]:
    """Layer-mean geometry at each key's endpoint, averaged over seeds (finite values only): the paper's
    "averaged over layers and seeds at the 100M endpoint"; a supplementary modified-backward run's seed
    beside its same-seed full twin (:func:`geometry_groups`). Every seed is at one checkpoint
    (:func:`at_endpoint`, the largest training-token count the key's geometry probes reached, as in the ΔNLL
    rows it is set against); a run whose last probe is earlier is left out and listed in ``unpaired``
    (``ValueError`` when None)."""
    by_key = geometry_groups(points)
    acc = {k: [p.geometry for p in at_endpoint(ps, "geometry", unpaired)] for k, ps in by_key.items()}
    out = {}
    for k, gs in acc.items():
        if not gs:  # every seed left out (listed in unpaired): e.g. one seed, not evaluated at its last step
            continue
        vals = {m: [g[m] for g in gs if g.get(m) is not None and np.isfinite(g[m])] for m in gs[0]}
        out[k] = {m: float(np.mean(v)) for m, v in vals.items() if v}
    return out
