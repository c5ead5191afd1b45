"""The command line as a user meets it across commands: bad input is one ``kinterval CMD: error:`` line and
exit 2, and what a command wrote is named."""

from __future__ import annotations

import pytest

from kinterval import cli


@pytest.mark.parametrize(
    "argv, name",
    [
        (["data", "prepare", "--source", "synthetic", "--out", ""], "--out"),
        (["data", "overlap", ""], "data"),
        (["train", "--config", "tiny-cpu", "--data", "d", "--out", ""], "--out"),
        (["train", "--config", "", "--data", "d", "--out", "r"], "--config"),
        (["eval", "--run", ""], "--run"),
        (["export-hf", "--run", "r", "--out", ""], "--out"),
        (["report", "--runs", "r", ""], "--runs"),
        (["ops", "--json", ""], "--json"),
        (["suite", "merge", "s", ""], "dst"),
    ],
)
def test_an_empty_path_is_refused_before_any_work(tmp_path, monkeypatch, capsys, argv, name):
    """``--out ""`` (an unset shell variable) was read as the current folder: `data prepare` and `train`
    wrote their files there, `data overlap ""` read whatever dataset it held, `ops --json ""` wrote none."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kinterval {argv[0]}: error: argument {name}: an empty path")
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
