"""Validation loss and row span logged during training (log.eval_every): right steps, the geometry probe's
values, no effect on training, identical after kill and resume."""

import numpy as np
import pytest
import torch

from kinterval.data.loader import TokenShards
from kinterval.eval.geometry import geometry_probe
from kinterval.model import GPT, ModelConfig
from kinterval.ops.tf32 import tf32_enabled
from kinterval.train.checkpoint import load_checkpoint
from kinterval.train.evaluate import evaluate_nll
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("validation_log")


class Killed(Exception):
    pass


def rows(run, validation):
    return [r for r in read_metrics(run) if (r.get("event") == "validation") == validation]


def checkpoint_model(run, step):
    ckpt = load_checkpoint(run / "checkpoints" / f"step_{step:06d}")
    model = GPT(ModelConfig.from_dict(ckpt.state["model_config"]), ckpt.state["config"]["operator"]["name"])
    model.load_state_dict(ckpt.model)
    return model


@pytest.fixture(scope="module")
def logged(tmp_path_factory, shared_config, data_dir):
    torch.set_num_threads(1)
    cfg = shared_config(**{"operator.name": "minmax-weight-k4", "log.eval_every": 3, "log.eval_blocks": 5})
    root = tmp_path_factory.mktemp("val")
    train(cfg, root / "logged")  # 8 steps, checkpoints after 2, 4, 6, 8
    train(cfg.override({"log.eval_every": 0}), root / "plain")
    return cfg, root


def test_validation_rows_at_the_right_steps_match_the_geometry_probe(logged, data_dir):
    cfg, root = logged
    val = rows(root / "logged", True)
    assert [r["step"] for r in val] == [3, 6, 8]  # every 3 steps, and the final step
    assert [r["tokens"] for r in val] == [3 * 256, 6 * 256, 8 * 256]  # 8 sequences of 32 tokens per step
    tokens = TokenShards(data_dir, "val").tokens()
    for r in val:
        assert r["val_blocks"] == 5 and len(r["row_span_layers"]) == 2
        assert np.isfinite([r["val_loss"], r["row_span"], *r["row_span_layers"]]).all()
        if r["step"] in (6, 8):  # checkpointed steps: recompute from the saved weights
            model = checkpoint_model(root / "logged", r["step"])
            probe = geometry_probe(model, tokens, 32, blocks=5)
            assert r["row_span"] == pytest.approx(probe["mean"]["span"], rel=1e-9)
            assert r["row_span_layers"] == pytest.approx([la["span"] for la in probe["layers"]], rel=1e-9)
            assert r["val_loss"] == pytest.approx(
                evaluate_nll(model, tokens, 32, max_blocks=5).mean(), rel=1e-12
            )
    assert val[0]["row_span"] != val[-1]["row_span"]  # a trajectory, not a constant


def test_validation_logging_does_not_change_training(logged):
    _, root = logged
    losses = [[r["train_loss"] for r in rows(root / run, False)] for run in ("logged", "plain")]
    assert losses[0] == losses[1] and len(losses[0]) == 8
    a, b = checkpoint_model(root / "logged", 8), checkpoint_model(root / "plain", 8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_validation_rows_survive_kill_and_resume(logged, tmp_path):
    cfg, root = logged

    def kill(step, model):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=kill)
    after = []
    train(cfg, tmp_path / "run", resume=True, on_step=lambda step, model: after.append(step))
    assert after == [5, 6, 7, 8]  # continued from the step-4 checkpoint, not retrained from step 0
    assert rows(tmp_path / "run", True) == rows(root / "logged", True)


def test_a_kill_during_validation_at_a_checkpoint_step_loses_no_row(logged, tmp_path, monkeypatch):
    """Step 6 is validated and checkpointed. Validating after saving lost the row for ever when a kill came
    between the two (the resume starts after the checkpoint); validating first redoes it from step 4."""
    from kinterval.train.trainer import Trainer

    cfg, root = logged
    validate = Trainer.validate

    def killed_at_6(self):
        if self.done == 6:
            raise Killed
        return validate(self)

    monkeypatch.setattr(Trainer, "validate", killed_at_6)
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run")
    monkeypatch.setattr(Trainer, "validate", validate)
    after = []
    train(cfg, tmp_path / "run", resume=True, on_step=lambda step, model: after.append(step))
    assert after == [5, 6, 7, 8]
    assert rows(tmp_path / "run", True) == rows(root / "logged", True)
    losses = [[r["train_loss"] for r in rows(run, False)] for run in (tmp_path / "run", root / "logged")]
    assert losses[0] == losses[1] and len(losses[0]) == 8


def test_validation_draws_no_random_numbers_and_keeps_the_checkpointed_state(shared_config, tmp_path):
    """What makes validating before saving safe: the RNG streams, the weights, the optimizer and the counters
    that a checkpoint records are the same after ``validate()`` as before it."""
    import random

    from kinterval.train import distributed as D
    from kinterval.train.trainer import Trainer

    cfg = shared_config(**{"operator.name": "minmax-weight-k4", "log.eval_every": 1, "log.eval_blocks": 3})
    trainer = Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    trainer.open_records()
    trainer.model.train()
    trainer.step()

    def snapshot():
        return (
            torch.get_rng_state(),
            np.random.get_state()[1].copy(),  # noqa: NPY002
            random.getstate(),
            {k: v.clone() for k, v in trainer.model.state_dict().items()},
            {id(p): {k: v.clone() for k, v in s.items()} for p, s in trainer.optimizer.state.items()},
            (trainer.done, trainer.clipped_steps, trainer.last_loss, trainer.model.training),
        )

    before = snapshot()
    trainer.validate()
    after = snapshot()
    trainer.close()
    assert torch.equal(before[0], after[0]) and (before[1] == after[1]).all() and before[2] == after[2]
    assert all(torch.equal(v, after[3][k]) for k, v in before[3].items())
    assert all(torch.equal(v, after[4][p][k]) for p, s in before[4].items() for k, v in s.items())
    assert before[5] == after[5]


def test_evaluation_is_batch_1_blocks_under_autocast_with_tf32_off():
    """Paper §4: validation NLL on non-overlapping blocks x = data[kT:kT+T], y = data[kT+1:kT+T+1], batch
    1, bf16 autocast outside attention as in training, fp32 logits, TF32 off; the train/eval mode is
    restored."""
    from kinterval.model import NumericsConfig, preset, tf32
    from kinterval.train.evaluate import token_nll

    torch.manual_seed(0)
    numerics = NumericsConfig(autocast_on_cpu=True)
    model = GPT(preset("tiny", vocab_size=97, block_size=16, n_embd=32, numerics=numerics), "fwm-prob-k4")
    tokens = np.random.default_rng(0).integers(0, 97, 3 * 16 + 5).astype(np.uint16)
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append((a[0].shape, m.training, tf32_enabled())))
    with tf32(True):
        got = token_nll(model, tokens, 16)
    assert model.training and got.shape == (3, 16)
    assert seen == [((1, 16), False, False)] * 3
    model.eval()
    for k in range(3):
        block = torch.from_numpy(tokens[16 * k : 16 * k + 17].astype(np.int64))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(block[None, :-1])
        want = torch.nn.functional.cross_entropy(logits[0].float(), block[1:], reduction="none")
        np.testing.assert_allclose(got[k], want.double().numpy(), rtol=1e-6, atol=1e-6)


def test_evaluation_copies_blocks_back_in_chunks_with_the_same_values(monkeypatch):
    """The per-token NLLs come back to the host FLUSH blocks at a time (one sync per chunk): the same array,
    bit for bit, for a block count that is not a multiple of the chunk."""
    import kinterval.train.evaluate as ev

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=97, block_size=16, n_layer=1, n_head=2, n_embd=32), "lerp-k4")
    tokens = np.random.default_rng(1).integers(0, 97, 8 * 16 + 1).astype(np.uint16)
    whole = ev.token_nll(model, tokens, 16)
    monkeypatch.setattr(ev, "FLUSH", 3)
    chunked = ev.token_nll(model, tokens, 16)
    assert chunked.shape == (8, 16) and np.array_equal(chunked, whole)
    monkeypatch.setattr(ev, "FLUSH", 1)
    assert np.array_equal(ev.token_nll(model, tokens, 16, max_blocks=5), whole[:5])


def test_evaluation_refuses_float_tokens_and_ids_outside_the_vocabulary():
    """Float token arrays were truncated silently; an id >= vocab_size was torch's IndexError on CPU and a
    device-side assert on CUDA. Both are ValueErrors naming the problem, checked once per array."""
    from kinterval.model import preset
    from kinterval.train.evaluate import token_nll

    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=97, block_size=16, n_embd=32))
    tokens = np.random.default_rng(0).integers(0, 97, 3 * 16 + 1)
    with pytest.raises(ValueError, match="1-D numpy array of integer token ids, got float64 array"):
        token_nll(model, tokens.astype(np.float64), 16)
    for bad in (97, -1):
        wrong = tokens.copy()
        wrong[40] = bad
        with pytest.raises(ValueError, match=rf"id {bad} is outside the model's vocabulary \[0, 97\)"):
            token_nll(model, wrong, 16)
    assert token_nll(model, tokens.astype(np.uint16), 16).shape == (3, 16)
