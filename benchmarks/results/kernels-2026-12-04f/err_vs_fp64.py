"""Relative Frobenius errors of the triton kernels against the float64 reference of the same inputs (out,
dq, dk, dv; max over three seeds; B = 1, H = 2, T = 96, D = 64, causal, fp32 "ieee" dots), the numbers of
NOTES.md. Usage: TRITON_INTERPRET=1 python benchmarks/results/kernels-2026-12-04f/err_vs_fp64.py"""

import torch

from kinterval.ops import kinterval_attention
from kinterval.ops.triton.autograd import triton_attention

OPS = [
    "lerp-k4",
    "minmax-prob-k4",
    "fwm-prob-k4",
    "minmax-weight-k4",
    "minmax-weight-k4[arithmetic=historical]",
    "minmax-prob-k4[arithmetic=historical]",
    "lerp-k16",
]
NAMES = ("out", "dq", "dk", "dv")

for op in OPS:
    errs = {n: [] for n in NAMES}
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        q, k, v, do = (torch.randn(1, 2, 96, 64, generator=g) * sc for sc in (1.5, 1.5, 1.0, 1.0))
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = triton_attention(*leaves, op, causal=True, precision="ieee")
        ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
        ref = kinterval_attention(*ref_leaves, op, causal=True, backend="reference")
        got = (out, *torch.autograd.grad(out, leaves, do))
        want = (ref, *torch.autograd.grad(ref, ref_leaves, do.double()))
        for n, a, b in zip(NAMES, got, want):
            errs[n].append(((a.double() - b).norm() / b.norm()).item())
    print(f"{op:45s}", " ".join(f"{n} {max(e):.3e}" for n, e in errs.items()))
