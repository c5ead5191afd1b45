"""End-to-end training on CPU: learning, invariance, exact resume, failure handling, checkpoint format."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from kinterval.ops.tf32 import tf32_flags
from kinterval.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics


class Killed(Exception):
    pass


def losses(run):
    return [r["train_loss"] for r in read_metrics(run) if "event" not in r]


def final_tensors(run):
    ckpt = load_checkpoint(latest_checkpoint(run))
    return ckpt.model, ckpt.optimizer


def test_loss_falls_and_metrics_are_logged(make_config, tmp_path):
    cfg = make_config(**{"schedule.tokens": 32 * 8 * 30})
    result = train(cfg, tmp_path / "run")
    assert result.status == "completed" and result.exit_code == 0 and result.steps == 30
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 30
    for key in ("step", "tokens", "train_loss", "lr", "grad_norm", "clipped", "tokens_per_s", "peak_mem"):
        assert key in rows[0]
    assert rows[-1]["tokens"] == 30 * 256 and rows[-1]["lr"] == pytest.approx(3e-4)
    first, last = np.mean([r["train_loss"] for r in rows[:3]]), np.mean([r["train_loss"] for r in rows[-3:]])
    assert last < first - 0.3, (first, last)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 30


def test_micro_batch_invariance(make_config, tmp_path):
    a = train(make_config(**{"schedule.micro_batch": 2, "schedule.accum": 4}), tmp_path / "a")
    b = train(make_config(**{"schedule.micro_batch": 8, "schedule.accum": 1}), tmp_path / "b")
    assert a.steps == b.steps == 8
    np.testing.assert_allclose(losses(tmp_path / "a"), losses(tmp_path / "b"), rtol=1e-6)
    ma, _ = final_tensors(tmp_path / "a")
    mb, _ = final_tensors(tmp_path / "b")
    for k in ma:
        torch.testing.assert_close(ma[k], mb[k], rtol=1e-4, atol=1e-5)  # Adam normalizes tiny grads


def test_kill_and_resume_is_bit_identical(make_config, tmp_path):
    cfg = make_config(**{"operator.name": "fwm-prob-k4"})  # checkpoints after steps 2, 4, 6, 8
    train(cfg, tmp_path / "full")

    def kill(step, model):
        if step == 5:  # one step past the checkpoint at 4: that step must be redone
            raise Killed

    with pytest.raises(Killed):
        train(cfg, tmp_path / "killed", on_step=kill)
    assert latest_checkpoint(tmp_path / "killed").name == "step_000004"
    after = []  # a resume that retrained from step 0 would reproduce the numbers below as well
    resumed = train(cfg, tmp_path / "killed", resume=True, on_step=lambda step, model: after.append(step))
    assert resumed.status == "completed" and after == [5, 6, 7, 8]
    assert losses(tmp_path / "killed") == losses(tmp_path / "full")  # exact floats
    (ma, oa), (mb, ob) = final_tensors(tmp_path / "full"), final_tensors(tmp_path / "killed")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    for name, st in oa["state"].items():
        assert all(torch.equal(st[k], ob["state"][name][k]) for k in st)


def test_a_resume_by_other_operator_code_warns(make_config, tmp_path, monkeypatch, capsys):
    """The checkpoint records the operator code's hash; a resume by other code (another kinterval version)
    went on without a word, so the run mixed two operators' code silently. It still goes on, and says so."""
    from kinterval.train import trainer

    cfg = make_config()

    def kill(step, model):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=kill)
    capsys.readouterr()
    real = trainer.code_identity
    monkeypatch.setattr(trainer, "code_identity", lambda: {**real(), "ops_sha256": "f" * 64})
    assert train(cfg, tmp_path / "run", resume=True).status == "completed"
    err = capsys.readouterr().err
    assert "was trained by other operator code" in err and "this checkout ffffffffffff" in err


def test_cli_hard_kill_then_resume(data_dir, tmp_path):
    args = [
        sys.executable,
        "-m",
        "kinterval.cli",
        "train",
        "--data",
        str(data_dir),
        "--model",
        "tiny",
        "--operator",
        "minmax-weight-k4",
        "--tokens",
        "1024",
        "--block-size",
        "32",
        "--micro-batch",
        "4",
        "--accum",
        "1",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--checkpoints",
        "4",
        "--warmup-tokens",
        "256",
        "--set",
        "model.n_embd=32",
        "--no-progress",
        "--out",
    ]
    full = subprocess.run([*args, str(tmp_path / "full")], capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    killed = subprocess.run(
        [*args, str(tmp_path / "k"), "--kill-after-step", "3"], capture_output=True, text=True
    )
    assert killed.returncode == 137
    status = json.loads((tmp_path / "k" / "status.json").read_text())
    assert status["status"] == "running"  # a hard kill leaves no final status
    assert latest_checkpoint(tmp_path / "k").name == "step_000002"  # checkpoints after steps 2, 4, 6, 8
    kept = (tmp_path / "k" / "checkpoints" / "step_000002" / "state.json").read_bytes()
    resumed = subprocess.run([*args, str(tmp_path / "k"), "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    # Continued from step 2: a retrain from step 0 would have rewritten that checkpoint (its train_s).
    assert (tmp_path / "k" / "checkpoints" / "step_000002" / "state.json").read_bytes() == kept
    assert losses(tmp_path / "k") == losses(tmp_path / "full")
    ma, mb = final_tensors(tmp_path / "full")[0], final_tensors(tmp_path / "k")[0]
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_nonfinite_loss_stops_cleanly(make_config, tmp_path):
    def poison(step, model):
        if step == 3:
            with torch.no_grad():
                model.transformer.ln_f.weight.fill_(float("nan"))

    result = train(make_config(), tmp_path / "run", on_step=poison)
    # docs/training.md: exit code 3 for a non-finite loss (2 is a refused input or checkpoint)
    assert result.status == "nonfinite_loss" and result.exit_code == 3 and result.steps == 3
    rows = read_metrics(tmp_path / "run")
    assert rows[-1]["event"] == "nonfinite_loss" and rows[-1]["step"] == 4
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "nonfinite_loss" and status["last_checkpoint"].endswith("step_000002")
    # the event goes to status.json as to metrics.jsonl: the failed step with its loss and gradient norm
    assert [status[k] for k in ("step", "tokens", "train_loss", "grad_norm")] == [
        rows[-1][k] for k in ("step", "tokens", "train_loss", "grad_norm")
    ]
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert ckpt.state["step"] == 2
    assert all(torch.isfinite(t).all() for t in ckpt.model.values())


def test_mismatched_config_is_refused(make_config, tmp_path):
    def stop(step, model):
        if step == 2:
            raise Killed

    cfg = make_config()
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=stop)
    other = cfg.override({"operator.name": "lerp-k4", "seed": 5})
    with pytest.raises(CheckpointError, match=r"operator\.name: 'softmax' -> 'lerp-k4'.*seed: 0 -> 5"):
        train(other, tmp_path / "run", resume=True)
    with pytest.raises(CheckpointError, match="schedule.tokens"):
        train(cfg.override({"schedule.tokens": 4096}), tmp_path / "run", resume=True)
    # Numerics are part of what a run computes: another attention dtype is refused like any config field.
    with pytest.raises(CheckpointError, match=r"numerics\.attention_dtype: 'float32' -> 'bfloat16'"):
        train(cfg.override({"numerics.attention_dtype": "bfloat16"}), tmp_path / "run", resume=True)
    # Execution-only changes are allowed: a different micro-batch split of the same global batch.
    ok = train(cfg.override({"schedule.micro_batch": 8, "schedule.accum": 1}), tmp_path / "run", resume=True)
    assert ok.status == "completed"


@pytest.mark.parametrize("damage", ["truncate", "flip", "state"])
def test_corrupt_checkpoint_is_refused(make_config, tmp_path, damage):
    cfg = make_config(**{"checkpoint.count": 1, "schedule.tokens": 512, "schedule.warmup_tokens": 256})
    train(cfg, tmp_path / "run")
    path = latest_checkpoint(tmp_path / "run")
    if damage == "truncate":
        f = path / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-100])
        match = "model.safetensors is corrupt or truncated"
    elif damage == "flip":
        f = path / "optimizer.safetensors"
        data = bytearray(f.read_bytes())
        data[-5] ^= 0xFF
        f.write_bytes(bytes(data))
        match = "optimizer.safetensors is corrupt"
    else:
        (path / "state.json").write_text('{"step": 2, "trunc')
        match = "state.json is corrupt"
    with pytest.raises(CheckpointError, match=match):
        train(cfg, tmp_path / "run", resume=True)


def test_checkpoints_hold_no_pickle(make_config, tmp_path):
    cfg = make_config(**{"checkpoint.count": 1, "schedule.tokens": 512, "schedule.warmup_tokens": 256})
    train(cfg, tmp_path / "run")
    path = latest_checkpoint(tmp_path / "run")
    names = sorted(p.name for p in path.iterdir())
    assert names == ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    for p in path.iterdir():
        raw = p.read_bytes()
        assert not raw.startswith(b"\x80") and not raw.startswith(b"PK")  # pickle / torch.save zip
        if p.suffix == ".safetensors":
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8 : 8 + n])  # a safetensors file is a JSON header + raw tensor bytes
            assert header["__metadata__"]["format"] == "kinterval-checkpoint"
        else:
            state = json.loads(raw)
    assert state["step"] == 2 and state["tokens"] == 512 and state["seq_counter"] == 16
    assert state["config"]["operator"]["name"] == "softmax"
    assert len(state["code"]["ops_sha256"]) == 64 and state["code"]["version"]
    assert "transformer.wte.weight" in state["decayed_params"]
    assert "transformer.h.0.ln_1.weight" not in state["decayed_params"]
    assert not any(".bias" in n for n in state["decayed_params"])
    assert state["model_config"]["numerics"]["tf32_train"] is True


def test_existing_run_requires_resume(make_config, tmp_path):
    cfg = make_config(**{"checkpoint.count": 1, "schedule.tokens": 512, "schedule.warmup_tokens": 256})
    train(cfg, tmp_path / "run")
    with pytest.raises(ValueError, match="--resume"):
        train(cfg, tmp_path / "run")
    assert train(cfg, tmp_path / "run", resume=True).status == "completed"  # finished: nothing to redo
    assert os.path.isfile(tmp_path / "run" / "run_config.json")


def test_resume_with_another_global_batch_or_other_data_is_refused(make_config, tmp_path):
    from kinterval.data.prepare import prepare

    def stop(step, model):
        if step == 2:
            raise Killed

    cfg = make_config()  # 8 sequences of 32 tokens per step, 8 steps
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=stop)
    # 9 sequences per step: still ceil(2048 / 288) = 8 steps, but another global batch (docs: micro_batch and
    # accum may change on resume only as long as the global sequences per step stay the same).
    with pytest.raises(CheckpointError, match=r"derived\.seqs_per_step: 8 -> 9"):
        train(cfg.override({"schedule.micro_batch": 9, "schedule.accum": 1}), tmp_path / "run", resume=True)
    # Same source, vocabulary and token count, other tokens: only the shard hashes tell them apart.
    other = tmp_path / "other"
    prepare("synthetic", other, tokens=60_000, seed=1, progress=False)
    with pytest.raises(CheckpointError, match=r"data\.identity\.shards_sha256"):
        train(cfg.override({"data.dir": str(other)}), tmp_path / "run", resume=True)


def test_the_data_source_note_may_change_on_resume(make_config, tmp_path):
    """data.source is a free-text note (meta.json and the shard hashes are the data's identity); a changed
    note blocked a resume."""

    def stop(step, model):
        if step == 3:
            raise Killed

    cfg = make_config(**{"data.source": "first note"})
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=stop)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert json.loads((ckpt / "state.json").read_text())["identity"].get("data.source") is None
    result = train(cfg.override({"data.source": "my note"}), tmp_path / "run", resume=True)
    assert result.status == "completed"


def test_a_budget_over_the_train_split_is_noted_and_recorded(make_config, tmp_path, capsys):
    """A run whose tokens go over its train split more than once says so at the start (the passes, and the
    split a single pass needs) and records the split's size and the passes in run_config.json; a run within
    one pass says nothing."""
    from kinterval.data.loader import TokenShards, n_blocks
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "small", tokens=3000, seed=0, progress=False)
    n = TokenShards(tmp_path / "small", "train").n_tokens
    cfg = make_config(**{"data.dir": str(tmp_path / "small"), "schedule.tokens": 32 * 8 * 20})
    train(cfg, tmp_path / "run")
    passes = 32 * 8 * 20 / (n_blocks(n, 32) * 32)
    assert passes > 1
    err = capsys.readouterr().err
    assert f"kinterval train: note: 5,120 training tokens are {passes:.2f} passes over the train split" in err
    assert f"({n:,} tokens)" in err and "needs a train split of 5,121 tokens or more" in err
    record = json.loads((tmp_path / "run" / "run_config.json").read_text())["train_data"]
    assert record == {"source": "synthetic", "tokens": n, "passes": pytest.approx(passes)}

    train(make_config(), tmp_path / "one-pass")
    assert "passes over the train split" not in capsys.readouterr().err
    record = json.loads((tmp_path / "one-pass" / "run_config.json").read_text())["train_data"]
    assert record["passes"] < 1


def test_a_budget_just_over_one_pass_is_not_shown_as_1_00_passes(make_config):
    """A budget a few tokens over one pass read "1.00 passes" in a note about going over the split more than
    once (and so did the report's index line and claims): enough decimals to tell it from 1; exactly one
    pass (or less) gives no note. Torchrun-like world sizes scale the planned tokens, not the passes' rule."""
    from kinterval.data.loader import passes_text
    from kinterval.train.schedule import make_plan
    from kinterval.train.trainer import passes_note

    assert passes_text(2.0064) == "2.01" and passes_text(1.0) == "1.00" and passes_text(0.5) == "0.50"
    assert passes_text(1.0003) == "1.0003" and passes_text(1.0000004) == "1.000000"
    for world in (1, 2, 4, 8):
        plan = make_plan(make_config(**{"schedule.tokens": 32 * 8 * 8 * 1000}), world)
        one = plan.total_tokens + 1  # a train split of exactly one pass
        assert passes_note(plan, one, "D") is None
        assert "are 1.00002 passes over the train split" in passes_note(plan, one - 32, "D")


def test_resume_identity_holds_every_field_but_the_execution_ones(make_config):
    """docs/training.md §5: a resume may change only device, compile, activation_checkpointing,
    operator.backend, micro_batch/accum,
    dist.strategy, data.dir, checkpoint.* and log.* (and the run's name and data.verify, a label and a
    check); every other config field is part of the identity a checkpoint must match."""
    from kinterval.train.config import flatten
    from kinterval.train.schedule import make_plan
    from kinterval.train.trainer import identity

    cfg = make_config()
    execution = {"device", "compile", "activation_checkpointing", "operator.backend", "schedule.micro_batch",
                 "schedule.accum", "dist.strategy", "data.dir", "name", "data.verify",
                 "data.source"}  # fmt: skip
    fields = set(flatten(cfg.to_dict()))
    computed = {f for f in fields if f not in execution and not f.startswith(("checkpoint.", "log."))}
    held = set(identity(cfg, make_plan(cfg, 1), {"source": "x"}))
    assert computed <= held, sorted(computed - held)
    assert not held & (fields - computed), sorted(held & (fields - computed))
    assert {"derived.seqs_per_step", "derived.steps", "data.identity"} <= held


def test_resume_identity_drops_the_execution_fields_an_older_checkpoint_holds(make_config):
    """A checkpoint of an older kinterval kept execution fields (device, micro-batch, ...) in its identity:
    resume compares it without them (and without the data's --source string), so it resumes under another
    device or micro-batch; every other field still counts."""
    from kinterval.train.schedule import make_plan
    from kinterval.train.trainer import identity, resume_identity

    cfg = make_config()
    now = identity(cfg, make_plan(cfg, 1), {"source": "text:corpus", "n_tokens": 10})
    old = dict(now, **{"device": "cuda", "schedule.micro_batch": 64, "operator.backend": "triton"})
    old["data.identity"] = {"source": "text:/abs/corpus", "n_tokens": 10}
    assert resume_identity(old) == resume_identity(now)
    assert resume_identity(dict(old, seed=5)) != resume_identity(now)


@pytest.mark.parametrize(("count", "save_every", "saved"), [(0, 0, [8]), (0, 3, [3, 6, 8])])
def test_a_completed_run_always_has_its_final_checkpoint(make_config, tmp_path, count, save_every, saved):
    """checkpoint.count 0, or a save_every that does not divide the 8 steps, used to finish "completed"
    without the final weights (and a resume then retrained the whole run)."""
    cfg = make_config(**{"checkpoint.count": count, "checkpoint.save_every": save_every})
    result = train(cfg, tmp_path / "run")
    assert result.status == "completed" and result.last_checkpoint.name == "step_000008"
    assert [p.name for p in sorted((tmp_path / "run" / "checkpoints").glob("step_*"))] == [
        f"step_{s:06d}" for s in saved
    ]
    assert train(cfg, tmp_path / "run", resume=True).resumed_finished


def test_log_every_logs_the_multiples_and_the_final_step(make_config, tmp_path):
    train(make_config(**{"log.every": 3}), tmp_path / "run")  # 8 steps
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [3, 6, 8]


def test_tf32_is_on_in_training_forwards_and_off_in_validation(make_config, tmp_path):
    """Paper §4 / App. C: TF32 matmuls in training, off in evaluation (validation rows included); the
    switches are restored after the run. (They are settable without CUDA, so CPU checks the policy.)"""
    from kinterval.train import distributed as D
    from kinterval.train.loop import run
    from kinterval.train.trainer import Trainer

    def flags():
        return tf32_flags()

    seen = []
    trainer = Trainer(
        make_config(**{"log.eval_every": 4, "log.eval_blocks": 1}), tmp_path / "run", D.setup("cpu")
    )
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append((module.training, *flags())))
    before = flags()
    assert run(trainer, resume=False).status == "completed"
    assert flags() == before
    assert sum(s[0] for s in seen) == 16 and sum(not s[0] for s in seen) == 2  # 8 steps x 2 micro-batches
    assert {s for s in seen if s[0]} == {(True, True, True)}
    assert {s for s in seen if not s[0]} == {(False, False, False)}
