from __future__ import annotations

import json

from kinterval import cli
from kinterval.data import TokenShards


def test_data_commands_are_registered():
    assert "kinterval.data.commands" in cli.COMMAND_MODULES


def test_cli_prepare_synthetic(tmp_path, capsys):
    out = tmp_path / "syn"
    argv = ["data", "prepare", "--source", "synthetic", "--out", str(out), "--tokens", "20000", "--seed", "4",
            "--block-size", "128", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "blocks@T=128" in text
    assert "train          20,000" in text and "156" in text  # (20000 - 1) // 128
    assert json.loads((out / "meta.json").read_text())["seed"] == 4
    assert TokenShards(out, "train", verify=True).n_blocks(128) == 156


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    assert cli.main(["data", "prepare", "--source", "nope", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval data: error: unknown source 'nope'") and "\n" not in err
    missing = tmp_path / "missing_dir"
    assert cli.main(["data", "prepare", "--source", f"bin:{missing}", "--out", str(tmp_path / "x")]) == 2
    assert str(missing) in capsys.readouterr().err
