"""The training protocol (paper App. C, docs/training.md) recomputed independently of the trainer: one
optimizer step is the gradient of the mean loss over the step's S sequences (one batch, no accumulation),
clipped at global norm ``grad_clip``, then torch's AdamW with weight decay on the >= 2-D parameters only and
the learning rate of the step's token count. The trainer's micro-batches, accumulation, clip statistics and
logged rows must agree with it."""

import math

import numpy as np
import pytest
import torch

from kinterval.data.loader import load_batch
from kinterval.model import GPT, ModelConfig, NumericsConfig
from kinterval.train import distributed as D
from kinterval.train.metrics import read_metrics
from kinterval.train.trainer import Trainer, accumulate_gradients


@pytest.mark.parametrize("mb", [1, 2, 3, 8])
def test_accumulated_gradient_is_that_of_the_mean_loss_over_one_batch_in_float64(mb):
    """Micro-batches of ``mb`` (3 leaves a last micro-batch of 2) give the gradient and the loss of the mean
    over all 8 sequences computed in one batch: each micro-batch's loss is weighted by its share of the
    sequences, none is dropped, and the gradients add up. In float64: only the summation order differs."""
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    torch.manual_seed(0)
    model = GPT(cfg).double()
    tokens = np.random.default_rng(1).integers(0, 32, size=400).astype(np.uint16)
    offsets = np.array([0, 40, 17, 200, 333, 91, 5, 250])
    numerics = NumericsConfig()

    loss = accumulate_gradients(model, tokens, offsets, mb, 8, numerics, torch.device("cpu"), 32)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    x, y = load_batch(tokens, offsets, 8)
    _, want_loss = model(x, y)
    want_loss.backward()
    assert float(loss) == pytest.approx(want_loss.item(), rel=1e-6)  # the trainer sums the loss in fp32
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-9, atol=1e-12, msg=n)


def _paper_step_by_hand(model, opt, x, y, lr, clip):
    """One step of the protocol on one batch: mean loss, global-norm clip, AdamW at ``lr``."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
    if norm > clip:
        for p in model.parameters():
            p.grad.mul_(clip / norm)
    opt.step()
    return loss.item(), norm


@pytest.mark.parametrize("clip", [0.7, 0.0])
def test_trainer_steps_are_the_protocol_computed_by_hand(make_config, tmp_path, clip):
    """8 steps of 8 sequences (micro-batches of 4, accumulation 2) against the protocol in one batch per
    step: the same loss, pre-clip gradient norm, clip flag, learning rate and weights, and a ``clipped_frac``
    that is the fraction of the steps so far that clipped. ``grad_clip`` is set between the norms the steps
    see, so that some steps clip and some do not."""
    seed, T, S = 3, 32, 8
    cfg = make_config(seed=seed, **{"optim.grad_clip": clip})
    trainer = Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    torch.manual_seed(seed)
    ref = GPT(trainer.model_cfg, "softmax")
    params = dict(ref.named_parameters())
    groups = [
        {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=0.0, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    peak, floor = 3e-3, 3e-4  # warmup over 512 tokens (2 steps of 256), cosine to 0.1 * peak at step 8
    lrs = [peak * 256 / 512, peak] + [
        floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * (s - 1) / 6)) for s in range(2, 8)
    ]
    tokens = np.asarray(trainer.tokens, dtype=np.int64)
    perm = np.random.default_rng([seed, 0]).permutation((len(tokens) - 1) // T)

    trainer.open_records()
    got, want = [], []
    for s in range(8):
        stats = trainer.step()
        trainer.log_step(stats)
        x, y = load_batch(tokens, perm[s * S : (s + 1) * S] * T, T)
        loss, norm = _paper_step_by_hand(ref, opt, x, y, lrs[s], clip if clip > 0 else math.inf)
        got.append((stats.step, stats.lr, stats.train_loss, stats.grad_norm))
        want.append((s + 1, lrs[s], loss, norm))
        assert stats.clipped == (clip > 0 and norm > clip), s
    trainer.close()
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4)
    for n, p in trainer.model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n].detach(), rtol=1e-4, atol=1e-5, msg=n)
    flags = [r["clipped"] for r in read_metrics(tmp_path / "run")]
    assert [r["clipped_frac"] for r in read_metrics(tmp_path / "run")] == pytest.approx(
        [sum(flags[: i + 1]) / (i + 1) for i in range(8)]
    )
    assert trainer.clipped_steps == sum(flags)
    if clip:  # the norms stay clear of the threshold, and both kinds of step occur
        assert all(abs(w[3] / clip - 1) > 1e-3 for w in want) and 0 < sum(flags) < 8, want


def test_the_autocast_policy_is_bf16_on_cuda_and_on_cpu_only_when_asked():
    """Paper §4: everything outside attention runs under bf16 autocast in training on the GPU, whatever
    ``autocast_on_cpu`` says (that switch only adds the CPU); "none" turns it off everywhere. Decided without
    CUDA: the policy is a function of the device type."""
    from kinterval.model.numerics import autocast_applied

    default, on_cpu, off = (
        NumericsConfig(),
        NumericsConfig(autocast_on_cpu=True),
        NumericsConfig(autocast_dtype="none"),
    )
    assert default.autocast_dtype == "bfloat16" and not default.autocast_on_cpu
    assert [autocast_applied(default, d) for d in ("cuda", "cuda:1", "cpu")] == [
        "bfloat16",
        "bfloat16",
        "none",
    ]
    assert [autocast_applied(on_cpu, d) for d in ("cuda", "cpu")] == ["bfloat16", "bfloat16"]
    assert [autocast_applied(off, d) for d in ("cuda", "cpu")] == ["none", "none"]


def test_tf32_is_on_in_the_training_backward_too(make_config, tmp_path):
    """Paper App. C: TF32 matmuls in training, the backward's products included; ``step()`` sets it itself
    (here inside a caller's TF32-off region), for its forwards and its backwards alike."""
    from kinterval.model import tf32
    from kinterval.ops.tf32 import tf32_flags

    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    seen = {"forward": set(), "backward": set()}
    trainer.model.register_forward_pre_hook(lambda m, a: seen["forward"].add(tf32_flags()))
    for p in trainer.model.parameters():
        p.register_hook(lambda g: seen["backward"].add(tf32_flags()))
    trainer.open_records()
    with tf32(False):
        assert trainer.step().finite
        assert tf32_flags() == (False, False)
    trainer.close()
    assert seen == {"forward": {(True, True)}, "backward": {(True, True)}}
