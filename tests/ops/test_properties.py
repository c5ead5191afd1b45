"""Hypothesis property tests over random shapes, masks and scales."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kinterval.ops import OperatorSpec, attention_probs
from kinterval.ops.catalog import FAMILY_FORMS

forms = st.sampled_from(list(FAMILY_FORMS) + ["softmax", "bf16-exp", "fp8-exp"])


@st.composite
def cases(draw):
    form = draw(forms)
    K = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64]))
    spec = OperatorSpec.parse(form.format(K=K))
    if spec.is_kinterval:
        spec = OperatorSpec.parse(
            form.format(K=K), range_grad=draw(st.sampled_from(["full", "detach", "p1"]))
        )
    Tq = draw(st.integers(1, 9))
    Tk = draw(st.integers(Tq, 12))
    scale = draw(st.sampled_from([0.1, 1.0, 6.0, 25.0, 100.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    causal = draw(st.booleans())
    use_mask = draw(st.booleans())
    return spec, Tq, Tk, scale, seed, causal, use_mask


@settings(max_examples=120, deadline=None)
@given(cases())
def test_probabilities_and_gradients_are_well_formed(case):
    spec, Tq, Tk, scale, seed, causal, use_mask = case
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, Tq, Tk, generator=g, dtype=torch.float64) * scale
    mask = (torch.rand(2, Tq, Tk, generator=g) > 0.4) if use_mask else None
    up = torch.randn(s.shape, generator=g, dtype=torch.float64)
    res = {}
    for backend in ("reference", "closed_form"):
        x = s.clone().requires_grad_()
        P = attention_probs(x, spec, causal=causal, mask=mask, backend=backend)
        (P * up).sum().backward()
        res[backend] = (P.detach(), x.grad)
    P, grad = res["reference"]
    assert torch.equal(P, res["closed_form"][0])
    assert torch.isfinite(P).all() and torch.isfinite(grad).all()
    assert (P >= 0).all()
    valid = torch.ones_like(P, dtype=torch.bool)
    if causal:
        valid = valid & torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=Tk - Tq)
    if mask is not None:
        valid = valid & mask
    nonempty = valid.any(-1)
    torch.testing.assert_close(P.sum(-1), nonempty.to(P.dtype), rtol=0, atol=1e-12)
    assert (P[~valid] == 0).all() and (grad[~valid] == 0).all()
    torch.testing.assert_close(
        res["closed_form"][1], grad, rtol=1e-9, atol=1e-12 * max(1.0, grad.abs().max().item())
    )
    if spec.range_grad in ("full", "p1"):  # zero-sum rows (shift invariance)
        assert (grad.sum(-1).abs() <= 1e-9 * grad.abs().sum(-1).clamp(min=1e-30) + 1e-15).all()
