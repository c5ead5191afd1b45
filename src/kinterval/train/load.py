"""``load_run``: the model of a training run's checkpoint, ready for evaluation (the one loader).

Evaluation, probes, the lm-eval adapter, the demo, the τ screen and the exports all load through here:

>>> run = load_run("runs/fwm-prob-k4", checkpoint="latest", device="cuda")
>>> logits, _ = run.model(tokens)

Only safetensors and JSON are read (no pickle), and the weights are checked against the sha256 recorded in
``state.json`` before they are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kinterval.model import GPT, SDPA, ModelConfig, parse_operator
from kinterval.ops import OperatorSpec, resolve_backend
from kinterval.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    read_model_weights,
    read_state,
)
from kinterval.train.config import TrainConfig
from kinterval.train.distributed import pick_device


@dataclass(frozen=True)
class LoadedRun:
    """A checkpoint loaded for evaluation."""

    model: GPT  # in eval mode, on the requested device
    operator: OperatorSpec | str  # the operator the model computes (``"sdpa"`` for PyTorch's softmax)
    config: TrainConfig  # the training config recorded in the checkpoint
    state: dict  # state.json: step, tokens, model config, data and code identity, file hashes
    checkpoint: Path  # the checkpoint folder
    backend: str | None  # the backend that runs the operator on this device in float32 (None for sdpa)

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def trained_operator(self) -> str:
        return trained_operator(self.state)


def trained_operator(state: dict) -> str:
    """The operator (full name, or ``sdpa``) a checkpoint was trained with."""
    op = state.get("operator") or {}
    return op.get("full_name") or state["config"]["operator"]["name"]


def find_checkpoint(path: str | Path, checkpoint: str | int | Path | None = "latest") -> Path:
    """The checkpoint folder that ``path`` (a run folder or a checkpoint folder) and ``checkpoint`` name.

    ``checkpoint``: ``"latest"`` (LATEST, else the highest step), a step number, or a checkpoint path
    (absolute, or relative to the run folder or the working directory: a relative path that names a different
    folder in each is a ``ValueError``). A checkpoint folder given as ``path`` is used as it is, with
    ``"latest"``, its own step or its own path; another step or path there is a ``ValueError``.
    """
    path = Path(path)
    if (path / "state.json").is_file():
        if checkpoint in (None, "latest"):
            return path
        step = read_state(path)["step"]
        if isinstance(checkpoint, int) or str(checkpoint).isdigit():
            if int(checkpoint) == step:
                return path
            asked = f"step {int(checkpoint)}"
        else:  # the same folder, as it is or relative to the run folder (RUN/checkpoints/step_*)
            asked = repr(str(checkpoint))
            for candidate in (Path(checkpoint), path.parent.parent / checkpoint):
                if candidate.is_dir() and candidate.samefile(path):
                    return path
        raise ValueError(
            f"{path} is the checkpoint of step {step}, not checkpoint {asked}; "
            "pass the run folder to choose another checkpoint"
        )
    if checkpoint in (None, "latest"):
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {path} (no {checkpoint_dir(path)}/step_*)")
        return found
    if isinstance(checkpoint, int) or str(checkpoint).isdigit():
        found = list_checkpoints(path)  # by step; a killed re-save's .old-step_* copy included
        named = [p for p in found if checkpoint_step(p) == int(checkpoint)]
        if not named:
            have = [p.name for p in found]
            folder = checkpoint_dir(path) / f"step_{int(checkpoint):06d}"
            why = f": {folder.name} has no state.json (incomplete or damaged)" if folder.is_dir() else ""
            raise FileNotFoundError(f"no checkpoint at step {int(checkpoint)} in {path}{why} (have: {have})")
        return named[0]
    # relative to the run folder, or to the working directory; two different folders are refused, so that
    # `--checkpoint checkpoints/step_N` run from inside another run's folder never loads that run's weights
    found = [c for c in (path / checkpoint, Path(checkpoint)) if (c / "state.json").is_file()]
    if len(found) == 2 and not found[0].samefile(found[1]):
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} names two folders: {found[0]} (in the run folder) and "
            f"{found[1].resolve()} (in the working directory); give an absolute path or a step number"
        )
    if found:
        # another run's checkpoint would be read as this run's (its results written into this run's folder)
        if found[0].resolve().parent != checkpoint_dir(path).resolve():
            raise ValueError(
                f"checkpoint {str(checkpoint)!r} is not one of {path}'s checkpoints (in "
                f"{checkpoint_dir(path)}); give its own run folder, or the checkpoint folder alone"
            )
        return found[0]
    raise FileNotFoundError(f"no checkpoint {str(checkpoint)!r} in {path} (not a checkpoint folder)")


def load_run(
    path: str | Path,
    checkpoint: str | int | Path = "latest",
    device: str | torch.device = "cpu",
    operator: str | OperatorSpec | None = None,
    backend: str = "auto",
) -> LoadedRun:
    """Load a run's checkpoint for evaluation.

    ``path`` is a run folder or a checkpoint folder; ``checkpoint`` is ``"latest"``, a step number or a
    checkpoint path (see :func:`find_checkpoint`). ``device`` may be ``"auto"`` (CUDA when available).
    ``operator`` substitutes another attention operator in the trained weights (e.g. ``"softmax"``), else the
    run's own is used. ``backend`` is ``"auto"`` (:func:`kinterval.ops.resolve_backend`) or an explicit
    backend, which must support the operator on ``device``. ``CheckpointError`` (a ``ValueError``) names a
    corrupt, truncated or malformed checkpoint.
    """
    ckpt = find_checkpoint(path, checkpoint)
    device = pick_device(device)
    state = read_state(ckpt, verify=True)  # an edited state.json could name another operator or model
    try:
        model_config = ModelConfig.from_dict(state["model_config"])
        config = TrainConfig.from_dict(state["config"])
        op = parse_operator(operator if operator is not None else trained_operator(state))
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {ckpt}: state.json lacks or garbles field {err}") from None
    resolved = None if op == SDPA else resolve_backend(op, device, backend=backend)  # explicit: checked here
    weights = read_model_weights(ckpt)
    model = GPT(model_config, op, backend)
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # missing, unexpected or differently shaped tensors
        first = str(err).split("\n\t")[1] if "\n\t" in str(err) else str(err)
        first = first if len(first) <= 200 else first[:200] + " ..."
        raise CheckpointError(
            f"checkpoint {ckpt}: model.safetensors does not match the model that state.json describes "
            f"({first})"
        ) from None
    return LoadedRun(model.to(device).eval(), op, config, state, ckpt, resolved)
