"""Triton kernels (interpreter or GPU) against the float64 reference over score magnitudes, every operator
mode: prints the rows whose error exceeds twice the float32 reference's + 1e-6 of the scale.

Usage: TRITON_INTERPRET=1 python benchmarks/results/kernels-2026-11-25/magnitude_sweep.py
"""

import math
import os
import warnings

import torch

from kinterval.ops.api import kinterval_attention

warnings.filterwarnings("ignore")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the Triton interpreter

OPS = [
    "softmax",
    "bf16-exp",
    "fp8-exp",
    "lerp-k4",
    "lerp-k32",
    "fwm-lerp-k4",
    "resolved-lerp-k8",
    "minmax-weight-k4",
    "minmax-prob-k4",
    "fwm-weight-k4",
    "fwm-prob-k4",
    "resolved-prob-k4",
    "minmax-weight-k4[arithmetic=historical]",
    "fwm-prob-k4[arithmetic=historical]",
    "lerp-k32[range_grad=detach]",
    "minmax-prob-k16[range_grad=p1]",
    "lerp-k4[range_grad=max_only]",
    "lerp-k4[range_grad=min_only]",
]
B, H, T, D = 1, 2, 24, 16
bad = 0
for op in OPS[: int(os.environ.get("SWEEP_OPS", len(OPS)))]:
    for mag in [1e-30, 1e-6, 1.0, 30.0, 1e3, 1e6]:
        for causal in (False, True):
            g = torch.Generator().manual_seed(int(math.log10(mag) + 40))
            q = torch.randn(B, H, T, D, generator=g) * math.sqrt(mag)
            k = torch.randn(B, H, T, D, generator=g) * math.sqrt(mag)
            v = torch.randn(B, H, T, D, generator=g)
            do = torch.randn(B, H, T, D, generator=g)
            res = {}
            for b in ["reference", "triton"]:
                x = [
                    t.clone().double().requires_grad_()
                    if b == "reference"
                    else t.detach().clone().to(DEVICE).requires_grad_()
                    for t in (q, k, v)
                ]
                o = kinterval_attention(*x, op, causal=causal, backend=b)
                (o * (do.double() if b == "reference" else do.to(DEVICE))).sum().backward()
                res[b] = [o.detach().double().cpu()] + [t.grad.double().cpu() for t in x]
            # fp32 reference as the error yardstick
            x = [t.clone().requires_grad_() for t in (q, k, v)]
            o = kinterval_attention(*x, op, causal=causal, backend="reference")
            (o * do).sum().backward()
            r32 = [o.detach().double()] + [t.grad.double() for t in x]
            msg = []
            for name, a, b, c in zip("o dq dk dv".split(), res["reference"], res["triton"], r32):
                et = (a - b).abs().max().item()
                e32 = (a - c).abs().max().item()
                sc = a.abs().max().item()
                if not (et <= 2 * e32 + 1e-6 * sc + 1e-30) or math.isnan(et):
                    msg.append(f"{name}: tri {et:.2e} fp32ref {e32:.2e} scale {sc:.2e}")
            if msg:
                bad += 1
                print(op, mag, causal, "; ".join(msg))
print("bad", bad)
