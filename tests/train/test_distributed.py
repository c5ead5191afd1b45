"""torchrun with 2 CPU processes (gloo; DDP and FSDP2) reproduces one process with doubled accumulation."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kinterval.train.checkpoint import latest_checkpoint, load_checkpoint
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics


def run_torchrun(data_dir, out, strategy="ddp", extra=(), env=None):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "kinterval.cli",
        "train",
        "--data",
        str(data_dir),
        "--out",
        str(out),
        "--model",
        "tiny",
        "--set",
        "model.n_embd=32",
        "--block-size",
        "32",
        "--tokens",
        str(32 * 8 * 8),
        "--micro-batch",
        "2",
        "--accum",
        "2",
        "--warmup-tokens",
        "512",
        "--lr",
        "3e-3",
        "--checkpoints",
        "4",
        "--device",
        "cpu",
        "--operator",
        "fwm-prob-k4",
        "--strategy",
        strategy,
        "--no-progress",
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


# the model's attention options (grouped-query heads, sinks, rotary positions): a 1-d parameter per layer
# to shard, and a narrower c_attn
MODEL_OPTIONS = {"model.n_kv_head": 1, "model.attn_sinks": True, "model.rope_theta": 1e4}


@pytest.mark.slow
# plain FSDP2 runs inside each fsdp2+X case (X adds to it; a case of its own took 9 s of CI)
@pytest.mark.parametrize(
    "strategy", ["ddp", "fsdp2+compile", "fsdp2+activation-checkpointing", "fsdp2+model-options"]
)
def test_two_processes_match_one_process(make_config, data_dir, tmp_path, strategy):
    strategy, _, option = strategy.partition("+")
    compiled = option == "compile"
    model_options = MODEL_OPTIONS if option == "model-options" else {}
    flags = [f"--{option}"] if option in ("compile", "activation-checkpointing") else []
    flags += [x for k, v in model_options.items() for x in ("--set", f"{k}={str(v).lower()}")]
    # compiled blocks: dynamo logs its graph break at the eager operator (model/gpt.py), once per rank
    env = {**os.environ, "TORCH_LOGS": "graph_breaks"} if compiled else None
    proc = run_torchrun(data_dir, tmp_path / "ddp", strategy, flags, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("_operator_attention" in proc.stderr) == compiled, proc.stderr[-3000:]
    # One process, accumulation doubled: the same 8 global sequences per step.
    single = make_config(
        **{"operator.name": "fwm-prob-k4", "schedule.micro_batch": 2, "schedule.accum": 4, **model_options}
    )
    train(single, tmp_path / "one")
    a = [r["train_loss"] for r in read_metrics(tmp_path / "ddp")]
    b = [r["train_loss"] for r in read_metrics(tmp_path / "one")]
    assert len(a) == len(b) == 8
    np.testing.assert_allclose(a, b, rtol=1e-6)
    da, db = (
        load_checkpoint(latest_checkpoint(tmp_path / "ddp")),
        load_checkpoint(latest_checkpoint(tmp_path / "one")),
    )
    assert da.state["world_size"] == 2 and da.state["seq_counter"] == db.state["seq_counter"] == 64
    assert da.model.keys() == db.model.keys()
    assert any(k.endswith("attn.sinks") for k in da.model) == bool(model_options)
    for k in db.model:
        torch.testing.assert_close(da.model[k], db.model[k], rtol=1e-5, atol=1e-5)
    run_cfg = json.loads((tmp_path / "ddp" / "run_config.json").read_text())
    assert run_cfg["world_size"] == 2 and run_cfg["plan"]["seqs_per_step"] == 8
    assert run_cfg["config"]["activation_checkpointing"] == (option == "activation-checkpointing")
    assert run_cfg["config"]["compile"] == compiled


def test_pick_device_refuses_a_gpu_index_the_machine_lacks(monkeypatch):
    """`--device cuda:7` on a one-GPU machine passed and failed later with torch's "invalid device ordinal"
    traceback (eval, geometry, graddiag, probes, downstream, lm-eval): a one-line ValueError now."""
    from kinterval.train.distributed import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda:0") == torch.device("cuda:0")
    assert pick_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match="'cuda:7': only 1 CUDA device"):
        pick_device("cuda:7")


def test_a_refusal_on_rank_0_alone_stops_every_rank(data_dir, tmp_path):
    """Rank 0 alone takes the run's lock (and reads its log): when it refused (the folder trained by another
    process), rank 1 trained on into the first gradient all-reduce and died with gloo's "connection closed"
    traceback (under nccl it would wait there). Every rank stops now, rank 1 with one line naming rank 0."""
    import fcntl

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    with open(folder / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.write("pid 1 on another host\n")
        fh.flush()
        proc = run_torchrun(data_dir, tmp_path / "run")
    assert proc.returncode != 0
    assert "is being trained by pid 1 on another host" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 stopped before training" in proc.stderr, proc.stderr[-3000:]
    assert "[rank1]: Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_lock_file_rank_0_cannot_open_stops_every_rank(data_dir, tmp_path):
    """The lock's other refusal: rank 0 cannot open the lock file (an OSError: here a folder in its place, in
    the field a folder it may not write). Only rank 0 opens it, so rank 1 must stop with it, not train on into
    gloo's "connection closed" traceback."""
    (tmp_path / "run" / "checkpoints" / ".lock").mkdir(parents=True)
    proc = run_torchrun(data_dir, tmp_path / "run")
    assert proc.returncode != 0
    assert "rank 0 stopped before training" in proc.stderr, proc.stderr[-3000:]
    assert "[rank1]: Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_corrupt_log_row_on_resume_stops_every_rank(data_dir, tmp_path):
    """Rank 0 alone reads the run's metrics.jsonl when a resume opens its records: a corrupt row there is
    refused on rank 0, and rank 1 must stop with it (one line naming rank 0), not train on into gloo's
    "connection closed" traceback."""
    import shutil

    out = tmp_path / "run"
    assert run_torchrun(data_dir, out).returncode == 0
    shutil.rmtree(latest_checkpoint(out))  # the resume redoes the last stretch
    log = out / "metrics.jsonl"
    log.write_text("{not json\n" + log.read_text())
    proc = run_torchrun(data_dir, out, extra=("--resume",))
    assert proc.returncode != 0
    assert "rank 0 stopped before training" in proc.stderr, proc.stderr[-3000:]
    assert "[rank1]: Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_tensorboard_missing_on_rank_0_stops_every_rank(data_dir, tmp_path):
    """Rank 0 alone opens the metrics log, and with --tensorboard refuses when the tensorboard package is
    missing (here a stand-in package that fails to import): rank 1 must stop with it, not go on into gloo's
    "connection closed" traceback."""
    fake = tmp_path / "site" / "tensorboard"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("no tensorboard here")\n')
    path = os.pathsep.join(x for x in (str(fake.parent), os.environ.get("PYTHONPATH")) if x)
    proc = run_torchrun(
        data_dir, tmp_path / "run", extra=("--tensorboard",), env={**os.environ, "PYTHONPATH": path}
    )
    assert proc.returncode != 0
    assert "log.tensorboard needs the tensorboard package" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 stopped before training" in proc.stderr, proc.stderr[-3000:]
    assert "[rank1]: Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("name", ["mps", "xpu", "meta"])
def test_pick_device_refuses_a_device_kinterval_does_not_run_on(name):
    """``--device mps`` (sample, tau-screen, downstream, probes) was torch's RuntimeError, a traceback."""
    from kinterval.train.distributed import pick_device

    with pytest.raises(ValueError, match=f"device '{name}': kinterval runs on cpu or cuda"):
        pick_device(name)
