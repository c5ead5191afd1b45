"""Which attention rows hold a grid decision that fp32 rounding may flip (test helper for the kernel tests).

Unlike softmax, a K-interval operator is discontinuous in the scores (§3, App. A):

* the interval index r jumps at the boundaries x = integer, where x = (z - b_0)/h is a key's grid position:
  Delta (so dS) jumps there, for every operator; FWM's tail cut z < -tau is the boundary x = 0 and drops
  the weight itself;
* the Nearest forward (Weight-STE, Prob-STE) jumps at the midpoints x = integer + 1/2;
* the arg-max key (and MinMax's arg-min key) receives the calibration gradient of eq. (2): a near-tie
  of the row max moves a whole G_M k term from one key to another.

A score within rounding of such a point lands on either side depending on the order of a dot product's sums,
so two correct fp32 evaluations (a GPU kernel's and cuBLAS's, or torch's on the CPU) disagree there by
O(gamma Delta) in one element of dS: a whole row of dq and a whole row of dk. Measured on the CPU with an
emulated kernel (scores summed in 16-wide chunks, as an MMA does) at (1, 4, 1000, 1000, 64): one key at
x = -0.99999984 (resolved-weight-k4) gives a dq error of 2.2e-3 against torch's 5.7e-6, and lifts dq's
relative Frobenius error from 6.4e-7 to 1.9e-5.

``flip_rows`` finds these rows in float64, with a rounding radius per score that is 8x the unit roundoff of
fp32 times the score's condition sum_d |q_d k_d| (plus the same for |s|, M, m and tau). The kernel tests
zero the upstream gradient of those rows (they then contribute nothing to dq, dk, dv, in the kernel and in
every reference alike) and skip them in the forward comparison; every other row is held to the full bound.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops import OperatorSpec

U32 = 2.0**-24  # unit roundoff of fp32 (bf16/fp16/tf32-representable inputs: exact products, fp32 sums)
RADIUS = 8.0  # rounding radius in units of U32 * condition (module doc)
EPS_DEGENERATE = 1e-12  # App. A: a MinMax row with M - m <= eps is degenerate (decided exactly)


def _near_set(x: Tensor, radius: Tensor, offset: float, lo: float, hi: float) -> Tensor:
    """|x - p| <= radius for the nearest p in {n + offset : lo <= n <= hi, n integer}."""
    n = torch.floor(x - offset + 0.5)  # nearest n with p = n + offset
    return (n >= lo) & (n <= hi) & ((x - (n + offset)).abs() <= radius)


def flip_rows(spec: OperatorSpec, q: Tensor, k: Tensor, scale: float, valid: Tensor) -> Tensor:
    """Bool (..., Tq): rows of ``scale * q k^T`` (masked by ``valid``) where a grid decision of ``spec`` lies
    within fp32 rounding of a discontinuity (module doc). Softmax has none."""
    q, k = q.double().cpu(), k.double().cpu()
    valid = valid.cpu().expand(*q.shape[:-1], k.shape[-2])
    rows = torch.zeros(valid.shape[:-1], dtype=torch.bool)
    if not spec.is_kinterval:
        return rows
    s = (q @ k.transpose(-2, -1)) * scale
    cond = (q.abs() @ k.abs().transpose(-2, -1)) * scale
    rad = RADIUS * U32 * (cond + s.abs())  # rounding radius of each score
    inf = float("inf")
    M, jmax = s.masked_fill(~valid, -inf).max(-1, keepdim=True)
    m, jmin = s.masked_fill(~valid, inf).min(-1, keepdim=True)
    keys = torch.arange(s.shape[-1])
    other = valid & (keys != jmax)
    if spec.calibration == "minmax":  # degenerate rows are decided exactly (all weights 1, no gradient)
        other = other & (M - m > EPS_DEGENERATE)
    rad_M = rad.gather(-1, jmax)
    rows |= (other & (M - s <= rad_M + rad)).any(-1)  # near-tie of the row max
    K = spec.K
    if spec.calibration == "minmax":
        nondeg = (M - m > EPS_DEGENERATE) & valid.any(-1, keepdim=True)
        rad_m = rad.gather(-1, jmin)
        other = other & (keys != jmin)
        rows |= (other & (s - m <= rad_m + rad)).any(-1)  # near-tie of the row min
        h = torch.where(nondeg, (M - m) / K, torch.ones_like(M))
        x = (s - m) / h
        rad_x = (rad + rad_m) / h + x * (rad_M + rad_m) / (M - m).clamp_min(EPS_DEGENERATE)
        boundaries = (1, K - 1)  # x = 0 and x = K clamp to the same interval on either side
    else:  # FWM, resolved: x = (z + tau)/h with h = tau/K, anchored at M
        h = spec.tau / K
        x = (s - M + spec.tau) / h
        rad_x = (rad + rad_M + RADIUS * U32 * (M.abs() + spec.tau)) / h
        boundaries = (0, K - 1) if spec.calibration == "fwm" else (-inf, K - 1)  # FWM: x = 0 is the tail cut
    rad_x = rad_x + RADIUS * U32 * x.abs()
    near = _near_set(x, rad_x, 0.0, *boundaries)
    if spec.reconstruction == "nearest":  # midpoints of the kept intervals
        near |= _near_set(x, rad_x, 0.5, 0 if spec.calibration != "resolved" else -inf, K - 1)
    return rows | (other & near).any(-1)


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
