"""Closed-form backward of the operator family: eqs. (1)–(4) of §3 and App. B, with no autograd inside.

The forward is the reference forward (bit-identical by construction). The backward recomputes the grid from
the saved scores and applies, per row, the functions of ``formulas.py``:

    gamma_j = (g_j - sum_i P_i g_i) / W                          gamma: normalization Jacobian (App. B)
    dL/ds_i = gamma_i Delta_i                                   score_grad, eq. (2): the self term
              + [i = argmax] sum_j gamma_j dw_j/dM                split evenly among tied maxima
              + [i = argmin] sum_j gamma_j dw_j/dm
    dw_j/dM = -w_j - Delta_j rho_j + X_j,  dw_j/dm = -Delta_j (1 - rho_j) + w_j - X_j        calibration_grad,
                                                                                           eq. (1), MinMax
    dw_j/dM = -Delta_j (no m term)                                FWM and resolved

with Delta = (e^{b_{r+1}} - e^{b_r})/h and (P, W) the point where the normalization Jacobian is evaluated
(``jacobian_point``): (P^L, W^L) for LERP and Prob-STE (eq. (4)), (P^N, W^N) for Weight-STE (eq. (3); the
historical weight w^H in historical arithmetic). ``range_grad`` keeps both extremum terms (full), one
(max_only/min_only) or none (detach); p1 then projects onto the zero-sum subspace. t is differentiated as
t_raw (the clamp on t only catches rounding; see ``formulas.grid``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops.autocast import outside_autocast
from kinterval.ops.first_order import first_order_only
from kinterval.ops.formulas import (
    calibration_grad,
    gamma,
    grid,
    jacobian_point,
    lerp_slope,
    lerp_weight,
    nearest_weight,
    row_extrema,
    score_grad,
    to_extremum,
)
from kinterval.ops.reference import place, project_zero_sum, reference_probs
from kinterval.ops.spec import OperatorSpec


class ClosedFormProbs(torch.autograd.Function):
    generate_vmap_rule = True  # forward and backward are PyTorch ops: torch.func.vmap batches them

    @staticmethod
    def forward(s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
        with torch.no_grad():
            return reference_probs(s, valid, spec)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        s, valid, spec = inputs
        ctx.spec = spec
        ctx.save_for_backward(s, valid)  # the scores and the mask; everything else is recomputed

    @staticmethod
    @first_order_only("backend 'closed_form'")  # a second derivative through it raises (first_order.py)
    def backward(ctx, g: Tensor):
        s, valid = ctx.saved_tensors
        with outside_autocast(s.device.type):  # as the forward ran (a backward called inside autocast)
            return closed_form_grad(s, valid, ctx.spec, g), None, None

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(FORWARD_MODE_MESSAGE)


FORWARD_MODE_MESSAGE = (
    "backend 'closed_form': its derivative is a reverse-mode backward only; forward mode (torch.func.jvp, "
    "jacfwd, hessian, torch.autograd.forward_ad) is not implemented: use backend='reference', which "
    "differentiates the operator's formulas with autograd in either mode"
)


def closed_form_probs(s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
    return ClosedFormProbs.apply(s, valid, spec)


@torch.no_grad()
def closed_form_grad(s: Tensor, valid: Tensor, spec: OperatorSpec, g: Tensor) -> Tensor:
    """dL/ds for upstream g = dL/dP, in closed form, with the extremum terms that ``range_grad`` keeps."""
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
    """The three per-key terms of eq. (2), dL/ds: self (gamma Delta), M (arg-max keys), m (arg-min keys).

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
            dz = torch.where(valid, gamma(g, w) * w, zero)  # d e^z / dz = e^z
        elif spec.kind == "bf16-exp":
            e_bf16 = torch.exp(z.to(torch.bfloat16))
            w = torch.where(valid, e_bf16.to(s.dtype), zero)
            gam = torch.where(valid, gamma(g, w), zero)
            # autograd through the casts: the gradient is rounded to bf16 and multiplied by the bf16 exp
            dz = torch.where(valid, (gam.to(torch.bfloat16) * e_bf16).to(s.dtype), zero)
        else:  # fp8-exp: normalization at the E4M3-rounded weights, fp32 exp derivative
            w_exp = torch.exp(z)
            w = torch.where(valid, w_exp.to(torch.float8_e4m3fn).to(s.dtype), zero)
            dz = torch.where(valid, gamma(g, w) * w_exp, zero)
        dM = -dz.sum(-1, keepdim=True)  # z = s - M: the max channel carries minus the row sum
        return {"self": dz, "M": to_extremum(dM, is_max), "m": zero}

    s_safe = torch.where(valid, s, M.expand_as(s))
    gr = grid(s_safe, valid, spec, M, m)
    wL = place(lerp_weight(gr), gr)
    wN = place(nearest_weight(gr), gr) if spec.reconstruction == "nearest" else wL
    gam = torch.where(gr.keep, gamma(g, jacobian_point(spec, wL, wN)), zero)
    Delta = lerp_slope(gr)
    if spec.calibration == "minmax":
        dw_dM, dw_dm = calibration_grad(gr, spec.K)  # eq. (1)
    else:  # FWM / resolved: w depends on s only through z = s - M, so dw/dM = -Delta and no m term
        dw_dM, dw_dm = -Delta, None
    return score_grad(gam, Delta, dw_dM, dw_dm, is_max, is_min)  # eq. (2)
