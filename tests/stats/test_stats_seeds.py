import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from kinterval.stats import bh_q, permutation_p_exact, permutation_p_random, seed_summary


def test_seed_summary_matches_scipy_t_interval():
    d = np.array([0.208, 0.191, 0.224, 0.215, 0.199])
    s = seed_summary(d)
    assert s.mean == pytest.approx(d.mean())
    assert s.sd == pytest.approx(np.std(d, ddof=1))
    assert (s.n, s.df) == (5, 4)
    lo, hi = stats.t.interval(0.95, df=4, loc=d.mean(), scale=stats.sem(d))
    assert (s.lo, s.hi) == pytest.approx((lo, hi), rel=1e-12)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    s90 = seed_summary(d, level=0.90)
    assert (s90.lo, s90.hi) == pytest.approx((ci.low, ci.high), rel=1e-12)


def _brute_force_p(d):
    obs = abs(np.mean(d))
    stat = [abs(np.mean(np.array(s) * d)) for s in itertools.product([-1, 1], repeat=len(d))]
    return np.mean(np.array(stat) >= obs - 1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_exact_permutation_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.3 * seed, 1.0, size=3 + seed)
    assert permutation_p_exact(d) == pytest.approx(_brute_force_p(d))


def test_exact_permutation_floor_and_ties():
    assert permutation_p_exact([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    assert permutation_p_exact([-0.1, -0.2, -0.3, -0.4, -0.5]) == pytest.approx(2 / 32)
    # Equal magnitudes: every assignment with |sum| = 5 counts (only +-all), and ties by rounding are counted.
    assert permutation_p_exact([0.1] * 5) == pytest.approx(2 / 32)
    # One sign flip in five equal magnitudes: |sum| >= 3 for 2 + 2*5 = 12 assignments.
    assert permutation_p_exact([0.1, 0.1, 0.1, 0.1, -0.1]) == pytest.approx(12 / 32)
    assert permutation_p_exact([0.0, 0.0]) == 1.0


def _rational_p(decimals):
    """Exact sign-flip p in rational arithmetic: sign assignments with |sum| >= |observed sum|."""
    d = [Fraction(x) for x in decimals]
    obs = abs(sum(d))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, d))) >= obs
        for signs in itertools.product([-1, 1], repeat=len(d))
    )
    return Fraction(hits, 2 ** len(d))


@pytest.mark.parametrize(
    "decimals",
    [
        ["0.15", "-0.19", "0.17", "0.02", "0.15"],  # -0.19 + 0.17 + 0.02 = 0: flipping those three ties
        ["0.12", "-0.05", "-0.05", "0.03", "0.05"],  # -0.05 + 0.05 = 0
        ["-0.18", "-0.10", "0.05", "-0.20", "0.30"],
    ],
)
def test_permutation_p_counts_sign_assignments_that_tie_up_to_rounding(decimals):
    """NLL differences read from tables are decimals; sign assignments whose sum equals the observed one
    exactly (in rational arithmetic) count as ">= observed" although floating point rounds them apart."""
    d = np.array([float(x) for x in decimals])
    ref = _rational_p(decimals)
    assert permutation_p_exact(d) == pytest.approx(float(ref), abs=1e-15)
    assert abs(permutation_p_random(d, n=20000, seed=2) - float(ref)) < 0.02


def test_random_permutation_close_to_exact_and_deterministic():
    d = np.random.default_rng(3).normal(0.4, 1.0, size=12)
    exact = permutation_p_exact(d)
    approx = permutation_p_random(d, n=20000, seed=1)
    assert abs(approx - exact) < 0.01
    assert approx == permutation_p_random(d, n=20000, seed=1)
    assert permutation_p_random([1.0] * 30, n=999) == pytest.approx(1 / 1000)


@pytest.mark.parametrize("m", [1, 2, 14, 25, 200])
def test_bh_matches_scipy(m):
    rng = np.random.default_rng(m)
    p = np.concatenate([rng.uniform(0, 0.05, m // 2), rng.uniform(0, 1, m - m // 2)])
    p[: m // 3] = p[0]  # ties
    q = bh_q(p)
    np.testing.assert_allclose(q, stats.false_discovery_control(p), rtol=1e-12)
    assert np.all(q <= 1) and np.all(q >= p)
    order = np.argsort(p)
    assert np.all(np.diff(q[order]) >= 0)


def test_bh_known_values():
    np.testing.assert_allclose(bh_q([0.01, 0.04, 0.03, 0.9]), [0.04, 0.16 / 3, 0.16 / 3, 0.9])


@pytest.mark.parametrize(
    "call",
    [
        lambda: seed_summary([1.0]),
        lambda: seed_summary([]),
        lambda: seed_summary([1.0, np.nan]),
        lambda: seed_summary([1.0, 2.0], level=1.0),
        lambda: seed_summary([1.0, 2.0], level=0.0),
        lambda: seed_summary([[1.0, 2.0]]),
        lambda: permutation_p_exact([]),
        lambda: permutation_p_exact(np.ones(21)),
        lambda: permutation_p_exact([1.0, np.inf]),
        lambda: permutation_p_random([], n=10),
        lambda: permutation_p_random([1.0], n=0),
        lambda: permutation_p_random([np.nan], n=10),
        lambda: bh_q([]),
        lambda: bh_q([0.1, 1.2]),
        lambda: bh_q([-0.1]),
        lambda: bh_q([0.1, np.nan]),
    ],
)
def test_seed_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_permutation_tolerance_only_absorbs_rounding():
    """|sum| = 2 + 1e-7 is reached only by +-all; the assignments flipping the small item give 2 - 1e-7,
    a real difference of 2e-7 (not rounding), so p = 2/8. A tolerance wide enough to tie them gives 4/8."""
    d = [1.0, 1.0, 1e-7]
    assert permutation_p_exact(d) == pytest.approx(2 / 8, abs=1e-15)
    assert abs(permutation_p_random(d, n=20000, seed=0) - 2 / 8) < 0.02


def test_random_permutation_keeps_every_chunk():
    """Sign draws come in chunks of 2^22 // len(d) rows; with 1000 items 20,000 draws span five chunks, the
    last partial. Only the first item is non-zero, so every assignment ties the observed |sum|: p = 1
    exactly, and less if any draw were dropped."""
    d = np.r_[1.0, np.zeros(999)]
    assert permutation_p_random(d, n=20000, seed=0) == 1.0


def test_exact_permutation_accepts_up_to_max_exact_n():
    """n <= MAX_EXACT_N is enumerated (the report takes the exact p for up to that many seeds), n + 1 is
    refused: 20 equal positive differences reach |sum| only at +-all, p = 2 / 2^20."""
    from kinterval.stats.seeds import MAX_EXACT_N

    assert MAX_EXACT_N == 20
    assert permutation_p_exact(np.full(MAX_EXACT_N, 0.1)) == 2 / 2**20
    with pytest.raises(ValueError, match="permutation_p_random"):
        permutation_p_exact(np.full(MAX_EXACT_N + 1, 0.1))


@pytest.mark.parametrize("value", [0.1, -0.05, 0.0])
def test_equal_seed_differences_have_sd_zero_and_their_value_as_mean(value):
    """np.mean / np.std of 3 x 0.1 gave mean 0.10000000000000002 and SD 1.7e-17 (a table printed 1.7e-17)."""
    s = seed_summary([value] * 3)
    assert (s.mean, s.sd, s.lo, s.hi) == (value, 0.0, value, value)
