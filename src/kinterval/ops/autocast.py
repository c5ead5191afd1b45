"""The operators run outside autocast (App. A: fp32 scores in a disabled-autocast region).

Every entry point into the probability backends and their closed-form backward switches autocast off for
the tensors' device: CUDA autocast would otherwise run ``exp`` in float32 (it is on its float32 list), and
BF16-exp's exponential would lose its bfloat16 output rounding."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

__all__ = ["outside_autocast"]


def outside_autocast(device_type: str) -> AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a no-op for devices without autocast (meta)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return nullcontext()
