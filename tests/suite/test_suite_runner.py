"""The suite runner: a required data folder, several runs per GPU, and honest Slurm submission."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import types

import pytest

from kinterval.cli import main
from kinterval.data.prepare import prepare
from kinterval.suite import runner
from kinterval.suite.definition import load_suite
from kinterval.suite.gate import gate
from kinterval.suite.manifest import read_manifest
from kinterval.suite.runner import init_suite, run_suite, submit_slurm

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("suite_runner")

TINY = """
name = "tiny"
protocol = "{protocol}"
seeds = [1]
checkpoints = 1
[overrides]
"model.n_layer" = 1
"model.n_head" = 2
"model.n_embd" = 32
"model.block_size" = 32
"schedule.tokens" = 1024
"schedule.warmup_tokens" = 256
"schedule.micro_batch" = 8
"schedule.accum" = 1
"operator.backend" = "closed_form"
[eval]
split = "val"
[[group]]
operators = ["softmax", "lerp-k4"]
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("runner") / "data"
    prepare("synthetic", out, tokens=20_000, seed=0, progress=False)
    return out


def suite_file(tmp_path, protocol="tiny-cpu"):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("{protocol}", protocol))
    return path


def test_mini_needs_a_prepared_data_folder(tmp_path, capsys):
    assert main(["suite", "run", "mini", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data" in err[0] and "kinterval data prepare --source" in err[0]
    assert main(["suite", "run", "mini", "--out", str(tmp_path / "m"), "--data", str(tmp_path)]) == 2
    assert "not a prepared data folder" in capsys.readouterr().err


def test_mini_is_portable_with_a_prepared_folder(tmp_path, data):
    m = init_suite("mini", tmp_path / "m", data)
    assert m["n_runs"] == 9 and m["data_dir"] == str(data.resolve())
    ops = {r["operator"] for r in m["runs"]}
    assert {"lerp-k32", "lerp-k32[range_grad=detach]", "fwm-prob-k4[arithmetic=historical]"} <= ops
    assert all(r["config"]["model"]["n_embd"] == 384 for r in m["runs"])


@pytest.mark.slow
def test_two_runs_share_one_gpu_slot_each_and_both_complete(tmp_path, data):
    """--gpus 1 --per-gpu 2: both child processes start before either finishes (order of the log)."""
    logs = []
    out = tmp_path / "out"
    res = run_suite(suite_file(tmp_path), out, data=data, gpus=1, per_gpu=2, log=logs.append)
    assert res == {"softmax-s1": "completed", "lerp-k4-s1": "completed"}
    events = [line for line in logs if "started on GPU" in line or line.endswith(": completed")]
    assert [("started" in e) for e in events] == [True, True, False, False], logs
    m = read_manifest(out)
    for r in m["runs"]:
        status = json.loads((out / r["run_dir"] / "status.json").read_text())
        assert status["status"] == "completed"
        assert (out / r["eval_dir"] / f"step_{r['checkpoint_steps'][-1]:06d}.json").is_file()
    assert main(["suite", "gate", str(out)]) == 0


class FakeProc:
    def __init__(self, cmd, env, stdout, stderr):
        self.args, self.gpu, self.polls, self.returncode = cmd, env["CUDA_VISIBLE_DEVICES"], 0, None
        FakeProc.live.append(self)
        FakeProc.peak = max(FakeProc.peak, sum(p.gpu == self.gpu for p in FakeProc.live))

    def poll(self):
        self.polls += 1
        if self.polls >= 2:
            self.returncode = 0
            FakeProc.live.remove(self)
        return self.returncode


def test_per_gpu_caps_each_gpu(tmp_path, monkeypatch):
    FakeProc.live, FakeProc.peak = [], 0
    monkeypatch.setattr(runner.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    logs = []
    res = runner._run_gpus(tmp_path, [f"r{i}" for i in range(7)], 2, logs.append, per_gpu=3)
    assert set(res.values()) == {"completed"} and len(res) == 7
    assert FakeProc.peak == 3  # never more than 3 on one GPU
    first = [line for line in logs if "started" in line][:6]
    assert sorted(line.split()[-3] for line in first) == ["0", "0", "0", "1", "1", "1"]


def test_a_failed_child_run_is_reported_failed(tmp_path, monkeypatch):
    """Exit 1 is a failed run; exit 3 (run-one's for a non-finite loss, as `kinterval train`'s) stopped."""
    codes = {"r1": 1, "r2": 3, "r3": 2}

    class Failing(FakeProc):
        def poll(self):
            code = super().poll()
            if code is not None:
                self.returncode = codes.get(self.args[-1], 0)
            return self.returncode

    FakeProc.live, FakeProc.peak = [], 0
    monkeypatch.setattr(runner.subprocess, "Popen", Failing)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    res = runner._run_gpus(tmp_path, ["r0", "r1", "r2", "r3"], 1, lambda line: None)
    assert res == {
        "r0": "completed",
        "r1": "failed (exit 1)",
        "r2": "nonfinite_loss",
        "r3": "failed (exit 2)",
    }


class FakeExecutor:
    def __init__(self):
        self.params, self.submitted = {}, []

    def update_parameters(self, **kw):
        self.params.update(kw)

    def batch(self):
        import contextlib

        return contextlib.nullcontext()

    def submit(self, fn, *args, **kwargs):
        self.submitted.append(args)
        self.kwargs = kwargs
        return types.SimpleNamespace(job_id=str(100 + len(self.submitted)))


@pytest.mark.parametrize(("protocol", "gpu"), [("tiny-cpu", False), ("124m-100m", True)])
def test_slurm_requests_a_gpu_only_for_gpu_protocols(tmp_path, data, protocol, gpu):
    out = tmp_path / "out"
    init_suite(suite_file(tmp_path, protocol), out, data)
    ex = FakeExecutor()
    res = submit_slurm(out, ["softmax-s1", "lerp-k4-s1"], {"partition": "p", "time": None}, print, ex)
    assert res == {"softmax-s1": "submitted (slurm job 101)", "lerp-k4-s1": "submitted (slurm job 102)"}
    assert ("gpus_per_node" in ex.params) == gpu and ex.params["partition"] == "p" and "time" not in ex.params


def test_slurm_cli_counts_submitted_not_ok(tmp_path, data, monkeypatch, capsys):
    monkeypatch.setattr(runner, "_slurm_executor", lambda out: FakeExecutor())
    argv = ["suite", "run", str(suite_file(tmp_path)), "--out", str(tmp_path / "o"), "--data", str(data)]
    assert main([*argv, "--slurm"]) == 0
    out = capsys.readouterr().out
    assert "2 runs submitted to Slurm, 0 finished yet" in out and "runs ok" not in out


def test_gpus_children_get_device_and_threads(tmp_path, data, monkeypatch):
    """--device and --threads were dropped with --gpus: the child `suite run-one` command had neither."""
    from kinterval.cli import build_parser

    FakeProc.live, FakeProc.peak = [], 0
    cmds, popen = [], runner.subprocess.Popen  # the real one for other commands (git of code_identity)

    def fake(cmd, **kw):
        if "run-one" not in cmd:
            return popen(cmd, **kw)
        cmds.append(cmd)
        return FakeProc(cmd, **kw)

    monkeypatch.setattr(runner.subprocess, "Popen", fake)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    out = tmp_path / "out"
    res = run_suite(suite_file(tmp_path), out, data=data, gpus=1, device="cpu", threads=1, log=print)
    assert set(res) == {"softmax-s1", "lerp-k4-s1"} and len(cmds) == 2
    for cmd in cmds:
        assert cmd[1:3] == ["-m", "kinterval"]
        args = build_parser().parse_args(cmd[3:])  # the child's own command line
        assert (args.func.__name__, args.out, args.device, args.threads) == ("_run_one", str(out), "cpu", 1)
        assert args.run_id in res


def test_slurm_jobs_get_device_and_threads(tmp_path, data, monkeypatch):
    """Slurm jobs called run_one(out, rid) without the device; --device cpu asks Slurm for no GPU."""
    ex = FakeExecutor()
    monkeypatch.setattr(runner, "_slurm_executor", lambda out: ex)
    out = tmp_path / "out"
    suite = suite_file(tmp_path, "124m-100m")  # a GPU protocol, run on the CPU by --device
    run_suite(suite, out, data=data, slurm=True, device="cpu", threads=2, log=print)
    assert len(ex.submitted) == 2 and ex.kwargs == {"device": "cpu", "threads": 2}
    assert "gpus_per_node" not in ex.params


def test_run_one_checks_threads_and_device(tmp_path, capsys):
    assert main(["suite", "run-one", "--out", str(tmp_path), "--threads", "0", "r"]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err
    assert main(["suite", "run-one", "--out", str(tmp_path), "--threads", "1000000", "r"]) == 2  # segfaulted
    assert "--threads must be at most" in capsys.readouterr().err
    assert main(["suite", "run-one", "--out", str(tmp_path), "--device", "tpu", "r"]) == 2
    assert "--device must be one of" in capsys.readouterr().err


FAKE_SBATCH = """#!/bin/sh
# records its arguments and the script it was given (the last one), then answers as sbatch does
echo "$@" >> "$SBATCH_LOG"
for a; do last=$a; done
cp "$last" "$SBATCH_LOG.script"
echo "Submitted batch job 4242"
"""


def test_slurm_submission_through_submitit_with_a_fake_sbatch(tmp_path, data, monkeypatch, capsys):
    """The CLI's --slurm through the real submitit (the slurm extra; the others use a fake executor) against
    an sbatch that only records: one job array, a GPU per job for a GPU protocol, the partition and time the
    command line gives, and each run's job id read back from sbatch's answer."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit only looks for it
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_LOG", str(tmp_path / "sbatch.log"))
    out = tmp_path / "out"
    argv = ["suite", "run", str(suite_file(tmp_path, "124m-100m")), "--out", str(out), "--data", str(data)]
    assert main([*argv, "--slurm", "--slurm-partition", "gpu", "--slurm-time", "90"]) == 0
    printed = capsys.readouterr().out
    assert (
        "softmax-s1: submitted (slurm job 4242_" in printed
        and "lerp-k4-s1: submitted (slurm job 4242_" in printed
    )
    assert len((tmp_path / "sbatch.log").read_text().splitlines()) == 1  # one submission: the array
    script = (tmp_path / "sbatch.log.script").read_text()
    for line in ("--array=0-1", "--gpus-per-node=1", "--partition=gpu", "--time=90", "--job-name=kinterval",
                 "--nodes=1", "--ntasks-per-node=1"):  # fmt: skip
        assert f"#SBATCH {line}" in script, line


def test_slurm_without_slurm_is_an_error_not_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", types.SimpleNamespace(SlurmExecutor=None))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match=r"no Slurm on this machine \(sbatch and srun not found\)"):
        runner._slurm_executor(tmp_path)
    # submitit's executor refuses a machine without srun (a RuntimeError of its own): named here first
    monkeypatch.setattr("shutil.which", lambda name: None if name == "srun" else f"/usr/bin/{name}")
    with pytest.raises(ValueError, match=r"no Slurm on this machine \(srun not found\)"):
        runner._slurm_executor(tmp_path)


@pytest.mark.parametrize(
    "flags, message",
    [(["--gpus", "-1"], "--gpus must be"), (["--per-gpu", "0"], "--per-gpu must be"),
     (["--per-gpu", "2"], "needs --gpus N"),
     (["--threads", "0"], "--threads must be"), (["--device", "tpu"], "--device must be one of"),
     (["--only", "nothing*"], "matches no run"), (["--slurm"], "--slurm needs submitit")],
)  # fmt: skip
def test_run_flags_are_checked_before_the_folder_is_made(tmp_path, capsys, monkeypatch, flags, message):
    """--gpus -1 and --threads 0 were taken silently; a bad --device or --only failed after preparing data;
    --slurm without submitit wrote the manifest first."""
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    out = tmp_path / "o"
    assert main(["suite", "run", str(suite_file(tmp_path)), "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_gate_max_errors_must_not_be_negative(tmp_path, capsys):
    assert main(["suite", "gate", str(tmp_path), "--max-errors", "-1"]) == 2
    assert "--max-errors must be >= 0" in capsys.readouterr().err


def test_run_complete_needs_completed_status_and_every_checkpoint(tmp_path):
    """A stopped run, or a completed one missing a checkpoint, is trained (resumed) again."""
    from kinterval.suite.runner import run_complete

    entry = {"checkpoint_steps": [4, 8]}
    for step in (4, 8):
        (tmp_path / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step:06d}" / "state.json").write_text("{}")
    (tmp_path / "status.json").write_text(json.dumps({"status": "stopped"}))
    assert not run_complete(tmp_path, entry)
    (tmp_path / "status.json").write_text(json.dumps({"status": "completed"}))
    assert run_complete(tmp_path, entry)
    (tmp_path / "checkpoints" / "step_000008" / "state.json").unlink()
    assert not run_complete(tmp_path, entry)


def test_an_interrupted_run_resumes_and_a_fresh_one_does_not(tmp_path, data, monkeypatch):
    """run_one passes resume=True to train() only when the run folder holds a checkpoint."""
    from kinterval.suite.runner import run_one

    calls = []

    def fake_train(cfg, run_dir, *, resume):
        calls.append(resume)
        return types.SimpleNamespace(status="stopped")  # not completed: run_one stops before evaluating

    monkeypatch.setattr("kinterval.train.loop.train", fake_train)
    out = tmp_path / "out"
    init_suite(suite_file(tmp_path), out, data)
    ckpts = out / "runs" / "softmax-s1" / "checkpoints"
    assert run_one(out, "softmax-s1", log=print) == "stopped"  # fresh folder
    ckpts.mkdir(parents=True)
    run_one(out, "softmax-s1", log=print)  # an empty checkpoints folder: nothing to resume from
    (ckpts / "step_000004").mkdir()
    (ckpts / "step_000004" / "state.json").write_text("{}")
    run_one(out, "softmax-s1", log=print)  # a partial run: one checkpoint, status not completed
    assert calls == [False, False, True]


def test_a_cpu_protocol_is_evaluated_on_the_cpu_on_a_gpu_machine(tmp_path, data, monkeypatch):
    """Evaluation and the geometry probe run where the run trains: a CPU protocol (tiny-cpu, the ci suite's)
    on a machine with CUDA was trained on the CPU but evaluated under "auto", i.e. on the GPU in bf16
    autocast, so the same suite recorded other numbers there; --device still overrides both."""
    import torch

    from kinterval.suite.runner import run_one

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "run_complete", lambda run_dir, entry: "train" in seen)

    def fake_train(cfg, run_dir, *, resume):
        seen["train"] = cfg.device
        return types.SimpleNamespace(status="completed")

    def fake_eval(run_dir, **kw):
        seen["eval"] = kw["device"]
        return [{"skipped": False, "mean_nll": 1.0}]

    def fake_diag(run_dir, kind, **kw):
        seen["geometry"] = kw["device"]
        assert kw["replace_other"] is True  # the suite's own probe: a user's probe of other blocks goes

    monkeypatch.setattr("kinterval.train.loop.train", fake_train)
    monkeypatch.setattr("kinterval.eval.evaluate.evaluate_run", fake_eval)
    monkeypatch.setattr("kinterval.eval.diagnostics.diagnose_run", fake_diag)
    out = tmp_path / "out"
    init_suite(suite_file(tmp_path), out, data)
    m = read_manifest(out)
    m["eval"]["geometry"] = True
    (out / "manifest.json").write_text(json.dumps(m))
    assert m["runs"][0]["config"]["device"] == "cpu"  # tiny-cpu
    run_one(out, "softmax-s1", log=print)
    assert seen == {"train": "cpu", "eval": "cpu", "geometry": "cpu"}
    seen.clear()
    run_one(out, "softmax-s1", device="cuda", log=print)
    assert seen == {"train": "cuda", "eval": "cuda", "geometry": "cuda"}


def test_a_suite_folder_resumed_without_data_keeps_its_data_code_and_suite(tmp_path, data):
    """A resume without --data uses the manifest's data folder and keeps the code identity the suite
    started with (another commit of the same operator code; other operator code is refused, below); a
    folder of another suite is refused."""
    from kinterval.train.checkpoint import ops_sha256

    out = tmp_path / "out"
    first = init_suite(suite_file(tmp_path), out, data)
    m = read_manifest(out)
    started = {"ops_sha256": ops_sha256(), "git_commit": "started-here"}  # same operator code, other commit
    m["code"] = started
    (out / "manifest.json").write_text(json.dumps(m))
    again = init_suite(suite_file(tmp_path), out)  # no data: TINY has no [data] source of its own
    assert again["data_dir"] == first["data_dir"] == str(data.resolve())
    assert again["code"] == started
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace('name = "tiny"', 'name = "other"').replace("{protocol}", "tiny-cpu"))
    with pytest.raises(ValueError, match="holds suite tiny, not other"):
        init_suite(other, out, data)


def test_gpus_needs_that_many_cuda_devices_unless_the_runs_train_on_the_cpu(tmp_path, capsys, monkeypatch):
    """--gpus 1 without CUDA started a child "on GPU 0" that trained a GPU protocol on the CPU, unnoticed."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    out = tmp_path / "o"
    argv = ["suite", "run", str(suite_file(tmp_path, "124m-100m")), "--out", str(out), "--gpus", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpus 1: 0 CUDA device(s) visible" in err[0] and not out.exists()
    runner.check_gpus(2, [], "cpu")  # --device cpu: processes share the CPU
    runner.check_gpus(2, load_suite(suite_file(tmp_path)).runs, None)  # a CPU protocol (tiny-cpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    runner.check_gpus(2, load_suite(suite_file(tmp_path, "124m-100m")).runs, None)
    with pytest.raises(ValueError, match="--gpus 3: 2 CUDA device"):
        runner.check_gpus(3, load_suite(suite_file(tmp_path, "124m-100m")).runs, None)


# ---------------------------------------------------------------------- audit of the runner (2026-11-27)
def test_gpus_map_through_the_callers_cuda_visible_devices(tmp_path, monkeypatch):
    """The children got CUDA_VISIBLE_DEVICES=0 and 1 whatever the caller's mask: the GPUs it had excluded."""
    FakeProc.live, FakeProc.peak = [], 0
    seen = []
    monkeypatch.setattr(
        runner.subprocess, "Popen", lambda *a, **kw: seen.append(FakeProc(*a, **kw)) or seen[-1]
    )
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5")
    runner._run_gpus(tmp_path, ["a", "b", "c"], 2, lambda *_: None)
    assert sorted(p.gpu for p in seen) == ["4", "4", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert runner._device_id(1) == "1"


def test_a_rerun_with_other_data_or_another_suite_version_is_refused(tmp_path, data):
    """A finished suite rerun with another --data was reported cached and ok, its evaluations redone on the
    other data (the old ones overwritten); an edited suite file likewise. Now both stop before any file."""
    out = tmp_path / "out"
    assert set(run_suite(suite_file(tmp_path), out, data=data, log=lambda *_: None).values()) == {"completed"}
    evals = {p: p.read_bytes() for p in out.glob("runs/*/eval/val/*")}
    manifest = (out / "manifest.json").read_bytes()
    other = tmp_path / "other-data"
    prepare("synthetic", other, tokens=20_000, seed=1, progress=False)
    with pytest.raises(ValueError, match="trained on other train data than .*other-data holds"):
        run_suite(suite_file(tmp_path), out, data=other, log=lambda *_: None)
    edited = tmp_path / "edited" / "tiny.toml"
    edited.parent.mkdir()
    edited.write_text(
        suite_file(tmp_path).read_text().replace('warmup_tokens" = 256', 'warmup_tokens" = 512')
    )
    with pytest.raises(ValueError, match="another version of suite tiny \\(runs differ\\)") as err:
        run_suite(edited, out, data=data, log=lambda *_: None)
    assert "to add conditions, put them in a suite file of their own" in str(err.value)
    assert {p: p.read_bytes() for p in out.glob("runs/*/eval/val/*")} == evals
    assert (out / "manifest.json").read_bytes() == manifest
    moved = tmp_path / "moved-data"  # the same data in another folder is fine
    data_copy = shutil.copytree(data, moved)
    res = run_suite(suite_file(tmp_path), out, data=data_copy, log=lambda *_: None)
    assert set(res.values()) == {"completed"}
    # ... and passes the gate: its checkpoints and evaluations name the old folder, their hashes the data
    assert gate(out, write_record=False).errors == []


def test_a_rerun_on_other_training_data_or_with_a_stray_evaluation_is_refused_and_says_which(tmp_path, data):
    """Only the evaluations' data was held: a data folder with the same val split but another train split
    (or a suite killed before its first evaluation) was taken, and the next runs trained on it. And one
    evaluation made by hand on other data blamed the suite's own data folder."""
    out = tmp_path / "out"
    assert set(run_suite(suite_file(tmp_path), out, data=data, log=lambda *_: None).values()) == {"completed"}
    manifest = (out / "manifest.json").read_bytes()
    other = tmp_path / "other-train"
    shutil.copytree(data, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["splits"]["train"]["shards"][0]["sha256"] = "0" * 64  # other train data by its recorded content
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"softmax-s1 was trained on other train data than .*other-train"):
        run_suite(suite_file(tmp_path), out, data=other, log=lambda *_: None)
    assert (out / "manifest.json").read_bytes() == manifest
    stray = sorted(out.glob("runs/*/eval/val/step_*.json"))[0]
    summary = json.loads(stray.read_text())
    summary["request"]["shards_sha256"] = ["0" * 64]
    stray.write_text(json.dumps(summary))
    n = len(list(out.glob("runs/*/eval/val/step_*.json")))
    with pytest.raises(ValueError, match=rf"1 of {n} evaluations record other val data .*delete them"):
        run_suite(suite_file(tmp_path), out, data=data, log=lambda *_: None)


def test_a_finished_run_missing_a_checkpoint_is_not_reported_completed(tmp_path, data):
    """A deleted intermediate checkpoint: the run was resumed, said completed, and the suite said ok."""
    text = suite_file(tmp_path).read_text().replace("checkpoints = 1", "checkpoints = 2")
    path = tmp_path / "two.toml"
    path.write_text(text.replace('operators = ["softmax", "lerp-k4"]', 'operators = ["softmax"]'))
    out = tmp_path / "out"
    assert run_suite(path, out, data=data, log=lambda *_: None) == {"softmax-s1": "completed"}
    first = sorted((out / "runs" / "softmax-s1" / "checkpoints").glob("step_*"))[0]
    shutil.rmtree(first)
    logs = []
    assert runner.run_one(out, "softmax-s1", log=logs.append) == "missing_checkpoints"
    assert f"checkpoints [{int(first.name[5:])}] of the manifest are missing" in logs[-1]


def test_a_run_that_raises_does_not_stop_a_sequential_suite(tmp_path, data, monkeypatch):
    """Sequentially, the first run that raised (out of memory, a kernel error) ended the whole suite: the
    runs after it never started. Now it is a failed run, as a child process under --gpus is, with its
    traceback in logs/<run>.log, and the next run goes on."""
    ran = []

    def fake_run_one(out, rid, device=None, log=print):
        ran.append(rid)
        if rid.startswith("softmax"):
            raise RuntimeError("CUDA out of memory")
        return "completed"

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    logs = []
    out = tmp_path / "out"
    res = run_suite(suite_file(tmp_path), out, data=data, log=logs.append)
    assert ran == ["softmax-s1", "lerp-k4-s1"]
    assert res == {"softmax-s1": "failed (RuntimeError: CUDA out of memory)", "lerp-k4-s1": "completed"}
    assert "RuntimeError: CUDA out of memory" in (out / "logs" / "softmax-s1.log").read_text()
    assert any("softmax-s1: failed" in line and "softmax-s1.log" in line for line in logs)
    assert main(["suite", "run", str(suite_file(tmp_path)), "--out", str(out), "--data", str(data)]) == 1


def test_an_unreadable_status_json_is_not_complete(tmp_path):
    from kinterval.suite.runner import run_complete

    (tmp_path / "checkpoints" / "step_000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004" / "state.json").write_text("{}")
    for status in (b"garbage", b"[1, 2]", b"", b"\xff\xfe"):
        (tmp_path / "status.json").write_bytes(status)
        assert not run_complete(tmp_path, {"checkpoint_steps": [4]})


def test_a_corrupt_status_json_is_resumed_not_failed(tmp_path, data):
    """run_complete parsed status.json unguarded: the suite failed the run on every attempt (JSONDecodeError)
    while `kinterval train --resume` rewrites it. Now the run resumes from its final checkpoint."""
    path = tmp_path / "one.toml"
    path.write_text(suite_file(tmp_path).read_text().replace('["softmax", "lerp-k4"]', '["softmax"]'))
    out = tmp_path / "out"
    assert run_suite(path, out, data=data, log=lambda *_: None) == {"softmax-s1": "completed"}
    (out / "runs" / "softmax-s1" / "status.json").write_text("garbage")
    logs = []
    assert run_suite(path, out, data=data, log=logs.append) == {"softmax-s1": "completed"}
    assert any(line.startswith("softmax-s1: resumed") for line in logs), logs
    assert json.loads((out / "runs" / "softmax-s1" / "status.json").read_text())["status"] == "completed"


def test_a_suite_folder_of_other_operator_code_is_refused(tmp_path, data, monkeypatch):
    """`suite run` on a folder begun by other operator code (another kinterval version) trained and evaluated
    into it, reported ok, and the gate then failed every new checkpoint and evaluation ("code identity
    differs from the manifest's"). Now the run and run-one refuse it, naming the commit to continue from."""
    from kinterval.train import checkpoint

    out = tmp_path / "out"
    init_suite(suite_file(tmp_path), out, data)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(checkpoint, "ops_sha256", lambda: "f" * 64)
    with pytest.raises(ValueError, match=r"other operator code .* checkout's \(ffffffffffff\)"):
        run_suite(suite_file(tmp_path), out, data=data, log=lambda *_: None)
    with pytest.raises(ValueError, match="continue it from the commit its manifest names"):
        runner.run_one(out, "softmax-s1", log=lambda *_: None)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_gpu_protocol_without_cuda_is_refused_unless_device_cpu_says_so(monkeypatch):
    """`suite run D` on a machine without CUDA started 124M runs on the CPU (its protocol's device is
    "auto") without a word; they would take days. It is refused unless --device cpu says it is meant."""
    import torch

    from kinterval.suite.definition import load_suite
    from kinterval.suite.runner import check_auto_has_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"no CUDA device here.*device 'auto'.*pass --device cpu to mean it"):
        check_auto_has_gpu(load_suite("D").runs[:2], None)
    check_auto_has_gpu(load_suite("D").runs[:2], "cpu")  # said so
    check_auto_has_gpu(load_suite("ci").runs, None)  # a CPU protocol (tiny-cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_auto_has_gpu(load_suite("mini").runs, None)


def test_suite_run_refuses_a_gpu_protocol_without_cuda_but_slurm_submits_it(tmp_path, data, monkeypatch):
    """`suite run` of a GPU protocol (device "auto") on a machine without CUDA is refused before any run
    starts; with --slurm the jobs go to GPU nodes (the submitting machine needs no CUDA) and are submitted."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    suite = suite_file(tmp_path, "124m-100m")
    with pytest.raises(ValueError, match=r"no CUDA device here"):
        run_suite(suite, tmp_path / "out", data=data, log=print)
    assert not (tmp_path / "out").exists()  # refused before the manifest is written or data prepared
    with pytest.raises(ValueError, match=r"needs --data DIR"):  # a missing --data is still named first
        run_suite(suite, tmp_path / "out", log=print)
    ex = FakeExecutor()
    monkeypatch.setattr(runner, "_slurm_executor", lambda out: ex)
    run_suite(suite, tmp_path / "slurm", data=data, slurm=True, log=print)
    assert len(ex.submitted) == 2 and "gpus_per_node" in ex.params


def test_suite_run_resumed_without_data_takes_the_manifests_data_folder(tmp_path, data, monkeypatch):
    """The --data check before the manifest is written must let a resume without --data through when the
    folder's manifest names its data (the suite has no [data] source of its own)."""
    monkeypatch.setattr(runner, "_slurm_executor", lambda out: FakeExecutor())
    suite = suite_file(tmp_path, "124m-100m")
    run_suite(suite, tmp_path / "out", data=data, slurm=True, log=print)
    run_suite(suite, tmp_path / "out", slurm=True, log=print)  # no --data: the manifest's
    assert read_manifest(tmp_path / "out")["data_dir"] == str(data.resolve())
    with pytest.raises(ValueError, match=r"needs --data DIR"):  # a fresh folder still needs it
        run_suite(suite, tmp_path / "fresh", slurm=True, log=print)


def test_a_paper_suite_on_another_corpus_is_warned_of(tmp_path, data, capsys):
    """Suite D is WikiText-103 (App. C.1): a --data folder prepared from another source trained and was
    reported as WikiText-103 without a word (only the run's train_data said synthetic). Every paper suite
    names the source of its corpus; a suite for any corpus (mini) warns of nothing."""
    from kinterval.suite.runner import corpus_note

    sources = {"A": "fineweb-edu", "B": "fineweb-edu", "C": "wikitext103", "D": "wikitext103"}
    for name, source in {**sources, "supplementary": "wikitext103"}.items():
        assert load_suite(name).corpus_source == source
    note = corpus_note(load_suite("D"), data)
    assert "WikiText-103" in note and "--source wikitext103" in note and "'synthetic'" in note
    assert corpus_note(load_suite("mini"), data) is None
    meta = json.loads((data / "meta.json").read_text())
    same = tmp_path / "wt"
    shutil.copytree(data, same)
    (same / "meta.json").write_text(json.dumps({**meta, "source": "wikitext103"}))
    assert corpus_note(load_suite("D"), same) is None
    runner.prepare_data(load_suite("D"), tmp_path / "out", data)
    assert "kinterval suite: warning: suite D's corpus is WikiText-103" in capsys.readouterr().err


def test_a_suite_prepares_a_text_data_source_and_refuses_a_seed_for_it(tmp_path):
    """The runner passed [data] seed (default 0) to every prepare, which refuses a seed for any source but
    synthetic: a suite on text: data stopped before it prepared anything. A seed there is refused at load."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"d{i}.txt").write_text(f"document {i} says something about attention and softmax.\n")
    body = (
        'name = "t"\nprotocol = "tiny-cpu"\nseeds = [1]\ncheckpoints = 1\n'
        f'[data]\nsource = "text:{docs}"\n{{seed}}[[group]]\noperators = ["softmax"]\n'
    )
    (tmp_path / "t.toml").write_text(body.format(seed=""))
    data = runner.prepare_data(load_suite(tmp_path / "t.toml"), tmp_path / "out", None)
    assert json.loads((data / "meta.json").read_text())["source"] == f"text:{docs}"
    (tmp_path / "t.toml").write_text(body.format(seed="seed = 3\n"))
    with pytest.raises(ValueError, match=r"\[data\]: seed applies to the synthetic source only"):
        load_suite(tmp_path / "t.toml")


def test_an_interrupted_gpus_sitting_stops_its_children(tmp_path, monkeypatch):
    """A SIGINT sent to the `suite run --gpus N` process alone (`kill -INT`, a scheduler) ended it with
    "interrupted" and left its run-one children training with no parent, holding their GPUs; the folder's
    lock went with the parent. The children now get SIGINT too (and stop as on Ctrl-C), or SIGKILL after
    the grace period, and the parent re-raises once they are gone."""
    import subprocess
    import sys
    import time

    real, real_sleep = subprocess.Popen, time.sleep
    started = []
    child = (  # says when it is inside its try (a SIGINT during start-up would be another test)
        "import pathlib, sys, time\n"
        "try:\n    pathlib.Path(sys.argv[1]).touch()\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    sys.exit(130)\n"
        "sys.exit(0)\n"
    )

    def popen(cmd, **kw):
        # a child that ignores SIGINT is killed after the grace period; the other takes it as Python does
        # by default (set here: a pytest-xdist worker ignores SIGINT, and its children inherit that)
        handler = "signal.SIG_IGN" if cmd[-1] == "stubborn" else "signal.default_int_handler"
        code = f"import signal; signal.signal(signal.SIGINT, {handler})\n" + child
        ready = tmp_path / f"{cmd[-1]}.ready"
        proc = real([sys.executable, "-c", code, str(ready), cmd[-1]], stdout=kw.get("stdout"),
                    stderr=kw.get("stderr"))  # fmt: skip
        started.append(proc)
        return proc

    class Interrupt:
        sent, deadline = False, time.monotonic() + 120

        def __call__(self, seconds):
            ready = len(started) == 2 and all(
                (tmp_path / f"{n}.ready").exists() for n in ("polite", "stubborn")
            )
            if not Interrupt.sent and ready:  # both children running: Ctrl-C here
                Interrupt.sent = True
                raise KeyboardInterrupt
            assert time.monotonic() < Interrupt.deadline, "the children never started"
            return real_sleep(min(seconds, 0.05))

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    monkeypatch.setattr(runner.time, "sleep", Interrupt())
    stop = runner._stop_children
    monkeypatch.setattr(runner, "_stop_children", lambda running, log: stop(running, log, grace=3.0))
    logs = []
    with pytest.raises(KeyboardInterrupt):
        runner._run_gpus(tmp_path, ["polite", "stubborn", "never"], 2, logs.append)
    assert [p.args[-1] for p in started] == ["polite", "stubborn"]  # the third never started
    assert all(p.poll() is not None for p in started)  # none left running
    assert started[0].returncode == 130 and started[1].returncode == -9
    assert (
        "polite: interrupted (SIGINT)" in logs and "stubborn: still running 3 s after SIGINT: killed" in logs
    )


@pytest.mark.parametrize(
    ("edit", "says"), [("tokens = 20_000", "tokens 20000 (now 30000)"), ("", "seed 0 (now 1)")]
)
def test_an_edited_data_section_is_refused_in_a_folder_that_has_run(tmp_path, edit, says):
    """The suite's own [data] (no --data) edited after a run: the folder's data stayed as prepared, every
    run was "cached, ok", and the manifest embedded the edited file, so it named data that no run used.
    A suite's own data folder that is gone is prepared again, where a resume said "--data ... is not a
    prepared data folder" (no --data was given) and pointed at a command that made other data."""
    from tiny_suite import tiny_suite

    group = '[[group]]\nname = "softmax"\noperators = ["softmax"]\n'
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_suite(group))
    out = tmp_path / "out"
    init_suite(path, out)
    before = (out / "manifest.json").read_text()
    changed = "tokens = 30_000" if edit else "tokens = 20_000\nseed = 1"
    path.write_text(tiny_suite(group).replace("tokens = 20_000", changed))
    with pytest.raises(
        ValueError, match=re.escape(f"prepared from another [data] section of suite tiny: {says}")
    ):
        init_suite(path, out)
    assert (out / "manifest.json").read_text() == before  # nothing written
    path.write_text(tiny_suite(group))
    shutil.rmtree(out / "data")
    init_suite(path, out)  # the same [data], prepared again
    assert json.loads((out / "data" / "meta.json").read_text())["params"]["tokens"] == 20_000
