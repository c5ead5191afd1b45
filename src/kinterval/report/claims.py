"""The paper's headline claims checked against a suite's results ("Paper claims" table, ``claims`` in
report.json).

Each claim names the contrast it tests, the paper's value with its source table, our estimate with its 95%
interval under the one rule (:func:`kinterval.report.analysis.estimate`), whether the direction agrees and
whether the difference is detectable (the interval excludes zero: App. C.3's "detectable", not the
"separated" of the ΔNLL tables, a lower bound above +0.01). A claim whose runs are absent is listed as
"not run", never dropped. A run of a claim that the trainer stopped with a non-finite loss (the paper's
"diverges", past the point of a finite loss) is an entry of its own: it agrees when the claim says that run's
operator is the worse one (LERP K32 detach, MinMax–Weight K4), disagrees when the claim says the other is (or
that it is within noise of softmax), and is "not estimable" in a factorial effect or the K trend.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kinterval.data.loader import passes_text
from kinterval.ops import OperatorSpec
from kinterval.report import analysis as A
from kinterval.report.results import Point, operator_spec
from kinterval.stats.format import num


@dataclass
class Claim:
    claim: str  # short text
    paper: str  # the paper's value and its source table
    test: str  # the contrast we estimate and the rule for "agrees"
    ours: str  # our estimate and 95% CI, or "not run"
    direction_agrees: bool | None  # None: not run
    detectable: bool | None  # the 95% CI excludes zero; None: not run
    setting: str = ""  # training tokens at the checkpoint used (and the budget), data and tag of the runs
    tokens: int | None = None  # training tokens at the checkpoint the estimate uses; None: not run
    estimate: A.Estimate | None = None
    stopped: bool = False  # an entry for a run stopped by a non-finite loss (no estimate)
    # passes over their train split that the runs' weights were trained on at that checkpoint (> 1: every
    # training sequence seen again, a multi-epoch regime unlike the paper's runs); None: not recorded
    train_passes: float | None = None
    # a claim of a sign (> 0, < 0), whose estimate may agree or disagree by noise alone; False for "within
    # noise of softmax", whose rule is the interval itself
    directional: bool = True

    @property
    def status(self) -> str:
        """agrees / disagrees, "(not detectable)" when a claim of a sign has a 95% CI that includes 0 (its
        sign may be noise), "(run stopped)" for a stopped run's entry."""
        if self.direction_agrees is None:
            return "not estimable (run stopped)" if self.stopped else "not run"
        agrees = "agrees" if self.direction_agrees else "disagrees"
        if self.stopped:
            return f"{agrees} (run stopped)"
        return f"{agrees} (not detectable)" if self.directional and self.detectable is False else agrees

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        # report.json's claim entries keep the key `separated` (whether the CI excludes zero) that scripts
        # read, beside `detectable`, its name in the paper's words (the tables say "Detectable")
        return {**d, "separated": self.detectable, "status": self.status}


def _ours(e: A.Estimate, seeds) -> str:
    s = ",".join(map(str, seeds))
    # num: a value below the fourth decimal in two significant digits, never "-0.0000", so that the sign the
    # status reads ("agrees (not detectable)") and an interval that excludes 0 show in the numbers
    return f"{num(e.mean)} [{num(e.lo)}, {num(e.hi)}] ({e.interval}; seed {s})"


def _setting(key, tokens: int, passes: float | None = None) -> str:
    """The runs' setting, led by the checkpoint the claim is computed at: the budget where the runs reached
    it, else "T of B tokens" (every run of the claim stopped short of its budget: its last checkpoint); and
    the passes over the train split when the runs saw their training data more than once."""
    model = f", {key.model}" if key.model else ""
    seed = "" if key.seed is None else f", seed {key.seed}"
    at = f"{key.budget} tokens" if not tokens or tokens == key.budget else f"{tokens} of {key.budget} tokens"
    repeat = ""
    if passes is not None and passes > 1:
        repeat = f" ({passes_text(passes)} passes over the train split)"
    return f"{at}{repeat}, {key.data}, {key.tag}{model}{seed}"


def _passes(points: list[Point]) -> dict[tuple, float]:
    """(``Key.setting()``, training tokens) -> the most passes over the train split any run there records."""
    out: dict[tuple, float] = {}
    for p in points:
        if p.passes is not None:
            k = (p.key.setting(), p.tokens)
            out[k] = max(out.get(k, 0.0), p.passes)
    return out


def _claim(template: Claim, found: list[tuple[A.Row, bool]], passes: dict[tuple, float]) -> list[Claim]:
    """One entry per setting where the claim's runs exist; one "not run" entry when there is none.
    ``passes``: :func:`_passes` of the points."""
    if not found:
        return [Claim(template.claim, template.paper, template.test, "not run", None, None)]
    return [
        Claim(
            template.claim,
            template.paper,
            template.test,
            _ours(r.est, r.seeds),
            bool(agrees),
            r.est.excludes_zero,
            _setting(r.key, r.tokens, passes.get((r.key.setting(), r.tokens)))
            + (f"; {r.family}" if r.family else ""),
            r.tokens or None,
            r.est,
            train_passes=passes.get((r.key.setting(), r.tokens)),
            directional=template.directional,
        )
        for r, agrees in found
    ]


@dataclass(frozen=True)
class _Stop:
    """A run the trainer stopped with a non-finite loss, as a claim lists it."""

    run_id: str
    operator: str  # with every override but the arithmetic (:func:`_any_arithmetic`)
    ours: str
    setting: str
    tokens: int  # training tokens at the non-finite step
    key: tuple | None  # its evaluations' ``Key.setting()``; None before its first checkpoint


def _stops(points: list[Point], unevaluated: dict[str, dict]) -> list[_Stop]:
    """Every stopped run, in run order: from its last evaluated checkpoint, or, stopped before its first,
    from ``unevaluated`` (``SuiteResults.stopped_unevaluated``: status.json and the manifest)."""
    last: dict[str, Point] = {}
    for p in points:
        if p.stopped is not None and (p.run_id not in last or p.tokens > last[p.run_id].tokens):
            last[p.run_id] = p
    out = {}
    for rid, p in last.items():
        step, tokens = p.stopped
        at = f"{tokens} of {p.budget} tokens"
        last_eval = f"last evaluated at {p.tokens} tokens, NLL {p.mean:.4f}"
        ours = f"{rid}: non-finite loss at step {step} ({at}); {last_eval}"
        out[rid] = _Stop(rid, _any_arithmetic(p), ours, _setting(p.key, tokens), tokens, p.key.setting())
    for rid, u in unevaluated.items():
        at = f"{u['tokens']} of {u['budget']} tokens"
        op = OperatorSpec.parse(operator_spec(u["operator"]), arithmetic="strict").full_name
        ours = f"{rid}: non-finite loss at step {u['step']} ({at}), before its first checkpoint"
        setting = at + (f", {u['model']}" if u["model"] else "") + f", seed {u['seed']}"
        out.setdefault(rid, _Stop(rid, op, ours, setting, u["tokens"], None))
    return [out[k] for k in sorted(out)]


def _claim_with_stops(
    template: Claim, found, stops: list[_Stop], roles: dict[str, int], passes: dict[tuple, float]
) -> list[Claim]:
    """:func:`_claim`'s entries, then one per stopped run whose operator (any arithmetic) the claim involves:
    ``roles[op]`` = +1 if the claim says ``op`` is the worse one (the run agrees), -1 if it says the other is
    (it disagrees), 0 where a non-finite loss gives the claim no sign (not estimable). "not run" only without
    either. In a setting where a run of the claim stopped, an estimate short of the budget (at the last
    checkpoint before the stop, where the run may still have tracked its control) is left out: the stop is
    the result."""
    stops = [x for x in stops if x.operator in roles]
    halted = {x.key for x in stops}
    found = [(r, a) for r, a in found if r.key.setting() not in halted or r.tokens >= r.key.budget]
    entries = [
        Claim(
            template.claim,
            template.paper,
            template.test,
            x.ours,
            None if roles[x.operator] == 0 else roles[x.operator] > 0,
            None,
            x.setting,
            x.tokens,
            stopped=True,
        )
        for x in stops
    ]
    if entries and not found:
        return entries
    return _claim(template, found, passes) + entries


# the 2x2 factorial's cells at K = 4 (any arithmetic)
FACTORIAL_K4 = ("minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4", "fwm-prob-k4")


def _within_noise(e: A.Estimate) -> bool:
    """Within noise of softmax: the 95% CI includes 0 (the paper's "no detectable difference from softmax"),
    or, for a single-seed row, lies wholly inside ±0.01 nats (§4: single-seed differences below about 0.01
    nats are not interpreted). Several seeds with a CI that excludes 0 are a detected difference."""
    return not e.excludes_zero or (e.n_seeds == 1 and e.within_margin)


def _last(rows: list[A.Row]) -> list[A.Row]:
    """The final checkpoint of each key among per-checkpoint rows."""
    last: dict = {}
    for r in rows:
        if r.key not in last or r.tokens > last[r.key].tokens:
            last[r.key] = r
    return list(last.values())


def _any_arithmetic(p: Point) -> str:
    """The point's operator with every override but the arithmetic (``fwm-prob-k4[tau=5]`` stays itself,
    ``fwm-prob-k4[arithmetic=historical]`` is ``fwm-prob-k4``)."""
    return OperatorSpec.parse(p.spec, arithmetic="strict").full_name


def _contrast_rows(points: list[Point], a: str, b: str, unpaired: dict[str, str] | None) -> list[A.Row]:
    """``a - b`` per block and seed at the endpoint of each setting (``analysis.at_endpoint``: a run without
    an evaluation there goes to ``unpaired``); operators match on their full spec (tau, range_grad) with any
    arithmetic (the factorial's historical or strict cells), one row per arithmetic and setting (and per seed
    for a supplementary run, ``Key.seed``): a run with another override (``fwm-prob-k4[tau=5]``) is another
    operator and never stands in for ``b``."""
    # (setting, lineage, arithmetic) -> every checkpoint of a and b
    cells: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        if _any_arithmetic(p) not in (a, b):
            continue
        cells[(p.key.setting(), p.key.seed, p.spec.arithmetic)].append(p)
    rows = []
    for (*_, arith), pts in sorted(cells.items(), key=lambda kv: str(kv[0])):
        by: dict[str, dict[int, Point]] = defaultdict(dict)
        for p in A.at_endpoint(pts, f"the claim {a} − {b}", unpaired, early=True):  # "500 of 1000 tokens"
            by[_any_arithmetic(p)][p.seed] = p
        seeds = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        seeds = [s for s in seeds if by[a][s].nll.size == by[b][s].nll.size]
        if seeds:
            p0 = by[a][seeds[0]]
            est = A.estimate(
                {s: by[a][s].nll - by[b][s].nll for s in seeds}, f"{a} − {b} ({p0.tokens} tokens)"
            )
            rows.append(
                A.Row(f"{a} − {b}", p0.key, tuple(seeds), est, p0.tokens, family=f"arithmetic={arith}")
            )
    return rows


def paper_claims(
    points: list[Point], unpaired: dict[str, str] | None = None, unevaluated: dict[str, dict] | None = None
) -> list[Claim]:
    """The claims of issue 12 on the primary (suite) evaluations of ``points``, each at its runs' endpoint; a
    run without an evaluation there is left out and listed in ``unpaired`` (run -> reason), or raises
    ``ValueError`` when ``unpaired`` is None."""
    points = [p for p in points if p.primary]
    pairing = A.softmax_pairs(points)
    no_control = set(pairing.unpaired)
    delta = A.delta_table(pairing)
    detach, _ = A.detach_pairs(points)
    fac = A.factorial_effects(points, unpaired)
    trends = A.k_trends(pairing)
    for run, why in pairing.unpaired.items():  # left out of a ΔNLL or K-trend row: not at its endpoint
        if run not in no_control:
            A._left_out(unpaired, run, why)

    def spec_is(r: A.Row, **kw) -> bool:
        s = A._spec(r.key.operator)
        return all(getattr(s, k) == v for k, v in kw.items())

    stops = _stops(points, unevaluated or {})
    passes = _passes(points)

    def with_stops(template: Claim, found, roles: dict[str, int]) -> list[Claim]:
        return _claim_with_stops(template, found, stops, roles, passes)

    out: list[Claim] = []
    found = [
        (r, r.est.mean > 0)
        for r in _last(detach)
        if spec_is(r, calibration="minmax", reconstruction="lerp", K=32, range_grad="detach")
    ]
    out += with_stops(
        Claim(
            "LERP K32: detach − full > 0",
            "+0.737 [+0.721, +0.752], seed 1337 (tab:detach); seeds 7/42: +0.802, +0.780 (tab:detachrep)",
            "NLL(lerp-k32[range_grad=detach]) − NLL(same-seed lerp-k32), per block; agrees if > 0",
            "",
            None,
            None,
        ),
        found,
        {"lerp-k32[range_grad=detach]": 1, "lerp-k32": -1},
    )
    found = [(r, r.est.mean > 0) for r in _contrast_rows(points, "minmax-weight-k4", "fwm-prob-k4", unpaired)]
    out += with_stops(
        Claim(
            "MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax",
            "+0.208 vs +0.013 (suite D, 5 seeds; tab:crossfull); five-seed means +0.2076 vs +0.0132, "
            "difference +0.194 (tab:seedend)",
            "ΔNLL(minmax-weight-k4) − ΔNLL(fwm-prob-k4) (softmax cancels: the same-seed NLL difference), "
            "per block; agrees if > 0",
            "",
            None,
            None,
        ),
        found,
        {"minmax-weight-k4": 1, "fwm-prob-k4": -1},
    )
    k4 = [r for r in fac if r.K == 4 and r.family in A.PAPER_DESIGNS]  # not another tau or range_grad
    for effect, text, paper, sign in (
        (
            "interaction",
            "factorial interaction > 0 (K4)",
            "+0.052 [+0.030, +0.075] (suite D K4; Table 3 tab:cross)",
            1,
        ),
        (
            "calibration",
            "calibration main effect FWM − MinMax < 0 (K4)",
            "−0.150 [−0.161, −0.138] (suite D K4; tab:crossfull, tab:seedfact)",
            -1,
        ),
        (
            "surrogate",
            "surrogate main effect Prob − Weight < 0 (K4)",
            "−0.045 [−0.052, −0.037] (suite D K4; tab:crossfull, tab:seedfact)",
            -1,
        ),
    ):
        found = [(r, sign * r.est.mean > 0) for r in k4 if r.contrast == effect]
        # stats.FACTORIAL_WEIGHTS: ±1/2 for the main effects (App. C.3), ±1 for the interaction
        weights = "±1 weights" if effect == "interaction" else "±1/2 weights (App. C.3)"
        rule = (
            "interaction (FWM_P − FWM_W) − (MM_P − MM_W)" if effect == "interaction" else f"{effect} effect"
        )
        out += with_stops(
            Claim(
                text,
                paper,
                f"{rule}, {weights}, per block; agrees if {'>' if sign > 0 else '<'} 0",
                "",
                None,
                None,
            ),
            found,
            dict.fromkeys(FACTORIAL_K4, 0),
        )
    found = [(r, _within_noise(r.est)) for r in delta if r.key.operator == "lerp-k32"]
    out += with_stops(
        Claim(
            "LERP K32 within noise of softmax",
            "−0.0008 [−0.004, +0.002], seed 1337 (tab:detach); 5 seeds +0.0076 [−0.000, +0.015] "
            "(tab:seedend)",
            "ΔNLL(lerp-k32); agrees if the 95% CI includes 0 (no detectable difference, §5.1) or, for one "
            "seed, lies inside ±0.01 nats (single-seed differences below it are not interpreted, §4)",
            "",
            None,
            None,
            directional=False,
        ),
        found,
        {"lerp-k32": -1, "softmax": 0},
    )
    found = [(r, r.est.mean < 0) for r in trends if r.family == "lerp"]
    trend_ops = {_any_arithmetic(p): 0 for p in points if p.family == "lerp" or p.operator == "softmax"}
    out += with_stops(
        Claim(
            "ΔNLL decreasing in K for LERP",
            "slope −0.0222 [−0.024, −0.020] nats per doubling of K (suite D, 5 seeds; tab:ktrend)",
            "least-squares slope of ΔNLL(lerp-kK) against log2 K, per block; agrees if < 0",
            "",
            None,
            None,
        ),
        found,
        trend_ops,
    )
    return out
