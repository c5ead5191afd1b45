"""The one rule (block bootstrap for one seed, seed summary for several), factorial cells from the operator
spec (tau included), full-gradient twins and pairing keys, on in-memory points."""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import pytest

from kinterval.report import analysis as A
from kinterval.report.results import Point
from kinterval.stats import (
    block_bootstrap_ci,
    k_trend_slopes,
    label_single_seed,
    permutation_p_exact,
    seed_summary,
)

N = 48


def point(op, seed, nll, *, budget=1000, tokens=1000, step=10, data="d", tag="val", **kw):
    n = len(nll)
    return Point(
        "s", f"{op}-s{seed}", "g", op, seed, budget, step, tokens, tag, (data, "val", 64, n), nll, **kw
    )


def test_estimate_one_seed_is_the_block_bootstrap():
    x = np.random.default_rng(0).normal(0.1, 0.05, N)
    e = A.estimate({7: x})
    b = block_bootstrap_ci(x, block=16, n_resamples=4000)
    assert (e.mean, e.lo, e.hi, e.interval, e.n_seeds) == (b.mean, b.lo, b.hi, "block bootstrap", 1)
    assert e.eval_se == pytest.approx(b.se) and e.sd is None and e.p == b.p == 2 / 4001


@pytest.mark.parametrize("n", [2, 5, 10, 16, 24, 31])
def test_estimate_on_a_short_series_uses_half_its_length_as_the_block(n):
    """Below 32 blocks the block is n // 2 (a resample holds two blocks at least): the old block
    min(16, n) = n made every resample a rotation of the series, a zero-width CI that excluded 0 for noise."""
    x = np.random.default_rng(n).normal(0.0, 0.05, n)
    e = A.estimate({7: x})
    assert e.hi - e.lo > 0 and e.lo < x.mean() < e.hi, (e.lo, e.hi)
    b = block_bootstrap_ci(x, block=n // 2, n_resamples=4000)
    assert (e.lo, e.hi, e.p, e.eval_se) == (b.lo, b.hi, b.p, b.se) and e.block == n // 2
    several = A.estimate({7: x, 42: x + 0.01})
    assert several.block == n // 2 and several.eval_se > 0
    assert A.estimate({7: np.resize(x, 48)}).block == 16


def test_several_seeds_of_different_lengths_record_the_shortest_series_block():
    """Seeds with 20 and 48 blocks: each seed's bootstrap uses its own block (10 and 16), the SE is their
    mean, and ``block`` is the shortest series' one (10), not the longest's."""
    rng = np.random.default_rng(12)
    xs = {7: rng.normal(0.02, 0.05, 20), 42: rng.normal(0.03, 0.05, 48)}
    e = A.estimate(xs)
    se = [block_bootstrap_ci(xs[7], block=10, n_resamples=4000).se]
    se += [block_bootstrap_ci(xs[42], block=16, n_resamples=4000).se]
    assert e.block == 10 and e.eval_se == pytest.approx(np.mean(se), rel=1e-12)


def test_path_ratio_interval_on_a_short_series_is_not_degenerate():
    rng = np.random.default_rng(4)
    fwm = rng.normal(5, 0.3, 10)
    mm = fwm + rng.normal(0.2, 0.1, 10)
    res = mm - 0.4 * (mm - fwm) + rng.normal(0, 0.05, 10)
    ratio, lo, hi = A.path_ratio_ci(mm, res, fwm)
    assert lo < ratio < hi and hi - lo > 0.01, (ratio, lo, hi)


def test_estimate_several_seeds_is_the_seed_summary():
    rng = np.random.default_rng(1)
    xs = {s: rng.normal(m, sd, N) for s, m, sd in ((7, 0.10, 0.02), (42, 0.13, 0.05), (1337, 0.08, 0.1))}
    e = A.estimate(xs)
    means = [xs[s].mean() for s in (7, 42, 1337)]
    ss = seed_summary(means)
    assert (e.mean, e.lo, e.hi, e.sd, e.interval) == pytest.approx((ss.mean, ss.lo, ss.hi, ss.sd, "t (2 df)"))
    assert e.p == permutation_p_exact(means) and e.per_seed == tuple(means)
    # the paired evaluation SE (tab:seedend, fig:seeds b): the mean over seeds of each seed's block-bootstrap
    # SE of the contrast (the seeds' evaluation noise differs here: 0.02, 0.05, 0.1 per block)
    ses = [block_bootstrap_ci(xs[s], block=16, n_resamples=4000).se for s in (7, 42, 1337)]
    assert e.eval_se == pytest.approx(np.mean(ses), rel=1e-12) and max(ses) > 3 * min(ses)


def test_factorial_takes_tau_from_the_spec():
    """FWM cells at tau=5 form a factorial with the MinMax cells (the old code required tau == 6.0)."""
    base = np.random.default_rng(2).normal(4.0, 0.2, N)
    eff = {
        "minmax-weight-k4": 0.2,
        "minmax-prob-k4": 0.14,
        "fwm-weight-k4[tau=5]": 0.04,
        "fwm-prob-k4[tau=5]": 0.01,
    }
    pts = [point(op, 7, base + e) for op, e in eff.items()]
    rows = {r.contrast: r for r in A.factorial_effects(pts)}
    assert {"calibration", "surrogate", "interaction", "Prob − Weight under FWM"} <= set(rows)
    assert rows["Prob − Weight under FWM"].est.mean == pytest.approx(0.01 - 0.04)
    assert rows["interaction"].est.mean == pytest.approx((0.01 - 0.04) - (0.14 - 0.2))
    assert "tau=5" in rows["interaction"].family
    assert rows["interaction"].est.interval == "block bootstrap"


def test_family_and_full_twin_come_from_the_spec():
    p = point("fwm-prob-k16[tau=5,range_grad=detach]", 7, np.zeros(N))
    assert (p.K, p.family) == (16, "fwm-prob[tau=5,range_grad=detach]")
    assert A.full_twin("lerp-k32[range_grad=detach]") == "lerp-k32"
    assert A.full_twin("minmax-weight-k4[range_grad=max_only,arithmetic=historical]") == (
        "minmax-weight-k4[arithmetic=historical]"
    )
    assert A.full_twin("lerp-k32") is None
    with pytest.raises(ValueError, match="unknown operator"):
        A.full_twin("lerp-kx")


def test_single_seed_k_trend_gets_a_block_bootstrap_interval():
    base = np.random.default_rng(3).normal(4.0, 0.2, N)
    noise = np.random.default_rng(4).normal(0, 0.01, (3, N))
    pts = [point("softmax", 7, base)]
    pts += [point(f"lerp-k{K}", 7, base + d + n) for K, d, n in zip((4, 16, 64), (0.09, 0.05, 0.01), noise)]
    (row,) = A.k_trends(A.softmax_pairs(pts))
    assert row.est.mean == pytest.approx(-0.02, abs=3e-3)
    assert row.est.interval == "block bootstrap" and row.est.lo < row.est.mean < row.est.hi < 0


def test_path_ratio_interval_resamples_the_three_runs_together():
    rng = np.random.default_rng(3)
    fwm = rng.normal(5.0, 0.3, N)
    mm = fwm + rng.normal(0.2, 0.1, N)  # a noisy MinMax − FWM gap per block
    res = mm - 0.4 * (mm - fwm)  # resolved recovers exactly 40% of the gap in every block
    ratio, lo, hi = A.path_ratio_ci(mm, res, fwm)
    # paired resampling: every resample's ratio is 0.4; independent resampling would spread it
    assert (ratio, lo, hi) == pytest.approx((0.4, 0.4, 0.4), abs=1e-12)
    res_noisy = res + rng.normal(0, 0.02, N)
    ratio, lo, hi = A.path_ratio_ci(mm, res_noisy, fwm)
    assert lo < ratio < hi and 0.2 < lo and hi < 0.6
    with pytest.raises(ValueError, match="path ratio"):
        A.path_ratio_ci(mm, res[:-1], fwm)


@pytest.mark.parametrize(
    ("lo", "hi", "excludes_zero", "separated", "within_margin"),
    [
        (0.0, 0.005, False, False, True),  # touching zero includes zero
        (0.001, 0.005, True, False, True),
        (0.01, 0.02, True, False, False),  # separated needs lo strictly above +0.01
        (0.0101, 0.02, True, True, False),
        (-0.01, 0.005, False, False, False),  # touching the margin is not wholly inside
        (-0.005, 0.01, False, False, False),
        (-0.0099, 0.0099, False, False, True),
        (-0.02, 0.0, False, False, False),
        (-0.03, -0.011, True, False, False),  # a detectable improvement is never "separated"
    ],
)
def test_estimate_labels_at_their_boundaries(lo, hi, excludes_zero, separated, within_margin):
    """The report's labels of a 95% CI are those of App. C.3, strict at every boundary, and agree with
    ``label_single_seed`` (the 0.01-nat margin)."""
    e = A.Estimate((lo + hi) / 2, lo, hi, "block bootstrap", 1, ((lo + hi) / 2,))
    assert (e.excludes_zero, e.separated, e.within_margin) == (excludes_zero, separated, within_margin)
    lab = label_single_seed(lo, hi, margin=A.MARGIN)
    assert (lab.detectable, lab.separated, lab.within_margin) == (excludes_zero, separated, within_margin)


def test_one_seed_with_one_block_is_an_error_not_a_nan_interval():
    """The old code returned lo = hi = NaN, printed as [+nan, +nan] in the claims table."""
    with pytest.raises(ValueError, match="lerp-k4 − softmax, seed 7: one seed with one validation block"):
        A.estimate({7: np.array([0.5])}, "lerp-k4 − softmax")
    e = A.estimate({7: np.array([0.5]), 42: np.array([0.7])})  # several seeds: the t interval over seeds
    assert e.interval == "t (1 df)" and np.isfinite(e.lo) and e.eval_se is None


def test_a_non_finite_contrast_names_the_row_seed_and_block():
    """The old code raised the bootstrap's "x contains NaN or infinite values", naming nothing."""
    base = np.random.default_rng(10).normal(4.0, 0.2, N)
    bad = base + 0.05
    bad[3] = np.nan
    pts = [point("softmax", 7, base), point("lerp-k4", 7, bad)]
    with pytest.raises(
        ValueError, match=r"lerp-k4 − softmax \[val, 1000 tokens\], seed 7: .*\(nan\) at block 3"
    ):
        A.delta_table(A.softmax_pairs(pts))


def test_path_ratio_is_none_where_undefined_and_refuses_a_non_finite_block():
    """MinMax and FWM of equal mean NLL (zero denominator) returned (nan, nan, nan), and so did a NaN block:
    undefined is None now (the report prints "-"), a non-finite block a ValueError naming it."""
    rng = np.random.default_rng(3)
    mm = rng.normal(5.0, 0.3, 40)
    assert A.path_ratio_ci(mm, mm - 0.1, mm.copy()) is None
    bad = mm.copy()
    bad[5] = np.nan
    with pytest.raises(ValueError, match="resolved per-block NLL is not finite at block 5"):
        A.path_ratio_ci(mm, bad, mm - 0.2)


def test_path_ratio_interval_is_the_percentile_interval_of_explicit_resamples():
    """Reference: build each resample's block indices explicitly (circular blocks of 16 from the same
    generator draws), take the ratio of the resampled mean gaps, and its 2.5% and 97.5% quantiles."""
    rng = np.random.default_rng(11)
    n = 50
    fwm = rng.normal(5.0, 0.3, n)
    mm = fwm + rng.normal(0.2, 0.05, n)
    res = mm - 0.4 * (mm - fwm) + rng.normal(0, 0.03, n)
    ratio, lo, hi = A.path_ratio_ci(mm, res, fwm)
    n_blocks = -(-n // 16)
    starts = np.random.default_rng(0).integers(0, n, size=(4000, n_blocks))
    idx = ((starts[:, :, None] + np.arange(16)) % n).reshape(4000, -1)[:, :n]
    ref = (mm - res)[idx].mean(axis=1) / (mm - fwm)[idx].mean(axis=1)
    assert ratio == pytest.approx((mm.mean() - res.mean()) / (mm.mean() - fwm.mean()), rel=1e-12)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])), rel=1e-9)


def test_delta_row_reports_the_seed_sd_of_the_condition_nll():
    base = np.random.default_rng(5).normal(4.0, 0.2, N)
    levels = {7: 0.0, 42: 0.03, 1337: 0.01}
    pts = [point("softmax", s, base + v) for s, v in levels.items()]
    pts += [point("lerp-k4", s, base + v + 0.05 + 0.02 * (s == 42)) for s, v in levels.items()]
    (row,) = A.delta_table(A.softmax_pairs(pts))
    means = [0.05, 0.03 + 0.07, 0.01 + 0.05]  # the shared base shifts every mean alike
    assert row.nll_sd == pytest.approx(statistics.stdev(means), abs=1e-9)  # n - 1 in the denominator
    assert row.est.per_seed == pytest.approx((0.05, 0.07, 0.05))  # seeds 7, 42, 1337


def test_delta_row_reports_the_condition_and_control_nll_over_seeds():
    """tab:seedend's NLL columns: the condition's mean NLL over seeds and its same-seed control's, each the
    mean of the per-seed means (the control is not the condition)."""
    rng = np.random.default_rng(13)
    soft = {s: rng.normal(4.0 + 0.1 * i, 0.2, N) for i, s in enumerate((7, 42))}
    lerp = {s: x + rng.normal(0.05, 0.01, N) for s, x in soft.items()}
    pts = [point("softmax", s, x) for s, x in soft.items()] + [
        point("lerp-k4", s, x) for s, x in lerp.items()
    ]
    (row,) = A.delta_table(A.softmax_pairs(pts))
    assert row.nll == pytest.approx(np.mean([lerp[7].mean(), lerp[42].mean()]), rel=1e-12)
    assert row.control_nll == pytest.approx(np.mean([soft[7].mean(), soft[42].mean()]), rel=1e-12)
    assert row.nll - row.control_nll == pytest.approx(row.est.mean, rel=1e-9)


def test_estimate_p_is_exact_up_to_twenty_seeds_and_random_above():
    """The sign-flip p is the exact enumeration for n <= 20 seeds (2^20 assignments), the random one above."""
    from kinterval.stats import permutation_p_random

    rng = np.random.default_rng(14)
    xs = {s: rng.normal(0.002 * (s % 3), 0.05, 8) for s in range(21)}
    twenty = {s: xs[s] for s in range(20)}
    means = [twenty[s].mean() for s in range(20)]
    assert A.estimate(twenty).p == permutation_p_exact(means) != permutation_p_random(means)
    assert A.estimate(xs).p == permutation_p_random([xs[s].mean() for s in range(21)])


def test_detach_gap_recovery_is_the_seed_mean_and_needs_every_seed():
    """Gap recovery (NLL_detach - NLL_x) / (NLL_detach - NLL_full) of a pooled max_only row: the mean of the
    per-seed recoveries (planted 0.25 and 0.75), and none at all when one seed lacks its detach run (not
    the recovery of the seeds that have one)."""
    base = np.random.default_rng(15).normal(4.0, 0.2, N)
    full, det = "lerp-k4", "lerp-k4[range_grad=detach]"
    mx = "lerp-k4[range_grad=max_only]"
    pts = [point(full, s, base + 0.001 * s) for s in (7, 42)]
    pts += [point(det, s, base + 0.001 * s + 0.2) for s in (7, 42)]
    pts += [point(mx, 7, base + 0.007 + 0.15), point(mx, 42, base + 0.042 + 0.05)]
    rows, _ = A.detach_pairs(pts)
    (row,) = [r for r in rows if r.key.operator == mx and r.contrast == f"{mx} − {full}"]
    assert row.seeds == (7, 42) and row.est.per_seed == pytest.approx((0.15, 0.05), abs=1e-12)
    assert row.recovery == pytest.approx(np.mean([(0.2 - 0.15) / 0.2, (0.2 - 0.05) / 0.2]), rel=1e-9)
    rows, _ = A.detach_pairs([p for p in pts if (p.operator, p.seed) != (det, 42)])
    (row,) = [r for r in rows if r.key.operator == mx and r.contrast == f"{mx} − {full}"]
    assert row.seeds == (7, 42) and row.recovery is None
    # a detach run with the full twin's NLL has no gap to recover: no recovery (not a division by zero)
    same = [point(det, 42, base + 0.001 * 42) if (p.operator, p.seed) == (det, 42) else p for p in pts]
    rows, _ = A.detach_pairs(same)
    (row,) = [r for r in rows if r.key.operator == mx and r.contrast == f"{mx} − {full}"]
    assert row.recovery is None


def test_seed_references_are_the_designed_conditions_at_the_supplementary_runs_seed():
    """tab:detach's "full-gradient − softmax" at seed 7: the designed lerp-k4 row of that one seed (block
    bootstrap), and neither the supplementary run itself (its own row is delta_table's) nor seed 42."""
    rng = np.random.default_rng(19)
    base = {s: rng.normal(4.0, 0.2, N) for s in (7, 42)}
    d = {s: rng.normal(0.05, 0.01, N) for s in (7, 42)}
    pts = [point("softmax", s, base[s]) for s in (7, 42)] + [
        point("lerp-k4", s, base[s] + d[s]) for s in (7, 42)
    ]
    pts.append(point("lerp-k4[range_grad=detach]", 7, base[7] + 0.2, per_seed=True))
    (ref,) = A.seed_references(A.softmax_pairs(pts))
    assert (ref.key.operator, ref.key.seed, ref.seeds) == ("lerp-k4", 7, (7,))
    assert ref.est.interval == "block bootstrap" and ref.est.mean == pytest.approx(d[7].mean(), rel=1e-12)


def _factorial_points(effects_by_K, seeds=(7,), missing=()):
    base = np.random.default_rng(6).normal(4.0, 0.2, N)
    cells = ("minmax-weight", "minmax-prob", "fwm-weight", "fwm-prob")
    return [
        point(f"{c}-k{K}", seed, base + e + 0.001 * seed)
        for K, effs in effects_by_K.items()
        for c, e in zip(cells, effs)
        for seed in seeds
        if (f"{c}-k{K}", seed) not in missing
    ]


def test_factorial_pooled_and_k_interaction_rows():
    """Factorial at K4 and K16: the pooled row averages each effect over K, the K× row is effect(K16) minus
    effect(K4), with calibration = (FWM_W + FWM_P - MM_W - MM_P) / 2 and surrogate = (MM_P + FWM_P - MM_W -
    FWM_W) / 2."""
    rows = A.factorial_effects(_factorial_points({4: (0.20, 0.14, 0.04, 0.01), 16: (0.10, 0.08, 0.03, 0.02)}))
    by = {(r.key.operator, r.contrast): r.est.mean for r in rows}
    assert by[("factorial K4", "calibration")] == pytest.approx(-0.145)
    assert by[("factorial K16", "calibration")] == pytest.approx(-0.065)
    assert by[("factorial, pooled over K", "calibration")] == pytest.approx(-0.105)
    assert by[("factorial, K×", "K×calibration (K16 − K4)")] == pytest.approx(0.08)
    assert by[("factorial, K×", "K×surrogate (K16 − K4)")] == pytest.approx(0.03)
    assert not any("K×interaction" in c for _, c in by)


def test_factorial_simple_effects_and_cells_against_lerp():
    """The four simple effects (each one factor's difference at one level of the other) and the cells minus
    LERP at the same K and seed, against planted cell values that make every sign and cell distinct."""
    mm_w, mm_p, fwm_w, fwm_p, lerp = 0.20, 0.14, 0.04, 0.01, 0.09
    seeds = (7, 42)
    pts = _factorial_points({4: (mm_w, mm_p, fwm_w, fwm_p)}, seeds=seeds)
    base = np.random.default_rng(6).normal(4.0, 0.2, N)
    pts += [point("lerp-k4", s, base + lerp + 0.001 * s) for s in seeds]
    by = {r.contrast: r for r in A.factorial_effects(pts) if r.K == 4}
    expected = {
        "Prob − Weight under MinMax": mm_p - mm_w,
        "Prob − Weight under FWM": fwm_p - fwm_w,
        "FWM − MinMax under Weight-STE": fwm_w - mm_w,
        "FWM − MinMax under Prob-STE": fwm_p - mm_p,
        "calibration": (fwm_w + fwm_p - mm_w - mm_p) / 2,
        "surrogate": (mm_p + fwm_p - mm_w - fwm_w) / 2,
        "interaction": (fwm_p - fwm_w) - (mm_p - mm_w),
        "MinMax–Weight K4 − LERP K4": mm_w - lerp,
        "FWM–Weight K4 − LERP K4": fwm_w - lerp,
        "FWM–Prob K4 − LERP K4": fwm_p - lerp,
    }
    for name, value in expected.items():
        assert by[name].seeds == seeds, name
        assert by[name].est.per_seed == pytest.approx((value, value), abs=1e-12), name
    assert set(A.SIMPLE_EFFECTS) <= set(by)


def test_factorial_uses_the_seeds_every_cell_has():
    pts = _factorial_points({4: (0.20, 0.14, 0.04, 0.01)}, seeds=(7, 42), missing={("fwm-prob-k4", 42)})
    rows = {r.contrast: r for r in A.factorial_effects(pts)}
    assert rows["interaction"].seeds == (7,) and rows["interaction"].est.interval == "block bootstrap"
    assert rows["interaction"].est.mean == pytest.approx((0.01 - 0.04) - (0.14 - 0.20))


def test_factorial_leaves_out_a_seed_whose_cells_have_other_block_counts():
    """A seed whose four cells were evaluated on different block counts has no per-block effect: the main
    effects and interaction are of the other seed (not a broadcasting error)."""
    pts = _factorial_points({4: (0.20, 0.14, 0.04, 0.01)}, seeds=(7, 42))
    pts = [
        dataclasses.replace(p, nll=p.nll[:32]) if (p.operator, p.seed) == ("fwm-prob-k4", 42) else p
        for p in pts
    ]
    rows = {r.contrast: r for r in A.factorial_effects(pts)}
    assert rows["interaction"].seeds == (7,)
    assert rows["interaction"].est.mean == pytest.approx((0.01 - 0.04) - (0.14 - 0.20), abs=1e-12)
    assert rows["Prob − Weight under MinMax"].seeds == (7,)  # the common seeds of all four cells


def test_factorial_cell_minus_lerp_leaves_out_a_lerp_run_of_another_block_count():
    """Cell − LERP per block needs one block count: seed 42's LERP run evaluated on 32 blocks leaves that
    seed out of the three ΔNLL-vs-LERP rows (not a broadcasting error), seed 7 keeps its planted values."""
    mm_w, mm_p, fwm_w, fwm_p, lerp = 0.20, 0.14, 0.04, 0.01, 0.09
    pts = _factorial_points({4: (mm_w, mm_p, fwm_w, fwm_p)}, seeds=(7, 42))
    base = np.random.default_rng(6).normal(4.0, 0.2, N)
    short = point("lerp-k4", 42, (base + lerp + 0.042)[:32])  # hand-made: its data label says N blocks
    pts += [point("lerp-k4", 7, base + lerp + 0.007), dataclasses.replace(short, data=("d", "val", 64, N))]
    by = {r.contrast: r for r in A.factorial_effects(pts)}
    for name, value in (("MinMax–Weight", mm_w), ("FWM–Weight", fwm_w), ("FWM–Prob", fwm_p)):
        row = by[f"{name} K4 − LERP K4"]
        assert row.seeds == (7,) and row.est.mean == pytest.approx(value - lerp, abs=1e-12), name
    assert by["interaction"].seeds == (7, 42)


def test_heldout_document_cluster_estimate_is_token_weighted():
    """One seed with document clusters (C4): the estimate is the token-weighted mean of the per-document
    differences, sum_d n_d (a_d - b_d) / sum_d n_d, with a document-cluster bootstrap interval."""
    rng = np.random.default_rng(8)
    n_docs = 40
    tokens = rng.integers(10, 500, n_docs).astype(float)
    per_doc_b = rng.normal(4.0, 0.2, n_docs)
    per_doc_a = per_doc_b + 0.02 + 0.1 * (tokens > 250)  # long documents differ more
    ids = np.arange(n_docs)

    def docs(per_doc):
        return {"doc_ids": ids, "doc_nll": per_doc * tokens, "doc_tokens": tokens}

    nll = rng.normal(4.0, 0.2, N)
    pts = [
        point("softmax", 7, nll),
        point("lerp-k4", 7, nll + 0.01),
        point("softmax", 7, nll[:8], tag="val__c4", docs=docs(per_doc_b), primary=False),
        point("lerp-k4", 7, nll[:8] + 0.05, tag="val__c4", docs=docs(per_doc_a), primary=False),
    ]
    (row,) = A.heldout_table(pts)
    d = per_doc_a - per_doc_b
    assert row.est.interval == "document-cluster bootstrap"
    assert row.est.mean == pytest.approx(np.sum(tokens * d) / tokens.sum(), rel=1e-12)
    assert row.est.lo < row.est.mean < row.est.hi


def test_heldout_with_document_clusters_on_several_seeds_is_the_seed_summary():
    """The document-cluster bootstrap is the one-seed interval only: two seeds with document clusters give
    the t interval over the seeds' per-block means (seed 7's documents alone are not the row)."""
    rng = np.random.default_rng(20)
    tokens = rng.integers(10, 500, 12).astype(float)
    ids = np.arange(12)
    pts, means = [], []
    for seed, shift in ((7, 0.05), (42, 0.03)):
        b = rng.normal(4.0, 0.2, 12)
        docs_b = {"doc_ids": ids, "doc_nll": b * tokens, "doc_tokens": tokens}
        docs_a = {"doc_ids": ids, "doc_nll": (b + 0.3) * tokens, "doc_tokens": tokens}
        nll = rng.normal(4.0, 0.2, 8)
        pts += [
            point("softmax", seed, nll, tag="val__c4", docs=docs_b, primary=False),
            point("lerp-k4", seed, nll + shift, tag="val__c4", docs=docs_a, primary=False),
        ]
        means.append(shift)
    (row,) = A.heldout_table(pts, {})
    assert row.est.interval == "t (1 df)" and row.seeds == (7, 42)
    assert row.est.per_seed == pytest.approx(tuple(means), abs=1e-12)
    assert row.est.mean == pytest.approx(np.mean(means), abs=1e-12)


def test_heldout_with_one_document_is_an_error_naming_the_row():
    """One held-out document has no document-cluster interval: the report said only "need at least 2
    clusters", naming no row, run or tag."""
    docs = {"doc_ids": np.array([5]), "doc_nll": np.array([512.0]), "doc_tokens": np.array([128.0])}
    nll = np.full(2, 4.0)
    pts = [
        point("softmax", 7, nll, tag="val__c4", docs=docs, primary=False),
        point("lerp-k4", 7, nll + 0.02, tag="val__c4", docs=docs, primary=False),
    ]
    with pytest.raises(ValueError, match=r"lerp-k4 − softmax \[val__c4\], lerp-k4-s7: .*2 documents, got 1"):
        A.heldout_table(pts, {})


def test_heldout_document_ids_that_differ_from_the_controls_are_an_error():
    """The same data and blocks give the same documents; the old code fell back to the block bootstrap."""
    rng = np.random.default_rng(9)
    tokens = rng.integers(10, 500, 40).astype(float)

    def docs(ids):
        return {"doc_ids": ids, "doc_nll": 4.0 * tokens, "doc_tokens": tokens}

    nll = rng.normal(4.0, 0.2, N)
    pts = [
        point("softmax", 7, nll),
        point("lerp-k4", 7, nll + 0.01),
        point("softmax", 7, nll[:8], tag="val__c4", docs=docs(np.arange(40)), primary=False),
        point("lerp-k4", 7, nll[:8] + 0.05, tag="val__c4", docs=docs(np.arange(40) + 1), primary=False),
    ]
    with pytest.raises(ValueError, match=r"lerp-k4-s7 \[val__c4\] and its control softmax-s7 .*document ids"):
        A.heldout_table(pts)


def test_rank_statistics_use_each_seeds_own_ordering():
    """Kendall's W and the pairwise Spearman are over the per-seed ΔNLL (seeds as raters), with orderings
    planted to differ by seed; against the textbook W (no ties) and scipy's Spearman for every seed pair."""
    from itertools import combinations

    from scipy.stats import spearmanr

    seeds = (7, 42, 1337)
    planted = {  # condition -> per-seed ΔNLL vs softmax
        "lerp-k4": (0.10, 0.02, 0.05),
        "lerp-k8": (0.04, 0.09, 0.01),
        "lerp-k16": (0.02, 0.03, 0.08),
        "lerp-k32": (0.06, 0.01, 0.03),
        "lerp-k64": (0.01, 0.05, 0.02),
    }
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in planted.items() for s, d in zip(seeds, ds)]
    rows = A.delta_table(A.softmax_pairs(pts))
    (st,) = A.rank_statistics(rows, {})
    assert st.seeds == seeds and len(st.conditions) == 5
    scores = np.array([[planted[op][i] for op in st.conditions] for i in range(len(seeds))])
    ranks = scores.argsort(axis=1).argsort(axis=1) + 1.0
    m, n = ranks.shape
    w = 12 * ((ranks.sum(axis=0) - ranks.sum(axis=0).mean()) ** 2).sum() / (m**2 * (n**3 - n))
    assert st.kendall_w == pytest.approx(w, abs=1e-12) and st.kendall_w < 0.5
    rho = [spearmanr(scores[i], scores[j]).statistic for i, j in combinations(range(m), 2)]
    assert st.pairwise_spearman == pytest.approx(rho, abs=1e-12) and min(rho) < 0


def test_rank_statistics_use_the_settings_most_common_seed_set():
    """Three conditions on seeds (7, 42, 1337) and one whose seed-1337 run is missing: the rank statistics
    are over the three of the common seed set, not the one condition of the rarer set."""
    seeds = (7, 42, 1337)
    planted = {"lerp-k4": (0.10, 0.02, 0.05), "lerp-k8": (0.04, 0.09, 0.01), "lerp-k16": (0.02, 0.03, 0.08)}
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in planted.items() for s, d in zip(seeds, ds)]
    pts += [point("lerp-k32", s, base[s] + 0.03) for s in (7, 42)]
    rows = A.delta_table(A.softmax_pairs(pts))
    assert [r.key.operator for r in A.ranked_rows(rows)[rows[0].key.setting()]] == list(planted)
    (st,) = A.rank_statistics(rows, {})
    assert st.seeds == seeds and st.conditions == tuple(planted)
    scores = np.array([[planted[op][i] for op in planted] for i in range(3)])
    ranks = scores.argsort(axis=1).argsort(axis=1) + 1.0
    w = 12 * ((ranks.sum(axis=0) - ranks.sum(axis=0).mean()) ** 2).sum() / (9 * (27 - 3))
    assert st.kendall_w == pytest.approx(w, abs=1e-12)


def test_rank_statistics_leave_out_modified_backward_and_baselines():
    """The cross-condition statistics (Kendall's W, Spearman vs geometry, fig:widthgap) range over the
    designed full-gradient grid: a detach run on the same seeds (an outlier in span) and a BF16-exp baseline
    do not enter them."""
    seeds = (7, 42, 1337)
    planted = {"lerp-k4": (0.10, 0.02, 0.05), "lerp-k8": (0.04, 0.09, 0.01), "lerp-k16": (0.02, 0.03, 0.08)}
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in planted.items() for s, d in zip(seeds, ds)]
    pts += [point(op, s, base[s] + 0.3) for op in ("lerp-k4[range_grad=detach]", "bf16-exp") for s in seeds]
    rows = A.delta_table(A.softmax_pairs(pts))
    assert len(rows) == 5
    (kept,) = A.ranked_rows(rows).values()
    assert sorted(r.key.operator for r in kept) == sorted(planted)
    (st,) = A.rank_statistics(rows, {r.key: {"span": r.est.mean} for r in rows})
    assert sorted(st.conditions) == sorted(planted)


def test_rank_statistics_need_three_conditions_for_kendall_w():
    """Two conditions on three seeds: no Kendall's W and no pairwise Spearman (two ranks say nothing)."""
    seeds = (7, 42, 1337)
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    planted = {"lerp-k4": (0.10, 0.02, 0.05), "lerp-k8": (0.04, 0.09, 0.01)}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in planted.items() for s, d in zip(seeds, ds)]
    (st,) = A.rank_statistics(A.delta_table(A.softmax_pairs(pts)), {})
    assert st.seeds == seeds and st.kendall_w is None and st.pairwise_spearman == ()


def test_trajectory_rows_are_in_training_token_order():
    """One row per checkpoint, in training-token order whatever the order the points come in."""
    base = np.random.default_rng(23).normal(4.0, 0.2, N)
    pts = [
        point(op, 7, base + d, tokens=t, step=t // 100)
        for t, dd in ((1000, 0.05), (500, 0.08), (750, 0.06))
        for op, d in (("softmax", 0.0), ("lerp-k4", dd))
    ]
    ((key, rows),) = A.trajectories(A.softmax_pairs(pts)).items()
    assert key.operator == "lerp-k4" and [r.tokens for r in rows] == [500, 750, 1000]
    assert [r.est.mean for r in rows] == pytest.approx([0.08, 0.06, 0.05], abs=1e-12)


def test_rank_statistics_spearman_p_is_the_exact_permutation_p():
    """ranks.md's "Spearman ΔNLL vs h (p)": with 5 conditions ordered alike, rho = 1 and the exact two-sided
    permutation p is 2/5! = 1/60 (scipy's t approximation gave 1.4e-24); 4 conditions give 2/4! = 1/12."""
    seeds = (7, 42)
    planted = {"lerp-k4": 0.10, "lerp-k8": 0.04, "lerp-k16": 0.02, "lerp-k32": 0.06, "lerp-k64": 0.01}
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d + 0.001 * s) for op, d in planted.items() for s in seeds]
    rows = A.delta_table(A.softmax_pairs(pts))
    geometry = {r.key: {"h": 100 * r.est.mean, "span": -r.est.mean} for r in rows}
    (st,) = A.rank_statistics(rows, geometry)
    assert st.spearman_h == pytest.approx((1.0, 1 / 60)) and st.spearman_span == pytest.approx((-1.0, 1 / 60))
    del geometry[rows[0].key]["h"]
    (st,) = A.rank_statistics(rows, geometry)
    assert st.spearman_h == pytest.approx((1.0, 1 / 12))


def test_rank_statistics_geometry_spearman_is_against_the_delta_not_the_nll():
    """A setting of single-seed conditions on different seeds (no seed set to rank over): the Spearman
    against geometry is of the ΔNLL vs same-seed softmax (ordered as h here: rho = 1), not of the condition
    NLL, whose order the seed levels (softmax NLL +0.5, 0, +0.2) change."""
    base = np.random.default_rng(16).normal(4.0, 0.2, N)
    runs = {"lerp-k4": (7, 0.5, 0.01), "lerp-k8": (42, 0.0, 0.02), "lerp-k16": (1337, 0.2, 0.03)}
    pts = [point("softmax", s, base + lvl) for s, lvl, _ in runs.values()]
    pts += [point(op, s, base + lvl + d) for op, (s, lvl, d) in runs.items()]
    rows = A.delta_table(A.softmax_pairs(pts))
    assert [r.seeds for r in rows] == [(7,), (42,), (1337,)]
    geometry = {r.key: {"h": 10 * r.est.mean} for r in rows}
    (st,) = A.rank_statistics(rows, geometry)
    assert st.seeds == () and st.kendall_w is None
    assert st.spearman_h == pytest.approx((1.0, 1 / 3)) and st.spearman_span is None


def test_rank_statistics_leave_out_what_ties_make_undefined():
    """Conditions whose ΔNLL ties on a seed (identical runs) give no W when every seed ties them all, no rho
    for a pair with such a seed, and no Spearman against geometry for equal mean ΔNLL: left out, not a
    report that fails."""
    seeds = (7, 42, 1337)
    base = {s: np.random.default_rng(s).normal(4.0, 0.2, N) for s in seeds}
    tied = {"lerp-k4": (0.05,) * 3, "lerp-k8": (0.05,) * 3, "lerp-k16": (0.05,) * 3}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in tied.items() for s, d in zip(seeds, ds)]
    rows = A.delta_table(A.softmax_pairs(pts))
    geometry = {r.key: {"h": float(i), "span": 1.0 + i} for i, r in enumerate(rows)}
    (st,) = A.rank_statistics(rows, geometry)
    assert (st.kendall_w, st.pairwise_spearman, st.spearman_h, st.spearman_span) == (None, (), None, None)

    mixed = {"lerp-k4": (0.05, 0.01, 0.03), "lerp-k8": (0.05, 0.02, 0.01), "lerp-k16": (0.05, 0.03, 0.02)}
    pts = [point("softmax", s, base[s]) for s in seeds]
    pts += [point(op, s, base[s] + d) for op, ds in mixed.items() for s, d in zip(seeds, ds)]
    rows = A.delta_table(A.softmax_pairs(pts))
    (st,) = A.rank_statistics(rows, {})
    assert st.kendall_w is not None and len(st.pairwise_spearman) == 1  # seeds 42 and 1337 only
    assert st.pairwise_spearman[0] == pytest.approx(-0.5)


def test_substitution_on_the_suites_own_split_is_paired_with_the_primary_evaluation():
    """tab:strictaudit: the frozen checkpoint under another arithmetic on the suite's own split
    (``kinterval eval --operator``, tag ``val__op-...``) minus its native (primary) evaluation, per block,
    with the largest |Δ| of one block."""
    rng = np.random.default_rng(10)
    nll = rng.normal(4.0, 0.2, N)
    delta = rng.normal(0.0, 1e-3, N)
    delta[5] = 0.02
    op = "val__op-fwm-weight-k4.arithmetic-strict"
    pts = [
        point("softmax", 7, nll),
        point("fwm-weight-k4", 7, nll + 0.03),
        point("softmax", 7, nll, tag=op, primary=False),
        point("fwm-weight-k4", 7, nll + 0.03 + delta, tag=op, primary=False),
    ]
    (soft,) = [r for r in A.heldout_table(pts) if r.contrast == A.SUBSTITUTED]
    (sub,) = [r for r in A.heldout_table(pts) if r.contrast == A.AUDIT]
    assert soft.key.operator == "softmax" and soft.est.mean == 0  # softmax weights through FWM's forward
    # the same hard forward under other arithmetic: tab:strictaudit's native − direct hard forward
    assert sub.est.mean == pytest.approx(-delta.mean()) and sub.max_abs == pytest.approx(0.02)
    assert sub.key.tag == op and sub.seeds == (7,)


@pytest.mark.parametrize(
    "native, through, audit",
    [
        # tab:rounding: Prob-STE's frozen code against the Weight-STE-expression evaluator
        ("minmax-prob-k4[arithmetic=historical]", "minmax-weight-k4[arithmetic=historical]", True),
        ("fwm-prob-k4[tau=5.5]", "fwm-prob-k4[tau=5.5,arithmetic=historical]", True),
        ("lerp-k4", "lerp-k4[range_grad=detach]", True),
        ("fwm-prob-k4", "fwm-prob-k4[tau=5.5]", False),  # another window: another forward
        ("fwm-prob-k4", "fwm-prob-k8", False),  # another K: another grid
        ("fwm-prob-k4", "fwm-lerp-k4", False),
        ("lerp-k4", "minmax-weight-k4", False),
        ("fwm-prob-k4", "softmax", False),  # tab:subst: softmax substituted
    ],
)
def test_a_forward_audit_is_native_minus_substituted_a_substitution_the_reverse(native, through, audit):
    """The paper's sign depends on the table: tab:strictaudit and tab:rounding (the same hard forward under
    another arithmetic or surrogate) print native − substituted; tab:subst ("diff", another operator on the
    same weights) prints substituted − native. The tag's safe name parses back (a tau of 5.5 included)."""
    from kinterval.model import safe_operator

    rng = np.random.default_rng(12)
    nll, delta = rng.normal(4.0, 0.2, N), rng.normal(1e-4, 1e-4, N)
    tag = "val__op-" + safe_operator(through)
    for recorded in ({}, {"operator_used": through}):  # from the tag, or from the evaluation's record
        pts = [point(native, 7, nll), point(native, 7, nll + delta, tag=tag, primary=False, **recorded)]
        (row,) = A.heldout_table(pts, {})
        assert row.contrast == (A.AUDIT if audit else A.SUBSTITUTED)
        assert row.est.mean == pytest.approx(-delta.mean() if audit else delta.mean(), rel=1e-12)


def test_substitution_max_abs_is_the_largest_magnitude_over_blocks_and_seeds():
    """tab:rounding's largest |Δ| of one block: a negative block difference (-0.05 at seed 42) counts by its
    magnitude, over every seed."""
    rng = np.random.default_rng(17)
    tag = "val__op-fwm-weight-k4.arithmetic-strict"
    pts = []
    for seed, worst in ((7, 0.02), (42, -0.05)):
        nll, delta = rng.normal(4.0, 0.2, N), rng.normal(0.0, 1e-3, N)
        delta[3] = worst
        pts += [
            point("fwm-weight-k4", seed, nll),
            point("fwm-weight-k4", seed, nll + delta, tag=tag, primary=False),
        ]
    (sub,) = A.heldout_table(pts, {})
    assert sub.seeds == (7, 42) and sub.max_abs == pytest.approx(0.05, rel=1e-12)


def test_substitution_needs_the_native_evaluation_of_the_same_blocks():
    """A substituted evaluation of 32 blocks against a native one of 48 has no per-block difference: no
    row (not a broadcasting error); on 48 blocks it is the per-block difference."""
    rng = np.random.default_rng(22)
    nll, delta = rng.normal(4.0, 0.2, N), rng.normal(0.01, 1e-3, N)
    tag = "val__op-lerp-k8"
    short = point("fwm-prob-k2", 7, (nll + delta)[:32], tag=tag, primary=False)
    short = dataclasses.replace(short, data=("d", "val", 64, N))  # the same split, fewer blocks read
    assert A.heldout_table([point("fwm-prob-k2", 7, nll), short], {}) == []
    (sub,) = A.heldout_table(
        [point("fwm-prob-k2", 7, nll), point("fwm-prob-k2", 7, nll + delta, tag=tag, primary=False)], {}
    )
    assert sub.est.mean == pytest.approx(delta.mean(), rel=1e-12)


def test_substitution_of_a_run_without_a_softmax_pair_is_reported():
    """A softmax run evaluated through a K-interval forward (``kinterval eval --operator lerp-k8`` on it) and
    a K-interval run with no softmax control both get their substituted − native row: the contrast needs no
    control (both were left out of the report without a line)."""
    rng = np.random.default_rng(11)
    nll = rng.normal(4.0, 0.2, N)
    delta = rng.normal(0.01, 1e-3, N)
    tag = "val__op-lerp-k8"
    for op in ("softmax", "fwm-prob-k2"):
        pts = [point(op, 7, nll), point(op, 7, nll + delta, tag=tag, primary=False)]
        (sub,) = A.heldout_table(pts, {})
        assert (sub.contrast, sub.key.operator, sub.key.tag, sub.seeds) == (
            A.SUBSTITUTED,
            op,
            tag,
            (7,),
        )
        assert sub.est.mean == pytest.approx(delta.mean()) and sub.max_abs == pytest.approx(delta.max())
    # through its own forward (``kinterval eval --operator softmax`` of a softmax run): no substitution
    assert (
        A.heldout_table(
            [point("softmax", 7, nll), point("softmax", 7, nll, tag="val__op-softmax", primary=False)], {}
        )
        == []
    )


def test_clip_statistics_of_the_logged_training_rows():
    """The clip table gave the whole-run clipped fraction only; the paper also reports the clipped share of
    the last 1.5B of 2.5B tokens (98%), single-step gradient norms (10^4), final pre-clip norms and the
    largest train-loss rise between logs. Ten logged steps of 100 tokens: the last 60% are steps 5-10."""
    nll = np.zeros(4)
    pts = [Point("s", f"op-s{seed}", "g", "lerp-k4", seed, 1000, 10, 1000, "val", ("d", "val", 64, 4), nll)
           for seed in (7, 42)]  # fmt: skip
    clipped = [True, True, True, True, False, True, True, False, True, True]  # steps 5-10: 4 of 6
    loss = [6.0, 5.0, 5.5, 4.0, 4.2, 3.9, 3.8, 3.7, 3.6, 3.5]  # largest rise +0.5 (step 2 -> 3)
    norm = [1.0, 12000.0, 3.0, 2.0, 0.9, 1.5, 1.1, 0.8, 1.2, 2.4]
    rows = [{"step": i + 1, "tokens": 100 * (i + 1), "clipped": c, "clipped_frac": 0.7, "train_loss": lo,
             "grad_norm": g} for i, (c, lo, g) in enumerate(zip(clipped, loss, norm))]  # fmt: skip
    old = [
        {"step": 1, "tokens": 100, "clipped_frac": 0.25, "train_loss": 5.0}
    ]  # a log without the per-step fields
    (row,) = A.clip_fractions(pts, {("", "op-s7"): rows, ("", "op-s42"): old})  # (folder, run id)
    assert row.seeds == (7, 42) and row.per_seed == (0.7, 0.25) and row.mean == pytest.approx(0.475)
    assert row.tail == (pytest.approx(4 / 6), None)
    assert row.final_norm == (2.4, None) and row.max_norm == (12000.0, None)
    assert row.max_loss_rise == (pytest.approx(0.5), None)


def test_clip_fraction_is_the_last_logged_whole_run_fraction():
    """The whole-run clipped fraction is the last logged ``clipped_frac`` in step order (the trainer's count
    since step 0), not the first: logged out of order, 0.1 -> 0.3 -> 0.45 by step."""
    pts = [Point("s", "op-s7", "g", "lerp-k4", 7, 1000, 10, 1000, "val", ("d", "val", 64, 4), np.zeros(4))]
    rows = [{"step": s, "tokens": 100 * s, "clipped_frac": f} for s, f in ((3, 0.45), (1, 0.1), (2, 0.3))]
    (row,) = A.clip_fractions(pts, {("", "op-s7"): rows})
    assert row.per_seed == (0.45,) and row.mean == 0.45


def test_apply_bh_gives_each_row_the_q_of_its_own_p():
    """BH q follows each row's p when the rows are not in p order (the families above all held ascending p,
    so a q list attached in sorted order passed them)."""
    ps = [0.04, 0.001, 0.5, 0.03, 0.2]
    rows = [
        A.Row(f"c{i}", None, (7,), A.Estimate(0.0, -1.0, 1.0, "block bootstrap", 1, (0.0,), p=p))
        for i, p in enumerate(ps)
    ]
    A.apply_bh(rows, family=lambda r: "one family")
    # Hand-worked step-up: sorted p (0.001, 0.03, 0.04, 0.2, 0.5) x 5/rank = (0.005, 0.075, 0.0667, 0.25,
    # 0.5), then the running minimum from the top: (0.005, 0.0667, 0.0667, 0.25, 0.5).
    assert [r.q for r in rows] == pytest.approx([0.2 / 3, 0.005, 0.5, 0.2 / 3, 0.25], rel=1e-12)


def test_a_one_seed_detach_run_has_its_same_seed_full_twin_beside_it_in_the_geometry():
    """The paper's "detached vs full" geometry and tab:e1's span set a detach record against the full run of
    its own seed; the full condition's row is the mean over its seeds. A modified run of one seed gets its
    twin's run of that seed as a row of its own; a supplementary run (one row a seed) likewise."""
    nll = np.zeros(N)
    span = {("lerp-k4", 7): 3.0, ("lerp-k4", 42): 2.0, ("lerp-k4[range_grad=detach]", 7): 9.0}
    pts = [point(op, s, nll, geometry={"span": v}) for (op, s), v in span.items()]
    geo = A.final_geometry(pts, {})
    by = {A.condition(k): g["span"] for k, g in geo.items()}
    assert by == {"lerp-k4": 2.5, "lerp-k4, seed 7": 3.0, "lerp-k4[range_grad=detach]": 9.0}
    per_seed = [dataclasses.replace(p, per_seed=p.operator != "lerp-k4") for p in pts]  # supplementary detach
    by = {A.condition(k): g["span"] for k, g in A.final_geometry(per_seed, {}).items()}
    assert by == {"lerp-k4": 2.5, "lerp-k4, seed 7": 3.0, "lerp-k4[range_grad=detach], seed 7": 9.0}
    # a twin of that one seed only needs no second row
    assert len(A.final_geometry([pts[0], pts[2]], {})) == 2


def test_k_trend_weights_are_correctly_rounded_on_every_cpu():
    """The slope weights' denominator sum (x - mean x)^2 is correctly rounded (math.fsum), not a BLAS dot
    whose order of additions (and FMA) depends on the CPU: for K = 4, 16, 32 a dot gives 4.666666666666666 on
    one machine and 4.666666666666667 on another, and the committed mini report moved in its last digits."""
    base, one = np.zeros(64), np.eye(64)[0]  # ΔNLL 1 in block 0 at K = 4, else 0: every sum is exact
    pts = [point("softmax", 7, base)] + [point(f"lerp-k{K}", 7, one * (K == 4)) for K in (4, 16, 32)]
    (row,) = A.k_trends(A.softmax_pairs(pts))
    x = np.log2([4, 16, 32])
    xc = x - x.mean()
    assert row.est.mean == xc[0] / 4.666666666666667 / 64
    slopes = k_trend_slopes([4, 16, 32], np.eye(3)[:2])
    assert slopes.slopes.tolist() == [xc[0] / 4.666666666666667, xc[1] / 4.666666666666667]
