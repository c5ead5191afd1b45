import numpy as np
import pytest
from scipy import signal

from kinterval.stats import (
    block_bootstrap_ci,
    block_length,
    cluster_bootstrap_ci,
    family_bootstrap_ci,
    label_single_seed,
    paired_bootstrap_ci,
)


def _naive_block_means(x, block, n_resamples, seed):
    """Reference: explicit index construction from the same random starts."""
    n = x.size
    n_blocks = -(-n // block)
    starts = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n_blocks))
    means = []
    for row in starts:
        idx = np.concatenate([(s + np.arange(block)) % n for s in row])[:n]
        means.append(x[idx].mean())
    return np.array(means)


@pytest.mark.parametrize(("n", "block"), [(243, 16), (50, 7), (64, 16), (10, 5), (33, 16), (9, 1)])
def test_block_bootstrap_matches_explicit_resampling(n, block):
    x = np.random.default_rng(n).normal(size=n)
    ref = _naive_block_means(x, block, 200, seed=5)
    lo, hi = np.quantile(ref, [0.025, 0.975])
    r = block_bootstrap_ci(x, block=block, n_resamples=200, seed=5)
    assert r.mean == pytest.approx(x.mean())
    assert (r.lo, r.hi) == pytest.approx((lo, hi), rel=1e-10, abs=1e-12)
    assert r.se == pytest.approx(ref.std(ddof=1), rel=1e-10)
    assert r.level == 0.95 and r.n_resamples == 200


@pytest.mark.parametrize(("n", "block"), [(20, 11), (20, 20), (10, 10), (31, 16), (3, 2), (2, 2)])
def test_block_bootstrap_refuses_a_block_longer_than_half_the_series(n, block):
    """With one block (block > n // 2) every circular resample is a rotation of the series with its mean: the
    interval would have zero width, exclude 0 and give p at its floor for a series of pure noise."""
    x = np.random.default_rng(n).normal(0.0, 1.0, n)
    with pytest.raises(ValueError, match="at least two blocks"):
        block_bootstrap_ci(x, block=block)


def test_block_length_is_the_papers_16_or_half_a_short_series():
    assert [block_length(n) for n in (2, 3, 5, 10, 16, 24, 31, 32, 33, 64, 243)] == [
        1, 1, 2, 5, 8, 12, 15, 16, 16, 16, 16
    ]  # fmt: skip
    assert block_length(40, block=8) == 8 and block_length(10, block=8) == 5
    for n in range(2, 80):  # always a valid block: no ValueError, a resample holds at least two blocks
        r = block_bootstrap_ci(
            np.random.default_rng(n).normal(size=n), block=block_length(n), n_resamples=200
        )
        assert r.lo < r.hi
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError):
            block_length(bad)


def test_block_bootstrap_deterministic_and_seeded():
    x = np.random.default_rng(0).normal(size=976)
    a = block_bootstrap_ci(x)
    assert a == block_bootstrap_ci(x, seed=0)
    assert a != block_bootstrap_ci(x, seed=1)
    assert a.lo < a.mean < a.hi
    const = block_bootstrap_ci(np.full(100, 0.3))
    assert const.lo == pytest.approx(0.3) and const.hi == pytest.approx(0.3)


def _ar1(phi, n, reps, rng):
    e = rng.normal(size=(reps, n + 200))
    return signal.lfilter([1.0], [1.0, -phi], e, axis=1)[:, 200:]  # burn-in 200 -> stationary, mean 0


def _coverage(series, block):
    hits = [
        (r.lo <= 0.0 <= r.hi)
        for r in (block_bootstrap_ci(x, block=block, n_resamples=1000, seed=i) for i, x in enumerate(series))
    ]
    return np.mean(hits)


def test_block_bootstrap_coverage_on_ar1():
    # phi = 0.5, n = 243 (WikiText-103 validation blocks): block 16 covers the true mean ~95% of the time.
    rng = np.random.default_rng(2024)
    cov = _coverage(_ar1(0.5, 243, 400, rng), block=16)
    assert 0.88 <= cov <= 0.98


def test_iid_bootstrap_undercovers_autocorrelated_series():
    # phi = 0.8: the long-run variance is (1 + phi) / (1 - phi) = 9 times the iid one, so the iid bootstrap
    # (block 1) interval is ~1/3 too narrow (nominal coverage ~50%); block 16 recovers most of it.
    series = _ar1(0.8, 243, 300, np.random.default_rng(7))
    cov_iid = _coverage(series, block=1)
    cov_block = _coverage(series, block=16)
    assert cov_iid < 0.75
    assert cov_block > cov_iid + 0.15


def test_paired_bootstrap_is_iid_bootstrap():
    d = np.random.default_rng(1).normal(0.05, 1.0, size=300)
    r = paired_bootstrap_ci(d, n_resamples=500, seed=3)
    assert r == paired_bootstrap_ci(d, n_resamples=500, seed=3)
    idx = np.random.default_rng(3).integers(0, d.size, size=(500, d.size))
    lo, hi = np.quantile(d[idx].mean(axis=1), [0.025, 0.975])
    assert (r.lo, r.hi) == pytest.approx((lo, hi), rel=1e-10)
    assert r.mean == pytest.approx(d.mean())


def test_cluster_bootstrap_weighted_statistic_matches_reference():
    rng = np.random.default_rng(4)
    clusters = np.repeat(["d0", "d1", "d2", "d3", "d4", "d5"], [1, 3, 2, 5, 1, 4])
    values = rng.normal(size=clusters.size)
    tokens = rng.integers(1, 50, size=clusters.size).astype(float)
    r = cluster_bootstrap_ci(values, clusters, tokens, n_resamples=300, seed=9)
    assert r.mean == pytest.approx(np.sum(tokens * values) / tokens.sum())
    # Reference: loop over resamples, gather the drawn clusters' items, token-weighted mean.
    names = np.unique(clusters)
    draws = np.random.default_rng(9).integers(0, names.size, size=(300, names.size))
    ref = []
    for row in draws:
        items = np.concatenate([np.flatnonzero(clusters == names[g]) for g in row])
        ref.append(np.sum(tokens[items] * values[items]) / tokens[items].sum())
    lo, hi = np.quantile(ref, [0.025, 0.975])
    assert (r.lo, r.hi) == pytest.approx((lo, hi), rel=1e-10)
    # Unweighted: plain item mean.
    assert cluster_bootstrap_ci(values, clusters, n_resamples=10).mean == pytest.approx(values.mean())


def test_cluster_and_family_bootstrap_respect_within_cluster_correlation():
    rng = np.random.default_rng(5)
    fam = np.repeat(np.arange(400), 5)  # probe A: 400 families x 5 distances
    values = np.repeat(rng.normal(size=400), 5) + 0.1 * rng.normal(size=2000)
    fam_ci = family_bootstrap_ci(values, fam, n_resamples=1000)
    iid_ci = paired_bootstrap_ci(values, n_resamples=1000)
    # Items in a family are near copies: the family-level interval is ~sqrt(5) wider than the iid one.
    ratio = (fam_ci.hi - fam_ci.lo) / (iid_ci.hi - iid_ci.lo)
    assert 1.8 < ratio < 2.7
    assert fam_ci.method == "family bootstrap"
    same = cluster_bootstrap_ci(values, fam, n_resamples=1000)
    assert (same.lo, same.hi) == (fam_ci.lo, fam_ci.hi)


@pytest.mark.parametrize(
    "call",
    [
        lambda: block_bootstrap_ci([]),
        lambda: block_bootstrap_ci([1.0]),
        lambda: block_bootstrap_ci(np.r_[np.ones(20), np.nan]),
        lambda: block_bootstrap_ci(np.ones(20), block=0),
        lambda: block_bootstrap_ci(np.ones(20), block=21),
        lambda: block_bootstrap_ci(np.ones(20), block=11),
        lambda: block_bootstrap_ci(np.ones(20), block=2.5),
        lambda: block_bootstrap_ci(np.ones(20), n_resamples=0),
        lambda: block_bootstrap_ci(np.ones(20), level=1.0),
        lambda: block_bootstrap_ci(np.ones(20), level=-0.1),
        lambda: block_bootstrap_ci(np.ones((4, 5))),
        lambda: paired_bootstrap_ci([]),
        lambda: paired_bootstrap_ci([0.3]),  # one item: a zero-width interval at 0.3 would "exclude 0"
        lambda: paired_bootstrap_ci([1.0, np.inf]),
        lambda: paired_bootstrap_ci([1.0, 2.0], level=95),
        lambda: cluster_bootstrap_ci([1.0, 2.0], [0]),
        lambda: cluster_bootstrap_ci([1.0, 2.0], [0, 0]),
        lambda: cluster_bootstrap_ci([1.0, 2.0], [0, 1], [1.0]),
        lambda: cluster_bootstrap_ci([1.0, 2.0], [0, 1], [1.0, -1.0]),
        lambda: cluster_bootstrap_ci([1.0, np.nan], [0, 1]),
        lambda: cluster_bootstrap_ci([], []),
        lambda: family_bootstrap_ci([1.0, 2.0, 3.0], [0, 1]),
    ],
)
def test_bootstrap_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_cluster_bootstrap_refuses_a_negative_weight_inside_a_positive_cluster():
    """Token weights are counts: a negative item weight is refused even when its cluster's total (and every
    resample's) stays positive, where no later step would notice it."""
    with pytest.raises(ValueError, match="non-negative"):
        cluster_bootstrap_ci([1.0, 2.0, 3.0, 4.0], [0, 0, 1, 2], [2.0, -1.0, 1.0, 1.0])


def test_bootstrap_p_matches_the_interval():
    """p < 0.05 exactly when the 95% percentile interval excludes 0; far from 0 it is the floor 2/(n+1)."""
    rng = np.random.default_rng(5)
    far = block_bootstrap_ci(rng.normal(1.0, 0.1, 64), n_resamples=999)
    assert far.p == pytest.approx(2 / 1000)
    for shift in (0.0, 0.02, 0.05):
        r = block_bootstrap_ci(rng.normal(shift, 0.1, 64), n_resamples=999)
        assert (r.p < 0.05) == r.excludes_zero() or abs(r.p - 0.05) < 0.01


def test_bootstrap_of_a_null_contrast():
    """Identical conditions give a contrast of zeros: every replicate is 0, the CI [0, 0] touches zero and so
    does not exclude it, and p is 1 (replicates equal to 0 count on both sides)."""
    zeros = np.zeros(48)
    for r in (
        block_bootstrap_ci(zeros),
        paired_bootstrap_ci(zeros),
        cluster_bootstrap_ci(zeros, np.arange(48) // 4),
    ):
        assert (r.mean, r.lo, r.hi) == (0.0, 0.0, 0.0), r.method
        assert not r.excludes_zero() and r.p == 1.0, r.method


def test_defaults_are_the_papers_protocol():
    """§4 / App. C.3: block 16, 4000 resamples, 95% percentile for the block bootstrap, 4000 resamples for
    the paired and cluster bootstraps, 20,000 random sign flips for the permutation p. Every caller relies on
    the defaults (halving n_resamples passed every other test)."""
    from kinterval.stats import permutation_p_random

    x = np.random.default_rng(3).normal(0.1, 1.0, 64)
    r = block_bootstrap_ci(x)
    assert (r.n_resamples, r.level, r.method) == (4000, 0.95, "circular block bootstrap (block 16)")
    assert r == block_bootstrap_ci(x, block=16, n_resamples=4000, level=0.95, seed=0)
    p = paired_bootstrap_ci(x)
    assert (p.n_resamples, p.level) == (4000, 0.95) and p == paired_bootstrap_ci(x, n_resamples=4000, seed=0)
    groups = np.arange(64) // 4
    c = cluster_bootstrap_ci(x, groups)
    assert (c.n_resamples, c.level) == (4000, 0.95) and c == cluster_bootstrap_ci(x, groups, n_resamples=4000)
    f = family_bootstrap_ci(x, groups)
    assert (f.n_resamples, f.level) == (4000, 0.95)
    q = permutation_p_random(x[:12])
    assert q == permutation_p_random(x[:12], n=20000, seed=0)
    assert (q * 20001) == pytest.approx(round(q * 20001), abs=1e-6)  # p = (1 + hits) / (1 + 20000)


@pytest.mark.parametrize("value", [0.01, -0.3, 0.0])
def test_a_constant_series_gives_the_zero_width_interval_at_its_value(value):
    """100 x 0.01 gave mean 0.009999999999999998 and [0.010000000000000004, 0.010000000000000009] (rounding
    of the prefix sums): an interval off its estimate, "separated" (lo > +0.01) at a difference of 0.01."""
    x = np.full(100, value)
    for r in (block_bootstrap_ci(x), paired_bootstrap_ci(x)):
        assert (r.mean, r.lo, r.hi, r.se) == (value, value, value, 0.0)
        assert r.p == (1.0 if value == 0 else 2 / (r.n_resamples + 1))
    ids = np.arange(100) // 7  # clusters / families of 7 items; token weights
    for r in (
        cluster_bootstrap_ci(x, ids),
        cluster_bootstrap_ci(x, ids, ids + 1.0),
        family_bootstrap_ci(x, ids),
    ):
        assert (r.mean, r.lo, r.hi, r.se) == (value, value, value, 0.0)  # was 0.29999999999999993, se 9e-17
    r = block_bootstrap_ci(np.full(100, 0.01))
    assert not label_single_seed(r.lo, r.hi).separated
    with pytest.raises(ValueError, match="seed"):
        block_bootstrap_ci(x, seed=-1)


@pytest.mark.parametrize("level", [0.8, 0.9, 0.99])
def test_level_sets_the_percentiles_of_every_bootstrap(level):
    """Every test above ran at the default 95%: a level that was ignored passed them all."""
    x = np.random.default_rng(11).normal(0.05, 1.0, 64)
    q = [(1 - level) / 2, (1 + level) / 2]
    r = block_bootstrap_ci(x, block=8, n_resamples=300, level=level, seed=2)
    assert (r.lo, r.hi) == pytest.approx(tuple(np.quantile(_naive_block_means(x, 8, 300, 2), q)), rel=1e-10)
    assert r.level == level
    p = paired_bootstrap_ci(x, n_resamples=300, level=level, seed=2)
    idx = np.random.default_rng(2).integers(0, x.size, size=(300, x.size))
    assert (p.lo, p.hi) == pytest.approx(tuple(np.quantile(x[idx].mean(axis=1), q)), rel=1e-10)
    groups = np.arange(64) // 4  # 16 equal clusters: the statistic is the mean of the drawn cluster means
    c = cluster_bootstrap_ci(x, groups, n_resamples=300, level=level, seed=2)
    draws = np.random.default_rng(2).integers(0, 16, size=(300, 16))
    ref = x.reshape(16, 4).mean(axis=1)[draws].mean(axis=1)
    assert (c.lo, c.hi) == pytest.approx(tuple(np.quantile(ref, q)), rel=1e-10)


def test_resamples_drawn_in_chunks_are_all_kept(monkeypatch):
    """Resamples are drawn in chunks of at most _CHUNK_ELEMS random integers; at the real size no test series
    spans two chunks, so a chunk loop that dropped the remainder passed everything. With 3 resamples per
    chunk, 1001 resamples are 334 chunks, the last of 2: every replicate must be kept, the result equal to
    the one-chunk draw and, far from 0, p at its floor 2 / (1001 + 1)."""
    import kinterval.stats.bootstrap as bs

    x = np.random.default_rng(6).normal(1.0, 0.1, 50)
    groups = np.arange(50) // 5  # 10 clusters
    whole = (
        block_bootstrap_ci(x, block=5, n_resamples=1001, seed=4),
        paired_bootstrap_ci(x, n_resamples=1001, seed=4),
        cluster_bootstrap_ci(x, groups, n_resamples=1001, seed=4),
    )
    monkeypatch.setattr(bs, "_CHUNK_ELEMS", 30)
    assert bs.circular_block_means(x, 5, 1001, np.random.default_rng(4)).size == 1001
    chunked = (
        block_bootstrap_ci(x, block=5, n_resamples=1001, seed=4),
        paired_bootstrap_ci(x, n_resamples=1001, seed=4),
        cluster_bootstrap_ci(x, groups, n_resamples=1001, seed=4),
    )
    assert chunked == whole
    for r in chunked:
        assert r.p == pytest.approx(2 / 1002), r.method


def test_seed_none_draws_fresh_resamples():
    """seed=None is fresh entropy (documented), not a hidden fixed seed."""
    x = np.random.default_rng(8).normal(size=100)
    assert block_bootstrap_ci(x, seed=None, n_resamples=200) != block_bootstrap_ci(
        x, seed=None, n_resamples=200
    )
