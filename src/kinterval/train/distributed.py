"""Process setup (single process or torchrun), model wrapping (DDP / FSDP2) and full state dicts.

Under ``torchrun`` the process group is initialised from the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT): gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from kinterval.model.gpt import compile_blocks


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(name: str | torch.device) -> torch.device:
    """ "auto" (CUDA if available, else CPU), a device name or a ``torch.device``; an unknown name or CUDA
    without a GPU is a ``ValueError``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # mps, xpu, ...: torch names them, kinterval does not run there
        raise ValueError(f"device {str(name)!r}: kinterval runs on cpu or cuda (auto, cpu, cuda or cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(name)!r} requested but CUDA is not available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(name)!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def setup(device_name: str) -> DistInfo:
    """Join the torchrun process group if WORLD_SIZE > 1; pick this process's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(device_name)
    if world <= 1:
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # cuda:N: library calls that take the current device take this one
        return DistInfo(device=device)
    if device.type == "cuda" and device.index is not None:
        raise ValueError(
            f"device {device_name!r} under torchrun: each rank trains on cuda:LOCAL_RANK; pass --device cuda "
            "(and CUDA_VISIBLE_DEVICES to choose the GPUs)"
        )
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        created = True
    return DistInfo(rank, world, local_rank, device, created)


def teardown(info: DistInfo) -> None:
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, info: DistInfo, strategy: str, compile: bool = False) -> torch.nn.Module:
    """DDP or FSDP2 (each block, then the whole) under torchrun; with ``compile``, each block is compiled in
    place first (:func:`kinterval.model.gpt.compile_blocks`), as torchtitan compiles before sharding."""
    if compile:
        compile_blocks(model)
    if not info.distributed:
        return model
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def grad_sync(model: torch.nn.Module, enabled: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of a step."""
    if hasattr(model, "no_sync") and not enabled:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def mean_across(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.distributed:
        value = value.clone()
        _all_reduce_released(value)  # a SUM; released like ``agreed``'s flags (a refusal may follow a log)
        value /= info.world_size
    return value


@contextlib.contextmanager
def agreed(info: DistInfo, catch: tuple[type[Exception], ...] = (ValueError, OSError)):
    """Run a step that only rank 0 takes (it alone holds the run's lock and reads and writes its log) so that
    its refusal (an exception of ``catch``) stops every rank, instead of leaving the others to train on into
    a collective that rank 0 never joins (gloo: a "connection closed" traceback; nccl: a hang). Re-raises the
    error on the rank that had it and raises a ``ValueError`` naming the failed rank(s) on the others; every
    rank must enter it."""
    error = None
    try:
        yield
    except catch as err:
        error = err
    if info.distributed:
        failed = torch.zeros(info.world_size, dtype=torch.int32, device=info.device)
        failed[info.rank] = int(error is not None)
        _all_reduce_released(failed)
        ranks = [str(r) for r in failed.nonzero().flatten().tolist()]
        if error is None and ranks:
            raise ValueError(f"rank {', '.join(ranks)} stopped before training (see its error)")
    if error is not None:
        raise error


# C++ references to a tensor (a private method; without it, only the Python references are watched). Looked
# up on the class: a bound method would itself hold a reference to the tensor it waits on.
_use_count = getattr(torch.Tensor, "_use_count", lambda tensor: 1)


def _all_reduce_released(tensor: torch.Tensor, timeout_s: float = 60.0) -> None:
    """``dist.all_reduce(tensor)``, then on gloo (CPU) wait, the GIL released, until its worker thread has
    dropped its references to ``tensor``.

    ``all_reduce`` returns when gloo's worker marks the work done, but the worker frees the work (and so its
    references to the tensor) only afterwards. While C++ shares a tensor, torch holds a reference to its
    Python object, and the worker's last release drops that reference: it needs the GIL, however long
    Python itself keeps the tensor. A refusal's teardown can free the process group with the GIL held (the
    DDP model's reducer, freed with the refusal's traceback, owns it), and ``~ProcessGroupGloo`` joins the
    worker: both would wait forever (seen under a loaded CPU)."""
    held = sys.getrefcount(tensor)  # this frame's references, before the collective shares the tensor
    dist.all_reduce(tensor)
    if tensor.device.type != "cpu":
        return
    deadline = time.monotonic() + timeout_s
    while (_use_count(tensor) > 1 or sys.getrefcount(tensor) > held) and time.monotonic() < deadline:
        time.sleep(0.001)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state dicts on CPU, keyed by parameter name (all ranks must call)."""
    return get_model_state_dict(model, options=_FULL), get_optimizer_state_dict(
        model, optimizer, options=_FULL
    )


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, msd: dict, osd: dict) -> None:
    opts = StateDictOptions(full_state_dict=True, strict=True)
    set_model_state_dict(model, msd, options=opts)
    set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
