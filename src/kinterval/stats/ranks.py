"""Rank statistics across seeds and conditions: Kendall's W (ordering reproducibility) and Spearman rho."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import stats

from ._checks import finite_1d, finite_2d


def kendall_w(scores) -> float:
    """Kendall's coefficient of concordance W of ``scores[n_seeds, n_conditions]`` (seeds are the raters).

    Each seed's scores are ranked (average ranks for ties); with column rank sums ``R_j`` and
    ``S = sum_j (R_j - mean R)^2``, ``W = 12 S / (m^2 (n^3 - n) - m * sum T)`` where
    ``T = sum_g (t_g^3 - t_g)`` over each seed's tie groups.
    W = 1 is identical ordering on every seed, 0 no agreement.
    """
    x = finite_2d(scores, "scores", min_rows=2, min_cols=2)
    m, n = x.shape
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


@dataclass(frozen=True)
class SpearmanResult:
    rho: float
    p: float


def spearman(x, y) -> SpearmanResult:
    """Spearman rank correlation and its two-sided p (``scipy.stats.spearmanr``)."""
    x = finite_1d(x, "x", min_size=3)
    y = finite_1d(y, "y", min_size=3)
    if x.size != y.size:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise ValueError("Spearman correlation is undefined for a constant input")
    res = stats.spearmanr(x, y)
    return SpearmanResult(float(res.statistic), float(res.pvalue))


def pairwise_spearman(scores) -> np.ndarray:
    """Spearman rho between every pair of seeds (rows of ``scores[n_seeds, n_conditions]``), pairs i < j."""
    x = finite_2d(scores, "scores", min_rows=2, min_cols=3)
    return np.array([spearman(x[i], x[j]).rho for i, j in combinations(range(x.shape[0]), 2)])
