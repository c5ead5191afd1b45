import numpy as np
import pytest

from kinterval.stats import (
    block_bootstrap_ci,
    contrast,
    factorial_2x2,
    k_trend_slopes,
    label_single_seed,
    seed_summary,
)


def test_contrast_linear_combination():
    blocks = {
        "softmax": np.array([4.0, 4.1, 4.2]),
        "A": np.array([4.5, 4.4, 4.3]),
        "B": np.array([4.0, 4.0, 4.0]),
    }
    np.testing.assert_allclose(contrast(blocks, {"A": 1, "softmax": -1}), [0.5, 0.3, 0.1])
    np.testing.assert_allclose(contrast(blocks, {"A": 1, "B": -1, "softmax": 0.5}), [2.5, 2.45, 2.4])


@pytest.mark.parametrize(
    ("blocks", "weights"),
    [
        ({"a": [1.0, 2.0], "b": [1.0]}, {"a": 1, "b": -1}),
        ({"a": [1.0, 2.0], "b": [1.0]}, {"a": 1}),  # unequal lengths even if unused
        ({"a": [1.0, 2.0]}, {"c": 1}),
        ({"a": [1.0, 2.0]}, {}),
        ({"a": [1.0, np.nan]}, {"a": 1}),
        ({"a": []}, {"a": 1}),
        ({"a": [1.0, 2.0]}, {"a": np.nan}),
    ],
)
def test_contrast_bad_input(blocks, weights):
    with pytest.raises(ValueError):
        contrast(blocks, weights)


def test_factorial_identities():
    rng = np.random.default_rng(0)
    n = 243
    base = rng.normal(4.2, 0.3, size=n)  # shared per-block difficulty cancels in every contrast
    mm_w, mm_p, fwm_w, fwm_p = (base + c + 0.01 * rng.normal(size=n) for c in (0.40, 0.30, 0.10, 0.05))
    f = factorial_2x2(mm_w, mm_p, fwm_w, fwm_p)
    np.testing.assert_allclose(f.interaction, (fwm_p - fwm_w) - (mm_p - mm_w))
    np.testing.assert_allclose(f.calibration, 0.5 * (fwm_w + fwm_p) - 0.5 * (mm_w + mm_p))
    np.testing.assert_allclose(f.surrogate, 0.5 * (mm_p + fwm_p) - 0.5 * (mm_w + fwm_w))
    # Cell means 0.40, 0.30, 0.10, 0.05: calibration -0.275, surrogate -0.075, interaction +0.05.
    assert f.calibration.mean() == pytest.approx(-0.275, abs=3e-3)
    assert f.surrogate.mean() == pytest.approx(-0.075, abs=3e-3)
    assert f.interaction.mean() == pytest.approx(0.05, abs=3e-3)
    # Subtracting softmax from every cell (dNLL inputs) leaves all contrasts unchanged.
    g = factorial_2x2(mm_w - base, mm_p - base, fwm_w - base, fwm_p - base)
    np.testing.assert_allclose(g.interaction, f.interaction)
    np.testing.assert_allclose(g.calibration, f.calibration)
    # The per-block arrays are bootstrappable.
    ci = block_bootstrap_ci(f.interaction)
    assert ci.lo < 0.05 < ci.hi


def test_factorial_bad_input():
    with pytest.raises(ValueError):
        factorial_2x2([1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [1.0])


def test_k_trend_recovers_slope():
    K = np.array([4, 8, 16, 32, 64])
    rng = np.random.default_rng(1)
    true = np.array([-0.03, -0.025, -0.035, -0.028, -0.032])
    d = 0.2 + true[:, None] * np.log2(K) + rng.normal(0, 1e-3, size=(5, 5))
    t = k_trend_slopes(K, d)
    np.testing.assert_allclose(t.slopes, true, atol=2e-3)
    np.testing.assert_allclose(t.slopes, [np.polyfit(np.log2(K), row, 1)[0] for row in d], rtol=1e-10)
    ref = seed_summary(t.slopes)
    assert t.summary == ref and t.summary.df == 4
    exact = k_trend_slopes(K, 0.1 - 0.02 * np.log2(K)[None, :].repeat(3, axis=0))
    np.testing.assert_allclose(exact.slopes, -0.02)


@pytest.mark.parametrize(
    ("K", "d"),
    [
        ([4, 8], [[0.1, 0.2]]),  # one seed
        ([4, 8, 16], [[0.1, 0.2], [0.1, 0.2]]),  # mismatched columns
        ([4, 4], [[0.1, 0.2], [0.1, 0.2]]),  # no spread in K
        ([0, 8], [[0.1, 0.2], [0.1, 0.2]]),
        ([4, 8], [[0.1, np.nan], [0.1, 0.2]]),
        ([4, 8], [0.1, 0.2]),
    ],
)
def test_k_trend_bad_input(K, d):
    with pytest.raises(ValueError):
        k_trend_slopes(K, d)


@pytest.mark.parametrize(
    ("lo", "hi", "separated", "detectable", "within"),
    [
        (0.011, 0.02, True, True, False),
        (0.01, 0.02, False, True, False),  # lower bound must exceed the margin
        (0.0, 0.005, False, False, True),  # CI touching zero includes zero
        (0.001, 0.005, False, True, True),  # detectable and within margin: the labels are independent
        (-0.005, 0.005, False, False, True),
        (-0.02, 0.005, False, False, False),  # no detectable difference, yet not within margin
        (-0.0099, 0.0099, False, False, True),
        (-0.01, 0.005, False, False, False),  # touching the margin is not wholly inside
        (-0.03, -0.011, False, True, False),  # detectable improvement is never "separated"
    ],
)
def test_labels_at_boundaries(lo, hi, separated, detectable, within):
    lab = label_single_seed(lo, hi)
    assert (lab.separated, lab.detectable, lab.within_margin) == (separated, detectable, within)
    d = lab.as_dict()
    assert d["detectability"] == ("detectable" if detectable else "no detectable difference")
    assert d["margin_status"] == ("within margin" if within else "not within margin")
    assert "equivalen" not in str(d)


def test_labels_custom_margin_and_bad_input():
    assert label_single_seed(0.03, 0.04, margin=0.02).separated
    assert not label_single_seed(0.03, 0.04, margin=0.05).separated
    for args in [(0.2, 0.1), (np.nan, 0.1), (0.0, np.inf), (0.0, 0.1, 0.0), (0.0, 0.1, -0.01)]:
        with pytest.raises(ValueError):
            label_single_seed(*args)
