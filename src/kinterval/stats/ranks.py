"""Rank statistics across seeds and conditions: Kendall's W (ordering reproducibility) and Spearman rho."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from ._checks import check_positive_int, finite_1d, finite_2d, make_rng

# scipy.stats is imported where it is used (about half a second to load: see seeds.py)


def kendall_w(scores) -> float:
    """Kendall's coefficient of concordance W of ``scores[n_seeds, n_conditions]`` (seeds are the raters).

    Each seed's scores are ranked (average ranks for ties); with column rank sums ``R_j`` and
    ``S = sum_j (R_j - mean R)^2``, ``W = 12 S / (m^2 (n^3 - n) - m * sum T)`` where
    ``T = sum_g (t_g^3 - t_g)`` over each seed's tie groups.
    W = 1 is identical ordering on every seed, 0 no agreement.
    """
    x = finite_2d(scores, "scores", min_rows=2, min_cols=2)
    m, n = x.shape
    from scipy import stats

    ranks = stats.rankdata(x, axis=1)
    rank_sums = ranks.sum(axis=0)
    s = np.sum((rank_sums - rank_sums.mean()) ** 2)
    ties = 0.0
    for row in x:  # loop over seeds (few), not resamples
        t = np.unique(row, return_counts=True)[1]
        ties += np.sum(t**3 - t)
    denom = m**2 * (n**3 - n) - m * ties
    if denom <= 0:
        raise ValueError("Kendall's W is undefined when every seed ties all conditions")
    return float(12.0 * s / denom)


SPEARMAN_RESAMPLES = 20000  # random pairings of the permutation p; all n! are enumerated for n <= 7


@dataclass(frozen=True)
class SpearmanResult:
    rho: float
    p: float


def _ranks(x, y) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks of two checked, equally long, non-constant samples of at least 3 values."""
    x = finite_1d(x, "x", min_size=3)
    y = finite_1d(y, "y", min_size=3)
    if x.size != y.size:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise ValueError("Spearman correlation is undefined for a constant input")
    from scipy import stats

    return stats.rankdata(x), stats.rankdata(y)  # average ranks for ties


def spearman(x, y, *, n_resamples: int = SPEARMAN_RESAMPLES, seed: int = 0) -> SpearmanResult:
    """Spearman rank correlation rho and its two-sided permutation p.

    rho is the Pearson correlation of the (average) ranks, as ``scipy.stats.spearmanr``. p comes from a
    permutation test of it (``scipy.stats.permutation_test`` over the pairings of the ranks): under H0 every
    pairing of the y ranks with the x ranks is equally likely. When all ``n!`` pairings fit within
    ``n_resamples`` (n <= 7 by default) they are enumerated and p is exact (n = 3, rho = 1: p = 1/3).
    Beyond, ``n_resamples`` random pairings drawn with ``seed`` give a deterministic p, the observed pairing
    counted once in each tail. Two-sided p is twice the smaller one-sided p, capped at 1 (with resampling,
    at least ``2 / (n_resamples + 1)``). The large-sample t approximation of ``spearmanr`` is not used: it is
    far too small for the few conditions compared here.
    """
    rx, ry = _ranks(x, y)
    n_resamples = check_positive_int(n_resamples, "n_resamples")
    from scipy import stats

    # The test statistic is 4 sum(rx ry), an integer (average ranks are multiples of 1/2) and, with the
    # margins fixed, an increasing function of rho: pairings that tie the observed rho tie it exactly.
    # (pearsonr's own permutation test compares floating rho values, and a tie off by 1e-17 dropped out of
    # a tail: rho = 0 of 7 conditions gave p = 0.9968, not 1.)
    res = stats.permutation_test(
        (ry,),
        lambda r, axis=-1: np.rint(4.0 * np.sum(rx * r, axis=axis)),
        permutation_type="pairings",
        n_resamples=n_resamples,
        alternative="two-sided",
        rng=make_rng(seed),
        vectorized=True,
    )
    return SpearmanResult(float(stats.spearmanr(x, y).statistic), float(min(1.0, res.pvalue)))


def pairwise_spearman(scores) -> np.ndarray:
    """Spearman rho between every pair of seeds (rows of ``scores[n_seeds, n_conditions]``), pairs i < j."""
    x = finite_2d(scores, "scores", min_rows=2, min_cols=3)
    # rho only (no permutation test per pair); a constant row is refused as in spearman.
    from scipy import stats

    rho = [stats.spearmanr(*_ranks(x[i], x[j])).statistic for i, j in combinations(range(x.shape[0]), 2)]
    return np.array(rho)
