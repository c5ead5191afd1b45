"""CLI: ``kinterval ops`` (operator table), ``kinterval ops verify`` (closed form vs reference) and
``kinterval ops consistency`` (the gradient-consistency diagnostics of App. F)."""

from __future__ import annotations

import math
import os
import re

import torch

from kinterval import atomic
from kinterval.arglists import Extend, numbers
from kinterval.ops.api import attention_probs, valid_mask
from kinterval.ops.diagnostics import consistency_table, median, score_gradient, zero_sum_residual
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
        "against autograd of the reference, every operator and mode (takes --K, --T and --scale). "
        "`kinterval ops consistency`: the gradient-consistency diagnostics A1-A4 and P1-0 (App. F) in "
        "float64, under range_grad full, detach and p1 (takes --K or --operators, --T, --scale, --seed, "
        "--json). The table and consistency write their numbers as JSON with --json FILE.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["table", "verify", "consistency"],
        default="table",
        help="what to compute (default table; see above)",
    )
    p.add_argument(
        "--operators",
        help="table and consistency: comma-separated names, full names with [overrides] too, as the table "
        "prints them (default: a set of each family; consistency: softmax, lerp, minmax-weight and "
        "minmax-prob at each --K)",
    )
    p.add_argument(
        "--range-grad", help="table only: backward rule of the K-interval operators (default: full)"
    )
    p.add_argument(
        "--T",
        type=int,
        help="keys per causal row, 4 x 4 heads (default: 128); verify's default: 33, consistency's: 64",
    )
    p.add_argument("--scale", type=float, help="score standard deviation (default: 6, spans of about 25-30)")
    p.add_argument("--seed", type=int, help="table and consistency: seed of the random scores (default: 0)")
    p.add_argument(
        "--K",
        type=numbers(int),
        action=Extend,
        nargs="+",
        help="verify and consistency: the K of every operator, space- or comma-separated (default: 4 16; "
        "consistency: 2 4 8 16 32)",
    )
    p.add_argument("--json", help="table and consistency: also write the numbers here as JSON")
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
    if range_grad is None or not spec.is_kinterval:  # baselines have no range_grad
        return spec
    named = "range_grad" in name.partition("[")[2].lower()  # "[range_grad=full]" is a choice, too
    if named and spec.range_grad != range_grad:
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
    # every action draws float32 scores N(0, scale^2); 8 sd stays under float32's largest value
    if args.scale is not None and args.scale * 8 > torch.finfo(torch.float32).max:
        raise ValueError(f"--scale {args.scale:g} makes float32 scores overflow; use a smaller --scale")
    if args.json is not None and args.action == "verify":
        raise ValueError("--json is for the table and `kinterval ops consistency`, not `ops verify`")
    if args.action == "consistency":
        return _consistency(args)
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
        raise ValueError(
            "--K is for `kinterval ops verify` and `kinterval ops consistency` (the table takes operator "
            "names: --operators)"
        )
    range_grad = (args.range_grad or "full").lower()  # case-insensitive, as in a name (the paper's P1)
    if range_grad not in RANGE_GRADS:
        raise ValueError(f"--range-grad must be one of {', '.join(RANGE_GRADS)}, got {range_grad!r}")
    names = split_operators(args.operators) if args.operators is not None else DEFAULT_OPERATORS
    if not names:
        raise ValueError(f"--operators names no operator, got {args.operators!r}")
    # every name, before the (large) tensors; a name's own range_grad stands where the flag is not given
    specs = [_spec(name, range_grad if args.range_grad is not None else None) for name in names]
    if args.json is not None:  # before the tensors, not after
        atomic.check_target(args.json)
    T, scale, seed = args.T or 128, args.scale or 6.0, check_seed(args.seed or 0, "--seed")
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(4, 4, T, T, generator=gen) * scale
    up = torch.randn(s.shape, generator=gen)
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    P_soft = attention_probs(s, "softmax", causal=True)
    table = Table(title=f"operators on random causal scores (T={T}, score sd {scale:g}, float32)")
    for col in ("operator", "TV to softmax (mean)", "TV max", "zero-sum residual (median)", "residual max"):
        table.add_column(col, justify="left" if col == "operator" else "right")
    rows = []
    for spec in specs:
        P = attention_probs(s, spec, causal=True)
        # both columns over the rows with >= 2 keys (i >= 1): row 0 holds one key, TV 0 for every operator
        tv = 0.5 * (P - P_soft).abs().sum(-1)[..., 1:]
        rho = zero_sum_residual(score_gradient(s, spec, up, causal=True), valid)[..., 1:]
        row = dict(operator=spec.full_name, tv_mean=float(tv.mean()), tv_max=float(tv.max()))
        rows.append(row | dict(residual_median=median(rho), residual_max=float(rho.max())))
        table.add_row(
            spec.full_name, f"{tv.mean():.4f}", f"{tv.max():.4f}", f"{median(rho):.1e}", f"{rho.max():.1e}"
        )
    if args.json is not None:  # before the table: `... | head` stops the printing, never the file
        setting = {"T": T, "scale": scale, "seed": seed, "range_grad": range_grad, "dtype": "float32"}
        atomic.write_json(args.json, {"setting": setting, "rows": rows})
    print(table)
    return 0


# ------------------------------------------------------------------------------------------ consistency
def _consistency(args) -> int:
    """`kinterval ops consistency`: :func:`consistency_table`, printed as the paper's table (Diagnostic,
    Question, Result) and one row per operator and backward; the numbers as JSON with --json."""
    if other := _given(args, "range_grad"):
        raise ValueError(f"`ops consistency` runs range_grad full, detach and p1 itself; it does not take "
                         f"{other[0]}")  # fmt: skip
    if args.T is not None and args.T < 3:
        raise ValueError(f"--T must be an integer >= 3 for `ops consistency` (A4 needs rows of three keys), "
                         f"got {args.T}")  # fmt: skip
    if args.K is not None and args.operators is not None:
        raise ValueError("--K sets the K of the default operators; --operators names carry their own K")
    if args.K is not None and any(K < 1 for K in args.K):
        raise ValueError(f"--K must be integers >= 1, got {' '.join(map(str, args.K))}")
    if args.json is not None:  # before the diagnostics run, not after
        atomic.check_target(args.json)
    names = None
    if args.operators is not None:
        names = split_operators(args.operators)
        if not names:
            raise ValueError(f"--operators names no operator, got {args.operators!r}")
    result = consistency_table(
        T=args.T if args.T is not None else 64,
        scale=args.scale if args.scale is not None else 6.0,
        seed=check_seed(args.seed if args.seed is not None else 0, "--seed"),
        Ks=args.K,
        operators=names,
    )
    if args.json is not None:  # before the tables: `... | head` stops the printing, never the file
        atomic.write_json(args.json, result)
    print(_summary_table(result))
    print()
    print(_rows_table(result))
    return 0


def _e(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def _summary_table(result: dict) -> Table:
    """The paper's table: a line per diagnostic and family (K-interval families: range_grad full, detach)."""
    st, sm = result["settings"], result["summary"]
    fams = sm["families"]
    table = Table(
        title=f"gradient-consistency diagnostics (App. F), float64, random causal scores "
        f"(T={st['T']}, score sd {st['scale']:g}, seed {st['seed']})"
    )
    for col in ("Diagnostic", "Question", "Result"):
        table.add_column(col)

    def block(diagnostic: str, question: str, results: list[str]) -> None:
        for i, res in enumerate(results):
            table.add_row(diagnostic if i == 0 else "", question if i == 0 else "", res)

    verdict = "pass for all" if sm["shift_pass"] else "FAIL over"
    block("A1 forward shift invariance", f"F(S+c1) = F(S), c = {st['shift_c']:g}",
          [f"{verdict} {sm['operators']} operators: max |F(S+c1) - F(S)| = {_e(sm['shift_max_abs'])} "
           f"(tolerance {st['shift_tol']:.1e}, fp64 rounding of s + c)"])  # fmt: skip
    a2, a3, a4, p1 = [], [], [], []
    for fam, modes in fams.items():
        for mode in ("full", "detach"):
            if mode not in modes:
                continue
            m, label = modes[mode], fam if len(modes) == 1 else f"{fam} {mode}"
            lo, hi = m["residual_median_min"], m["residual_median_max"]
            median = f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f} over K"
            a2.append(f"{label}: max {_e(m['residual_max'])}" if mode == "full" else
                      f"{label}: median {median}, max {m['residual_max']:.3f}")  # fmt: skip
            K = f" K={m['K_top']}" if m["K_top"] is not None else ""
            over_K = f"; max over K |autograd| {_e(m['directional_autograd_max_abs'])}" if K else ""
            a3.append(f"{label}{K}: autograd {m['directional_autograd_top']:+.1e} vs true 0 "
                      f"(FD {m['directional_fd_top']:+.1e}){over_K}")  # fmt: skip
            if m["interior_rel_err_max"] is not None:
                a4.append(f"{label}: max |autograd - FD| / max |autograd| = {_e(m['interior_rel_err_max'])}")
        if "p1" in modes:
            m = modes["p1"]
            same = "yes" if m["forward_equals_detach_all"] else "NO"
            p1.append(f"{fam}: forward bitwise equal to detach: {same}; projected rho max "
                      f"{_e(m['residual_max'])}; max |g_proj - g_full| {_e(m['max_abs_vs_full_top'])} "
                      f"at K={m['K_top']}, max over K {_e(m['max_abs_vs_full_max'])}")  # fmt: skip
    hard = [f for f, modes in fams.items() if modes["full"]["interior_keys"] is None]
    if hard:
        a4.append(f"{', '.join(hard)}: n/a (hard forward, locally constant)")
    if none := [f for f, modes in fams.items() if modes["full"]["interior_keys"] == 0]:
        a4.append(f"{', '.join(none)}: no key away from the extrema and the grid's kinks (use a larger --T)")
    block("A2 gradient shift residual", "rho = |sum_j g_ij| / sum_j |g_ij| per row", a2)
    block("A3 all-ones directional FD", "autograd vs derivative along s + c1", a3)
    block("A4 interior finite difference", "local slopes away from the extrema", a4)
    block(
        "P1-0 projection sanity",
        "removes exactly the common-mode gradient?",
        p1 or ["n/a (no K-interval operator)"],
    )
    return table


def _rows_table(result: dict) -> Table:
    """Every operator and backward: the numbers the summary is drawn from."""
    table = Table(
        title="per operator and backward (A4: max |autograd - FD| / max |autograd| at interior keys)"
    )
    cols = ("operator", "backward", "A1 max|dF|", "A2 rho median", "A2 rho max", "A3 autograd", "A3 FD",
            "A4 rel err", "max|g - g_full|", "P1 fwd = detach")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("operator", "backward") else "right")
    for r in result["rows"]:
        fwd = {None: "", True: "bitwise", False: "differs"}[r["forward_equals_detach"]]
        table.add_row(r["operator"], r["range_grad"], _e(r["shift_max_abs"]), _e(r["residual_median"]),
                      _e(r["residual_max"]), f"{r['directional_autograd']:+.1e}",
                      f"{r['directional_fd']:+.1e}", _e(r["interior_rel_err"]), _e(r["max_abs_vs_full"]),
                      fwd)  # fmt: skip
    return table
