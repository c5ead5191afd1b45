"""The Trainer driven by hand, as docs/training.md shows, is the run that ``train`` makes."""

import pytest
import torch

from kinterval.model import tf32
from kinterval.ops.tf32 import tf32_flags
from kinterval.train import distributed as D
from kinterval.train.checkpoint import latest_checkpoint, load_checkpoint
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics
from kinterval.train.trainer import Trainer


def _doc_loop(trainer, poison_after=None):
    """The hand-driven loop of docs/training.md §7 (``poison_after``: NaN weights after that step)."""
    trainer.resume()
    trainer.open_records()
    result = None
    while trainer.done < trainer.plan.steps:
        stats = trainer.step()
        if not stats.finite:
            result = trainer.stop_nonfinite(stats)
            break
        trainer.log_step(stats)
        if stats.step in trainer.plan.checkpoint_steps:
            trainer.save()
        if stats.step == poison_after:
            with torch.no_grad():
                trainer.model.transformer.ln_f.weight.fill_(float("nan"))
    trainer.close()
    return result or trainer.finish()


def test_hand_driven_trainer_equals_train(make_config, tmp_path):
    cfg = make_config()
    train(cfg, tmp_path / "loop")
    trainer = Trainer(cfg, tmp_path / "hand", D.setup(cfg.device))
    seen = []  # the TF32 switches each training forward sees (settable without CUDA)
    trainer.model.register_forward_pre_hook(lambda m, a: seen.append(tf32_flags()))
    before = tf32_flags()
    with tf32(False):  # step() itself must set the training policy (paper: TF32 on in training)
        result = _doc_loop(trainer)
    assert tf32_flags() == before
    assert cfg.numerics.tf32_train and len(seen) == 16 and set(seen) == {(True, True)}
    assert result.status == "completed" and result.steps == 8 and trainer.clipped_steps >= 0
    losses = [[r["train_loss"] for r in read_metrics(tmp_path / run)] for run in ("loop", "hand")]
    assert losses[0] == losses[1] and len(losses[0]) == 8
    a, b = (load_checkpoint(latest_checkpoint(tmp_path / run)).model for run in ("loop", "hand"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _set_grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    return grads


def test_clip_gradients_clips_the_global_norm_and_returns_the_pre_clip_norm():
    """The paper's clip: the global gradient norm over every parameter is clipped at ``grad_clip``
    (direction kept); the logged norm is the one before clipping. 0 disables clipping (the norm is still
    reported)."""
    from kinterval.model import GPT, ModelConfig
    from kinterval.train.trainer import clip_gradients

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    grads = _set_grads(model, 1)
    norm = sum(float(g.double().pow(2).sum()) for g in grads.values()) ** 0.5  # well above 1
    assert norm > 5
    for clip in (1.0, 0.0, 2 * norm):
        _set_grads(model, 1)
        assert abs(clip_gradients(model, clip) - norm) < 1e-4 * norm
        scale = clip / norm if 0 < clip < norm else 1.0
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[n] * scale, rtol=1e-5, atol=1e-8, msg=n)


def test_hand_driven_loop_stops_on_a_non_finite_step(make_config, tmp_path):
    """The documented loop ends on a non-finite step (step() does not advance ``done``, so a loop without
    the check would retry it forever) with status nonfinite_loss and the checkpoints it had."""
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    result = _doc_loop(trainer, poison_after=3)
    assert result.status == "nonfinite_loss" and trainer.done == 3
    status = (tmp_path / "run" / "status.json").read_text()
    assert "nonfinite_loss" in status


def test_a_non_finite_step_leaves_weights_optimizer_and_counters_alone(make_config, tmp_path):
    """``step()`` reports a non-finite loss without stepping the optimizer (docstring): the other weights, the
    AdamW state and ``done`` stay as they were, so the last good state is what the caller keeps."""
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    trainer.open_records()
    trainer.step()
    with torch.no_grad():
        trainer.model.transformer.ln_f.weight.fill_(float("nan"))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in trainer.optimizer.state.items()}
    stats = trainer.step()
    trainer.close()
    assert not stats.finite and stats.step == 2 and trainer.done == 1
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items() if k != "transformer.ln_f.weight")
    for p, s in trainer.optimizer.state.items():
        assert all(torch.equal(v, moments[id(p)][k]) for k, v in s.items())


def test_float16_autocast_is_refused_for_training_but_not_for_a_model(make_config, tmp_path, capsys):
    """fp16 autocast trained without loss scaling (gradients underflowed); the Trainer, ``train`` and the CLI
    refuse it, while a model (evaluation, inference) may still run under it."""
    from kinterval.cli import main
    from kinterval.model import GPT, ModelConfig, NumericsConfig

    cfg = make_config(**{"numerics.autocast_dtype": "float16"})
    with pytest.raises(ValueError, match="'float16' cannot be used for training"):
        Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    with pytest.raises(ValueError, match="'float16' cannot be used for training"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        main(["train", "--data", str(tmp_path), "--autocast", "float16", "--out", str(tmp_path / "run")])
    assert "invalid choice: 'float16'" in capsys.readouterr().err
    numerics = NumericsConfig(autocast_dtype="float16")
    GPT(ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16, numerics=numerics))
