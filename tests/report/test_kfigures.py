"""fig:2x2 (c, d) and fig:k (a, b, c) from planted per-block results: what each panel plots, in report.json,
is recomputed here from the evaluation arrays themselves (same-seed differences per block, the seed mean and
its t interval), and the figures draw those numbers; a panel whose runs are absent is "not run"."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from synthetic_results import write_results

from kinterval.report import figures as F
from kinterval.report.analysis import Estimate, Row
from kinterval.report.build import build_report

pytestmark = pytest.mark.xdist_group("kfigures")  # one worker builds the module fixtures

SUITE = """
name = "kfig"
title = "kfig: 2x2 at K=4 and 16, LERP K=4/16, three seeds"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = [7, 42, 253]
checkpoints = 3

[eval]
split = "val"

[[group]]
name = "softmax"
operators = ["softmax"]

[[group]]
name = "lerp"
operators = ["lerp-k{K}"]
K = [4, 16]

[[group]]
name = "factorial"
operators = ["minmax-weight-k{K}", "minmax-prob-k{K}", "fwm-weight-k{K}", "fwm-prob-k{K}"]
K = [4, 16]
"""
BASE = {"lerp": 0.05, "minmax-weight": 0.30, "minmax-prob": 0.12, "fwm-weight": 0.04, "fwm-prob": 0.02}
OFFSET = {7: -0.004, 42: 0.001, 253: 0.003}  # a planted seed spread (t intervals of non-zero width)
FAMILIES = list(BASE)


def planted(op: str) -> float:
    if op == "softmax":
        return 0.0
    fam, K = op.rsplit("-k", 1)
    return BASE[fam] * 4 / int(K)


def effect(r, frac):
    op = r["operator"]
    return 0.0 if op == "softmax" else (planted(op) + OFFSET[r["seed"]]) * frac


def _build(tmp, name, runs=None):
    (tmp / "kfig.toml").write_text(SUITE)
    m = write_results(tmp / name, tmp / "kfig.toml", effect, n_blocks=40, noise=0.004, runs=runs)
    build_report([tmp / name], tmp / f"{name}-rep")
    rep = tmp / f"{name}-rep"
    return m, rep, json.loads((rep / "report.json").read_text())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kfig")
    m, rep, data = _build(tmp, "full")
    return tmp / "full", m, rep, data


@pytest.fixture(scope="module")
def no_lerp4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kfig_nolerp")
    return _build(tmp, "nolerp", runs=lambda r: r["operator"] != "lerp-k4")


def _nll(root, m, op, seed, i=-1) -> tuple[int, np.ndarray]:
    """(step, per-block NLL) of the run of ``op`` and ``seed`` at its ``i``-th checkpoint, from its files."""
    (r,) = [r for r in m["runs"] if r["operator"] == op and r["seed"] == seed]
    step = r["checkpoint_steps"][i]
    return step, np.load(root / r["eval_dir"] / f"step_{step:06d}.npz")["nll"]


def _t(per_seed) -> tuple[float, float, float]:
    """(mean, lo, hi): the seed mean and its 95% t interval (n − 1 df), by hand."""
    x = np.asarray(per_seed)
    h = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return x.mean(), x.mean() - h, x.mean() + h


def _check(est, want) -> None:
    assert (est["mean"], est["lo"], est["hi"]) == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert est["interval"] == f"t ({len(OFFSET) - 1} df)"


def _contrast(root, m, a, b, i=-1) -> tuple[float, float, float]:
    """Seed mean of a − b (same seed, per block, mean over blocks) with its t interval."""
    return _t([(_nll(root, m, a, s, i)[1] - _nll(root, m, b, s, i)[1]).mean() for s in sorted(OFFSET)])


def test_2x2_surrogate_effect_by_K_under_each_calibration(full):
    """fig:2x2 (d): Prob − Weight at K = 4 and 16 under MinMax and FWM, paired by seed, t intervals."""
    root, m, _, data = full
    d = data["factorial_cells"]["surrogate_effect"]
    assert set(d) == {"MinMax", "FWM"}
    for cal, fam in (("MinMax", "minmax"), ("FWM", "fwm")):
        assert sorted(map(int, d[cal])) == [4, 16]
        for K, v in d[cal].items():
            assert v["seeds"] == sorted(OFFSET)
            want = _contrast(root, m, f"{fam}-prob-k{K}", f"{fam}-weight-k{K}")
            _check(v["est"], want)
            planted_effect = planted(f"{fam}-prob-k{K}") - planted(f"{fam}-weight-k{K}")
            assert want[0] == pytest.approx(planted_effect, abs=0.003)
            # the same contrast as the factorial table's simple effect
            (row,) = [
                r
                for r in data["factorial"]
                if r["contrast"] == f"Prob − Weight under {cal}" and r["K"] == int(K)
            ]
            assert row["est"]["mean"] == v["est"]["mean"]


def test_2x2_families_by_K(full):
    """fig:2x2 (c): each family's seed-mean ΔNLL vs softmax at each K with its t interval."""
    root, m, _, data = full
    fams = data["factorial_cells"]["families"]
    assert set(fams) == set(FAMILIES)
    for fam, by_K in fams.items():
        assert sorted(map(int, by_K)) == [4, 16]
        for K, est in by_K.items():
            _check(est, _contrast(root, m, f"{fam}-k{K}", "softmax"))


def test_k_figure_endpoints_by_K_and_family(full):
    """fig:k (a): endpoint ΔNLL vs softmax by family at the measured K."""
    root, m, rep, data = full
    k = data["k_figure"]
    assert k["setting"][0] == m["runs"][0]["tokens"] and k["K"] == 4 and k["not_run"] == {}
    assert list(k["final"]) == FAMILIES  # the paper's family order
    for fam, by_K in k["final"].items():
        assert sorted(map(int, by_K)) == [4, 16]
        for K, v in by_K.items():
            assert v["operator"] == f"{fam}-k{K}"
            _check(v["est"], _contrast(root, m, f"{fam}-k{K}", "softmax"))
    assert "![" in (rep / "index.md").read_text() and (rep / "kscaling.png").stat().st_size > 20_000


def test_k_figure_gap_and_nearest_minus_lerp_along_training(full):
    """fig:k (b): the K=4 conditions' ΔNLL vs softmax at every checkpoint; (c) each Nearest K=4 condition
    minus the same-seed LERP K=4 at every checkpoint."""
    root, m, _, data = full
    k = data["k_figure"]
    assert list(k["gap"]) == [f"{f}-k4" for f in FAMILIES]
    nearest = [f"{f}-k4" for f in FAMILIES if f != "lerp"]
    assert list(k["nearest_minus_lerp"]) == nearest
    steps = m["runs"][0]["checkpoint_steps"]
    for series, control in ((k["gap"], "softmax"), (k["nearest_minus_lerp"], "lerp-k4")):
        for op, pts in series.items():
            assert len(pts) == len(steps)
            tokens = [p["tokens"] for p in pts]
            assert tokens == sorted(tokens)
            for i, p in enumerate(pts):
                _check(p["est"], _contrast(root, m, op, control, i))
    # planted: (Nearest − LERP) grows linearly along training to its endpoint value
    last = k["nearest_minus_lerp"]["minmax-weight-k4"][-1]["est"]["mean"]
    assert last == pytest.approx(BASE["minmax-weight"] - BASE["lerp"], abs=0.003)


def test_k_figure_without_lerp_is_not_run(no_lerp4):
    """No LERP K=4 run: panel (c) is "not run" (in report.json and index.md); (a) and (b) still drawn."""
    m, rep, data = no_lerp4
    k = data["k_figure"]
    assert k["nearest_minus_lerp"] == {}
    assert "no lerp-k4 run" in k["not_run"]["c"] and set(k["not_run"]) == {"c"}
    assert "lerp-k4" not in k["gap"] and sorted(map(int, k["final"]["lerp"])) == [16]
    assert "kscaling.png (c): not run (no lerp-k4 run" in (rep / "index.md").read_text()


# --- the figures draw what they are given ---


def _row(mean, lo, hi, tokens=0):
    return Row("c", None, (1, 2), Estimate(mean, lo, hi, "t (1 df)", 2, (lo, hi)), tokens=tokens)


def _bar_ends(ax):
    """(x, low, high) of each vertical error bar of the axes."""
    ends = []
    for c in ax.containers:
        if hasattr(c, "has_yerr"):
            for seg in c.lines[2][0].get_segments():
                ends.append((float(seg[0][0]), *sorted(float(p[1]) for p in seg)))
    return sorted(ends)


def _texts(ax):
    return " ".join(t.get_text() for t in ax.texts)


def test_factorial_figure_panel_d_and_not_run(figs, tmp_path):
    cells = {4: {c: _row(0.1, 0.05, 0.2) for c in ("mm_w", "mm_p", "fwm_w", "fwm_p")}}
    sur = {
        "MinMax": {4: _row(-0.3, -0.4, -0.2), 16: _row(-0.1, -0.15, -0.05)},
        "FWM": {4: _row(-0.02, -0.03, -0.01)},
    }
    F.factorial_figure(cells, {}, tmp_path / "f.png", "t", sur)
    d = figs[0].axes[2]
    got = [(lo, hi) for _, lo, hi in _bar_ends(d)]
    np.testing.assert_allclose(
        np.asarray(sorted(got), float),
        np.asarray(sorted([(-0.4, -0.2), (-0.15, -0.05), (-0.03, -0.01)]), float),
        rtol=1e-6,
        atol=1e-12,
    )
    assert d.get_xscale() == "log" and "Prob − Weight" in d.get_title()
    F.factorial_figure(cells, {}, tmp_path / "g.png", "t", {})
    assert "not run" in _texts(figs[1].axes[2]) and not _bar_ends(figs[1].axes[2])
    # the by-K panel without a family: "not run" and why, not an empty 0-1 frame
    for fig in figs[:2]:
        assert "not run" in _texts(fig.axes[1]) and "no family measured" in _texts(fig.axes[1])
    F.factorial_figure(
        cells, {"lerp": {4: _row(0.1, 0.0, 0.2), 16: _row(0.05, 0.0, 0.1)}}, tmp_path / "h.png", "t"
    )
    assert not _texts(figs[2].axes[1]) and len(_bar_ends(figs[2].axes[1])) == 2


def test_k_figure_panels(figs, tmp_path):
    final = {
        "lerp": {4: _row(0.05, 0.04, 0.06), 16: _row(0.01, 0.0, 0.02)},
        "fwm-prob": {4: _row(0.2, 0.1, 0.3)},
    }
    gap = {"lerp-k4": [_row(0.1, 0.08, 0.12, 1000), _row(0.05, 0.04, 0.06, 2000)]}
    F.k_figure(final, gap, {}, {"c": "no lerp-k4 run"}, tmp_path / "k.png", "t")
    a, b, c = figs[0].axes[:3]
    np.testing.assert_allclose(
        np.asarray(sorted((lo, hi) for _, lo, hi in _bar_ends(a)), float),
        np.asarray(sorted([(0.04, 0.06), (0.0, 0.02), (0.1, 0.3)]), float),
        rtol=1e-6,
        atol=1e-12,
    )
    assert a.get_xscale() == "log" and a.get_yscale() == "symlog"  # |ΔNLL| beyond 0.02: symlog
    (line,) = [ln for ln in b.lines if ln.get_label() == "lerp-k4"]
    assert list(line.get_xdata()) == [1000, 2000] and list(line.get_ydata()) == [0.1, 0.05]
    v = np.concatenate([p.vertices for p in b.collections[0].get_paths()])
    assert (v[v[:, 0] == 1000, 1].min(), v[v[:, 0] == 1000, 1].max()) == pytest.approx((0.08, 0.12))
    assert "not run" in _texts(c) and "no lerp-k4 run" in _texts(c) and not c.lines
    F.k_figure(final, gap, gap, {}, tmp_path / "k2.png", "t")
    assert figs[1].axes[2].get_yscale() == "linear"  # (c): linear


def test_k_figure_a_family_keeps_its_colour_in_every_panel(figs, tmp_path):
    """Panel (a) colours by family in its order (lerp first); a line of (b) or (c) takes its rows' family's
    colour, whatever its place among the lines of its own panel."""
    from dataclasses import replace

    from matplotlib.colors import to_rgba

    final = {"lerp": {4: _row(0.05, 0.04, 0.06)}, "minmax-weight": {4: _row(0.2, 0.1, 0.3)}}
    mw = [replace(_row(0.1, 0.08, 0.12, t), family="minmax-weight") for t in (1000, 2000)]
    gap = {
        "minmax-weight-k4": mw,
        "lerp-k4": [replace(_row(0.05, 0.04, 0.06, t), family="lerp") for t in (1000, 2000)],
    }
    F.k_figure(final, gap, {"minmax-weight-k4": mw}, {}, tmp_path / "k.png", "t")
    a, b, c = figs[0].axes[:3]
    in_a = {}
    for cont in a.containers:  # each family's error bars: its label and colour
        if hasattr(cont, "has_yerr") and cont.get_label() in final:
            in_a[cont.get_label()] = to_rgba(cont.lines[0].get_color())
    assert set(in_a) == set(final) and in_a["lerp"] != in_a["minmax-weight"]
    for ax in (b, c):
        for line in ax.lines:
            if line.get_label().endswith("-k4"):
                family = line.get_label().removesuffix("-k4")
                assert to_rgba(line.get_color()) == in_a[family], (line.get_label(), ax)


TAU8 = """
[[group]]
name = "fwm-tau8"
operators = ["fwm-weight-k4[tau=8]", "fwm-prob-k4[tau=8]"]
"""


def test_2x2_surrogate_effect_is_that_of_the_plotted_design(tmp_path):
    """FWM runs at another tau in the same setting make a second design (MinMax joins it) whose Prob −
    Weight differs: fig:2x2 (d) shows the design of the plotted cells (default tau), not the other one."""
    (tmp_path / "kfig.toml").write_text(SUITE + TAU8)  # the suite, and FWM at tau=8 too

    def effect_tau8(r, frac):  # at tau=8, Prob − Weight under FWM is 0.12 larger than at the default tau
        op = r["operator"]
        if not op.endswith("[tau=8]"):
            return effect(r, frac)
        return (planted(op.removesuffix("[tau=8]")) + OFFSET[r["seed"]] + 0.12 * ("-prob-" in op)) * frac

    m = write_results(tmp_path / "res", tmp_path / "kfig.toml", effect_tau8, n_blocks=40, noise=0.004)
    build_report([tmp_path / "res"], tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    v = data["factorial_cells"]["surrogate_effect"]["FWM"]["4"]
    _check(v["est"], _contrast(tmp_path / "res", m, "fwm-prob-k4", "fwm-weight-k4"))
    assert v["est"]["mean"] == pytest.approx(planted("fwm-prob-k4") - planted("fwm-weight-k4"), abs=0.003)


def test_k_figure_colours_families_in_the_given_order_and_joins_a_family_measured_at_two_K(figs, tmp_path):
    """The families in the paper's order, which is not the alphabetical one (lerp before fwm-prob): a line
    of (b) keeps its family's colour in (a); in (a) a family at two K is one line through its two means."""
    from dataclasses import replace

    from matplotlib.colors import to_rgba

    final = {
        "lerp": {4: _row(0.05, 0.04, 0.06), 16: _row(0.01, 0.0, 0.02)},
        "fwm-prob": {4: _row(0.2, 0.1, 0.3)},
    }
    gap = {"fwm-prob-k4": [replace(_row(0.1, 0.08, 0.12, t), family="fwm-prob") for t in (1000, 2000)]}
    F.k_figure(final, gap, {}, {"c": "no lerp-k4 run"}, tmp_path / "k.png", "t")
    a, b = figs[0].axes[:2]
    in_a = {c.get_label(): to_rgba(c.lines[0].get_color()) for c in a.containers if c.get_label() in final}
    (line,) = [ln for ln in b.lines if ln.get_label() == "fwm-prob-k4"]
    assert to_rgba(line.get_color()) == in_a["fwm-prob"] != in_a["lerp"]
    joined = [ln for ln in a.lines if len(ln.get_xdata()) == 2 and ln.get_marker() in ("None", None)]
    joined = [ln for ln in joined if list(ln.get_xdata()) != [0, 1]]  # not the zero line
    assert [list(ln.get_ydata()) for ln in joined] == [[0.05, 0.01]]
    assert [ax.get_title(loc="left") for ax in figs[0].axes[:3]] == ["(a)", "(b)", "(c)"]
