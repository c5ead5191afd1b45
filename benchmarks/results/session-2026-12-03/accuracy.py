"""Max error against the float64 reference of the kernels (Triton's CPU interpreter) under grouped-query
attention and with v's own head dim, beside torch's own error at the same precision: the bound of
tests/ops/test_triton.py (err <= 2 * torch + atol). Run from the repository root:

    python benchmarks/results/session-2026-12-03/accuracy.py
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "ops"))

import test_triton as T  # noqa: E402
import torch  # noqa: E402

CASES = [  # (operator, dtype, k/v heads of 6 q heads, Dv)
    ("softmax", torch.float32, 2, 16),
    ("minmax-weight-k4", torch.float32, 2, 16),
    ("fwm-prob-k4", torch.float32, 3, 16),
    ("minmax-weight-k4", torch.bfloat16, 2, 16),
    ("fwm-prob-k4", torch.float32, 6, 8),
    ("lerp-k4", torch.float32, 2, 40),
    ("minmax-prob-k4", torch.bfloat16, 2, 24),
]
print("| operator | dtype | H / H_kv | D / Dv | out | dq | dk | dv |")
print("|---|---|---|---|---|---|---|---|")
for name, dtype, H_kv, Dv in CASES:
    q, k, _, _ = T.make_inputs(1, 6, 37, 37, 16, seed=3, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    v, do = (torch.randn(1, 6, 37, Dv, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    table, _, _ = T.check(name, q, k[:, :H_kv], v[:, :H_kv], do, causal=True, precision="ieee")
    cells = " | ".join(f"{e:.2e} ({t:.2e})" for e, t in (table[n] for n in T.NAMES))
    print(f"| {name} | {str(dtype)[6:]} | 6 / {H_kv} | 16 / {Dv} | {cells} |", flush=True)
print("each cell: the kernel's max |error| against float64 (torch's own at the same precision)")
