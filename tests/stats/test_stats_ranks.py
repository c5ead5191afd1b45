from itertools import permutations

import numpy as np
import pytest
from scipy import stats

from kinterval.stats import kendall_w, pairwise_spearman, spearman


def test_kendall_w_textbook_values():
    # 3 raters, 4 objects: rank sums 4, 6, 8, 12; S = 35; W = 12 * 35 / (9 * 60) = 7/9.
    assert kendall_w([[1, 2, 3, 4], [2, 1, 3, 4], [1, 3, 2, 4]]) == pytest.approx(7 / 9)
    assert kendall_w([[1, 2, 3, 4]] * 3) == pytest.approx(1.0)
    assert kendall_w([[1, 2, 3, 4], [4, 3, 2, 1]]) == pytest.approx(0.0)
    # Scores, not ranks, are accepted; ranking is within each seed (row) and scale-free.
    assert kendall_w([[10, 20, 30, 40], [0.2, 0.1, 0.3, 0.4], [-5, 1, 0, 7]]) == pytest.approx(7 / 9)


def test_kendall_w_tie_correction():
    # Row 2 ties two objects: ranks (1, 2.5, 2.5); R = (2, 4.5, 5.5), S = 6.5; T = 2^3 - 2 = 6;
    # W = 12 * 6.5 / (4 * 24 - 2 * 6) = 13/14 (uncorrected it would be 78/96).
    assert kendall_w([[1, 2, 3], [1, 2, 2]]) == pytest.approx(13 / 14)


def test_kendall_w_relation_to_mean_spearman():
    x = np.random.default_rng(0).normal(size=(5, 25)) + np.linspace(0, 3, 25)
    m = x.shape[0]
    mean_rho = pairwise_spearman(x).mean()
    assert pairwise_spearman(x).shape == (10,)
    assert kendall_w(x) == pytest.approx(((m - 1) * mean_rho + 1) / m, rel=1e-12)


def test_spearman_rho_matches_scipy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    y[:4] = y[0]  # ties
    assert spearman(x, y).rho == pytest.approx(stats.spearmanr(x, y).statistic, rel=1e-12)


def _brute_force_p(x, y):
    """Two-sided permutation p over all n! pairings: twice the smaller tail, capped at 1."""
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    rx, perms = rx - rx.mean(), np.array(list(permutations(ry - ry.mean())))  # every pairing of the y ranks
    null = perms @ rx / (np.linalg.norm(perms, axis=1) * np.linalg.norm(rx))  # Pearson r of the ranks
    rho = stats.spearmanr(x, y).statistic
    tol = 1e-12
    return min(1.0, 2 * min(np.mean(null >= rho - tol), np.mean(null <= rho + tol))), rho, null


@pytest.mark.parametrize("n", [3, 4, 5, 6])
@pytest.mark.parametrize("case", ["random", "ties", "perfect", "reversed"])
def test_spearman_p_is_exact_permutation_p(n, case):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = {"random": x + rng.normal(size=n), "perfect": 2 * x + 1, "reversed": -x}.get(case)
    if case == "ties":
        y = np.round(x + rng.normal(size=n))
        y[0], y[1] = 0.0, 1.0  # never constant
        x[2] = x[0] if n > 3 else x[2]
    p, rho, null = _brute_force_p(x, y)
    r = spearman(x, y)
    assert r.rho == pytest.approx(rho, abs=1e-12)
    assert r.p == pytest.approx(p, abs=1e-12)
    if case in ("random", "perfect", "reversed"):  # no ties: the null is symmetric, p = P(|rho*| >= |rho|)
        assert r.p == pytest.approx(np.mean(np.abs(null) >= abs(rho) - 1e-12), abs=1e-12)


def test_spearman_p_small_n_values():
    # n = 3, rho = 1: 1 of the 6 pairings gives +1 and 1 gives -1, p = 2/6 (the t approximation gives 0).
    assert spearman([1, 2, 3], [10, 20, 30]).p == pytest.approx(1 / 3)
    # n = 5, rho = 0.9: 5 of the 120 pairings reach |rho| >= 0.9 in each tail, p = 10/120 (t approx: 0.037).
    assert spearman([1, 2, 3, 4, 5], [2, 1, 3, 4, 5]).p == pytest.approx(1 / 12)
    assert spearman([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]).p == pytest.approx(2 / 120)
    # rho = 0 exactly (the mini report's seven conditions): both tails hold the observed pairing's ties,
    # p = 1; compared as floating rho, ties off by 1e-17 fell out of a tail and p was 0.9968
    x = [0.0527, -0.0145, -0.0279, 0.1351, 0.0672, 0.0321, 0.0226]
    r = spearman(x, [9.06, 11.34, 13.22, 12.34, 15.12, 9.22, 14.04])
    assert r.rho == 0.0 and r.p == 1.0


def test_spearman_p_resampled_beyond_enumeration():
    rng = np.random.default_rng(3)
    x = rng.normal(size=8)
    y = x + rng.normal(size=8)
    exact, _, _ = _brute_force_p(x, y)  # 8! = 40320 pairings
    assert spearman(x, y, n_resamples=50000).p == pytest.approx(exact, abs=1e-12)  # enumerated
    r = spearman(x, y)  # 20000 random pairings: deterministic for a seed, close to the exact p
    assert r.p == spearman(x, y).p and r.p == pytest.approx(exact, abs=0.01) and r.p != exact
    assert spearman(x, y, seed=1).p != r.p
    # A perfect ordering of 25 conditions: the floor 2 / (n_resamples + 1).
    assert spearman(np.arange(25.0), np.arange(25.0)).p == pytest.approx(2 / 20001)
    assert spearman(np.arange(25.0), np.arange(25.0), n_resamples=999).p == pytest.approx(2 / 1000)


@pytest.mark.parametrize(
    "call",
    [
        lambda: kendall_w([[1, 2, 3]]),
        lambda: kendall_w([[1], [2]]),
        lambda: kendall_w([1, 2, 3]),
        lambda: kendall_w([[1, 2, np.nan], [1, 2, 3]]),
        lambda: kendall_w([[1, 1, 1], [2, 2, 2]]),
        lambda: spearman([1, 2, 3], [1, 2]),
        lambda: spearman([1, 2], [1, 2]),
        lambda: spearman([1, 2, 3], [1, 1, 1]),
        lambda: spearman([1, 2, np.nan], [1, 2, 3]),
        lambda: pairwise_spearman([[1, 2, 3]]),
        lambda: spearman([1, 2, 3], [1, 2, 3], n_resamples=0),
    ],
)
def test_rank_bad_input(call):
    with pytest.raises(ValueError):
        call()
