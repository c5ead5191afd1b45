"""kinterval_attention: SDPA-compatible semantics, backends agree, masks and causal alignment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention


def _qkv(B=2, H=3, Tq=7, Tk=7, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype) * 1.5 for T in (Tq, Tk, Tk)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_matches_sdpa(causal, dtype):
    q, k, v = _qkv(dtype=dtype)
    out = kinterval_attention(q, k, v, "softmax", causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    mask = torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # SDPA returns NaN on fully masked rows
    out = kinterval_attention(q, k, v, "softmax", mask=mask, scale=0.3)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_causal_aligns_last_query_with_last_key():
    q, k, v = _qkv(Tq=3, Tk=6)
    out = kinterval_attention(q, k, v, "lerp-k4", causal=True)
    s = q @ k.transpose(-2, -1) / 8**0.5
    mask = torch.ones(3, 6, dtype=torch.bool).tril(diagonal=3)
    torch.testing.assert_close(out, attention_probs(s, "lerp-k4", mask=mask) @ v)
    assert mask[0].sum() == 4 and mask[-1].all()


@pytest.mark.parametrize("op", ["lerp-k4", "minmax-weight-k4", "fwm-prob-k4", "resolved-weight-k8"])
@pytest.mark.parametrize("rg", ["full", "detach", "p1"])
def test_closed_form_backend_matches_reference_for_qkv(op, rg):
    spec = OperatorSpec.parse(op, range_grad=rg)
    grads = {}
    for backend in ("reference", "closed_form"):
        q, k, v = (x.requires_grad_() for x in _qkv(Tq=9, Tk=9, seed=3))
        out = kinterval_attention(q, k, v, spec, causal=True, backend=backend)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[backend] = (out.detach(), q.grad, k.grad, v.grad)
    for a, b in zip(grads["reference"], grads["closed_form"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_low_precision_inputs_run_operator_in_float32():
    q, k, v = _qkv(dtype=torch.float32)
    out = kinterval_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), "fwm-weight-k4", causal=True)
    assert out.dtype == torch.bfloat16
    ref = kinterval_attention(
        q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), "fwm-weight-k4", causal=True
    )
    torch.testing.assert_close(out, ref.bfloat16())


def test_autocast_does_not_reach_the_operator():
    q, k, v = _qkv(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = kinterval_attention(q, k, v, "minmax-prob-k4", causal=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, kinterval_attention(q, k, v, "minmax-prob-k4", causal=True))


def test_leaving_autocast_on_cpu_or_cuda_asks_torch_nothing_compile_cannot_trace(monkeypatch):
    """torch.compile of torch 2.11 and older cannot trace ``torch.amp.is_autocast_available``: its graph
    break inside the operator's autocast-off region made each call of a compiled model recompile (19 graphs
    for 10 calls in tests/ops/test_sdpa_mode.py's compile-once test, under torch 2.10 and 2.11). For cpu and
    cuda the operator and the model answer without it; other devices still ask."""
    from kinterval.model.numerics import autocast_off
    from kinterval.ops.autocast import outside_autocast

    asked = []
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device: asked.append(device) or False)
    for device in ("cpu", "cuda"):
        assert isinstance(outside_autocast(device), torch.autocast)
        assert isinstance(autocast_off(device), torch.autocast)
    assert asked == []
    outside_autocast("meta"), autocast_off("meta")
    assert asked == ["meta", "meta"]
    q, k, v = _qkv(dtype=torch.float32)
    kinterval_attention(q, k, v, "lerp-k4", causal=True)
    assert asked == ["meta", "meta"]


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_a_backward_called_inside_autocast_stays_in_float32(backend):
    """Autograd replays a matmul's backward under the autocast of the thread calling .backward(): inside
    torch.autocast the reference and closed-form dQ, dK, dV were bf16 matmuls (3e-3 relative error)."""
    q0, k0, v0 = _qkv(Tq=16, Tk=16, D=16, dtype=torch.float32)

    def grads(inside):
        xs = [x.clone().requires_grad_() for x in (q0, k0, v0)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = kinterval_attention(*xs, "lerp-k4", causal=True, backend=backend).pow(2).sum()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        return [x.grad for x in xs]

    for a, b in zip(grads(True), grads(False)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_attention_probs_propagates_meta_shapes(backend):
    """Meta scores skip the data checks (they raised 'Tensor.item() cannot be called on meta tensors')."""
    P = attention_probs(torch.empty(2, 3, 5, device="meta"), "lerp-k4", causal=True, backend=backend)
    assert (P.device.type, P.shape) == ("meta", (2, 3, 5))


def test_fully_masked_rows_give_zero_output_and_gradients():
    q, k, v = (x.requires_grad_() for x in _qkv(Tq=4, Tk=4))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    out = kinterval_attention(q, k, v, "fwm-prob-k4", mask=mask)
    out.sum().backward()
    assert (out[:, :, 2] == 0).all() and torch.isfinite(q.grad).all() and (q.grad[:, :, 2] == 0).all()


@pytest.mark.usefixtures("triton_installed")  # the kernels are faked below
def test_dot_precision_reaches_the_triton_backend(monkeypatch):
    """``dot_precision`` sets the triton backend's fp32 dot precision where the call gives none; an explicit
    precision wins; the setting ends with the block; an unknown value raises."""
    from kinterval.ops import dot_precision
    from kinterval.ops import triton as tri

    seen = []

    def fake(q, k, v, spec, *, causal, mask, scale, precision):
        seen.append(precision)
        return q

    monkeypatch.setattr(tri, "triton_attention", fake)
    q = torch.randn(1, 1, 4, 8)
    with dot_precision("tf32x3"):
        kinterval_attention(q, q, q, "lerp-k4", backend="triton")
        kinterval_attention(q, q, q, "lerp-k4", backend="triton", precision="ieee")
    kinterval_attention(q, q, q, "lerp-k4", backend="triton")
    assert seen == ["tf32x3", "ieee", None]
    with pytest.raises(ValueError, match="precision"):
        with dot_precision("fp64"):
            pass


@pytest.mark.parametrize("kind", ["0/-inf", "bias"])
def test_a_float_mask_compiles_as_one_graph(kind):
    """Without gradients, a float attn_mask (0/-inf, or T5's position bias with -inf) traces whole under
    torch.compile(fullgraph=True), with the eager values: the bias-or-mask check (a host sync) and the
    fake-tensor test are not traced (Dynamo refused ``is_fake``)."""
    import torch._dynamo

    q, k, v = _qkv(dtype=torch.float32)
    keep = torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(2)) > 0.3
    mask = torch.zeros(2, 1, 7, 7) if kind == "0/-inf" else torch.randn(2, 1, 7, 7)
    mask = mask.masked_fill(~keep, float("-inf"))

    def f(q, k, v, m):
        return kinterval_attention(q, k, v, "lerp-k4", backend="closed_form", attn_mask=m)

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(f, backend="eager", fullgraph=True)(q, k, v, mask)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, f(q, k, v, mask), rtol=0, atol=0)
