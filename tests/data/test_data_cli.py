from __future__ import annotations

import json

import numpy as np
import pytest

import kinterval
from kinterval import cli
from kinterval.data import TokenShards


def test_version(capsys):
    """``--version`` alone answers without loading the command modules (torch, matplotlib, scipy)."""
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kinterval {kinterval.__version__}"
    with pytest.raises(SystemExit) as exit_:  # with other arguments: argparse's action, the same text
        cli.main(["--version", "data"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"kinterval {kinterval.__version__}"


def test_ctrl_c_while_the_commands_load_is_one_line(monkeypatch, capsys):
    """A Ctrl-C in the seconds the command modules take to import ended in a traceback."""

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["train", "--out", "x"]) == 130
    assert capsys.readouterr().err == "kinterval: interrupted\n"


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


def test_cli_keeps_the_traceback_of_an_internal_bug(tmp_path, monkeypatch):
    """A ValueError raised inside a library (here numpy) is a bug, not bad input: it propagates."""
    import kinterval.data.commands as commands

    monkeypatch.setattr(commands, "prepare", lambda *a, **k: np.zeros(3).reshape(2))
    with pytest.raises(ValueError, match="cannot reshape"):
        cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "x"), "--quiet"])
    monkeypatch.setattr(commands, "prepare", lambda *a, **k: {}["vocab_size"])
    with pytest.raises(KeyError):
        cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "x"), "--quiet"])


def test_is_input_error_rule(tmp_path):
    """One line only for kinterval's own input checks (a raise statement in a kinterval module)."""
    try:
        kinterval.data.n_blocks(10, 0)
    except ValueError as err:
        assert cli.is_input_error(err)
    try:
        int("not a number")  # a builtin's ValueError raised here, outside kinterval
    except ValueError as err:
        assert not cli.is_input_error(err)
    assert cli.is_input_error(FileNotFoundError("x"))
    assert not cli.is_input_error(TypeError("x"))


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    """--out naming a file (or a path under one) is bad input, not a FileExistsError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        argv = ["data", "prepare", "--source", "synthetic", "--out", str(out), "--tokens", "100", "--quiet"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("kinterval data: error: ") and str(out) in err and "\n" not in err
    assert cli.is_input_error(FileExistsError(17, "File exists", "x"))
    assert not cli.is_input_error(FileExistsError("no file name: not a path the user gave"))


def test_a_file_that_is_a_folder_is_one_line(tmp_path, capsys, monkeypatch):
    """A path that must be a file but is a folder (a run's metrics.jsonl, say) is bad input, not an
    IsADirectoryError traceback; one without a file name is an internal error and keeps its traceback."""
    import kinterval.data.commands as commands

    folder = tmp_path / "metrics.jsonl"
    folder.mkdir()
    monkeypatch.setattr(commands, "prepare", lambda *a, **k: folder.read_text())
    assert (
        cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == f"kinterval data: error: {folder} is a folder (a file is needed there)"
    assert not cli.is_input_error(IsADirectoryError("no file name"))


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C stops a command with one line and the shell's status for SIGINT, not a traceback."""
    import kinterval.data.commands as commands

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "prepare", interrupted)
    assert (
        cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "x"), "--quiet"]) == 130
    )
    assert capsys.readouterr().err == "kinterval data: interrupted\n"


@pytest.mark.parametrize(
    "flags, message", [(["--block-size", "0"], "--block-size must be positive"),
                       (["--reference"], "--reference applies to a bin:DIR source only")],
)  # fmt: skip
def test_prepare_flags_are_checked_before_any_work(tmp_path, capsys, flags, message):
    out = tmp_path / "syn"
    assert cli.main(["data", "prepare", "--source", "synthetic", "--out", str(out), "--quiet", *flags]) == 2
    assert message in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("source", ["text:", "bin:", "text: "])
def test_a_source_with_an_empty_path_is_refused(tmp_path, capsys, monkeypatch, source):
    """``text:`` used to read Path(""), the current directory, and tokenize whatever stray files it held."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stray.txt").write_text("not a corpus\n")
    np.arange(100, dtype="<u2").tofile(tmp_path / "stray.train.bin")
    assert cli.main(["data", "prepare", "--source", source, "--out", "v", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval data: error: ") and "needs a path" in err and "\n" not in err
    assert not (tmp_path / "v").exists()


def test_a_split_without_a_block_is_noted(tmp_path, capsys):
    """One small file: its one document is hashed into one split; the others were empty without a word, and
    evaluation on them was refused later."""
    (tmp_path / "doc.txt").write_text("a short document about nothing in particular. " * 40)
    argv = ["data", "prepare", "--source", f"text:{tmp_path / 'doc.txt'}", "--out", str(tmp_path / "d")]
    assert cli.main([*argv, "--block-size", "32", "--quiet"]) == 0
    out = capsys.readouterr()
    notes = [x for x in out.err.splitlines() if x.startswith("note: the ")]
    assert len(notes) == 2 and all("holds no block of 32+1 tokens (0 tokens)" in x for x in notes), out.err
    assert {x.split()[2] for x in notes} | {"train"} == {"train", "val", "test"}
