"""numerics.attention_dtype: "float32" (the paper's policy) and "bfloat16" (q, k, v rounded; fp32 maths)."""

import pytest
import torch
import torch.nn.functional as F

import kinterval.ops.triton as triton_pkg
from kinterval.model import GPT, ModelConfig, NumericsConfig, autocast, preset
from kinterval.model.numerics import attention_inputs
from kinterval.model.scores import attention_scores
from kinterval.ops import kinterval_attention
from kinterval.train.config import TrainConfig, shipped_configs
from triton_gate import skip_without_kernels

KINTERVAL_OPS = ("fwm-prob-k4", "minmax-weight-k4", "lerp-k4")


def config(attention_dtype: str, **numerics) -> ModelConfig:
    return preset(
        "tiny",
        vocab_size=97,
        block_size=16,
        numerics=NumericsConfig(attention_dtype=attention_dtype, **numerics),
    )


def build(operator: str, attention_dtype: str, backend: str = "auto") -> GPT:
    torch.manual_seed(0)  # the same weights for every numerics option
    return GPT(config(attention_dtype), operator, backend)


def layer_input(model: GPT, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, model.config.n_embd, generator=g)


def direct(attn, x: torch.Tensor, operator: str, backend: str, *, rounded: bool) -> torch.Tensor:
    """The attention layer by hand: the fp32 operator on q, k, v (bf16-rounded first if ``rounded``)."""
    B, T, C = x.shape
    q, k, v = (
        t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2)
    )
    if rounded:
        q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
    assert q.dtype == torch.float32
    if operator == "sdpa":
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        y = kinterval_attention(q, k, v, operator, causal=True, backend=backend)
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
@pytest.mark.parametrize("operator", [*KINTERVAL_OPS, "softmax"])
def test_bf16_inputs_are_the_fp32_operator_on_rounded_qkv(operator, backend):
    fp32, bf16 = build(operator, "float32", backend), build(operator, "bfloat16", backend)
    x = layer_input(fp32)
    with torch.no_grad():
        y32, y16 = fp32.transformer.h[0].attn(x), bf16.transformer.h[0].attn(x)
        attn = fp32.transformer.h[0].attn
        assert torch.equal(y32, direct(attn, x, operator, backend, rounded=False))  # float32: as before
        assert torch.equal(y16, direct(attn, x, operator, backend, rounded=True))  # output not rounded
    assert y16.dtype == y32.dtype == torch.float32
    assert not torch.allclose(y16, y32, rtol=0, atol=1e-5)  # the rounding shows
    assert (y16 - y32).abs().max() < 0.05  # ... at bf16's scale


def test_sdpa_gets_bf16_inputs():
    fp32, bf16 = build("sdpa", "float32"), build("sdpa", "bfloat16")
    x = layer_input(fp32)
    attn = bf16.transformer.h[0].attn
    B, T, C = x.shape
    with torch.no_grad():
        q, k, v = (
            t.view(B, T, 2, C // 2).transpose(1, 2).to(torch.bfloat16) for t in attn.c_attn(x).split(C, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
        want = attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        assert torch.equal(attn(x), want)
        assert torch.equal(fp32.transformer.h[0].attn(x), direct(attn, x, "sdpa", "", rounded=False))
        assert not torch.allclose(attn(x), fp32.transformer.h[0].attn(x), rtol=0, atol=1e-5)


def test_model_outputs_differ_between_options_and_float32_is_unchanged():
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    a, b = build("fwm-prob-k4", "float32"), build("fwm-prob-k4", "bfloat16")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    la, lb = a(idx)[0], b(idx)[0]
    assert not torch.allclose(la, lb, rtol=0, atol=1e-6)
    torch.testing.assert_close(la, lb, rtol=0, atol=0.05)


@pytest.mark.parametrize("operator", ["sdpa", "fwm-prob-k4", "minmax-weight-k4", "lerp-k4"])
def test_gradients_flow_with_bf16_inputs(operator):
    model = build(operator, "bfloat16", "closed_form" if operator != "sdpa" else "auto")
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for block in model.transformer.h:  # q and k only get gradient through the attention
        g = block.attn.c_attn.weight.grad
        assert g.dtype == torch.float32 and g.abs().sum() > 0


class Spy:
    """Stands in for the fused kernel: records the dtype it gets and returns the output in q's dtype."""

    def __init__(self):
        self.dtypes = []

    def __call__(self, q, k, v, spec, *, causal=False, mask=None, scale=None, precision=None):
        self.dtypes.append((q.dtype, k.dtype, v.dtype))
        y = kinterval_attention(q.float(), k.float(), v.float(), spec, causal=causal, scale=scale)
        return y.to(q.dtype)


@pytest.mark.parametrize("autocast_on_cpu", [False, True])
@pytest.mark.parametrize(
    ("attention_dtype", "want"), [("bfloat16", torch.bfloat16), ("float32", torch.float32)]
)
def test_triton_backend_gets_the_attention_dtype(monkeypatch, attention_dtype, want, autocast_on_cpu):
    """The fused kernel gets bf16 q, k, v exactly with the bf16 option. Under bf16 autocast the projections
    are bf16, and the paper's policy widens them to fp32 first (the kernel then runs fp32/TF32 dots)."""
    skip_without_kernels()
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets the triton backend take CPU tensors (the spy runs)
    spy = Spy()
    monkeypatch.setattr(triton_pkg, "triton_attention", spy)
    torch.manual_seed(0)
    model = GPT(config(attention_dtype, autocast_on_cpu=autocast_on_cpu), "fwm-prob-k4", "triton")
    idx = torch.randint(0, 97, (1, 16))
    with autocast(model.config.numerics, "cpu"):
        _, loss = model(idx, idx)
    loss.backward()
    assert spy.dtypes == [(want, want, want)] * model.config.n_layer
    assert torch.isfinite(loss)


@pytest.mark.parametrize("operator", ["fwm-prob-k4", "minmax-weight-k4"])
def test_fused_kernel_with_bf16_inputs_tracks_the_emulation(operator):
    """The real kernel (CPU interpreter without a GPU) on bf16 inputs against the closed_form emulation: the
    same up to the kernel's own bf16 roundings (weights before P v, the output)."""
    skip_without_kernels()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # tests/conftest.py sets TRITON_INTERPRET on CPU
    out = {}
    for backend in ("triton", "closed_form"):
        attn = build(operator, "bfloat16", backend).transformer.h[0].attn.to(device)
        x = layer_input(build(operator, "float32")).to(device).requires_grad_()
        y = attn(x)
        y.pow(2).sum().backward()
        out[backend] = y.detach(), x.grad
    (y_t, g_t), (y_e, g_e) = out["triton"], out["closed_form"]
    assert y_t.dtype == torch.float32 and torch.isfinite(g_t).all() and g_t.abs().sum() > 0
    torch.testing.assert_close(y_t, y_e, rtol=0, atol=2**-8 * y_e.abs().max().item())
    torch.testing.assert_close(g_t, g_e, rtol=0, atol=2**-6 * g_e.abs().max().item())


def test_scores_follow_the_attention_dtype():
    x = layer_input(build("softmax", "float32"))
    for attention_dtype, rounded in (("float32", False), ("bfloat16", True)):
        attn = build("softmax", attention_dtype).transformer.h[0].attn
        q, k, v, s, _ = attention_scores(attn, x)
        B, T, C = x.shape
        raw = attn.c_attn(x).split(C, dim=2)[0].view(B, T, 2, C // 2).transpose(1, 2)
        assert q.dtype == torch.float32
        assert torch.equal(q, raw.to(torch.bfloat16).float() if rounded else raw)


def test_invalid_attention_dtype_is_refused():
    for bad in ("float16", "bf16", "fp32", None):
        with pytest.raises(
            ValueError, match=r"numerics\.attention_dtype must be one of \('float32', 'bfloat16'\)"
        ):
            NumericsConfig(attention_dtype=bad).validate()
    with pytest.raises(ValueError, match="attention_dtype"):
        GPT(ModelConfig(n_layer=1, n_head=1, n_embd=8, numerics=NumericsConfig(attention_dtype="float16")))
    with pytest.raises(ValueError, match="attention_dtype"):
        attention_inputs("float16", torch.zeros(1))
    with pytest.raises(ValueError, match="attention_dtype"):
        TrainConfig().override({"numerics.attention_dtype": "half"}).model_config(vocab_size=97)


def test_config_records_the_option_and_shipped_configs_keep_float32():
    cfg = config("bfloat16")
    assert cfg.to_dict()["numerics"]["attention_dtype"] == "bfloat16"
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert NumericsConfig().attention_dtype == "float32"
    for name in shipped_configs():
        assert TrainConfig.from_toml(name).numerics.attention_dtype == "float32", name


def test_eval_precision_sets_the_kernel_dot_precision(monkeypatch):
    """Evaluation with TF32 off runs the fused kernel's fp32 dots at $KINTERVAL_EVAL_DOT_PRECISION (default
    "ieee", the paper's fp32); with tf32_eval the TF32 switch decides (no override); a bad value raises."""
    from kinterval.model.config import NumericsConfig
    from kinterval.model.numerics import EVAL_DOT_PRECISION_ENV, eval_precision
    from kinterval.ops.api import _DOT_PRECISION

    monkeypatch.delenv(EVAL_DOT_PRECISION_ENV, raising=False)
    with eval_precision(NumericsConfig()):
        assert _DOT_PRECISION.get() == "ieee"
    for split in ("tf32x3", "bf16x6"):
        monkeypatch.setenv(EVAL_DOT_PRECISION_ENV, split)
        with eval_precision(NumericsConfig()):
            assert _DOT_PRECISION.get() == split
    with eval_precision(NumericsConfig(tf32_eval=True)):
        assert _DOT_PRECISION.get() is None
    assert _DOT_PRECISION.get() is None
    monkeypatch.setenv(EVAL_DOT_PRECISION_ENV, "tf32")
    with pytest.raises(ValueError, match=EVAL_DOT_PRECISION_ENV):
        with eval_precision(NumericsConfig()):
            pass


@pytest.mark.parametrize("operator", ["fwm-prob-k4", "softmax", "sdpa"])
def test_attention_runs_in_fp32_outside_bf16_autocast(operator):
    """Paper §4: everything outside attention runs under bf16 autocast, the attention operator on fp32 tensors
    outside it. By hand: the projections under autocast (bf16), q, k, v widened to fp32, the operator with
    autocast off, c_proj under autocast again; the layer must give exactly that."""
    torch.manual_seed(0)
    model = GPT(config("float32", autocast_on_cpu=True), operator, "closed_form")
    attn = model.transformer.h[0].attn
    x = layer_input(model)
    B, T, C = x.shape
    with torch.no_grad(), autocast(model.config.numerics, "cpu"):
        y = attn(x)
        qkv = attn.c_attn(x)
        assert qkv.dtype == torch.bfloat16  # autocast is on around the layer
        q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2).float() for t in qkv.split(C, dim=2))
        with torch.autocast("cpu", enabled=False):
            if operator == "sdpa":  # CPU autocast would run SDPA in bf16
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = kinterval_attention(q, k, v, operator, causal=True, backend="closed_form")
        assert o.dtype == torch.float32
        want = attn.c_proj(o.transpose(1, 2).reshape(B, T, C))
    assert torch.equal(y, want)
