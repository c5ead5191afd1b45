"""A refusal through ``distributed.agreed`` on 2 gloo ranks, then the teardown the CLI does (the process group
destroyed, the refusal's traceback and with it the DDP model freed), many times over: none may hang.

Freeing the DDP model frees its reducer, which owns the process group, with the GIL held, and
``~ProcessGroupGloo`` joins gloo's worker threads. Were a worker still freeing the flag tensor's all-reduce
then, it would wait for the GIL to drop its reference to the tensor's Python object: both threads wait
forever. Before the fix a few cycles hung with high odds on a loaded CPU."""

import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from kinterval.train import distributed as D

RANK = """
import os

import torch
import torch.distributed as dist

from kinterval.train.distributed import DistInfo, agreed, mean_across

rank, cycles = int(os.environ["RANK"]), int(os.environ["CYCLES"])
store = dist.TCPStore("127.0.0.1", int(os.environ["PORT"]), 2, rank == 0)


def cycle(i):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"cycle{i}", store), rank=rank, world_size=2)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # freed with the traceback
        assert mean_across(torch.tensor(float(rank)), DistInfo(rank, 2)).item() == 0.5  # a logged loss first
        with agreed(DistInfo(rank, 2)):
            if rank == 0:
                raise ValueError("refused")
    finally:
        dist.destroy_process_group()


for i in range(cycles):
    try:
        cycle(i)
    except ValueError as err:  # as kinterval.cli: the traceback, and with it the DDP model, is freed here
        print(f"cycle {i}: {err}", flush=True)
print("done", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refusal_teardown_never_hangs(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port, cycles = free_port(), 12
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**os.environ, "RANK": str(rank), "PORT": str(port), "CYCLES": str(cycles)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=150)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outs = [proc.communicate()[0] for proc in procs]
        raise AssertionError("a rank hung in the refusal's teardown:\n" + "\n---\n".join(outs)) from None
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-3000:]
        assert out.count("cycle ") == cycles and out.rstrip().endswith("done"), out[-3000:]
    assert "cycle 0: refused" in outs[0] and "cycle 0: rank 0 stopped before training" in outs[1], outs


@pytest.mark.parametrize("use_count", ["torch", "fallback"])
def test_the_release_wait_returns_at_once(tmp_path, monkeypatch, use_count):
    """The wait after gloo's all-reduce ends as soon as the worker lets go, with torch's ``_use_count`` and
    with the fallback for a torch without it (Python references only); it is no fixed 60 s sleep."""
    if use_count == "fallback":
        monkeypatch.setattr(D, "_use_count", lambda tensor: 1)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        for _ in range(3):
            value = torch.tensor([1.0, 2.0])
            start = time.monotonic()
            D._all_reduce_released(value, timeout_s=30.0)
            assert time.monotonic() - start < 10.0
            assert value.tolist() == [1.0, 2.0]
    finally:
        dist.destroy_process_group()
