"""The fused kernels and their autograd wrapper at boundaries the rest of test_triton.py does not reach in
the CPU interpreter: the split loops' interior-tile bounds at a causal diagonal two keys short of a tile,
FWM's tail cut exactly at z = -tau, head dims above 64 (the code compiled for BLOCK_D = 128 only), a resolved
row whose span overflows fp32, the sinks' gradient over two batch elements and the P1 control's bias gradient
with causal Tq < Tk. Each test
was written for a mutant of kernels.py or autograd.py that the other tests let pass (the kernels' mutation
audit under benchmarks/results).

On a machine without CUDA the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set below and
in tests/conftest.py before triton is imported)."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: run the kernels in the CPU interpreter

from triton_gate import skip_without_kernels  # noqa: E402

skip_without_kernels(module=True)

from test_triton import (  # noqa: E402
    DEVICE,
    NAMES,
    _bias_for,
    _grads,
    _one_query,
    _poison,  # noqa: F401  (autouse: every kernel output starts as NaN)
    _sinks_for,
    check,
    fused_bwd,  # noqa: F401  (fixture)
    make_inputs,
)

from kinterval.ops import kinterval_attention  # noqa: E402
from kinterval.ops.api import valid_mask  # noqa: E402
from kinterval.ops.triton import kernels as K  # noqa: E402
from kinterval.ops.triton import triton_attention  # noqa: E402


@pytest.mark.parametrize("bwd", ["split", "fused"])
def test_split_loops_with_the_causal_diagonal_two_keys_short_of_a_tile(bwd, monkeypatch, request):
    """16-bit inputs without a mask run interior tiles through the unmasked loop bodies (``split_loops``).
    With Tk - Tq = 14 on 16 x 16 tiles the first row 16p of a query block sees keys up to 16p + 14, one short
    of the key tile's last key: the forward's and dQ's interior key tiles end before that tile
    (``_full_key_end``), and dK/dV's interior query blocks of key tile n start at block 16(n + 1) (row 16n + 1
    is the first to see key 16n + 15, ``_full_query_range``). An off-by-one in either bound unmasks key
    16p + 15 for row 16p (made that row's largest score here); at Tk - Tq = 0 (and the production tile
    test's BLOCK_N + 9) no such bound falls on a tile boundary, so no other test sees it."""
    if HAS_CUDA:
        pytest.skip("the interpreter's 16 x 16 tiles; GPU tiles differ")
    assert all(c.kwargs["BLOCK_M"] == c.kwargs["BLOCK_N"] == 16 for c in K._configs("fwd"))
    assert K.split_loops("fwd", 2, 16, False) and K.split_loops("dq", 2, 16, False)
    assert K.split_loops("dkdv", 2, 16, False)
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    calls = request.getfixturevalue("fused_bwd") if bwd == "fused" else None
    q, k, v, do = make_inputs(1, 2, 20, 34, 16, seed=31, dtype=torch.bfloat16)
    # key 16p + 15 (masked for row 16p alone) as row 16p's q: were it unmasked, it would be that row's max
    k[:, :, 15], k[:, :, 31] = q[:, :, 0], q[:, :, 16]
    check("minmax-prob-k4", q, k, v, do, causal=True)
    assert calls is None or calls, "the fused backward did not run"


@pytest.mark.parametrize("name", ["fwm-weight-k4[tau=8]", "fwm-lerp-k4[tau=8]", "fwm-prob-k4[tau=8]"])
def test_fwm_keeps_a_key_exactly_at_minus_tau(name):
    """FWM zeroes keys with z < -tau, strictly (App. A, reference.py): a key exactly at z = -tau is kept, at
    grid position 0 with weight e^{-tau}. One query with exact scores (scale 1, row max 0): key 1 at -8 =
    -tau is kept, key 3 at -9 is not; out, dq, dk, dv against the float64 reference, and dv of key 1
    (= P_1 dO) is not 0."""
    D = 16
    q, k, v, do = _one_query(torch.tensor([0.0, -8.0, -3.0, -9.0, -5.5]), D)

    def tri(a, b, c):
        return triton_attention(*(x.to(DEVICE) for x in (a, b, c)), name, scale=1.0, precision="ieee")

    def ref(a, b, c):
        return kinterval_attention(a, b, c, name, scale=1.0, backend="reference")

    res = _grads(tri, q, k, v, do)
    want = _grads(ref, *(x.double() for x in (q, k, v, do)))
    assert (want[3][0, 0, 1].abs() > 1e-5).all() and (want[3][0, 0, 3] == 0).all()
    for got, w, what in zip(res, want, NAMES, strict=True):
        torch.testing.assert_close(
            got.cpu().double(), w, rtol=1e-5, atol=1e-6, msg=lambda m, x=what: f"{x}: {m}"
        )


@pytest.mark.parametrize(
    ("name", "bwd", "dtype"),
    [
        ("minmax-weight-k4", "split", torch.float32),
        ("minmax-prob-k4[range_grad=min_only]", "split", torch.float32),
        ("minmax-weight-k4", "fused", torch.float32),
        ("fwm-prob-k4", "split", torch.float32),
        ("minmax-weight-k4", "split", torch.bfloat16),
    ],
)
def test_head_dims_above_64(name, bwd, dtype, monkeypatch):
    """Head dim 72 (BLOCK_D = 128) compiles code that D <= 64 does not: the dQ kernel's unfolded gamma and
    the long form of eq. (1)'s dw/dM (``calibration_grad``, SHORT False; fp32 MinMax); in dK/dV
    (``_dkdv_step``, ARG_AFTER False) the calibration terms of eq. (2) added per score instead of after the
    loop; the fused backward's long dw/dM, and no split loops for 16-bit inputs. Every other interpreter
    test runs D <= 40. The float64 reference's bound, causal, on out, dq, dk, dv."""
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    q, k, v, do = make_inputs(1, 2, 20, 20, 72, seed=41, dtype=dtype)
    check(name, q, k, v, do, causal=True, precision="ieee")


@pytest.mark.parametrize(
    "name", ["resolved-lerp-k4", "resolved-weight-k4", "resolved-prob-k4[arithmetic=historical]"]
)
def test_a_resolved_row_whose_span_overflows_fp32_is_nan(name):
    """Resolved continues the grid below -tau, so it keeps a valid key whose z = s - M overflowed to -inf
    (finite scores +-3e38): its grid position is NaN, and so is the row, as the reference's. The clamps of r
    and t must propagate that NaN: the plain ones are IEEE minNum / maxNum on the GPU (and in the
    interpreter, kernels._patch_interpreter_minmax), which drop it and give the key a finite weight
    (r = K - 1, t = 0) and the row a quiet wrong value. The other row (finite span) is the reference's."""
    D = 16
    q = torch.zeros(1, 1, 2, D)
    q[0, 0, :, 0] = 1.0
    q[0, 0, 1, 0] = 1e-38  # row 1: the same keys, scores 3, -3, 0
    k = torch.zeros(1, 1, 3, D)
    k[0, 0, :, 0] = torch.tensor([3e38, -3e38, 0.0])
    v = torch.randn(1, 1, 3, D, generator=torch.Generator().manual_seed(0))
    out = triton_attention(*(x.to(DEVICE) for x in (q, k, v)), name, scale=1.0, precision="ieee").cpu()
    ref = kinterval_attention(q, k, v, name, scale=1.0, backend="reference")
    assert ref[0, 0, 0].isnan().all() and torch.isfinite(ref[0, 0, 1]).all()
    assert out[0, 0, 0].isnan().all()
    torch.testing.assert_close(out[0, 0, 1], ref[0, 0, 1], rtol=1e-5, atol=1e-6)


def test_the_sinks_gradient_sums_over_the_batch():
    """A sink's gradient is the sum of dL/ds_sink over every row of its head, in every batch element
    (autograd's ``ds_sink.sum((0, 2))``); the other sink tests run one batch element. Two here, causal."""
    B, H, T, D = 2, 4, 13, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=43)
    sinks = _sinks_for(q, k, D**-0.5, valid_mask((B, H, T, T), "cpu", causal=True, mask=None), torch.float32)
    check("minmax-weight-k4", q, k, v, do, causal=True, sinks=sinks)


@pytest.mark.parametrize("name", ["lerp-k4[range_grad=p1]", "minmax-weight-k4[range_grad=p1]"])
def test_the_p1_bias_gradient_with_causal_rows_shorter_than_the_keys(name):
    """The P1 control's bias gradient is dL/ds less its row mean on every valid key (``autograd.bias_grad``),
    causal aligning the last query with the last key: key j is valid for row i when j <= i + Tk - Tq. The
    other P1 bias cases have Tq = Tk, where the offset is 0. Tq = 12, Tk = 29."""
    B, H, Tq, Tk, D = 1, 2, 12, 29, 16
    q, k, v, do = make_inputs(B, H, Tq, Tk, D, seed=47)
    bias = _bias_for((1, H, Tq, Tk), 48)
    table, res, ref = check(name, q, k, v, do, causal=True, bias=bias)
    assert ref[4].abs().max() > 1e-2  # a gradient worth checking
