"""Contrasts, the 2x2 factorial, the K trend and single-seed labels (paper §4, App. C.3).

A contrast ``sum_c a_c NLL_c`` is computed per block (or per seed) and then averaged / bootstrapped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ._checks import check_mapping, check_real, finite_1d, finite_2d
from .seeds import SeedSummary, seed_summary


def contrast(per_block: Mapping[str, np.ndarray], weights: Mapping[str, float]) -> np.ndarray:
    """Per-block linear contrast ``sum_c weights[c] * per_block[c]``.

    ``per_block`` maps condition -> per-block NLL (all the same length, paired by block); e.g.
    ``{"A": 1, "softmax": -1}`` is the paired difference A - softmax.
    """
    per_block, weights = check_mapping(per_block, "per_block"), check_mapping(weights, "weights")
    if not weights:
        raise ValueError("weights must name at least one condition")
    unknown = set(weights) - set(per_block)
    if unknown:
        raise ValueError(f"weights reference unknown conditions: {sorted(unknown)}")
    arrays = {c: finite_1d(v, f"per_block[{c!r}]") for c, v in per_block.items()}
    lengths = {c: a.size for c, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"per-block arrays must all have the same length, got {lengths}")
    out = np.zeros(next(iter(lengths.values())))
    for cond, a in weights.items():
        out += check_real(a, f"weight of {cond!r}") * arrays[cond]
    return out


@dataclass(frozen=True)
class Factorial2x2:
    """Per-block (or per-seed) contrast arrays of the calibration x surrogate factorial."""

    calibration: np.ndarray  # FWM - MinMax, averaged over surrogate
    surrogate: np.ndarray  # Prob - Weight, averaged over calibration
    interaction: np.ndarray  # (FWM_P - FWM_W) - (MM_P - MM_W)


# Contrast weights of App. C.3: main effects average over the other factor with weights +-1/2.
FACTORIAL_WEIGHTS = {
    "calibration": {"mm_w": -0.5, "mm_p": -0.5, "fwm_w": 0.5, "fwm_p": 0.5},
    "surrogate": {"mm_w": -0.5, "mm_p": 0.5, "fwm_w": -0.5, "fwm_p": 0.5},
    "interaction": {"mm_w": 1.0, "mm_p": -1.0, "fwm_w": -1.0, "fwm_p": 1.0},
}


def factorial_2x2(mm_w, mm_p, fwm_w, fwm_p) -> Factorial2x2:
    """2x2 factorial contrasts from the four cells' per-block NLL (or dNLL vs softmax: softmax cancels).

    Cells: MinMax/FWM calibration x Weight-STE/Prob-STE surrogate. Each returned array can be passed to
    ``block_bootstrap_ci`` (single seed) or ``seed_summary`` (per-seed values).
    """
    cells = {"mm_w": mm_w, "mm_p": mm_p, "fwm_w": fwm_w, "fwm_p": fwm_p}
    return Factorial2x2(**{name: contrast(cells, w) for name, w in FACTORIAL_WEIGHTS.items()})


@dataclass(frozen=True)
class KTrend:
    """Per-seed OLS slopes of dNLL against log2 K (nats per doubling of K) and their seed summary."""

    slopes: np.ndarray
    summary: SeedSummary


def k_trend_weights(K_values) -> np.ndarray:
    """The OLS slope weights ``c_k = (x_k - mean x) / sum_j (x_j - mean x)^2``, ``x = log2 K``: the slope of
    ``y`` against ``log2 K`` is ``sum_k c_k y_k``. The denominator is correctly rounded (``math.fsum``), not a
    BLAS dot, whose order of additions (and FMA) depends on the CPU: a committed report must regenerate to
    the last digit on any machine."""
    K = finite_1d(K_values, "K_values", min_size=2)
    if np.any(K <= 0):
        raise ValueError("K values must be positive")
    x = np.log2(K)
    xc = x - x.mean()
    if not np.any(xc):
        raise ValueError("need at least two distinct K values")
    return xc / math.fsum(xc * xc)


def k_trend_slopes(K_values, delta_nll, *, level: float = 0.95) -> KTrend:
    """Least-squares slope of ``delta_nll[seed, k]`` against ``log2(K_values[k])``, fitted per seed.

    Returns the per-seed slopes with their mean, seed SD and t interval (n_seeds - 1 df).
    """
    K = finite_1d(K_values, "K_values", min_size=2)
    if np.any(K <= 0):
        raise ValueError("K values must be positive")
    d = finite_2d(delta_nll, "delta_nll", min_rows=2, min_cols=2)
    if d.shape[1] != K.size:
        raise ValueError(f"delta_nll has {d.shape[1]} columns but there are {K.size} K values")
    # OLS slope per row: sum_k c_k y_k (centering y is unnecessary); a numpy sum, not a BLAS product (see
    # k_trend_weights)
    slopes = (d * k_trend_weights(K)).sum(axis=1)
    return KTrend(slopes=slopes, summary=seed_summary(slopes, level=level))


@dataclass(frozen=True)
class Labels:
    """Single-seed / downstream labels of a contrast CI ``[lo, hi]`` (App. C.3).

    ``separated``: lo > +margin (caution margin for single-seed contrasts, not a significance threshold).
    ``detectable``: the CI excludes zero. ``within_margin``: the CI lies wholly inside (-margin, +margin).
    Detectability and margin status are independent labels; "no detectable difference" is never equivalence.
    """

    separated: bool
    detectable: bool
    within_margin: bool

    @property
    def detectability(self) -> str:
        return "detectable" if self.detectable else "no detectable difference"

    @property
    def margin_status(self) -> str:
        return "within margin" if self.within_margin else "not within margin"

    def as_dict(self) -> dict[str, object]:
        return {
            "separated": self.separated,
            "detectable": self.detectable,
            "within_margin": self.within_margin,
            "detectability": self.detectability,
            "margin_status": self.margin_status,
        }


def label_single_seed(lo: float, hi: float, margin: float = 0.01) -> Labels:
    """Labels of a contrast interval ``[lo, hi]`` in nats; all comparisons are strict."""
    lo, hi, margin = check_real(lo, "lo"), check_real(hi, "hi"), check_real(margin, "margin")
    if lo > hi:
        raise ValueError(f"lo ({lo}) must not exceed hi ({hi})")
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    return Labels(
        separated=lo > margin,
        detectable=lo > 0.0 or hi < 0.0,
        within_margin=-margin < lo and hi < margin,
    )
