"""kinterval.ops.flips: the rows whose grid decision lies within fp32 rounding of a discontinuity."""

from __future__ import annotations

import torch

from kinterval.ops import OperatorSpec
from kinterval.ops.flips import flip_rows


def test_flip_rows_finds_each_discontinuity():
    """One row, scale 1, q = e_0: the scores are the keys' first coordinates, exactly. Around 100 a score's
    rounding radius is 8 * 2^-24 * 200 = 9.5e-5: 1e-5 lies within it, 0.3 does not."""
    D, c = 16, 100.0

    def rows(spec, scores, valid=None):
        q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
        q[..., 0] = 1.0
        k = torch.zeros(1, 1, len(scores), D, dtype=torch.float64)
        k[0, 0, :, 0] = torch.tensor(scores, dtype=torch.float64)
        valid = torch.ones(1, 1, 1, len(scores), dtype=torch.bool) if valid is None else valid
        return bool(flip_rows(OperatorSpec.parse(spec), q, k, 1.0, valid)[0, 0, 0])

    # MinMax K = 4 over [c, c + 8]: h = 2, boundaries at c + 2, 4, 6, midpoints at c + 1, 3, 5, 7
    assert rows("minmax-weight-k4", [c, c + 8, c + 4])  # on a boundary
    assert not rows("minmax-weight-k4", [c, c + 8, c + 4.3])
    assert rows("minmax-weight-k4", [c, c + 8, c + 3 + 1e-5])  # within rounding of a midpoint
    assert not rows("minmax-lerp-k4", [c, c + 8, c + 3])  # LERP is continuous at midpoints
    assert rows("minmax-lerp-k4", [c, c + 8, c + 8 - 1e-5])  # near-tie of the row max
    assert rows("minmax-lerp-k4", [c, c + 8, c + 1e-5])  # near-tie of the row min
    assert not rows("minmax-lerp-k4", [c, c, c])  # degenerate row: decided exactly
    # FWM tau = 6, K = 4: h = 1.5 below M = c; the tail cut at z = -6 is a boundary
    assert rows("fwm-lerp-k4", [c, c - 6])
    assert not rows("fwm-lerp-k4", [c, c - 5.7, c - 40])  # far tail: FWM has no boundary below -tau
    assert rows("resolved-lerp-k4", [c, c - 36 + 1e-5])  # resolved: z = -36 is x = -20, a boundary
    assert not rows("softmax", [c, c])
    masked = torch.tensor([[[[True, True, False]]]])
    assert not rows("minmax-weight-k4", [c, c + 8, c + 4], masked)  # masked keys make no decision
