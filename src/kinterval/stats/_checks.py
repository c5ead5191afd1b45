"""Input validation shared by the statistics modules (every failure is a ``ValueError``)."""

from __future__ import annotations

import numpy as np


def finite_1d(x, name: str, min_size: int = 1) -> np.ndarray:
    """``x`` as a float64 1-D array with at least ``min_size`` entries, all finite."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} value(s), got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


def finite_2d(x, name: str, min_rows: int = 1, min_cols: int = 1) -> np.ndarray:
    """``x`` as a finite float64 2-D array of at least ``min_rows`` x ``min_cols``."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    if a.shape[0] < min_rows or a.shape[1] < min_cols:
        raise ValueError(f"{name} must be at least {min_rows} x {min_cols}, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


def check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def check_positive_int(n, name: str) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)
