"""Checkpoints: safetensors for every tensor, plain JSON for everything else, written atomically.

Layout of ``RUN/checkpoints/step_{step:06d}/``::

    model.safetensors      model weights (the tied lm_head.weight is stored once, as transformer.wte.weight)
    optimizer.safetensors  AdamW moments and step counters, flattened to "state.<param>.<name>" keys
    rng.safetensors        torch CPU / CUDA generator states and numpy's MT19937 key
    state.json             step, tokens, sequence counter, full config, model config, data identity, code
                           identity, optimizer structure, python/numpy RNG scalars, sha256 of every file above

``RUN/checkpoints/LATEST`` names the newest complete checkpoint. A checkpoint is built in a ``.tmp-*`` folder
and renamed into place, so a kill never leaves a half-written ``step_*`` folder. Loading reads safetensors and
JSON only: no pickle, no code execution.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FORMAT = "kinterval-checkpoint"
FORMAT_VERSION = 1
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
TIED = ("lm_head.weight", "transformer.wte.weight")  # (dropped key, the key it equals)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, truncated, wrong format or wrong config)."""


@dataclass
class Checkpoint:
    path: Path
    state: dict  # state.json
    model: dict[str, torch.Tensor]
    optimizer: dict  # nested optimizer state dict, tensors restored
    rng: dict  # {"tensors": {...}, "json": {...}}


# ---------------------------------------------------------------------- code identity
def ops_sha256() -> str:
    """SHA-256 over the operator source files (relative path + bytes, sorted): the frozen-code hash."""
    root = Path(__file__).resolve().parents[1] / "ops"
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def code_identity() -> dict:
    import kinterval

    return {
        "version": kinterval.__version__,
        "git_commit": git_commit(),
        "ops_sha256": ops_sha256(),
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------- RNG
def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (the legacy global state)
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.uint32).view(np.int32).copy())
    version, pystate, gauss = random.getstate()
    meta = {
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
        "python": [version, list(pystate), gauss],
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted(k for k in tensors if k.startswith("torch_cuda_"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda][: torch.cuda.device_count()])
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["numpy_keys"].numpy().view(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    version, pystate, gauss = meta["python"]
    random.setstate((version, tuple(pystate), gauss))


# ---------------------------------------------------------------------- nested state <-> flat tensors
def flatten_state(obj, prefix: str = "", tensors: dict | None = None):
    """Replace every tensor of a nested dict/list by ``{"__tensor__": key}``; return (structure, tensors)."""
    tensors = {} if tensors is None else tensors
    if isinstance(obj, torch.Tensor):
        key = prefix.rstrip(".")
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}, tensors
    if isinstance(obj, dict):
        int_keys = bool(obj) and all(isinstance(k, int) for k in obj)
        items = {str(k): flatten_state(v, f"{prefix}{k}.", tensors)[0] for k, v in obj.items()}
        return ({"__int_keys__": items} if int_keys else items), tensors
    if isinstance(obj, (list, tuple)):
        return [flatten_state(v, f"{prefix}{i}.", tensors)[0] for i, v in enumerate(obj)], tensors
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj, tensors
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a checkpoint")


def unflatten_state(obj, tensors: dict[str, torch.Tensor]):
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__int_keys__"}:
            return {int(k): unflatten_state(v, tensors) for k, v in obj["__int_keys__"].items()}
        return {k: unflatten_state(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


# ---------------------------------------------------------------------- save / load
def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: str | Path, step: int, model_state: dict, optim_state: dict, state: dict
) -> Path:
    """Write ``step_{step:06d}`` atomically and point LATEST at it. ``state`` holds the JSON metadata."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final, tmp = root / name, root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    model_tensors = {k: v.detach().cpu().contiguous() for k, v in model_state.items() if k != TIED[0]}
    optim_struct, optim_tensors = flatten_state(optim_state)
    rng_tensors, rng_meta = capture_rng()
    save_file(model_tensors, tmp / "model.safetensors", metadata={"format": FORMAT})
    save_file(optim_tensors, tmp / "optimizer.safetensors", metadata={"format": FORMAT})
    save_file(rng_tensors, tmp / "rng.safetensors", metadata={"format": FORMAT})
    state = dict(
        state,
        format=FORMAT,
        format_version=FORMAT_VERSION,
        optimizer_structure=optim_struct,
        rng=rng_meta,
        files={f: _sha256(tmp / f) for f in FILES},
    )
    (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    for f in (*FILES, "state.json"):
        with open(tmp / f, "rb") as fh:
            os.fsync(fh.fileno())

    if final.exists():  # re-saving the same step (e.g. after a resume): swap, then drop the old one
        old = root / f".old-{name}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    latest_tmp = root / "LATEST.tmp"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / "LATEST")
    _fsync_dir(root)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint named by LATEST (else the highest ``step_*``), or None when the run has none."""
    root = checkpoint_dir(run_dir)
    latest = root / "LATEST"
    if latest.is_file():
        path = root / latest.read_text().strip()
        if path.is_dir():
            return path
    steps = sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []
    return steps[-1] if steps else None


def read_state(path: str | Path) -> dict:
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {path}: state.json is missing (not a checkpoint, or incomplete)")
    try:
        state = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt ({err})") from None
    if state.get("format") != FORMAT or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: unknown format {state.get('format')!r} "
            f"v{state.get('format_version')!r}, expected {FORMAT} v{FORMAT_VERSION}"
        )
    return state


def load_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Read a checkpoint folder; with ``verify`` every file's sha256 is checked against state.json."""
    path = Path(path)
    state = read_state(path)
    tensors = {}
    for f in FILES:
        fp = path / f
        if not fp.is_file():
            raise CheckpointError(f"checkpoint {path}: {f} is missing")
        if verify and _sha256(fp) != state["files"].get(f):
            raise CheckpointError(
                f"checkpoint {path}: {f} is corrupt or truncated (sha256 differs from state.json)"
            )
        try:
            tensors[f] = load_file(fp)
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path}: {f} is unreadable ({err})") from None
    model = tensors["model.safetensors"]
    if TIED[1] in model:
        model[TIED[0]] = model[TIED[1]]
    optimizer = unflatten_state(state["optimizer_structure"], tensors["optimizer.safetensors"])
    return Checkpoint(
        path, state, model, optimizer, {"tensors": tensors["rng.safetensors"], "json": state["rng"]}
    )


# ---------------------------------------------------------------------- config matching
def config_differences(saved: dict, requested: dict) -> list[str]:
    """``field: saved -> requested`` for every differing flattened field."""
    from kinterval.train.config import flatten

    a, b = flatten(saved), flatten(requested)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


# ---------------------------------------------------------------------- model weights only (eval, export)
def read_model_weights(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint (the tied ``lm_head.weight`` restored), after checking
    ``model.safetensors`` against the sha256 that ``state.json`` records; ``CheckpointError`` names the file
    when it is missing, truncated, corrupt or unrecorded."""
    path = Path(ckpt_dir)
    state = read_state(path)
    name = "model.safetensors"
    weights = path / name
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {path}: {name} is missing")
    recorded = (state.get("files") or {}).get(name)
    if not recorded:
        raise CheckpointError(f"checkpoint {path}: state.json records no sha256 for {name}")
    if _sha256(weights) != recorded:
        raise CheckpointError(
            f"checkpoint {path}: {name} is corrupt or truncated (sha256 differs from state.json)"
        )
    try:
        tensors = load_file(weights)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: {name} is unreadable ({err})") from None
    if TIED[1] in tensors:
        tensors[TIED[0]] = tensors[TIED[1]]
    return tensors
