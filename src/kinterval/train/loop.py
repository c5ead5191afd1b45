"""The training loop: ``train(cfg, out, resume=...)``, read top to bottom.

The run's state lives in a :class:`~kinterval.train.trainer.Trainer`; this loop only says in which order its
steps, logs, checkpoints and validation happen (see docs/training.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import torch

from kinterval import atomic
from kinterval.model import train_precision
from kinterval.train import distributed as D
from kinterval.train.checkpoint import checkpoint_dir
from kinterval.train.config import TrainConfig
from kinterval.train.trainer import (  # noqa: F401 (re-exported: the public names of this module)
    EXECUTION_FIELDS,
    EXIT_NONFINITE,
    StepStats,
    Trainer,
    TrainResult,
    accumulate_gradients,
    check_fits,
    clip_gradients,
    data_identity,
    device_memory,
    identity,
)

StepHook = Callable[[int, torch.nn.Module], None]  # (completed steps, model) after each step


def train(
    cfg: TrainConfig, out: str | Path, *, resume: bool = False, on_step: StepHook | None = None
) -> TrainResult:
    """Train (or with ``resume``, continue) the run in folder ``out``; see docs/training.md."""
    cfg.validate()
    info = D.setup(cfg.device)
    try:
        with deterministic(info.device):
            trainer = Trainer(cfg, out, info)
            return run(trainer, resume, on_step)
    finally:
        D.teardown(info)


def run(trainer: Trainer, resume: bool, on_step: StepHook | None = None) -> TrainResult:
    """Drive ``trainer`` from its current step to the end of its plan."""
    with contextlib.ExitStack() as stack:
        # rank 0 takes the lock for the job: its refusal, or a lock file it cannot make or open (an OSError:
        # a folder it may not write, a folder in its place), stops every rank
        with D.agreed(trainer.info):
            stack.enter_context(run_lock(trainer.out, trainer.info.is_main))
        return _run(trainer, resume, on_step)


def _run(trainer: Trainer, resume: bool, on_step: StepHook | None) -> TrainResult:
    cfg, plan = trainer.cfg, trainer.plan
    if resume:
        trainer.resume()
        if trainer.finished:  # nothing to redo: the run's records stay as they are
            return trainer.finish()
    else:
        trainer.start()
    with D.agreed(trainer.info):  # rank 0 alone reads and rewrites the log (a corrupt row is refused there)
        trainer.open_records()
    trainer.model.train()
    try:
        with train_precision(trainer.model_cfg.numerics):
            for _ in range(trainer.done, plan.steps):
                stats = trainer.step()
                if not stats.finite:
                    return trainer.stop_nonfinite(stats)
                if stats.step % cfg.log.every == 0 or stats.step == plan.steps:
                    trainer.log_step(stats)
                # Validate before saving: a kill between the two then redoes the row from the previous
                # checkpoint. Validation draws no random numbers and changes nothing that a checkpoint keeps.
                if cfg.log.eval_every and (stats.step % cfg.log.eval_every == 0 or stats.step == plan.steps):
                    trainer.validate()
                if stats.step in plan.checkpoint_steps:
                    trainer.save()
                if on_step is not None:
                    on_step(stats.step, trainer.model)
    finally:
        trainer.close()
    return trainer.finish()


@contextlib.contextmanager
def deterministic(device: torch.device, *, required: bool = False):
    """On CUDA, request deterministic algorithms for the run (restored afterwards), unless the environment
    sets ``KINTERVAL_DETERMINISTIC=0``: the paper's formal runs did not use them (App. F), which changes
    float rounding only. An environment switch, not a config field: it never blocks a resume.

    ``required``: on any device and whatever the environment says (the gradient diagnostic, App. F: "used
    deterministic algorithms"). ``warn_only=True`` (an op without a deterministic implementation warns)
    unless the caller already asked for the strict mode. On exit the caller's flags come back, ``warn_only``
    included, and ``CUBLAS_WORKSPACE_CONFIG`` (set on CUDA when unset) is removed again."""
    flag = os.environ.get("KINTERVAL_DETERMINISTIC", "1")
    if flag not in ("0", "1"):
        raise ValueError(f"KINTERVAL_DETERMINISTIC must be 0 or 1, got {flag!r}")
    old = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        if required or (device.type == "cuda" and flag == "1"):
            if device.type == "cuda":  # cuBLAS's deterministic workspace (read when its handle is made)
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=old[1] if old[0] else True)
        yield
    finally:
        torch.use_deterministic_algorithms(old[0], warn_only=old[1])
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


LOCK = ".lock"  # in the checkpoints folder: not a result file, never merged or gated


@contextlib.contextmanager
def run_lock(out: Path, is_main: bool = True):
    """One process trains a run folder at a time. A second ``train`` of the same folder (a suite rerun while
    the children of a killed ``--gpus`` parent still train, a command started twice) would pass the
    no-checkpoint check beside the first and both would write the same checkpoints and logs
    (:func:`kinterval.atomic.exclusive`: a killed run leaves no stale lock)."""
    if not is_main:  # rank 0 writes the folder; the other ranks of a torchrun job share its lock
        yield
        return
    busy = f"{out} is being trained by {{who}}: wait for it to finish or stop it, then resume"
    with atomic.exclusive(checkpoint_dir(out) / LOCK, busy):
        yield
