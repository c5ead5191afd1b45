"""What each figure plots: the figures are kept open (``plt.close`` intercepted) and their artists read back
against hand-written values: which series on which axis, interval ends, the control's dashed line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kinterval.report import figures as F
from kinterval.report.analysis import Estimate, Row


@pytest.fixture
def figs(monkeypatch):
    kept, close = [], F.plt.close
    monkeypatch.setattr(F.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


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
