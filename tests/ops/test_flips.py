"""kinterval.ops.flips: the rows whose grid decision lies within fp32 rounding of a discontinuity."""

from __future__ import annotations

import math

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


def _row(spec, scores, valid=None, scale=1.0):
    """flip_rows of one query row whose scores are ``scores`` exactly: q = e_0 / scale, k_j0 = s_j."""
    D = 16
    q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    q[..., 0] = 1.0 / scale  # scale is a power of two: q * k * scale = s exactly
    k = torch.zeros(1, 1, len(scores), D, dtype=torch.float64)
    k[0, 0, :, 0] = torch.tensor(scores, dtype=torch.float64)
    valid = torch.ones(1, 1, 1, len(scores), dtype=torch.bool) if valid is None else valid
    return bool(flip_rows(OperatorSpec.parse(spec), q, k, scale, valid)[0, 0, 0])


def test_flip_rows_both_sides_of_every_boundary_and_midpoint():
    """Each discontinuity of K = 4, approached from below and from above (1e-5, well inside the ~1e-4
    radius), and 0.3 away (outside every radius). MinMax over [c, c + 8]: h = 2, boundaries x = 1, 2, 3 at
    c + 2, 4, 6 and midpoints x = 1/2 ... 7/2 at c + 1, 3, 5, 7. FWM (tau = 6, h = 1.5, M = c): the tail cut
    z = -6 and boundaries z = -4.5, -3, -1.5; midpoints z = -5.25, -3.75, -2.25, -0.75."""
    c = 100.0
    minmax_boundaries, minmax_midpoints = [c + 2, c + 4, c + 6], [c + 1, c + 3, c + 5, c + 7]
    fwm_boundaries, fwm_midpoints = [c - 6, c - 4.5, c - 3, c - 1.5], [c - 5.25, c - 3.75, c - 2.25, c - 0.75]
    cases = [  # (operator, row extremes, discontinuities, continuous points)
        ("minmax-weight-k4", [c, c + 8], minmax_boundaries + minmax_midpoints, []),
        ("minmax-lerp-k4", [c, c + 8], minmax_boundaries, minmax_midpoints),
        ("fwm-weight-k4", [c], fwm_boundaries + fwm_midpoints, []),
        ("fwm-lerp-k4", [c], fwm_boundaries, fwm_midpoints),
    ]
    for spec, extremes, jumps, smooth in cases:
        for p in jumps:
            for d in (-1e-5, 1e-5):
                assert _row(spec, [*extremes, p + d]), (spec, p, d)
            for d in (-0.3, 0.3):
                assert not _row(spec, [*extremes, p + d]), (spec, p, d)
        for p in smooth:
            assert not _row(spec, [*extremes, p]), (spec, p)
    # the interval below FWM's tail cut holds no weight, so its midpoint z = -6.75 is no discontinuity; the
    # resolved operator keeps every interval below M and has one there
    assert not _row("fwm-weight-k4", [c, c - 6.75])
    assert _row("resolved-weight-k4", [c, c - 6.75])


def test_flip_rows_take_the_extremes_over_valid_keys():
    """A masked key above the row max (or below the row min) moves neither M nor m: [c, c + 8] keeps h = 2
    and c + 4 on the boundary x = 2. Taken over every key, M = c + 9 (or m = c - 1) would put the boundaries
    at c + 2.25 k (c - 1 + 2.25 k) and c + 4 on none."""
    c = 100.0
    valid = torch.tensor([[[[True, True, True, False]]]])
    for outside in (c + 9, c - 1):
        assert _row("minmax-lerp-k4", [c, c + 8, c + 4, outside], valid)
        assert not _row("minmax-lerp-k4", [c, c + 8, c + 4, outside])  # the same key valid: no boundary


def test_flip_rows_radius_holds_the_documented_terms():
    """The radius (module doc) holds 8 U (cond + |s|) for each score a decision reads (U = 2^-24), with the
    scale in cond, and FWM's 8 U (|M| + tau): a score 0.99x that sum from the point is flagged. It stays
    under 2x that sum: a score twice as far is not. Scale 1/8 (q = 8 e_0), positive scores: cond_j = s_j, so
    each score's term is 16 U s_j."""
    U, c, scale = 2.0**-24, 100.0, 1 / 8
    # MinMax boundary x = 2 at c + 4 over [c, c + 8]: the key's score and m
    L = 16 * U * ((c + 4) + c)
    assert _row("minmax-lerp-k4", [c, c + 8, c + 4 + 0.99 * L], scale=scale)
    assert _row("minmax-lerp-k4", [c, c + 8, c + 4 - 0.99 * L], scale=scale)
    assert not _row("minmax-lerp-k4", [c, c + 8, c + 4 + 2 * L], scale=scale)
    # near-tie of the row max M = c + 8: the key's score and M
    L = 16 * U * ((c + 8) + (c + 8))
    assert _row("minmax-lerp-k4", [c, c + 8, c + 8 - 0.99 * L], scale=scale)
    assert not _row("minmax-lerp-k4", [c, c + 8, c + 8 - 2 * L], scale=scale)
    # FWM boundary z = -3 (x = 2) below M = c: the key's score, M, and 8 U (|M| + tau)
    L = 16 * U * (c - 3) + 16 * U * c + 8 * U * (c + 6)
    assert _row("fwm-lerp-k4", [c, c - 3 + 0.99 * L], scale=scale)
    assert _row("fwm-lerp-k4", [c, c - 3 - 0.99 * L], scale=scale)
    assert not _row("fwm-lerp-k4", [c, c - 3 + 2 * L], scale=scale)


def test_flip_rows_finds_the_baselines_rounding_midpoints():
    """BF16-exp and FP8-exp round to coarse formats: a key flips where z = s - M (BF16-exp) or its exponential
    lies within rounding of a midpoint of the format. Scores c + z with c = 100 (radius ~1e-4 in z), exact."""
    c = 100.0
    # bf16 values around -1.5 are 2^-7 apart: -1.50390625 is a midpoint, -1.5 a value (exp(-1.5) is 0.015
    # of a bf16 step from the nearest exp midpoint, far outside its 2.7e-7 radius)
    assert _row("bf16-exp", [c, c - 1.50390625])
    assert not _row("bf16-exp", [c, c - 1.5])
    # the same midpoint at z = -12.03125 carries a weight e^-12 < 2^-16 of the row: no result can move
    assert not _row("bf16-exp", [c, c - 12.03125])
    # E4M3 values 0.5625 and 0.625 (step 2^-4): exp(z) on their midpoint 0.59375 flips, on 0.5625 does not
    assert _row("fp8-exp", [c, c + math.log(0.59375)])
    assert not _row("fp8-exp", [c, c + math.log(0.5625)])
    assert _row("fp8-exp", [c, c - 1e-5])  # a near-tie of the row max moves G_M (the max stays on the tape)
    assert not _row("softmax", [c, c - 1.50390625, c - 1e-5])


def test_flip_rows_adds_bf16_exps_backward_with_v_and_do():
    """BF16-exp's backward rounds gamma = (g - <g>_P)/W to bf16: with v and the upstream gradient, rows whose
    gamma lies within rounding of a bf16 midpoint are added to the forward's."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 37, 16, generator=g, dtype=torch.float64) * s for s in (2, 2, 1, 1))
    valid = torch.ones(37, 37, dtype=torch.bool).tril()
    spec = OperatorSpec.parse("bf16-exp")
    fwd = flip_rows(spec, q, k, 0.25, valid)
    both = flip_rows(spec, q, k, 0.25, valid, v, do)
    assert (both | ~fwd).all() and both.sum() > fwd.sum()
    assert torch.equal(flip_rows(OperatorSpec.parse("fp8-exp"), q, k, 0.25, valid, v, do),
                       flip_rows(OperatorSpec.parse("fp8-exp"), q, k, 0.25, valid))  # fmt: skip


def _row_mods(spec, raw, softcap=None, bias=None, sinks=None):
    """flip_rows of one row whose products are ``raw`` exactly (scale 1/8, q = 8 e_0: cond_j = |raw_j|),
    with the score modifications given (bias: one per key; sinks: one, the row's head)."""
    D = 16
    q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    q[..., 0] = 8.0
    k = torch.zeros(1, 1, len(raw), D, dtype=torch.float64)
    k[0, 0, :, 0] = torch.tensor(raw, dtype=torch.float64)
    valid = torch.ones(1, 1, 1, len(raw), dtype=torch.bool)
    kw = dict(softcap=softcap)
    if bias is not None:
        kw["bias"] = torch.tensor(bias, dtype=torch.float64).view(1, 1, 1, -1)
    if sinks is not None:
        kw["sinks"] = torch.tensor([sinks], dtype=torch.float64)
    return bool(flip_rows(OperatorSpec.parse(spec), q, k, 1 / 8, valid, **kw)[0, 0, 0])


def test_flip_rows_place_the_decisions_on_the_modified_row():
    """The grid decisions are those of the row the operator sees: c tanh(s / c) + bias, with the sink as one
    more key (none when -inf). Each case puts a key on a MinMax boundary of the modified row only."""
    c = 10.0
    cap = lambda t: c * math.atanh(t / c)  # noqa: E731 - the product whose softcapped score is t
    # softcapped row [2, 6] (h = 1 for K = 4): 4 is the boundary x = 2; its product 4.24 is no point of the
    # raw row [2.03, 6.93] (x = 2.25)
    row = [cap(2.0), cap(6.0), cap(4.0)]
    assert _row_mods("minmax-lerp-k4", row, softcap=c)
    assert not _row_mods("minmax-lerp-k4", row)
    # a bias moves the key at 103 (a LERP midpoint of [100, 108]: continuous) onto the boundary 104
    assert _row_mods("minmax-lerp-k4", [100.0, 108.0, 103.0], bias=[0.0, 0.0, 1.0])
    assert not _row_mods("minmax-lerp-k4", [100.0, 108.0, 103.0])
    # a sink of 108 is the row max: 104 is the boundary x = 2 of [100, 108]; without it 104 is the max
    assert _row_mods("minmax-lerp-k4", [100.0, 104.0], sinks=108.0)
    assert not _row_mods("minmax-lerp-k4", [100.0, 104.0])
    # a sink of -inf is no key: [100, 108] keeps its boundary at 104 (a sink of 0 would make m = 0)
    assert _row_mods("minmax-lerp-k4", [100.0, 108.0, 104.0], sinks=float("-inf"))
    assert not _row_mods("minmax-lerp-k4", [100.0, 108.0, 104.0], sinks=0.0)


def test_flip_rows_radius_of_a_modified_score():
    """The documented radius of a modified score (U = 2^-24): under a softcap, the product's 16 U |s| (here)
    times tanh's slope 1 - (t/c)^2 plus 32 U |t| for the tanh; with a bias, 8 U |s + bias| more for the sum.
    A near-tie of the row max (FWM, x ~ K: no boundary) within 0.99x the two keys' radii is flagged, one
    1.5x as far is not; each term matters (the slope alone, without the tanh's term, is 0.07 of it)."""
    U, c = 2.0**-24, 10.0
    t1 = c * math.tanh(20.0 / c)  # 9.64, slope 0.07
    cap = lambda t: c * math.atanh(t / c)  # noqa: E731
    radius = lambda t: 16 * U * cap(t) * (1 - (t / c) ** 2) + 32 * U * t  # noqa: E731
    for f, want in ((0.99, True), (1.5, False)):
        t2 = t1 - f * (radius(t1) + radius(t1))
        assert _row_mods("fwm-lerp-k4", [20.0, cap(t2)], softcap=c) == want, f
    # a bias of +100 on products of about 1: the sum's rounding (8 U * 101) dominates the products' (16 U)
    L = 2 * (16 * U * 1.0 + 8 * U * 101.0)
    for f, want in ((0.99, True), (1.5, False)):
        assert _row_mods("fwm-lerp-k4", [1.0, 1.0], bias=[100.0, 100.0 - f * L]) == want, f
