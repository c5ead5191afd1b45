"""Every statistics function refuses a bad argument (None, a scalar for an array, a string, ...) with a
ValueError naming it, never a TypeError from deep inside numpy."""

import numpy as np
import pytest

from kinterval.stats import (
    block_bootstrap_ci,
    block_length,
    cluster_bootstrap_ci,
    contrast,
    family_bootstrap_ci,
    k_trend_slopes,
    k_trend_weights,
    kendall_w,
    label_single_seed,
    paired_bootstrap_ci,
    pairwise_spearman,
    permutation_p_exact,
    permutation_p_random,
    seed_summary,
    spearman,
)

X = np.arange(40.0)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: block_bootstrap_ci(X, block=None), "block"),
        (lambda: block_bootstrap_ci(X, n_resamples=None), "n_resamples"),
        (lambda: block_bootstrap_ci(X, level=None), "level"),
        (lambda: block_bootstrap_ci(X, level="0.95"), "level"),
        (lambda: block_bootstrap_ci(X, seed="0"), "seed"),
        (lambda: block_bootstrap_ci(X, seed=-1), "seed"),
        (lambda: block_bootstrap_ci(None), "x"),
        (lambda: block_bootstrap_ci(["a", "b"]), "x"),
        (lambda: paired_bootstrap_ci(X, n_resamples=np.nan), "n_resamples"),
        (lambda: cluster_bootstrap_ci(X, X, level=None), "level"),
        (lambda: seed_summary([1, 2], level=None), "level"),
        (lambda: seed_summary([1, 2], level=True), "level"),
        (lambda: seed_summary([object(), 2]), "diffs"),
        (lambda: permutation_p_random(X[:5], n=None), "n"),
        (lambda: permutation_p_random(X[:5], n=np.inf), "n"),
        (lambda: permutation_p_random(X[:5], seed=1.5), "seed"),
        (lambda: block_length(None), "n"),
        (lambda: block_length(40, block=None), "block"),
        (lambda: label_single_seed(None, 1), "lo"),
        (lambda: label_single_seed(0, "1"), "hi"),
        (lambda: label_single_seed(0, 1, margin=None), "margin"),
        (lambda: contrast({"a": 1.0, "b": 2.0}, {"a": 1, "b": -1}), r"per_block\['a'\]"),
        (lambda: contrast({"a": [1.0, 2.0], "b": 2.0}, {"a": 1}), r"per_block\['b'\]"),
        (lambda: contrast({"a": [1.0, 2.0]}, {"a": None}), "weight of 'a'"),
        (lambda: k_trend_slopes([4, 8], [[0.1, 0.2], [0.1, 0.3]], level=None), "level"),
        (lambda: kendall_w(None), "scores"),
        (lambda: spearman([1, 2, 3], [1, 2, 3], n_resamples=None), "n_resamples"),
        (lambda: spearman([1, 2, 3], [1, 2, 3], seed="a"), "seed"),
        # Booleans are refused where a number is meant (True is not block 1 nor a bound of 1).
        (lambda: block_bootstrap_ci(X, block=True), "block"),
        (lambda: block_bootstrap_ci(X, n_resamples=True), "n_resamples"),
        (lambda: block_length(True), "n"),
        (lambda: label_single_seed(False, True), "lo"),
        (lambda: label_single_seed(0.0, True), "hi"),
        (lambda: contrast({"a": [1.0, 2.0]}, {"a": True}), "weight of 'a'"),
        # Too little data is refused by the argument that is short, not by a later step.
        (lambda: block_bootstrap_ci([1.0]), "x needs at least 2"),
        (lambda: k_trend_slopes([0, 8], [[0.1, 0.2], [0.1, 0.3]]), "K values must be positive"),
        (lambda: k_trend_slopes([-4, 8], [[0.1, 0.2], [0.1, 0.3]]), "K values must be positive"),
        (lambda: k_trend_slopes([4, 8], [[0.1, 0.2]]), "delta_nll"),
        # The slope weights alone: log2 of K <= 0 or of a non-number would give NaN weights.
        (lambda: k_trend_weights([0, 8]), "K values must be positive"),
        (lambda: k_trend_weights([-4, 8]), "K values must be positive"),
        (lambda: k_trend_weights([4, np.nan]), "K_values"),
        (lambda: k_trend_weights([4, np.inf]), "K_values"),
        (lambda: k_trend_weights(["4", "x"]), "K_values"),
        (lambda: k_trend_weights([4]), "K_values needs at least 2"),
        (lambda: kendall_w([[1.0], [2.0]]), "scores"),
        (lambda: pairwise_spearman([[1.0, 2.0], [2.0, 1.0]]), "scores"),
        # Not a mapping, or ids numpy cannot sort: a ValueError naming it, not a TypeError from numpy.
        (lambda: contrast(None, {"a": 1}), "per_block must be a mapping"),
        (lambda: contrast([[1.0, 2.0]], {"a": 1}), "per_block must be a mapping"),
        (lambda: contrast({"a": [1.0, 2.0]}, ["a"]), "weights must be a mapping"),
        (lambda: cluster_bootstrap_ci(X[:4], [None, None, 1, 1]), "clusters must be ids"),
        (lambda: cluster_bootstrap_ci(X[:4], [0.0, np.nan, 1.0, 1.0]), "clusters must be ids"),
        (lambda: family_bootstrap_ci(X[:4], None), "families must have the shape"),
        (lambda: family_bootstrap_ci(X[:4], [0, 0, 0, 0]), "at least 2 families"),
        # Values whose sums or squares overflow float64 would give inf/NaN statistics (or p = 0).
        (lambda: permutation_p_exact([1e308, 1e308]), "too large"),
        (lambda: block_bootstrap_ci([1e308, -1e308] * 20), "too large"),
        (lambda: seed_summary([1e308, -1e308, 1e308]), "too large"),
        (lambda: seed_summary([1e160, 0.0, 1.0]), "too large"),
        (lambda: k_trend_slopes([4, 8], [[1e308, 0.0], [0.1, 0.3]]), "too large"),
    ],
)
def test_bad_argument_is_a_value_error_naming_it(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_whole_numbers_and_numpy_scalars_still_accepted():
    a = block_bootstrap_ci(X, block=np.int64(8), n_resamples=100.0, level=np.float32(0.9), seed=np.int64(3))
    b = block_bootstrap_ci(X, block=8, n_resamples=100, level=float(np.float32(0.9)), seed=3)
    assert (a.lo, a.hi) == (b.lo, b.hi)
    assert block_length(np.int64(40)) == 16
    assert label_single_seed(np.float64(0.02), 0.03).separated
