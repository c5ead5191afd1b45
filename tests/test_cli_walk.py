"""The command line as a user meets it across commands: bad input is one ``kinterval CMD: error:`` line and
exit 2, and what a command wrote is named."""

from __future__ import annotations

import argparse

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


def test_an_empty_value_is_refused_not_taken_for_the_default(tmp_path, monkeypatch, capsys):
    """``ops --range-grad ""`` printed the range_grad full table, as if the flag were not given."""
    monkeypatch.chdir(tmp_path)
    for argv, name in ((["ops", "--range-grad", ""], "--range-grad"), (["eval", "--run", "r", "--split", " "],
                       "--split"), (["suite", "show", ""], "name")):  # fmt: skip
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"kinterval {argv[0]}: error: argument {name}: an empty value\n"
    assert list(tmp_path.iterdir()) == []


# Every argument that names a file or folder, per command: each must be refused when given as "".
PATH_ARGUMENTS_OF = {
    ("ops",): {"json"},
    ("data", "prepare"): {"bpe_file", "out"},
    ("data", "overlap"): {"json", "against_data", "data"},
    ("train",): {"config", "out", "data"},
    ("eval",): {"run", "out", "data"},
    ("geometry",): {"run", "out", "data"},
    ("graddiag",): {"run", "out", "data"},
    ("sample",): {"run"},
    ("tau-screen",): {"run", "out", "data"},
    ("fp8-backward",): {"config", "data", "json"},
    ("downstream",): {"run", "include_path", "out"},
    ("downstream-compare",): {"json", "baseline", "conditions"},
    ("probes",): {"run", "out"},
    ("probes-compare",): {"json", "reference", "conditions"},
    ("export-hf",): {"run", "out"},
    ("suite", "run"): {"skip_gated", "out", "data"},
    ("suite", "run-one"): {"out"},
    ("suite", "gate"): {"dir"},
    ("suite", "merge"): {"dst", "src"},
    ("report",): {"runs", "dirs", "clean_blocks", "out", "downstream", "nll_from"},
    ("demo",): {"out"},
}


def test_every_path_argument_of_every_command_is_refused_empty():
    """Each command's file and folder arguments (a positional one, one of several values too) given as ""
    are named by empty_argument as empty paths; a path argument missing from cli.PATH_ARGUMENTS would be read
    as the current folder. Every other text argument but --prompt is refused as an empty value (`ops
    --range-grad ""` ran range_grad full)."""
    root = cli.build_parser()
    seen, values, allowed = {}, 0, set()
    for path, parser in _commands(root):
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            continue
        namespace, p = argparse.Namespace(), root
        for name in path[1:]:  # the subcommand choices that lead to this command
            sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
            setattr(namespace, sub.dest, name)
            p = sub.choices[name]
        for action in parser._actions:
            setattr(namespace, action.dest, action.default)
        refused = set()
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            before = getattr(namespace, action.dest)
            setattr(namespace, action.dest, ["a", ""] if action.nargs in ("+", "*") else "")
            said = cli.empty_argument(root, namespace)
            name = "/".join(action.option_strings) or action.dest
            if said == f"argument {name}: an empty path; give a file or folder":
                refused.add(action.dest)
            elif said == f"argument {name}: an empty value":
                values += 1
            elif action.type in (None, str):
                allowed.add(action.dest)
            setattr(namespace, action.dest, before)
        if refused:
            seen[path[1:]] = refused
    assert seen == PATH_ARGUMENTS_OF
    assert allowed == {"prompt"} and values > 50


def _commands(parser, path=("kinterval",)):
    """(command path, parser) of every command and subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_argument_says_what_it_does():
    """--seed, --num-fewshot, --batch-size, run-one's run_id and --out, ... had no help text."""
    missing = [
        f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
        for path, parser in _commands(cli.build_parser())
        if path[1:2] != ("lm-eval",)  # lm-eval's own command line, passed through
        for a in parser._actions
        if not a.help and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    "argv, dest",
    [
        (["eval", "--run", "R"], "quiet"),
        (["data", "prepare", "--source", "synthetic", "--out", "D"], "quiet"),
        (["train", "--out", "R"], "no_progress"),
        (["demo"], "no_progress"),
    ],
)
def test_quiet_and_no_progress_are_one_flag_everywhere(argv, dest):
    """Every command with progress bars takes both spellings, --quiet and --no-progress."""
    parser = cli.build_parser()
    for flag in ("--quiet", "--no-progress"):
        assert getattr(parser.parse_args([*argv, flag]), dest) is True
    assert getattr(parser.parse_args(argv), dest) is False


@pytest.mark.parametrize(
    "argv, dest, want",
    [
        (["ops", "verify", "--K", "4,16"], "K", [4, 16]),
        (["ops", "consistency", "--K", "4", "16,32"], "K", [4, 16, 32]),
        (["ops", "verify", "--K", "4,", "16"], "K", [4, 16]),
        (["tau-screen", "--run", "R", "--K", "4,8"], "K", [4, 8]),
        (["tau-screen", "--run", "R", "--taus", "4,6.5", "8"], "taus", [4.0, 6.5, 8.0]),
        (["ops", "verify", "--K", "4", ",", "16"], "K", [4, 16]),  # a comma of its own: `--K 4 , 16`
        (["ops", "verify", "--K", "4, 16, "], "K", [4, 16]),  # quoted, a space after each comma
    ],
)
def test_number_lists_take_commas_as_the_other_lists_do(argv, dest, want):
    """--operators, --stages and --tasks are comma lists; ``--K 4,16`` was refused (invalid int value)."""
    assert getattr(cli.build_parser().parse_args(argv), dest) == want


@pytest.mark.parametrize("value", ["4,x", "", "4.5"])
def test_a_bad_number_list_is_one_error_line(capsys, value):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["ops", "verify", "--K", value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("kinterval ops: error: argument --K: ")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["suite", "show", "ci", "--only", "nosuch"], "--only ['nosuch'] matches no run of suite ci"),
        (["downstream-compare", "{file}", "{file}"], "a_file is a file, not a folder"),
        (["probes-compare", "{missing}", "{empty}"], "missing is not a `kinterval probes` output"),
    ],
)
def test_the_error_names_what_is_wrong_with_the_first_bad_argument(tmp_path, capsys, argv, says):
    """`suite show --only` of no run printed "0 runs" with exit 0 (`suite run` refuses it); a file given to
    downstream-compare "did not exist"; probes-compare named its second folder when the first was missing."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    paths = {"file": tmp_path / "a_file", "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    assert cli.main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kinterval {argv[0]}: error: ") and says in err and "\n" not in err, err


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["data", "prepare", "--source", "synthetic", "--tokens", "0", "--out", "{tmp}/d"],
            "--tokens must be",
        ),
        (["probes", "--run", "{tmp}", "--batch-size", "0"], "--batch-size must be an integer >= 1"),
    ],
)
def test_a_bad_value_names_the_flag_not_the_python_parameter(tmp_path, capsys, argv, says):
    """A library check's message names its parameter (``batch_size must be ...``); on the command line the
    error names the flag the user typed."""
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kinterval {argv[0]}: error: {says}"), err


def test_only_a_must_message_of_a_known_parameter_is_renamed():
    flags = {"batch_size": "--batch-size"}
    assert (
        cli.input_error_message(ValueError("batch_size must be >= 1"), flags) == "--batch-size must be >= 1"
    )
    assert cli.input_error_message(ValueError("batch_size is odd"), flags) == "batch_size is odd"
    assert cli.input_error_message(ValueError("tokens must be > 0"), flags) == "tokens must be > 0"


def test_an_unknown_argument_is_refused_where_no_command_passes_its_arguments_on(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["ops", "verify", "--no-such-flag"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_a_command_status_is_the_exit_status_and_a_non_system_os_error_keeps_its_traceback():
    """A command returns its own status (a gate that failed: 1); an OSError that is no refusal of the file
    system (a bad file descriptor: a bug) is raised, not printed as one line."""
    import errno
    from types import SimpleNamespace

    assert cli._run(SimpleNamespace(command="x", func=lambda a: 3)) == 3
    assert cli._run(SimpleNamespace(command="x", func=lambda a: None)) == 0

    def bad_fd(args):
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(OSError, match="Bad file descriptor"):
        cli._run(SimpleNamespace(command="x", func=bad_fd))


def test_a_value_error_is_bad_input_only_from_a_raise_statement_of_kinterval():
    """A library's own raise statement (fractions) and a builtin failing inside kinterval on a wrong
    internal value (a format spec, here) are bugs; a message of several lines is printed as one."""
    from fractions import Fraction

    from kinterval.stats.format import num

    for bad in (lambda: Fraction("x"), lambda: num(100.0, digits=-1)):
        with pytest.raises(ValueError) as info:
            bad()
        assert not cli.is_input_error(info.value)
    assert cli.input_error_message(ValueError("first\nsecond")) == "first second"


def test_only_kinterval_warnings_become_one_warning_line(monkeypatch):
    """A UserWarning of another package (torch, transformers) is shown as Python shows it."""
    import io
    import warnings

    python_way = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: python_way.append(str(message)))
    show, out = cli.warning_lines("eval"), io.StringIO()
    show("mine", UserWarning, str(cli.PACKAGE / "atomic.py"), 1, file=out)
    show("theirs", UserWarning, "lib.py", 7, file=out)
    assert out.getvalue() == "kinterval eval: warning: mine\n" and python_way == ["theirs"]


def test_a_bad_number_names_the_kind_expected():
    from kinterval import arglists

    for kind, text in ((int, "4.5"), (float, "x")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^invalid {kind.__name__} value: '{text}'$"):
            arglists.numbers(kind)(text)


def test_an_empty_item_between_commas_is_refused(tmp_path, capsys):
    """`--taus 1,,2` and `sample --prompt-ids 1,,2` dropped the empty item and ran on [1, 2]; a comma at
    either end (`--K 4, 16`) still separates."""
    from kinterval import arglists

    with pytest.raises(argparse.ArgumentTypeError, match="empty item between commas"):
        arglists.numbers(float)("1,,2")
    assert arglists.numbers(int)("4,") == [4] and arglists.numbers(int)(",16") == [16]
    assert cli.main(["sample", "--run", str(tmp_path), "--prompt-ids", "1,,2"]) == 2
    assert "--prompt-ids takes integers" in capsys.readouterr().err


def test_messages_name_what_the_user_gave(tmp_path, capsys):
    """`sample --tokens -3` said max_new_tokens; a config file's bad seed was blamed on --seed (not given);
    an output folder that cannot be made printed Python's '[Errno 2] ...'."""
    cfg = tmp_path / "cfg.toml"
    cfg.write_text('seed = "zero"\n')
    argv = ["train", "--config", str(cfg), "--data", str(tmp_path), "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "seed must be" in err and "--seed" not in err
    assert cli.main(["sample", "--run", str(tmp_path), "--prompt-ids", "1", "--tokens", "-3"]) == 2
    assert "--tokens must be an integer >= 0" in capsys.readouterr().err
    msg = cli.input_error_message(FileNotFoundError(2, "No such file or directory", "/proc/kint"))
    assert msg.startswith("/proc/kint: no such file or folder") and "Errno" not in msg
    assert cli.input_error_message(FileNotFoundError("no meta.json in X")) == "no meta.json in X"
