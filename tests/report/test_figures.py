"""What each figure plots: the figures are kept open (``plt.close`` intercepted) and their artists read back
against hand-written values: which series on which axis, interval ends, the control's dashed line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kinterval.report import figures as F
from kinterval.report.analysis import Estimate, Row


def _bar_ends(ax, axis):
    """(low, high) of each error bar of the axes' error-bar containers, along ``axis`` (0: x, 1: y)."""
    ends = []
    for c in ax.containers:
        if hasattr(c, "has_xerr"):
            for seg in c.lines[2][0].get_segments():
                ends.append(tuple(sorted(float(p[axis]) for p in seg)))
    return ends


def test_endpoint_bars_span_the_interval(figs, tmp_path):
    rows = [{"operator": "a", "delta": 0.1, "lo": 0.05, "hi": 0.3}]
    F.endpoint_figure(rows, tmp_path / "e.png", "t")
    np.testing.assert_allclose(
        np.asarray(_bar_ends(figs[0].axes[0], 0), float),
        np.asarray([(0.05, 0.3)], float),
        rtol=1e-6,
        atol=1e-12,
    )


def test_width_gap_plots_h_then_span(figs, tmp_path):
    F.widthgap_figure({"a": (0.5, 20.0, 0.1), "b": (2.0, 8.0, -0.05)}, tmp_path / "w.png", "t")
    ax_h, ax_span = figs[0].axes[:2]
    assert "width h" in ax_h.get_xlabel() and "span" in ax_span.get_xlabel()
    assert np.asarray(ax_h.collections[0].get_offsets()).tolist() == [[0.5, 0.1], [2.0, -0.05]]
    assert np.asarray(ax_span.collections[0].get_offsets()).tolist() == [[20.0, 0.1], [8.0, -0.05]]


def test_validation_panels_modified_solid_control_dashed(figs, tmp_path):
    v = SimpleNamespace(tokens=[1, 2], val_loss=[5.0, 4.0], control_val_loss=[5.1, 4.2],
                        row_span=[10.0, 20.0], control_row_span=[11.0, 21.0], diff=[-0.1, -0.2])  # fmt: skip
    F.validation_figure({"x": v}, tmp_path / "v.png", "t")
    loss, span, diff = figs[0].axes[:3]
    assert [list(line.get_ydata()) for line in loss.lines] == [[5.0, 4.0], [5.1, 4.2]]
    assert [line.get_linestyle() for line in loss.lines] == ["-", "--"]
    assert [list(line.get_ydata()) for line in span.lines] == [[10.0, 20.0], [11.0, 21.0]]
    assert list(diff.lines[0].get_ydata()) == [-0.1, -0.2]


def test_seed_figure_intervals_are_the_rows_intervals(figs, tmp_path):
    est = Estimate(0.1, 0.05, 0.3, "block bootstrap", 1, (0.1,))  # asymmetric, as a bootstrap interval can be
    F.seeds_figure({"a": Row("a − softmax", None, (7,), est)}, {}, tmp_path / "s.png", "t")
    np.testing.assert_allclose(
        np.asarray(_bar_ends(figs[0].axes[2], 1), float),  # (c): per condition
        np.asarray([(0.05, 0.3)], float),
        rtol=1e-6,
        atol=1e-12,
    )


def test_trajectory_line_is_the_mean_and_band_spans_the_interval(figs, tmp_path):
    traj = {"a": [(1000, 0.1, 0.05, 0.2), (2000, 0.3, 0.2, 0.5)], "b": [(1000, -0.01, -0.03, 0.004)]}
    F.trajectory_figure(traj, tmp_path / "t.png", "t")
    ax = figs[0].axes[0]
    lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    for op, pts in traj.items():
        assert list(lines[op].get_xdata()) == [p[0] for p in pts]
        assert list(lines[op].get_ydata()) == pytest.approx([p[1] for p in pts])
    bands = ax.collections  # one fill per condition, in the lines' (sorted) order
    assert len(bands) == len(traj)
    for band, (_, pts) in zip(bands, sorted(traj.items())):
        v = np.concatenate([p.vertices for p in band.get_paths()])
        for t, _, lo, hi in pts:
            ys = v[v[:, 0] == t, 1]
            assert (ys.min(), ys.max()) == pytest.approx((lo, hi))


def test_geometry_panels_plot_each_metric_as_given(figs, tmp_path):
    nan = float("nan")
    series = {
        "a": [(1000, {"span": 12.0, "h": 3.0, "tv": 0.2, "top_bucket_mass": 0.9}),
              (2000, {"span": 20.0, "h": 5.0, "tv": 0.1, "top_bucket_mass": 0.95})],
        "b": [(1000, {"span": 8.0, "h": 1.5, "tv": nan, "top_bucket_mass": 0.7}),
              (2000, {"span": 9.0, "h": 2.0, "tv": 0.3, "top_bucket_mass": 0.75})],
    }  # fmt: skip
    F.geometry_figure(series, tmp_path / "g.png", "t")
    axes = figs[0].axes[: len(F.GEOMETRY)]
    for ax, (key, label, log) in zip(axes, F.GEOMETRY):
        assert ax.get_ylabel() == label
        got = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
        want = {
            op: ([t for t, g in pts if g[key] == g[key]], [g[key] for _, g in pts if g[key] == g[key]])
            for op, pts in series.items()
        }  # a NaN point is left out, not plotted
        assert got == want
        assert ax.get_yscale() == ("log" if log else "linear")


def _row(mean, lo, hi):
    return Row("c", None, (1,), Estimate(mean, lo, hi, "t (n-1 df)", 2, (lo, hi)))


def _joining_lines(ax):
    """The lines through several points without markers: not the error bars' points and caps, nor the
    horizontal reference lines (an ``axhline`` runs over x = [0, 1] in axes coordinates)."""
    return [
        line
        for line in ax.lines
        if len(line.get_xdata()) > 1
        and line.get_marker() in ("None", None)
        and list(line.get_xdata()) != [0, 1]
    ]


def test_factorial_panels_one_line_per_calibration_through_its_cells(figs, tmp_path):
    cells = {
        K: {
            "mm_w": _row(0.1 * K, 0.05 * K, 0.2 * K),
            "mm_p": _row(0.3 * K, 0.25 * K, 0.4 * K),
            "fwm_w": _row(-0.02 * K, -0.04 * K, 0.0),
            "fwm_p": _row(0.01 * K, 0.0, 0.03 * K),
            "lerp": _row(0.5, 0.4, 0.6),
        }
        for K in (1, 4)
    }
    families = {"lerp": {1: _row(0.5, 0.4, 0.6), 4: _row(0.2, 0.1, 0.3)}}
    F.factorial_figure(cells, families, tmp_path / "f.png", "t")
    axes = figs[0].axes
    for ax, K in zip(axes, (1, 4)):
        c = cells[K]
        assert ax.get_title() == f"K = {K}"
        # MinMax at x - 0.04, FWM at x + 0.04 (x: 0 Weight-STE, 1 Prob-STE), each calibration's cells joined
        joined = {
            tuple(np.round(ln.get_xdata(), 6)): (ln.get_color(), ln.get_ydata()) for ln in _joining_lines(ax)
        }
        assert joined == {
            (-0.04, 0.96): ("#c44e52", pytest.approx([c["mm_w"].est.mean, c["mm_p"].est.mean])),
            (0.04, 1.04): ("#4c72b0", pytest.approx([c["fwm_w"].est.mean, c["fwm_p"].est.mean])),
        }
        handles, labels = ax.get_legend_handles_labels()
        colors = [h.lines[0].get_color() if hasattr(h, "lines") else h.get_color() for h in handles]
        assert dict(zip(labels, colors)) == {"MinMax": "#c44e52", "FWM": "#4c72b0", "LERP": "grey"}
        want = sorted((c[k].est.lo, c[k].est.hi) for k in ("mm_w", "mm_p", "fwm_w", "fwm_p"))
        np.testing.assert_allclose(
            np.asarray(sorted(_bar_ends(ax, 1)), float), np.asarray(want, float), rtol=1e-6, atol=1e-12
        )
        assert [list(ln.get_ydata()) for ln in ax.lines if ln.get_label() == "LERP"] == [[0.5, 0.5]]
    assert [list(ln.get_ydata()) for ln in _joining_lines(axes[2])] == [[0.5, 0.2]]  # the family's means by K


def test_a_condition_keeps_its_colour_across_figures(figs, tmp_path):
    """trajectories.png has no softmax line, geometry.png has one: with the report's one colour map the
    other conditions keep their colours from one figure to the other (matplotlib's cycle alone would shift
    every condition after softmax by one colour), and no two conditions share one."""
    from matplotlib.colors import to_rgba

    traj = {op: [(1, 0.1, 0.0, 0.2), (2, 0.05, 0.0, 0.1)] for op in ("lerp-k4", "minmax-weight-k4")}
    geo = {op: [(1, {"span": 3.0, "h": 1.0, "tv": 0.1, "top_bucket_mass": 0.5})] for op in (*traj, "softmax")}
    colours = F.colours([*traj, *geo])
    assert len(set(colours.values())) == 3
    F.trajectory_figure(traj, tmp_path / "t.png", "t", colours=colours)
    F.geometry_figure(geo, tmp_path / "g.png", "g", colours)
    t_lines = {
        line.get_label(): to_rgba(line.get_color())
        for line in figs[0].axes[0].lines
        if line.get_label() in traj
    }
    g_lines = {line.get_label(): to_rgba(line.get_color()) for line in figs[1].axes[0].lines}
    assert set(t_lines) == set(traj) and set(g_lines) == set(geo)
    for op in traj:
        assert t_lines[op] == g_lines[op] == to_rgba(colours[op]), op
    assert len(set(g_lines.values())) == 3
    many = F.colours([f"op{i}" for i in range(15)])  # beyond ten: tab20, still one colour each
    assert len(set(many.values())) == 15


def test_trajectory_ticks_read_a_band_between_decades(figs, tmp_path):
    """A band reaching ±0.05 on the symlog axis (linear within ±0.02) is labelled at 0.02 and 0.05 as well as
    the decades; a trajectory inside ±0.02 gets a plain linear axis with evenly spaced ticks."""
    F.trajectory_figure({"a": [(1, 0.0, -0.05, 0.05), (2, 0.01, -0.04, 0.06)]}, tmp_path / "t.png", "t")
    F.trajectory_figure({"a": [(1, 0.0, -0.004, 0.004), (2, 0.001, -0.003, 0.005)]}, tmp_path / "u.png", "u")
    wide, tiny = figs[0].axes[0], figs[1].axes[0]
    for fig in figs:
        fig.canvas.draw()
    lo, hi = wide.get_ylim()
    shown = {t.get_text() for t in wide.get_yticklabels() if lo <= t.get_position()[1] <= hi}
    assert wide.get_yscale() == "symlog" and {"0", "0.01", "0.02", "0.05", "-0.02", "-0.05"} <= shown
    assert tiny.get_yscale() == "linear" and len([t for t in tiny.get_yticks() if -0.004 <= t <= 0.005]) >= 3


def test_a_symlog_axis_is_labelled_beyond_its_outermost_value(figs, tmp_path):
    """A point at -0.028 sat below the last label, -0.02, and read as about -0.0225 on the log part of the
    axis; the axis now reaches the next 1-2-5 label beyond the data on either side (0.12: 0.2)."""
    F.trajectory_figure({"a": [(1, 0.0, -0.01, 0.12), (2, -0.028, -0.03, -0.025)]}, tmp_path / "t.png", "t")
    ax = figs[0].axes[0]
    figs[0].canvas.draw()
    lo, hi = ax.get_ylim()
    assert lo <= -0.05 and hi >= 0.2
    shown = {t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi}
    assert {"-0.05", "0.2"} <= shown
    F._symlog_y(figs[0].axes[0], [float("inf"), -0.03, float("nan")], linthresh=0.02)  # no OverflowError


# --- what each axis says, fixed here rather than read from the module's own tables ---


def test_geometry_panels_are_span_h_tv_and_top_bucket_mass_with_their_scales(figs, tmp_path):
    """The panels in the paper's order with their metric, label and scale; a condition drawn on the span
    panel only (softmax: no native width) is in the figure's legend all the same."""
    pts = [(1000, {"span": 12.0, "h": 3.0, "tv": 0.2, "top_bucket_mass": 0.9}),
           (2000, {"span": 20.0, "h": 5.0, "tv": 0.1, "top_bucket_mass": 0.95})]  # fmt: skip
    F.geometry_figure(
        {"a": pts, "softmax": [(1000, {"span": 9.0}), (2000, {"span": 11.0})]}, tmp_path / "g.png", "t"
    )
    axes = figs[0].axes[:4]
    assert [ax.get_ylabel() for ax in axes] == [
        "row span M − m (score units, log)",
        "native width h (score units, log)",
        "TV(native, softmax)",
        "softmax mass in the top bucket",
    ]
    assert [ax.get_yscale() for ax in axes] == ["log", "log", "linear", "linear"]
    a = {ax.get_ylabel().split(" (")[0]: list(ax.lines[0].get_ydata()) for ax in axes}
    assert a == {
        "row span M − m": [12.0, 20.0],
        "native width h": [3.0, 5.0],
        "TV(native, softmax)": [0.2, 0.1],
        "softmax mass in the top bucket": [0.9, 0.95],
    }
    assert all(ax.get_xlabel() == "training tokens" for ax in axes)
    assert sorted(t.get_text() for t in figs[0].legends[0].get_texts()) == ["a", "softmax"]


def test_trajectory_axes_and_endpoint_bars_say_what_they_show(figs, tmp_path):
    F.trajectory_figure({"a": [(1000, 0.1, 0.05, 0.2)]}, tmp_path / "t.png", "t")
    ax = figs[0].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("training tokens", "ΔNLL vs softmax (nats/token)")
    rows = [{"operator": "a", "delta": 0.1, "lo": 0.05, "hi": 0.3},
            {"operator": "b", "delta": -0.2, "lo": -0.3, "hi": -0.1}]  # fmt: skip
    F.endpoint_figure(rows, tmp_path / "e.png", "t")
    ax = figs[1].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    widths = [bar.get_width() for bar in ax.patches]
    assert dict(zip(labels, widths)) == pytest.approx({"a": 0.1, "b": -0.2})  # each bar under its own name


def test_a_figure_that_cannot_be_written_names_its_file_and_is_closed(figs, tmp_path, monkeypatch):
    import errno
    import os

    from matplotlib.figure import Figure

    def full(self, path, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a flush raises it: no file name

    monkeypatch.setattr(Figure, "savefig", full)
    path = tmp_path / "e.png"
    with pytest.raises(OSError) as info:
        F.endpoint_figure([{"operator": "a", "delta": 0.1, "lo": 0.0, "hi": 0.2}], path, "t")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert len(figs) == 1  # closed all the same


def test_colours_follow_the_sorted_labels_whatever_their_order():
    assert F.colours(["b", "a", "c"]) == F.colours(["c", "a", "b", "a"])
    assert list(F.colours(["b", "a"])) == ["a", "b"]


def test_a_condition_keeps_its_colour_in_the_k_figure(figs, tmp_path):
    """kscaling.png coloured its families by their own order (FWM–Prob blue there, brown in the trajectories):
    a condition's line has one colour in every figure."""
    from matplotlib.colors import to_hex
    from synthetic_results import write_results

    from kinterval.report.build import build_report

    eff = lambda r, f: 0.0 if r["operator"] == "softmax" else 0.05 * f  # noqa: E731
    write_results(tmp_path / "ci", "ci", eff, n_blocks=32)
    build_report([tmp_path / "ci"], tmp_path / "rep")

    def title(fig):
        return fig._suptitle.get_text() if fig._suptitle is not None else fig.axes[0].get_title()

    traj = next(f for f in figs if title(f).startswith("ΔNLL vs same-seed softmax"))
    kfig = next(f for f in figs if title(f).startswith("K scaling"))

    def colours(fig):
        return {ln.get_label(): to_hex(ln.get_color()) for ax in fig.axes for ln in ax.get_lines()
                if not ln.get_label().startswith("_")}  # fmt: skip

    in_k, in_traj = colours(kfig), colours(traj)
    shared = set(in_k) & set(in_traj)
    assert len(shared) >= 3, (in_k, in_traj)
    assert {op: in_k[op] for op in shared} == {op: in_traj[op] for op in shared}


def test_width_gap_leaves_out_a_condition_without_a_positive_width_on_that_panel_only(figs, tmp_path):
    F.widthgap_figure(
        {"a": (0.5, 20.0, 0.1), "s": (0.0, 8.0, 0.0), "n": (None, 4.0, 0.2)}, tmp_path / "w.png", "t"
    )
    ax_h, ax_span = figs[0].axes[:2]
    assert np.asarray(ax_h.collections[0].get_offsets()).tolist() == [[0.5, 0.1]]
    assert sorted(np.asarray(ax_span.collections[0].get_offsets()).tolist()) == [
        [4.0, 0.2],
        [8.0, 0.0],
        [20.0, 0.1],
    ]


def test_validation_panel_a_is_minus_the_same_seed_softmax_where_every_pair_has_one(figs, tmp_path):
    """fig:detach (a), fig:detachextra (a): logged validation loss minus the same-seed softmax run's, the
    modified run solid and its full twin dashed."""
    from kinterval.report.analysis import ValidationPair
    from kinterval.report.results import Key

    v = ValidationPair(Key("lerp-k32[range_grad=detach]", 1, "d", "val"), "lerp-k32", 7, [1, 2], [5.0, 4.0],
                       [5.1, 4.2], [10.0, 20.0], [11.0, 21.0], [4.5, 4.1])  # fmt: skip
    F.validation_figure({"x": v}, tmp_path / "v.png", "t")
    loss = figs[0].axes[0]
    got = [list(line.get_ydata()) for line in loss.lines if line.get_linestyle() in ("-", "--")][:2]
    assert got == [pytest.approx([0.5, -0.1]), pytest.approx([0.6, 0.1])]
    assert "same-seed softmax" in loss.get_ylabel()


def test_validation_span_panel_is_log_and_the_difference_panel_symlog_beyond_two_centinats(figs, tmp_path):
    v = SimpleNamespace(tokens=[1, 2], val_loss=[5.0, 4.0], control_val_loss=[5.1, 4.2],
                        row_span=[10.0, 20.0], control_row_span=[11.0, 21.0], diff=[-0.1, -0.2])  # fmt: skip
    F.validation_figure({"x": v}, tmp_path / "v.png", "t")
    loss, span, diff = figs[0].axes[:3]
    assert (span.get_yscale(), diff.get_yscale()) == ("log", "symlog")
    assert [ax.get_title(loc="left") for ax in (loss, span, diff)] == ["(a)", "(b)", "(c)"]
    assert all(ax.get_xlabel() == "training tokens" for ax in (loss, span, diff))


def test_seed_figure_effect_lines_join_the_means_and_sd_is_plotted_against_the_evaluation_se(figs, tmp_path):
    def row(mean, lo, hi, per_seed, se=None, sd=None):
        return Row("c", None, (1, 2), Estimate(mean, lo, hi, "t (1 df)", 2, per_seed, eval_se=se, sd=sd))

    conditions = {"a": row(0.1, 0.0, 0.2, (0.05, 0.15), se=0.01, sd=0.07)}
    effects = {"calibration": {4: row(0.3, 0.1, 0.5, (0.2, 0.4)), 16: row(0.2, 0.0, 0.4, (0.1, 0.3))}}
    F.seeds_figure(conditions, effects, tmp_path / "s.png", "t")
    a, b, _ = figs[0].axes[:3]  # the paper's (a) effects by K and (b) seed SD against evaluation SE
    (line,) = _joining_lines(a)
    assert list(line.get_ydata()) == [0.3, 0.2]
    xy = np.asarray(b.collections[0].get_offsets()).tolist()
    assert xy == [[0.01, 0.07]]  # x: the evaluation SE, y: the seed SD
    assert "evaluation SE" in b.get_xlabel() and "seed SD" in b.get_ylabel()
    assert [ax.get_title(loc="left") for ax in figs[0].axes[:3]] == ["(a)", "(b)", "(c)"]


def test_factorial_cells_are_labelled_by_surrogate_placement(figs, tmp_path):
    cells = {4: {c: _row(0.1, 0.05, 0.2) for c in ("mm_w", "mm_p", "fwm_w", "fwm_p")}}
    F.factorial_figure(cells, {}, tmp_path / "f.png", "t")
    ax = figs[0].axes[0]
    assert [(t, lab.get_text()) for t, lab in zip(ax.get_xticks(), ax.get_xticklabels())] == [
        (0, "Weight-STE"),
        (1, "Prob-STE"),
    ]


def test_factorial_styles_follow_the_caption_weight_filled_and_solid_prob_hollow_and_dashed(figs, tmp_path):
    """fig:2x2's caption: filled markers / solid lines for Weight-STE, hollow / dashed for Prob-STE, in the
    cell panels (a, b) and in the families' panel (c)."""
    from matplotlib.colors import to_rgba

    cells = {4: {c: _row(0.1, 0.05, 0.2) for c in ("mm_w", "mm_p", "fwm_w", "fwm_p")}}
    two_K = {4: _row(0.1, 0.05, 0.2), 8: _row(0.05, 0.0, 0.1)}
    families = {"minmax-weight": two_K, "minmax-prob": two_K}
    F.factorial_figure(cells, families, tmp_path / "f.png", "t")
    cell_ax, fam_ax = figs[0].axes[:2]

    def hollow(line):
        return to_rgba(line.get_markerfacecolor()) == to_rgba("white")

    means = [ln for ln in cell_ax.lines if ln.get_marker() == "o"]  # not the error bars' caps
    assert {round(ln.get_xdata()[0]): hollow(ln) for ln in means} == {0: False, 1: True}
    joins = {ln.get_color(): ln.get_linestyle() for ln in fam_ax.lines if ln.get_marker() in ("None", None)}
    joins.pop("k")  # the zero line
    assert sorted(joins.values()) == ["-", "--"]
    fills = {lab: hollow(h.lines[0]) for h, lab in zip(*fam_ax.get_legend_handles_labels())}
    assert fills.get("minmax-prob") is True and fills.get("minmax-weight") is False


def test_a_trajectory_line_takes_its_colour_from_the_map_not_from_the_cycle(figs, tmp_path):
    """A map made with a label the trajectories lack (it sorts first): the cycle would give "b" the map's
    colour of "a"."""
    from matplotlib.colors import to_rgba

    colours = F.colours(["a", "b", "c"])
    F.trajectory_figure({"b": [(1, 0.1, 0.0, 0.2)], "c": [(1, 0.2, 0.1, 0.3)]}, tmp_path / "t.png", "t",
                        colours=colours)  # fmt: skip
    got = {ln.get_label(): to_rgba(ln.get_color()) for ln in figs[0].axes[0].lines if ln.get_label() in "bc"}
    assert got == {"b": to_rgba(colours["b"]), "c": to_rgba(colours["c"])}


def test_colours_stay_distinct_beyond_twenty_conditions():
    """Suite D's grid with its softmax and detach rows is over 20 labels: tab20 repeated, and fwm-prob-k4
    drew in minmax-weight-k32's colour. 60 stay distinct (tab20, tab20b, tab20c)."""
    labels = [f"c{i:02d}" for i in range(60)]
    assert len(set(F.colours(labels).values())) == 60
    assert len(set(F.colours(labels[:7]).values())) == 7


def test_a_symlog_axis_keeps_zero_in_view_when_the_values_have_one_sign(figs, tmp_path):
    """fig:2x2 (d) asks whether Prob − Weight is below 0: with every value below -0.02 the fixed symlog
    limits (-0.1, -0.0055) left the zero line out of the panel."""
    F.trajectory_figure({"a": [(1, -0.09, -0.1, -0.08), (2, -0.03, -0.035, -0.025)]}, tmp_path / "t.png", "t")
    lo, hi = figs[0].axes[0].get_ylim()
    assert lo <= -0.1 and hi >= 0.01
    F.trajectory_figure({"b": [(1, 0.09, 0.08, 0.1), (2, 0.03, 0.025, 0.035)]}, tmp_path / "u.png", "t")
    lo, hi = figs[1].axes[0].get_ylim()
    assert lo <= -0.01 and hi >= 0.1


def test_a_log_axis_within_one_decade_gets_more_than_one_label(figs, tmp_path):
    """widthgap's span axis from 9 to 15 was labelled "10" alone (1, 2, 5 per decade)."""
    F.widthgap_figure({"a": (0.5, 9.1, 0.1), "b": (2.0, 15.0, -0.05)}, tmp_path / "w.png", "t")
    figs[0].canvas.draw()
    ax = figs[0].axes[1]
    lo, hi = ax.get_xlim()
    shown = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi and t.get_text()]
    assert len(shown) >= 3, shown
    assert [ax.get_title(loc="left") for ax in figs[0].axes[:2]] == ["(a)", "(b)"]


def test_the_factorial_families_take_the_reports_colours(figs, tmp_path):
    """fig:2x2 (c) drew each family in the cycle's next colour (LERP green there, red in kscaling.png)."""

    def row(m):
        return Row("x", None, (1,), Estimate(m, m - 0.01, m + 0.01, "t (n-1 df)", 2, (m, m)))

    fams = {"lerp": {4: row(0.05), 16: row(-0.01)}, "minmax-weight": {4: row(0.1)}}
    F.factorial_figure({}, fams, tmp_path / "f.png", "t", family_colours={"lerp": (1.0, 0.0, 0.0, 1.0)})
    ax = [a for a in figs[0].axes if a.get_title() == "all families"][0]
    lerp = [line for line in ax.lines if len(line.get_xdata()) == 2][0]
    assert lerp.get_color() == (1.0, 0.0, 0.0, 1.0) and lerp.get_linestyle() == "-"
