"""The calibration x surrogate factorial and K (App. C.3): factorial effects per K, pooled and K× rows
(tab:crossfull, tab:seedfact), K trends (tab:ktrend), the cells and surrogate effects of fig:2x2 and the
panels of fig:k."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kinterval.ops import OperatorSpec
from kinterval.ops.spec import DEFAULT_TAU
from kinterval.report.analysis.core import (
    Pair,
    Pairing,
    Row,
    _left_out,
    _spec,
    at_endpoint,
    designed_full,
    estimate,
    key_order,
    operator_order,
    pair_controls,
    trajectories,
)
from kinterval.report.results import Key, Point
from kinterval.stats import FACTORIAL_WEIGHTS, k_trend_weights

FACTORIAL = {
    "mm_w": ("minmax", "weight"),
    "mm_p": ("minmax", "prob"),
    "fwm_w": ("fwm", "weight"),
    "fwm_p": ("fwm", "prob"),
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


# The paper's factorial designs (``Row.family``): FWM at the default tau with the full gradient, in either
# arithmetic; a factorial at another tau or range_grad is another operator family
PAPER_DESIGNS = frozenset(_design_name(a, "full", DEFAULT_TAU) for a in ("strict", "historical"))


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
        if len({x.point.K for x in pairs}) < 2:
            continue  # one K has no trend: no row to leave a run out of
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
        c = k_trend_weights(Ks)
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


def k_panels(points: list[Point], delta: list[Row], traj: dict[Key, list[Row]], K: int = 4) -> KPanels | None:
    """fig:k (124M @ 2.5B in the paper) for the longest-horizon setting among the designed full-gradient
    conditions with a K in ``delta`` (:func:`delta_table`; a tie: the setting with more of them): (a) their
    endpoint rows, (b) the K = ``K`` rows of ``traj`` (:func:`trajectories` of the softmax pairing), (c) each
    Nearest condition at K with no override besides the arithmetic minus the same-seed ``lerp-kK`` (the LERP
    reference of :func:`factorial_effects`) at every checkpoint both reached, per block, under the one rule
    (:func:`estimate`). None without such a setting."""
    rows = [r for r in delta if designed_full(r.key)]
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
        if k.setting() == setting and designed_full(k) and _spec(k.operator).K == K
    }
    lerp = f"lerp-k{K}"

    def control_of(op: str) -> str | None:
        s = _spec(op)
        if s.K != K or s.reconstruction != "nearest" or s.range_grad != "full":
            return None  # (a reference such as sdpa included: it has no K)
        plain = OperatorSpec.parse(op.partition("[")[0], arithmetic=s.arithmetic) == s
        return lerp if plain else None

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
