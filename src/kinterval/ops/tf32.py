"""TF32 for fp32 matmuls (and cuDNN convolutions): one place that reads and sets it.

PyTorch >= 2.9 has the ``fp32_precision`` settings and raises when its legacy ``allow_tf32`` flags are read
after a mix of the two APIs was used; on those versions only the new API is used here, on older ones the
legacy flags."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["tf32", "tf32_enabled", "tf32_flags"]


def _new_api() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _resolved(*settings) -> bool:
    """The first setting that is not "none" (a child inherits its parent's), compared with "tf32"."""
    return next((v for v in settings if v != "none"), "none") == "tf32"


def tf32_flags() -> tuple[bool, bool]:
    """Whether TF32 is allowed for fp32 matmuls and for cuDNN convolutions (the new API's "none" inherits
    from its parent setting; older PyTorch: the two ``allow_tf32`` flags)."""
    b = torch.backends
    if not _new_api():
        return bool(b.cuda.matmul.allow_tf32), bool(b.cudnn.allow_tf32)
    top = getattr(b, "fp32_precision", "none")
    return (
        _resolved(b.cuda.matmul.fp32_precision, top),
        _resolved(b.cudnn.conv.fp32_precision, getattr(b.cudnn, "fp32_precision", "none"), top),
    )


def tf32_enabled() -> bool:
    """Whether fp32 matmuls may use TF32: what the triton backend's fp32 dots follow by default."""
    return tf32_flags()[0]


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 on or off for fp32 matmuls and cuDNN convolutions inside the block; the previous settings are
    restored on exit.

    Off also pins the CPU's fp32 matmuls (oneDNN) to full fp32: ``set_float32_matmul_precision("medium")``
    sets ``torch.backends.mkldnn.matmul.fp32_precision`` to "bf16" (``"high"``: "tf32"), and on CPUs with
    bf16 units (AMX) the fp32 attention of a CPU evaluation then ran in bf16 while its summary said TF32 off.
    On leaves the CPU setting as the caller has it: TF32 in training is a CUDA tensor-core setting (App. C),
    and forcing oneDNN's TF32 would make a CPU run's numerics depend on the CPU's generation."""
    b = torch.backends
    if _new_api():
        mode = "tf32" if enabled else "ieee"
        pinned = [(b.cuda.matmul, mode), (b.cudnn.conv, mode)]
        mkldnn = getattr(b.mkldnn, "matmul", None)
        if not enabled and hasattr(mkldnn, "fp32_precision"):
            pinned.append((mkldnn, "ieee"))
        old = [f.fp32_precision for f, _ in pinned]
        for f, value in pinned:
            f.fp32_precision = value
        try:
            yield
        finally:
            for (f, _), value in zip(pinned, old):
                f.fp32_precision = value
        return
    # older PyTorch: allow_tf32 = False also sets the matmul precision to "highest", which is what turns
    # oneDNN's bf16 matmuls off; restoring allow_tf32 alone would turn a caller's "medium" into "high"
    old = b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = old[:2]
        torch.set_float32_matmul_precision(old[2])
