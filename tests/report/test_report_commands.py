"""``kinterval report DIR [DIR ...] [--out DIR]`` wiring: every folder reaches the report, and the output
folder is --out or, by default, DIR/report of the first folder (the help text)."""

from pathlib import Path

from kinterval import cli
from kinterval.report import build


def test_report_passes_every_folder_and_its_output_folder(monkeypatch, tmp_path, capsys):
    calls = []

    def fake(dirs, out, clean_blocks=()):
        calls.append((list(dirs), Path(out), list(clean_blocks)))
        return out

    monkeypatch.setattr(build, "build_report", fake)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert cli.main(["report", a, b]) == 0
    assert calls[-1] == ([a, b], Path(a) / "report", [])
    assert cli.main(["report", a, b, "--out", str(tmp_path / "r")]) == 0
    assert calls[-1] == ([a, b], tmp_path / "r", [])
    assert f"report written: {tmp_path / 'r'}" in capsys.readouterr().out
    assert cli.main(["report", a, "--clean-blocks", "x.json", "--clean-blocks", "y.json"]) == 0
    assert calls[-1] == ([a], Path(a) / "report", ["x.json", "y.json"])


def test_report_refuses_an_out_inside_a_run_folder(tmp_path, capsys):
    # a report written into a run folder mixes its files with the run's: the gate then counts them as errors
    run = tmp_path / "suite" / "runs" / "softmax-s7"
    run.mkdir(parents=True)
    (run / "run_config.json").write_text("{}")
    for out in (run, run / "report"):
        assert cli.main(["report", str(tmp_path / "suite"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kinterval report: error: --out")
        assert "run folder" in err[0]
    assert sorted(p.name for p in run.iterdir()) == ["run_config.json"]
