"""``activation_checkpointing = true`` (``kinterval train --activation-checkpointing``): each block's
activations recomputed in the backward instead of kept: less memory, the same result."""

import pytest
import torch
from safetensors.torch import load_file

from kinterval.cli import build_parser
from kinterval.model import GPT, ModelConfig
from kinterval.train.checkpoint import latest_checkpoint
from kinterval.train.commands import config_from_args
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics


def saved_bytes(model, idx) -> int:
    """Bytes of the tensors autograd keeps for the backward of one forward (what activation memory is)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx, idx)
    return total, loss


@pytest.mark.parametrize("operator", ["softmax", "minmax-weight-k4", "sdpa"])
def test_checkpointed_blocks_keep_less_and_give_the_same_gradients(operator):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=2, n_embd=32, block_size=32, vocab_size=64)
    model = GPT(cfg, operator, "closed_form")
    idx = torch.randint(0, 64, (4, 32))
    full, loss = saved_bytes(model, idx)
    loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing = True
    kept, loss_ac = saved_bytes(model, idx)
    loss_ac.backward()
    assert torch.equal(loss_ac, loss)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, want[n]), n  # recomputed, not approximated: bit for bit
    assert kept < full / 3, (kept, full)  # 4 blocks' activations against their 4 inputs (and the head)


def test_a_run_with_checkpointed_blocks_is_the_same_run(make_config, tmp_path, monkeypatch):
    """Bit-identical weights and losses, with the blocks really checkpointed; a resume may switch it (an
    execution field)."""
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(
        torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    cfg = make_config(**{"operator.name": "fwm-prob-k4"})
    train(cfg, tmp_path / "plain")
    assert not calls
    train(cfg.override({"activation_checkpointing": True}), tmp_path / "ac")
    assert len(calls) == 8 * 2 * 2  # steps x micro-batches x layers (evaluation never checkpoints)
    a = load_file(latest_checkpoint(tmp_path / "plain") / "model.safetensors")
    b = load_file(latest_checkpoint(tmp_path / "ac") / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["train_loss"] for r in read_metrics(tmp_path / d) if "train_loss" in r] for d in ("plain", "ac")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 8

    class Stop(Exception):
        pass

    def stop(step, model):
        if step >= 3:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, tmp_path / "switched", on_step=stop)
    train(cfg.override({"activation_checkpointing": True}), tmp_path / "switched", resume=True)
    c = load_file(latest_checkpoint(tmp_path / "switched") / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_the_flag_and_the_field():
    args = build_parser().parse_args(["train", "--data", "d", "--out", "o", "--activation-checkpointing"])
    assert config_from_args(args).activation_checkpointing is True
    assert (
        config_from_args(
            build_parser().parse_args(["train", "--data", "d", "--out", "o"])
        ).activation_checkpointing
        is False
    )
    from kinterval.train.config import TrainConfig

    with pytest.raises(ValueError, match="activation_checkpointing must be true or false"):
        TrainConfig().override({"data.dir": "d", "activation_checkpointing": 1}).validate()
