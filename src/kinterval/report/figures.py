"""Figures (matplotlib, Agg backend): ΔNLL trajectories, geometry panels, detach-vs-full trajectories, and the
endpoint ΔNLL bar chart used by the demo. Every figure is a PNG with labelled axes and units."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    SymmetricalLogLocator,
)

from kinterval import atomic  # noqa: E402

# (metric, axis label, log scale): span and h on log axes as in the paper's geometry figures
GEOMETRY = (
    ("span", "row span M − m (score units, log)", True),
    ("h", "native width h (score units, log)", True),
    ("tv", "TV(native, softmax)", False),
    ("top_bucket_mass", "softmax mass in the top bucket", False),
)


def _save(fig, path: Path, title: str | None = None, *, bottom=0.0, top=0.95, panels=()) -> Path:
    """Letter the ``panels`` (a), (b), ..., title the figure (its layout keeps ``bottom`` for a figure legend
    and the band above ``top`` for the title), write it to ``path`` and close it."""
    for ax, letter in zip(panels, "abcdefgh"):
        ax.set_title(f"({letter})", fontsize=9, loc="left")
    if title is None:
        fig.tight_layout()
    else:
        fig.suptitle(title, fontsize=10)
        fig.tight_layout(rect=(0, bottom, 1, top))
    try:
        with atomic.naming(path):  # a full disk: the error names the figure
            fig.savefig(path, dpi=130)
    finally:
        plt.close(fig)
    return path


def colours(labels) -> dict[str, tuple]:
    """label -> colour, one per label in sorted order: matplotlib's default ten (tab10); beyond ten labels
    tab20, then tab20b and tab20c (60 colours: suite D's 25 conditions with the others of a report; they
    repeat only beyond 60). The report passes one such map to every figure with a line per condition, so
    that a condition keeps its colour from figure to figure (softmax, in the geometry figure only, keeps its
    colour out of the others)."""
    names = sorted(set(labels))
    if len(names) <= 10:
        palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    else:
        palette = [plt.get_cmap(m)(i) for m in ("tab20", "tab20b", "tab20c") for i in range(20)]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, ncol=1 + n // 20)


def _log_x(ax) -> None:
    """Log x axis labelled at 1, 2, 5 per decade in plain numbers (no crowded minor labels); where that
    labels fewer than two values in view (spans of 9 to 15: 10 alone), at evenly spaced round values."""
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) if 0 < lo < hi else ()
    labelled = [m * 10.0**e for e in decades for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    if decades and len(labelled) < 2:
        ax.xaxis.set_major_locator(
            FixedLocator([t for t in MaxNLocator(5).tick_values(lo, hi) if lo <= t <= hi])
        )
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _next_125(x: float) -> float:
    """The smallest of 1, 2 and 5 times a power of ten that is at least ``x`` > 0."""
    decade = 10.0 ** math.floor(math.log10(x))
    return next(m * decade for m in (1.0, 2.0, 5.0, 10.0) if m * decade >= x * (1 - 1e-12))


def _symlog_y(ax, values, linthresh: float) -> None:
    """symlog y (linear within ±linthresh), labelled at 1, 2 and 5 per decade (a band reaching 0.05 is read
    at 0.02 and 0.05, not left between the decade ticks 0.01 and 0.1); values that all sit in the linear part
    get a plain linear axis, which is the same scale there, with evenly spaced ticks."""
    values = [v for v in values if math.isfinite(v)]  # a non-finite value has no place on the axis
    if max((abs(v) for v in values), default=0.0) > linthresh:
        ax.set_yscale("symlog", linthresh=linthresh)
        ax.yaxis.set_major_locator(SymmetricalLogLocator(linthresh=linthresh, base=10, subs=(1.0, 2.0, 5.0)))
        # the axis reaches the next labelled value beyond the data, so that no point sits past the last
        # label (-0.028 below a last tick of -0.02 reads as about -0.0225 on a log scale)
        lo, hi = ax.get_ylim()
        top, bottom = max(values), min(values)
        # 0, the reference of every ΔNLL axis, stays in view (with half the linear band beyond it) when all
        # values have one sign: the fixed limits would otherwise leave the zero line out
        ax.set_ylim(
            min(lo, -_next_125(-bottom)) if bottom < -linthresh else min(lo, -linthresh / 2),
            max(hi, _next_125(top)) if top > linthresh else max(hi, linthresh / 2),
        )
    else:
        ax.yaxis.set_major_locator(MaxNLocator(6, symmetric=False))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))


def _tokens_axis(ax) -> None:
    ax.set_xlabel("training tokens")
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    ax.grid(alpha=0.3)


def trajectory_figure(
    traj: dict,
    path: Path,
    title: str,
    *,
    ylabel: str = "ΔNLL vs softmax (nats/token)",
    symlog: bool = True,
    colours: dict | None = None,
) -> Path:
    """ΔNLL vs training tokens, one line per condition with its CI band; symlog vertical axis (linear within
    ±0.02 nats) as in the paper's figures, so that 0.01-nat and 1-nat gaps are both readable. ``colours``:
    label -> colour (:func:`colours`); without it, or for a label it lacks, matplotlib's cycle."""
    ncol = 1 + len(traj) // 20  # many conditions (a full grid): a wider figure with a multi-column legend
    fig, ax = plt.subplots(figsize=(8 + 3.5 * ncol, max(4.5, 0.2 * len(traj) / ncol + 1)))
    values = []
    for op, pts in sorted(traj.items()):
        t = [p[0] for p in pts]
        values += [v for p in pts for v in p[1:4] if math.isfinite(v)]
        line = ax.plot(
            t, [p[1] for p in pts], marker="o", ms=3, lw=1.2, label=op, color=(colours or {}).get(op)
        )[0]
        ax.fill_between(t, [p[2] for p in pts], [p[3] for p in pts], color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(0, color="k", lw=0.8)
    if symlog:
        _symlog_y(ax, values, linthresh=0.02)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    _tokens_axis(ax)
    _legend(ax, len(traj))
    return _save(fig, path)


def geometry_figure(
    series: dict[str, list[tuple[int, dict]]], path: Path, title: str, colours: dict | None = None
) -> Path:
    """Layer-mean span, h, TV and top-bucket mass vs training tokens per condition (legend below);
    ``colours`` as in :func:`trajectory_figure`."""
    ncol = 4
    legend_h = 0.17 * -(-len(series) // ncol) + 0.3  # inches: one line per legend row
    fig, axes = plt.subplots(1, len(GEOMETRY), figsize=(17, 4 + legend_h))
    for ax, (key, label, log) in zip(axes, GEOMETRY):
        for op, pts in sorted(series.items()):
            vals = [(t, g.get(key)) for t, g in pts if g.get(key) is not None and g.get(key) == g.get(key)]
            if vals:
                ax.plot([v[0] for v in vals], [v[1] for v in vals], marker="o", ms=3, lw=1.2, label=op,
                        color=(colours or {}).get(op))  # fmt: skip
        ax.set_ylabel(label)
        _tokens_axis(ax)
        if log and any(line.get_ydata().min() > 0 for line in ax.get_lines()):
            ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", frameon=False, ncol=ncol)
    return _save(fig, path, title, bottom=legend_h / (4 + legend_h), panels=axes)


def endpoint_figure(
    rows: list[dict], path: Path, title: str, xlabel: str = "ΔNLL vs softmax (nats/token), 95% CI"
) -> Path:
    """Horizontal bars: ΔNLL per condition (``operator``: its label) with its 95% CI."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    y = list(range(len(rows)))
    ax.barh(y, [r["delta"] for r in rows], color="#4c72b0", alpha=0.8)
    err = [[r["delta"] - r["lo"] for r in rows], [r["hi"] - r["delta"] for r in rows]]
    ax.errorbar([r["delta"] for r in rows], y, xerr=err, fmt="none", ecolor="k", capsize=3, lw=1)
    ax.set_yticks(y, [r["operator"] for r in rows], fontsize=8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def widthgap_figure(points: dict[str, tuple[float, float, float]], path: Path, title: str) -> Path:
    """Condition-mean endpoint ΔNLL against native width h and row span (Figure widthgap): log x, symlog y
    (linear within ±0.02 nats). ``points``: condition -> (h, span, ΔNLL)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, i, label in ((axes[0], 0, "native width h (log)"), (axes[1], 1, "row span M − m (log)")):
        xs = [(v[i], v[2], op) for op, v in sorted(points.items()) if v[i] is not None and v[i] > 0]
        ax.scatter([x for x, _, _ in xs], [y for _, y, _ in xs], s=18, color="#4c72b0")
        for x, y, op in xs if len(xs) <= 12 else ():  # a designed grid of 25 conditions: points only
            ax.annotate(op, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        _log_x(ax)
        _symlog_y(ax, [y for _, y, _ in xs], linthresh=0.02)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("endpoint ΔNLL vs softmax (nats/token)")
        ax.grid(alpha=0.3, which="both")
    return _save(fig, path, title, panels=axes)


def validation_figure(pairs, path: Path, title: str, colours: dict | None = None) -> Path:
    """fig:detach (a, b), fig:detachextra, fig:e1 (a, c): (a) logged validation loss minus the same-seed
    softmax run's (absolute loss when a pair has no softmax run), (b) logged layer-mean row span (log) and
    (c) the validation-loss difference modified − full (symlog, linear within ±0.02 nats) along training
    tokens. One colour per pair (``colours``: label -> the modified run's colour in the report's other
    figures); solid: the modified backward, dashed: its same-seed full-gradient twin.
    ``pairs``: label -> :class:`~kinterval.report.analysis.ValidationPair`."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    minus = all(getattr(v, "minus_softmax", None) is not None for v in pairs.values())
    diffs = []
    for label, v in sorted(pairs.items()):
        own, full = v.minus_softmax if minus else (v.val_loss, v.control_val_loss)
        c = (colours or {}).get(label)
        c = axes[0].plot(v.tokens, own, marker="o", ms=3, lw=1.2, label=label, color=c)[0].get_color()
        axes[0].plot(v.tokens, full, ls="--", lw=1.0, color=c)
        axes[1].plot(v.tokens, v.row_span, marker="o", ms=3, lw=1.2, color=c)
        axes[1].plot(v.tokens, v.control_row_span, ls="--", lw=1.0, color=c)
        axes[2].plot(v.tokens, v.diff, marker="o", ms=3, lw=1.2, color=c)
        diffs += v.diff
    if minus:
        axes[0].axhline(0, color="k", lw=0.8)
        axes[0].set_ylabel("validation loss − same-seed softmax (nats/token)")
    else:
        axes[0].set_ylabel("logged validation loss (nats/token)")
    axes[1].set_ylabel("logged row span M − m (score units, log)")
    if all(y > 0 for line in axes[1].get_lines() for y in line.get_ydata()):
        axes[1].set_yscale("log")
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set_ylabel("validation loss, modified − full (nats/token)")
    _symlog_y(axes[2], diffs, linthresh=0.02)
    for ax in axes:
        _tokens_axis(ax)
    handles, labels = axes[0].get_legend_handles_labels()
    rows = -(-len(labels) // 3)
    fig.legend(handles, labels, fontsize=7, loc="lower center", frameon=False, ncol=3)
    legend_h = 0.17 * rows + 0.3
    fig.set_size_inches(17, 4.6 + legend_h)
    title += " (solid: modified backward, dashed: full-gradient twin)"
    return _save(fig, path, title, bottom=legend_h / (4.6 + legend_h), panels=axes)


def _interval(ax, x, row, color, marker="o", fill=True, label=None, points=True) -> None:
    """A seed mean with its 95% interval as an error bar, and (several seeds) the per-seed values as dots."""
    e = row.est
    ax.errorbar(
        [x],
        [e.mean],
        yerr=[[e.mean - e.lo], [e.hi - e.mean]],
        fmt=marker,
        ms=5,
        color=color,
        mfc=color if fill else "white",
        capsize=3,
        lw=1,
        label=label,
    )
    if points and len(e.per_seed) > 1:
        ax.scatter([x] * len(e.per_seed), e.per_seed, s=10, color=color, alpha=0.6, lw=0, zorder=3)


EFFECT_STYLE = {"calibration": "#4c72b0", "surrogate": "#dd8452", "interaction": "#55a868"}


def seeds_figure(conditions: dict, effects: dict, path: Path, title: str) -> Path:
    """fig:seeds, its panels in the paper's order: (a) calibration, surrogate and interaction effects by K
    (log2 K), per seed, mean and t interval; (b) seed SD of each condition's ΔNLL against its paired
    evaluation SE (log-log) with the 1:1 line; then (c), which the paper does not draw: endpoint ΔNLL vs
    same-seed softmax per condition, per-seed values (dots), seed mean and 95% t interval (symlog, linear
    within ±0.02 nats). ``conditions``: label -> delta Row; ``effects``: effect name -> {K: factorial Row}."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2), gridspec_kw={"width_ratios": [1.2, 1, 2.2]})
    ax = axes[2]
    labels = list(conditions)
    vals = []
    for i, lab in enumerate(labels):
        _interval(ax, i, conditions[lab], "#4c72b0")
        vals += [*conditions[lab].est.per_seed, conditions[lab].est.lo, conditions[lab].est.hi]
    ax.set_xticks(range(len(labels)), labels, rotation=70, ha="right", fontsize=6)
    ax.axhline(0, color="k", lw=0.8)
    _symlog_y(ax, vals, linthresh=0.02)
    ax.set_ylabel("endpoint ΔNLL vs same-seed softmax (nats/token)")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[0]
    vals = []
    for j, (name, by_K) in enumerate(effects.items()):
        for K, row in by_K.items():
            x = K * 2 ** (0.08 * (j - 1))  # a small horizontal offset per effect
            _interval(ax, x, row, EFFECT_STYLE.get(name, f"C{j}"), label=name if K == min(by_K) else None)
            vals += [*row.est.per_seed, row.est.lo, row.est.hi]
        Ks = sorted(by_K)
        ax.plot(
            [K * 2 ** (0.08 * (j - 1)) for K in Ks],
            [by_K[K].est.mean for K in Ks],
            lw=0.8,
            color=EFFECT_STYLE.get(name, f"C{j}"),
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.axhline(0, color="k", lw=0.8)
    _symlog_y(ax, vals, linthresh=0.02)
    ax.set_xlabel("K")
    ax.set_ylabel("factorial effect (nats/token), paired by seed")
    if effects:
        ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    ax = axes[1]
    xy = [(r.est.eval_se, r.est.sd) for r in conditions.values() if r.est.sd and r.est.eval_se]
    if xy:
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=14, color="#4c72b0")
        lo, hi = min(min(p) for p in xy) / 1.5, max(max(p) for p in xy) * 1.5
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls="--", label="1:1")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7, frameon=False)
    ax.set_xlabel("paired evaluation SE of ΔNLL (log)")
    ax.set_ylabel("seed SD of ΔNLL (log)")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path, title, panels=axes)


CELL_STYLE = {  # (calibration label, surrogate index, colour)
    "mm_w": ("MinMax", 0, "#c44e52"),
    "mm_p": ("MinMax", 1, "#c44e52"),
    "fwm_w": ("FWM", 0, "#4c72b0"),
    "fwm_p": ("FWM", 1, "#4c72b0"),
}


def _not_run(ax, why: str) -> None:
    """An empty panel whose runs are absent: "not run" and why."""
    text = "not run\n" + textwrap.fill(f"({why})", 48)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _log2_x(ax, Ks) -> None:
    """log2 K axis, labelled in plain numbers, half a doubling of margin around the K values shown."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if Ks:
        ax.set_xlim(min(Ks) / 2**0.5, max(Ks) * 2**0.5)
    ax.set_xlabel("K")


def factorial_figure(
    cells: dict[int, dict],
    families: dict[str, dict],
    path: Path,
    title: str,
    surrogate: dict[str, dict] | None = None,
    family_colours: dict[str, tuple] | None = None,
) -> Path:
    """fig:2x2. One panel per K: endpoint ΔNLL vs softmax of the four cells by surrogate placement
    (Weight-STE filled, Prob-STE hollow), one line per calibration, 95% intervals; dotted: LERP at the same K.
    Then: mean ΔNLL vs K (log2) per family with its interval (symlog y; Prob-STE families hollow and
    dashed, the others filled and solid); last, panel (d): the surrogate effect Prob −
    Weight vs K (log2) under each calibration, paired by seed, with its interval (symlog y). A panel with
    nothing to show says "not run" and why. ``cells``: K -> cell (``mm_w``, ..., ``lerp``) -> Row;
    ``families``: family -> {K: Row}; ``surrogate``: calibration (``MinMax``, ``FWM``) -> {K: Row};
    ``family_colours``: a family's colour in the report's other figures (the next of the cycle without)."""
    Ks = sorted(cells)
    fig, axes = plt.subplots(1, len(Ks) + 2, figsize=(3.2 * len(Ks) + 9, 4.4), squeeze=False)
    for ax, K in zip(axes[0], Ks):
        vals = []
        for cal, off in (("MinMax", -0.04), ("FWM", 0.04)):
            rows = {
                CELL_STYLE[c][1]: r
                for c, r in cells[K].items()
                if c in CELL_STYLE and CELL_STYLE[c][0] == cal
            }
            color = next(s[2] for s in CELL_STYLE.values() if s[0] == cal)
            for x, r in sorted(rows.items()):  # filled: Weight-STE (x 0), hollow: Prob-STE (x 1)
                _interval(ax, x + off, r, color, fill=x == 0, label=cal if x == 0 else None, points=False)
                vals += [r.est.lo, r.est.hi]
            ax.plot(
                [x + off for x in sorted(rows)], [rows[x].est.mean for x in sorted(rows)], color=color, lw=1
            )
        if "lerp" in cells[K]:
            ax.axhline(cells[K]["lerp"].est.mean, color="grey", ls=":", lw=1.2, label="LERP")
            vals.append(cells[K]["lerp"].est.mean)
        ax.axhline(0, color="k", lw=0.8)
        _symlog_y(ax, vals, linthresh=0.02)
        ax.set_xticks([0, 1], ["Weight-STE", "Prob-STE"])
        ax.set_xlim(-0.4, 1.4)
        ax.set_title(f"K = {K}", fontsize=9)
        ax.set_ylabel("endpoint ΔNLL vs softmax (nats/token)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, frameon=False)
    ax = axes[0][-2]
    ax.set_title("all families", fontsize=9)
    if not families:
        _not_run(ax, "no family measured")
    else:
        vals = []
        for j, (fam, by_K) in enumerate(sorted(families.items())):
            ks, prob = sorted(by_K), "-prob" in fam  # the caption's styles: Prob-STE hollow and dashed
            xs = [K * 2 ** (0.05 * (j - 2)) for K in ks]
            colour = (family_colours or {}).get(fam) or f"C{j}"
            for x, K in zip(xs, ks):
                label = fam if K == ks[0] else None
                _interval(ax, x, by_K[K], colour, fill=not prob, label=label, points=False)
                vals += [by_K[K].est.lo, by_K[K].est.hi]
            ax.plot(xs, [by_K[K].est.mean for K in ks], color=colour, lw=1, ls="--" if prob else "-")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        _symlog_y(ax, vals, linthresh=0.02)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("K")
        ax.set_ylabel("mean ΔNLL vs softmax (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, frameon=False)
    ax = axes[0][-1]
    ax.set_title("surrogate effect Prob − Weight", fontsize=9)
    if not surrogate:
        _not_run(ax, "no Prob − Weight contrast")
    else:
        vals = []
        for j, (cal, by_K) in enumerate(surrogate.items()):
            color = next((s[2] for s in CELL_STYLE.values() if s[0] == cal), f"C{j}")
            xs = [K * 2 ** (0.05 * (2 * j - 1)) for K in by_K]  # MinMax a little left, FWM right
            for x, row in zip(xs, by_K.values()):
                _interval(ax, x, row, color, label=cal if x == xs[0] else None, points=False)
                vals += [row.est.lo, row.est.hi]
            ax.plot(xs, [r.est.mean for r in by_K.values()], color=color, lw=1)
        _log2_x(ax, [K for by_K in surrogate.values() for K in by_K])
        _symlog_y(ax, vals, linthresh=0.02)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_ylabel("Prob − Weight (nats/token), paired by seed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    return _save(fig, path, title, top=0.93, panels=axes[0])


def k_figure(
    final: dict,
    gap: dict,
    vs_lerp: dict,
    not_run: dict,
    path: Path,
    title: str,
    K: int = 4,
    colours: dict | None = None,
) -> Path:
    """fig:k. (a) Endpoint ΔNLL vs softmax by K (log2) and family, at the measured K only, whiskers: the
    95% interval; (b) ΔNLL vs softmax along training of the K = ``K`` conditions with their interval bands;
    (a, b) symlog, linear within ±0.02 nats. (c) Each Nearest condition minus the same-seed LERP at K along
    training with its interval band, linear. ``final``: family -> {K: Row}; ``gap``, ``vs_lerp``: label ->
    [Row per checkpoint]; ``not_run``: panel letter -> why (an empty "not run" panel). A family has one
    colour in all three panels (a line of (b) or (c) takes its rows' family's colour in (a)): ``colours``
    (operator -> colour, the report's map) gives a family the colour of its K = ``K`` condition, as in the
    other figures; a family without one takes the next of matplotlib's cycle."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.0))
    ax = axes[0]
    vals = []
    n = len(final)
    family_colour = {
        rows[0].family: (colours or {})[op] for op, rows in gap.items() if rows and op in (colours or {})
    }
    for j, fam in enumerate(final):
        family_colour.setdefault(fam, f"C{j}")
    for j, (fam, by_K) in enumerate(final.items()):
        xs = [K_ * 2 ** (0.04 * (j - (n - 1) / 2)) for K_ in by_K]  # a small offset per family
        for x, row in zip(xs, by_K.values()):
            _interval(ax, x, row, family_colour[fam], label=fam if x == xs[0] else None, points=False)
            vals += [row.est.lo, row.est.hi]
        if len(xs) > 1:
            ax.plot(xs, [r.est.mean for r in by_K.values()], color=family_colour[fam], lw=1)
    _log2_x(ax, [K_ for by_K in final.values() for K_ in by_K])
    _symlog_y(ax, vals, linthresh=0.02)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel("endpoint ΔNLL vs softmax (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, frameon=False)
    for ax, series, letter, ylabel in (
        (axes[1], gap, "b", "ΔNLL vs softmax (nats/token)"),
        (axes[2], vs_lerp, "c", f"Nearest − LERP K={K} (nats/token)"),
    ):
        if not series:
            _not_run(ax, not_run.get(letter, "no runs"))
            continue
        vals = []
        for label, rows in series.items():
            t = [r.tokens for r in rows]
            colour = family_colour.get(rows[0].family) if rows else None  # None: the next of the cycle
            line = ax.plot(
                t, [r.est.mean for r in rows], marker="o", ms=3, lw=1.2, label=label, color=colour
            )[0]
            lo, hi = [r.est.lo for r in rows], [r.est.hi for r in rows]
            ax.fill_between(t, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
            vals += lo + hi
        ax.axhline(0, color="k", lw=0.8)
        if letter == "b":
            _symlog_y(ax, vals, linthresh=0.02)
        ax.set_ylabel(ylabel)
        _tokens_axis(ax)
        ax.legend(fontsize=6, frameon=False)
    return _save(fig, path, title, top=0.94, panels=axes)
