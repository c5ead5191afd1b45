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


def test_a_run_folder_or_a_folder_of_runs_is_pointed_to_report_runs(tmp_path, capsys):
    """A training run folder as DIR: the default --out was refused as inside a run, and --out X said to create
    a manifest with `kinterval suite run NAME --out RUN`, which suite run refuses."""
    runs = tmp_path / "runs"
    for name in ("soft", "lerp"):
        (runs / name / "checkpoints").mkdir(parents=True)
    (runs / "notes").mkdir()  # not a run: left out of the suggestion
    want = {
        runs / "soft": "is a training run folder, not a suite folder (no manifest.json): report runs with "
        "`kinterval report --runs RUN [RUN ...]`",
        runs: f"holds training run folders, not a suite (no manifest.json): report them with `kinterval "
        f"report --runs {runs / 'lerp'} {runs / 'soft'}`",
    }
    for folder, message in want.items():
        for out in ([], ["--out", str(tmp_path / "rep")]):
            assert cli.main(["report", str(folder), *out]) == 2
            (err,) = capsys.readouterr().err.strip().splitlines()
            assert err == f"kinterval report: error: {folder} {message}"
    assert not (tmp_path / "rep").exists() and not (runs / "soft" / "report").exists()
