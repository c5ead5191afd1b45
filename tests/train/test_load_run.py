"""One loader: ``kinterval.load_run`` finds, verifies and loads a run's checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import kinterval
from kinterval.cli import main
from kinterval.model import GPT
from kinterval.ops import OperatorSpec
from kinterval.train.checkpoint import CheckpointError, read_model_weights, state_sha256
from kinterval.train.config import TrainConfig
from kinterval.train.load import LoadedRun, find_checkpoint, load_run
from kinterval.train.loop import train


@pytest.fixture
def tiny_run(make_config, tmp_path):
    """fwm-prob-k4, 8 steps, checkpoints after steps 4 and 8."""
    cfg = make_config(**{"operator.name": "fwm-prob-k4", "checkpoint.count": 2})
    train(cfg, tmp_path / "run")
    return tmp_path / "run"


def test_load_run_by_folder_step_and_path(tiny_run):
    loaded = kinterval.load_run(tiny_run)
    assert isinstance(loaded, LoadedRun) and loaded is not None
    assert loaded.step == 8 and loaded.checkpoint.name == "step_000008"
    assert loaded.operator == OperatorSpec.parse("fwm-prob-k4") and loaded.backend == "closed_form"
    assert isinstance(loaded.config, TrainConfig) and loaded.config.operator.name == "fwm-prob-k4"
    assert isinstance(loaded.model, GPT) and not loaded.model.training
    ckpt4 = tiny_run / "checkpoints" / "step_000004"
    for path, which in ((tiny_run, 4), (tiny_run, "4"), (tiny_run, ckpt4), (ckpt4, "latest")):
        assert find_checkpoint(path, which) == ckpt4
    early = load_run(tiny_run, checkpoint=4)
    assert early.step == 4
    x = torch.randint(0, 512, (1, 32))
    with torch.no_grad():
        assert not torch.equal(early.model(x)[0], loaded.model(x)[0])
        soft = load_run(tiny_run, operator="softmax")
        assert soft.operator == OperatorSpec.parse("softmax") and soft.trained_operator == "fwm-prob-k4"
        assert not torch.equal(soft.model(x)[0], loaded.model(x)[0])  # same weights, another operator
    assert load_run(tiny_run, operator="sdpa").backend is None


def test_a_checkpoint_folder_gives_only_its_own_step(tiny_run):
    """``find_checkpoint(step_000008, 4)`` used to return step 8's folder: the step asked for was ignored."""
    ckpt8 = tiny_run / "checkpoints" / "step_000008"
    for which in ("latest", None, 8, "8", ckpt8, "checkpoints/step_000008"):
        assert find_checkpoint(ckpt8, which) == ckpt8
    for which in (4, "4", tiny_run / "checkpoints" / "step_000004", "checkpoints/step_000004"):
        with pytest.raises(ValueError, match=r"step_000008 is the checkpoint of step 8, not checkpoint .*4"):
            find_checkpoint(ckpt8, which)
    with pytest.raises(ValueError, match="not checkpoint step 4; pass the run folder"):
        load_run(ckpt8, checkpoint=4)


def test_load_run_refuses_an_edited_state_json(tiny_run):
    """One flipped bit (fwm-prob-k4 -> fwm-prob-k6) used to load the k4 weights as another operator."""
    ckpt = tiny_run / "checkpoints" / "step_000008"
    raw = (ckpt / "state.json").read_bytes()
    assert raw.count(b"fwm-prob-k4") >= 1
    (ckpt / "state.json").write_bytes(raw.replace(b"fwm-prob-k4", b"fwm-prob-k6"))  # still valid JSON
    with pytest.raises(CheckpointError, match="state.json was modified"):
        load_run(tiny_run)


def test_load_run_errors(tiny_run, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 5 .*step_000004"):
        load_run(tiny_run, checkpoint=5)
    (tiny_run / "checkpoints" / "step_000005").mkdir()  # a step folder without its state.json
    with pytest.raises(
        FileNotFoundError, match=r"step 5 in .*: step_000005 has no state.json \(incomplete or"
    ):
        load_run(tiny_run, checkpoint=5)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="'triton' cannot run operator fwm-prob-k4 on cpu"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_INTERPRET", "0")
            load_run(tiny_run, backend="triton")


def test_weights_that_do_not_fit_the_recorded_model_are_a_checkpoint_error(tiny_run, capsys):
    """state.json's model_config and the weights disagree: a CheckpointError, not torch's RuntimeError."""
    import json

    ckpt = tiny_run / "checkpoints" / "step_000008"
    state = json.loads((ckpt / "state.json").read_text())
    n_embd, state["model_config"]["n_embd"] = state["model_config"]["n_embd"], 16
    state["state_sha256"] = state_sha256(state)  # a consistent state.json: only the weights disagree
    (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"does not match the model that state.json describes \(size"):
        load_run(tiny_run)
    state["model_config"]["n_embd"] = n_embd
    state["model_config"]["n_layer"] += 1  # a layer whose weights the file does not hold
    state["state_sha256"] = state_sha256(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(
        CheckpointError, match=r"describes \(Missing key\(s\) in state_dict: .transformer.h.\d"
    ):
        load_run(tiny_run)
    assert main(["eval", "--run", str(tiny_run), "--checkpoint", "latest", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kinterval eval: error: checkpoint ")


def test_unknown_or_unavailable_device_is_a_value_error(tiny_run):
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        load_run(tiny_run, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_run(tiny_run, device="cuda:0")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "unrecorded"])
def test_read_model_weights_checks_the_recorded_hash(tiny_run, damage):
    import json

    ckpt = tiny_run / "checkpoints" / "step_000008"
    good = read_model_weights(ckpt)
    assert torch.equal(good["lm_head.weight"], good["transformer.wte.weight"])  # the tied key restored
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flip":
        data[-5] ^= 0x01  # one bit of one weight: the file still parses
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(bytes(data[:-64]))
    elif damage == "delete":
        weights.unlink()
    else:
        state = json.loads((ckpt / "state.json").read_text())
        del state["files"]["model.safetensors"]
        (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        read_model_weights(ckpt)


def test_eval_refuses_a_bit_flipped_checkpoint(tiny_run, capsys):
    """``kinterval eval --force`` used to score damaged weights and write a result."""
    ckpt = tiny_run / "checkpoints" / "step_000008"
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    code = main(["eval", "--run", str(tiny_run), "--checkpoint", "latest", "--force", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "model.safetensors" in err[0] and "sha256" in err[0] and "step_000008" in err[0]
    assert not list((tiny_run / "eval").rglob("step_000008.json"))  # no result written


def test_import_kinterval_stays_light():
    code = "import sys, kinterval; print('kinterval.train.load' in sys.modules, callable(kinterval.load_run))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


# ---------------------------------------------------------------------- mutation audit (cli_glue.md)
def test_checkpoint_paths_relative_to_the_run_and_steps_after_a_checkpoint_folder(tiny_run):
    """A checkpoint path may be relative to the run folder; a checkpoint folder answers only its own step
    (a later step is not it either)."""
    ckpt4, ckpt8 = (tiny_run / "checkpoints" / f"step_00000{s}" for s in (4, 8))
    assert find_checkpoint(tiny_run, "checkpoints/step_000004") == tiny_run / "checkpoints/step_000004"
    assert find_checkpoint(tiny_run, "checkpoints/step_000004").samefile(ckpt4)
    with pytest.raises(ValueError, match="checkpoint of step 8, not checkpoint step 9"):
        find_checkpoint(ckpt8, 9)


def test_an_explicit_backend_is_the_one_used(tiny_run):
    ref = load_run(tiny_run, backend="reference")
    assert ref.backend == "reference" and {b.attn.backend for b in ref.model.transformer.h} == {"reference"}
    assert load_run(tiny_run).backend == "closed_form"  # auto on the CPU


def test_a_garbled_model_config_is_a_checkpoint_error(tiny_run):
    """An unknown model field (a TypeError in the dataclass) names the checkpoint, like a missing one."""
    import json

    ckpt = tiny_run / "checkpoints" / "step_000008"
    state = json.loads((ckpt / "state.json").read_text())
    state["model_config"]["n_layers"] = 2
    state["state_sha256"] = state_sha256(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="state.json lacks or garbles field"):
        load_run(tiny_run)


def test_trained_operator_is_the_recorded_full_name():
    from kinterval.train.load import trained_operator

    state = {"operator": {"full_name": "fwm-prob-k4"}, "config": {"operator": {"name": "fwm-prob-k4[tau=6]"}}}
    assert trained_operator(state) == "fwm-prob-k4"
    assert trained_operator({"config": {"operator": {"name": "softmax"}}}) == "softmax"  # older checkpoints


def test_a_relative_checkpoint_path_never_loads_another_runs_checkpoint(tiny_run, tmp_path, monkeypatch):
    """From inside run A, `find_checkpoint(B, "checkpoints/step_000004")` used to return A's checkpoint."""
    other = tmp_path / "other-run"
    shutil.copytree(tiny_run, other)
    monkeypatch.chdir(tiny_run)
    with pytest.raises(
        ValueError, match="names two folders: .*other-run/checkpoints/step_000004 .*in the run"
    ):
        find_checkpoint(other, "checkpoints/step_000004")
    assert find_checkpoint(other, "4").parent.parent == other  # a step number is never ambiguous
    assert find_checkpoint(tiny_run, "checkpoints/step_000004").samefile(tiny_run / "checkpoints/step_000004")
    monkeypatch.chdir(tmp_path)  # relative to the working directory, where the run folder has no such path
    assert find_checkpoint(other, "other-run/checkpoints/step_000004").samefile(
        other / "checkpoints" / "step_000004"
    )


def test_another_runs_checkpoint_is_not_taken_as_this_runs(tiny_run, tmp_path):
    """`eval --run A --checkpoint B/checkpoints/step_N` evaluated B's weights and filed the result as A's."""
    other = tmp_path / "other-run"
    shutil.copytree(tiny_run, other)
    theirs = other / "checkpoints" / "step_000004"
    for given in (theirs, os.path.relpath(theirs)):
        with pytest.raises(ValueError, match=r"is not one of .*'s checkpoints .*give its own run folder"):
            find_checkpoint(tiny_run, given)
    assert find_checkpoint(other, theirs).parent.parent == other
