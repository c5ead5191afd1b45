"""App. F diagnostics A1-A4, the fixed-upstream decomposition, and the hard Jacobian, eq. (5) of App. B."""

from __future__ import annotations

import re

import pytest
import torch

from kinterval.ops import OperatorSpec, attention_probs
from kinterval.ops.api import valid_mask
from kinterval.ops.diagnostics import (
    all_ones_directional,
    decompose_score_grad,
    interior_fd,
    score_gradient,
    shift_invariance,
    zero_sum_residual,
)
from kinterval.ops.formulas import hard_jacobian, hard_weights

OPS = [
    "softmax",
    "lerp-k4",
    "lerp-k32",
    "minmax-weight-k2",
    "minmax-prob-k8",
    "fwm-weight-k4",
    "resolved-prob-k4",
]


def _scores(seed=0, T=24, scale=5.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, T, T, generator=g, dtype=torch.float64) * scale, torch.randn(
        2, T, T, generator=g, dtype=torch.float64
    )


def test_a1_shift_invariance():
    s, _ = _scores()
    for op in OPS:
        assert shift_invariance(s, op, c=0.75, causal=True) < 1e-12, op  # exact up to rounding of s + c


def test_a2_zero_sum_residual_full_vs_detach():
    s, up = _scores(1)
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    full = zero_sum_residual(score_gradient(s, "lerp-k32", up, causal=True), valid)[:, 1:]
    det = zero_sum_residual(
        score_gradient(s, OperatorSpec.parse("lerp-k32", range_grad="detach"), up, causal=True), valid
    )[:, 1:]
    assert full.max() < 1e-12
    assert det.median() > 1e-3


def test_a1_a2_with_a_general_mask_and_backend_choice():
    """A1 applies the mask to both forwards; A2 reads only the valid keys; score_gradient runs the backend
    it is given (closed_form agrees with reference; a name that forms no probabilities raises)."""
    s, up = _scores(5, T=8)
    mask = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(9)) > 0.4
    for op in ("softmax", "lerp-k4", "fwm-prob-k4"):
        assert shift_invariance(s, op, c=0.75, mask=mask) < 1e-12, op
    grad = torch.tensor([[1.0, -1.0, 5.0], [2.0, 0.0, -1.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    torch.testing.assert_close(
        zero_sum_residual(grad, valid), torch.tensor([0.0, 1 / 3], dtype=torch.float64)
    )
    ref = score_gradient(s, "minmax-weight-k4", up, mask=mask)
    torch.testing.assert_close(
        score_gradient(s, "minmax-weight-k4", up, mask=mask, backend="closed_form"),
        ref,
        rtol=1e-9,
        atol=1e-14,
    )
    with pytest.raises(ValueError, match="not a probability backend"):
        score_gradient(s, "minmax-weight-k4", up, mask=mask, backend="triton")


def test_a3_all_ones_directional_derivative():
    s, up = _scores(2)
    full = all_ones_directional(s, "lerp-k32", up, causal=True)
    det = all_ones_directional(s, OperatorSpec.parse("lerp-k32", range_grad="detach"), up, causal=True)
    assert (
        abs(full.finite_difference) < 1e-9 and abs(det.finite_difference) < 1e-9
    )  # the forward is invariant
    assert abs(full.autograd) < 1e-12
    assert abs(det.autograd) > 1e-4  # detach carries a spurious common-mode component


def test_a4_interior_finite_difference_matches_for_softmax_full_and_detach():
    s, up = _scores(3, T=12)
    row = s[0, 11]
    # an interior key: neither extremum of its row
    j = int(torch.argsort(row)[6])
    for spec in ("softmax", "lerp-k32", OperatorSpec.parse("lerp-k32", range_grad="detach")):
        r = interior_fd(s, spec, up, (0, 11, j), causal=True)
        assert abs(r.autograd - r.finite_difference) <= 1e-6 * max(1e-3, abs(r.autograd)), (spec, r)


def test_decomposition_identity_and_extremum_support():
    s, up = _scores(4)
    for op in ("lerp-k32", "minmax-weight-k4", "fwm-prob-k4"):
        d = decompose_score_grad(s, up, op, causal=True)
        full = score_gradient(s, op, up, causal=True)
        torch.testing.assert_close(d["g_full"], full, rtol=1e-10, atol=1e-14)
        for mode, parts in (
            ("detach", ["g_self"]),
            ("max_only", ["g_self", "g_M"]),
            ("min_only", ["g_self", "g_m"]),
        ):
            g_mode = score_gradient(s, OperatorSpec.parse(op, range_grad=mode), up, causal=True)
            torch.testing.assert_close(sum(d[p] for p in parts), g_mode, rtol=1e-10, atol=1e-14)
        # M and m terms fall entirely on the arg-max / arg-min keys
        valid = valid_mask(s.shape, s.device, causal=True, mask=None)
        masked = s.masked_fill(~valid, float("nan"))
        not_max = valid & (s != masked.nan_to_num(float("-inf")).amax(-1, keepdim=True))
        assert (d["g_M"][not_max] == 0).all()


def test_eq5_hard_jacobian_against_autograd_and_finite_differences():
    g = torch.Generator().manual_seed(5)
    worst_ad, worst_fd = 0.0, 0.0
    for _ in range(100):
        s = torch.randn(9, generator=g, dtype=torch.float64) * 4
        for K in (2, 4, 16):
            J = hard_jacobian(s, K)
            _, ell = hard_weights(s, K)
            J_ad = torch.autograd.functional.jacobian(lambda x, ell=ell, K=K: hard_weights(x, K, ell)[0], s)
            eps = 1e-6
            J_fd = torch.stack(
                [
                    (hard_weights(s + eps * e, K, ell)[0] - hard_weights(s - eps * e, K, ell)[0]) / (2 * eps)
                    for e in torch.eye(9, dtype=torch.float64)
                ],
                dim=1,
            )
            worst_ad = max(worst_ad, (J - J_ad).abs().max().item())
            worst_fd = max(worst_fd, (J - J_fd).abs().max().item())
    assert worst_ad < 1e-15  # paper: 2.8e-17
    assert worst_fd < 1e-8  # paper: 8.8e-11


def test_two_key_minmax_hard_row_is_two_element_softmax():
    g = torch.Generator().manual_seed(6)
    s = torch.randn(200, 2, generator=g, dtype=torch.float64) * 5
    for K in (1, 2, 4, 16):
        for sur in ("weight", "prob"):
            P = attention_probs(s, f"minmax-{sur}-k{K}")
            torch.testing.assert_close(P, torch.softmax(s, -1), rtol=0, atol=1e-15)


def test_fwm_hard_map_has_zero_jacobian():
    """Under FWM the hard weights are locally constant: small perturbations do not move the forward."""
    g = torch.Generator().manual_seed(7)
    s = torch.randn(20, 16, generator=g, dtype=torch.float64) * 3
    P0 = attention_probs(s, "fwm-weight-k4")
    moved = attention_probs(
        s + 1e-9 * torch.randn(s.shape, generator=g, dtype=torch.float64), "fwm-weight-k4"
    )
    assert torch.equal(P0, moved)


def test_decomposition_treats_neg_inf_scores_as_masked():
    """A -inf score is a masked key (as in attention_probs): the decomposition used to give NaN rows."""
    s = torch.tensor([[1.0, float("-inf"), 0.0, -2.0]], dtype=torch.float64)
    up = torch.tensor([[0.3, -1.0, 0.7, 0.1]], dtype=torch.float64)
    got = decompose_score_grad(s, up, "lerp-k4")
    masked = decompose_score_grad(s.nan_to_num(neginf=5.0), up, "lerp-k4", mask=torch.isfinite(s))
    for key in ("g_self", "g_M", "g_m", "g_full"):
        assert torch.equal(got[key], masked[key]), key
    assert got["g_full"].isfinite().all() and got["g_full"][0, 1] == 0
    torch.testing.assert_close(got["g_full"], score_gradient(s, "lerp-k4", up), rtol=1e-12, atol=1e-12)


def test_decomposition_refuses_nan_and_pos_inf_scores_like_score_gradient():
    """decompose_score_grad returned all-NaN gradients for a NaN or +inf score where score_gradient raises."""
    up = torch.tensor([[0.3, -1.0, 0.7, 0.1]], dtype=torch.float64)
    calls = (lambda s: score_gradient(s, "lerp-k4", up), lambda s: decompose_score_grad(s, up, "lerp-k4"))
    for bad in (float("nan"), float("inf")):
        for call in calls:
            with pytest.raises(ValueError, match=r"scores contain NaN or \+inf on keys that are not masked"):
                call(torch.tensor([[1.0, bad, 0.0, -2.0]], dtype=torch.float64))
    # a NaN on a masked key is never read
    s = torch.tensor([[1.0, float("nan"), 0.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    assert decompose_score_grad(s, up, "lerp-k4", mask=mask)["g_full"].isfinite().all()


def test_zero_sum_residual_of_a_non_finite_row_is_nan():
    """A NaN gradient row used to read as rho = 0, a perfectly zero-sum gradient."""
    g = torch.tensor(
        [[float("nan"), 1.0, -1.0], [float("inf"), -1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]
    )
    rho = zero_sum_residual(g)
    assert rho[:2].isnan().all() and rho[2:].tolist() == [0.0, 0.0]
    assert zero_sum_residual(torch.tensor([[1.0, 2.0, -1.0]])).item() == pytest.approx(0.5)
    # masked keys are not read
    assert zero_sum_residual(g[:1], torch.tensor([[False, True, True]])).item() == 0.0


@pytest.mark.parametrize("up_shape", [(5, 5), (2, 5, 6), (1, 2, 5, 5), (2, 5, 1)])
def test_upstream_of_another_shape_is_a_value_error_naming_both(up_shape):
    """An upstream of another shape gave a raw torch error, or broadcast silently ((5, 5) against scores
    (2, 5, 5) summed the loss over the batch) in the decomposition and in the A1-A4 gradients."""
    s = torch.randn(2, 5, 5, dtype=torch.float64)
    up = torch.ones(up_shape, dtype=torch.float64)
    msg = rf"upstream .* shape of the scores \(2, 5, 5\), got {re.escape(str(up_shape))}"
    for call in (
        lambda: decompose_score_grad(s, up, "lerp-k4"),
        lambda: score_gradient(s, "lerp-k4", up),
        lambda: all_ones_directional(s, "lerp-k4", up),
        lambda: interior_fd(s, "lerp-k4", up, (0, 1, 2)),
    ):
        with pytest.raises(ValueError, match=msg):
            call()
    with pytest.raises(ValueError, match="must be tensors"):
        decompose_score_grad(s, up.tolist(), "lerp-k4")
    with pytest.raises(ValueError, match="must be tensors, got list and Tensor"):  # the scores, too
        score_gradient(s.tolist(), "lerp-k4", up)


def test_a1_reports_a_forward_that_is_not_shift_invariant(monkeypatch):
    """A1 must be able to fail: with a forward that moves under s -> s + c it reports the move (a checker
    that compared F(s) with itself would always give 0 and pass the test above)."""
    from kinterval.ops import diagnostics

    monkeypatch.setattr(diagnostics, "attention_probs", lambda s, spec, **kw: s * s)
    s = torch.tensor([[0.0, 1.0, -2.0]], dtype=torch.float64)
    # (s + c)^2 - s^2 = 2 c s + c^2 with c = 0.5: 0.25, 1.25, -1.75
    assert shift_invariance(s, "lerp-k4", c=0.5) == pytest.approx(1.75, rel=1e-15)


def test_a3_and_a4_measure_a_forward_that_is_not_shift_invariant(monkeypatch):
    """A3 and A4 on L = <u, s^2> (central differences of a quadratic are exact): the derivative along the
    all-ones direction is sum 2 u s, at one entry 2 u s. The shift-invariant operators only ever gave A3 a
    true value of 0, which a finite difference off by any factor also matches."""
    from kinterval.ops import diagnostics

    monkeypatch.setattr(diagnostics, "attention_probs", lambda s, spec, **kw: s * s)
    s = torch.tensor([[0.5, 1.0, -2.0], [1.5, -0.25, 3.0]], dtype=torch.float64)
    up = torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, -1.0]], dtype=torch.float64)
    want = float((2 * up * s).sum())  # 1 - 2 - 2 + 6 - 0.5 - 6 = -3.5
    r = all_ones_directional(s, "lerp-k4", up, eps=1e-3)
    assert r.autograd == pytest.approx(want, rel=1e-12) and r.finite_difference == pytest.approx(
        want, rel=1e-9
    )
    r = interior_fd(s, "lerp-k4", up, (1, 2), eps=1e-3)
    assert r.autograd == pytest.approx(-6.0, rel=1e-12) and r.finite_difference == pytest.approx(
        -6.0, rel=1e-9
    )
