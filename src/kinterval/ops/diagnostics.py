"""Gradient-consistency diagnostics run when the detach defect was found (App. F, "Gradient-consistency
diagnostics"): A1 shift invariance, A2 the zero-sum residual, A3 the all-ones directional finite difference,
A4 the interior finite difference; and the fixed-upstream decomposition g_full = g_self + g_M + g_m.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from kinterval.ops.api import as_spec, attended_keys, attention_probs, valid_mask
from kinterval.ops.closed_form import score_grad_terms
from kinterval.ops.formulas import grid, row_extrema
from kinterval.ops.seeds import check_seed
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


def median(x: Tensor) -> float:
    """The median of the values of ``x`` (the mean of the two middle ones for an even count, where
    ``torch.median`` returns the lower); NaN when ``x`` is empty."""
    return float(np.median(x.detach().double().cpu().numpy())) if x.numel() else float("nan")


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
    """g_self, g_M, g_m of the local VJP at fixed upstream u = dL/dP (Table S-graddecomp): the three terms
    of dL/ds, eq. (2): the direct one and the range terms through ∂w/∂M and ∂w/∂m, eq. (1).

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


# ------------------------------------------------------------------------ the App. F table, all at once
CONSISTENCY_KS = (2, 4, 8, 16, 32)
CONSISTENCY_FAMILIES = ("lerp", "minmax-weight", "minmax-prob")  # LERP and Nearest (both surrogates)
CONSISTENCY_MODES = ("full", "detach", "p1")  # range_grad of the K-interval operators
SHIFT_C = 0.1  # A1's c: not a binary fraction, so s + c is rounded and A1 sees fp64 rounding
EPS_A3, EPS_A4 = 1e-4, 1e-5  # central finite-difference steps (A3 along s + c 1, A4 one interior key)
A1_ULPS = 1000  # A1 passes when max |F(S + c 1) - F(S)| <= A1_ULPS * eps64 * max |s + c|: rounding of s + c


def _family(spec: OperatorSpec) -> str:
    """The name without ``-k{K}``: ``lerp``, ``minmax-weight``, ``softmax``."""
    return str(spec).rsplit("-k", 1)[0] if spec.is_kinterval else str(spec)


def _interior_keys(s: Tensor, valid: Tensor, spec: OperatorSpec, eps: float) -> tuple[Tensor, Tensor]:
    """A4's keys: one per row with three or more keys, neither extremum of its row (further than ``eps`` from
    both, so the finite difference moves neither M nor m) and, for LERP, the key whose place t on its grid
    interval is nearest 1/2 (away from the kinks of the weight). Returns (rows mask, key index per row)."""
    ext = row_extrema(s, valid)
    ok = valid & (s < ext.M - 10 * eps) & (s > ext.m + 10 * eps)
    if spec.is_kinterval:
        g = grid(s, valid, spec, ext.M, ext.m)
        ok &= g.keep & (g.t_raw > 0.01) & (g.t_raw < 0.99)
        badness = (g.t_raw - 0.5).abs()
    else:  # softmax: the key nearest the middle of the row's range
        badness = (s - (ext.M + ext.m) / 2).abs()
    badness = torch.where(ok, badness, torch.inf)
    return ok.any(-1), badness.argmin(-1)


def _interior_fd_rows(s, spec, up, grad, valid) -> tuple[float | None, int]:
    """A4 on every row at once: rows are independent, so one perturbed key per row gives each row's own
    central difference of L_i = <up_i, P_i>. Returns max |autograd - FD| / max |autograd| over the keys
    (None without any) and the number of keys."""
    rows, key = _interior_keys(s, valid, spec, EPS_A4)
    if not rows.any():
        return None, 0
    e = torch.zeros_like(s).scatter_(-1, key.unsqueeze(-1), EPS_A4) * rows.unsqueeze(-1)

    def row_loss(x):
        return (attention_probs(x, spec, causal=True) * up).sum(-1)

    fd = ((row_loss(s + e) - row_loss(s - e)) / (2 * EPS_A4))[rows]
    ad = grad.gather(-1, key.unsqueeze(-1)).squeeze(-1)[rows]
    return ((ad - fd).abs().max() / ad.abs().max().clamp(min=1e-300)).item(), int(rows.sum())


def consistency_table(*, T: int = 64, scale: float = 6.0, seed: int = 0, Ks=None, operators=None) -> dict:
    """The gradient-consistency diagnostics of App. F (A1-A4 and the P1-0 projection sanity check) in float64.

    Scores and upstream gradients are drawn as ``kinterval ops`` (table) draws them: 4 x 4 heads of causal
    T x T rows, scores N(0, scale^2), upstream dL/dP N(0, 1), from ``seed``; then cast to float64. Operators:
    softmax and, for each K of ``Ks`` (default 2, 4, 8, 16, 32), LERP and Nearest (MinMax-Weight,
    MinMax-Prob); or the names of ``operators`` (with their own K; not with ``Ks``). Every K-interval operator
    runs under range_grad full, detach and p1.

    Returns ``{"settings", "rows", "summary"}``: one row per (operator, range_grad) with A1 ``shift_max_abs``
    (max |F(S + c 1) - F(S)|), A2 ``residual_median``/``residual_max`` (rows with two or more keys), A3
    ``directional_autograd`` vs ``directional_fd`` (true value 0), A4 ``interior_rel_err`` over
    ``interior_keys`` keys (one per row; both None where the forward is hard: Nearest, bf16-exp, fp8-exp),
    ``max_abs_vs_full`` (max |g - g_full|) and, on p1 rows,
    ``forward_equals_detach``; ``summary`` aggregates them per family the way the paper's table reports them.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 3:  # A4 needs a key that is neither extremum
        raise ValueError(f"T must be an integer >= 3 (A4 needs rows of three keys), got {T!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    check_seed(seed, "seed")
    specs = _consistency_specs(Ks, operators)
    gen = torch.Generator().manual_seed(seed)
    s32 = torch.randn(4, 4, T, T, generator=gen) * scale  # as the operator table draws them
    if not s32.isfinite().all():
        raise ValueError(f"scale {scale:g} makes float32 scores overflow; use a smaller scale")
    s, up = s32.double(), torch.randn(s32.shape, generator=gen).double()
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    rows = []
    for spec in specs:
        # A1 and A3's finite difference read the forward only: one value for every range_grad
        shift = shift_invariance(s, spec, SHIFT_C, causal=True)
        fd3 = ((_loss(s + EPS_A3, spec, up, causal=True) - _loss(s - EPS_A3, spec, up, causal=True))
               / (2 * EPS_A3)).item()  # fmt: skip
        differentiable = spec.kind == "softmax" or spec.reconstruction == "lerp"  # A4: no hard forward
        modes = CONSISTENCY_MODES if spec.is_kinterval else ("full",)
        out = {}
        for mode in modes:
            sp = OperatorSpec.parse(spec, range_grad=mode) if mode != "full" else spec
            x = s.clone().requires_grad_()
            P = attention_probs(x, sp, causal=True)
            (grad,) = torch.autograd.grad((P * up).sum(), x)
            out[mode] = P.detach(), grad
            rho = zero_sum_residual(grad, valid)[..., 1:]  # rows with two or more keys
            a4, n4 = _interior_fd_rows(s, sp, up, grad, valid) if differentiable else (None, None)
            rows.append({
                "operator": str(spec), "family": _family(spec), "K": spec.K, "range_grad": mode,
                "shift_max_abs": shift,
                "residual_median": median(rho), "residual_max": rho.max().item(),
                "directional_autograd": torch.where(valid, grad, 0.0).sum().item(), "directional_fd": fd3,
                "interior_rel_err": a4, "interior_keys": n4,
                "max_abs_vs_full": (grad - out["full"][1]).abs().max().item(),
                "forward_equals_detach": torch.equal(P.detach(), out["detach"][0]) if mode == "p1" else None,
            })  # fmt: skip
    tol = A1_ULPS * torch.finfo(torch.float64).eps * (s.abs().max().item() + SHIFT_C)
    settings = {"T": T, "scale": float(scale), "seed": seed, "dtype": "float64", "heads": [4, 4],
                "shift_c": SHIFT_C, "shift_tol": tol, "eps_directional": EPS_A3,
                "eps_interior": EPS_A4}  # fmt: skip
    return {"settings": settings, "rows": rows, "summary": _consistency_summary(rows, tol)}


def _consistency_specs(Ks, operators) -> list[OperatorSpec]:
    """The operators of :func:`consistency_table`: softmax and each family at each K, or ``operators``."""
    if operators is not None and Ks is not None:
        raise ValueError(
            "give Ks (the K of the default operators) or operators (names with their K), not both"
        )
    if operators is None:
        Ks = CONSISTENCY_KS if Ks is None else Ks
        if isinstance(Ks, (str, bytes)) or not hasattr(Ks, "__iter__"):
            raise ValueError(f"Ks must be a list of integers >= 1, got {Ks!r}")
        Ks = list(Ks)
        if not Ks or any(isinstance(K, bool) or not isinstance(K, int) or K < 1 for K in Ks):
            raise ValueError(f"Ks must be a non-empty list of integers >= 1, got {Ks!r}")
        operators = ["softmax"] + [f"{f}-k{K}" for K in Ks for f in CONSISTENCY_FAMILIES]
    if isinstance(operators, (str, bytes)) or not hasattr(operators, "__iter__"):
        raise ValueError(f"operators must be a list of operator names, got {operators!r}")
    specs = [o if isinstance(o, OperatorSpec) else OperatorSpec.from_full_name(o) for o in operators]
    if not specs:
        raise ValueError("operators names no operator")
    for spec in specs:
        if spec.range_grad != "full":
            raise ValueError(f"operator {spec.full_name!r} sets range_grad; the diagnostics run full, detach "
                             f"and p1 themselves")  # fmt: skip
    names = [s.full_name for s in specs]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"operator(s) given twice: {', '.join(twice)}")
    return specs


def _consistency_summary(rows: list[dict], shift_tol: float) -> dict:
    """Per family and range_grad, the numbers of the paper's Result column: A1 the largest deviation; A2 the
    largest residual and the range of the per-K medians; A3 the values at the largest K and the largest
    |autograd|; A4 the largest relative error; P1-0 bitwise forwards, projected residual and
    max |g_p1 - g_full|."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["range_grad"]), []).append(r)
    per = {}
    for (fam, mode), rs in groups.items():
        top = max(rs, key=lambda r: r["K"] or 0)  # the largest K (paper: K = 32)
        a4 = [r["interior_rel_err"] for r in rs if r["interior_rel_err"] is not None]
        per.setdefault(fam, {})[mode] = {
            "residual_max": max(r["residual_max"] for r in rs),
            "residual_median_min": min(r["residual_median"] for r in rs),
            "residual_median_max": max(r["residual_median"] for r in rs),
            "K_top": top["K"], "directional_autograd_top": top["directional_autograd"],
            "directional_fd_top": top["directional_fd"],
            "directional_autograd_max_abs": max(abs(r["directional_autograd"]) for r in rs),
            "interior_rel_err_max": max(a4) if a4 else None,
            "interior_keys": None if rs[0]["interior_keys"] is None else sum(r["interior_keys"] for r in rs),
            "max_abs_vs_full_top": top["max_abs_vs_full"],
            "max_abs_vs_full_max": max(r["max_abs_vs_full"] for r in rs),
            "forward_equals_detach_all": (all(r["forward_equals_detach"] for r in rs)
                                          if mode == "p1" else None),
        }  # fmt: skip
    shift = max(r["shift_max_abs"] for r in rows)
    operators = len({r["operator"] for r in rows})
    return {"shift_max_abs": shift, "shift_pass": shift <= shift_tol, "operators": operators, "families": per}
