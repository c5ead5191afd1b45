"""The GPT model: presets, parameter counts, operator swap, numerics contexts."""

import re

import pytest
import torch

from kinterval.model import GPT, PRESETS, ModelConfig, NumericsConfig, autocast, count_params, preset, tf32
from kinterval.ops import OperatorSpec
from kinterval.ops.backends import triton_problem
from kinterval.ops.tf32 import tf32_flags

TINY = preset("tiny", vocab_size=97, block_size=16)


def build(operator, cfg=TINY, seed=0, backend="auto"):
    torch.manual_seed(seed)
    return GPT(cfg, operator, backend)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_analytic_count_matches_meta_model(name):
    cfg = preset(name, vocab_size=50257)
    with torch.device("meta"):
        model = GPT(cfg)
    assert model.num_params() == count_params(cfg)
    assert model.num_params(include_positions=False) == count_params(cfg, include_positions=False)


@pytest.mark.parametrize("operator", ["fwm-prob-k4", "softmax", "sdpa"])
def test_a_meta_model_traces_its_shapes_and_to_empty_keeps_the_embedding_tied(operator):
    """Built under torch.device("meta"), the model raised in its forward (the id check read values, the
    attention asked meta for autocast); after to_empty its two embedding ends were two matrices."""
    sinks = operator != "sdpa"  # sdpa takes no sinks
    cfg = preset("tiny", vocab_size=97, block_size=16, n_kv_head=2, rope_theta=1e4, attn_sinks=sinks)
    with torch.device("meta"):
        model = GPT(cfg, operator)
    logits, loss = model(
        torch.zeros(2, 8, dtype=torch.long, device="meta"), torch.zeros(2, 8, dtype=torch.long, device="meta")
    )
    assert logits.shape == (2, 8, cfg.padded_vocab_size) and logits.is_meta and loss.shape == ()
    n = model.num_params()
    model.to_empty(device="cpu")
    assert model.lm_head.weight is model.transformer.wte.weight and model.num_params() == n
    model.to(torch.float64)  # other conversions keep it tied too
    assert model.lm_head.weight is model.transformer.wte.weight


def test_paper_sizes():
    cfg_1b = preset("gpt2-1b", vocab_size=50257, vocab_multiple=1)
    n_1b = count_params(cfg_1b, include_positions=False)
    print(f"gpt2-1b: {n_1b:,} parameters (nanoGPT convention), {count_params(cfg_1b):,} with positions")
    assert 983e6 <= n_1b < 984e6  # paper App. C.1: ~983M
    assert (cfg_1b.n_layer, cfg_1b.n_head, cfg_1b.n_embd, cfg_1b.block_size) == (32, 24, 1536, 1024)
    cfg_124 = preset("gpt2-124m", vocab_size=50257)
    assert cfg_124.padded_vocab_size == 50304
    n_124 = count_params(cfg_124, include_positions=False)
    print(f"gpt2-124m: {n_124:,} parameters (vocab padded to {cfg_124.padded_vocab_size})")
    assert 123e6 < n_124 < 125e6


def test_forward_shapes_and_loss():
    cfg = preset("tiny", vocab_size=97, block_size=16, vocab_multiple=64)
    model = build("softmax", cfg)
    assert model.transformer.wte.weight.shape[0] == 128  # padded table
    x, y = torch.randint(0, 97, (2, 3, 16))
    logits, loss = model(x, y)
    assert logits.shape == (3, 16, 97)  # padding rows never get probability
    assert loss.ndim == 0 and abs(loss.item() - torch.log(torch.tensor(97.0)).item()) < 0.2
    assert model(x)[1] is None
    assert model.lm_head.weight is model.transformer.wte.weight
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_forward_rejects_float_or_1d_ids_and_mismatched_targets():
    """Float or 1-d ids raised torch's embedding error or a bare unpacking error; targets of another shape
    cross_entropy's batch-size error."""
    model = build("softmax", preset("tiny", vocab_size=97, block_size=16))
    for bad in (torch.zeros(1, 8), torch.zeros(8, dtype=torch.long), [[1, 2]]):
        with pytest.raises(ValueError, match="2-d integer tensor of token ids"):
            model(bad)
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(1, 8\), got \(1, 7\)"):
        model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 7, dtype=torch.long))


def test_forward_rejects_ids_outside_the_vocabulary_and_non_integer_types():
    """With vocab_multiple > 1, an id in [vocab_size, padded size) embedded a padding row silently; an id
    beyond the table or a negative one raised torch's "index out of range in self"; bool or uint8 ids
    torch's embedding dtype error."""
    model = build("softmax", preset("tiny", vocab_size=97, block_size=16, vocab_multiple=64))
    assert model.config.padded_vocab_size == 128
    for bad in (97, 127, 128, -1):
        ids = torch.zeros(1, 4, dtype=torch.long)
        ids[0, 2] = bad
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, vocab_size=97\)"):
            model(ids)
    for dtype in (torch.bool, torch.uint8):
        with pytest.raises(ValueError, match="int64/int32"):
            model(torch.zeros(1, 4, dtype=dtype))
    logits, _ = model(torch.full((1, 4), 96, dtype=torch.int32))
    assert logits.shape == (1, 4, 97)
    with pytest.raises(ValueError, match="unknown attention backend 'gpu'"):
        model.set_backend("gpu")  # was accepted, to fail at the next forward


def test_forward_rejects_targets_outside_the_vocabulary_and_an_empty_batch():
    """A target of -100 was skipped silently (cross_entropy's ignore index), one in [vocab_size, padded size)
    was scored against a row that never gets probability, int32 targets raised torch's "expected scalar type
    Long", and a batch of no sequences gave a NaN loss."""
    model = build("softmax", preset("tiny", vocab_size=97, block_size=16, vocab_multiple=64))
    ids = torch.zeros(2, 4, dtype=torch.long)
    for bad in (97, -100):
        targets = ids.clone()
        targets[1, 3] = bad
        with pytest.raises(ValueError, match=r"targets must lie in \[0, vocab_size=97\)"):
            model(ids, targets)
    with pytest.raises(ValueError, match="targets must be int64/int32"):
        model(ids, ids.float())
    with pytest.raises(ValueError, match="hold no token"):
        model(ids[:0], ids[:0])
    _, loss32 = model(ids, (ids + 5).int())
    _, loss64 = model(ids, ids + 5)
    assert torch.isfinite(loss32) and loss32 == loss64


def test_operator_swap_changes_nothing_else():
    models = [build(op) for op in ("softmax", "sdpa", "fwm-prob-k4", "minmax-weight-k4[range_grad=detach]")]
    ref = models[0].state_dict()
    for m in models[1:]:
        sd = m.state_dict()
        assert list(sd) == list(ref)
        assert all(torch.equal(sd[k], ref[k]) for k in ref)
    assert models[3].operator == "minmax-weight-k4[range_grad=detach]"


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_softmax_operator_matches_sdpa(backend):
    x = torch.randint(0, 97, (2, 16))
    a, b = build("softmax", backend=backend), build("sdpa")
    la, loss_a = a(x, x)
    lb, loss_b = b(x, x)
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_kinterval_operator_changes_outputs():
    x = torch.randint(0, 97, (2, 16))
    a, b = build("softmax"), build("minmax-weight-k4")
    assert not torch.allclose(a(x)[0], b(x)[0], atol=1e-4)


def test_bad_configs_and_backends():
    with pytest.raises(ValueError, match="divisible"):
        preset("tiny", n_head=3)
    with pytest.raises(ValueError, match="n_layer"):
        preset("tiny", n_layer=0)
    with pytest.raises(ValueError, match="unknown model preset"):
        preset("gpt5")
    with pytest.raises(ValueError, match="backend"):
        build("softmax", backend="cuda-magic")
    with pytest.raises(ValueError, match="operator"):
        build("softmaxx")


def test_historical_ste_model_runs_under_auto_and_rejects_an_unsupported_backend(monkeypatch):
    """Suite D's STE operators (historical arithmetic): auto picks a backend that runs them."""
    x = torch.randint(0, 97, (2, 16))
    spec = OperatorSpec.parse("minmax-weight-k4", arithmetic="historical")
    model = build(spec)
    _, loss = model(x, x)
    loss.backward()
    assert torch.isfinite(loss) and model.transformer.wte.weight.grad.abs().sum() > 0
    assert model.transformer.h[0].attn.operator.arithmetic == "historical"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    bad = build("bf16-exp", backend="triton")  # the fused kernels need a CUDA device
    with pytest.raises(ValueError, match="'triton' cannot run operator bf16-exp on cpu.*'closed_form' can"):
        bad(x)


def test_config_roundtrip():
    cfg = preset("small", vocab_size=300, numerics=NumericsConfig(autocast_dtype="none"))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_tf32_context_sets_and_restores():
    before = tf32_flags()
    with tf32(True):
        assert tf32_flags() == (True, True)
        with tf32(False):
            assert tf32_flags() == (False, False)
        assert tf32_flags() == (True, True)
    assert tf32_flags() == before


def _precision_state() -> dict:
    """Every fp32 precision setting a caller can read, a getter that raises (mixed APIs) as "raises"."""
    b, out = torch.backends, {}
    reads = {
        "legacy": torch.get_float32_matmul_precision,
        "allow_tf32": lambda: b.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
    }
    for obj, name in [(b, ""), (b.cuda.matmul, "cuda.matmul"), (b.cudnn, "cudnn"), (b.cudnn.conv, "conv")]:
        reads[f"{name}.fp32_precision"] = lambda o=obj: o.fp32_precision
    for obj, name in [(b.mkldnn, "mkldnn"), (b.mkldnn.matmul, "mkldnn.matmul")]:
        reads[f"{name}.fp32_precision"] = lambda o=obj: o.fp32_precision
    for key, read in reads.items():
        try:
            out[key] = read()
        except RuntimeError:
            out[key] = "raises"
    return out


CALLER_STATES = {
    "default": lambda b: None,
    "legacy medium": lambda b: torch.set_float32_matmul_precision("medium"),
    "legacy high": lambda b: torch.set_float32_matmul_precision("high"),
    "new cuda tf32": lambda b: setattr(b.cuda.matmul, "fp32_precision", "tf32"),
    "new top tf32": lambda b: setattr(b, "fp32_precision", "tf32"),
    "new oneDNN bf16": lambda b: setattr(b.mkldnn.matmul, "fp32_precision", "bf16"),
    "new top oneDNN bf16": lambda b: setattr(b.mkldnn, "fp32_precision", "bf16"),
    "legacy allow_tf32": lambda b: setattr(b.cuda.matmul, "allow_tf32", True),
}


@pytest.mark.skipif(
    not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="PyTorch without fp32_precision"
)
@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("state", sorted(CALLER_STATES))
def test_tf32_context_restores_every_caller_state(state, enabled):
    """After any one of these caller settings (legacy or new API), the block leaves every setting as it found
    it, a getter that raised before included (it raises again). Where the caller's own mix makes the legacy
    precision unreadable, torch's default is what can be restored: after a legacy set_float32_matmul_precision
    followed by a new-API setting, the effective fp32_precision values come back, a legacy getter may not."""
    b = torch.backends

    def reset():
        torch.set_float32_matmul_precision("highest")
        b.fp32_precision = b.cuda.matmul.fp32_precision = b.cudnn.fp32_precision = "none"
        b.cudnn.conv.fp32_precision = b.cudnn.rnn.fp32_precision = "tf32"
        b.mkldnn.fp32_precision = b.mkldnn.matmul.fp32_precision = "none"
        b.mkldnn.conv.fp32_precision = b.mkldnn.rnn.fp32_precision = "none"

    reset()
    try:
        CALLER_STATES[state](b)
        before = _precision_state()
        with tf32(enabled):
            assert tf32_flags()[0] is enabled
        assert _precision_state() == before
    finally:
        reset()


@pytest.mark.skipif(
    not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="PyTorch without fp32_precision"
)
def test_tf32_switch_works_after_the_new_pytorch_api_was_used():
    """PyTorch >= 2.9 raises on reading the legacy allow_tf32 once its fp32_precision API set TF32 on (a mix
    of the two APIs): the evaluation switch must still turn TF32 off, and restore the user's setting."""
    from kinterval.model import eval_precision

    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert tf32_flags()[0]
        if triton_problem() is None:  # the kernels read the same setting
            from kinterval.ops.triton.autograd import resolve_precision

            assert resolve_precision(torch.float32, None) == "tf32"
        with eval_precision(NumericsConfig()):
            assert tf32_flags() == (False, False) and matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = old


def test_autocast_policy_on_cpu():
    x = torch.ones(2, 2)
    with autocast(NumericsConfig(), "cpu"):  # off on CPU by default
        assert (x @ x).dtype == torch.float32
    with autocast(NumericsConfig(autocast_on_cpu=True), "cpu"):
        assert (x @ x).dtype == torch.bfloat16
    # "none" holds inside a caller's own autocast region too (an evaluation called from a user's bf16 loop)
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast(NumericsConfig(), "cpu"):
        assert (x @ x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast(NumericsConfig(autocast_dtype="none"), "cpu"):
        assert (x @ x).dtype == torch.float32
    with autocast(NumericsConfig(), "meta"):  # no autocast on meta: nothing to switch off
        pass
    # The attention operator stays in fp32 inside an autocast region; the output comes back as q's dtype.
    model = build("fwm-prob-k4")
    with autocast(NumericsConfig(autocast_on_cpu=True), "cpu"):
        logits, loss = model(torch.randint(0, 97, (1, 16)), torch.randint(0, 97, (1, 16)))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32


def test_gpt2_initialisation():
    """GPT-2 init: N(0, 0.02) for Linear and Embedding weights, zero biases, LayerNorm (1, 0), and the
    residual projections (attn.c_proj, mlp.c_proj) at 0.02 / sqrt(2 * n_layer)."""
    cfg = preset("tiny", vocab_size=97, block_size=16, n_layer=4, n_embd=128, n_head=4)
    torch.manual_seed(0)
    model = GPT(cfg)
    residual = 0.02 / (2 * cfg.n_layer) ** 0.5
    for name, p in model.named_parameters():
        if ".ln_" in name:
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith(".bias"):
            assert torch.all(p == 0), name
        else:
            std = residual if name.endswith("c_proj.weight") else 0.02
            assert abs(p.mean().item()) < 4 * std / p.numel() ** 0.5, name
            assert abs(p.std().item() / std - 1) < 0.05, (name, p.std().item(), std)


def test_train_and_eval_precision_switch_tf32():
    """Paper §4: TF32 matmuls on in training (numerics.tf32_train), off in evaluation (numerics.tf32_eval)."""
    from kinterval.model import eval_precision, train_precision

    def flags():
        return tf32_flags()

    default = NumericsConfig()
    for ambient in (False, True):
        with tf32(ambient):
            with train_precision(default):
                assert flags() == (True, True)
            with eval_precision(default):
                assert flags() == (False, False)
            with eval_precision(NumericsConfig(tf32_eval=True)):
                assert flags() == (True, True)
            with train_precision(NumericsConfig(tf32_train=False)):
                assert flags() == (False, False)
            assert flags() == (ambient, ambient)


# ---------------------------------------------------------------------- mutation audit (cli_glue.md)
def test_presets_have_the_documented_shapes():
    """docs/training.md: gpt2-124m 12 layers, 12 heads, d=768, context 1024, vocabulary padded to a multiple
    of 64 (50257 -> 50304); gpt2-1b 32 layers, 24 heads, d=1536; small 6 x 384, 512; tiny 2 x 64, 128."""
    shape = lambda c: (c.n_layer, c.n_head, c.n_embd, c.block_size)  # noqa: E731
    assert shape(PRESETS["gpt2-124m"]) == (12, 12, 768, 1024)
    assert PRESETS["gpt2-124m"].padded_vocab_size == 50304
    assert shape(PRESETS["gpt2-1b"]) == (32, 24, 1536, 1024)
    assert [(c.n_layer, c.n_embd, c.block_size) for c in (PRESETS["small"], PRESETS["tiny"])] == [
        (6, 384, 512),
        (2, 64, 128),
    ]


def test_padding_keeps_a_vocabulary_that_is_already_a_multiple():
    assert preset("tiny", vocab_size=128, vocab_multiple=64).padded_vocab_size == 128
    assert preset("tiny", vocab_size=129, vocab_multiple=64).padded_vocab_size == 192
    assert preset("tiny", vocab_size=97).padded_vocab_size == 97  # multiple 1: no padding


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"n_layer": True}, "model.n_layer must be a positive integer, got True"),
        ({"vocab_multiple": 0}, "model.vocab_multiple must be a positive integer, got 0"),
        ({"bias": "yes"}, "model.bias must be true or false, got 'yes'"),
        ({"numerics": NumericsConfig(autocast_dtype="float32")}, "numerics.autocast_dtype must be one of"),
        ({"numerics": NumericsConfig(tf32_eval="no")}, "numerics.tf32_eval must be true or false, got 'no'"),
    ],
)
def test_each_model_field_is_checked(fields, message):
    """A bool is not an integer (True would build a one-layer model); vocab_multiple 0 divided by zero."""
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(**{"n_layer": 1, "n_head": 1, "n_embd": 8, **fields}).validate()


def test_parameter_count_without_biases_matches_the_model():
    """count_params is the model's parameter count without building it, for bias=False too (LayerNorms
    without a bias)."""
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=50, bias=False)
    built = sum(p.numel() for p in GPT(cfg).parameters())
    assert count_params(cfg) == built
    assert count_params(cfg, include_positions=False) == built - 8 * 16
