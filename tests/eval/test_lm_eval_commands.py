"""``kinterval lm-eval ARGS...`` wiring (docs/downstream.md, layer 3): what reaches lm-eval's command line,
the device default, the refused ``--model``/``-M``, lm-eval's exit status and its option errors. lm-eval's
entry point is replaced by a recorder."""

import argparse
import sys

import pytest

pytest.importorskip("lm_eval")
import lm_eval.__main__ as lm_main  # noqa: E402

from kinterval.eval import lm_eval_commands  # noqa: E402


@pytest.fixture
def recorder(monkeypatch):
    seen = []
    monkeypatch.setattr(lm_main, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    return seen


def run(*args):
    return lm_eval_commands._lm_eval(argparse.Namespace(lm_eval_args=list(args)))


def test_the_model_is_set_and_the_device_defaults_to_cpu_without_cuda(recorder):
    argv = sys.argv
    assert run("--tasks", "hellaswag") == 0
    assert sys.argv is argv  # restored
    got = recorder[-1]
    assert got[got.index("--model") + 1] == "kinterval"
    assert got[-6:] == [
        "--tasks",
        "hellaswag",
        "--device",
        "cpu",
        "--include_path",
        str(lm_eval_commands.TASKS_DIR),
    ]


@pytest.mark.parametrize("given", [["--include_path", "mine"], ["--include_path=mine"]])
def test_the_shipped_tasks_folder_is_added_unless_one_is_given(recorder, given):
    """sciq_nosupport (the paper's no-support SciQ) is found by name; lm-eval takes one folder only."""
    assert run("--tasks", "sciq_nosupport", *given) == 0
    got = recorder[-1]
    assert str(lm_eval_commands.TASKS_DIR) not in got and got[-2 - len(given) : -2] == given


@pytest.mark.parametrize("device", [["--device", "cuda:1"], ["--device=cuda:1"]])
def test_a_given_device_is_kept(recorder, device):
    assert run("-t", "hellaswag", *device) == 0  # -t is lm-eval's short --tasks
    got = recorder[-1]
    assert got.count("--device") + sum(a.startswith("--device=") for a in got) == 1
    assert got[-len(device) - 2 : -2] == device


@pytest.mark.parametrize("flag", [["--model", "hf"], ["--model=hf"], ["-M", "hf"]])
def test_another_model_is_refused(recorder, flag):
    with pytest.raises(ValueError, match="sets --model kinterval itself"):
        run(*flag, "--tasks", "hellaswag")
    assert not recorder


@pytest.mark.parametrize("code", [0, 2, 3])
def test_lm_evals_own_exit_status_is_returned(monkeypatch, code):
    def exits():
        raise SystemExit(code)

    monkeypatch.setattr(lm_main, "cli_evaluate", exits)
    assert run("--tasks", "x", "--device", "cpu") == code


@pytest.mark.parametrize("code, status", [(None, 0), ("lm-eval: a message", 1)])
def test_an_exit_without_a_status_is_success_and_an_exit_message_is_printed(
    monkeypatch, capsys, code, status
):
    """sys.exit() is success (the status was 1) and sys.exit("message") prints the message (it was lost)."""

    def exits():
        raise SystemExit(code)

    monkeypatch.setattr(lm_main, "cli_evaluate", exits)
    assert run("--tasks", "x", "--device", "cpu") == status
    assert capsys.readouterr().err == ("" if code is None else code + "\n")


def test_the_device_defaults_to_cuda_when_it_is_available(recorder, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert run("--tasks", "hellaswag") == 0
    argv = recorder[-1]
    assert argv[argv.index("--device") + 1] == "cuda"


def test_an_option_error_of_lm_eval_is_one_named_line_and_other_errors_are_kept(monkeypatch):
    """An error raised by lm-eval's own option checks (in ``lm_eval.config.*``) becomes ``lm-eval: ...``;
    a ValueError from anywhere else keeps its traceback (an internal bug is not an input error)."""
    scope = {"__name__": "lm_eval.config.evaluate_config"}
    exec("def fail():\n    raise ValueError('Tasks not found: nope')", scope)  # a function of that module
    monkeypatch.setattr(lm_main, "cli_evaluate", scope["fail"])
    with pytest.raises(ValueError, match=r"^lm-eval: Tasks not found: nope$"):
        run("--tasks", "nope", "--device", "cpu")

    def elsewhere():
        raise ValueError("a bug")

    monkeypatch.setattr(lm_main, "cli_evaluate", elsewhere)
    with pytest.raises(ValueError, match=r"^a bug$"):
        run("--tasks", "x", "--device", "cpu")


def test_a_task_dataset_out_of_reach_is_one_error_line(monkeypatch, capsys):
    """A Hub task without network (datasets' ConnectionError) was a traceback and exit status 1."""
    from kinterval.cli import main

    def offline():
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(lm_main, "cli_evaluate", offline)
    assert main(["lm-eval", "--tasks", "hellaswag", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval lm-eval: error: lm-eval could not download a task's dataset")
    assert "\n" not in err
    assert "Rowan/hellaswag" in err and "--include_path DIR" in err
