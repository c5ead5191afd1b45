"""Table S1: forward/backward edge cases, in float32 and float64, for every operator of the family."""

from __future__ import annotations

import itertools

import pytest
import torch

from kinterval.ops import OperatorSpec, attention_probs
from triton_gate import skip_without_kernels

NAN = float("nan")

# (description, row scores, valid mask or None). K = 4, tau = 6 puts grid points at multiples of 1.5 for FWM.
ROWS = {
    "tied maxima": ([3.0, 3.0, 1.0, -2.0, 0.5], None),
    "tied minima": ([3.0, -2.0, 1.0, -2.0, 0.5], None),
    "ties at both ends": ([3.0, 3.0, -2.0, -2.0, 0.5], None),
    "equal scores": ([2.5] * 5, None),
    "single valid key": ([1.0, 7.0, -3.0, 0.0, 2.0], [False, True, False, False, False]),
    "fully masked": ([1.0, 7.0, -3.0, 0.0, 2.0], [False] * 5),
    "span below eps": ([1.0, 1.0 + 1e-13, 1.0, 1.0, 1.0], None),
    "very small positive span": ([1.0, 1.0 + 1e-6, 1.0, 1.0 - 1e-6, 1.0], None),
    "grid boundaries (MinMax K4 span 8)": ([0.0, -2.0, -4.0, -6.0, -8.0], None),
    "midpoints (MinMax K4 span 8)": ([0.0, -1.0, -3.0, -5.0, -8.0], None),
    "FWM window edge z = -tau": ([0.0, -6.0, -1.5, -3.0, -4.5], None),
    "FWM just past the edge": ([0.0, -6.000001, -6.5, -30.0, -0.75], None),
    "FWM grid midpoints": ([0.0, -0.75, -2.25, -3.75, -5.25], None),
    "wide span (detach-like)": ([900.0, 0.0, -300.0, 450.0, 899.0], None),
    "large negative offset": ([-1e4, -1e4 - 3.0, -1e4 - 7.0, -1e4 - 1.0, -1e4 - 12.0], None),
    "masked extremum": ([50.0, 1.0, -50.0, 0.0, 2.0], [False, True, False, True, True]),
    "masked keys tying the valid extrema": ([2.0, 2.0, 1.0, -1.0, -1.0], [False, True, True, True, False]),
    # grid boundaries and midpoints where 1/h rounds down (h = 10.25 and 2.5625): a product with the rounded
    # 1/h instead of the division put these keys on the wrong side (the triton kernels did, before)
    "inexact 1/h (MinMax K4 span 41)": ([0.0, 41.0, 35.875, 5.125, 20.5], None),  # mid r = 3, 0; b_2
    "inexact 1/h (MinMax K16 span 41)": ([0.0, 41.0, 39.71875, 38.4375, 35.875], None),  # mid 15; b_15, b_14
}

OPERATORS = [
    "softmax",
    "bf16-exp",
    "fp8-exp",
    "lerp-k1",
    "lerp-k4",
    "lerp-k16",
    "fwm-lerp-k4",
    "resolved-lerp-k4",
    "minmax-weight-k4",
    "minmax-prob-k4",
    "minmax-weight-k16",
    "minmax-prob-k16",
    "fwm-weight-k4",
    "fwm-prob-k4",
    "resolved-weight-k4",
    "resolved-prob-k4",
]


def _case(name: str, dtype):
    s, valid = ROWS[name]
    s = torch.tensor([s], dtype=dtype)
    mask = None if valid is None else torch.tensor([valid])
    return s, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", OPERATORS)
def test_edge_case_matrix(op, dtype):
    """Every edge case: finite forward and backward, row sums 1 (0 for an empty row), masked keys zero."""
    for row, backend, rg in itertools.product(ROWS, ("reference", "closed_form"), ("full", "detach", "p1")):
        spec = (
            OperatorSpec.parse(op)
            if not OperatorSpec.parse(op).is_kinterval
            else OperatorSpec.parse(op, range_grad=rg)
        )
        if not spec.is_kinterval and rg != "full":
            continue
        s, mask = _case(row, dtype)
        x = s.clone().requires_grad_()
        P = attention_probs(x, spec, mask=mask, backend=backend)
        up = torch.linspace(-1, 1, s.shape[-1], dtype=dtype)[None]
        (P * up).sum().backward()
        assert torch.isfinite(P).all() and torch.isfinite(x.grad).all(), (row, spec.full_name, backend)
        empty = mask is not None and not mask.any()
        target = 0.0 if empty else 1.0
        assert abs(P.sum().item() - target) <= 1e-6, (row, spec.full_name, P)
        if mask is not None:
            assert (P[~mask] == 0).all() and (x.grad[~mask] == 0).all()
        if empty:
            assert (x.grad == 0).all()


def _grid_of(row: str, op: str, dtype=torch.float64):
    from kinterval.ops.formulas import grid, nearest_weight, row_extrema

    s, mask = _case(row, dtype)
    valid = torch.ones_like(s, dtype=torch.bool) if mask is None else mask
    ext = row_extrema(s, valid)
    g = grid(torch.where(valid, s, ext.M), valid, OperatorSpec.parse(op), ext.M, ext.m)
    return g, nearest_weight(g), valid


def test_each_table_s1_condition_reaches_its_branch():
    """Each Table S1 row of the matrix above exercises the convention it names, in the package's grid."""
    g, _, valid = _grid_of("equal scores", "lerp-k4")
    assert g.ones.all() and not g.keep.any()  # degenerate MinMax branch
    g, _, valid = _grid_of("span below eps", "lerp-k4")
    assert g.ones.all()
    g, _, valid = _grid_of("single valid key", "minmax-weight-k4")
    assert g.ones[valid].all() and not g.ones[~valid].any()
    g, _, _ = _grid_of("very small positive span", "lerp-k4")
    assert g.keep.all() and not g.ones.any()  # regular branch with a tiny h
    g, _, _ = _grid_of("equal scores", "fwm-weight-k4")
    assert g.keep.all() and not g.ones.any() and (g.z == 0).all()  # FWM has no degenerate branch
    g, _, _ = _grid_of("grid boundaries (MinMax K4 span 8)", "lerp-k4")
    assert torch.equal(g.t_raw % 1, torch.zeros_like(g.t_raw))  # every key on a grid point
    g, wN, _ = _grid_of("midpoints (MinMax K4 span 8)", "minmax-weight-k4")
    assert (g.t[0, 1:4] == 0.5).all()  # midpoint ties round up
    torch.testing.assert_close(wN[0, 1:4], torch.exp(g.z[0, 1:4] + 1.0), rtol=1e-15, atol=0)
    g, _, _ = _grid_of("FWM window edge z = -tau", "fwm-weight-k4")
    assert g.keep.all() and g.z[0, 1] == -6.0
    g, _, _ = _grid_of("FWM just past the edge", "fwm-weight-k4")
    assert g.keep[0].tolist() == [True, False, False, False, True]
    g, wN, _ = _grid_of("FWM grid midpoints", "fwm-prob-k4")
    assert (g.t[0, 1:] == 0.5).all()
    for dtype in (torch.float32, torch.float64):  # exact in both: every backend must decide them alike
        g, _, _ = _grid_of("inexact 1/h (MinMax K4 span 41)", "minmax-weight-k4", dtype)
        assert g.r[0, 2:].tolist() == [3, 0, 2] and g.t[0, 2:].tolist() == [0.5, 0.5, 0.0]
        g, _, _ = _grid_of("inexact 1/h (MinMax K16 span 41)", "minmax-weight-k16", dtype)
        assert g.r[0, 2:].tolist() == [15, 15, 14] and g.t[0, 2:].tolist() == [0.5, 0.0, 0.0]
    # ties: test_tied_extrema_split_gradient_evenly below


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_degenerate_minmax_row_is_uniform_with_zero_gradient(dtype):
    for row in ("equal scores", "span below eps", "single valid key"):
        s, mask = _case(row, dtype)
        for op in ("lerp-k4", "minmax-weight-k4", "minmax-prob-k16"):
            x = s.clone().requires_grad_()
            P = attention_probs(x, op, mask=mask)
            (P * torch.arange(5, dtype=dtype)).sum().backward()
            valid = torch.ones_like(s, dtype=torch.bool) if mask is None else mask
            torch.testing.assert_close(P[valid], torch.full_like(P[valid], 1 / valid.sum().item()))
            assert (x.grad == 0).all()


def test_degenerate_branch_threshold_is_eps_1e12():
    """App. A: the degenerate branch is M - m <= eps with eps = 1e-12 (no other span clamp): a float64 row of
    span 2e-12 takes the regular branch (nonzero gradient), one of span 9e-13 the degenerate one (zero), and
    so does a span of exactly 1e-12 (the comparison is <=)."""
    for span, regular in ((2e-12, True), (9e-13, False), (1e-12, False)):
        x = torch.tensor([[0.0, span, span / 3, span / 2]], dtype=torch.float64, requires_grad=True)
        P = attention_probs(x, "lerp-k4")
        (P * torch.arange(4.0, dtype=torch.float64)).sum().backward()
        assert torch.isfinite(x.grad).all() and (x.grad.abs().sum() > 0) == regular, (span, x.grad)
        torch.testing.assert_close(P, torch.full_like(P, 0.25), rtol=0, atol=1e-11)


def test_very_small_span_uses_regular_branch():
    s, _ = _case("very small positive span", torch.float64)
    x = s.clone().requires_grad_()
    P = attention_probs(x, "lerp-k4")
    (P * torch.arange(5.0, dtype=torch.float64)).sum().backward()
    assert x.grad.abs().sum() > 0 and torch.isfinite(x.grad).all()


def test_fwm_equal_scores_all_at_top_grid_value():
    s, _ = _case("equal scores", torch.float64)
    for op in ("fwm-weight-k4", "fwm-prob-k4", "fwm-lerp-k4", "resolved-weight-k4"):
        P = attention_probs(s, op)
        torch.testing.assert_close(P, torch.full_like(P, 0.2))


def test_tied_extrema_split_gradient_evenly():
    """Table S1: tied extrema split the calibration gradient evenly. Row 0 ties two keys at each end, row 1
    three at the max and none at the min; each tied key's term is dL/dM (dL/dm) over the row's tie count,
    with dL/dM, dL/dm from autograd with M and m as leaves of the paper's LERP weights."""
    from kinterval.ops.api import valid_mask
    from kinterval.ops.closed_form import score_grad_terms
    from kinterval.ops.formulas import grid, lerp_weight, normalize
    from kinterval.ops.reference import place

    s = torch.tensor([[3.0, 3.0, -2.0, -2.0, 0.5], [4.0, 1.0, 4.0, -1.0, 4.0]], dtype=torch.float64)
    valid = valid_mask(s.shape, s.device, causal=False, mask=None)
    spec = OperatorSpec.parse("lerp-k4")
    g = torch.stack([torch.linspace(-1, 1, 5), torch.tensor([0.3, -1.0, 0.7, 0.2, -0.4])]).double()
    t = score_grad_terms(s, valid, spec, g)
    M = s.amax(-1, keepdim=True).requires_grad_()
    m = s.amin(-1, keepdim=True).requires_grad_()
    L = (g * normalize(place(lerp_weight(gr := grid(s, valid, spec, M, m)), gr))).sum()
    dM, dm = (d[:, 0] for d in torch.autograd.grad(L, (M, m)))
    assert (dM.abs() > 1e-3).all() and (dm.abs() > 1e-3).all()
    for row, (is_max, is_min) in enumerate([([0, 1], [2, 3]), ([0, 2, 4], [3])]):
        want_M = torch.zeros(5, dtype=torch.float64).index_fill(
            0, torch.tensor(is_max), dM[row] / len(is_max)
        )
        want_m = torch.zeros(5, dtype=torch.float64).index_fill(
            0, torch.tensor(is_min), dm[row] / len(is_min)
        )
        torch.testing.assert_close(t["M"][row], want_M, rtol=1e-12, atol=0)
        torch.testing.assert_close(t["m"][row], want_m, rtol=1e-12, atol=0)


def test_fwm_tail_keys_get_zero_weight_and_gradient():
    s, _ = _case("FWM just past the edge", torch.float64)
    x = s.clone().requires_grad_()
    P = attention_probs(x, "fwm-weight-k4")
    (P * torch.arange(5.0, dtype=torch.float64)).sum().backward()
    assert (P[0, 1:4] == 0).all() and (x.grad[0, 1:4] == 0).all()
    s, _ = _case("FWM window edge z = -tau", torch.float64)
    P = attention_probs(s, "fwm-weight-k4")
    assert P[0, 1] > 0  # z = -tau itself is in the window (the tail is z < -tau)


# The Table S1 matrix through the triton kernels (Triton's CPU interpreter without a GPU), on the operators
# below: every row, each in a query of its own that sees only its own keys (q = e_0, scale 1: the scores are
# the keys' first coordinates, exact), twelve rows per launch (B = 1, H = 2, Tq = 6, Tk = 30).
TRITON_OPERATORS = [
    "softmax",
    "bf16-exp",
    "fp8-exp",
    "lerp-k1",
    "lerp-k4",
    "lerp-k16",
    "fwm-lerp-k4",
    "resolved-lerp-k4",
    "minmax-weight-k4",
    "minmax-prob-k4[arithmetic=historical]",
    "minmax-weight-k16",
    "fwm-weight-k4",
    "fwm-prob-k4",
    "resolved-weight-k4",
    "resolved-prob-k4",
]


def _triton_launches(dtype=torch.float32):
    """The Table S1 rows packed into launches: (names, q, k, v, do, mask) with row i of head h in query
    i % 6 of head h, its keys 5 (i % 6) .. 5 (i % 6) + 4; v_j one-hot (out_i[:5] = P_i)."""
    names, T, per_head = list(ROWS), 5, 6
    g = torch.Generator().manual_seed(0)
    for start in range(0, len(names), 2 * per_head):
        chunk = names[start : start + 2 * per_head]
        q = torch.zeros(1, 2, per_head, 16, dtype=dtype)
        q[..., 0] = 1.0
        k = torch.zeros(1, 2, per_head * T, 16, dtype=dtype)
        mask = torch.zeros(1, 2, per_head, per_head * T, dtype=torch.bool)
        for i, name in enumerate(chunk):
            h, r = divmod(i, per_head)
            s, valid = ROWS[name]
            k[0, h, r * T : (r + 1) * T, 0] = torch.tensor(s, dtype=dtype)
            mask[0, h, r, r * T : (r + 1) * T] = True if valid is None else torch.tensor(valid)
        v = torch.eye(T, 16, dtype=dtype).repeat(per_head, 1)[None, None].expand(1, 2, -1, -1).contiguous()
        do = torch.randn(1, 2, per_head, 16, generator=g, dtype=dtype)
        yield chunk, q, k, v, do, mask


@pytest.mark.parametrize("op", TRITON_OPERATORS)
def test_edge_case_matrix_triton(op):
    """Every Table S1 row through the fused kernels: finite out and gradients, P summing to 1 (0 for the
    fully masked row), masked keys with P = 0 and zero gradients, and out, dq, dk, dv against the float64
    reference within twice the fp32 reference's own error (+1e-5 of the magnitude). Rows with exact ties of
    the row max or min: the kernel gives the calibration gradient to the first tied key (docs/kernels.md,
    Conventions), so there dk is compared summed over the row's keys, and per key off the tied ones. dq sums
    dS_j k_j with sum_j dS_j = 0: on rows far from 0 (scores 900, -1e4) it cancels, and its bound adds 16
    roundings of the terms' size, max |k_j| max |g|."""
    skip_without_kernels()
    from kinterval.ops import kinterval_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def grads(backend, q, k, v, do, mask, **kw):
        leaves = [x.clone().to(device).requires_grad_() for x in (q, k, v)]
        out = kinterval_attention(*leaves, op, backend=backend, mask=mask.to(device), scale=1.0, **kw)
        return [y.detach().cpu().double() for y in (out, *torch.autograd.grad(out, leaves, do.to(device)))]

    for names, q, k, v, do, mask in _triton_launches():
        tri = grads("triton", q, k, v, do, mask, precision="ieee")
        r32 = grads("reference", q, k, v, do, mask)
        r64 = grads("reference", *(x.double() for x in (q, k, v, do)), mask)
        for i, name in enumerate(names):
            h, r = divmod(i, 6)
            keys = slice(5 * r, 5 * r + 5)
            where = (name, op)
            s, valid = ROWS[name]
            valid = torch.ones(5, dtype=torch.bool) if valid is None else torch.tensor(valid)
            o, dq, dk, dv = (x[0, h] for x in tri)
            assert all(torch.isfinite(x).all() for x in (o, dq, dk, dv)), where
            assert abs(o[r, :5].sum().item() - float(valid.any())) <= 1e-6, (where, o[r, :5])
            assert (o[r, :5][~valid] == 0).all(), where
            assert (dk[keys][~valid] == 0).all() and (dv[keys][~valid] == 0).all(), where
            s32 = torch.tensor(s, dtype=torch.float32)
            tied = set()  # valid keys tied for the row max or min (in fp32, as the kernel sees them)
            for ext in (s32[valid].amax(), s32[valid].amin()) if valid.any() else ():
                at = {j for j in range(5) if valid[j] and s32[j] == ext}
                tied |= at if len(at) > 1 else set()
            for n, got, want, ref32 in zip(("out", "dq", "dk", "dv"), tri, r64, r32):
                rows_of = (slice(r, r + 1),) if n in ("out", "dq") else (keys,)
                got, want, ref32 = (x[0, h][rows_of] for x in (got, want, ref32))
                tol = 2 * (ref32 - want).abs().max().item() + 1e-5 * max(1.0, want.abs().max().item())
                if n == "dq" and valid.any():  # dq = sum_j dS_j k_j cancels (sum_j dS_j = 0): its rounding
                    tol += 16 * 2.0**-24 * s32[valid].abs().max().item() * do[0, h, r].abs().max().item()
                if n == "dk" and tied:
                    assert (got.sum(0) - want.sum(0)).abs().max() <= tol, (where, n, "summed over the keys")
                    others = [j for j in range(5) if j not in tied]
                    got, want = got[others], want[others]
                err = (got - want).abs().max().item() if got.numel() else 0.0
                assert err <= tol, (where, n, err, tol)
