"""TF32 for fp32 matmuls (and cuDNN convolutions): one place that reads and sets it.

PyTorch >= 2.9 has the ``fp32_precision`` settings and raises when its legacy ``allow_tf32`` flags are read
after a mix of the two APIs was used; on those versions the new API sets the precision here, and the legacy
matmul precision that ``torch.get_float32_matmul_precision()`` returns is kept consistent with it; on older
ones the legacy flags."""

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
        mkldnn = getattr(b.mkldnn, "matmul", None)
        pinned = [(b.cuda.matmul, mode), (b.cudnn.conv, mode)]
        if hasattr(mkldnn, "fp32_precision"):
            pinned.append((mkldnn, mkldnn.fp32_precision if enabled else "ieee"))
        old = [f.fp32_precision for f, _ in pinned]
        # The legacy matmul precision, which torch.get_float32_matmul_precision() returns (inductor's
        # autotuning caches and FlexAttention read it), is stored apart from the fp32_precision settings,
        # and that getter raises when CUDA matmuls are "tf32" while it says "highest". So it is set to
        # match ("medium" keeps a caller's bf16 oneDNN matmuls legal) before the settings are pinned, and
        # restored first on exit. Where the caller's settings already make the getter raise (new-API settings
        # over the legacy default), it cannot be read: torch's default, "highest", is restored, which with
        # the caller's new-API settings put back after it makes the getter raise again, as before.
        try:
            old_legacy = torch.get_float32_matmul_precision()
        except RuntimeError:
            old_legacy = "highest"
        cpu_bf16 = enabled and getattr(mkldnn, "fp32_precision", "") == "bf16"
        torch.set_float32_matmul_precision("highest" if not enabled else "medium" if cpu_bf16 else "high")
        for f, value in pinned:
            f.fp32_precision = value
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(old_legacy)
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
