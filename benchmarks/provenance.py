"""What a benchmark table was measured on, for the line that heads every table and CSV of the scripts here:
the device (and driver), torch and triton versions, and the git commit of the checkout, marked when it has
uncommitted changes (``KINTERVAL_COMMIT`` where the copy has no ``.git``, as on a lent GPU machine)."""

from __future__ import annotations

import os
import subprocess

import torch


def _out(*cmd: str) -> str:
    """A command's stdout, or "" when it fails or is not there."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=os.path.dirname(__file__))
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance(device: torch.device, cpu: str = "cpu") -> str:
    """``device NAME, driver D; torch T, triton V; commit C`` (``cpu`` names a CPU device)."""
    name = cpu
    if device.type == "cuda":
        driver = _out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
        name = f"{torch.cuda.get_device_name(device)}, driver {driver[0] if driver else 'unknown'}"
    try:
        import triton

        triton_version = f"triton {triton.__version__}"
    except ImportError:
        triton_version = "no triton"
    commit = _out("git", "rev-parse", "HEAD")
    if commit and _out("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    elif not commit and os.environ.get("KINTERVAL_COMMIT"):
        commit = os.environ["KINTERVAL_COMMIT"] + " (KINTERVAL_COMMIT)"
    commit = commit or "unknown (not a git checkout; set KINTERVAL_COMMIT)"
    return f"device {name}; torch {torch.__version__}, {triton_version}; commit {commit}"
