"""Checkpoints: safetensors for every tensor, plain JSON for everything else, written atomically.

Layout of ``RUN/checkpoints/step_{step:06d}/``::

    model.safetensors      model weights (the tied lm_head.weight is stored once, as transformer.wte.weight)
    optimizer.safetensors  AdamW moments and step counters, flattened to "state.<param>.<name>" keys
    rng.safetensors        torch CPU / CUDA generator states and numpy's MT19937 key
    state.json             step, tokens, sequence counter, full config, model config, data identity, code
                           identity, optimizer structure, python/numpy RNG scalars, sha256 of every file above

``RUN/checkpoints/LATEST`` names the newest complete checkpoint (only a ``step_NNNNNN`` name inside the same
folder is followed; an unreadable LATEST falls back to the newest ``step_*`` folder). A checkpoint is built
in a ``.tmp-*`` folder, fsynced and renamed into place, so a kill never leaves a half-written ``step_*``
folder; a re-saved step moves the old copy aside to ``.old-step_*`` first, and readers take that copy while
the new one is not yet in place. Loading reads safetensors and JSON only: no pickle, no code execution.
``state.json`` carries the sha256 of its own content (``state_sha256``); its step must match the folder name
and the optimizer's step counters.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kinterval import atomic

FORMAT = "kinterval-checkpoint"
FORMAT_VERSION = 1
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
TIED = ("lm_head.weight", "transformer.wte.weight")  # (dropped key, the key it equals)
STEP_NAME = re.compile(r"step_(\d{6,})")  # a checkpoint folder; LATEST may name nothing else
OLD_PREFIX = ".old-"  # a re-saved step's previous copy, while the new one is renamed in


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
    """The commit of the kinterval checkout this code runs from, or None: not a git checkout, or an installed
    package that merely lies inside another repository (a user's project with its ``.venv``), whose commit
    says nothing about this code."""
    package = Path(__file__).resolve().parents[1]  # .../src/kinterval in a checkout
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=package,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split("\n")
    if len(lines) < 2 or Path(lines[0]).resolve() / "src" / "kinterval" != package:
        return None
    return lines[1].strip() or None


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
    cuda = sorted((k for k in tensors if k.startswith("torch_cuda_")), key=lambda k: int(k.rsplit("_", 1)[1]))
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


def state_sha256(state: dict) -> str:
    """SHA-256 of a state.json's content without its own ``state_sha256`` field (canonical JSON)."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


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


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.save_file``; its I/O failure (a ``SafetensorError`` naming no file) as an ``OSError``
    naming ``path``."""
    try:
        save_file(tensors, path, metadata={"format": FORMAT})
    except SafetensorError as err:
        code = re.search(r"os error (\d+)", str(err))
        code = int(code[1]) if code else errno.EIO
        raise OSError(
            code, os.strerror(code) if f"os error {code}" in str(err) else str(err), str(path)
        ) from err


def _write_files(tmp: Path, model_state: dict, optim_state: dict, state: dict, step: int) -> dict:
    """Write a checkpoint's files into the folder ``tmp``, fsynced; return its state.json content."""
    model_tensors = {k: v.detach().cpu().contiguous() for k, v in model_state.items() if k != TIED[0]}
    optim_struct, optim_tensors = flatten_state(optim_state)
    rng_tensors, rng_meta = capture_rng()
    _save_tensors(model_tensors, tmp / "model.safetensors")
    _save_tensors(optim_tensors, tmp / "optimizer.safetensors")
    _save_tensors(rng_tensors, tmp / "rng.safetensors")
    state = dict(
        state,
        step=step,
        format=FORMAT,
        format_version=FORMAT_VERSION,
        optimizer_structure=optim_struct,
        rng=rng_meta,
        files={f: _sha256(tmp / f) for f in FILES},
    )
    state["state_sha256"] = state_sha256(state)
    with atomic.naming(tmp / "state.json"):
        (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    for f in (*FILES, "state.json"):
        _fsync_file(tmp / f)
    _fsync_dir(tmp)  # the folder's entries are durable before it is renamed into place
    return state


def save_checkpoint(
    run_dir: str | Path, step: int, model_state: dict, optim_state: dict, state: dict
) -> Path:
    """Write ``step_{step:06d}`` atomically and point LATEST at it. ``state`` holds the JSON metadata."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final, tmp, old = root / name, root / f".tmp-{name}", root / f"{OLD_PREFIX}{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:  # a failed write (a full disk) leaves no partial folder taking the space; the old checkpoints stay
        state = _write_files(tmp, model_state, optim_state, state, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if final.exists():  # re-saving a step: move the old copy aside (readers use it meanwhile), swap, drop it
        if old.exists():  # left by a kill in an earlier swap, and superseded by ``final``
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    atomic.write_text(root / "LATEST", name + "\n")  # fsynced; a Ctrl-C leaves no temporary file
    _fsync_dir(root)
    return final


def enclosing_run(path: str | Path) -> tuple[Path, str] | None:
    """The kinterval checkpoint or training-run folder that ``path`` (symlinks and ``..`` resolved) is or lies
    inside, with what it is; None when there is none. A run folder holds ``run_config.json``, ``status.json``,
    ``checkpoints/LATEST`` or a ``checkpoints/step_*`` folder; a checkpoint folder ``state.json``. Commands
    that write a folder of their own refuse one there: they would overwrite or mix with the run's files."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        ckpts = folder / "checkpoints"
        if (folder / "state.json").is_file():
            return folder, "a kinterval checkpoint folder (it holds state.json)"
        if (
            (folder / "run_config.json").is_file()
            or (folder / "status.json").is_file()
            or (ckpts / "LATEST").is_file()
            or any(p.is_dir() for p in ckpts.glob("step_*"))
        ):
            return folder, "a kinterval run folder (it holds run_config.json, status.json or checkpoints/)"
    return None


def check_outside_runs(out: str | Path, why: str) -> None:
    """``ValueError`` when ``out`` is or lies inside a checkpoint or run folder (:func:`enclosing_run`);
    ``why`` says what writing there would do."""
    if run := enclosing_run(out):
        folder, kind = run
        where = "is" if folder == Path(out).resolve() else f"lies inside {folder}, which is"
        raise ValueError(f"--out {out} {where} {kind}: {why}; give a folder outside any run")


# Files that mark a folder as another command's: an --out there would mix its files with that folder's.
FOLDER_MARKS = {"meta.json": "a prepared dataset", "manifest.json": "a suite folder"}


def check_not_other_folder(out: str | Path, who: str, own: str | None = None) -> None:
    """``ValueError`` when ``out`` is a prepared dataset or a suite folder (:data:`FOLDER_MARKS`; ``own``: the
    mark of ``who``'s own kind, which it may write into)."""
    for name, what in FOLDER_MARKS.items():
        if name != own and (Path(out) / name).is_file():
            raise ValueError(f"--out {out} is {what} (it holds {name}); give {who} a folder of its own")


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint folder's name says (``step_NNNNNN`` or its ``.old-`` copy), else None."""
    m = STEP_NAME.fullmatch(Path(path).name.removeprefix(OLD_PREFIX))
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders with a state.json, by step; a step whose ``step_*`` folder is being
    replaced (a kill between the two renames of a re-save) is represented by its ``.old-step_*`` copy."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in root.iterdir():
        step = checkpoint_step(p)
        if step is None or not (p / "state.json").is_file():
            continue
        if step not in found or found[step].name.startswith(OLD_PREFIX):  # step_* wins over .old-step_*
            found[step] = p
    return [found[s] for s in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint named by LATEST, or None when the run has none.

    LATEST must hold one ``step_NNNNNN`` name of a folder beside it; anything else (empty, binary, a path,
    another run's folder) is not followed: a warning names the file and the newest checkpoint folder is used.
    """
    root = checkpoint_dir(run_dir)
    found = list_checkpoints(run_dir)
    latest = root / "LATEST"
    if latest.is_file():
        try:
            name = latest.read_bytes().decode("ascii").strip()
        except UnicodeDecodeError:
            name = None
        step = checkpoint_step(name) if name and STEP_NAME.fullmatch(name) else None
        named = [p for p in found if checkpoint_step(p) == step]
        if named:
            return named[0]
        if found:
            why = (
                f"names {name}, which has no state.json (an incomplete or damaged checkpoint)"
                if step is not None and (root / name).is_dir()
                else f"does not name a checkpoint of this run ({name!r})"
            )
            warnings.warn(f"{latest} {why}; using the newest complete one, {found[-1].name}", stacklevel=2)
    return found[-1] if found else None


def read_state(path: str | Path, *, verify: bool = False) -> dict:
    """A checkpoint's state.json, checked: format, entries, its step against the folder name; with ``verify``
    also its own sha256 (``state_sha256``, when recorded: an edited state.json is refused)."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {path}: state.json is missing (not a checkpoint, or incomplete)")
    try:
        state = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt ({err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: state.json is not a JSON object")
    if state.get("format") != FORMAT or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: unknown format {state.get('format')!r} "
            f"v{state.get('format_version')!r}, expected {FORMAT} v{FORMAT_VERSION}"
        )
    step, named = state.get("step"), checkpoint_step(path)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint {path}: state.json has no valid step ({step!r})")
    if named is not None and step != named:
        raise CheckpointError(f"checkpoint {path}: state.json says step {step}, the folder name says {named}")
    # config and model_config: every reader indexes them (eval, geometry, the gate, load_run)
    entries = (("files", dict), ("optimizer_structure", (dict, list)), ("rng", dict), ("config", dict),
               ("model_config", dict))  # fmt: skip
    for key, kind in entries:
        if not isinstance(state.get(key), kind):
            raise CheckpointError(f"checkpoint {path}: state.json lacks a valid {key!r} entry")
    # last: the errors above say more. Checkpoints of kinterval versions before state_sha256 (the same format
    # version) have none: they are not checked here (their tensor files are, against the recorded sha256s)
    if verify and "state_sha256" in state and state["state_sha256"] != state_sha256(state):
        raise CheckpointError(
            f"checkpoint {path}: state.json was modified (its content differs from state_sha256)"
        )
    return state


def trained_data_dir(state: dict, ckpt: str | Path) -> str:
    """The data folder a checkpoint was trained on (state.json's ``config.data.dir``), every evaluation's
    default. ``CheckpointError`` (then the data folder must be given) when state.json records none, when that
    folder holds no prepared data here (a relative path is read from the working directory, which may not be
    the one training ran in), or when its training split is not the one the checkpoint records (its shard
    hashes differ: another corpus under the same path), which would be evaluated silently otherwise."""
    data = state.get("config", {}).get("data")
    folder = data.get("dir") if isinstance(data, dict) else None
    if not isinstance(folder, str) or not folder:
        raise CheckpointError(
            f"checkpoint {ckpt}: state.json records no data folder (config.data.dir); give the data (--data)"
        )
    where = f"checkpoint {ckpt} was trained on the data folder {folder!r}"
    if not Path(folder).is_absolute():
        where += f" (relative to the folder training ran in; read here from {Path.cwd()})"
    meta = Path(folder) / "meta.json"
    if not meta.is_file():
        raise CheckpointError(f"{where}, which holds no prepared data here (no {meta}); give it (--data)")
    trained = (state.get("identity") or {}).get("data.identity")
    want = trained.get("shards_sha256") if isinstance(trained, dict) else None
    try:
        splits, split = json.loads(meta.read_text())["splits"], trained["split"]
        have = [x["sha256"] for x in splits[split]["shards"]] if split in splits else None
    except (OSError, ValueError, KeyError, TypeError):  # unreadable or unrecorded: the loader names it
        return folder
    if have is None:
        raise CheckpointError(f"{where}, but it has no {split} split there; give the data (--data)")
    if isinstance(want, list) and all(isinstance(h, str) for h in want + have) and have != want:
        raise CheckpointError(
            f"{where}, but its {trained['split']} split there is other data (its shard hashes differ from "
            "those the checkpoint records); give the data to evaluate (--data)"
        )
    return folder


def _load_tensors(path: Path, name: str, state: dict, *, verify: bool) -> dict[str, torch.Tensor]:
    """One tensor file of a checkpoint; with ``verify`` first checked against the sha256 state.json records.
    ``CheckpointError`` names the file when it is missing, unrecorded, corrupt, truncated or unreadable."""
    fp = path / name
    if not fp.is_file():
        raise CheckpointError(f"checkpoint {path}: {name} is missing")
    if verify:
        recorded = state["files"].get(name)
        if not recorded:
            raise CheckpointError(f"checkpoint {path}: state.json records no sha256 for {name}")
        if _sha256(fp) != recorded:
            raise CheckpointError(
                f"checkpoint {path}: {name} is corrupt or truncated (sha256 differs from state.json)"
            )
    try:
        return load_file(fp)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: {name} is unreadable ({err})") from None


def load_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Read a checkpoint folder; with ``verify`` every file's sha256 is checked against state.json."""
    path = Path(path)
    state = read_state(path, verify=verify)
    tensors = {f: _load_tensors(path, f, state, verify=verify) for f in FILES}
    model = tensors["model.safetensors"]
    if TIED[1] in model:
        model[TIED[0]] = model[TIED[1]]
    try:
        optimizer = unflatten_state(state["optimizer_structure"], tensors["optimizer.safetensors"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint {path}: optimizer_structure does not match the tensors ({err})"
        ) from None
    # AdamW counts its steps per parameter: each counter must equal the checkpoint's step.
    counters = (
        {
            float(s["step"])
            for s in (optimizer.get("state") or {}).values()
            if isinstance(s, dict) and "step" in s
        }
        if isinstance(optimizer, dict)
        else set()
    )
    if counters and counters != {float(state["step"])}:
        raise CheckpointError(
            f"checkpoint {path}: state.json says step {state['step']}, the optimizer has taken "
            f"{sorted(int(c) for c in counters)} steps"
        )
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
    tensors = _load_tensors(path, "model.safetensors", read_state(path), verify=True)
    if TIED[1] in tensors:
        tensors[TIED[0]] = tensors[TIED[1]]
    return tensors
