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


def test_spearman_matches_scipy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    y[:4] = y[0]  # ties
    r = spearman(x, y)
    ref = stats.spearmanr(x, y)
    assert (r.rho, r.p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)


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
    ],
)
def test_rank_bad_input(call):
    with pytest.raises(ValueError):
        call()
