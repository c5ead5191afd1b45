"""Closed-form backward of the operator family: eqs. (1)-(4) of §3 and App. B, with no autograd inside.

The forward is the reference forward (bit-identical by construction). The backward recomputes the grid from
the saved scores and applies, per row,

    gamma_j = (g_j - sum_i P_i g_i) / W                          normalization Jacobian (App. B)
    dL/ds_i = gamma_i Delta_i                                   self term, Delta = (e^{b_{r+1}} - e^{b_r})/h
              + [i = argmax] sum_j gamma_j dw_j/dM                eq. (4), split evenly among tied maxima
              + [i = argmin] sum_j gamma_j dw_j/dm
    dw_j/dM = -w_j - Delta_j rho_j + X_j,  dw_j/dm = -Delta_j (1 - rho_j) + w_j - X_j        eq. (3), MinMax
    dw_j/dM = -Delta_j (no m term)                                FWM and resolved

with (P, W) the point where the normalization Jacobian is evaluated: (P^L, W^L) for LERP and Prob-STE (eq. 2),
(P^N, W^N) for Weight-STE (eq. 1; the historical weight w^H in historical arithmetic). ``range_grad`` keeps
both extremum terms (full), one (max_only/min_only) or none (detach); p1 then projects onto the zero-sum
subspace. t is differentiated as t_raw (the clamp on t only catches rounding; see reference.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops.reference import grid, normalize, place, project_zero_sum, reference_probs, row_extrema
from kinterval.ops.spec import OperatorSpec


class ClosedFormProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
        with torch.no_grad():
            P = reference_probs(s, valid, spec)
        ctx.spec = spec
        ctx.save_for_backward(s, valid)  # the scores and the mask; everything else is recomputed
        return P

    @staticmethod
    def backward(ctx, g: Tensor):
        s, valid = ctx.saved_tensors
        return score_grad(s, valid, ctx.spec, g), None, None


def closed_form_probs(s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
    return ClosedFormProbs.apply(s, valid, spec)


def _gamma(g: Tensor, P: Tensor, W: Tensor) -> Tensor:
    """gamma = (g - <g>_P) / W, the normalization Jacobian contracted with g (App. B)."""
    W_safe = torch.where(W > 0, W, torch.ones_like(W))
    return (g - (P * g).sum(-1, keepdim=True)) / W_safe


def _to_extremum(grad_row: Tensor, is_ext: Tensor) -> Tensor:
    """Put a per-row gradient on the row's extremum keys, split evenly among ties (as amax/amin do)."""
    n = is_ext.sum(-1, keepdim=True).clamp(min=1).to(grad_row.dtype)
    return torch.where(is_ext, grad_row / n, torch.zeros_like(grad_row).expand_as(is_ext))


@torch.no_grad()
def score_grad(s: Tensor, valid: Tensor, spec: OperatorSpec, g: Tensor) -> Tensor:
    """dL/ds for upstream g = dL/dP, in closed form."""
    terms = score_grad_terms(s, valid, spec, g)
    ds = terms["self"]
    rg = spec.range_grad if spec.is_kinterval else "full"
    if rg in ("full", "max_only"):
        ds = ds + terms["M"]
    if rg in ("full", "min_only"):
        ds = ds + terms["m"]
    if rg == "p1":
        ds = project_zero_sum(ds, valid)
    return ds


@torch.no_grad()
def score_grad_terms(s: Tensor, valid: Tensor, spec: OperatorSpec, g: Tensor) -> dict[str, Tensor]:
    """The three per-key terms of eq. (4): self (gamma Delta), M (on arg-max keys), m (on arg-min keys).

    Their sum is the full calibration gradient; detach keeps "self", max_only "self" + "M", min_only
    "self" + "m" (App. F, the fixed-upstream decomposition).
    """
    ext = row_extrema(s, valid)
    M, m = ext.M, ext.m
    is_max = valid & (s == M)
    is_min = valid & (s == m)
    zero = torch.zeros_like(s)

    if not spec.is_kinterval:
        z = torch.where(valid, s - M, zero)
        if spec.kind == "softmax":
            w = torch.where(valid, torch.exp(z), zero)
            gamma = _gamma(g, normalize(w), w.sum(-1, keepdim=True))
            dz = torch.where(valid, gamma * w, zero)  # d e^z / dz = e^z
        elif spec.kind == "bf16-exp":
            e_bf16 = torch.exp(z.to(torch.bfloat16))
            w = torch.where(valid, e_bf16.to(s.dtype), zero)
            gamma = torch.where(valid, _gamma(g, normalize(w), w.sum(-1, keepdim=True)), zero)
            # autograd through the casts: the gradient is rounded to bf16 and multiplied by the bf16 exp
            dz = torch.where(valid, (gamma.to(torch.bfloat16) * e_bf16).to(s.dtype), zero)
        else:  # fp8-exp: normalization at the E4M3-rounded weights, fp32 exp derivative
            w_exp = torch.exp(z)
            w = torch.where(valid, w_exp.to(torch.float8_e4m3fn).to(s.dtype), zero)
            gamma = _gamma(g, normalize(w), w.sum(-1, keepdim=True))
            dz = torch.where(valid, gamma * w_exp, zero)
        dM = -dz.sum(-1, keepdim=True)  # z = s - M: the max channel carries minus the row sum
        return {"self": dz, "M": _to_extremum(dM, is_max), "m": zero}

    s_safe = torch.where(valid, s, M.expand_as(s))
    gr = grid(s_safe, valid, spec, M, m)
    wL = place(gr.wL, gr)
    # The point (P, W) at which the normalization Jacobian is evaluated (eqs. 1, 2).
    if spec.reconstruction == "lerp" or spec.surrogate == "prob":
        w_at = wL
    else:
        wN = place(gr.wN, gr)
        w_at = wN if spec.arithmetic == "strict" else wL + (wN - wL)  # historical w^H = wL + sg(wN - wL)
    gamma = torch.where(gr.keep, _gamma(g, normalize(w_at), w_at.sum(-1, keepdim=True)), zero)

    Delta = (gr.E_r1 - gr.E_r) / gr.h  # LERP secant slope
    self_term = gamma * Delta  # eq. (4), first term

    if spec.calibration == "minmax":
        K = spec.K
        rho = (gr.r + gr.t_raw) / K  # normalized position (r + t)/K
        # Y = w^L - X with X = [(1-t) r e^{b_r} + t (r+1) e^{b_{r+1}}]/K, written as a sum of non-negative
        # terms: eq. (3) evaluated as -w + X cancels badly in float32 at small K and wide spans.
        Y = (1 - gr.t) * gr.E_r * (1 - gr.r / K) + gr.t * gr.E_r1 * (1 - (gr.r + 1) / K)
        dw_dM = -Y - Delta * rho  # eq. (3): -w - Delta rho + X
        dw_dm = Y - Delta * (1 - rho)  # eq. (3): -Delta (1 - rho) + w - X
        G_M = (gamma * dw_dM).sum(-1, keepdim=True)
        G_m = (gamma * dw_dm).sum(-1, keepdim=True)
        m_term = _to_extremum(G_m, is_min)
    else:  # FWM / resolved: w depends on s only through z = s - M, so dw/dM = -dw/ds on kept keys
        G_M = -self_term.sum(-1, keepdim=True)
        m_term = zero
    return {"self": self_term, "M": _to_extremum(G_M, is_max), "m": m_term}
