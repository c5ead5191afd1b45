"""Finding a run's checkpoints and loading a model from one (safetensors + JSON only, no optimizer state)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from kinterval.model import GPT, ModelConfig, resolve_backend
from kinterval.train.checkpoint import TIED, CheckpointError, checkpoint_dir, read_state


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (``step_*`` with state.json) of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and (p / "state.json").is_file())


def select_checkpoints(run_dir: str | Path, which: str | int = "all") -> list[Path]:
    """``all``, ``latest`` or a step number."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}: no checkpoints under {checkpoint_dir(run_dir)}")
    if which == "all":
        return ckpts
    if which == "latest":
        return ckpts[-1:]
    try:
        step = int(which)
    except (TypeError, ValueError):
        raise ValueError(f"--checkpoint must be all, latest or a step number, got {which!r}") from None
    match = [p for p in ckpts if int(read_state(p)["step"]) == step]
    if not match:
        steps = [int(p.name.removeprefix("step_")) for p in ckpts]
        raise ValueError(f"{run_dir}: no checkpoint at step {step} (steps: {steps})")
    return match


def trained_operator(state: dict) -> str:
    """The operator (full name, or ``sdpa``) a checkpoint was trained with."""
    op = state.get("operator") or {}
    return op.get("full_name") or state["config"]["operator"]["name"]


def state_sha256(path: str | Path) -> str:
    return hashlib.sha256((Path(path) / "state.json").read_bytes()).hexdigest()


def load_model(
    path: str | Path,
    *,
    operator: str | None = None,
    device: str | torch.device = "cpu",
    backend: str | None = None,
) -> tuple[GPT, dict]:
    """(model, state) of checkpoint ``path`` in eval mode, through its own operator or ``operator``."""
    path = Path(path)
    state = read_state(path)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {path}: model.safetensors is missing")
    tensors = load_file(weights)
    if TIED[1] in tensors:
        tensors[TIED[0]] = tensors[TIED[1]]
    backend = backend or state["config"]["operator"].get("backend", "auto")
    backend = resolve_backend(backend, device)
    model = GPT(ModelConfig.from_dict(state["model_config"]), operator or trained_operator(state), backend)
    model.load_state_dict(tensors)
    return model.to(device).eval(), state


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
