"""A suite run that the trainer stops with a non-finite loss is an outcome, not unfinished work: it is
evaluated up to its last checkpoint, never trained again by a later ``suite run`` (a sitting would otherwise
spend its time replaying the same divergence), signed off by the gate (full, partial and results-only) with
the step of the loss, merged, and listed by the report. A tiny real suite (3 runs x 2 checkpoints, CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_gate import RUN, TINY

import kinterval.train.loop as loop
from kinterval.cli import main
from kinterval.report.build import build_report
from kinterval.suite.gate import RECORD, gate
from kinterval.suite.merge import merge
from kinterval.suite.runner import run_suite
from tiny_suite import tiny_suite

pytestmark = pytest.mark.xdist_group("stopped_runs")
POISON = (
    10  # after this step's update the weights are NaN: step 11's loss is not finite (16 steps, ckpt 8, 16)
)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    root = tmp_path_factory.mktemp("stopped")
    (root / "tiny.toml").write_text(TINY)
    real, logs = loop.train, []

    def train(cfg, run_dir, *, resume=False, on_step=None):
        def poison(step, model):
            if Path(run_dir).name == RUN and step == POISON:
                with torch.no_grad():
                    model.transformer.ln_f.weight.fill_(float("nan"))

        return real(cfg, run_dir, resume=resume, on_step=poison)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "train", train)
        res = run_suite(root / "tiny.toml", root / "out", threads=1, log=logs.append)
    return root, res, logs


def test_a_stopped_run_is_evaluated_up_to_its_last_checkpoint(stopped):
    root, res, logs = stopped
    assert res == {"softmax-s7": "completed", RUN: "nonfinite_loss", "lerp-k4-s42": "completed"}
    run = root / "out" / "runs" / RUN
    status = json.loads((run / "status.json").read_text())
    assert (status["status"], status["step"]) == ("nonfinite_loss", POISON + 1)
    assert sorted(p.name for p in (run / "eval" / "val").glob("*.json")) == ["step_000008.json"]
    assert sorted(p.name for p in (run / "diagnostics" / "geometry").glob("*.json")) == ["step_000008.json"]
    (line,) = [x for x in logs if x.startswith(f"{RUN}:") and "evaluated" in x]
    assert "(nonfinite_loss); 1 checkpoints evaluated (1 new), last NLL" in line


def test_a_stopped_run_is_not_trained_again(stopped, tmp_path, capsys):
    root, *_ = stopped
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    before = {p: p.read_bytes() for p in (out / "runs" / RUN).rglob("*") if p.is_file()}
    assert main(["suite", "run", str(root / "tiny.toml"), "--out", str(out), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert (
        f"{RUN}: stopped by a non-finite loss at step {POISON + 1} (its status.json); not trained again"
        in printed
    )
    assert (
        f"2 of 3 runs ok; stopped by a non-finite loss (evaluated as far as they got): ['{RUN}']" in printed
    )
    after = {p: p.read_bytes() for p in (out / "runs" / RUN).rglob("*") if p.is_file()}
    assert after == before  # no step trained, no file rewritten


def test_the_gate_signs_off_a_stopped_run_with_its_step(stopped, tmp_path, capsys):
    root, *_ = stopped
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    rep = gate(out)
    assert rep.ok, rep.errors
    assert (rep.runs, rep.jobs, rep.stopped) == (3, 5, {RUN: POISON + 1})
    assert "3 runs, 5 jobs, 0 errors; 1 stopped by a non-finite loss" in rep.summary()
    rec = json.loads((out / RECORD).read_text())
    assert rec["partial"] is False and rec["n_jobs"] == 5 and f"{RUN}/step_000016" not in rec["checkpoints"]
    assert main(["suite", "gate", str(out), "--no-record"]) == 0
    assert f"stopped by a non-finite loss, gated up to their last checkpoint (1): {RUN} (step 11)" in (
        capsys.readouterr().out
    )
    # a partial gate signs it off too: its work is done
    part = gate(out, partial=True, write_record=False)
    assert part.ok and part.not_run == [] and part.stopped == {RUN: POISON + 1}


def test_the_gate_still_checks_what_a_stopped_run_keeps(stopped, tmp_path):
    """The evaluation of a checkpoint before the stop missing is one error; a status.json that moves the stop
    past a checkpoint the run does not have is that checkpoint's error and the log's (it ends at the stop)."""
    root, *_ = stopped
    out = tmp_path / "a"
    shutil.copytree(root / "out", out)
    (out / "runs" / RUN / "eval" / "val" / "step_000008.json").unlink()
    errors = gate(out, write_record=False).errors
    assert len(errors) == 1 and f"{RUN} step 8" in errors[0], errors
    out = tmp_path / "b"
    shutil.copytree(root / "out", out)
    status = out / "runs" / RUN / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "step": 20}))
    errors = gate(out, write_record=False).errors
    assert len(errors) == 2, errors
    assert "metrics.jsonl: truncated: its last row is step 11 of the 20" in errors[0]
    assert errors[1].startswith(f"{RUN} step 16: checkpoint missing"), errors


def test_a_stopped_run_merges_and_reports(stopped, tmp_path):
    root, *_ = stopped
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    assert gate(out, partial=True).ok
    res = merge(out, tmp_path / "res")
    assert RUN in res.added and res.not_run == []
    rep = gate(tmp_path / "res", results_only=True)
    assert rep.ok and rep.stopped == {RUN: POISON + 1}, rep.errors
    # tampering with the stop is one error for the run (status.json's hash)
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "res", bad)
    status = bad / "runs" / RUN / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "status": "completed"}))
    errors = gate(bad, results_only=True).errors
    assert len(errors) == 1 and "status.json" in errors[0], errors
    # and a completed run made to look stopped before its last checkpoint (hiding its evaluation)
    bad = tmp_path / "bad2"
    shutil.copytree(tmp_path / "res", bad)
    status = bad / "runs" / "lerp-k4-s42" / "status.json"
    status.write_text(json.dumps({"status": "nonfinite_loss", "step": 9, "tokens": 9 * 256}))
    errors = gate(bad, results_only=True).errors
    assert len(errors) == 1 and "lerp-k4-s42/status.json" in errors[0], errors
    build_report(tmp_path / "res", tmp_path / "rep")
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["stopped"][RUN]["step"] == POISON + 1
    assert report["stopped"][RUN]["last_evaluated_tokens"] == 8 * 256


def test_final_steps_are_the_checkpoints_before_the_non_finite_step():
    """The trainer checks a step's loss before it saves that step's checkpoint: a stop at a checkpoint step
    keeps only the ones before it. Anything but completed or a well-formed stop is not finished."""
    from kinterval.suite.manifest import final_steps, stopped_step

    steps = [8, 16]
    assert final_steps({"status": "completed", "step": 16}, steps) == [8, 16]
    assert final_steps({"status": "nonfinite_loss", "step": 16}, steps) == [8]
    assert final_steps({"status": "nonfinite_loss", "step": 9}, steps) == [8]
    assert final_steps({"status": "nonfinite_loss", "step": 8}, steps) == []
    for status in ({"status": "running", "step": 3}, None, [], {"status": "nonfinite_loss"}):
        assert final_steps(status, steps) is None, status
    for step in (True, 0, -1, "9", 9.0):
        assert stopped_step({"status": "nonfinite_loss", "step": step}) is None, step


def test_a_checkpoint_holding_the_diverging_weights_ends_the_outcome(tmp_path, monkeypatch):
    """The last checkpoint before a non-finite loss can evaluate to a non-finite NLL (its weights diverge):
    the suite failed the run for good (every re-run repeated it, the gate missed its probes). Now that
    checkpoint ends the outcome (recorded in status.json), the ones before are evaluated and probed, and the
    gate signs it off."""
    import kinterval.eval.evaluate as ev

    (tmp_path / "t.toml").write_text(
        tiny_suite('[[group]]\nname = "lerp"\noperators = ["lerp-k4"]').replace(
            "checkpoints = 2", "checkpoints = 4"
        )
    )
    real_train, real_check = loop.train, ev._check_finite

    def train(cfg, run_dir, *, resume=False, on_step=None):
        def poison(step, model):
            if step == POISON:
                with torch.no_grad():
                    model.transformer.ln_f.weight.fill_(float("nan"))

        return real_train(cfg, run_dir, resume=resume, on_step=poison)

    def check(tok, ckpt, split, step):  # checkpoint 8's weights give a NaN NLL
        return real_check(tok * float("nan") if step == 8 else tok, ckpt, split, step)

    monkeypatch.setattr(loop, "train", train)
    monkeypatch.setattr(ev, "_check_finite", check)
    logs = []
    assert run_suite(tmp_path / "t.toml", tmp_path / "out", threads=1, log=logs.append) == {
        RUN: "nonfinite_loss"
    }
    run = tmp_path / "out" / "runs" / RUN
    status = json.loads((run / "status.json").read_text())
    assert (status["step"], status["nonfinite_eval_step"]) == (POISON + 1, 8)
    for sub in ("eval/val", "diagnostics/geometry"):
        assert sorted(p.name for p in (run / sub).glob("*.json")) == ["step_000004.json"], sub
    assert any("its checkpoint at step 8 has a non-finite NLL" in x for x in logs)
    rep = gate(tmp_path / "out", write_record=False)
    assert rep.ok and rep.jobs == 1, rep.errors
    # a second sitting does not fail it again
    assert run_suite(tmp_path / "t.toml", tmp_path / "out", threads=1, log=logs.append) == {
        RUN: "nonfinite_loss"
    }
