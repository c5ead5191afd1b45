"""Precision contexts: TF32 switches for training vs evaluation and the autocast region outside attention."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kinterval.model.config import NumericsConfig


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Set ``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32``; restore them on exit."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def train_precision(numerics: NumericsConfig) -> contextlib.AbstractContextManager:
    return tf32(numerics.tf32_train)


def eval_precision(numerics: NumericsConfig) -> contextlib.AbstractContextManager:
    return tf32(numerics.tf32_eval)


def autocast(numerics: NumericsConfig, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The autocast region for everything outside attention (the operator disables autocast itself)."""
    device_type = torch.device(device).type
    enabled = numerics.autocast_dtype != "none" and (device_type == "cuda" or numerics.autocast_on_cpu)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, numerics.autocast_dtype))
