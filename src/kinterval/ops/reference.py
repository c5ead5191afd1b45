"""Reference operators: the paper's direct formulas (§3, App. A, C.2, D.4, D.5), differentiated by autograd.

Everything acts on the last dimension of ``s`` (one attention row per index of the leading dimensions) with a
boolean ``valid`` mask of the same shape. The helpers ``row_extrema`` and ``grid`` are shared with the
closed-form backward so that both compute bit-identical forwards; the backward of this module is autograd's.

Conventions "as implemented" (App. A, Table S1):
* extrema over valid keys only (``amax``/``amin``, which split the gradient evenly among ties);
* MinMax rows with ``M - m <= 1e-12`` (or one valid key) are degenerate: weight 1 on every valid key, zero
  gradient, a safe width ``h = 1`` so that no 0/0 is formed;
* FWM zeroes keys with ``z < -tau`` (strict inequality) and keeps the gradient through ``M``;
* ``t_raw = (z - b_r)/h`` lies in [0, 1] by construction of ``r``; the clamp on ``t`` only removes rounding
  excursions (e.g. 1 + 1ulp at the arg-max key), so its derivative is the interval's interior one (the
  paper's Delta on every kept key). The gradient then never depends on the last bit of ``t_raw``;
* FWM's clamp of ``z`` to [-tau, 0] is ``torch.clamp`` (identity on every kept key);
* a fully masked row gives all-zero probabilities and zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kinterval.ops.spec import OperatorSpec

EPS_DEGENERATE = 1e-12  # App. A: the degenerate branch is M - m <= eps


@dataclass
class RowExtrema:
    M: Tensor  # row max over valid keys (0 where the row is empty), shape (..., 1)
    m: Tensor  # row min over valid keys
    nonempty: Tensor  # (..., 1) bool


def row_extrema(s: Tensor, valid: Tensor) -> RowExtrema:
    nonempty = valid.any(-1, keepdim=True)
    M = s.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
    m = s.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    return RowExtrema(torch.where(nonempty, M, zero), torch.where(nonempty, m, zero), nonempty)


@dataclass
class Grid:
    """Per-key reconstruction terms of one calibration rule (names as in §3 / App. B)."""

    z: Tensor  # s - M
    h: Tensor  # interval width (safe width 1 on degenerate MinMax rows)
    r: Tensor  # interval index (float tensor holding integers)
    t_raw: Tensor  # (z - b_r)/h before the clamp
    t: Tensor  # clamp(t_raw, 0, 1), derivative of t_raw
    E_r: Tensor  # e^{b_r}
    E_r1: Tensor  # e^{b_{r+1}}
    wL: Tensor  # LERP weight (1 - t) e^{b_r} + t e^{b_{r+1}}
    wN: Tensor  # Nearest weight e^{b_l}, l = r + [t >= 1/2]
    keep: Tensor  # keys whose weight is the formula (valid, in window, row not degenerate)
    ones: Tensor  # keys forced to weight 1 (valid keys of a degenerate MinMax row)


def grid(s: Tensor, valid: Tensor, spec: OperatorSpec, M: Tensor, m: Tensor) -> Grid:
    """Reconstruction terms. ``M``/``m`` may be detached by the caller (range_grad)."""
    K = spec.K
    z = s - M
    if spec.calibration == "minmax":
        span = M - m
        degenerate = span <= EPS_DEGENERATE  # also single-key and empty rows (span 0)
        h = torch.where(degenerate, torch.ones_like(span), span / K)  # safe width before any division
        b_origin = m - M  # z_min
        z_in = z
        r = torch.floor((z - b_origin) / h).clamp(0, K - 1)
        keep = valid & ~degenerate
        ones = valid & degenerate
    else:  # fwm, resolved: step tau/K, origin -tau, anchored at M
        tau = spec.tau
        h = torch.full_like(M, tau / K)
        b_origin = -tau
        if spec.calibration == "fwm":
            z_in = z.clamp(-tau, 0)  # z~ = clip(z, -tau, 0)
            r = torch.floor((z_in + tau) / h).clamp(0, K - 1)
            keep = valid & (z >= -tau)  # zero tail for z < -tau
        else:  # resolved: the grid continues below -tau with negative indices; nothing is truncated
            z_in = z
            r = torch.floor((z_in + tau) / h).clamp(max=K - 1)
            keep = valid
        ones = torch.zeros_like(valid)
    b_r = b_origin + r * h  # b_r = z_min + r h (MinMax), -tau + r h (FWM, resolved)
    b_r1 = b_origin + (r + 1) * h
    t_raw = (z_in - b_r) / h
    t = _RoundingClamp.apply(t_raw)
    E_r, E_r1 = torch.exp(b_r), torch.exp(b_r1)
    wL = (1 - t) * E_r + t * E_r1
    ell = r + (t >= 0.5).to(s.dtype)  # Nearest: a midpoint t = 1/2 rounds up
    wN = torch.exp(b_origin + ell * h)
    return Grid(z, h, r, t_raw, t, E_r, E_r1, wL, wN, keep, ones)


class _RoundingClamp(torch.autograd.Function):
    """clamp(t, 0, 1) in the forward; identity derivative (the clamp only catches rounding, see above)."""

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        return t.clamp(0, 1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def place(w: Tensor, g: Grid) -> Tensor:
    """Formula weight on kept keys, 1 on degenerate rows, 0 elsewhere (``torch.where``: no gradient leaks)."""
    return torch.where(g.keep, w, torch.where(g.ones, torch.ones_like(w), torch.zeros_like(w)))


def normalize(w: Tensor) -> Tensor:
    """P = w / sum(w); an all-zero row (fully masked) stays zero."""
    W = w.sum(-1, keepdim=True)
    pos = W > 0
    return torch.where(pos, w / torch.where(pos, W, torch.ones_like(W)), torch.zeros_like(w))


class _ZeroSumProjection(torch.autograd.Function):
    """Identity forward; backward projects each row's gradient onto the valid keys' zero-sum subspace (P1)."""

    @staticmethod
    def forward(ctx, s: Tensor, valid: Tensor) -> Tensor:
        ctx.save_for_backward(valid)
        return s.view_as(s)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (valid,) = ctx.saved_tensors
        return project_zero_sum(grad, valid), None


def project_zero_sum(grad: Tensor, valid: Tensor) -> Tensor:
    """g' = g - mean_{valid}(g) on valid keys, 0 elsewhere (App. B, the P1 control)."""
    g = torch.where(valid, grad, torch.zeros_like(grad))
    n = valid.sum(-1, keepdim=True).clamp(min=1).to(grad.dtype)
    return torch.where(valid, g - g.sum(-1, keepdim=True) / n, torch.zeros_like(g))


def extrema_for_grad(ext: RowExtrema, range_grad: str) -> tuple[Tensor, Tensor]:
    """Which extremum stays on the tape: full keeps both, max_only M, min_only m, detach/p1 neither."""
    M = ext.M if range_grad in ("full", "max_only") else ext.M.detach()
    m = ext.m if range_grad in ("full", "min_only") else ext.m.detach()
    return M, m


def reference_probs(s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
    """Attention probabilities of ``spec`` on scores ``s`` (any float dtype; computed in ``s.dtype``)."""
    if spec.range_grad == "p1":
        s = _ZeroSumProjection.apply(s, valid)
    ext = row_extrema(s, valid)
    zero = torch.zeros_like(s)

    if not spec.is_kinterval:  # baselines keep the max on the tape (App. D.5)
        z = torch.where(valid, s - ext.M, zero)
        if spec.kind == "softmax":
            w = torch.exp(z)
        elif spec.kind == "bf16-exp":  # z rounded to bf16, exp with bf16 output, back to the working dtype
            w = torch.exp(z.to(torch.bfloat16)).to(s.dtype)
        else:  # fp8-exp: E4M3-rounded fp32 exp, identity surrogate with the exp derivative
            w_exp = torch.exp(z)
            w_fp8 = w_exp.detach().to(torch.float8_e4m3fn).to(s.dtype)
            w = w_fp8 + (w_exp - w_exp.detach())
        return normalize(torch.where(valid, w, zero))

    M, m = extrema_for_grad(ext, spec.range_grad)
    s_safe = torch.where(valid, s, M.detach().expand_as(s))  # masked keys never reach exp/division
    g = grid(s_safe, valid, spec, M, m)
    wL = place(g.wL, g)
    if spec.reconstruction == "lerp":
        return normalize(wL)
    wN = place(g.wN, g).detach()  # the hard branch only ever enters inside a stop-gradient
    if spec.surrogate == "weight":
        if spec.arithmetic == "strict":  # w = sg(wN) + (wL - sg(wL)): forward is wN bit for bit
            w = wN + (wL - wL.detach())
        else:  # historical: w = wL + sg(wN - wL)
            w = wL + (wN - wL).detach()
        return normalize(w)
    PL = normalize(wL)
    if spec.arithmetic == "strict":  # P = sg(PN) + (PL - sg(PL))
        return normalize(wN) + (PL - PL.detach())
    PH = normalize(wL.detach() + (wN - wL.detach()))  # historical P^H, normalized from the historical weight
    return PL + (PH - PL).detach()
