"""The model's attention options beyond GPT-2: grouped-query heads (``n_kv_head``), the score softcap
(``attn_softcap``), learned attention sinks (``attn_sinks``) and rotary positions (``rope_theta``). Each is
checked in float64 against the layer written out by hand, and the scores the probes recompute
(``model.scores``) against the model."""

import math

import pytest
import torch

from kinterval.eval.attention import patched_attention
from kinterval.model import GPT, ModelConfig, NumericsConfig, count_params, preset
from kinterval.model.scores import attention_scores
from kinterval.ops.reference import reference_probs
from triton_gate import skip_without_kernels

OPTIONS = {
    "gqa": dict(n_kv_head=2),
    "mqa": dict(n_kv_head=1),
    "softcap": dict(attn_softcap=2.0),
    "sinks": dict(attn_sinks=True),
    "rope": dict(rope_theta=100.0),
    "all": dict(n_kv_head=2, attn_softcap=2.0, attn_sinks=True, rope_theta=100.0),
}


def config(**options) -> ModelConfig:
    return preset("tiny", **{"vocab_size": 97, "block_size": 12, "n_embd": 32, "n_head": 4, **options})


def build(operator: str, backend: str = "reference", **options) -> GPT:
    torch.manual_seed(0)
    model = GPT(config(**options), operator, backend).double()
    for block in model.transformer.h:  # sinks of either sign and size, as after training
        if block.attn.sinks is not None:
            block.attn.sinks.data = torch.tensor([1.5, -0.5, 0.0, 3.0], dtype=torch.float64)
    return model


def rotated(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions as complex numbers: channel pair (i, i + D/2) of position t is z = x_i + i x_{i+D/2},
    multiplied by exp(i t theta^(-2i/D)). x is (B, T, heads, D)."""
    T, D = x.shape[1], x.shape[-1]
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :])
    omega = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    z = z * torch.polar(torch.ones(T, D // 2, dtype=torch.float64), torch.arange(T)[:, None] * omega)[:, None]
    return torch.cat([z.real, z.imag], -1)


def by_hand(attn, x: torch.Tensor) -> torch.Tensor:
    """The layer in float64, every option written out: softmax over c tanh(q k^T / sqrt(D) / c) (q and k
    rotated first with rotary positions) and the sink logit appended to each row, the sink's probability
    dropped, k/v head j serving q heads j*G .. (j+1)*G - 1."""
    B, T, C = x.shape
    H, Hkv = attn.n_head, attn.n_kv_head
    D = C // H
    qkv = x @ attn.c_attn.weight.T + attn.c_attn.bias
    q = qkv[..., :C].reshape(B, T, H, D)
    k = qkv[..., C : C + Hkv * D].reshape(B, T, Hkv, D)
    v = qkv[..., C + Hkv * D :].reshape(B, T, Hkv, D)
    if attn.rope_theta is not None:
        q, k = rotated(q, attn.rope_theta), rotated(k, attn.rope_theta)
    out = torch.zeros(B, T, H, D, dtype=x.dtype)
    for h in range(H):
        j = h // (H // Hkv)
        s = torch.einsum("bid,bjd->bij", q[:, :, h], k[:, :, j]) / math.sqrt(D)
        if attn.softcap is not None:
            s = attn.softcap * torch.tanh(s / attn.softcap)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        if attn.sinks is not None:
            s = torch.cat([s, attn.sinks[h].expand(B, T, 1)], -1)
        P = torch.softmax(s, -1)[..., :T]
        out[:, :, h] = P @ v[:, :, j]
    return out.reshape(B, T, C) @ attn.c_proj.weight.T + attn.c_proj.bias


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_layer_is_the_options_written_out(option, backend):
    model = build("softmax", backend, **OPTIONS[option])
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = attn(x)
    want = by_hand(attn, x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    params = list(attn.parameters())
    grads = torch.autograd.grad(y.square().sum(), params)
    wants = torch.autograd.grad(want.square().sum(), params)
    for g, w in zip(grads, wants):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    if attn.sinks is not None:  # the sinks learn: their gradient is nonzero
        assert torch.all(grads[[p is attn.sinks for p in params].index(True)] != 0)


@pytest.mark.parametrize("operator", ["sdpa", "softmax"])
def test_sdpa_runs_grouped_query_heads(operator):
    """SDPA takes grouped-query heads (``enable_gqa``) and gives the softmax operator's output."""
    torch.manual_seed(0)
    cfg = config(n_kv_head=2)
    ref, model = GPT(cfg, "softmax", "reference"), GPT(cfg, operator, "closed_form")
    model.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 97, (2, 12))
    torch.testing.assert_close(model(idx)[0], ref(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("option", ["softcap", "sinks"])
def test_sdpa_refuses_a_softcap_or_sinks(option):
    with pytest.raises(ValueError, match="operator 'softmax'"):
        GPT(config(**OPTIONS[option]), "sdpa")


@pytest.mark.parametrize("operator", ["fwm-prob-k4", "minmax-weight-k4[arithmetic=historical]", "lerp-k4"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_probes_recompute_the_model_s_own_attention(option, operator):
    """``attention_scores`` (validation log, geometry probe, gradient diagnostics, tau screen) gives the
    scores the operator sees: the operator on them, through ``patched_attention``, is the model itself."""
    model = build(operator, "closed_form", **OPTIONS[option])
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    logits, loss = model(idx, idx)
    spec = model.transformer.h[0].attn.operator
    with patched_attention(model, lambda i, s, valid, q, k: reference_probs(s, valid, spec)):
        again, loss_again = model(idx, idx)
    torch.testing.assert_close(again, logits, rtol=1e-10, atol=1e-12)
    g = torch.autograd.grad(loss, list(model.parameters()))
    g_again = torch.autograd.grad(loss_again, list(model.parameters()))
    for a, b in zip(g, g_again):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)


def test_scores_carry_the_sink_as_a_last_key_without_value():
    model = build("softmax", **OPTIONS["all"])
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        q, k, v, s, valid = attention_scores(attn, x)
    assert q.shape == k.shape == (2, 4, 12, 8) and v.shape == (2, 4, 13, 8)
    assert s.shape == valid.shape == (2, 4, 12, 13)
    assert torch.equal(s[..., -1], attn.sinks.detach().view(1, 4, 1).expand(2, 4, 12))
    assert bool(valid[..., -1].all()) and not bool(v[..., -1, :].any())
    assert float(s[..., :-1].abs().max()) <= attn.softcap  # softcapped
    assert torch.equal(k[:, 0], k[:, 1]) and torch.equal(k[:, 2], k[:, 3])  # k/v heads serve two q heads


@pytest.mark.parametrize("op", ["softmax", "lerp-k4"])
def test_a_sink_at_minus_infinity_is_absent_in_the_scores_as_in_the_model(op):
    """A head's sink of -inf is no key (the operator's rule, ``ops.api.with_sinks``): the recomputed scores
    mark it invalid, so that the probes' P v is the model's own output."""
    model = build(op, **OPTIONS["sinks"])
    for block in model.transformer.h:
        block.attn.sinks.data = torch.tensor([1.5, float("-inf"), 0.0, 3.0], dtype=torch.float64)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        _, _, _, _, valid = attention_scores(attn, x)
    assert not bool(valid[:, 1, :, -1].any()) and bool(valid[:, [0, 2, 3], :, -1].all())
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = model(idx)
        spec = attn.operator
        with patched_attention(model, lambda i, s, valid, q, k: reference_probs(s, valid, spec)):
            again, _ = model(idx)
    torch.testing.assert_close(again, logits, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_parameter_count_and_state_dict(option):
    cfg = config(**OPTIONS[option])
    with torch.device("meta"):
        model = GPT(cfg)
    assert model.num_params() == count_params(cfg)
    sinks = [k for k in model.state_dict() if k.endswith("attn.sinks")]
    assert len(sinks) == (cfg.n_layer if cfg.attn_sinks else 0)
    assert ("transformer.wpe.weight" in model.state_dict()) == (cfg.rope_theta is None)
    assert model.num_params(include_positions=False) == count_params(cfg, include_positions=False)
    qkv = model.transformer.h[0].attn.c_attn.weight.shape[0]
    assert qkv == 32 + 2 * 8 * cfg.kv_heads


def test_without_options_the_model_is_gpt2():
    """Off (the default, every preset and shipped config): the parameters and outputs of GPT-2."""
    cfg = config()
    assert (cfg.n_kv_head, cfg.attn_softcap, cfg.attn_sinks, cfg.rope_theta) == (None, None, False, None)
    torch.manual_seed(0)
    model = GPT(cfg)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (96, 32)
    assert not any("sinks" in k for k in model.state_dict())
    new = ("n_kv_head", "attn_softcap", "attn_sinks", "rope_theta")
    old = {k: v for k, v in cfg.to_dict().items() if k not in new}
    assert ModelConfig.from_dict(old) == cfg  # a config saved before the options existed


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(n_kv_head=3), "n_kv_head"),
        (dict(n_kv_head=0), "n_kv_head"),
        (dict(n_kv_head=True), "n_kv_head"),
        (dict(n_kv_head=2.0), "n_kv_head"),
        (dict(attn_softcap=0.0), "attn_softcap"),
        (dict(attn_softcap=-1.0), "attn_softcap"),
        (dict(attn_softcap=float("inf")), "attn_softcap"),
        (dict(attn_softcap=float("nan")), "attn_softcap"),
        (dict(attn_softcap=True), "attn_softcap"),
        (dict(attn_softcap="30"), "attn_softcap"),
        (dict(attn_softcap=1e-40), "attn_softcap must be at least 1.18e-38"),  # 1/c: inf in float32
        (dict(attn_sinks=1), "attn_sinks"),
        (dict(rope_theta=1.0), "rope_theta"),
        (dict(rope_theta=0.0), "rope_theta"),
        (dict(rope_theta=float("inf")), "rope_theta"),
        (dict(rope_theta=float("nan")), "rope_theta"),
        (dict(rope_theta=True), "rope_theta"),
        (dict(rope_theta="1e4"), "rope_theta"),
        (dict(rope_theta=1e4, n_embd=36, n_head=4), "even head dimension"),
    ],
)
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        config(**options)


def test_the_attention_layer_built_on_its_own_checks_its_config():
    """CausalSelfAttention is exported, but only GPT validated the config: rope_theta=0 gave an all-NaN
    output and an odd rotary head dimension a shape error from inside rotary()."""
    from kinterval.model import CausalSelfAttention

    for bad, match in (
        (dict(n_head=4, n_embd=32, rope_theta=0.0), "rope_theta"),
        (dict(n_head=6, n_embd=42, rope_theta=1e4), "even head dimension"),
    ):
        with pytest.raises(ValueError, match=match):
            CausalSelfAttention(
                ModelConfig(n_layer=1, block_size=8, vocab_size=16, **bad), "softmax", "reference"
            )


@pytest.mark.parametrize("attention_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("operator", ["softmax", "fwm-prob-k4"])
def test_the_fused_kernels_run_the_options(operator, attention_dtype):
    """backend="triton" (the CPU interpreter without a GPU) against closed_form, every option at once:
    the kernels read each k/v head in place and apply the softcap and the sinks themselves."""
    skip_without_kernels()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # tests/conftest.py sets TRITON_INTERPRET on CPU
    cfg = preset(
        "tiny", vocab_size=97, block_size=12, n_embd=32, n_head=4, **OPTIONS["all"],
        numerics=NumericsConfig(attention_dtype=attention_dtype),
    )  # fmt: skip
    out = {}
    for backend in ("triton", "closed_form"):
        torch.manual_seed(0)
        attn = GPT(cfg, operator, backend).transformer.h[0].attn.to(device)
        attn.sinks.data = torch.tensor([1.5, -0.5, 0.0, 3.0], device=device)
        x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        y = attn(x)
        y.pow(2).sum().backward()
        out[backend] = y.detach(), x.grad, attn.sinks.grad
    for got, want in zip(out["triton"], out["closed_form"]):
        assert torch.isfinite(got).all() and got.abs().sum() > 0
        tol = (2**-7 if attention_dtype == "bfloat16" else 1e-5) * want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("option", [None, *sorted(OPTIONS)])
def test_the_layer_names_its_options_to_the_ops_and_nothing_else(monkeypatch, option):
    """A GPT-2 layer calls the dispatcher and the operator with exactly the keywords it always did; a layer
    with options adds only theirs (the dispatcher learns the score modifications the backend must apply)."""
    import kinterval.model.gpt as gpt

    calls = {}

    def resolve(spec, device, dtype, **kw):
        calls["resolve"] = kw
        return "closed_form"

    def attend(q, k, v, spec, **kw):
        calls["attend"] = {k_: v_ for k_, v_ in kw.items() if k_ != "sinks"} | {"sinks": "sinks" in kw}
        return torch.zeros_like(q)

    monkeypatch.setattr(gpt, "resolve_backend", resolve)
    monkeypatch.setattr(gpt, "kinterval_attention", attend)
    opts = OPTIONS.get(option, {})
    GPT(config(**opts), "fwm-prob-k4")(torch.randint(0, 97, (1, 12)))
    mods = tuple(n for n, on in (("softcap", "attn_softcap" in opts), ("sinks", "attn_sinks" in opts)) if on)
    assert calls["resolve"] == ({"backend": "auto", "score_mod": mods} if mods else {"backend": "auto"})
    want = {"causal": True, "backend": "closed_form", "sinks": "attn_sinks" in opts}
    want |= {"enable_gqa": True} if "n_kv_head" in opts else {}
    want |= {"softcap": 2.0} if "attn_softcap" in opts else {}
    assert calls["attend"] == want


def test_rotary_positions_match_transformers_llama():
    """``rotary`` against transformers' Llama (rotate_half convention) on the same q and k."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    from kinterval.model.gpt import rotary

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=500.0, max_position_embeddings=32)
    q, k = torch.randn(2, 2, 4, 20, 16, dtype=torch.float64)
    position_ids = torch.arange(20)[None]
    cos, sin = llama.LlamaRotaryEmbedding(cfg)(q, position_ids)
    want_q, want_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    # transformers takes its angles in fp32 (an error of a few 1e-7 at t = 19), kinterval in float64
    torch.testing.assert_close(rotary(q, 500.0), want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(rotary(k, 500.0), want_k, rtol=0, atol=1e-5)


def test_rotary_scores_depend_on_the_offset_only():
    """The same q and k vector at every position: q_t . k_u depends on t - u alone."""
    from kinterval.model.gpt import rotary

    q, k = torch.randn(2, 1, 1, 1, 8, dtype=torch.float64)
    s = rotary(q.expand(1, 1, 16, 8), 10.0) @ rotary(k.expand(1, 1, 16, 8), 10.0).transpose(-2, -1)
    for offset in range(-15, 16):
        d = torch.diagonal(s[0, 0], offset)
        torch.testing.assert_close(d, d[:1].expand_as(d), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(torch.diagonal(s[0, 0], 0)[0], torch.diagonal(s[0, 0], 3)[0])


def test_attention_options_names_exactly_the_options_that_are_set():
    assert config().attention_options == {} and config(n_kv_head=4).attention_options == {}
    assert config(**OPTIONS["all"]).attention_options == {
        "n_kv_head": 2, "attn_softcap": 2.0, "attn_sinks": True, "rope_theta": 100.0
    }  # fmt: skip


def test_the_smallest_softcap_is_accepted():
    """attn_softcap at float32's smallest normal number is valid (the operators take it); below it, not."""
    assert config(attn_softcap=2.0**-126).attn_softcap == 2.0**-126
    with pytest.raises(ValueError, match="attn_softcap must be at least"):
        config(attn_softcap=math.nextafter(2.0**-126, 0.0))


def test_rotary_runs_in_fp32_at_least():
    """16-bit q and k (under autocast) are rotated in fp32: the result is fp32 and equals the float64
    rotation of the same 16-bit values to fp32 rounding; float64 stays float64."""
    from kinterval.model.gpt import rotary

    x = torch.randn(2, 4, 64, 16, generator=torch.Generator().manual_seed(3))
    for dtype in (torch.bfloat16, torch.float16):
        got = rotary(x.to(dtype), 1e4)
        assert got.dtype == torch.float32
        want = rotary(x.to(dtype).double(), 1e4)
        assert want.dtype == torch.float64
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_sinks_start_at_zero():
    """The learned sink logits are zero at init (each sink weighs e^0 = 1 beside the keys' e^s), in
    every layer, whatever the seed."""
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = GPT(config(attn_sinks=True, n_layer=2), "fwm-prob-k4")
        assert [block.attn.sinks.tolist() for block in model.transformer.h] == [[0.0] * 4] * 2
