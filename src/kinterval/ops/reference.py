"""Reference operators: the paper's formulas (``formulas.py``) composed directly, differentiated by autograd.

Everything acts on the last dimension of ``s`` (one attention row per index of the leading dimensions) with a
boolean ``valid`` mask of the same shape. The closed-form backward recomputes the same grid with the same
functions, so both backends compute bit-identical forwards; the backward of this module is autograd's.

Conventions "as implemented" (App. A, Table S1):
* extrema over valid keys only (``amax``/``amin``, which split the gradient evenly among ties);
* MinMax rows with ``M - m <= 1e-12`` (or one valid key) are degenerate: weight 1 on every valid key, zero
  gradient, a safe width ``h = 1`` so that no 0/0 is formed;
* FWM zeroes keys with ``z < -tau`` (strict inequality) and keeps the gradient through ``M``;
* ``t_raw = (z - b_r)/h`` lies in [0, 1] by construction of ``r``; the clamp on ``t`` only removes rounding
  excursions (e.g. 1 + 1ulp at the arg-max key), so its derivative is the interval's interior one (the
  paper's Delta on every kept key). The gradient then never depends on the last bit of ``t_raw``;
* FWM's clip of ``z`` to [-tau, 0] has derivative 1 on every kept key, the bounds included
  (``formulas._clip_fwm``; not ``torch.clamp``'s, which changed at the bounds in torch 2.14);
* a fully masked row gives all-zero probabilities and zero gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kinterval.ops.formulas import (  # noqa: F401  (grid, row_extrema: re-exported for callers)
    EPS_DEGENERATE,
    Grid,
    RowExtrema,
    grid,
    lerp_weight,
    nearest_weight,
    normalize,
    prob_ste,
    row_extrema,
    weight_ste,
)
from kinterval.ops.spec import OperatorSpec


def place(w: Tensor, g: Grid) -> Tensor:
    """Formula weight on kept keys, 1 on degenerate rows, 0 elsewhere (``torch.where``: no gradient leaks)."""
    return torch.where(g.keep, w, torch.where(g.ones, torch.ones_like(w), torch.zeros_like(w)))


class _ZeroSumProjection(torch.autograd.Function):
    """Identity forward; backward projects each row's gradient onto the valid keys' zero-sum subspace (P1)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(s: Tensor, valid: Tensor) -> Tensor:
        return s.clone()  # not a view: forward mode (jvp) returns a projected tangent, which is no view

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        (valid,) = ctx.saved_tensors
        return project_zero_sum(grad, valid), None

    @staticmethod
    def jvp(ctx, s_t: Tensor, valid_t) -> Tensor:  # forward mode: the projection is symmetric
        (valid,) = ctx.saved_tensors
        return project_zero_sum(s_t, valid)


def project_zero_sum(grad: Tensor, valid: Tensor) -> Tensor:
    """g' = g - mean_{valid}(g) on valid keys, 0 elsewhere (App. B, the P1 control)."""
    g = torch.where(valid, grad, torch.zeros_like(grad))
    n = valid.sum(-1, keepdim=True).clamp(min=1).to(grad.dtype)
    return torch.where(valid, g - g.sum(-1, keepdim=True) / n, torch.zeros_like(g))


def extrema_for_grad(ext: RowExtrema, range_grad: str) -> tuple[Tensor, Tensor]:
    """Which extremum stays on the tape: full keeps both, max_only M, min_only m, detach/p1 neither: which
    range terms of dL/ds, eq. (2), the backward keeps (those through ∂w/∂M and ∂w/∂m, eq. (1))."""
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
    wL = place(lerp_weight(g), g)
    if spec.reconstruction == "lerp":
        return normalize(wL)
    wN = place(nearest_weight(g), g).detach()  # the hard branch only ever enters inside a stop-gradient
    if spec.surrogate == "weight":
        return weight_ste(wL, wN, spec.arithmetic)  # eq. (3)
    return prob_ste(wL, wN, spec.arithmetic)  # eq. (4)
