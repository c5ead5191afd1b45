"""The operators run outside autocast (App. A: fp32 scores in a disabled-autocast region).

Every entry point into the probability backends and their closed-form backward switches autocast off for
the tensors' device: CUDA autocast would otherwise run ``exp`` in float32 (it is on its float32 list), and
BF16-exp's exponential would lose its bfloat16 output rounding."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

__all__ = ["autocast_dtype", "matmul_outside_autocast", "outside_autocast"]


def outside_autocast(device_type: str) -> AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a no-op for devices without autocast (meta)."""
    if _has_autocast(device_type):
        return torch.autocast(device_type, enabled=False)
    return nullcontext()


def _has_autocast(device_type: str) -> bool:
    # cpu and cuda answered in Python: torch.compile of torch 2.11 and older cannot trace
    # is_autocast_available, and its graph break here made each call of a compiled model recompile
    return device_type in ("cpu", "cuda") or torch.amp.is_autocast_available(device_type)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of the autocast region enabled for ``device_type``; None outside one, and for devices
    without autocast (meta)."""
    if _has_autocast(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class _MatmulOutsideAutocast(torch.autograd.Function):
    """``a @ b`` whose backward also runs outside autocast.

    Autograd replays a matmul's backward under the autocast state of the thread that calls ``.backward()``:
    called inside ``torch.autocast``, the fp32 attention's dQ, dK, dV would be bf16 matmuls. The backward is
    written in differentiable ops, so double backward and forward-mode (``jvp``) still work."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a, b):
        return torch.matmul(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        with outside_autocast(g.device.type):
            ga = torch.matmul(g, b.mT).sum_to_size(a.shape) if ctx.needs_input_grad[0] else None
            gb = torch.matmul(a.mT, g).sum_to_size(b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb

    @staticmethod
    def jvp(ctx, da, db):
        a, b = ctx.saved_tensors
        out = None
        if da is not None:
            out = torch.matmul(da, b)
        if db is not None:
            out = torch.matmul(a, db) if out is None else out + torch.matmul(a, db)
        return out


def matmul_outside_autocast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` of tensors with at least 2 dims, forward and backward outside autocast."""
    with outside_autocast(a.device.type):
        if not (a.requires_grad or b.requires_grad) or not torch.is_grad_enabled():
            return torch.matmul(a, b)
        return _MatmulOutsideAutocast.apply(a, b)
