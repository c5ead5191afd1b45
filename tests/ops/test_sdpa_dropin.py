"""kinterval_attention as a drop-in for F.scaled_dot_product_attention: SDPA's keywords (attn_mask, dropout_p,
is_causal, scale, enable_gqa), float masks, numpy scalars, meta tensors and torch.compile; every check against
float64 SDPA or an explicit computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kinterval.ops import attention_probs, kinterval_attention
from triton_gate import needs_kernels

KINTERVAL_OPS = ["lerp-k4", "minmax-weight-k4", "fwm-prob-k4"]
BACKENDS = ["reference", "closed_form"]


def _qkv(B=2, H=4, H_kv=2, Tq=6, Tk=6, D=8, Dv=8, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_()

    return r(B, H, Tq, D), r(B, H_kv, Tk, D), r(B, H_kv, Tk, Dv)


def _out_and_grads(f, q, k, v):
    """f(q, k, v) and (dq, dk, dv) for a fixed random upstream gradient."""
    out = f(q, k, v)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    up = up.to(out.device, out.dtype)  # the same draw whatever the dtype
    return (out, *torch.autograd.grad(out, (q, k, v), up))


def _assert_all_close(got, want, atol):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("Tq, Tk", [(6, 6), (4, 7), (7, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_softmax_takes_sdpa_keywords_and_matches_sdpa(backend, Tq, Tk, is_causal):
    """enable_gqa (k/v with fewer heads), is_causal (SDPA's top-left alignment, also for Tq != Tk), Dv != D:
    outputs and dq, dk, dv equal float64 SDPA's."""
    q, k, v = _qkv(Tq=Tq, Tk=Tk, Dv=5)
    kw = dict(enable_gqa=True, is_causal=is_causal)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, "softmax", backend=backend, **kw), q, k, v
    )
    want = _out_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    assert got[2].shape == k.shape and got[3].shape == v.shape  # gradients reach the H_kv heads
    _assert_all_close(got, want, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", KINTERVAL_OPS)
@pytest.mark.parametrize("causal", [False, True])
def test_enable_gqa_equals_explicitly_repeated_heads(backend, op, causal):
    """k/v head j serves q heads j*G .. (j+1)*G - 1 (repeat_interleave), gradients summed back onto it."""
    q, k, v = _qkv(Tq=5, Tk=7, H=6, H_kv=2)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, op, causal=causal, backend=backend, enable_gqa=True),
        q,
        k,
        v,
    )
    rep = [x.detach().repeat_interleave(3, dim=1).requires_grad_() for x in (k, v)]
    out, dq, dk, dv = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, op, causal=causal, backend=backend), q, *rep
    )
    fold = [d.unflatten(1, (2, 3)).sum(2) for d in (dk, dv)]  # each k/v head's three copies
    _assert_all_close(got, (out, dq, *fold), atol=1e-12)


@needs_kernels
@pytest.mark.parametrize("op", ["softmax", "fwm-prob-k4"])
def test_enable_gqa_in_the_fused_kernels(op):
    """The triton backend (its CPU interpreter without CUDA) gives what it gives on repeated k/v, and the
    float64 closed form's values to float32 rounding."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = _qkv(B=1, Tq=5, Tk=5, dtype=torch.float32, device=device)
    kw = dict(causal=True, precision="ieee")
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, op, backend="triton", enable_gqa=True, **kw), q, k, v
    )
    rep = _out_and_grads(
        lambda q, k, v: kinterval_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), op, backend="triton", **kw
        ),
        q,
        k,
        v,
    )
    _assert_all_close(got, rep, atol=1e-6)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, op, backend="closed_form", enable_gqa=True, causal=True),
        q64,
        k64,
        v64,
    )
    _assert_all_close([g.double() for g in got], want, atol=1e-5)


def test_head_counts_that_differ_need_enable_gqa_and_must_divide():
    q, k, v = _qkv(H=4, H_kv=2)
    with pytest.raises(ValueError, match="q has 4 heads and k, v have 2: pass enable_gqa=True"):
        kinterval_attention(q, k, v, "softmax")
    q3, k3, v3 = _qkv(H=4, H_kv=3)
    with pytest.raises(ValueError, match="multiple of k and v's 3"):
        kinterval_attention(q3, k3, v3, "softmax", enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa must be True or False"):
        kinterval_attention(q, k, v, "softmax", enable_gqa="yes")
    same = _qkv(H=2, H_kv=2)  # enable_gqa with equal head counts changes nothing, as in SDPA
    assert torch.equal(
        kinterval_attention(*same, "lerp-k4", enable_gqa=True), kinterval_attention(*same, "lerp-k4")
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_p_matches_sdpa_for_softmax(backend):
    """Same seed, same draw: SDPA's math path drops P before P v, as kinterval_attention does."""
    q, k, v = _qkv(H_kv=4)
    torch.manual_seed(3)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, "softmax", dropout_p=0.3, backend=backend), q, k, v
    )
    torch.manual_seed(3)
    want = _out_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3), q, k, v)
    _assert_all_close(got, want, atol=1e-12)
    plain = kinterval_attention(q, k, v, "softmax", backend=backend)
    assert (got[0] - plain).abs().max() > 0.1  # the dropout acted


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", KINTERVAL_OPS)
def test_dropout_p_drops_the_operators_probabilities_and_the_backward_sees_it(backend, op):
    """Against an explicit computation: P of the operator (attention_probs), F.dropout with the same seed,
    then P v; gradients through the dropped P."""
    q, k, v = _qkv(Tq=5, Tk=7, H_kv=4)
    torch.manual_seed(4)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, op, causal=True, dropout_p=0.25, backend=backend),
        q,
        k,
        v,
    )

    def explicit(q, k, v):
        P = attention_probs(q @ k.transpose(-2, -1) / 8**0.5, op, causal=True, backend="reference")
        return F.dropout(P, p=0.25) @ v

    torch.manual_seed(4)
    _assert_all_close(got, _out_and_grads(explicit, q, k, v), atol=1e-12)


def test_dropout_p_is_checked_and_refused_by_the_fused_kernels():
    q, k, v = _qkv(H_kv=4)
    for bad in (-0.1, 1.5, float("nan"), True, "0.1", None):
        with pytest.raises(ValueError, match="dropout_p must be a number in"):
            kinterval_attention(q, k, v, "softmax", dropout_p=bad)
    with pytest.raises(ValueError, match="dropout_p > 0 needs the probabilities P explicitly"):
        kinterval_attention(q, k, v, "softmax", dropout_p=0.1, backend="triton")
    assert torch.equal(
        kinterval_attention(q, k, v, "lerp-k4", dropout_p=np.float32(0)),
        kinterval_attention(q, k, v, "lerp-k4"),
    )


def test_float_masks_of_sdpa_kind_are_masks_and_biases():
    """SDPA adds a float attn_mask to the scores: 0 and -inf (or finfo.min) are a mask and give SDPA's
    result; any other value is an additive score bias, added to the scores as SDPA adds it."""
    q, k, v = _qkv(Tq=5, Tk=7, H_kv=4)
    fm = torch.zeros(2, 1, 5, 7, dtype=torch.float64)
    fm[0, :, :, :3] = float("-inf")
    fm[1, :, 2:, 5:] = torch.finfo(torch.float64).min
    want = _out_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=fm), q, k, v)
    for kw in (dict(attn_mask=fm), dict(mask=fm), dict(attn_mask=fm == 0)):
        got = _out_and_grads(lambda q, k, v, kw=kw: kinterval_attention(q, k, v, "softmax", **kw), q, k, v)
        _assert_all_close(got, want, atol=1e-12)
    lerp = kinterval_attention(q, k, v, "lerp-k4", attn_mask=fm)
    assert torch.equal(lerp, kinterval_attention(q, k, v, "lerp-k4", mask=fm == 0))
    biased = fm - torch.linspace(0, 2, 7, dtype=torch.float64)
    want = _out_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=biased), q, k, v)
    got = _out_and_grads(lambda q, k, v: kinterval_attention(q, k, v, "softmax", attn_mask=biased), q, k, v)
    _assert_all_close(got, want, atol=1e-12)
    assert not torch.equal(kinterval_attention(q, k, v, "lerp-k4", attn_mask=biased), lerp)
    with pytest.raises(ValueError, match=r"mask must be boolean or a float mask \(0/-inf, or an additive"):
        kinterval_attention(q, k, v, "softmax", mask=torch.ones(5, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="pass mask or attn_mask"):
        kinterval_attention(q, k, v, "softmax", mask=fm == 0, attn_mask=fm == 0)


def test_is_causal_is_sdpas_top_left_and_causal_is_bottom_right():
    q, k, v = _qkv(Tq=3, Tk=6, H_kv=4)
    key_pad = torch.tensor([True] * 5 + [False])
    got = kinterval_attention(q, k, v, "softmax", is_causal=True, attn_mask=key_pad)
    top_left = torch.ones(3, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=top_left & key_pad), rtol=0, atol=1e-12
    )
    bottom_right = kinterval_attention(q, k, v, "softmax", causal=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 6, dtype=torch.bool).tril(3))
    torch.testing.assert_close(bottom_right, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        kinterval_attention(q, k, v, "softmax", causal=True, is_causal=True)
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        kinterval_attention(q, k, v, "softmax", is_causal=1)
    with pytest.raises(ValueError, match="does not broadcast"):
        kinterval_attention(q, k, v, "softmax", is_causal=True, attn_mask=torch.ones(4, 6, dtype=torch.bool))


def _random_mask(shape, seed):
    """A boolean mask that keeps key 0 and drops about a third of the others (no row fully masked)."""
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.35
    m[..., 0] = True
    return m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("Tq, Tk", [(7, 4), (4, 7), (6, 6)])
@pytest.mark.parametrize("kind", ["bool", "-inf float32", "finfo.min float32", "finfo.min bfloat16"])
@pytest.mark.parametrize("per_head", [False, True])
def test_is_causal_with_a_mask_attends_the_keys_both_allow(backend, Tq, Tk, kind, per_head):
    """SDPA refuses is_causal with attn_mask; kinterval_attention takes both and attends the keys both allow:
    SDPA's output and gradients with the AND of the top-left causal mask and the mask, also under enable_gqa
    with a mask over q's heads or broadcast over them, and with a float mask of another dtype than q."""
    q, k, v = _qkv(Tq=Tq, Tk=Tk)
    m = _random_mask((2, 4 if per_head else 1, Tq, Tk), seed=Tq * 10 + Tk)
    if kind == "bool":
        mask = m
    else:
        dtype = torch.bfloat16 if "bfloat16" in kind else torch.float32
        blocked = float("-inf") if kind.startswith("-inf") else torch.finfo(dtype).min
        mask = torch.zeros(m.shape, dtype=dtype).masked_fill(~m, blocked)
    both = m & torch.ones(Tq, Tk, dtype=torch.bool).tril()
    kw = dict(enable_gqa=True)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(
            q, k, v, "softmax", backend=backend, is_causal=True, attn_mask=mask, **kw
        ),
        q,
        k,
        v,
    )
    want = _out_and_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=both, **kw), q, k, v
    )
    _assert_all_close(got, want, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_are_zero_as_sdpa_gives_for_a_boolean_or_minus_inf_mask(backend):
    """A query row with no key to attend (a boolean mask, -inf, or is_causal with a mask that drops every key
    the row may see) is a zero row with zero gradients, as SDPA's; a finfo.min float mask counts as masked,
    so its fully masked row is zero too, where SDPA (which adds finfo.min to every score) averages v."""
    q, k, v = _qkv(Tq=6, Tk=4, H_kv=4)
    m = torch.ones(2, 1, 6, 4, dtype=torch.bool)
    m[0, :, 2] = False  # row 2 of batch 0 masks every key
    m[1, :, :, 0] = False  # is_causal: row 0 sees key 0 only, which this drops
    top_left = torch.ones(6, 4, dtype=torch.bool).tril()
    want = _out_and_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m & top_left), q, k, v
    )
    assert not want[0][0, :, 2].any() and not want[0][1, :, 0].any()  # SDPA's fully masked rows are zeros
    for mask in (m, torch.zeros(m.shape).masked_fill(~m, float("-inf"))):
        got = _out_and_grads(
            lambda q, k, v, mask=mask: kinterval_attention(
                q, k, v, "softmax", backend=backend, is_causal=True, attn_mask=mask
            ),
            q,
            k,
            v,
        )
        _assert_all_close(got, want, atol=1e-12)
    finfo_mask = torch.zeros(m.shape).masked_fill(~m, torch.finfo(torch.float32).min)
    got = kinterval_attention(q, k, v, "softmax", backend=backend, is_causal=True, attn_mask=finfo_mask)
    torch.testing.assert_close(got, want[0], rtol=0, atol=1e-12)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=finfo_mask.double())
    torch.testing.assert_close(sdpa[0, :, 2], v[0].mean(1), rtol=0, atol=1e-12)  # SDPA: the mean of v


def test_dropout_asks_auto_for_a_backend_that_forms_the_probabilities(monkeypatch):
    """On CUDA "auto" would take the fused kernels, which have no dropout: dropout_p > 0 must ask
    resolve_backend for a backend that forms P (and dropout_p = 0 must not)."""
    import kinterval.ops.api as api

    asked = []

    def spy(*args, probs=False, **kwargs):
        asked.append(probs)
        return "closed_form"

    monkeypatch.setattr(api, "resolve_backend", spy)
    q, k, v = _qkv(H_kv=4)
    kinterval_attention(q, k, v, "softmax", dropout_p=0.25)
    kinterval_attention(q, k, v, "softmax", dropout_p=0.0)
    assert asked == [True, False]


@needs_kernels
@pytest.mark.parametrize("Tq, Tk", [(3, 5), (5, 3)])
def test_is_causal_with_a_mask_in_the_fused_kernels(Tq, Tk):
    """The triton backend (its CPU interpreter without CUDA) gets is_causal with Tq != Tk as an explicit
    top-left mask ANDed with the caller's: the float64 closed form's values to float32 rounding."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = _qkv(B=1, H=2, H_kv=1, Tq=Tq, Tk=Tk, D=16, Dv=16, dtype=torch.float32, device=device)
    m = torch.ones(1, 2, Tq, Tk, dtype=torch.bool, device=device)
    m[0, 1, :, 0] = False
    m[0, 1, 0, 1] = True
    kw = dict(is_causal=True, attn_mask=m, enable_gqa=True)
    got = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, "fwm-prob-k4", backend="triton", precision="ieee", **kw),
        q,
        k,
        v,
    )
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = _out_and_grads(
        lambda q, k, v: kinterval_attention(q, k, v, "fwm-prob-k4", backend="closed_form", **kw),
        q64,
        k64,
        v64,
    )
    _assert_all_close([g.double() for g in got], want, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_bools_and_scalars_act_as_python_ones(backend):
    """``causal=np.True_`` (as numpy code computes it) was refused as not a bool."""
    q, k, v = _qkv(Tq=4, Tk=6)
    want = kinterval_attention(
        q, k, v, "fwm-prob-k4", causal=True, scale=0.25, enable_gqa=True, backend=backend
    )
    got = kinterval_attention(
        q, k, v, "fwm-prob-k4", causal=np.True_, scale=np.float32(0.25), enable_gqa=np.True_, backend=backend
    )
    assert torch.equal(got, want)
    got = kinterval_attention(q, k, v, "fwm-prob-k4", is_causal=np.False_, enable_gqa=True, backend=backend)
    assert torch.equal(got, kinterval_attention(q, k, v, "fwm-prob-k4", enable_gqa=True, backend=backend))


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("op", ["softmax", "lerp-k4", "fwm-prob-k4"])
def test_meta_tensors_propagate_shapes(backend, op):
    """Meta tensors (a model built under torch.device("meta")) failed in torch.autocast with "unsupported
    scalarType"; now the output and the gradients have SDPA's shapes and dtypes."""
    q, k, v = (x.detach().to("meta").requires_grad_() for x in _qkv(Tq=5, Tk=7, Dv=3, dtype=torch.float32))
    kw = dict(enable_gqa=True, is_causal=True, dropout_p=0.1)
    out = kinterval_attention(q, k, v, op, backend=backend, attn_mask=torch.ones(7, dtype=torch.bool), **kw)
    want = F.scaled_dot_product_attention(q, k, v, **kw)  # SDPA takes no attn_mask with is_causal
    assert (out.device.type, out.shape, out.dtype) == ("meta", want.shape, want.dtype)
    out.sum().backward()
    assert [x.grad.shape for x in (q, k, v)] == [q.shape, k.shape, v.shape]
    with pytest.raises(
        ValueError, match="attn_mask is on meta and q on cpu"
    ):  # not "Cannot copy out of meta"
        kinterval_attention(
            *_qkv(Tq=5, Tk=7), op, attn_mask=torch.ones(7, dtype=torch.bool, device="meta"), enable_gqa=True
        )


@pytest.mark.parametrize("kind", ["bool", "-inf", "bias"])
def test_fake_tensors_and_export_trace_every_kind_of_mask(kind):
    """A float attn_mask (even SDPA's 0/-inf) raised DataDependentOutputException under FakeTensorMode and
    torch.export: split_mask read its values to drop an all-zero bias."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv(Tq=3, Tk=5, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    drop = torch.rand(3, 5, generator=gen) > 0.5
    drop[:, 0] = False  # every row keeps a key
    mask = {"bool": ~drop, "-inf": torch.zeros(3, 5).masked_fill(drop, float("-inf")),
            "bias": torch.randn(3, 5, generator=gen)}[kind]  # fmt: skip
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        out = kinterval_attention(*(fake.from_tensor(x) for x in (q, k, v)), "fwm-prob-k4",
                                  attn_mask=fake.from_tensor(mask), enable_gqa=True)  # fmt: skip
    assert out.shape == q.shape

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, m):
            return kinterval_attention(
                q, k, v, "fwm-prob-k4", attn_mask=m, backend="closed_form", enable_gqa=True
            )

    exported = torch.export.export(Attend(), (q, k, v, mask))
    want = kinterval_attention(q, k, v, "fwm-prob-k4", attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(exported.module()(q, k, v, mask), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_traces_and_matches_eager(backend):
    """torch.compile (aot_eager: the tracing and autograd of inductor, without its C++ compile) gives the
    eager values and gradients."""
    q, k, v = _qkv(Tq=5, Tk=5, dtype=torch.float32)

    def f(q, k, v):
        return kinterval_attention(q, k, v, "fwm-prob-k4", backend=backend, is_causal=True, enable_gqa=True)

    torch._dynamo.reset()
    got = _out_and_grads(torch.compile(f, backend="aot_eager"), q, k, v)
    _assert_all_close(got, _out_and_grads(f, q, k, v), atol=1e-6)
