"""Test helpers for the kernel tests around flip-prone rows (``kinterval.ops.flips``: where two correct fp32
evaluations of a K-interval operator may disagree by a whole interval): TF32 rounding of inputs and a second
fp32 evaluation with a tensor-core summation order.

Measured on the CPU with the emulated kernel (scores summed in 16-wide chunks, as an MMA does) at
(1, 4, 1000, 1000, 64): one key at x = -0.99999984 (resolved-weight-k4) gives a dq error of 2.2e-3 against
torch's 5.7e-6, and lifts dq's relative Frobenius error from 6.4e-7 to 1.9e-5. The kernel tests zero the
upstream gradient of flip-prone rows (they then contribute nothing to dq, dk, dv, in the kernel and in
every reference alike) and skip them in the forward comparison; every other row is held to the full bound.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops.flips import flip_rows

__all__ = ["emulated_kernel", "flip_rows", "to_tf32"]


def to_tf32(x: Tensor) -> Tensor:
    """Round fp32 to the nearest TF32 value (10 stored mantissa bits, ties to even): a TF32 dot then
    multiplies such inputs exactly, whether the hardware rounds or truncates its operands."""
    bits = x.float().contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


def emulated_kernel(q, k, v, spec, *, causal=False, mask=None, scale=None, precision=None):
    """A second correct fp32 evaluation of the operator, with the summation order of a tensor-core dot
    (16-wide chunks of the head dim, summed in turn) instead of torch's: it flips other grid decisions than
    torch's CPU matmul does, as a GPU kernel would. Operands in q's dtype, operator maths in fp32, P cast to
    v's dtype before P V (as the kernels do), and truncated to TF32 there for ``precision="tf32"`` (with
    TF32-representable q, k, v that is the only TF32 rounding of the forward); autograd gives the backward."""
    from kinterval.ops.api import valid_mask
    from kinterval.ops.reference import reference_probs

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = None
    for c in range(0, q.shape[-1], 16):
        part = q[..., c : c + 16].float() @ k[..., c : c + 16].float().transpose(-2, -1)
        s = part if s is None else s + part
    s = s * scale
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    P = reference_probs(s, valid, spec).to(v.dtype).float()
    if precision == "tf32" and v.dtype == torch.float32:  # operands truncated to TF32 (straight-through)
        P = P + (_truncate_tf32(P.detach()) - P.detach())
    return (P @ v.float()).to(q.dtype)


def _truncate_tf32(x: Tensor) -> Tensor:
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)
