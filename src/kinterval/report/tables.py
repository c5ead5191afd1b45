"""Markdown and LaTeX renderings of the analysis rows (same content, two formats).

Each ``*_rows`` function turns :class:`~kinterval.report.analysis.Row` objects into (headers, cells).
"""

from __future__ import annotations

import math

from kinterval.report.analysis import AUDIT, MARGIN, NOT_RECORDED, ReferenceRow, Row, condition, key_order
from kinterval.stats.format import num, prob


def ci(lo, hi, fmt=num) -> str:
    return "-" if lo is None or not math.isfinite(lo) else f"[{fmt(lo)}, {fmt(hi)}]"


# LaTeX for the characters the tables use: TeX's specials escaped, the Unicode symbols as math or text
# commands, so that a .tex table compiles under pdflatex without a Unicode setup (and "<", ">" print as
# themselves under the default OT1 font encoding).
_LATEX = str.maketrans(
    {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "<": "$<$",
        ">": "$>$",
        "−": "$-$",
        "–": "--",
        "—": "---",
        "±": r"$\pm$",
        "×": r"$\times$",
        "·": r"$\cdot$",
        "°": r"$^\circ$",
        "≫": r"$\gg$",
        "≪": r"$\ll$",
        "≤": r"$\leq$",
        "≥": r"$\geq$",
        "≈": r"$\approx$",
        "→": r"$\to$",
        "Δ": r"$\Delta$",
        "τ": r"$\tau$",
        "ρ": r"$\rho$",
        "γ": r"$\gamma$",
        "‖": r"$\|$",
        "§": r"\S{}",
        "…": r"\dots{}",
    }
)


def latex(text: str) -> str:
    """``text`` as LaTeX source (see ``_LATEX``); other characters pass through."""
    return text.translate(_LATEX)


def render(headers: list[str], rows: list[list[str]], fmt: str = "md", caption: str = "") -> str:
    if fmt == "md":
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return (f"{caption}\n\n" if caption else "") + "\n".join(out) + "\n"
    esc = [[latex(c) for c in r] for r in [headers, *rows]]
    body = " \\\\\n".join(" & ".join(r) for r in esc[1:])
    cap = "".join(f"% {latex(line)}\n" for line in caption.splitlines())
    return (
        f"{cap}\\begin{{tabular}}{{l{'r' * (len(headers) - 1)}}}\n\\toprule\n{' & '.join(esc[0])} \\\\\n"
        f"\\midrule\n{body} \\\\\n\\bottomrule\n\\end{{tabular}}\n"
    )


def tokens(n: int) -> str:
    """``100000000`` -> ``100M``."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.4g}{unit}"
    return str(n)


def _setting_cells(rows: list[Row]) -> tuple[list[str], callable]:
    """Budget/data/tag columns, shown only when the rows come from more than one setting, and the model column
    when they come from more than one model (suites C and D)."""
    settings = {r.key.setting() for r in rows if r.key}
    if len(settings) <= 1:
        return [], lambda r: []
    if len({model for *_, model in settings}) == 1:
        return ["Budget", "Data", "Eval"], lambda r: [tokens(r.key.budget), r.key.data, r.key.tag]
    return ["Budget", "Data", "Eval", "Model"], lambda r: [
        *(tokens(r.key.budget), r.key.data, r.key.tag, r.key.model)
    ]


def seeds(r: Row) -> str:
    return ",".join(map(str, r.seeds))


SEPARATED = "Separated (lo > +0.01)"


def estimate_headers(rows: list[Row]) -> list[str]:
    """The CI columns; the seed columns when a row has several seeds; the single-seed label "separated"
    (paper §4: CI lower bound above +0.01) when a row has one seed ("-" on the rows of several seeds)."""
    heads = ["95% CI", "Interval"]
    if any(r.est.n_seeds > 1 for r in rows):
        heads += ["Seed SD", "Eval SE", "p (perm.; boot. for one seed)", "BH q"]
    return heads + ([SEPARATED] if any(r.est.n_seeds == 1 for r in rows) else [])


def estimate_cells(r: Row, headers: list[str]) -> list[str]:
    """The cells of :func:`estimate_headers`' columns ``headers`` for row ``r``."""
    e = r.est
    cells = [ci(e.lo, e.hi), e.interval]
    if "Seed SD" in headers:
        cells += [num(e.sd, False), num(e.eval_se, False), prob(e.p), prob(r.q)]
    if SEPARATED in headers:
        cells.append("-" if e.n_seeds > 1 else "yes" if e.separated else "no")
    return cells


def delta_rows(rows: list[Row], refs: list[ReferenceRow] = ()) -> tuple[list[str], list[list[str]]]:
    """tab:seedend (several seeds: with each NLL's seed SD) or tab:endpoints (one seed): the softmax rows of
    ``refs`` (NLL, seed SD, no contrast) first in their setting, then its conditions."""
    multi = any(r.est.n_seeds > 1 for r in rows)
    extra, cells_of = _setting_cells([*rows, *refs])
    sd = ["NLL seed SD"] if multi else []
    est_heads = estimate_headers(rows)
    headers = ["Condition", *extra, "Seed ids", "NLL", *sd, "ΔNLL (nats/token)", *est_heads]
    blank = ["-"] * (len(headers) - len(extra) - 3 - len(sd))
    by_setting: dict[tuple, list[ReferenceRow]] = {}
    for ref in refs:
        by_setting.setdefault(ref.key.setting(), []).append(ref)
    ordered = []  # each setting's softmax rows just before its first condition
    for r in rows:
        ordered += [*by_setting.pop(r.key.setting(), []), r]
    out = []
    for r in ordered + [ref for rs in by_setting.values() for ref in rs]:
        nll_sd = [num(r.nll_sd, False)] if multi else []
        if isinstance(r, ReferenceRow):
            out.append([condition(r.key), *cells_of(r), seeds(r), num(r.nll, False), *nll_sd, *blank])
            continue
        est = [num(r.est.mean), *estimate_cells(r, est_heads)]
        out.append([condition(r.key), *cells_of(r), seeds(r), num(r.nll, False), *nll_sd, *est])
    return headers, out


def _range(xs, fmt: str) -> str:
    """min–max of ``xs``; one value alone where they agree (one seed pair); "-" for none."""
    if not xs:
        return "-"
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


FACTORIAL_NAMES = {
    "calibration": "calibration (FWM − MinMax)",
    "surrogate": "surrogate (Prob − Weight)",
    "interaction": "interaction (FWM_P − FWM_W) − (MM_P − MM_W)",
}


def factorial_cross(fac: list[Row], settings: list[tuple]) -> dict[str, dict[tuple, Row]]:
    """The factorial rows of tab:cross / tab:crossfull, contrast -> setting -> row: each effect at each K
    ("interaction, K4"), pooled over K and the K× rows, for the cross table's ``settings`` (a design other
    than the setting's only one, e.g. another arithmetic, is named after the contrast)."""
    designs = {(r.key.setting(), r.family) for r in fac if r.key}
    several = len({f for _, f in designs}) > 1
    out: dict[str, dict[tuple, Row]] = {}
    for r in fac:
        if r.key is None or r.key.setting() not in settings:
            continue
        name = FACTORIAL_NAMES.get(r.contrast, r.contrast)
        if "K×" not in name:
            at = "pooled over K" if r.K is None else f"K{r.K}"
            name = name if at in name else f"{name}, {at}"
        out.setdefault(name + (f" [{r.family}]" if several else ""), {})[r.key.setting()] = r
    return out


def factorial_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    extra, cells_of = _setting_cells(rows)
    est_heads = estimate_headers(rows)
    headers = ["K", *extra, "Effect", "Estimate (nats/token)", *est_heads, "Seed ids", "Cells"]
    return headers, [
        [
            str(r.K) if r.K is not None else "pooled",
            *cells_of(r),
            FACTORIAL_NAMES.get(r.contrast, r.contrast),
            num(r.est.mean),
            *estimate_cells(r, est_heads),
            seeds(r),
            r.family,
        ]
        for r in rows
    ]


def trend_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    extra, cells_of = _setting_cells(rows)
    headers = [
        "Family",
        "K values",
        "Seeds (n)",
        *extra,
        "Slope (nats per doubling of K)",
        "95% CI",
        "Interval",
    ]
    headers += ["Seed SD"]
    return headers, [
        [
            condition(r.key),  # the family, and a supplementary row's seed
            r.note,
            str(r.est.n_seeds),
            *cells_of(r),
            num(r.est.mean),
            ci(r.est.lo, r.est.hi),
            r.est.interval,
            num(r.est.sd, False),
        ]
        for r in rows
    ]


def detach_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    extra, cells_of = _setting_cells(rows)
    headers = [
        "Condition",
        *extra,
        "Tokens",
        "Seed ids",
        "Modified − full (nats/token)",
        "95% CI",
        "Interval",
    ]
    headers += ["Gap recovery"]
    return headers, [
        [
            r.contrast,
            *cells_of(r),
            tokens(r.tokens),
            seeds(r),
            num(r.est.mean),
            ci(r.est.lo, r.est.hi),
            r.est.interval,
            num(r.recovery, False, 3)
            + (f" [{r.recovery_lo:.3f}, {r.recovery_hi:.3f}]" if r.recovery_lo is not None else ""),
        ]
        for r in rows
    ]


def taildecomp_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """tab:taildecomp: each contrast's Δ with its CI, ° where |Δ| < 0.01 nats (below the single-seed
    interpretation margin), and the path ratio (MinMax − resolved) / (MinMax − FWM) with its interval once
    per resolved run (on its MinMax − resolved row)."""
    extra, cells_of = _setting_cells(rows)
    headers = ["Contrast", *extra, "Tokens", "Seed ids", "Δ (nats/token)", "95% CI", "Interval"]
    headers += ["Path ratio [95% CI]"]
    out, shown = [], set()
    for r in rows:
        ratio = "-"
        if r.recovery is not None and (r.key, r.tokens) not in shown:
            shown.add((r.key, r.tokens))
            ratio = f"{r.recovery:.3f}" + (
                f" [{r.recovery_lo:.3f}, {r.recovery_hi:.3f}]" if r.recovery_lo is not None else ""
            )
        mark = " °" if abs(r.est.mean) < MARGIN else ""
        out.append(
            [r.contrast, *cells_of(r), tokens(r.tokens), seeds(r), num(r.est.mean)]
            + [ci(r.est.lo, r.est.hi) + mark, r.est.interval, ratio]
        )
    return headers, out


def cross_column(setting: tuple, suites: str = "") -> str:
    """A cross-setting column: ``"C: 32L 24H d1536, 100M, wt103:val (...), val"`` (the model when known)."""
    b, d, t, model = setting
    where = ", ".join(x for x in (model, tokens(b), d, t) if x)
    return f"{suites}: {where}" if suites else where


def cross_rows(
    settings: list[tuple], table: dict, columns: list[str] | None = None
) -> tuple[list[str], list]:
    """tab:cross / tab:crossfull: one column per setting (``columns``: their labels, :func:`cross_column`)."""
    columns = columns or [cross_column(s) for s in settings]
    headers = ["Condition", *[f"{c}: ΔNLL [95% CI]" for c in columns]]
    out = []
    for op, by in table.items():
        cells = [op]
        for s in settings:
            r = by.get(s)
            cells.append("-" if r is None else f"{num(r.est.mean)} {ci(r.est.lo, r.est.hi)}")
        out.append(cells)
    return headers, out


def option_rows(effects) -> tuple[list[str], list[list[str]]]:
    """Attention options across models (:func:`~kinterval.report.analysis.option_effects`): each operator's
    NLL without and with the options and its option effect; for an operator other than softmax its penalty
    (ΔNLL vs same-seed softmax) without and with them and the change."""
    rows = [e.effect for e in effects] + [e.penalty for e in effects if e.penalty is not None]
    extra, cells_of = _setting_cells(rows)
    q = ["BH q"] if any(r.est.n_seeds > 1 for r in rows) else []
    headers = ["Condition", *extra, "Options", "Without", "Seed ids", "Tokens", "NLL without", "NLL with"]
    headers += ["Δ option (nats/token)", "95% CI", *q, "Penalty without", "Penalty with"]
    headers += ["Δ penalty", "95% CI", *q, "Interval"]

    def est(r) -> list[str]:
        if r is None:
            return ["-", "-", *(["-"] if q else [])]
        return [num(r.est.mean), ci(r.est.lo, r.est.hi), *([prob(r.q)] if q else [])]

    out = []
    for e in effects:
        r, pen = e.effect, e.penalty
        cells = [condition(r.key), *cells_of(r), e.options, e.base, seeds(r), tokens(r.tokens)]
        cells += [num(r.control_nll, False), num(r.nll, False), *est(r)]
        cells += [num(pen.control_nll), num(pen.nll)] if pen is not None else ["-", "-"]
        out.append([*cells, *est(pen), r.est.interval])
    return headers, out


def unpaired_rows(unpaired: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    return ["Run [eval] vs control, or in the row it is left out of", "Why it is left out"], [
        [k, v] for k, v in sorted(unpaired.items())
    ]


def stopped_rows(stopped: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["Run", "Operator", "Seed", "Non-finite at step", "Tokens (of budget)", "Last evaluated", "NLL"]
    return headers, [
        [
            rid,
            s["operator"],
            str(s["seed"]),
            str(s["step"]),
            f"{s['tokens']} of {s['budget']}",
            "-" if s["last_evaluated_tokens"] is None else f"{s['last_evaluated_tokens']} tokens",
            num(s["last_mean_nll"], signed=False),
        ]
        for rid, s in stopped.items()
    ]


def skipped_rows(
    skipped: dict[str, str], pair: str = "Modified run vs full-gradient twin"
) -> tuple[list[str], list[list[str]]]:
    return [pair, "Why it is skipped"], [[k, v] for k, v in sorted(skipped.items())]


def claim_rows(claims) -> tuple[list[str], list[list[str]]]:
    headers = ["Claim", "Paper", "Ours (95% CI)", "Status", "Direction agrees", "Detectable (CI excludes 0)"]
    headers += ["Runs", "Tested"]
    yn = {True: "yes", False: "no", None: "-"}
    return headers, [
        [
            c.claim,
            c.paper,
            c.ours,
            c.status,
            yn[c.direction_agrees],
            yn[c.detectable],
            c.setting or "-",
            c.test,
        ]
        for c in claims
    ]


def heldout_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "Condition",
        "Contrast",
        "Eval",
        "Data",
        "Seed ids",
        "ΔNLL (nats/token)",
        "95% CI",
        "Interval",
        "BH q",
    ]
    headers += ["CI excl. 0", "CI inside ±0.01", "max abs Δ of a block"]
    yn = {True: "yes", False: "no"}
    # a forward audit's Δ is 1e-5 to 1e-4 nats: three significant digits, as tab:strictaudit prints it
    fmt = {AUDIT: lambda x: "-" if x is None else f"{x:+.2e}"}
    return headers, [
        [
            condition(r.key),
            r.contrast.replace(r.key.operator, "").strip(" −") or r.contrast,
            r.key.tag,
            r.key.data,
            seeds(r),
            fmt.get(r.contrast, num)(r.est.mean),
            ci(r.est.lo, r.est.hi, fmt.get(r.contrast, num)),
            r.est.interval,
            prob(r.q),
            yn[r.est.excludes_zero],
            yn[r.est.within_margin],
            "-" if r.max_abs is None else f"{r.max_abs:.3g}",
        ]
        for r in rows
    ]


def _varying(items, columns: dict) -> tuple[list[str], callable]:
    """The columns (header: cell of an item) whose cells differ between ``items``, e.g. the data and model of
    rows of several corpora or models (suites C and D are both 100M tokens of WikiText-103): their headers,
    and a function giving an item's cells."""
    keep = {h: f for h, f in columns.items() if len({f(x) for x in items}) > 1}
    return list(keep), lambda x: [f(x) for f in keep.values()]


def _setting_model(stats) -> tuple[list[str], callable]:
    """The model column of per-setting statistics (``setting``: budget, data, tag, model), if several."""
    return _varying(stats, {"Model": lambda s: s.setting[3] if len(s.setting) > 3 else ""})


def heldout_ordering_rows(stats) -> tuple[list[str], list[list[str]]]:
    """Layer 1: Spearman of the held-out ΔNLL ordering with the in-domain one, and the split-half fluctuation
    (the largest and the mean absolute first-half − second-half ΔNLL over the conditions; descriptive)."""
    model, cells = _setting_model(stats)
    headers = ["Budget", "Data", "Eval", *model, "Conditions", "Spearman with in-domain ΔNLL (p)"]
    headers += [
        "Split-half units",
        "Split-half fluctuation: largest (condition)",
        "Split-half fluctuation: mean",
    ]
    return headers, [
        [
            tokens(s.setting[0]),
            s.setting[1],
            s.setting[2],
            *cells(s),
            f"{len(s.conditions)} of {len(s.split_half)}",
            "-" if s.spearman is None else f"{s.spearman[0]:+.3f} ({s.spearman[1]:.3g})",
            s.unit,
            f"{s.fluctuation_max:.4f} ({max(s.split_half, key=lambda c: abs(s.split_half[c]))})",
            f"{s.fluctuation_mean:.4f}",
        ]
        for s in stats
    ]


def rank_rows(stats) -> tuple[list[str], list[list[str]]]:
    model, cells = _setting_model(stats)
    headers = ["Budget", "Data", "Eval", *model, "Seed ids", "Conditions", "Kendall's W"]
    headers += ["Pairwise Spearman (min–max)", "Spearman ΔNLL vs h (p)", "Spearman ΔNLL vs span (p)"]

    def rho(x):
        return "-" if x is None else f"{x[0]:+.3f} ({x[1]:.3g})"

    return headers, [
        [
            tokens(s.setting[0]),
            s.setting[1],
            s.setting[2],
            *cells(s),
            ",".join(map(str, s.seeds)) or "-",  # one seed: no ordering over seeds (W and Spearman "-")
            str(len(s.conditions)),
            num(s.kendall_w, False, 3),
            _range(s.pairwise_spearman, "{:.3f}"),
            rho(s.spearman_h),
            rho(s.spearman_span),
        ]
        for s in stats
    ]


def within_run_rows(stats) -> tuple[list[str], list[list[str]]]:
    """Within-run Spearman of row span against ΔNLL along training, per seed
    (``analysis.within_run_spearman``; "-" where fewer than 3 checkpoints have both, or one is constant)."""
    heads, cells = _data_model([s.key for s in stats])
    headers = ["Condition", "Budget", *heads, "Eval", "Seed ids", "Checkpoints", "Spearman span vs ΔNLL (p)"]

    def rho(r, p):
        return "-" if r is None else f"{r:+.3f} ({p:.3g})"

    return headers, [
        [
            condition(s.key),
            tokens(s.key.budget),
            *cells(s.key),
            s.key.tag,
            ",".join(map(str, s.seeds)),
            ", ".join(map(str, s.checkpoints)),
            ", ".join(rho(r, p) for r, p in zip(s.rho, s.p)),
        ]
        for s in stats
    ]


def _data_model(keys) -> tuple[list[str], callable]:
    """The data and model columns of rows keyed by condition keys, each where the rows hold several."""
    return _varying(keys, {"Data": lambda k: k.data, "Model": lambda k: k.model})


def clip_rows(rows) -> tuple[list[str], list[list[str]]]:
    from kinterval.report.analysis import CLIP_TAIL

    def each(values, fmt):
        return ", ".join("-" if x is None else format(x, fmt) for x in values) or "-"

    heads, cells = _data_model([r.key for r in rows])
    headers = ["Condition", "Budget", *heads, "Seed ids", "Clipped fraction of steps (mean over seeds)",
               "Per seed", f"Clipped fraction in the last {CLIP_TAIL:.0%} of tokens", "Final pre-clip norm",
               "Largest pre-clip norm", "Largest loss rise between logs"]  # fmt: skip
    return headers, [
        [
            condition(r.key),
            tokens(r.key.budget),
            *cells(r.key),
            ",".join(map(str, r.seeds)),
            f"{r.mean:.3f}",
            each(r.per_seed, ".3f"),
            each(r.tail, ".3f"),
            each(r.final_norm, ".3g"),
            each(r.max_norm, ".3g"),
            each(r.max_loss_rise, ".3g"),
        ]
        for r in rows
    ]


def clean_rows(rows) -> tuple[list[str], list[list[str]]]:
    """ΔNLL vs softmax on all blocks, on the blocks without a target in a window shared with the training
    split, and on the others (``analysis.clean_blocks``)."""

    def est(e):
        return ["-", "-"] if e is None else [num(e.mean), ci(e.lo, e.hi)]

    headers = ["Condition", "Data", "Seed ids", "n-gram", "ΔNLL, all blocks", "95% CI", "Clean blocks",
               "ΔNLL, clean", "95% CI", "Covered blocks", "ΔNLL, covered", "95% CI"]  # fmt: skip
    return headers, [
        [
            condition(r.key),
            r.key.data,
            ",".join(map(str, r.seeds)),
            str(r.n),
            *est(r.all),
            str(r.n_clean),
            *est(r.clean),
            str(r.n_covered),
            *est(r.covered),
        ]  # fmt: skip
        for r in rows
    ]


def fit_rows(rows) -> tuple[list[str], list[list[str]]]:
    """The training-fit table (``analysis.train_fit``): training loss over the last ``FIT_TAIL`` of the
    tokens against the evaluation, each as condition − same-seed control."""
    from kinterval.report.analysis import FIT_TAIL

    heads, cells = _data_model([r.key for r in rows])
    headers = ["Condition", "Budget", *heads, "Seed ids", "Control", "Steps",
               f"Train loss (last {FIT_TAIL:.0%})", "Δ train loss", "95% CI", "Interval", "ΔNLL (evaluation)",
               "NLL − train loss", "Control NLL − train loss"]  # fmt: skip
    return headers, [
        [
            condition(r.key),
            tokens(r.key.budget),
            *cells(r.key),
            ",".join(map(str, r.seeds)),
            r.control,
            str(r.steps),
            num(r.train, signed=False),
            num(r.d_train.mean),
            ci(r.d_train.lo, r.d_train.hi),
            r.d_train.interval,
            num(r.d_eval),
            num(r.gap),
            num(r.control_gap),
        ]
        for r in rows
    ]


def graddecomp_rows(rows) -> tuple[list[str], list[list[str]]]:
    """tab:graddecomp (norm ratios to g_full; relative errors of the implemented local gradient) with the
    zero-sum residual of the run's own implemented score gradient."""
    from kinterval.report.analysis import GRAD_TERMS as terms

    headers = ["Condition", "Seed", "Checkpoint", "Blocks", "self", "M term", "m term", "detach", "min_only",
               "max_only", "P1 (local)", "zero-sum residual (median)", "rows > 1e-3"]  # fmt: skip
    return headers, [
        [r.operator, str(r.seed), tokens(r.tokens), str(r.n_blocks)]
        + [f"{r.terms[k]:.3g}" if k in r.terms else "-" for k in terms]
        + [f"{r.zero_sum_residual:.2g}", f"{r.rows_above_1e_3:.3f}"]
        for r in rows
    ]


# The paper's headers of the geometry metrics (its final-checkpoint geometry table); report.json keeps the
# field names (kinterval.eval.geometry)
GEOMETRY_NAMES = {
    "span": "Span",
    "h": "h",
    "q_norm": "‖q‖",
    "entropy": "Entropy",
    "top_bucket_mass": "Top-level mass",
    "eff_buckets": "Eff. levels",
    "tv": "TV",
    "sink_mass": "Sink mass",
    "sink_mass_softmax": "Sink mass (softmax)",
}


def geometry_rows(geo: dict) -> tuple[list[str], list[list[str]]]:
    """Endpoint geometry per condition and setting: the data column when the rows are of several corpora, the
    model column when of several models (suites C and D: both 100M tokens of WikiText-103); the sink's share
    (operator, softmax) when a model has attention sinks."""
    metrics = ["span", "h", "q_norm", "entropy", "top_bucket_mass", "eff_buckets", "tv"]  # the paper's order
    if any("sink_mass" in g for g in geo.values()):
        metrics += ["sink_mass", "sink_mass_softmax"]
    heads, cells = _data_model(geo)
    return ["Condition", "Budget", *heads, *[GEOMETRY_NAMES.get(m, m) for m in metrics]], [
        [condition(k), tokens(k.budget), *cells(k), *[num(g.get(m), False, 3) for m in metrics]]
        for k, g in sorted(geo.items(), key=lambda kv: key_order(kv[0]))
    ]


def strict_rows(rows) -> tuple[list[str], list[list[str]]]:
    """tab:strict: each contrast with its evaluator (evaluation tag), Δ and 95% CI, and the evaluations it
    combines; a contrast whose runs or evaluations are absent is "not run" with the reason."""
    headers = ["Group", "Contrast (nats/token)", "K", "Seed", "Evaluator", "Δ", "95% CI", "Interval"]
    headers += ["Evaluations (or why not run)"]
    out = []
    for r in rows:
        seed = "-" if r.seed is None else str(r.seed)
        if r.est is None:
            out.append([r.group, r.contrast, str(r.K), seed, r.evaluator, "not run", "-", "-", r.why])
            continue
        e = r.est
        where = r.evaluator + (f" ({', '.join(r.devices)})" if r.devices else "")
        out.append(
            [r.group, r.contrast, str(r.K), seed, where, num(e.mean), ci(e.lo, e.hi), e.interval]
            + ["; ".join(r.terms)]
        )
    return headers, out


def probe_rows(comparisons: dict) -> tuple[list[str], list[list[str]]]:
    """tab:probeab and tab:probec: per condition, the rows ``kinterval probes-compare`` marks ``tab:probeab``
    (:func:`kinterval.eval.probes.in_probeab`), then probe C's deltas and slopes (against log2 of the copied
    length L), in its columns; a condition without probes is "not run" with the reason."""
    from kinterval.eval.probes import in_probeab, interval_text

    headers = ["Condition", "Reference", "Probe", "Metric", "Param", "Sample", "Reference value"]
    headers += ["Δ vs reference", "95% CI", "n", "Table (or why not run)"]
    out = []
    for name, c in comparisons.items():
        if "not_run" in c:
            out.append([name, "-", "-", "-", "-", "-", "-", "not run", "-", "-", c["not_run"]])
            continue
        ref = f"{c['reference']} ({c['reference_operator']})"
        for r in c["deltas"]:
            table = "tab:probeab" if in_probeab(r) else "tab:probec" if r["probe"] == "C" else None
            if table:
                ivl = interval_text(r["lo"], r["hi"], signed=True)
                cells = [
                    r["probe"],
                    r["metric"],
                    str(r["param"]),
                    r["condition"],
                    num(r["reference"], signed=False),
                ]
                cells += [num(r["delta"]), ivl]  # the reference's absolute value: the tables' softmax row
                out.append([name, ref, *cells, str(r["n"]), table])
        for r in c["slopes"]:
            if r["probe"] == "C":
                param = f"slope vs log2 {r['params']}"
                ivl = interval_text(r["lo"], r["hi"], signed=True)
                cells = [r["probe"], r["metric"], param, r["condition"], "-", num(r["slope"]), ivl]
                out.append([name, ref, *cells, f"{r['n_families']} families", "tab:probec"])
    return headers, out


def stack_text(stack: dict) -> str:
    """One training stack of the caption: ``NVIDIA H200 ×1 process, torch 2.5.1, CUDA 12.4, Python 3.11.7``
    (a field its sessions did not record: "not recorded"; a CPU build of torch: "no CUDA")."""
    n = stack.get("processes")
    procs = NOT_RECORDED if n == NOT_RECORDED else f"{n} process{'es' if n != 1 else ''}"
    cuda = stack.get("cuda")
    cuda = "no CUDA" if cuda is None else cuda if cuda == NOT_RECORDED else f"CUDA {cuda}"
    device, torch, python = stack.get("device_name"), stack.get("torch"), stack.get("python")
    return f"{device} ×{procs}, torch {torch}, {cuda}, Python {python}"


def hardware_caption(hw) -> str:
    stacks = "; ".join(f"{sid}: {stack_text(s)}" for sid, s in hw.stacks.items())
    return (
        "Training and evaluation hardware per suite and group (tab:hardware), from the run folders "
        "(environment.jsonl, status.json, run_config.json) and the evaluation summaries. Training stack: the "
        "device model, processes, torch, CUDA and Python of each training session; a run whose sessions "
        "ran on several stacks lists each (S1+S2); a run without environment.jsonl is not recorded. "
        "Stacks: " + (stacks or "none recorded") + ". Train hours: training wall time × processes / 3600, "
        "each session's time (environment.jsonl train_s) at its own process count, summed over the runs that "
        "record it (status.json train_s)"
    )


def hardware_rows(hw) -> tuple[list[str], list[list[str]]]:
    """tab:hardware (``analysis.hardware``): one row per suite and group."""

    def hours(r) -> str:
        if r.train_hours is None:
            return "—"
        text = f"{r.train_hours:.3g}" if r.train_hours < 100 else f"{r.train_hours:.0f}"
        return text if r.timed_runs == len(r.runs) else f"{text} ({r.timed_runs} of {len(r.runs)} runs)"

    def stacks(r) -> str:
        return "; ".join(f"{label} ({n} run{'s' if n != 1 else ''})" for label, n in r.stacks.items())

    headers = ["Suite", "Group", "Runs", "Training stack", "Evaluation device(s)", "Train hours"]
    return headers, [
        [r.suite, r.group, str(len(r.runs)), stacks(r), ", ".join(r.eval_devices) or "none", hours(r)]
        for r in hw.rows
    ]


def stack_rows(hw) -> tuple[list[str], list[list[str]]]:
    """tab:dstack (``analysis.hardware``): runs per operator family and training stack, with totals."""
    columns = hw.columns()
    headers = ["Family", *columns, "Total"]
    rows = [
        [family, *(str(counts.get(c, 0)) for c in columns), str(sum(counts.values()))]
        for family, counts in hw.by_family.items()
    ]
    totals = [sum(counts.get(c, 0) for counts in hw.by_family.values()) for c in columns]
    return headers, [*rows, ["Total", *map(str, totals), str(sum(totals))]]
