"""Bootstrap intervals for mean contrasts (paper §4 "Statistics", App. C.3).

* ``block_bootstrap_ci``: circular moving-block bootstrap over validation blocks (block 16, 4000 resamples,
  95% percentile) -- the single-seed CIs, covering evaluation-set sampling only. ``block_length(n)`` is the
  block every caller uses: 16, or ``n // 2`` for a series shorter than 32 blocks.
* ``cluster_bootstrap_ci``: document-cluster bootstrap (C4 in the downstream layer 1).
* ``family_bootstrap_ci``: resample whole probe families (probe A: every distance stays in its family).
* ``paired_bootstrap_ci``: iid bootstrap of per-item paired differences (downstream layer 3).

All resampling is vectorized over resamples; resamples are processed in chunks only to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_level, check_positive_int, finite_1d, make_rng

_CHUNK_ELEMS = 1 << 22  # random indices drawn per chunk of resamples (bounds memory at ~32 MB)
BLOCK = 16  # the paper's block length (§4, App. C.3)


def block_length(n: int, block: int = BLOCK) -> int:
    """The circular block-bootstrap block length for a series of ``n >= 2`` values: ``block`` (the paper's 16)
    when the series holds at least two such blocks (``n >= 2 * block``), else ``n // 2``.

    A resample must hold at least two blocks: with one block as long as the series every circular resample
    is a rotation of it, with the series' own mean, and the interval has zero width (``block_bootstrap_ci``
    refuses ``block > n // 2``). ``n = 1`` has no interval at all (``ValueError``).
    """
    n = check_positive_int(n, "n")
    block = check_positive_int(block, "block")
    if n < 2:
        raise ValueError("a block bootstrap needs a series of at least 2 values, got 1")
    return min(block, n // 2)


@dataclass(frozen=True)
class BootstrapResult:
    """Point estimate ``mean`` with a percentile interval ``[lo, hi]`` at ``level``."""

    mean: float
    lo: float
    hi: float
    se: float  # SD of the bootstrap replicates
    level: float
    n_resamples: int
    method: str
    p: float = 1.0  # two-sided percentile-bootstrap p for "mean = 0" (see _percentile_result)

    def excludes_zero(self) -> bool:
        return self.lo > 0.0 or self.hi < 0.0


def _percentile_result(
    estimate: float, reps: np.ndarray, level: float, method: str, n_resamples: int
) -> BootstrapResult:
    alpha = 1.0 - level
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    # The smallest alpha whose percentile interval excludes 0: 2 min(P(rep <= 0), P(rep >= 0)), with the
    # observed estimate counted once so that p > 0.
    n = reps.size
    p = 2 * min(np.count_nonzero(reps <= 0) + 1, np.count_nonzero(reps >= 0) + 1) / (n + 1)
    return BootstrapResult(
        mean=float(estimate),
        lo=float(lo),
        hi=float(hi),
        se=float(reps.std(ddof=1)) if reps.min() < reps.max() else 0.0,  # np.std of equal values rounds
        level=level,
        n_resamples=n_resamples,
        method=method,
        p=float(min(1.0, p)),
    )


def _chunks(n_resamples: int, draws_per_resample: int):
    """Row ranges so that each chunk draws at most ``_CHUNK_ELEMS`` random integers."""
    step = max(1, _CHUNK_ELEMS // max(1, draws_per_resample))
    for start in range(0, n_resamples, step):
        yield min(step, n_resamples - start)


def circular_block_means(x: np.ndarray, block: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_resamples`` circular moving-block resamples of ``x``.

    Each resample concatenates ``b = ceil(n / block)`` blocks ``x[s], ..., x[s+block-1]`` (indices mod n)
    with starts ``s`` uniform on ``[0, n)`` and truncates to ``n`` values, i.e. the last block contributes
    only its first ``n - (b-1)*block`` values. Block sums come from a prefix sum of ``x`` wrapped once,
    so the cost is O(n_resamples * b) rather than O(n_resamples * n).
    """
    n = x.size
    n_blocks = -(-n // block)
    tail = n - (n_blocks - 1) * block  # length kept from the last block
    wrapped = np.resize(x, n + block)  # x, then its first `block` values again (np.resize repeats cyclically)
    csum = np.concatenate(([0.0], np.cumsum(wrapped)))
    full = csum[block : block + n] - csum[:n]  # full[s] = sum of the circular block starting at s
    part = csum[tail : tail + n] - csum[:n]  # part[s] = sum of its first `tail` values
    out = []
    for rows in _chunks(n_resamples, n_blocks):
        starts = rng.integers(0, n, size=(rows, n_blocks))
        out.append(full[starts[:, :-1]].sum(axis=1) + part[starts[:, -1]])
    return np.concatenate(out) / n


def _mean_and_reps(x: np.ndarray, block: int, n_resamples: int, seed: int | None) -> tuple[float, np.ndarray]:
    """The mean of ``x`` and its circular block-bootstrap replicates. A constant series has every replicate
    equal to its value exactly (the prefix sums would round them, e.g. 100 x 0.01 to an interval just above
    the mean, which a margin test such as "lo > 0.01" would then pass)."""
    rng = make_rng(seed)  # a bad seed is refused for every series
    if x[0] == x.min() == x.max():
        return float(x[0]), np.full(n_resamples, x[0])
    return float(x.mean()), circular_block_means(x, block, n_resamples, rng)


def block_bootstrap_ci(
    x, *, block: int = 16, n_resamples: int = 4000, level: float = 0.95, seed: int | None = 0
) -> BootstrapResult:
    """Circular moving-block bootstrap percentile CI for the mean of a per-block series ``x``.

    ``x`` is usually a per-validation-block contrast (``contrast`` / ``factorial_2x2``), kept in evaluation
    order so that neighbouring blocks stay together. ``block=1`` is the iid bootstrap. ``block`` must be at
    most ``x.size // 2`` (a resample holds at least two blocks; see :func:`block_length`, the block every
    caller uses), else ``ValueError``.
    """
    x = finite_1d(x, "x", min_size=2)
    block = check_positive_int(block, "block")
    if block > x.size // 2:
        raise ValueError(
            f"block ({block}) must be at most half the series length ({x.size} // 2 = {x.size // 2}): a "
            "resample must hold at least two blocks, else every circular resample is a rotation of the "
            "series with its mean and the interval has zero width; "
            f"use block_length({x.size}) = {block_length(x.size)}"
        )
    n_resamples = check_positive_int(n_resamples, "n_resamples")
    level = check_level(level)
    est, reps = _mean_and_reps(x, block, n_resamples, seed)
    return _percentile_result(est, reps, level, f"circular block bootstrap (block {block})", n_resamples)


def paired_bootstrap_ci(
    diffs, *, n_resamples: int = 4000, level: float = 0.95, seed: int | None = 0
) -> BootstrapResult:
    """iid bootstrap percentile CI for the mean of per-item paired differences (downstream comparisons)."""
    diffs = finite_1d(diffs, "diffs", min_size=2)
    n_resamples = check_positive_int(n_resamples, "n_resamples")
    level = check_level(level)
    # A circular block bootstrap with block 1 is exactly the iid bootstrap.
    est, reps = _mean_and_reps(diffs, 1, n_resamples, seed)
    return _percentile_result(est, reps, level, "paired bootstrap", n_resamples)


def cluster_bootstrap_ci(
    values,
    clusters,
    weights=None,
    *,
    n_resamples: int = 4000,
    level: float = 0.95,
    seed: int | None = 0,
    method: str = "cluster bootstrap",
    name: str = "clusters",
) -> BootstrapResult:
    """Cluster bootstrap percentile CI for a (weighted) mean of per-item ``values``.

    Clusters (e.g. C4 documents) are drawn with replacement, as many as there are; a drawn cluster brings all
    its items. The statistic is ``sum(w * v) / sum(w)`` over the resampled items: with ``weights`` = token
    counts it is the token-weighted mean, with ``weights=None`` the plain item mean.
    """
    values = finite_1d(values, "values")
    clusters = np.asarray(clusters)
    if clusters.shape != values.shape:
        raise ValueError(f"{name} must have the shape of values {values.shape}, got {clusters.shape}")
    if clusters.dtype == object or (clusters.dtype.kind == "f" and not np.all(np.isfinite(clusters))):
        raise ValueError(f"{name} must be ids of one type (ints or strings), without None or NaN")
    w = np.ones_like(values) if weights is None else finite_1d(weights, "weights")
    if w.shape != values.shape:
        raise ValueError(f"weights must have the shape of values {values.shape}, got {w.shape}")
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    n_resamples = check_positive_int(n_resamples, "n_resamples")
    level = check_level(level)
    _, label = np.unique(clusters, return_inverse=True)
    n_clusters = int(label.max()) + 1
    if n_clusters < 2:
        raise ValueError(f"need at least 2 {name}, got {n_clusters}")
    # Per-cluster sums: a resample is a vector of draw counts c_g, and its statistic is
    # sum_g c_g * sum_{i in g} w_i v_i  /  sum_g c_g * sum_{i in g} w_i.
    wv = np.bincount(label, weights=w * values, minlength=n_clusters)
    ww = np.bincount(label, weights=w, minlength=n_clusters)
    rng = make_rng(seed)
    reps = []
    for rows in _chunks(n_resamples, n_clusters):
        draws = rng.integers(0, n_clusters, size=(rows, n_clusters))
        num, den = wv[draws].sum(axis=1), ww[draws].sum(axis=1)
        if np.any(den <= 0):
            raise ValueError("a resample drew only zero-weight clusters; give every cluster positive weight")
        reps.append(num / den)
    est, reps = wv.sum() / ww.sum(), np.concatenate(reps)
    if values.min() == values.max():  # every (weighted) mean is the value exactly; the sums would round it
        est, reps = values[0], np.full(n_resamples, values[0])
    return _percentile_result(est, reps, level, method, n_resamples)


def family_bootstrap_ci(
    values, families, *, n_resamples: int = 4000, level: float = 0.95, seed: int | None = 0
) -> BootstrapResult:
    """Family-level bootstrap (probe A): resample whole families, keeping every distance/pairing together."""
    return cluster_bootstrap_ci(
        values,
        families,
        n_resamples=n_resamples,
        level=level,
        seed=seed,
        method="family bootstrap",
        name="families",
    )
