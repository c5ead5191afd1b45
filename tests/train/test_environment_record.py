"""``RUN/environment.jsonl``: the machine each training session ran on (docs/training.md), one line per
session from the step it started at; a resume from an earlier checkpoint drops the lines it redoes."""

import datetime
import importlib.metadata
import json
import platform
import shutil

import pytest
import torch

from kill_hook import Killed, kill_at
from kinterval.environment import ENVIRONMENT_FILE, environment, read_environment
from kinterval.train.loop import train

FIELDS = {
    "step",
    "time",
    "train_s",
    "device",
    "device_name",
    "cpu_threads",
    "processes",
    "torch",
    "cuda",
    "triton",
    "python",
    "host",
}


def starts(run):
    return [row["step"] for row in read_environment(run / ENVIRONMENT_FILE)]


def test_each_session_appends_its_environment_and_a_resume_drops_what_it_redoes(make_config, tmp_path):
    cfg = make_config()  # 8 steps, checkpoints after steps 2, 4, 6, 8
    run = tmp_path / "run"
    with pytest.raises(Killed):
        train(cfg, run, on_step=kill_at(5))  # last checkpoint: step 4
    (row,) = read_environment(run / ENVIRONMENT_FILE)
    assert set(row) == FIELDS and row["step"] == 0
    assert row["device"] == "cpu" and row["device_name"] and row["processes"] == 1
    assert row["cpu_threads"] == torch.get_num_threads()  # the train tests' conftest: 1
    assert row["torch"] == torch.__version__ and row["cuda"] == torch.version.cuda
    assert row["python"] == platform.python_version() and row["host"] == platform.node()
    assert datetime.datetime.fromisoformat(row["time"]).utcoffset() == datetime.timedelta(0)

    with pytest.raises(Killed):
        train(cfg, run, resume=True, on_step=kill_at(7))  # resumes at 4, last checkpoint: step 6
    assert starts(run) == [0, 4]
    assert read_environment(run / ENVIRONMENT_FILE)[0] == row  # the earlier session's line is kept as it was
    # the second session starts with the training time the checkpoint at step 4 saved
    saved = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())["train_s"]
    assert (
        row["train_s"] == 0 and read_environment(run / ENVIRONMENT_FILE)[1]["train_s"] == round(saved, 3) > 0
    )

    # back to the checkpoint at step 4: the session that started there is redone, its line replaced
    shutil.rmtree(run / "checkpoints" / "step_000006")
    (run / "checkpoints" / "LATEST").write_text("step_000004\n")
    assert train(cfg, run, resume=True).status == "completed"
    assert starts(run) == [0, 4]
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temporary file left behind

    assert train(cfg, run, resume=True).resumed_finished  # a finished run: nothing trained, nothing added
    assert starts(run) == [0, 4]


def test_environment_without_triton_says_none(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == "triton":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    env = environment(torch.device("cpu"), 2)
    assert env["triton"] is None and env["processes"] == 2 and env["device"] == "cpu"


def test_a_damaged_environment_line_is_refused(tmp_path):
    path = tmp_path / ENVIRONMENT_FILE
    path.write_text('{"step": 0}\n{"step": "4"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_environment(path)
    assert read_environment(tmp_path / "absent.jsonl") == []


def test_a_resume_over_a_damaged_record_says_how_to_go_on(make_config, tmp_path):
    cfg = make_config()
    run = tmp_path / "run"
    with pytest.raises(Killed):
        train(cfg, run, on_step=kill_at(3))  # last checkpoint: step 2
    (run / ENVIRONMENT_FILE).write_text('{"step": 0}\n{"step": \n')
    with pytest.raises(
        ValueError, match=r"line 2: not a session record .*; fix or delete that line to go on"
    ):
        train(cfg, run, resume=True)
    (run / ENVIRONMENT_FILE).unlink()
    assert train(cfg, run, resume=True).status == "completed"
    assert starts(run) == [2]  # this session's line; the ones before were deleted


def test_blank_lines_are_skipped_and_a_bool_step_is_refused(tmp_path):
    path = tmp_path / ENVIRONMENT_FILE
    path.write_text('{"step": 0}\n\n  \n{"step": 8}\n')
    assert [r["step"] for r in read_environment(path)] == [0, 8]
    path.write_text('{"step": 0}\n{"step": true}\n')
    with pytest.raises(ValueError, match="line 2: not a session record"):
        read_environment(path)


def test_the_cpu_model_comes_from_proc_cpuinfo(monkeypatch, tmp_path):
    """platform.processor() is "" on many Linux machines: the CPU was recorded as "x86_64"."""
    from kinterval import environment as E

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core\n")
    monkeypatch.setattr(E, "CPUINFO", str(info))
    assert E.device_name(torch.device("cpu")) == "AMD EPYC 7763 64-Core"
    info.write_text("processor\t: 0\n")  # no model name: what the platform module knows
    monkeypatch.setattr(E.platform, "processor", lambda: "")
    assert E.device_name(torch.device("cpu")) == E.platform.machine()
