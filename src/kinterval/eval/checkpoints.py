"""Selecting a run's checkpoints for evaluation; loading one goes through :func:`kinterval.load_run`."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kinterval.train.checkpoint import checkpoint_dir
from kinterval.train.distributed import pick_device
from kinterval.train.load import find_checkpoint, trained_operator

__all__ = ["list_checkpoints", "pick_device", "select_checkpoints", "state_sha256", "trained_operator"]


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (``step_*`` with state.json) of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and (p / "state.json").is_file())


def select_checkpoints(run_dir: str | Path, which: str | int = "all") -> list[Path]:
    """``all``, or one checkpoint as :func:`~kinterval.train.load.find_checkpoint` names it (``latest``, a
    step number or a checkpoint path)."""
    if which != "all":
        if not (isinstance(which, int) or str(which).isdigit() or which == "latest" or Path(which).is_dir()):
            raise ValueError(f"--checkpoint must be all, latest or a step number, got {which!r}")
        return [find_checkpoint(run_dir, which)]
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}: no checkpoints under {checkpoint_dir(run_dir)}")
    return ckpts


def state_sha256(path: str | Path) -> str:
    return hashlib.sha256((Path(path) / "state.json").read_bytes()).hexdigest()
