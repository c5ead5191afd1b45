"""App. D.5's native FP8 backward diagnostic: autograd's backward of the E4M3 cast against FP8-exp's
training backward, on a config's initialization and first step."""

import json

import pytest
import torch

from kinterval.eval.fp8_backward import fp8_backward_check, native_cast_probs
from kinterval.ops import OperatorSpec
from kinterval.ops.reference import reference_probs


class _CastWithE4M3Gradient(torch.autograd.Function):
    """An own statement of what autograd does with ``.to(float8_e4m3fn).to(float32)``: round to E4M3 in the
    forward, and the incoming gradient rounded to E4M3 in the backward."""

    @staticmethod
    def forward(ctx, w):
        return w.to(torch.float8_e4m3fn).to(w.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.float8_e4m3fn).to(g.dtype)


def _own_native(s, valid):
    M = s.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
    w = torch.where(valid, _CastWithE4M3Gradient.apply(torch.exp(torch.where(valid, s - M, 0.0))), 0.0)
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_native_cast_forward_is_fp8_exp_and_its_backward_rounds_the_gradient(scale):
    torch.manual_seed(0)
    s = (scale * torch.randn(3, 6, 6)).requires_grad_()
    valid = torch.ones(6, 6, dtype=torch.bool).tril().expand(3, 6, 6)
    upstream = torch.randn(3, 6, 6) * torch.logspace(-4, 1, 6)  # gradients below and above E4M3's range
    P = native_cast_probs(s, valid)
    want = reference_probs(s.detach(), valid, OperatorSpec.parse("fp8-exp"))
    torch.testing.assert_close(P.detach(), want, rtol=0, atol=0)
    (g,) = torch.autograd.grad(P, s, upstream)
    s2 = s.detach().clone().requires_grad_()
    (g_own,) = torch.autograd.grad(_own_native(s2, valid), s2, upstream)
    torch.testing.assert_close(g, g_own, rtol=0, atol=0)
    (g_train,) = torch.autograd.grad(reference_probs(s2, valid, OperatorSpec.parse("fp8-exp")), s2, upstream)
    assert not torch.equal(g, g_train)  # the rounding of the gradient is the difference


def test_the_check_flushes_qk_gradients_where_training_has_them(make_config, tmp_path, capsys):
    """At initialization every dL/dw of a row lies below 2^-10: the native cast flushes it, and with it the
    whole score gradient (the Q/K projections get exactly 0, every gradient finite); the training backward
    gives the gradient a fp8-exp run's first step computes."""
    from kinterval.train import distributed as D
    from kinterval.train.trainer import Trainer, accumulate_gradients, rank_offsets

    cfg = make_config(seed=7)
    res = fp8_backward_check(cfg)
    fp32, native = res["designs"]["fp32"], res["designs"]["native"]
    assert (res["seed"], res["device"], res["micro_batches"], res["sequences"]) == (7, "cpu", 2, 8)
    # the training precision it ran in (on the CPU: no autocast unless autocast_on_cpu; TF32 as in training)
    assert (res["device_type"], res["autocast"], res["attention_dtype"], res["tf32"]) == (
        "cpu",
        "none",
        "float32",
        True,
    )
    assert native["q"] == native["k"] == 0.0 and native["finite"]
    assert fp32["q"] > 0 and fp32["k"] > 0 and fp32["finite"] and len(fp32["layers"]) == 2

    trainer = Trainer(make_config(seed=7, **{"operator.name": "fp8-exp"}), tmp_path / "run", D.setup("cpu"))
    plan = trainer.plan
    offsets = rank_offsets(trainer.sampler, 0, plan.seqs_per_step, 0, plan.seqs_per_step)
    mc = trainer.model_cfg
    cpu = torch.device("cpu")
    accumulate_gradients(
        trainer.model, trainer.tokens, offsets, 4, plan.block_size, mc.numerics, cpu, mc.vocab_size
    )
    C = trainer.model_cfg.n_embd
    q = sum(float(b.attn.c_attn.weight.grad[:C].pow(2).sum() + b.attn.c_attn.bias.grad[:C].pow(2).sum())
            for b in trainer.model.transformer.h) ** 0.5  # fmt: skip
    assert fp32["q"] == pytest.approx(q, rel=1e-5)

    one = fp8_backward_check(cfg, micro_batches=1)
    assert one["sequences"] == 4 and one["designs"]["native"]["qk"] == 0.0
    with pytest.raises(ValueError, match=r"micro_batches must be in \[1, 2\]"):
        fp8_backward_check(cfg, micro_batches=3)
    if not torch.cuda.is_available():  # the config's device, as train takes it
        with pytest.raises(ValueError, match="device 'cuda' requested but CUDA is not available"):
            fp8_backward_check(make_config(device="cuda"))
    with pytest.raises(ValueError, match="attention sinks"):
        fp8_backward_check(make_config(**{"model.attn_sinks": True}))


def test_cli_prints_the_table_and_writes_json(data_dir, tmp_path, capsys):
    from kinterval.cli import main

    out = tmp_path / "r.json"
    small = ["--set", "model.n_embd=32", "--set", "model.block_size=32"]
    argv = ["fp8-backward", "--config", "tiny-cpu", "--data", str(data_dir), "--seed", "7", *small]
    argv += ["--json", str(out), "--threads", "1"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fp8-exp at seed 7 on cpu, first step, 1 micro-batches (16 sequences)"
    assert lines[3].split() == ["native", "0", "0", "True"]
    res = json.loads(out.read_text())
    assert res["designs"]["native"]["qk"] == 0.0 and res["designs"]["fp32"]["qk"] > 0
    assert main([*argv, "--set", "seed=8"]) == 2  # --set and --seed disagree: refused, as train refuses it
    assert "--seed 7 and --set seed=8 set one field to two values" in capsys.readouterr().err
    assert main([*argv, "--set", "operator.name=softmax"]) == 2  # was replaced by fp8-exp without a word
    assert "--set operator.name: the check runs FP8-exp" in capsys.readouterr().err
