"""What ``suite run`` and ``suite gate`` refuse before they write anything: a finished run that has lost its
checkpoints (trained again, it overwrote its signed-off results), a results folder without checkpoints as
``--out``, a device this machine lacks, and a gate of a folder that holds no manifest. A tiny real suite (2
runs x 2 checkpoints, CPU, seconds)."""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest
from test_gate import TINY
from test_sittings import _tree

from kinterval.cli import main
from kinterval.suite import runner
from kinterval.suite.gate import gate
from kinterval.suite.runner import run_suite

pytestmark = pytest.mark.xdist_group("suite_refusals")  # one worker builds the module fixture

RUN = "softmax-s7"


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A gated suite folder of two finished runs (softmax-s7, lerp-k4-s7) and its suite file."""
    root = tmp_path_factory.mktemp("refusals")
    suite = root / "tiny.toml"
    suite.write_text(TINY.replace("seeds = [7, 42]", "seeds = [7]"))
    assert run_suite(suite, root / "out", threads=1, log=lambda *_: None) == {
        "softmax-s7": "completed",
        "lerp-k4-s7": "completed",
    }
    assert gate(root / "out").ok
    return root / "out", suite


@pytest.fixture
def no_training(monkeypatch):
    """Training or evaluating is the defect: either fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run was trained or evaluated again")

    monkeypatch.setattr("kinterval.train.loop.train", refuse)
    monkeypatch.setattr("kinterval.eval.evaluate.evaluate_run", refuse)


def test_a_gated_run_without_its_checkpoints_is_not_trained_again(gated, tmp_path, no_training, capsys):
    """`rm -rf runs/softmax-s7/checkpoints` then `suite run --only softmax-s7`: the run was trained from
    scratch and its evaluations, metrics, status and probes overwritten. Now it is missing_checkpoints and
    every file is left as it was."""
    src, suite = gated
    out = tmp_path / "out"
    shutil.copytree(src, out)
    shutil.rmtree(out / "runs" / RUN / "checkpoints")
    before = _tree(out)
    argv = ["suite", "run", str(suite), "--out", str(out), "--threads", "1", "--only", RUN]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    run = out / "runs" / RUN
    assert f"{RUN}: finished, but checkpoints [8, 16] of the manifest are missing; not trained" in printed
    assert f"restore them into {run / 'checkpoints'}, or delete {run} to train the run anew" in printed
    assert f"0 of 1 runs ok; failed: ['{RUN}']" in printed
    assert _tree(out) == before
    logs = []
    assert runner.run_one(out, RUN, log=logs.append) == "missing_checkpoints"  # `suite run-one`, --gpus
    assert _tree(out) == before and "checkpoints [8, 16] of the manifest are missing" in logs[-1]


def test_a_finished_run_that_lost_one_checkpoint_is_not_resumed(gated, tmp_path, no_training):
    src, _ = gated
    out = tmp_path / "out"
    shutil.copytree(src, out)
    shutil.rmtree(out / "runs" / RUN / "checkpoints" / "step_000008")
    before = _tree(out)
    logs = []
    assert runner.run_one(out, RUN, log=logs.append) == "missing_checkpoints"
    assert "checkpoints [8] of the manifest are missing" in logs[-1] and _tree(out) == before


def test_a_finished_run_that_lost_an_unevaluated_checkpoint_is_not_trained_again(
    gated, tmp_path, no_training
):
    """A completed run lacks a checkpoint and its evaluation: it is still lost (the run had finished), not a
    run cut short that training would resume."""
    src, _ = gated
    out = tmp_path / "out"
    shutil.copytree(src, out)
    run = out / "runs" / RUN
    shutil.rmtree(run / "checkpoints" / "step_000008")
    for ext in (".json", ".npz"):
        (run / "eval" / "val" / f"step_000008{ext}").unlink()
    entry = next(e for e in json.loads((out / "manifest.json").read_text())["runs"] if e["run_id"] == RUN)
    assert runner.lost_checkpoints(run, entry, run / "eval" / "val") == [8]
    before = _tree(out)
    assert runner.run_one(out, RUN, log=lambda *_: None) == "missing_checkpoints"
    assert _tree(out) == before


def test_an_evaluated_checkpoint_is_lost_whatever_the_status(gated, tmp_path, monkeypatch):
    """A run with an unreadable status.json resumes (training rewrites it), unless a checkpoint it lacks was
    evaluated: that run had finished. A missing checkpoint without an evaluation is still trained."""
    src, _ = gated
    out = tmp_path / "out"
    shutil.copytree(src, out)
    run = out / "runs" / RUN
    (run / "status.json").write_text("garbage")
    shutil.rmtree(run / "checkpoints" / "step_000016")
    calls = []

    def fake_train(cfg, run_dir, *, resume):
        calls.append(resume)
        return types.SimpleNamespace(status="stopped")

    monkeypatch.setattr("kinterval.train.loop.train", fake_train)
    before = _tree(out)
    assert runner.run_one(out, RUN, log=lambda *_: None) == "missing_checkpoints"
    assert calls == [] and _tree(out) == before
    (run / "eval" / "val" / "step_000016.json").unlink()  # never evaluated: a run cut short
    assert runner.run_one(out, RUN, log=lambda *_: None) == "stopped"
    assert calls == [True]


@pytest.mark.parametrize("with_data", [False, True])
def test_a_results_folder_as_out_is_refused_before_anything_is_written(
    gated, tmp_path, no_training, capsys, with_data
):
    """A results folder (merged, or copied without checkpoints and data: the one kept in git) as --out: every
    run was trained again over its results, and --data rewrote the manifest's data folder."""
    src, suite = gated
    res = tmp_path / "res"
    shutil.copytree(src, res, ignore=shutil.ignore_patterns("checkpoints", "data"))
    assert gate(res, results_only=True).ok
    before = _tree(res)
    data = ["--data", str(src / "data")] if with_data else []
    assert main(["suite", "run", str(suite), "--out", str(res), "--threads", "1", *data]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{res} is a results folder (results without checkpoints)" in err[0]
    assert f"run into a new --out, with --skip-gated {res}" in err[0]
    assert _tree(res) == before
    assert main(["suite", "run-one", "--out", str(res), RUN]) == 1  # one run of it: missing_checkpoints
    assert _tree(res) == before


def test_a_results_folder_without_its_record_as_out_is_refused(gated, tmp_path, no_training, capsys):
    """A copy without checkpoints, data and gate.json (evaluations only) is a results folder too."""
    src, suite = gated
    res = tmp_path / "res"
    shutil.copytree(src, res, ignore=shutil.ignore_patterns("checkpoints", "data", "gate.json"))
    before = _tree(res)
    assert main(["suite", "run", str(suite), "--out", str(res), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{res} is a results folder (results without checkpoints)" in err[0]
    assert _tree(res) == before


def test_a_resumed_run_that_lost_an_unevaluated_checkpoint_is_reported_not_evaluated(gated, tmp_path):
    """An interrupted run (status running) whose first checkpoint, never evaluated, is gone: it resumes from
    its last checkpoint, which does not bring the first back; it is missing_checkpoints, not completed."""
    src, _ = gated
    out = tmp_path / "out"
    shutil.copytree(src, out)
    run_dir = out / "runs" / RUN
    (run_dir / "status.json").write_text(json.dumps({"status": "running"}))
    shutil.rmtree(run_dir / "checkpoints" / "step_000008")
    for p in [*run_dir.glob("eval/val/step_000008.*"), *run_dir.glob("diagnostics/geometry/step_000008.*")]:
        p.unlink()
    lines = []
    assert runner.run_one(out, RUN, threads=1, log=lines.append) == "missing_checkpoints"
    assert "checkpoints [8] of the manifest are missing" in lines[-1], lines
    assert not (run_dir / "eval" / "val" / "step_000008.json").exists()


@pytest.mark.parametrize("inside", ["", "sub"])
def test_a_training_run_folder_as_out_is_refused_before_anything_is_written(gated, tmp_path, capsys, inside):
    """A training run's folder (or a folder inside it) as --out: the suite's manifest, runs/ and data/ were
    written beside the run's own checkpoints, run_config.json and status.json."""
    src, suite = gated
    run = tmp_path / "run"
    shutil.copytree(src / "runs" / RUN, run)
    before = _tree(run)
    out = run / inside if inside else run
    assert main(["suite", "run", str(suite), "--out", str(out), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    where = "is" if not inside else f"lies inside {run.resolve()}, which is"
    assert len(err) == 1 and f"--out {out} {where} a kinterval run folder" in err[0], err
    assert _tree(run) == before


@pytest.mark.parametrize(
    "override, says",
    [("", "--device cuda: device 'cuda' requested but CUDA is not available"),
     ('"device" = "cuda"', "the runs' protocol device: device 'cuda' requested but CUDA is not available")],
)  # fmt: skip
def test_cuda_on_a_machine_without_cuda_is_refused_before_any_run(
    tmp_path, monkeypatch, capsys, override, says
):
    """Every run failed in turn with a traceback in its log ("device 'cuda' requested but CUDA is not
    available") and the suite exited 1; now one line, exit 2, and no folder made."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY.replace("[overrides]", f"[overrides]\n{override}"))
    out = tmp_path / "o"
    flags = [] if override else ["--device", "cuda"]
    assert main(["suite", "run", str(suite), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "pass --device cpu (or auto)" in err[0]
    assert not out.exists()
    # --slurm submits from a login node: the job's node has the GPU (refused here for want of submitit)
    monkeypatch.setitem(sys.modules, "submitit", None)
    assert main(["suite", "run", str(suite), "--out", str(out), "--slurm", *flags]) == 2
    assert "--slurm needs submitit" in capsys.readouterr().err and not out.exists()


def test_skip_gated_refuses_a_results_folder_of_another_version_of_the_suite(gated, tmp_path):
    """The same suite name and operator code, another optim.lr: the results folder's runs are not this
    suite's, so none is skipped as signed off (and the two could never be merged); refused with the fields
    that differ."""
    src, _ = gated
    other = tmp_path / "tiny.toml"
    other.write_text(
        TINY.replace("seeds = [7, 42]", "seeds = [7]").replace(
            "[overrides]", '[overrides]\n"optim.lr" = 1e-3'
        )
    )
    with pytest.raises(
        ValueError, match=rf"--skip-gated {src}: its manifest differs from this suite folder's in runs"
    ):
        run_suite(other, tmp_path / "s", skip_gated=src, threads=1, log=lambda *_: None)


def test_a_dataset_folder_as_out_is_refused(gated, tmp_path, no_training, capsys):
    """``suite run S --out DATA`` wrote manifest.json and runs/ beside the shards of a prepared dataset."""
    src, suite = gated
    data = tmp_path / "data"
    shutil.copytree(src / "data", data)
    before = _tree(data)
    assert main(["suite", "run", str(suite), "--out", str(data), "--threads", "1"]) == 2
    assert f"--out {data} is a prepared dataset (it holds meta.json)" in capsys.readouterr().err
    assert _tree(data) == before
