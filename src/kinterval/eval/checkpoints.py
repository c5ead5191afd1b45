"""Selecting a run's checkpoints for evaluation; loading one goes through :func:`kinterval.load_run`."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kinterval.data.loader import TokenShards
from kinterval.train.checkpoint import checkpoint_dir, checkpoint_step, list_checkpoints, trained_data_dir
from kinterval.train.distributed import pick_device
from kinterval.train.load import find_checkpoint, trained_operator

__all__ = [
    "checkpoint_name",
    "evaluation_split",
    "list_checkpoints",
    "pick_device",
    "select_checkpoints",
    "state_file_sha256",
    "trained_operator",
]


def checkpoint_name(ckpt: str | Path) -> str:
    """``step_NNNNNN``: the name results of checkpoint ``ckpt`` are filed under, also for the ``.old-step_*``
    copy that stands for a step whose re-save was killed (so that its results are not hidden files)."""
    step = checkpoint_step(ckpt)
    return Path(ckpt).name if step is None else f"step_{step:06d}"


def select_checkpoints(run_dir: str | Path, which: str | int | Path = "all") -> list[Path]:
    """``all`` (training's :func:`~kinterval.train.checkpoint.list_checkpoints`: by step, a step whose re-save
    was killed by its ``.old-step_*`` copy; for a checkpoint folder given as ``run_dir``, that one), or one
    checkpoint as
    :func:`~kinterval.train.load.find_checkpoint` names it (``latest``, a step number or a checkpoint path,
    absolute or relative to the run folder)."""
    if which != "all" or (Path(run_dir) / "state.json").is_file():  # a checkpoint folder: all is that one
        return [find_checkpoint(run_dir, "latest" if which == "all" else which)]
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}: no checkpoints under {checkpoint_dir(run_dir)}")
    return ckpts


def run_folder(run: str | Path) -> Path:
    """The run folder of a ``--run`` argument: itself, or for a checkpoint folder (``RUN/checkpoints/
    step_N``, which ``--run`` also takes) its run, where every measurement's own output goes by default
    (``RUN/eval``, ``RUN/diagnostics``, ``RUN/probes``, ``RUN/downstream``), never inside a checkpoint."""
    run = Path(run)
    return run.parent.parent if (run / "state.json").is_file() else run


def state_file_sha256(path: str | Path) -> str:
    """SHA-256 of checkpoint ``path``'s state.json file, byte for byte (what evaluations record as
    ``checkpoint_state_sha256``); not ``train.checkpoint.state_sha256``, the hash of its content that
    state.json carries."""
    return hashlib.sha256((Path(path) / "state.json").read_bytes()).hexdigest()


def evaluation_split(data: str | Path | None, split: str, state: dict, ckpt: str | Path) -> TokenShards:
    """The split every evaluation command reads: of ``data``, or without it of the folder the checkpoint was
    trained on (:func:`~kinterval.train.checkpoint.trained_data_dir`, checked against its training data); data
    of another tokenizer than the training data's, a shard whose bytes are not those meta.json lists (its
    sha256: a result is stored and reused under those hashes), or a split without one block, is a
    ``ValueError``."""
    shards = TokenShards(data if data is not None else trained_data_dir(state, ckpt), split, verify=True)
    shards.check_matches(state)
    shards.require_blocks(int(state["model_config"]["block_size"]))
    return shards
