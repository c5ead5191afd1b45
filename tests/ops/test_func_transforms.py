"""torch.func transforms (grad, vjp, vmap, jacrev; jvp, jacfwd on the reference) agree with plain autograd.

The library's autograd.Functions (closed_form's backward, P1's projection, the rounding clamp of t and the
first-order guard) use the ``setup_context`` form with a generated vmap rule, so torch.func can transform
them; the reference's two also define jvp (forward mode), closed_form's raises a clear error. Every
comparison is against the same call differentiated or looped by plain autograd, in float64, on causal rows
(the first one has a single key: MinMax's degenerate branch) and on a boolean mask with a fully masked row.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention
from kinterval.ops.closed_form import closed_form_probs
from kinterval.ops.reference import reference_probs

SPECS = [
    OperatorSpec.parse("softmax"),
    OperatorSpec.parse("minmax-weight-k4"),
    OperatorSpec.parse("fwm-prob-k4"),
    OperatorSpec.parse("lerp-k16"),
    OperatorSpec.parse("minmax-prob-k4", arithmetic="historical"),
    OperatorSpec.parse("resolved-weight-k4", arithmetic="historical"),
    OperatorSpec.parse("lerp-k4", range_grad="detach"),
    OperatorSpec.parse("fwm-weight-k4", range_grad="p1"),
    OperatorSpec.parse("minmax-prob-k4", range_grad="p1"),
]
IDS = [s.full_name for s in SPECS]
BACKENDS = ("closed_form", "reference")
B, H, T, D = 2, 2, 5, 4
TOL = dict(rtol=0, atol=1e-12)


def _inputs(seed: int = 0, shape=(B, H, T, D)):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(4))
    return q, k, v, do


def _mask(seed: int = 1, b: int = B, t: int = T) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, 1, t, t, generator=g) < 0.7
    mask[0, 0, 2] = False  # a fully masked row: zero output, zero gradient
    return mask


MASKINGS = {"causal": dict(causal=True), "mask": dict(mask=_mask())}


def _attention(spec, backend, masking):
    kw = MASKINGS[masking]
    return lambda q, k, v: kinterval_attention(q, k, v, spec, backend=backend, **kw)


def _autograd_grads(fn, q, k, v, do):
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    out = fn(qq, kk, vv)
    return out.detach(), torch.autograd.grad(out, (qq, kk, vv), do)


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_grad_and_vjp_match_autograd(spec, backend, masking):
    fn = _attention(spec, backend, masking)
    q, k, v, do = _inputs()
    out, expected = _autograd_grads(fn, q, k, v, do)
    assert all(e.abs().sum() > 0 for e in expected)  # a gradient that is there to be compared

    got = grad(lambda q, k, v: (fn(q, k, v) * do).sum(), argnums=(0, 1, 2))(q, k, v)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **TOL)

    out_f, vjp_fn = vjp(fn, q, k, v)
    torch.testing.assert_close(out_f, out, rtol=0, atol=0)
    for g, e in zip(vjp_fn(do), expected, strict=True):
        torch.testing.assert_close(g, e, **TOL)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_closed_form_grad_under_torch_func_matches_the_reference(spec):
    """The two backends agree under torch.func too (a context set up wrong would show here: the comparison
    against autograd above runs the same setup_context)."""
    q, k, v, do = _inputs(seed=3)
    grads = {
        b: grad(lambda q, k, v, b=b: (_attention(spec, b, "causal")(q, k, v) * do).sum(), argnums=(0, 1, 2))(
            q, k, v
        )
        for b in BACKENDS
    }
    for g, e in zip(grads["closed_form"], grads["reference"], strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_vmap_and_per_sample_grads_match_a_loop(spec, backend, masking):
    """vmap over the batch (one sample of shape (H, T, D) per call) equals a loop of calls; vmap(grad) gives
    the per-sample gradients of the looped autograd calls."""
    q, k, v, do = _inputs(seed=5)
    causal = masking == "causal"
    mask = None if causal else _mask(seed=6)

    def one(q, k, v, m):  # one sample
        kw = dict(causal=True) if causal else dict(mask=m[None])
        return kinterval_attention(q[None], k[None], v[None], spec, backend=backend, **kw)[0]

    m = torch.zeros(B, 1, T, T, dtype=torch.bool) if causal else mask
    looped = [
        _autograd_grads(lambda a, b, c, i=i: one(a, b, c, m[i]), q[i], k[i], v[i], do[i]) for i in range(B)
    ]

    torch.testing.assert_close(vmap(one)(q, k, v, m), torch.stack([o for o, _ in looped]), **TOL)

    def loss(q, k, v, m, do):
        return (one(q, k, v, m) * do).sum()

    per_sample = vmap(grad(loss, argnums=(0, 1, 2)))(q, k, v, m, do)
    for j in range(3):
        torch.testing.assert_close(per_sample[j], torch.stack([gs[j] for _, gs in looped]), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_vmap_over_the_probability_functions(spec, backend):
    """The probability functions of both backends batch under vmap (``attention_probs`` itself does not: its
    input checks branch on the data in Python)."""
    probs = closed_form_probs if backend == "closed_form" else reference_probs
    g = torch.Generator().manual_seed(7)
    s = torch.randn(3, 2, T, T, generator=g, dtype=torch.float64)
    valid = _mask(seed=8, b=3)[:, 0:1].expand(3, 2, T, T)
    upstream = torch.randn(s.shape, generator=g, dtype=torch.float64)

    torch.testing.assert_close(
        vmap(probs, in_dims=(0, 0, None))(s, valid, spec),
        torch.stack([probs(s[i], valid[i], spec) for i in range(3)]),
        **TOL,
    )
    per_row = vmap(grad(lambda s, valid, u: (probs(s, valid, spec) * u).sum()))(s, valid, upstream)
    looped = []
    for i in range(3):
        si = s[i].clone().requires_grad_()
        looped.append(torch.autograd.grad((probs(si, valid[i], spec) * upstream[i]).sum(), si)[0])
    torch.testing.assert_close(per_row, torch.stack(looped), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_grad_of_attention_probs_matches_autograd(spec, backend):
    g = torch.Generator().manual_seed(9)
    s = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    upstream = torch.randn(s.shape, generator=g, dtype=torch.float64)

    def loss(s):
        return (attention_probs(s, spec, causal=True, backend=backend) * upstream).sum()

    ss = s.clone().requires_grad_()
    (expected,) = torch.autograd.grad(loss(ss), ss)
    torch.testing.assert_close(grad(loss)(s), expected, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_jacrev_matches_the_autograd_jacobian(spec, backend):
    q, k, v, _ = _inputs(seed=11, shape=(1, 1, 3, 2))
    fn = _attention(spec, backend, "causal")
    got = jacrev(fn, argnums=(0, 1))(q, k, v)

    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    out = fn(qq, kk, v)
    rows = [torch.autograd.grad(o, (qq, kk), retain_graph=True) for o in out.flatten()]
    for j, x in enumerate((q, k)):
        expected = torch.stack([r[j] for r in rows]).reshape(*out.shape, *x.shape)
        torch.testing.assert_close(got[j], expected, **TOL)

    if backend == "closed_form":  # its derivative is a reverse-mode backward only
        with pytest.raises(NotImplementedError, match="closed_form.*forward mode"):
            jacfwd(fn)(q, k, v)
        return
    # forward mode (jacfwd, jvp): the reference's Functions define jvp; the same Jacobian to rounding
    expected = torch.stack([r[0] for r in rows]).reshape(*out.shape, *q.shape)
    torch.testing.assert_close(jacfwd(fn)(q, k, v), expected, rtol=1e-12, atol=1e-14)
    tangent = torch.randn(q.shape, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    out_f, out_t = jvp(lambda q: fn(q, k, v), (q,), (tangent,))
    torch.testing.assert_close(out_f, out, rtol=0, atol=0)
    jt = expected.reshape(out.numel(), q.numel()) @ tangent.flatten()
    torch.testing.assert_close(out_t, jt.reshape(out.shape), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_second_derivatives_through_closed_form_raise_under_torch_func(spec):
    """closed_form's gradient is first order only: grad(grad), jacrev(jacrev) and jacrev(grad) raise its
    RuntimeError, as double backward does with autograd; the reference differentiates twice and agrees
    with autograd's second derivative."""
    q, k, v, do = _inputs(seed=13, shape=(1, 1, 3, 2))

    def first(backend):
        fn = _attention(spec, backend, "causal")
        return lambda q, k: grad(lambda q, k: (fn(q, k, v) * do).sum(), argnums=0)(q, k)

    for second in (
        lambda f: grad(lambda q, k: f(q, k).square().sum(), argnums=1)(q, k),
        lambda f: grad(lambda q, k: f(q, k).square().sum())(q, k),
        lambda f: jacrev(f, argnums=(0, 1))(q, k),
    ):
        with pytest.raises(RuntimeError, match="closed_form.*first order only"):
            second(first("closed_form"))
    fn = _attention(spec, "closed_form", "causal")
    with pytest.raises(NotImplementedError, match="closed_form.*forward mode"):  # hessian = jacfwd(jacrev)
        hessian(lambda q: (fn(q, k, v) * do).sum())(q)

    got = grad(lambda q, k: first("reference")(q, k).square().sum(), argnums=1)(q, k)
    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    out = _attention(spec, "reference", "causal")(qq, kk, v)
    (gq,) = torch.autograd.grad((out * do).sum(), qq, create_graph=True)
    (expected,) = torch.autograd.grad(gq.square().sum(), kk, retain_graph=True)
    torch.testing.assert_close(got, expected, **TOL)

    fn = _attention(spec, "reference", "causal")
    rows = [torch.autograd.grad(x, qq, retain_graph=True)[0] for x in gq.flatten()]
    torch.testing.assert_close(
        hessian(lambda q: (fn(q, k, v) * do).sum())(q),
        torch.stack(rows).reshape(*q.shape, *q.shape),
        rtol=1e-12,
        atol=1e-14,
    )


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_forward_mode_ad_of_the_reference(spec):
    """torch.autograd.forward_ad (dual numbers) through the reference gives J t (the Jacobian built by
    reverse mode); closed_form raises its forward-mode error."""
    g = torch.Generator().manual_seed(19)
    s, t = (torch.randn(2, 5, generator=g, dtype=torch.float64) for _ in range(2))
    ss = s.clone().requires_grad_()
    P = attention_probs(ss, spec)
    J = torch.stack([torch.autograd.grad(p, ss, retain_graph=True)[0] for p in P.flatten()]).reshape(10, 10)
    with fwAD.dual_level():
        primal, tangent = fwAD.unpack_dual(attention_probs(fwAD.make_dual(s, t), spec))
        with pytest.raises(NotImplementedError, match="closed_form.*forward mode"):
            attention_probs(fwAD.make_dual(s, t), spec, backend="closed_form")
    torch.testing.assert_close(primal, P.detach(), rtol=0, atol=0)
    torch.testing.assert_close(tangent, (J @ t.flatten()).reshape(2, 5), rtol=1e-12, atol=1e-14)


def test_second_derivative_check_also_raises_in_a_jacrev_of_jacrev():
    """jacrev(jacrev) differentiates the vmapped backward: the guard still fires (not a silent zero)."""
    q, k, v, _ = _inputs(seed=17, shape=(1, 1, 3, 2))
    fn = _attention(SPECS[1], "closed_form", "causal")
    with pytest.raises(RuntimeError, match="first order only"):
        jacrev(jacrev(fn, argnums=1), argnums=1)(q, k, v)
