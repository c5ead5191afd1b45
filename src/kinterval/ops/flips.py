"""Rows whose grid decision fp32 rounding may flip: where two correct fp32 evaluations of a K-interval
operator may legitimately disagree by a whole interval.

Unlike softmax, a K-interval operator is discontinuous in the scores (§3, App. A):

* the interval index r jumps at the boundaries x = integer, where x = (z - b_0)/h is a key's grid position:
  Delta (so dS) jumps there, for every operator; FWM's tail cut z < -tau is the boundary x = 0 and drops
  the weight itself;
* the Nearest forward (Weight-STE, Prob-STE) jumps at the midpoints x = integer + 1/2;
* the arg-max key (and MinMax's arg-min key) receives the calibration gradient of eq. (2): a near-tie
  of the row max moves a whole G_M k term from one key to another.

A score within rounding of such a point lands on either side depending on the order of a dot product's sums,
so two correct fp32 evaluations (a GPU kernel's and cuBLAS's, or torch's on the CPU) disagree there by
O(1/K) in a row of the output and O(gamma Delta) in one element of dS: a whole row of dq and of dk.

``flip_rows`` finds these rows in float64, with a rounding radius per score that is 8x the unit roundoff of
fp32 times the score's condition sum_d |q_d k_d| (plus the same for |s|, M, m and tau). Error comparisons
of a kernel against float64 leave these rows out (the kernel tests, the benchmark's error columns); every
other row must agree to the precision of its arithmetic. A mode whose scores are less accurate than fp32's
flips rows outside this set, and its errors show it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops.formulas import EPS_DEGENERATE  # App. A: MinMax rows with M - m <= eps are decided exactly
from kinterval.ops.spec import OperatorSpec

__all__ = ["flip_rows"]

U32 = 2.0**-24  # unit roundoff of fp32 (bf16/fp16/tf32-representable inputs: exact products, fp32 sums)
RADIUS = 8.0  # rounding radius in units of U32 * condition (module doc)


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
