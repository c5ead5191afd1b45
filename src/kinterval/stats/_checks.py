"""Input validation shared by the statistics modules: every failure is a ValueError naming the argument."""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Integral, Real

import numpy as np


def _array(x, name: str) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from None


def _check_finite(a: np.ndarray, name: str) -> np.ndarray:
    """Refuse NaN/inf, and values so large that a sum of ``a.size`` of them, squared, overflows float64:
    every statistic here sums, and an SD squares, so such values would come back as a silent inf or NaN."""
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if a.size:
        scale = a.size * float(np.abs(a).max())
        if not math.isfinite(scale * scale):
            raise ValueError(
                f"{name} holds values too large for float64 sums of squares (largest |value| "
                f"{float(np.abs(a).max()):.3g} over {a.size} values)"
            )
    return a


def finite_1d(x, name: str, min_size: int = 1) -> np.ndarray:
    """``x`` as a float64 1-D array with at least ``min_size`` entries, all finite (and small enough that
    their sums and squares stay finite)."""
    a = _array(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} value(s), got {a.size}")
    return _check_finite(a, name)


def check_mapping(x, name: str) -> Mapping:
    """``x`` if it is a mapping (condition -> values / weights), else a ValueError naming it."""
    if not isinstance(x, Mapping):
        raise ValueError(f"{name} must be a mapping of condition names, got {type(x).__name__}")
    return x


def finite_2d(x, name: str, min_rows: int = 1, min_cols: int = 1) -> np.ndarray:
    """``x`` as a finite float64 2-D array of at least ``min_rows`` x ``min_cols``."""
    a = _array(x, name)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    if a.shape[0] < min_rows or a.shape[1] < min_cols:
        raise ValueError(f"{name} must be at least {min_rows} x {min_cols}, got {a.shape}")
    return _check_finite(a, name)


def check_real(x, name: str) -> float:
    """``x`` as a finite float; ``None``, booleans, strings and other non-numbers are refused."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, Real) or not np.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def check_level(level) -> float:
    level = check_real(level, "level")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def check_positive_int(n, name: str) -> int:
    """``n`` as an int >= 1; a whole float (16.0) is accepted, a fraction, bool, string or ``None`` is not."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, Real) or not float(n).is_integer() or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def make_rng(seed) -> np.random.Generator:
    """``np.random.default_rng(seed)`` (``None``: fresh entropy), with a bad seed a ``ValueError``."""
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.default_rng(seed)
