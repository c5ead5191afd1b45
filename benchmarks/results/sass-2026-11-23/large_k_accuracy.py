"""fp32 score gradients against float64, reference and closed form, per operator given (NOTES section 10).

python benchmarks/results/sass-2026-11-23/large_k_accuracy.py softmax lerp-k1024 fwm-prob-k65536
"""

import sys

import torch

from kinterval.ops.diagnostics import score_gradient

torch.manual_seed(0)
s = torch.randn(4, 4, 64, 64) * 6.0  # random causal scores, B = H = 4, T = 64
up = torch.randn(s.shape)
for name in sys.argv[1:]:
    errs = []
    for backend in ("reference", "closed_form"):
        g32 = score_gradient(s, name, up, causal=True, backend=backend).double()
        g64 = score_gradient(s.double(), name, up.double(), causal=True, backend=backend)
        errs.append(((g32 - g64).abs().max() / g64.abs().max()).item())
    print(f"{name:22s} max |error| / max |grad|: reference {errs[0]:.2e}  closed form {errs[1]:.2e}")
