"""CLI: ``kinterval ops`` (operator table) and ``kinterval ops verify`` (closed form vs reference)."""

from __future__ import annotations

import math
import os
import re

import torch

from kinterval.ops.api import attention_probs, valid_mask
from kinterval.ops.diagnostics import score_gradient, zero_sum_residual
from kinterval.ops.seeds import check_seed
from kinterval.ops.spec import RANGE_GRADS, OperatorSpec
from kinterval.ops.text_table import Table

DEFAULT_OPERATORS = (
    "softmax bf16-exp fp8-exp lerp-k4 lerp-k16 minmax-weight-k4 minmax-prob-k4 fwm-weight-k4 fwm-prob-k4 "
    "resolved-weight-k4 fwm-prob-k16"
).split()
# Peak memory per T^2, measured: the table's 4x4xTxT float32 tensors (T = 512, 1024) and verify's 2x3xTxT
# float64 ones (T = 600) take about 2-3 KiB per T^2 in all
BYTES_PER_T2 = 3 * 1024


def register(sub) -> None:
    p = sub.add_parser(
        "ops",
        help="operator table: distance to softmax and gradient zero-sum residual",
        description="`kinterval ops`: the operator table. `kinterval ops verify`: the closed-form backward "
        "against autograd of the reference, every operator and mode (takes --K, --T and --scale).",
    )
    p.add_argument("action", nargs="?", choices=["table", "verify"], default="table")
    p.add_argument(
        "--operators",
        help="table only: comma-separated names, full names with [overrides] too, as the table prints them "
        "(default: a set of each family)",
    )
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


def _memory_available() -> int | None:
    """Bytes of memory available (Linux: MemAvailable; elsewhere the physical total), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(T: int) -> None:
    """Refuse a --T whose tensors would not fit (it failed with an allocator traceback, or swapped)."""
    need, avail = BYTES_PER_T2 * T * T, _memory_available()
    if avail is not None and need > avail:
        raise ValueError(f"--T {T} needs about {need / 2**30:,.1f} GiB of memory (about 3 KiB per T^2), more "
                         f"than the {avail / 2**30:,.1f} GiB available; use a smaller --T")  # fmt: skip


def split_operators(text: str) -> list[str]:
    """``--operators``: comma-separated full names, whose ``[...]`` may hold commas of their own
    (``fwm-prob-k4[tau=5,range_grad=detach]``); blank items are skipped."""
    return [n.strip() for n in re.split(r",(?![^\[\]]*\])", text) if n.strip()]


def _spec(name: str, range_grad: str | None) -> OperatorSpec:
    """A table operator: its full name (as the table prints it), with --range-grad for K-interval ones."""
    spec = OperatorSpec.from_full_name(name)  # the parse error itself (unknown name, tau out of range, ...)
    if range_grad is None or range_grad == "full" or not spec.is_kinterval:  # baselines have no range_grad
        return spec
    if spec.range_grad not in ("full", range_grad):
        raise ValueError(
            f"operator {name!r} sets range_grad={spec.range_grad}, --range-grad says {range_grad}"
        )
    return OperatorSpec.parse(spec, range_grad=range_grad)


def run(args) -> int:
    if args.T is not None and args.T < 2:  # the residual column needs rows with at least two keys
        raise ValueError(f"--T must be an integer >= 2, got {args.T}")
    _check_memory(args.T if args.T is not None else 128)
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
    range_grad = args.range_grad or "full"
    if range_grad not in RANGE_GRADS:
        raise ValueError(f"--range-grad must be one of {', '.join(RANGE_GRADS)}, got {range_grad!r}")
    names = split_operators(args.operators) if args.operators is not None else DEFAULT_OPERATORS
    if not names:
        raise ValueError(f"--operators names no operator, got {args.operators!r}")
    specs = [_spec(name, range_grad) for name in names]  # every name, before the (large) tensors
    T, scale, seed = args.T or 128, args.scale or 6.0, check_seed(args.seed or 0, "--seed")
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(4, 4, T, T, generator=gen) * scale
    up = torch.randn(s.shape, generator=gen)
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    P_soft = attention_probs(s, "softmax", causal=True)
    table = Table(title=f"operators on random causal scores (T={T}, score sd {scale:g}, float32)")
    for col in ("operator", "TV to softmax (mean)", "TV max", "zero-sum residual (median)", "residual max"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for spec in specs:
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
