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
    assert _bar_ends(figs[0].axes[0], 0) == pytest.approx([(0.05, 0.3)])


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
    assert _bar_ends(figs[0].axes[0], 1) == pytest.approx([(0.05, 0.3)])


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
        assert sorted(_bar_ends(ax, 1)) == pytest.approx(want)
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
