"""Which backend computes an operator: one rule for the whole package.

Three backends compute the same operator (``docs/operators.md``): ``triton`` (fused kernels, CUDA),
``closed_form`` (the paper's explicit backward, any device) and ``reference`` (autograd of the direct
formulas, any device). Each answers ``supports(spec, device, dtype)``; :func:`resolve_backend` returns the
preferred one that supports the operator (``"auto"``: triton on CUDA, the fastest there; else the closed form,
which keeps a fraction of the reference's memory for the backward), or checks an explicit choice and raises
a ``ValueError`` naming the operator, the backend and what would run it. Every caller (the model, evaluation,
the Hugging Face integration, the lm-eval adapter, the benchmarks) goes through :func:`resolve_backend`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from kinterval.ops.spec import OperatorSpec, as_spec

AUTO = "auto"
# kinterval_attention's score modifications (a float mask's bias, softcap, sinks), named for users
SCORE_MODS = {"bias": "additive score bias", "softcap": "softcap", "sinks": "attention sinks"}
FLOATING = (torch.float64, torch.float32, torch.bfloat16, torch.float16)  # the operators' input dtypes


@dataclass(frozen=True)
class Backend:
    """A backend and its answer to "can you run this operator here?" (None: yes; else the reason why not)."""

    name: str
    why_not: Callable[[OperatorSpec, torch.device, torch.dtype | None], str | None]
    forms_probs: bool  # computes P explicitly (can serve ``attention_probs``)
    score_mods: frozenset[str]  # the score modifications (SCORE_MODS) it applies

    def supports(self, spec: OperatorSpec, device, dtype: torch.dtype | None = None) -> bool:
        return self.why_not(as_spec(spec), torch.device(device), dtype) is None


# The oldest Triton the fused kernels are tested with: the GPU tests ran 3.6, the interpreter tests 3.6 to 3.9
# (under 3.2 the kernels cannot even be defined without a GPU: its autotuner asks for a driver). PyPI's torch
# wheels pin their Triton, 3.6 or newer from torch 2.10 on; an older one installed beside it is passed over.
MIN_TRITON = (3, 6)


@lru_cache(maxsize=1)
def triton_problem() -> str | None:
    """Why the fused kernels cannot run in this environment (None: they can): triton missing or too old.
    Reads the installed version without importing triton (a slow import)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on the path: trust it
        return None
    if version_tuple(version) < MIN_TRITON:
        need = ".".join(map(str, MIN_TRITON))  # torch 2.10 and later bring it
        return f"triton {version} is older than {need}, the oldest the fused kernels run on"
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    """(3, 6, 0) from "3.6.0", "3.6.0+git1234" or "3.7.0rc1": a release to compare with a lower bound."""
    return tuple(int(re.match(r"\d*", part).group() or 0) for part in version.split("+")[0].split(".")[:3])


def _interpreted() -> bool:
    """Triton's CPU interpreter (``TRITON_INTERPRET=1``): the kernels run on CPU tensors, for tests only."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_why_not(spec: OperatorSpec, device: torch.device, dtype: torch.dtype | None) -> str | None:
    from kinterval.ops.triton import triton_supports, unsupported_reason  # pure Python: no triton import

    if (problem := triton_problem()) is not None:
        return problem
    if device.type != "cuda" and not (device.type == "cpu" and _interpreted()):
        return f"the fused kernels need a CUDA device, got {device.type}"
    if dtype == torch.float64:
        return "the fused kernels do not run float64"
    if not triton_supports(spec):
        return unsupported_reason(spec) or "the fused kernels do not implement it"
    return None


def _everything(spec: OperatorSpec, device: torch.device, dtype: torch.dtype | None) -> str | None:
    # closed_form implements every operator of the family (baselines, every calibration, surrogate and
    # range_grad, both arithmetics) on any device, in float32 or float64; reference is the definition.
    return None


TRITON = Backend("triton", _triton_why_not, forms_probs=False, score_mods=frozenset(SCORE_MODS))
CLOSED_FORM = Backend("closed_form", _everything, forms_probs=True, score_mods=frozenset(SCORE_MODS))
REFERENCE = Backend("reference", _everything, forms_probs=True, score_mods=frozenset(SCORE_MODS))


def _score_mods(score_mod) -> frozenset[str]:
    """``resolve_backend``'s ``score_mod`` as a set of SCORE_MODS names (True: all of them)."""
    if isinstance(score_mod, bool):
        return frozenset(SCORE_MODS if score_mod else ())
    names = (score_mod,) if isinstance(score_mod, str) else tuple(score_mod)
    unknown = [n for n in names if n not in SCORE_MODS]
    if unknown:
        raise ValueError(f"unknown score modification {unknown[0]!r}; choose from {tuple(SCORE_MODS)}")
    return frozenset(names)


REGISTRY: dict[str, Backend] = {b.name: b for b in (TRITON, CLOSED_FORM, REFERENCE)}  # preferred first
BACKENDS = (AUTO, *REGISTRY)  # the names a user may pass


def _candidates(device: torch.device) -> list[Backend]:
    """What ``auto`` may pick, preferred first; off CUDA triton only runs in its (slowest) interpreter."""
    out = list(REGISTRY.values())
    return out if device.type == "cuda" else [b for b in out if b is not TRITON]


def resolve_backend(
    spec: OperatorSpec | str,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    *,
    backend: str = AUTO,
    probs: bool = False,
    score_mod: bool | str | tuple[str, ...] = False,
) -> str:
    """The backend that computes ``spec`` on ``device`` for inputs of ``dtype`` (None: any floating dtype).

    ``backend="auto"`` (the default) returns the preferred backend that supports the operator there:
    ``triton`` on CUDA when installed and the kernels implement the operator (not float64), else
    ``closed_form`` (on the CPU 2.5-5x less backward memory than ``reference``, which is up to 1.4x faster).
    An explicit ``backend`` is returned unchanged when it supports the operator, else a ``ValueError`` names
    the operator, the backend, the reason and the backend that would run it. ``probs=True`` asks for a backend
    that forms the probabilities P explicitly (``attention_probs``; the fused kernel never does).
    ``score_mod`` names the score modifications the call needs, from ``SCORE_MODS``: "bias" (an additive
    score bias, ``kinterval_attention``'s float ``attn_mask``), "softcap" and "sinks" (attention sinks), as
    a name or a tuple of names; True asks for all three, False for none. Every backend applies all three.
    """
    spec = as_spec(spec)
    if dtype is not None and not isinstance(dtype, torch.dtype):  # "float64" would pass every check
        raise ValueError(f"dtype must be a torch.dtype or None, got {dtype!r}")
    if dtype is not None and dtype not in FLOATING:  # the operators' input dtypes (api.working_dtype)
        raise ValueError(f"dtype must be float64, float32, bfloat16 or float16 (or None), got {dtype}")
    if not isinstance(backend, str):
        raise ValueError(f"backend must be a string, one of {BACKENDS}, got {backend!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    mods = _score_mods(score_mod)

    def why_not(b: Backend) -> str | None:
        reason = b.why_not(spec, device, dtype)
        if reason is None and probs and not b.forms_probs:
            reason = "it never forms the probabilities P explicitly"
        missing = [n for n in SCORE_MODS if n in mods and n not in b.score_mods]
        if reason is None and missing:
            reason = f"it applies no {' or '.join(SCORE_MODS[n] for n in missing)}"
        return reason

    if backend == AUTO:
        for b in _candidates(device):
            if why_not(b) is None:
                return b.name
        raise ValueError(f"no backend runs {spec.full_name} on {device.type}")  # reference runs everything
    if backend not in REGISTRY:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    reason = why_not(REGISTRY[backend])
    if reason is not None:
        other = resolve_backend(spec, device, dtype, probs=probs, score_mod=score_mod)
        where = f"{device.type}" + (f", {dtype}" if dtype is not None else "")
        raise ValueError(
            f"backend {backend!r} cannot run operator {spec.full_name} on {where}: {reason}; "
            f"backend {other!r} can (or pass backend='auto')"
        )
    return backend
