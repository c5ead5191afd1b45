"""The range of a seed, checked up front by every command and file that takes one.

Here in ``ops``, the lowest layer, so that every other may import it. A seed reaches torch
(``manual_seed``: below 2^63), numpy's legacy global RNG and lm-eval (``np.random.seed``: below 2^32); a
larger one failed deep inside them with a traceback ("Overflow when unpacking long long"), after data had been
prepared or a suite run started. The paper's seeds are small (its lm-eval seed is 20260920).
"""

from __future__ import annotations

SEED_LIMIT = 2**32  # seeds are integers in [0, SEED_LIMIT)


def is_seed(value) -> bool:
    """Whether ``value`` is an integer (not a bool) in [0, 2^32)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < SEED_LIMIT


def check_seed(value, name: str = "seed") -> int:
    """``value`` if it is an integer in [0, 2^32), else a ValueError naming ``name`` (a flag or field)."""
    if not is_seed(value):
        raise ValueError(f"{name} must be an integer from 0 to {SEED_LIMIT - 1} (2^32 - 1), got {value!r}")
    return value
