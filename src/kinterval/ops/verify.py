"""Agreement of the closed-form backward with autograd of the reference (``python -m kinterval.ops.verify``).

float64: the forward must be identical and the maximum relative gradient error at most 1e-9.
float32: each backend's error against the float64 truth is compared with the reference's own float32 error
(the flash-attention convention); the ratio must stay below 2.
"""

from __future__ import annotations

import argparse
import sys

import torch

from kinterval.ops.api import attention_probs
from kinterval.ops.catalog import all_specs
from kinterval.ops.spec import OperatorSpec
from kinterval.ops.text_table import Table

TOL_F64 = 1e-9
TOL_RATIO_F32 = 2.0


def _run(s, spec, up, backend, **kw):
    x = s.detach().clone().requires_grad_()
    P = attention_probs(x, spec, backend=backend, **kw)
    (P * up).sum().backward()
    return P.detach().double(), x.grad.double()


def agreement(
    spec: OperatorSpec, *, T: int = 33, scale: float = 6.0, seed: int = 0, causal: bool = True
) -> dict:
    """Forward/backward agreement of closed_form vs reference for one operator on random scores."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 3, T, T, generator=gen, dtype=torch.float64) * scale
    up = torch.randn(2, 3, T, T, generator=gen, dtype=torch.float64)
    kw = {"causal": True} if causal else {"mask": torch.rand(2, 1, T, T, generator=gen) > 0.3}
    P_ref, g_ref = _run(s, spec, up, "reference", **kw)
    P_cf, g_cf = _run(s, spec, up, "closed_form", **kw)
    rel = ((g_cf - g_ref).abs().max() / g_ref.abs().max().clamp(min=1e-300)).item()
    # float32: errors against the float64 truth, relative to the reference's own float32 error.
    s32, up32 = s.float(), up.float()
    _, g_ref32 = _run(s32, spec, up32, "reference", **kw)
    _, g_cf32 = _run(s32, spec, up32, "closed_form", **kw)
    # flash-attention's convention: global max errors, with a floor of float32 rounding of the largest entry
    floor = torch.finfo(torch.float32).eps * g_ref.abs().max()
    ratio = ((g_cf32 - g_ref).abs().max() / ((g_ref32 - g_ref).abs().max() + floor + 1e-300)).item()
    return {
        "forward_identical": torch.equal(P_ref, P_cf),
        "forward_max_abs": (P_ref - P_cf).abs().max().item(),
        "grad_rel_err_f64": rel,
        "f32_err_ratio": ratio,
        "ok": torch.equal(P_ref, P_cf) and rel <= TOL_F64 and ratio <= TOL_RATIO_F32,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--T", type=int, default=33)
    parser.add_argument("--scale", type=float, default=6.0)
    args = parser.parse_args(argv)
    table = Table(title="closed_form vs reference (float64 forward/backward; float32 error ratio)")
    for col in ("operator", "mask", "forward", "max rel grad err (f64)", "f32 err / torch f32 err", "ok"):
        table.add_column(col, justify="right" if col not in ("operator", "mask") else "left")
    failures = 0
    for spec in all_specs(Ks=args.K):
        for causal in (True, False):
            r = agreement(spec, T=args.T, scale=args.scale, causal=causal)
            failures += not r["ok"]
            table.add_row(
                spec.full_name,
                "causal" if causal else "random",
                "identical" if r["forward_identical"] else f"{r['forward_max_abs']:.1e}",
                f"{r['grad_rel_err_f64']:.1e}",
                f"{r['f32_err_ratio']:.2f}",
                "yes" if r["ok"] else "NO",
            )
    print(table)
    print(
        f"{len(table.rows)} checks, {failures} failed "
        f"(tolerances: f64 {TOL_F64:g}, f32 ratio {TOL_RATIO_F32:g})"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
