"""Rows whose grid decision fp32 rounding may flip: where two correct fp32 evaluations of a K-interval
operator may legitimately disagree by a whole interval.

Unlike softmax, a K-interval operator is discontinuous in the scores (§3, App. A):

* the interval index r jumps at the boundaries x = integer, where x = (z - b_0)/h is a key's grid position:
  Delta (so dS) jumps there, for every operator; FWM's tail cut z < -tau is the boundary x = 0 and drops
  the weight itself;
* the Nearest forward (Weight-STE, Prob-STE) jumps at the midpoints x = integer + 1/2;
* the arg-max key (and MinMax's arg-min key) receives the calibration gradient of eq. (2): a near-tie
  of the row max moves a whole G_M k term from one key to another.

The reduced-precision baselines (App. D.5) round to a coarse format, so a value within rounding of a
rounding midpoint of that format goes either way: BF16-exp rounds z = s - M and e^{bf16(z)} to bfloat16
(a step of 2^-8 relative), and in the backward the normalization's gamma (which needs v and the upstream
gradient); FP8-exp rounds e^z to E4M3 (2^-4). Both keep the max on the tape, so a near-tie of the row max
moves their G_M too. Softmax is continuous and has none of these.

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
# A baseline weight below this share of its row's total moves no result by more than 2^-23 |v| (one fp32
# rounding) when its rounding flips (a relative 2^-7), so such keys are not counted (module doc).
MIN_SHARE = 2.0**-16


def _near_set(x: Tensor, radius: Tensor, offset: float, lo: float, hi: float) -> Tensor:
    """|x - p| <= radius for the nearest p in {n + offset : lo <= n <= hi, n integer}."""
    n = torch.floor(x - offset + 0.5)  # nearest n with p = n + offset
    return (n >= lo) & (n <= hi) & ((x - (n + offset)).abs() <= radius)


def _near_midpoint(y: Tensor, radius: Tensor, mant_bits: int, min_exp: int) -> Tensor:
    """|y - p| <= radius for the nearest rounding midpoint p of a binary float format with ``mant_bits``
    stored mantissa bits and smallest normal exponent ``min_exp`` (bfloat16: 7, -126; E4M3: 3, -6)."""
    a = y.abs()
    binade = torch.floor(torch.log2(a.clamp_min(2.0**-200))).clamp_min(min_exp)
    step = torch.exp2(binade - mant_bits)  # the spacing of the format's values around a
    return _near_set(a / step, radius / step, 0.5, -float("inf"), float("inf"))


def _baseline_flips(spec, s, rad, M, rad_M, valid, v, do) -> Tensor:
    """Keys (BF16-exp, FP8-exp) whose weight's rounding to the baseline's format may go either way (module
    doc); with v and do, also BF16-exp's gamma."""
    z = torch.where(valid, s - M, 0.0)
    rad_z = rad + rad_M
    e = torch.where(valid, torch.exp(z), 0.0)
    P = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    valid = valid & (P >= MIN_SHARE)  # keys that can move a result
    if spec.kind == "fp8-exp":
        return valid & _near_midpoint(e, e * (rad_z + RADIUS * U32 * (1 + z.abs())), 3, -6)

    def bf16(x):
        return x.float().bfloat16().double()

    # z within rounding of one of its bf16 midpoints may round to either neighbour: both are tried; the
    # weight flips if they give different bf16 weights, or if an exp lies within its error of a midpoint
    near = torch.zeros_like(valid)
    w = []
    for zb in (bf16(z - rad_z), bf16(torch.minimum(z + rad_z, torch.zeros_like(z)))):
        e = torch.exp(zb)
        near |= _near_midpoint(e, e * RADIUS * U32 * (1 + zb.abs()), 7, -126)
        w.append(bf16(e))
    near = valid & (near | (w[0] != w[1]))
    if v is None or do is None:
        return near
    w = torch.where(P > 0, bf16(torch.exp(bf16(z))), 0.0)
    W = w.sum(-1, keepdim=True)
    inv_W = torch.where(W > 0, 1 / W, 0.0)
    v, do = v.double().cpu(), do.double().cpu()
    g = do @ v.transpose(-2, -1)  # dL/dP
    O = (w * inv_W) @ v
    D = (do * O).sum(-1, keepdim=True)
    gamma = (g - D) * inv_W  # rounded to bf16 by the backward (autograd through the casts)
    cond = (do.abs() @ v.abs().transpose(-2, -1)) + (do.abs() * O.abs()).sum(-1, keepdim=True)
    rad_gamma = RADIUS * U32 * (cond * inv_W + gamma.abs())
    return near | (valid & _near_midpoint(gamma, rad_gamma, 7, -126))


def flip_rows(
    spec: OperatorSpec, q: Tensor, k: Tensor, scale: float, valid: Tensor, v: Tensor | None = None,
    do: Tensor | None = None, softcap: float | None = None, sinks: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Bool (..., Tq): rows of ``scale * q k^T`` (masked by ``valid``) where a grid decision of ``spec`` (or
    a rounding of a reduced-precision baseline) lies within fp32 rounding of a discontinuity (module doc).
    Softmax has none. ``v`` and ``do`` (the upstream gradient) add BF16-exp's backward rounding. ``softcap``
    c: the scores are c tanh(scale q k^T / c); a score's radius is then its product's times tanh's slope
    1 - (s/c)^2, plus a few roundings of s for the tanh itself. ``sinks`` (H,): attention sinks, one more
    key per row after the softcap (``api.with_sinks``; -inf: none), exact and without a value. ``bias``: an
    additive score bias (broadcastable to the scores), added after the softcap, its sum rounded once more."""
    q, k = q.double().cpu(), k.double().cpu()
    valid = valid.cpu().expand(*q.shape[:-1], k.shape[-2])
    rows = torch.zeros(valid.shape[:-1], dtype=torch.bool)
    if spec.kind == "softmax":
        return rows
    s = (q @ k.transpose(-2, -1)) * scale
    cond = (q.abs() @ k.abs().transpose(-2, -1)) * scale
    rad = RADIUS * U32 * (cond + s.abs())  # rounding radius of each score
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
        rad = rad * (1 - (s / softcap) ** 2) + RADIUS * U32 * 4 * s.abs()
    if bias is not None:  # the bias itself is exact (an fp32 input); the sum rounds once
        s = s + bias.double().cpu()
        rad = rad + RADIUS * U32 * s.abs()
    if sinks is not None:  # the sink key: its score is the input itself (radius 0), its value row zero
        sink = sinks.double().cpu().view(-1, 1, 1).expand(*s.shape[:-1], 1)
        taken = ~torch.isneginf(sink)
        s = torch.cat([s, torch.where(taken, sink, 0.0)], -1)
        rad = torch.cat([rad, torch.zeros_like(sink)], -1)
        valid = torch.cat([valid, taken], -1)
        if v is not None:
            v = torch.cat(
                [v.double().cpu(), torch.zeros(*v.shape[:-2], 1, v.shape[-1], dtype=torch.float64)], -2
            )
    inf = float("inf")
    M, jmax = s.masked_fill(~valid, -inf).max(-1, keepdim=True)
    m, jmin = s.masked_fill(~valid, inf).min(-1, keepdim=True)
    keys = torch.arange(s.shape[-1])
    other = valid & (keys != jmax)
    if spec.calibration == "minmax":  # degenerate rows are decided exactly (all weights 1, no gradient)
        other = other & (M - m > EPS_DEGENERATE)
    rad_M = rad.gather(-1, jmax)
    rows |= (other & (M - s <= rad_M + rad)).any(-1)  # near-tie of the row max
    if not spec.is_kinterval:
        return rows | _baseline_flips(spec, s, rad, M, rad_M, valid, v, do).any(-1)
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
