"""An independent float64 numpy transcription of the paper's formulas, one row at a time (App. A, B).

It shares no code with kinterval.ops: the tests hold the reference against it, so that an error in the
shared grid code cannot hide behind the agreement of reference and closed form.
"""

from __future__ import annotations

import math

import numpy as np


def row_forward(s: np.ndarray, valid: np.ndarray, calib: str, K: int, tau: float = 6.0):
    """Per-key (wL, wN, Delta, dw/dM, dw/dm, kept) for one row, as in App. A and eq. (1) (dw/dM, dw/dm)."""
    n = len(s)
    wL, wN, Delta, dM, dm = (np.zeros(n) for _ in range(5))
    kept = np.zeros(n, bool)
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return wL, wN, Delta, dM, dm, kept
    M, m = s[idx].max(), s[idx].min()
    if calib == "minmax" and M - m <= 1e-12:  # degenerate: weight 1 on valid keys, zero gradient
        wL[idx] = wN[idx] = 1.0
        return wL, wN, Delta, dM, dm, kept
    for j in idx:
        z = s[j] - M
        if calib == "minmax":
            h = (M - m) / K
            zmin = m - M
            r = min(max(math.floor((z - zmin) / h), 0), K - 1)
            b = lambda q, zmin=zmin, h=h: zmin + q * h  # noqa: E731
        else:
            h = tau / K
            if calib == "fwm" and z < -tau:
                continue  # zero tail
            zz = min(max(z, -tau), 0.0) if calib == "fwm" else z
            r = math.floor((zz + tau) / h)
            r = min(max(r, 0), K - 1) if calib == "fwm" else min(r, K - 1)
            b = lambda q, h=h: -tau + q * h  # noqa: E731
            z = zz
        t = min(max((z - b(r)) / h, 0.0), 1.0)
        Er, Er1 = math.exp(b(r)), math.exp(b(r + 1))
        wL[j] = (1 - t) * Er + t * Er1
        ell = r + (1 if t >= 0.5 else 0)
        wN[j] = math.exp(b(ell))
        Delta[j] = (Er1 - Er) / h
        if calib == "minmax":
            rho = (r + t) / K
            X = ((1 - t) * r * Er + t * (r + 1) * Er1) / K
            dM[j] = -wL[j] - Delta[j] * rho + X  # eq. (1): dw/dM
            dm[j] = -Delta[j] * (1 - rho) + wL[j] - X
        else:
            dM[j] = -Delta[j]
        kept[j] = True
    return wL, wN, Delta, dM, dm, kept


def row_probs_and_grad(s, valid, g, calib, K, surrogate, range_grad="full", tau=6.0):
    """Forward P (hard for STE operators) and eq. (2) score gradient dL/ds for upstream g = dL/dP."""
    wL, wN, Delta, dM, dm, kept = row_forward(s, valid, calib, K, tau)
    w_fwd = wL if surrogate is None else wN
    P = w_fwd / w_fwd.sum() if w_fwd.sum() > 0 else np.zeros_like(s)
    grad = np.zeros_like(s)
    if not kept.any():
        return P, grad
    w_at = wN if surrogate == "weight" else wL  # Weight-STE, eq. (3): P^N; Prob-STE, eq. (4), and LERP: P^L
    W = w_at.sum()
    gamma = (g - (w_at / W * g).sum()) / W
    gamma[~kept] = 0.0
    grad += gamma * Delta
    idx = np.flatnonzero(valid)
    M, m = s[idx].max(), s[idx].min()
    amax = idx[s[idx] == M]
    amin = idx[s[idx] == m]
    if range_grad in ("full", "max_only"):
        grad[amax] += (gamma * dM).sum() / len(amax)
    if range_grad in ("full", "min_only"):
        grad[amin] += (gamma * dm).sum() / len(amin)
    if range_grad == "p1":
        grad[idx] -= grad[idx].mean()
    return P, grad
