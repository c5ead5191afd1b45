"""CLI: ``kinterval ops`` (operator table) and ``kinterval ops verify`` (closed form vs reference)."""

from __future__ import annotations

import math

import torch

from kinterval.ops.api import attention_probs, valid_mask
from kinterval.ops.diagnostics import score_gradient, zero_sum_residual
from kinterval.ops.spec import RANGE_GRADS, OperatorSpec
from kinterval.ops.text_table import Table

DEFAULT_OPERATORS = (
    "softmax bf16-exp fp8-exp lerp-k4 lerp-k16 minmax-weight-k4 minmax-prob-k4 fwm-weight-k4 fwm-prob-k4 "
    "resolved-weight-k4 fwm-prob-k16"
).split()


def register(sub) -> None:
    p = sub.add_parser(
        "ops",
        help="operator table: distance to softmax and gradient zero-sum residual",
        description="`kinterval ops`: the operator table. `kinterval ops verify`: the closed-form backward "
        "against autograd of the reference, every operator and mode (takes --K, --T and --scale).",
    )
    p.add_argument("action", nargs="?", choices=["table", "verify"], default="table")
    p.add_argument("--operators", help="table only: comma-separated names (default: a set of each family)")
    p.add_argument(
        "--range-grad", help="table only: backward rule of the K-interval operators (default: full)"
    )
    p.add_argument(
        "--T", type=int, help="keys per causal row, 4 x 4 heads (default: 128); verify's default: 33"
    )
    p.add_argument("--scale", type=float, help="score standard deviation (default: 6, spans of about 25-30)")
    p.add_argument("--seed", type=int, help="table only: seed of the random scores (default: 0)")
    p.add_argument("--K", type=int, nargs="+", help="verify only: the K of every operator (default: 4 16)")
    p.set_defaults(func=run)


def _given(args, *names) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n) is not None]


def run(args) -> int:
    if args.T is not None and args.T < 2:  # the residual column needs rows with at least two keys
        raise ValueError(f"--T must be an integer >= 2, got {args.T}")
    if args.scale is not None and (not math.isfinite(args.scale) or args.scale <= 0):
        raise ValueError(f"--scale must be a finite number > 0, got {args.scale}")
    if args.action == "verify":
        from kinterval.ops.verify import main as verify_main

        if other := _given(args, "operators", "range_grad", "seed"):
            raise ValueError(f"`ops verify` checks every operator and mode; it takes --K, --T and --scale, "
                             f"not {', '.join(other)}")  # fmt: skip
        argv = [*(["--K", *map(str, args.K)] if args.K else [])]
        argv += [*(["--T", str(args.T)] if args.T is not None else [])]
        argv += [*(["--scale", repr(args.scale)] if args.scale is not None else [])]
        return verify_main(argv)
    if args.K is not None:
        raise ValueError("--K is for `kinterval ops verify` (the table takes operator names: --operators)")
    operators = args.operators or ",".join(DEFAULT_OPERATORS)
    range_grad = args.range_grad or "full"
    if range_grad not in RANGE_GRADS:
        raise ValueError(f"--range-grad must be one of {', '.join(RANGE_GRADS)}, got {range_grad!r}")
    T, scale, seed = args.T or 128, args.scale or 6.0, args.seed or 0
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(4, 4, T, T, generator=gen) * scale
    up = torch.randn(s.shape, generator=gen)
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    P_soft = attention_probs(s, "softmax", causal=True)
    table = Table(title=f"operators on random causal scores (T={T}, score sd {scale:g}, float32)")
    for col in ("operator", "TV to softmax (mean)", "TV max", "zero-sum residual (median)", "residual max"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for name in operators.split(","):
        spec = OperatorSpec.parse(name.strip())
        if spec.is_kinterval and range_grad != "full":  # the baselines have no range_grad
            spec = OperatorSpec.parse(name.strip(), range_grad=range_grad)
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
