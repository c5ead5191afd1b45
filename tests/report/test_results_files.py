"""Loading suite results from files: a run killed mid-write leaves a torn last metrics line; a non-finite
per-block NLL is an error naming its file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report.results import load_results


def test_a_torn_last_metrics_line_is_left_out(tmp_path):
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, clip=lambda r: 0.1)
    run = m["runs"][0]
    log = tmp_path / "ci" / run["run_dir"] / "metrics.jsonl"
    n = len(log.read_text().splitlines())
    with log.open("a") as f:
        f.write('{"step": 99, "clipped_fr')
    logs = load_results(tmp_path / "ci").logs[run["run_id"]]
    assert len(logs) == n and all(r["clipped_frac"] == 0.1 for r in logs)


def _cut_log(suite: Path, run: dict) -> Path:
    """Cut the run's metrics.jsonl after its first row (the checkpoint at step 16 of 48), mid-row."""
    log = suite / run["run_dir"] / "metrics.jsonl"
    first = log.read_text().splitlines()[0]
    log.write_text(first + '\n{"step": 32, "clipped_fr')
    return log


def test_a_truncated_log_of_a_finished_run_is_refused(tmp_path, capsys):
    """The report took the clip statistics of a completed run from whatever rows its metrics.jsonl kept: a log
    cut after step 16 of 48 gave that seed the clipped fraction of its first steps, with exit status 0."""
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, clip=lambda r: 0.1)
    run = m["runs"][2]
    log = _cut_log(tmp_path / "ci", run)
    why = rf"{log}: truncated: its last row is step 16, but the run trained 48 steps \(its checkpoint at "
    with pytest.raises(ValueError, match=why):
        load_results(tmp_path / "ci")
    assert f"{log}: truncated" in _report([tmp_path / "ci"], tmp_path, capsys)
    # status.json of the completed run says so too, when the last checkpoint is not evaluated (yet)
    for f in (tmp_path / "ci" / run["run_dir"] / "eval").glob("*/step_000048.*"):
        f.unlink()
    (log.parent / "status.json").write_text(json.dumps({"status": "completed", "step": 48, "steps": 48}))
    with pytest.raises(ValueError, match=rf"{log}: .* trained 48 steps \(status.json of the completed run\)"):
        load_results(tmp_path / "ci")
    log.write_text("")
    with pytest.raises(ValueError, match=rf"{log}: truncated: it holds no logged step"):
        load_results(tmp_path / "ci")


def test_the_log_of_a_run_still_training_may_stop_anywhere(tmp_path):
    """A run of a partial suite still training (or stopped early): its log is read as far as it goes."""
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, clip=lambda r: 0.1)
    run = m["runs"][2]
    log = _cut_log(tmp_path / "ci", run)
    for f in (tmp_path / "ci" / run["run_dir"] / "eval").glob("*/step_0000[34]*"):
        f.unlink()
    for status in (None, "running", "nonfinite_loss"):
        if status is not None:
            (log.parent / "status.json").write_text(json.dumps({"status": status, "step": 20, "steps": 48}))
        logs = load_results(tmp_path / "ci").logs[run["run_id"]]
        assert [r["step"] for r in logs] == [16]


def test_a_non_finite_per_block_nll_names_its_file(tmp_path):
    """The old code loaded it and failed later in the bootstrap with "x contains NaN or infinite values". The
    arrays are no longer those the summary states (its mean NLL is finite): refused as an edited file."""
    write_results(tmp_path / "ci", "ci", lambda r, f: 0.0)
    npz = sorted((tmp_path / "ci").glob("runs/*/eval/val/step_*.npz"))[0]
    with np.load(npz) as z:
        nll = z["nll"].copy()
    nll[5] = np.inf
    np.savez(npz, nll=nll)
    with pytest.raises(ValueError, match=rf"{npz.stem}.json and {npz} disagree \(its block"):
        load_results(tmp_path / "ci")


def _report(args, tmp_path, capsys) -> str:
    """`kinterval report ARGS --out`: exit status 2 and one error line, no report written; the line."""
    from kinterval.cli import main

    assert main(["report", *map(str, args), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kinterval report: error: "), err
    assert not (tmp_path / "rep").exists()
    return err


def test_a_folder_given_twice_is_refused(tmp_path, capsys):
    """`kinterval report d d/` loaded the runs twice, as two seeds of their own (seeds [7, 7], sd 0)."""
    from kinterval.report.results import load_many

    write_results(tmp_path / "ci", "ci", lambda r, f: 0.0)
    (tmp_path / "link").symlink_to(tmp_path / "ci")
    for again in (f"{tmp_path / 'ci'}/", tmp_path / "link"):
        with pytest.raises(ValueError, match="is given twice"):
            load_many([tmp_path / "ci", again])
        assert f"suite folder {tmp_path / 'ci'} is given twice" in _report(
            [tmp_path / "ci", again], tmp_path, capsys
        )


MALFORMED = ["manifest without runs", "manifest run without seed", "summary a list", "summary without step",
             "geometry a list", "graddiag without step"]  # fmt: skip


@pytest.mark.parametrize("what", MALFORMED)
def test_a_malformed_result_file_is_one_error_line_naming_it(tmp_path, capsys, what):
    """The old report crashed: KeyError 'runs', AttributeError 'list' object has no attribute 'get', ..."""
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, geometry=lambda r, f: {"row_span": 1.0})
    run = tmp_path / "ci" / m["runs"][0]["run_dir"]
    js = sorted(run.glob("eval/val/step_*.json"))[-1]
    manifest = tmp_path / "ci" / "manifest.json"
    if what.startswith("manifest"):
        bad, m = manifest, json.loads(manifest.read_text())
        if what == "manifest without runs":
            del m["runs"]
        else:
            del m["runs"][0]["seed"]
        manifest.write_text(json.dumps(m))
    elif what.startswith("summary"):
        bad, s = js, json.loads(js.read_text())
        js.write_text(
            json.dumps([1, 2] if what == "summary a list" else {k: v for k, v in s.items() if k != "step"})
        )
    elif what == "geometry a list":
        bad = run / "diagnostics" / "geometry" / js.name
        bad.write_text("[1, 2]")
    else:
        bad = run / "diagnostics" / "graddiag" / js.name
        bad.parent.mkdir(parents=True)
        bad.write_text(json.dumps({"mean": {}}))
    assert str(bad) in _report([tmp_path / "ci"], tmp_path, capsys)


def test_a_log_one_step_short_of_a_finished_run_is_refused(tmp_path):
    """A completed run's log whose last row is the step before its last (48): one step short is truncated
    too (the trainer always logs the last step)."""
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, clip=lambda r: 0.1)
    run = m["runs"][2]
    log = tmp_path / "ci" / run["run_dir"] / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert rows[-1]["step"] == 48
    rows[-1]["step"] = 47
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        ValueError, match=rf"{log}: truncated: its last row is step 47, but the run trained 48"
    ):
        load_results(tmp_path / "ci")
