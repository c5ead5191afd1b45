"""How an estimate prints in the tables and command-line summaries: a number to four decimals, never a
nonzero one as ``-0.0000``, and a p value never as ``0.000``."""

from __future__ import annotations

import math


def num(x, signed: bool = True, digits: int = 4) -> str:
    """``x`` to ``digits`` decimals; a nonzero value that would round to zero there in two significant digits
    (``-2.1e-06``, not ``-0.0000``: an interval that excludes 0 must not read as one at 0)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x and abs(x) < 0.5 * 10**-digits:
        return f"{x:+.1e}" if signed else f"{x:.1e}"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def prob(x) -> str:
    """A p value or BH q to 3 decimals; one below 0.001 as "<0.001" (as tab:nearci prints it), never
    "0.000": the bootstrap and permutation p have a positive floor (2/4001; 2/2^n)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return "<0.001" if x < 0.001 else f"{x:.3f}"
