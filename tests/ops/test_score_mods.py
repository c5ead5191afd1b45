"""Score modifications in kinterval_attention: an additive bias (SDPA's float attn_mask: ALiBi, T5's position
bias), a softcap (Gemma 2) and attention sinks (gpt-oss). The operator runs on the modified score row
s = c tanh(scale q k^T / c) + bias, with one sink logit per q head appended as a key without a value.

Every backend that applies them is held, in float64, against autograd of a direct composition: the scores
modified by hand, then the reference operator on them (``attention_probs``), then P v. Softmax is also held
against transformers' eager formulas, written out here."""

from __future__ import annotations

import pytest
import torch

from kinterval.model.config import SOFTCAP_MIN as ModelConfig_SOFTCAP_MIN
from kinterval.ops import attention_probs, catalog, kinterval_attention, resolve_backend
from kinterval.ops.api import SOFTCAP_MIN, split_mask

SPECS = [s.full_name for s in catalog.all_specs(range_grads=("full", "detach"))]
B, H, H_KV, T, D = 2, 4, 2, 7, 8


def _inputs(seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=1.0):
        return (s * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    q, k, v = r(B, H, T, D, s=scale), r(B, H_KV, T, D, s=scale), r(B, H_KV, T, D)
    bias = r(1, H, T, T)
    sinks = r(H, s=2.0)
    return q, k, v, bias, sinks


def _direct(q, k, v, spec, bias, softcap, sinks, causal=True):
    """The modifications written out, then the reference operator (autograd of the direct formulas)."""
    k, v = k.repeat_interleave(H // H_KV, 1), v.repeat_interleave(H // H_KV, 1)
    s = q @ k.transpose(-2, -1) / D**0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if sinks is None:
        P = attention_probs(s, spec, causal=causal, backend="reference")
        return P @ v
    row = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, T, 1)], -1)
    visible = torch.ones(T, T + 1, dtype=torch.bool).tril()  # causal over the keys; the sink always
    visible[:, -1] = True
    P = attention_probs(row, spec, mask=visible if causal else None, backend="reference")
    return P[..., :-1] @ v


def _grads(out, inputs):
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    return (out, *torch.autograd.grad(out, inputs, up))


@pytest.mark.parametrize("backend", ["closed_form", "reference"])
@pytest.mark.parametrize("spec", SPECS)
def test_every_operator_runs_on_the_modified_row(spec, backend):
    q, k, v, bias, sinks = _inputs(scale=1.5)
    inputs = (q, k, v, bias, sinks)
    want = _grads(_direct(q, k, v, spec, bias, 2.5, sinks), inputs)
    got = kinterval_attention(
        q, k, v, spec, attn_mask=bias, softcap=2.5, sinks=sinks, causal=True, enable_gqa=True, backend=backend
    )
    for name, a, b in zip(
        ("out", "dq", "dk", "dv", "dbias", "dsinks"), _grads(got, inputs), want, strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    "mods", [dict(bias=True), dict(softcap=0.8), dict(sinks=True), dict(bias=True, softcap=0.8, sinks=True)]
)
def test_each_modification_alone(mods):
    q, k, v, bias, sinks = _inputs(scale=1.5)
    bias, sinks = (bias if mods.get("bias") else None), (sinks if mods.get("sinks") else None)
    softcap = mods.get("softcap")
    inputs = tuple(x for x in (q, k, v, bias, sinks) if x is not None)
    for spec in ("minmax-weight-k4", "fwm-prob-k4", "lerp-k4"):
        want = _grads(_direct(q, k, v, spec, bias, softcap, sinks), inputs)
        got = kinterval_attention(
            q, k, v, spec, attn_mask=bias, softcap=softcap, sinks=sinks, causal=True, enable_gqa=True
        )
        for a, b in zip(_grads(got, inputs), want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        plain = kinterval_attention(q, k, v, spec, causal=True, enable_gqa=True)
        assert not torch.allclose(got, plain, atol=1e-3)  # each one changes the result


def test_softmax_matches_transformers_eager_formulas():
    """Gemma 2's eager attention (softcap, then the additive mask) and gpt-oss's (sinks appended to the row,
    their column dropped), written out independently of the direct composition above."""
    q, k, v, bias, sinks = _inputs(scale=1.5)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    causal = torch.zeros(T, T, dtype=torch.float64).masked_fill(
        ~torch.ones(T, T).bool().tril(), float("-inf")
    )
    w = q @ kr.transpose(-2, -1) / D**0.5
    gemma = torch.softmax(torch.tanh(w / 0.7) * 0.7 + causal, -1) @ vr
    got = kinterval_attention(q, k, v, "softmax", softcap=0.7, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, gemma, rtol=0, atol=1e-14)
    logits = torch.cat([w + causal + bias, sinks.view(1, H, 1, 1).expand(B, H, T, 1)], -1)
    logits = logits - logits.max(-1, keepdim=True).values
    oss = torch.softmax(logits, -1)[..., :-1] @ vr
    got = kinterval_attention(
        q, k, v, "softmax", attn_mask=bias, sinks=sinks, is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(got, oss, rtol=0, atol=1e-14)
    up = torch.randn(got.shape, dtype=torch.float64)
    for a, b in zip(
        torch.autograd.grad(got, (q, bias, sinks), up), torch.autograd.grad(oss, (q, bias, sinks), up)
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_the_sink_takes_part_in_the_calibration():
    """A sink far above every score takes MinMax's top bucket: the row's keys share the lower buckets, and
    their probabilities sum to what the sink leaves. A sink of -inf is no sink."""
    q, k, v, _, _ = _inputs()
    high = torch.full((H,), 30.0, dtype=torch.float64)
    s = q @ k.repeat_interleave(2, 1).transpose(-2, -1) / D**0.5
    row = torch.cat([s, high.view(1, H, 1, 1).expand(B, H, T, 1)], -1)
    P = attention_probs(row, "minmax-weight-k4")
    assert torch.equal(attention_probs(s, "minmax-weight-k4", sinks=high.view(1, H, 1, 1)), P[..., :-1])
    assert torch.equal(attention_probs(s, "minmax-weight-k4", sinks=high), P[..., :-1])  # (H,): per head
    assert (P[..., :-1].sum(-1) < 1e-6).all()  # K = 4 buckets over a span of ~30: the keys sit far below
    none = torch.full((H,), float("-inf"), dtype=torch.float64)
    for spec in ("minmax-weight-k4", "fwm-prob-k4", "softmax"):
        torch.testing.assert_close(
            kinterval_attention(q, k, v, spec, sinks=none, causal=True, enable_gqa=True),
            kinterval_attention(q, k, v, spec, causal=True, enable_gqa=True),
            rtol=0,
            atol=1e-15,
        )


def test_edge_rows_with_modifications():
    """A row whose keys are all masked gives zeros (the sink, if any, holds everything); a non-finite bias
    or sink on an attended key makes its row NaN, never a quiet wrong row; attention_probs refuses them."""
    q, k, v, bias, sinks = _inputs()
    mask = torch.ones(T, T, dtype=torch.bool)
    mask[2] = False
    for kw in (dict(sinks=sinks), dict(attn_mask=bias.masked_fill(~mask, float("-inf"))), dict(softcap=1.0)):
        m = None if "attn_mask" in kw else mask
        out = kinterval_attention(q, k, v, "minmax-weight-k4", mask=m, enable_gqa=True, **kw)
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2])) and torch.isfinite(out).all()
    bad = bias.detach().clone()
    bad[0, 1, 3, 0] = float("inf")
    out = kinterval_attention(q, k, v, "fwm-prob-k4", attn_mask=bad, enable_gqa=True)
    assert out[:, 1, 3].isnan().all() and out[:, 1, :3].isfinite().all()
    nan_sinks = sinks.detach().clone()
    nan_sinks[2] = float("nan")
    out = kinterval_attention(q, k, v, "fwm-prob-k4", sinks=nan_sinks, enable_gqa=True)
    assert out[:, 2].isnan().all() and out[:, :2].isfinite().all()
    with pytest.raises(ValueError, match="sinks contain NaN or \\+inf"):
        attention_probs(torch.zeros(H, T, T), "softmax", sinks=nan_sinks.view(H, 1, 1))
    # an infinite q k^T stays a NaN row under a softcap, which would bound it
    qi = q.detach().clone()
    qi[0, 0, 1, 0] = float("inf")
    assert kinterval_attention(qi, k, v, "softmax", softcap=5.0, enable_gqa=True)[0, 0, 1].isnan().all()


def test_bad_arguments_are_value_errors():
    q, k, v, bias, sinks = _inputs()
    kw = dict(enable_gqa=True)
    for bad in (0, -1.0, float("inf"), float("nan"), True, "30"):
        with pytest.raises(ValueError, match="softcap must be a positive finite number"):
            kinterval_attention(q, k, v, "softmax", softcap=bad, **kw)
    # below float32's smallest normal 1/c overflows: NaN gradients in the kernels (the model checks it too)
    with pytest.raises(ValueError, match="softcap must be at least 1.18e-38"):
        kinterval_attention(q, k, v, "softmax", softcap=1e-40, **kw)
    assert SOFTCAP_MIN == ModelConfig_SOFTCAP_MIN == torch.finfo(torch.float32).tiny
    kinterval_attention(q, k, v, "softmax", softcap=SOFTCAP_MIN, **kw)
    for bad in (sinks[:2], sinks.view(1, H), sinks.long(), [0.0] * H):
        with pytest.raises(ValueError, match=r"sinks must be a floating tensor of shape \(4,\)"):
            kinterval_attention(q, k, v, "softmax", sinks=bad, **kw)
    with pytest.raises(
        ValueError, match=r"sinks must be a floating tensor \(float64/32, bfloat16, float16\)"
    ):
        kinterval_attention(q, k, v, "softmax", sinks=sinks.detach().to(torch.float8_e4m3fn), **kw)
    with pytest.raises(ValueError, match="sinks of shape"):
        attention_probs(torch.zeros(H, T, T), "softmax", sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="does not broadcast"):
        kinterval_attention(q, k, v, "softmax", attn_mask=torch.zeros(3, T), **kw)


@pytest.mark.usefixtures("triton_installed")
def test_backends_apply_them_or_say_why_not(monkeypatch):
    """The fused kernels apply every score modification (an additive bias, a softcap, attention sinks): auto
    picks them on CUDA for any of them (True: all three) and closed_form on the CPU; an explicit triton
    backend takes them. A float mask that only masks is not a bias."""
    from kinterval.ops import backends

    for spec in catalog.all_specs():
        want = "triton" if backends.TRITON.supports(spec, "cuda", torch.bfloat16) else "closed_form"
        for mods in (True, "bias", ("bias", "sinks"), ("softcap", "bias"), "sinks", "softcap", ()):
            assert resolve_backend(spec, "cuda", torch.bfloat16, score_mod=mods) == want
            assert resolve_backend(spec, "cpu", torch.float32, score_mod=mods) == "closed_form"
    for mods in (True, "bias", ("softcap", "sinks")):
        got = resolve_backend("fwm-prob-k4", "cuda", torch.bfloat16, backend="triton", score_mod=mods)
        assert got == "triton"
    with pytest.raises(ValueError, match="unknown score modification 'alibi'"):
        resolve_backend("fwm-prob-k4", "cuda", score_mod=("sinks", "alibi"))
    fm = torch.zeros(T, T).masked_fill(~torch.ones(T, T).bool().tril(), torch.finfo(torch.float32).min)
    valid, bias = split_mask(fm)
    assert bias is None and torch.equal(valid, torch.ones(T, T).bool().tril())
    valid, bias = split_mask(fm + 0.25 * torch.ones(T, T).tril())
    assert torch.equal(valid, torch.ones(T, T).bool().tril()) and torch.equal(
        bias, 0.25 * torch.ones(T, T).tril()
    )


def test_a_mask_written_as_a_large_negative_number_is_a_bias_with_a_warning():
    """-1e9 (or -1e4, or fp16's lowest in an fp32 mask) is added to the scores, as SDPA adds it: softmax gives
    those keys ~0 weight, silently as SDPA. A K-interval operator's calibration sees them instead (MinMax's m
    spans the row), unlike masking: that call warns, and -inf / a boolean mask gives the masked one."""
    import warnings

    q, k, v, _, _ = _inputs()
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    for low in (-1e9, -1e4, float(torch.finfo(torch.float16).min)):
        fm = torch.zeros(T, T, dtype=torch.float64).masked_fill(~keep, low)
        with pytest.warns(
            UserWarning, match="additive bias as low as .* minmax-weight-k4's calibration sees it"
        ):
            got = kinterval_attention(q, k, v, "minmax-weight-k4", attn_mask=fm, enable_gqa=True)
        masked = kinterval_attention(q, k, v, "minmax-weight-k4", attn_mask=keep, enable_gqa=True)
        assert not torch.allclose(got, masked, atol=1e-2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            soft = kinterval_attention(q, k, v, "softmax", attn_mask=fm, enable_gqa=True)
            torch.testing.assert_close(
                soft, kinterval_attention(q, k, v, "softmax", attn_mask=keep, enable_gqa=True)
            )
            inf = torch.zeros(T, T, dtype=torch.float64).masked_fill(~keep, float("-inf"))
            torch.testing.assert_close(
                kinterval_attention(q, k, v, "minmax-weight-k4", attn_mask=inf, enable_gqa=True), masked
            )
            quiet = fm * 1e-6  # above -1e4: a bias, no warning
            kinterval_attention(q, k, v, "minmax-weight-k4", attn_mask=quiet, enable_gqa=True)


def test_a_zero_bias_that_requires_grad_gets_its_gradient():
    """A float attn_mask that is all zeros (a learned bias initialised to zero, T5's zero position bias
    under gradient checkpointing) was taken for a mask that only masks and dropped: its gradient was None
    (SDPA's is not), so a zero-initialised learned bias never trained, also on meta tensors. A mask that
    requires a gradient now stays a bias, with SDPA's gradient; without one, zeros still only mask."""
    q, k, v, _, _ = _inputs()
    k, v = k.repeat_interleave(H // H_KV, 1), v.repeat_interleave(H // H_KV, 1)
    up = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    bias = torch.zeros(1, H, T, T, dtype=torch.float64, requires_grad=True)
    bias.detach()[..., 0] = float("-inf")  # a masked key keeps a zero gradient
    out = kinterval_attention(q, k, v, "softmax", attn_mask=bias)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-14)
    (got,) = torch.autograd.grad(out, bias, up)
    (want,) = torch.autograd.grad(ref, bias, up)
    assert got.abs().sum() > 0 and (got[..., 0] == 0).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    meta = [torch.empty(B, H, T, D, device="meta") for _ in range(3)]
    mb = torch.zeros(1, H, T, T, device="meta", requires_grad=True)
    (g,) = torch.autograd.grad(kinterval_attention(*meta, "softmax", attn_mask=mb).sum(), mb)
    assert g.shape == mb.shape
    assert split_mask(torch.zeros(T, T))[1] is None
    with torch.no_grad():
        assert split_mask(torch.zeros(T, T, requires_grad=True))[1] is None


@pytest.mark.usefixtures("triton_installed")
def test_a_backend_without_a_modification_is_passed_over_or_named(monkeypatch):
    """Every backend applies every modification today; the dispatcher still holds one that lacks some (a
    new backend) to them: auto passes it over for a call that needs one (True: all three; False, or the
    ones it has: it may run), and an explicit choice names what it lacks and who can."""
    from dataclasses import replace

    from kinterval.ops import backends

    lacking = replace(backends.TRITON, score_mods=frozenset({"bias", "softcap"}))
    monkeypatch.setitem(backends.REGISTRY, "triton", lacking)
    on = ("fwm-prob-k4", "cuda", torch.bfloat16)
    for mods, want in (
        (False, "triton"), ((), "triton"), (("bias", "softcap"), "triton"), ("softcap", "triton"),
        ("sinks", "closed_form"), (("bias", "sinks"), "closed_form"), (True, "closed_form"),
    ):  # fmt: skip
        assert resolve_backend(*on, score_mod=mods) == want, mods
    with pytest.raises(
        ValueError,
        match=r"backend 'triton' cannot run operator fwm-prob-k4 on cuda, torch.bfloat16: it applies no "
        r"attention sinks; backend 'closed_form' can",
    ):
        resolve_backend(*on, backend="triton", score_mod=("sinks", "bias"))
