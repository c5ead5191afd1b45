"""CLI glue of ``kinterval suite``: flags reach their parameters, exit codes, the gate's error listing
(mutation audit, benchmarks/results/mutation-2026-11-24/cli_glue.md)."""

from types import SimpleNamespace

import pytest

from kinterval.cli import main


def fake_report(errors):
    rep = {"errors": errors, "results_only": False, "suite": "s", "record": None, "record_error": None,
           "ok": not errors, "not_run": [], "stopped": {}, "hint": None}  # fmt: skip
    return SimpleNamespace(**rep, summary=lambda: "summary")


@pytest.mark.parametrize(
    "max_errors, shown, more",
    [(0, 0, "... and 3 more errors"), (2, 2, "... and 1 more errors"), (3, 3, None)],
)
def test_gate_prints_at_most_max_errors_and_counts_the_rest(
    monkeypatch, capsys, tmp_path, max_errors, shown, more
):
    """--max-errors N (>= 0) prints the first N errors and says how many more there are."""
    from kinterval.suite import gate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "D").mkdir()
    (tmp_path / "D" / "manifest.json").write_text("{}")  # a folder with a manifest: the gate reads it
    seen = {}
    rep = fake_report(["e1", "e2", "e3"])
    monkeypatch.setattr(gate, "gate", lambda d, **k: seen.update(k, dir=d) or rep)
    assert main(["suite", "gate", "D", "--max-errors", str(max_errors)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("ERROR")] == [f"ERROR e{i}" for i in range(1, shown + 1)]
    assert [line for line in out if line.startswith("...")] == ([more] if more else [])
    assert seen == {"dir": "D", "results_only": False, "write_record": True, "partial": False}
    assert main(["suite", "gate", "D", "--no-record", "--results-only"]) == 1
    assert seen == {"dir": "D", "results_only": True, "write_record": False, "partial": False}
    assert main(["suite", "gate", "D", "--partial"]) == 1
    assert seen == {"dir": "D", "results_only": False, "write_record": True, "partial": True}


def test_run_passes_its_flags_and_exits_1_when_a_run_failed(monkeypatch, capsys):
    from kinterval.suite import runner

    seen = {}
    result = {"a": "completed", "b": "failed"}
    monkeypatch.setattr(
        runner, "run_suite", lambda name, out, **k: seen.update(k, name=name, out=out) or result
    )
    argv = ["suite", "run", "mini", "--out", "O", "--data", "D", "--only", "x*", "--gpus", "2",
            "--per-gpu", "3", "--device", "cpu", "--threads", "1", "--skip-gated", "R"]  # fmt: skip
    assert main(argv) == 1
    assert seen == {"name": "mini", "out": "O", "data": "D", "only": ["x*"], "gpus": 2, "per_gpu": 3,
                    "slurm": False, "slurm_args": {"partition": None, "time": None}, "device": "cpu",
                    "threads": 1, "skip_gated": "R"}  # fmt: skip
    out = capsys.readouterr().out
    assert "1 of 2 runs ok; failed: ['b']" in out
    assert "next: kinterval suite gate O --partial (without --partial once every run has run)" in out
    result.pop("b")
    assert main(["suite", "run", "mini", "--out", "O"]) == 0
    assert capsys.readouterr().out.endswith("next: kinterval suite gate O\n")  # the whole suite: plain
    assert (seen["gpus"], seen["per_gpu"], seen["slurm_args"]) == (0, 1, {"partition": None, "time": None})
    assert seen["skip_gated"] is None
    result.clear()  # --skip-gated R signs off every selected run: nothing ran, nothing to gate in O
    assert main(["suite", "run", "mini", "--out", "O", "--skip-gated", "R"]) == 0
    out = capsys.readouterr().out
    assert "nothing ran in O: the runs are signed off in R; gate it there" in out and "next:" not in out
    result.update(a="completed")  # a folder with a space: the command to paste keeps it one argument
    assert main(["suite", "run", "mini", "--out", "else where/O"]) == 0
    assert capsys.readouterr().out.endswith("next: kinterval suite gate 'else where/O'\n")
    # a time limit Slurm would refuse: refused here, before anything is written (it was a submitit traceback)
    seen.clear()
    assert main(["suite", "run", "mini", "--out", "O", "--slurm", "--slurm-time", "-5"]) == 2
    assert "--slurm-time must be a number of minutes >= 1, got -5" in capsys.readouterr().err and not seen
    main(["suite", "run", "mini", "--out", "O", "--slurm", "--slurm-partition", "gpu", "--slurm-time", "90"])
    assert seen["slurm"] is True and seen["slurm_args"] == {"partition": "gpu", "time": 90}
    seen.clear()
    for flag, value in (("--slurm-time", "90"), ("--slurm-partition", "gpu")):  # ignored without --slurm
        assert main(["suite", "run", "mini", "--out", "O", flag, value]) == 2
        assert f"{flag} is for --slurm" in capsys.readouterr().err and not seen


def test_run_one_exits_1_unless_the_run_completed(monkeypatch):
    from kinterval.suite import runner

    status = {"s": "failed"}
    monkeypatch.setattr(runner, "run_one", lambda out, run_id, **k: status["s"])
    assert main(["suite", "run-one", "--out", "O", "r"]) == 1
    status["s"] = "completed"
    assert main(["suite", "run-one", "--out", "O", "r"]) == 0


def test_show_lists_only_the_selected_runs(capsys):
    from kinterval.suite.definition import load_suite

    runs = load_suite("mini").runs
    group = runs[0].group
    assert main(["suite", "show", "mini", "--only", group]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    want = [r.run_id for r in runs if r.group == group]
    assert 0 < len(want) < len(runs) and [line.split()[0] for line in lines] == want


def test_output_into_a_closed_pipe_stops_quietly():
    """`kinterval suite show D | head -1` ended in a BrokenPipeError traceback once head had left (and under
    `suite run`, the broken pipe was recorded as the run's failure)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    proc = subprocess.run(
        [sys.executable, "-m", "kinterval", "suite", "show", "D"], stdout=w, stderr=subprocess.PIPE, text=True
    )
    os.close(w)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


@pytest.mark.parametrize("what", ["missing", "empty", "a file"])
def test_gate_of_a_folder_without_a_manifest_is_one_line_and_exit_2(tmp_path, capsys, what):
    """`suite gate PATH` of a missing path, an empty folder or a file printed an ERROR line and a summary of
    suite "?" and exited 1, where merge, report and --skip-gated say one line and exit 2."""
    path = tmp_path / "d"
    if what == "empty":
        path.mkdir()
    elif what == "a file":
        path.write_text("x")
    assert main(["suite", "gate", str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1
    assert err[0] == f"kinterval suite: error: {path}: no manifest.json there, not a suite or results folder"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")  # there but unreadable: a gate error
    assert main(["suite", "gate", str(tmp_path / "bad"), "--no-record"]) == 1
    assert "ERROR manifest.json: unreadable" in capsys.readouterr().out
