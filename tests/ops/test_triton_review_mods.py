"""The fused kernels with a softcap and an attention sink far beyond it as a row's arg-max or arg-min key.

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

from kinterval.ops import kinterval_attention  # noqa: E402
from kinterval.ops.triton import triton_attention  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


def _grads(fn, q, k, v, do, sinks):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sinks)]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, do.to(out.dtype))]


@pytest.mark.parametrize("name", ["minmax-weight-k4", "minmax-weight-k4[range_grad=min_only]", "fwm-prob-k4"])
def test_softcap_with_a_far_sink_as_the_arg_key(name):
    """With a softcap the dQ kernel weighs the calibration terms of eq. (2) on a row's arg-max / arg-min key
    by tanh's slope there, 1 - (M/c)^2 or 1 - (m/c)^2. The sink is not capped: when it is the arg key, its
    score may lie far beyond c (here finfo.min, a common stand-in for "no sink" that still takes part, and
    1e20), (s/c)^2 overflowed to inf, and inf times the sink's zero k row made every dq row of the head NaN,
    where the reference's gradient is finite. The sink has no k: its term belongs to dL/ds_sink alone."""
    g = torch.Generator().manual_seed(7)
    B, H, Tq, Tk, D = 1, 2, 5, 7, 8
    q, k = (torch.randn(B, H, T, D, generator=g) * 2 for T in (Tq, Tk))
    v = torch.randn(B, H, Tk, D, generator=g)
    do = torch.randn(B, H, Tq, D, generator=g)
    # head 0: the sink is every row's arg-min (MinMax); head 1: every row's arg-max
    sinks = torch.tensor([torch.finfo(torch.float32).min, 1e20])
    got = _grads(
        lambda a, b, c, s: triton_attention(a, b, c, name, sinks=s, softcap=2.0, precision="ieee"),
        *(x.to(DEVICE) for x in (q, k, v, do, sinks)),
    )
    want = _grads(
        lambda a, b, c, s: kinterval_attention(a, b, c, name, sinks=s, softcap=2.0, backend="reference"),
        *(x.double() for x in (q, k, v, do, sinks)),
    )
    for what, x, w in zip(("out", "dq", "dk", "dv", "dsinks"), got, want, strict=True):
        assert torch.isfinite(w).all()
        assert torch.isfinite(x).all(), f"{what}: {(~torch.isfinite(x)).sum()} non-finite elements"
        err = (x.double().cpu() - w).abs().max().item()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), (what, err)
