"""The paper's formulas as small named functions, in paper order (§3, App. A, App. B).

Each function is one object of the paper: the calibrated grid, the two reconstructions, the surrogates
Weight-STE (eq. (3)) and Prob-STE (eq. (4)), the calibration derivatives ∂w/∂M, ∂w/∂m (eq. (1)), the score
gradient dL/ds (eq. (2)) and the derivative of the MinMax hard map (eq. (5)). ``reference.py`` composes
them and lets autograd differentiate; ``closed_form.py`` composes them into the explicit backward; the Triton
kernels mirror them one-to-one as ``@triton.jit`` helpers of the same names. ``EQUATIONS`` maps the paper's
equation numbers to their labels and to these functions.

Rows are the last dimension; ``valid`` is a boolean mask of the same shape. The formulas assume what the paper
assumes (a nondegenerate row, a locally fixed interval index, unique extrema where they enter); the edge-case
conventions of App. A (Table S1) are in ``grid`` and in the tie split of ``score_grad``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kinterval.ops.spec import OperatorSpec


@dataclass(frozen=True)
class Equation:
    """One numbered equation of the paper."""

    label: str  # its \\label in the paper
    what: str
    where: str  # the section that states it
    function: str  # the function of this module that implements it
    keywords: tuple[str, ...]  # words that name it in prose (a mention "eq. (n)" sits near one of them)


EQUATIONS: dict[int, Equation] = {
    1: Equation(
        "eq:calgrad",
        "∂w/∂M and ∂w/∂m: the MinMax calibration derivatives of the LERP weight",
        "§3",
        "calibration_grad",
        ("calibration_grad", "∂w/∂M", "∂w_j/∂M", "∂w/∂m", "dw/dM", "dw_j/dM", "dw/dm", "-w + X", "−w + X"),
    ),
    2: Equation(
        "eq:full",
        "dL/ds: the full calibration gradient (self term plus the extremum terms)",
        "§3",
        "score_grad",
        (
            "score_grad",
            "dL/ds",
            "∂L/∂s",
            "calibration gradient",
            "calibration terms",
            "exact Jacobian",
            "self term",
            "self-term",
            "G_M",
        ),
    ),
    3: Equation(
        "eq:wste",
        "Weight-STE: the straight-through replacement on the weights, γ at (P^N, W^N)",
        "§3",
        "weight_ste",
        ("Weight-STE", "weight_ste", "γ^W", "gamma^W"),
    ),
    4: Equation(
        "eq:pste",
        "Prob-STE: the straight-through replacement on the probabilities, γ at (P^L, W^L)",
        "§3",
        "prob_ste",
        ("Prob-STE", "prob_ste", "γ^P", "gamma^P"),
    ),
    5: Equation(
        "eq:hardjac",
        "∂w^N/∂s: the derivative of the MinMax hard map with the index held fixed",
        "App. B",
        "hard_jacobian",
        ("hard_jacobian", "hard Jacobian", "hard map", "hard_weights", "dw^N"),
    ),
}

EPS_DEGENERATE = 1e-12  # App. A: the degenerate branch is M - m <= eps


# ---------------------------------------------------------------------------------- calibration (§3, App. A)
@dataclass
class RowExtrema:
    M: Tensor  # row max over valid keys (0 where the row is empty), shape (..., 1)
    m: Tensor  # row min over valid keys
    nonempty: Tensor  # (..., 1) bool


def row_extrema(s: Tensor, valid: Tensor) -> RowExtrema:
    """M and m over the valid keys (``amax``/``amin``: the gradient is split evenly among ties)."""
    nonempty = valid.any(-1, keepdim=True)
    if s.shape[-1] == 0:  # no keys at all (Tk = 0): every row is empty
        zero = s.new_zeros(nonempty.shape)
        return RowExtrema(zero, zero, nonempty)
    M = s.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
    m = s.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    return RowExtrema(torch.where(nonempty, M, zero), torch.where(nonempty, m, zero), nonempty)


@dataclass
class Grid:
    """A row's calibrated grid and each key's place on it (names as in §3 / App. A)."""

    z: Tensor  # s - M
    h: Tensor  # interval width (safe width 1 on degenerate MinMax rows)
    b0: Tensor | float  # grid origin: z_min (MinMax) or -tau (FWM, resolved)
    r: Tensor  # interval index (float tensor holding integers)
    t_raw: Tensor  # (z - b_r)/h before the clamp
    t: Tensor  # clamp(t_raw, 0, 1), derivative of t_raw
    E_r: Tensor  # grid value e^{b_r}
    E_r1: Tensor  # grid value e^{b_{r+1}}
    keep: Tensor  # keys whose weight is the formula (valid, in window, row not degenerate)
    ones: Tensor  # keys forced to weight 1 (valid keys of a degenerate MinMax row)
    K: int  # number of intervals


def grid(s: Tensor, valid: Tensor, spec: OperatorSpec, M: Tensor, m: Tensor) -> Grid:
    """The calibration rule of ``spec`` (App. A): MinMax h = (M - m)/K, b_r = z_min + r h; FWM h = tau/K,
    b_r = -tau + r h on z~ = clip(z, -tau, 0) with a zero tail z < -tau; resolved as FWM, the grid continued
    below -tau. ``M``/``m`` may be detached by the caller (range_grad)."""
    K = spec.K
    z = s - M
    if spec.calibration == "minmax":
        span = M - m
        degenerate = span <= EPS_DEGENERATE  # also single-key and empty rows (span 0)
        h = torch.where(degenerate, torch.ones_like(span), span / K)  # safe width before any division
        b0 = m - M  # z_min
        z_in = z
        r = torch.floor((z - b0) / h).clamp(0, K - 1)
        keep = valid & ~degenerate
        ones = valid & degenerate
    else:  # fwm, resolved: step tau/K, origin -tau, anchored at M
        tau = spec.tau
        h = torch.full_like(M, tau / K)
        b0 = -tau
        if spec.calibration == "fwm":
            z_in = _clip_fwm(z, tau)  # z~ = clip(z, -tau, 0)
            r = torch.floor((z_in + tau) / h).clamp(0, K - 1)
            keep = valid & (z >= -tau)  # zero tail for z < -tau
        else:  # resolved: the grid continues below -tau with negative indices; nothing is truncated
            z_in = z
            r = torch.floor((z_in + tau) / h).clamp(max=K - 1)
            keep = valid
        ones = torch.zeros_like(valid)
    b_r = b0 + r * h  # b_r = z_min + r h (MinMax), -tau + r h (FWM, resolved)
    b_r1 = b0 + (r + 1) * h
    t_raw = (z_in - b_r) / h
    t = _RoundingClamp.apply(t_raw, 0, 1)
    E_r, E_r1 = torch.exp(_grid_point(b_r, r == K)), torch.exp(_grid_point(b_r1, r + 1 == K))
    if spec.calibration == "minmax" and h.requires_grad:  # (closed_form's forward runs without autograd)
        E_r, E_r1 = _derivative_through(E_r, (r - K) * h), _derivative_through(E_r1, (r + 1 - K) * h)
    return Grid(z, h, b0, r, t_raw, t, E_r, E_r1, keep, ones, K)


def _derivative_through(E: Tensor, b: Tensor) -> Tensor:
    """``E`` = exp(b_r) in value, bit for bit, with its derivatives taken through ``b`` = (r - K) h, the same
    grid point as one product (b0 = -K h). Autograd of b0 + r h sums O(1) paths of M and m that cancel (at the
    top point b_K, exactly) into the same nodes as the O(1/h) ones of t: the reference's dL/dM and dL/dm lost
    eps * h relative (1e-5 at spans of 1e12 in float64, 1e-5 at 1e3 in float32). The closed form of eq. (1),
    calibration_grad, never forms those paths. expm1(0) = 0 keeps the value; E exp(b - b') carries every
    higher derivative (double backward, jvp)."""
    E0 = E.detach()
    return E0 + E0 * torch.expm1(b - b.detach())


def _clip_fwm(z: Tensor, tau: float) -> Tensor:
    """FWM's z~ = clip(z, -tau, 0) with derivative 1 on the closed interval [-tau, 0] (every kept key: the
    arg-max key at z = 0 and a key exactly at -tau too, App. A "as implemented") and 0 outside it (the zero
    tail). Not ``torch.clamp``'s own derivative: at its bounds that is 1 up to torch 2.13 and 0 from 2.14 on,
    which would move the reference's gradient with the torch version."""
    return torch.where((z >= -tau) & (z <= 0), z, z.clamp(-tau, 0))


def _grid_point(b: Tensor, top: Tensor) -> Tensor:
    """Every grid point is <= 0 and the top one b_K is 0. Rounding of b0 + K h moves b_K by a few ulps of the
    span: once the span is ~1e9 (fp32) or ~1e19 (fp64) and K is not a power of two, exp overflows (NaN
    weights) or underflows (rows summing to 0). An excursion above 1, or of b_K below -1, can only be such
    rounding: it is set to the exact 0. Smaller ones (normal spans) are kept: normal results do not change."""
    return torch.where((b > 1) | (top & (b < -1)), torch.zeros_like(b), b)


class _RoundingClamp(torch.autograd.Function):
    """clamp(x, lo, hi) in the forward; identity derivative: the clamp only catches rounding.

    ``t_raw = (z - b_r)/h`` lies in [0, 1] by construction of r; the clamp only removes rounding excursions
    (e.g. 1 + 1ulp at the arg-max key), so its derivative is the interval's interior one and the gradient
    never depends on the last bit of ``t_raw``. Likewise for the grid points b_r <= 0.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, lo, hi) -> Tensor:
        return x.clamp(lo, hi)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None

    @staticmethod
    def jvp(ctx, x_t: Tensor, lo_t, hi_t) -> Tensor:  # forward mode (jvp, jacfwd): the same identity
        return x_t


# ------------------------------------------------------------------------------- reconstruction (§3, App. A)
def lerp_weight(g: Grid) -> Tensor:
    """LERP: w^L = (1 - t) e^{b_r} + t e^{b_{r+1}}, a piecewise-linear reconstruction of e^z.

    The value is the formula's. Its derivative in t, e^{b_{r+1}} - e^{b_r}, is taken as h Delta
    (``lerp_slope``) through a term that adds exactly 0: the difference loses the digits of h (float32
    gradients 3e-3 off at K = 65536); the derivatives in e^{b_r} and e^{b_{r+1}} are the formula's."""
    t0 = g.t.detach()
    return ((1 - t0) * g.E_r + t0 * g.E_r1) + (g.t - t0) * (g.h * lerp_slope(g))


def lerp_slope(g: Grid) -> Tensor:
    """The LERP secant slope Delta = dw^L/dz = (e^{b_{r+1}} - e^{b_r})/h inside an interval (§3, App. B),
    evaluated as e^{b_{r+1}} (1 - e^{-h})/h with expm1: no cancellation at any K (the product stays finite:
    both factors are <= 1)."""
    return g.E_r1 * -torch.expm1(-g.h) / g.h


def nearest_weight(g: Grid) -> Tensor:
    """Nearest: w^N = e^{b_l}, l = r + [t >= 1/2], the nearest grid point in z (a midpoint rounds up)."""
    ell = g.r + (g.t >= 0.5).to(g.t.dtype)
    return torch.exp(_grid_point(g.b0 + ell * g.h, ell == g.K))


def normalize(w: Tensor) -> Tensor:
    """P = w / sum(w); an all-zero row (fully masked) stays zero."""
    W = w.sum(-1, keepdim=True)
    pos = W > 0
    return torch.where(pos, w / torch.where(pos, W, torch.ones_like(W)), torch.zeros_like(w))


# ------------------------------------------------------------------------------------------ surrogates (§3)
def weight_ste(wL: Tensor, wN: Tensor, arithmetic: str = "strict") -> Tensor:
    """Eq. (3) (``eq:wste``), Weight-STE: w = w^L + sg(w^N - w^L), P = w / sum w.

    The forward is P^N; the backward is LERP's with the normalization Jacobian at the hard point (P^N, W^N).
    ``strict`` evaluates sg(w^N) + (w^L - sg(w^L)), bit for bit w^N; ``historical`` the expression as written
    (App. C.2 (ii)), which differs from w^N by rounding. ``wN`` must carry no gradient.
    """
    if arithmetic == "strict":
        w = wN.detach() + (wL - wL.detach())
    else:
        w = wL + (wN - wL).detach()
    return normalize(w)


def prob_ste(wL: Tensor, wN: Tensor, arithmetic: str = "strict") -> Tensor:
    """Eq. (4) (``eq:pste``), Prob-STE: P = P^L + sg(P^N - P^L), P^L = w^L / W^L.

    The forward is P^N; the backward is the Jacobian of normalize(w^L), at (P^L, W^L). ``strict`` evaluates
    sg(P^N) + (P^L - sg(P^L)); ``historical`` P^L + sg(P^H - P^L) with P^H normalized from the historical
    weight w^L + sg(w^N - w^L) (App. C.2 (ii)).
    """
    PL = normalize(wL)
    if arithmetic == "strict":
        return normalize(wN.detach()) + (PL - PL.detach())
    PH = normalize(wL.detach() + (wN.detach() - wL.detach()))
    return PL + (PH - PL).detach()


def jacobian_point(spec: OperatorSpec, wL: Tensor, wN: Tensor) -> Tensor:
    """The weights at which the normalization Jacobian is evaluated: w^N for Weight-STE (eq. (3); the
    historical weight w^H = w^L + (w^N - w^L) in historical arithmetic), w^L for LERP and Prob-STE
    (eq. (4))."""
    if spec.reconstruction == "lerp" or spec.surrogate == "prob":
        return wL
    return wN if spec.arithmetic == "strict" else wL + (wN - wL)


# ------------------------------------------------------------------------------------ gradients (§3, App. B)
def gamma(g: Tensor, w: Tensor) -> Tensor:
    """gamma = dL/dw = (g - <g>_P)/W with P = w/W, the normalization Jacobian contracted with g = dL/dP."""
    W = w.sum(-1, keepdim=True)
    P = normalize(w)
    W_safe = torch.where(W > 0, W, torch.ones_like(W))
    return (g - (P * g).sum(-1, keepdim=True)) / W_safe


def calibration_grad(g: Grid, K: int) -> tuple[Tensor, Tensor]:
    """Eq. (1) (``eq:calgrad``): the MinMax calibration derivatives of the LERP weight,

        dw^L/dM = -w^L - Delta rho + X,   dw^L/dm = -Delta (1 - rho) + w^L - X,

    with rho = (r + t)/K and X = [(1 - t) r e^{b_r} + t (r + 1) e^{b_{r+1}}]/K. Both are evaluated through
    Y = w^L - X written as a sum of non-negative terms: -w + X cancels badly in float32 at small K and wide
    spans. (FWM and resolved have dw/dM = -Delta and no m term.)
    """
    Delta = lerp_slope(g)
    rho = (g.r + g.t_raw) / K  # normalized position (r + t)/K in [z_min, 0]
    Y = (1 - g.t) * g.E_r * (1 - g.r / K) + g.t * g.E_r1 * (1 - (g.r + 1) / K)
    return -Y - Delta * rho, Y - Delta * (1 - rho)


def to_extremum(grad_row: Tensor, is_ext: Tensor) -> Tensor:
    """Put a per-row gradient on the row's extremum keys, split evenly among ties (as amax/amin do)."""
    n = is_ext.sum(-1, keepdim=True).clamp(min=1).to(grad_row.dtype)
    return torch.where(is_ext, grad_row / n, torch.zeros_like(grad_row).expand_as(is_ext))


def score_grad(
    gam: Tensor, Delta: Tensor, dw_dM: Tensor, dw_dm: Tensor | None, is_max: Tensor, is_min: Tensor
) -> dict[str, Tensor]:
    """Eq. (2) (``eq:full``): dL/ds_i = gamma_i Delta_i + [i = argmax] sum_j gamma_j dw_j/dM
    + [i = argmin] sum_j gamma_j dw_j/dm, as its three per-key terms "self", "M" and "m".

    Their sum is the full calibration gradient; tied extrema share their term evenly. ``dw_dm`` is None
    for FWM and resolved (no m term).
    """
    self_term = gam * Delta
    M_term = to_extremum((gam * dw_dM).sum(-1, keepdim=True), is_max)
    if dw_dm is None:
        m_term = torch.zeros_like(self_term)
    else:
        m_term = to_extremum((gam * dw_dm).sum(-1, keepdim=True), is_min)
    return {"self": self_term, "M": M_term, "m": m_term}


def hard_weights(s: Tensor, K: int, ell: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """w^N of a MinMax row with the index ell held fixed (computed from s if not given), differentiable
    through M and m: w^N_j = exp(b_{ell_j}), b_ell = (1 - ell/K)(m - M). Rows are the last dim, all valid."""
    if ell is None:
        with torch.no_grad():
            valid = torch.ones_like(s, dtype=torch.bool)
            ext = row_extrema(s, valid)
            g = grid(s, valid, OperatorSpec.parse(f"minmax-weight-k{K}"), ext.M, ext.m)
            ell = g.r + (g.t >= 0.5).to(s.dtype)
    M = s.amax(-1, keepdim=True)
    m = s.amin(-1, keepdim=True)
    return torch.exp((1 - ell / K) * (m - M)), ell


def hard_jacobian(s: Tensor, K: int) -> Tensor:
    """Eq. (5) (``eq:hardjac``), the derivative of the MinMax hard map with the index held fixed:
    dw^N_j/ds_i = c_j w^N_j ([i = argmin] - [i = argmax]), c_j = 1 - ell_j/K, for one row s (n,).

    Returns the (n, n) Jacobian J[j, i] (unique extrema assumed). No operator back-propagates it: both
    surrogates keep the hard branch inside the stop-gradient.
    """
    w, ell = hard_weights(s, K)
    c = 1 - ell / K
    n = s.shape[-1]
    onehot_min = torch.nn.functional.one_hot(s.argmin(), n).to(s.dtype)
    onehot_max = torch.nn.functional.one_hot(s.argmax(), n).to(s.dtype)
    return (c * w).unsqueeze(-1) * (onehot_min - onehot_max).unsqueeze(0)
