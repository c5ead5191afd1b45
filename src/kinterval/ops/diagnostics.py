"""Gradient-consistency diagnostics run when the detach defect was found (App. F, "Gradient-consistency
diagnostics"): A1 shift invariance, A2 the zero-sum residual, A3 the all-ones directional finite difference,
A4 the interior finite difference; and the fixed-upstream decomposition g_full = g_self + g_M + g_m.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kinterval.ops.api import as_spec, attended_keys, attention_probs, valid_mask
from kinterval.ops.closed_form import score_grad_terms
from kinterval.ops.spec import OperatorSpec


def _loss(scores: Tensor, spec: OperatorSpec, upstream: Tensor, **mask_kw) -> Tensor:
    """L = <upstream, P(scores)>: a linear loss whose gradient at P is ``upstream``."""
    return (attention_probs(scores, spec, **mask_kw) * upstream).sum()


def check_upstream(scores: Tensor, upstream: Tensor) -> None:
    """``upstream`` (dL/dP) must be a tensor of exactly the scores' shape: broadcasting would silently sum
    the loss over the broadcast dimensions, and a mismatch would surface as a raw torch error."""
    if not isinstance(upstream, Tensor) or not isinstance(scores, Tensor):
        raise ValueError(
            f"scores and upstream must be tensors, got {type(scores).__name__} and {type(upstream).__name__}"
        )
    if upstream.shape != scores.shape:
        raise ValueError(
            f"upstream (dL/dP) must have the shape of the scores {tuple(scores.shape)}, "
            f"got {tuple(upstream.shape)}"
        )


def score_gradient(scores: Tensor, spec, upstream: Tensor, *, causal=False, mask=None, backend="reference"):
    """The implemented score gradient dL/ds for L = <upstream, P>."""
    check_upstream(scores, upstream)
    s = scores.detach().clone().requires_grad_()
    P = attention_probs(s, as_spec(spec), causal=causal, mask=mask, backend=backend)
    (grad,) = torch.autograd.grad((P * upstream).sum(), s)
    return grad


# ----------------------------------------------------------------------------------------------- A1 - A4
def shift_invariance(scores: Tensor, spec, c: float = 3.0, *, causal=False, mask=None) -> float:
    """A1: max |F(s + c 1) - F(s)| over all entries (0 up to rounding for every operator)."""
    spec = as_spec(spec)
    P0 = attention_probs(scores, spec, causal=causal, mask=mask)
    P1 = attention_probs(scores + c, spec, causal=causal, mask=mask)
    return (P1 - P0).abs().max().item()


def zero_sum_residual(grad: Tensor, valid: Tensor | None = None) -> Tensor:
    """A2: rho = |sum_j g_ij| / sum_j |g_ij| per row (rows with zero gradient give 0; a row with a NaN or
    infinite gradient gives NaN, never a good value)."""
    if valid is not None:
        grad = torch.where(valid, grad, torch.zeros_like(grad))
    denom = grad.abs().sum(-1)
    return torch.where(denom == 0, 0.0, grad.sum(-1).abs() / denom)


@dataclass
class DirectionalCheck:
    autograd: float  # the implemented derivative along the direction
    finite_difference: float  # central finite difference of the forward


def all_ones_directional(scores, spec, upstream, eps: float = 1e-4, *, causal=False, mask=None):
    """A3: the derivative along s + c 1. The forward is shift invariant, so the true value is 0; the
    implemented gradient gives sum_ij dL/ds_ij (nonzero under detach)."""
    spec = as_spec(spec)
    s = scores.to(torch.float64)
    grad = score_gradient(s, spec, upstream, causal=causal, mask=mask)
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    fd = (
        _loss(s + eps, spec, upstream, causal=causal, mask=mask)
        - _loss(s - eps, spec, upstream, causal=causal, mask=mask)
    ) / (2 * eps)
    return DirectionalCheck(torch.where(valid, grad, 0.0).sum().item(), fd.item())


def interior_fd(scores, spec, upstream, index: tuple, eps: float = 1e-6, *, causal=False, mask=None):
    """A4: dL/ds at one entry ``index`` (a key that is neither extremum of its row and away from grid
    boundaries) by autograd and by central finite differences; LERP slopes must match for full and detach."""
    spec = as_spec(spec)
    s = scores.to(torch.float64)
    grad = score_gradient(s, spec, upstream, causal=causal, mask=mask)
    e = torch.zeros_like(s)
    e[index] = eps
    fd = (
        _loss(s + e, spec, upstream, causal=causal, mask=mask)
        - _loss(s - e, spec, upstream, causal=causal, mask=mask)
    ) / (2 * eps)
    return DirectionalCheck(grad[index].item(), fd.item())


# ------------------------------------------------------------------------------ fixed-upstream decomposition
def decompose_score_grad(
    scores: Tensor, upstream: Tensor, spec, *, causal=False, mask=None
) -> dict[str, Tensor]:
    """g_self, g_M, g_m of the local VJP at fixed upstream u = dL/dP (Table S-graddecomp).

    g_full = g_self + g_M + g_m; detach = g_self; max_only = g_self + g_M; min_only = g_self + g_m. The M and
    m terms fall entirely on the arg-max and arg-min keys. ``upstream`` must have the shape of ``scores``
    (else ``ValueError`` naming both shapes).
    """
    spec = as_spec(spec)
    check_upstream(scores, upstream)
    s = scores if scores.dtype == torch.float64 else scores.float()
    valid = attended_keys(s, causal=causal, mask=mask)  # as attention_probs: NaN / +inf raise, -inf is masked
    t = score_grad_terms(s, valid, spec, upstream.to(s.dtype))
    return {"g_self": t["self"], "g_M": t["M"], "g_m": t["m"], "g_full": t["self"] + t["M"] + t["m"]}
