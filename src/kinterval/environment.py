"""The machine a run or an evaluation ran on: :func:`device_name` and :func:`environment`; and what it can
take: :func:`check_threads_bound`.

A training session appends :func:`environment` to its run's ``environment.jsonl``; an evaluation records
:func:`device_name` in its summary. No kinterval imports: every layer may use it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

import torch

ENVIRONMENT_FILE = "environment.jsonl"  # in a run folder: one line per training session
CPUINFO = "/proc/cpuinfo"  # Linux: the processor's model name


def check_threads_bound(threads: int) -> None:
    """``--threads`` at most max(64, 4 x this machine's CPUs): torch overflowed above 2^63, and starting a
    million OpenMP threads crashed the process."""
    cpus = os.cpu_count() or 1
    if threads > max(64, 4 * cpus):
        raise ValueError(
            f"--threads must be at most {max(64, 4 * cpus)} on this machine ({cpus} CPUs), got {threads}"
        )


def device_name(device: torch.device) -> str:
    """The model of ``device`` ("NVIDIA H200"; on the CPU the processor's model, e.g. "AMD EPYC 7763 64-Core
    Processor" from Linux's /proc/cpuinfo, else what Python's platform module knows, else "cpu")."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model() or platform.processor() or platform.machine() or device.type


def _cpu_model() -> str | None:
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (not imported), None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device, processes: int) -> dict:
    """The software and hardware of a session on ``device`` with ``processes`` processes (the world size):
    device type and model, torch's CPU threads (on the CPU they set the order of float sums, so results
    repeat bit for bit only with the same count), torch, its CUDA (None on CPU builds), triton (None when not
    installed), python and the host name."""
    return {
        "device": device.type,
        "device_name": device_name(device),
        "cpu_threads": torch.get_num_threads(),
        "processes": int(processes),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": package_version("triton"),
        "python": platform.python_version(),
        "host": platform.node(),
    }


def read_environment(path: str | Path) -> list[dict]:
    """The session lines of an ``environment.jsonl`` ([] when there is none); a line that is not a JSON
    object with an integer ``step`` is a ``ValueError`` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a session log (bytes that are not text: {err})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{path}, line {n}: not a session record (a JSON object with an integer step)")
        rows.append(row)
    return rows
