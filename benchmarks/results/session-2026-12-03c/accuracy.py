"""Max error against the float64 reference of the kernels (Triton's CPU interpreter) with attention sinks
and with a softcap, beside torch's own error at the same precision: the bound of tests/ops/test_triton.py
(err <= 2 * torch + atol). Run from the repository root:

    python benchmarks/results/session-2026-12-03c/accuracy.py
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "ops"))

import test_triton as T  # noqa: E402
import torch  # noqa: E402

CASES = [  # (operator, dtype, sinks, softcap)
    ("softmax", torch.float32, True, None),
    ("minmax-weight-k4", torch.float32, True, None),
    ("fwm-prob-k4", torch.float32, True, None),
    ("minmax-prob-k4[arithmetic=historical]", torch.float32, True, None),
    ("fwm-prob-k4", torch.bfloat16, True, None),
    ("softmax", torch.float32, False, 3.0),
    ("minmax-weight-k4", torch.float32, False, 3.0),
    ("fwm-prob-k4", torch.float32, False, 3.0),
    ("minmax-weight-k4", torch.bfloat16, False, 3.0),
    ("fwm-prob-k4", torch.float32, True, 3.0),
]
names = (*T.NAMES, "dsinks")
print("| operator | dtype | sinks | softcap | " + " | ".join(names) + " |")
print("|---|---|---|---|" + "---|" * len(names))
for name, dtype, with_sinks, cap in CASES:
    q, k, v, do = T.make_inputs(1, 4, 37, 37, 16, seed=3, dtype=dtype)
    valid = T.valid_mask((1, 4, 37, 37), "cpu", causal=True, mask=None)
    sinks = T._sinks_for(q, k, 0.25, valid, dtype) if with_sinks else None
    if sinks is not None and cap is not None:
        sinks = sinks.clamp_max(1.5)
    table, _, _ = T.check(
        name, q, k, v, do, causal=True, precision="ieee", sinks=sinks, softcap=cap,
        exclude_flips=not (with_sinks and cap),
    )  # fmt: skip
    cells = " | ".join(
        f"{e:.2e} ({t:.2e})" if n in table else "-" for n in names for e, t in [table.get(n, (0, 0))]
    )
    print(
        f"| {name} | {str(dtype)[6:]} | {'yes' if with_sinks else 'no'} | {cap or '-'} | {cells} |",
        flush=True,
    )
print("each cell: the kernel's max |error| against float64 (torch's own at the same precision)")
