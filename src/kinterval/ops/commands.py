"""CLI: ``kinterval ops`` (operator table) and ``kinterval ops verify`` (closed form vs reference)."""

from __future__ import annotations

import math

import torch

from kinterval.ops.api import attention_probs, valid_mask
from kinterval.ops.diagnostics import score_gradient, zero_sum_residual
from kinterval.ops.spec import OperatorSpec
from kinterval.ops.text_table import Table

DEFAULT_OPERATORS = (
    "softmax bf16-exp fp8-exp lerp-k4 lerp-k16 minmax-weight-k4 minmax-prob-k4 fwm-weight-k4 fwm-prob-k4 "
    "resolved-weight-k4 fwm-prob-k16"
).split()


def register(sub) -> None:
    p = sub.add_parser("ops", help="operator table: distance to softmax and gradient zero-sum residual")
    p.add_argument("action", nargs="?", choices=["table", "verify"], default="table")
    p.add_argument("--operators", default=",".join(DEFAULT_OPERATORS), help="comma-separated names")
    p.add_argument(
        "--range-grad", default="full", help="backward rule of the K-interval operators (default: full)"
    )
    p.add_argument("--T", type=int, default=128, help="keys per causal row, 4 x 4 heads (default: 128)")
    p.add_argument(
        "--scale", type=float, default=6.0, help="score standard deviation (default: 6, spans of about 25-30)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random scores (default: 0)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.action == "verify":
        from kinterval.ops.verify import main as verify_main

        return verify_main([])
    if args.T < 2:  # the residual column needs rows with at least two keys
        raise ValueError(f"--T must be an integer >= 2, got {args.T}")
    if not math.isfinite(args.scale) or args.scale <= 0:
        raise ValueError(f"--scale must be a finite number > 0, got {args.scale}")
    gen = torch.Generator().manual_seed(args.seed)
    s = torch.randn(4, 4, args.T, args.T, generator=gen) * args.scale
    up = torch.randn(s.shape, generator=gen)
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    P_soft = attention_probs(s, "softmax", causal=True)
    table = Table(title=f"operators on random causal scores (T={args.T}, score sd {args.scale:g}, float32)")
    for col in ("operator", "TV to softmax (mean)", "TV max", "zero-sum residual (median)", "residual max"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for name in args.operators.split(","):
        spec = OperatorSpec.parse(name.strip())
        if spec.is_kinterval and args.range_grad != "full":
            spec = OperatorSpec.parse(name.strip(), range_grad=args.range_grad)
        P = attention_probs(s, spec, causal=True)
        tv = 0.5 * (P - P_soft).abs().sum(-1)
        rho = zero_sum_residual(score_gradient(s, spec, up, causal=True), valid)[
            ..., 1:
        ]  # rows with >= 2 keys
        table.add_row(
            spec.full_name, f"{tv.mean():.4f}", f"{tv.max():.4f}", f"{rho.median():.1e}", f"{rho.max():.1e}"
        )
    print(table)
    return 0
