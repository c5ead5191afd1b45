"""Seed-level statistics (paper §4, App. C.3): suite D pairs each condition with softmax on the same seed.

* ``seed_summary``: mean of the paired seed differences, seed SD and a t interval with n-1 df (4 for 5 seeds).
* ``permutation_p_exact``: two-sided sign-flip permutation p over all 2^n sign assignments (floor 2/2^n).
* ``permutation_p_random``: the same test with random sign flips (downstream: 20,000).
* ``bh_q``: Benjamini-Hochberg q values within a family of comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_level, check_positive_int, finite_1d, make_rng

# scipy.stats is imported where it is used: it takes about half a second to load, which every ``kinterval``
# command would pay (they import this module's table formatting) whether it tests anything or not.

MAX_EXACT_N = 20  # 2^20 sign assignments


@dataclass(frozen=True)
class SeedSummary:
    """Mean paired difference over seeds with its seed SD and t interval."""

    mean: float
    sd: float  # seed SD, ddof=1
    lo: float
    hi: float
    n: int
    df: int
    level: float


def seed_summary(diffs, *, level: float = 0.95) -> SeedSummary:
    """Mean, seed SD (ddof=1) and ``level`` t interval ``mean +- t_{n-1} sd / sqrt(n)`` of per-seed diffs."""
    d = finite_1d(diffs, "diffs", min_size=2)
    level = check_level(level)
    n = d.size
    # Equal differences have SD 0 and their value as mean exactly (np.mean/np.std of 3 x 0.1 round to
    # 0.10000000000000002 and 1.7e-17, which a table would print as a non-zero SD).
    mean, sd = (d[0], 0.0) if d.min() == d.max() else (d.mean(), d.std(ddof=1))
    from scipy import stats

    half = stats.t.ppf(0.5 + level / 2, df=n - 1) * sd / np.sqrt(n)
    return SeedSummary(float(mean), float(sd), float(mean - half), float(mean + half), n, n - 1, level)


def _tolerance(d: np.ndarray) -> float:
    # Signed sums equal to the observed one up to rounding must count as ">= observed".
    return 1e-12 * float(np.abs(d).sum())


def permutation_p_exact(diffs) -> float:
    """Exact two-sided sign-flip permutation p for a mean paired difference.

    Under H0 (no difference) each paired difference is symmetric about 0, so all 2^n sign assignments
    ``s in {-1,+1}^n`` are equally likely. Statistic ``|mean(s * d)|``; p is the fraction of the 2^n
    assignments (the observed one included) with statistic >= observed. Since ``s`` and ``-s`` tie,
    p >= 2 / 2^n.
    """
    d = finite_1d(diffs, "diffs")
    if d.size > MAX_EXACT_N:
        raise ValueError(f"exact enumeration is limited to n <= {MAX_EXACT_N}; use permutation_p_random")
    # All 2^n signed sums, built by doubling: after item j the array holds every sum over items 0..j.
    sums = np.zeros(1)
    for dj in d:
        sums = np.concatenate((sums - dj, sums + dj))
    observed = abs(sums[-1])  # the all-plus assignment
    return float(np.mean(np.abs(sums) >= observed - _tolerance(d)))


def permutation_p_random(diffs, n: int = 20000, seed: int | None = 0) -> float:
    """Two-sided sign-flip permutation p from ``n`` random sign assignments.

    ``p = (1 + #{|sum(s * d)| >= |sum(d)|}) / (1 + n)``: the observed assignment is counted once, so p > 0.
    """
    d = finite_1d(diffs, "diffs")
    n = check_positive_int(n, "n")
    rng = make_rng(seed)
    observed = abs(d.sum()) - _tolerance(d)
    hits = 0
    step = max(1, (1 << 22) // d.size)  # chunks of sign draws to bound memory
    for start in range(0, n, step):
        signs = rng.integers(0, 2, size=(min(step, n - start), d.size)) * 2.0 - 1.0
        hits += int(np.count_nonzero(np.abs((signs * d).sum(axis=1)) >= observed))  # not BLAS: see slopes
    return (1 + hits) / (1 + n)


def bh_q(pvals) -> np.ndarray:
    """Benjamini-Hochberg q values of a family of p values (same order as the input).

    With p sorted ascending, ``q_(i) = min_{j >= i} min(1, m * p_(j) / j)``: monotone in p and capped at 1.
    """
    p = finite_1d(pvals, "pvals")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("p values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    q = np.empty(m)
    q[order] = q_sorted
    return q
