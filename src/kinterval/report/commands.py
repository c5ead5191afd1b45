"""``kinterval report DIR [DIR ...] [--out DIR]`` and ``kinterval report --runs RUN [RUN ...]``."""

from __future__ import annotations

from pathlib import Path


def _report(args) -> int:
    from kinterval.report.build import build_report

    if args.runs:
        return _runs(args)
    if args.downstream:
        return _downstream(args)
    if args.nll_from or args.heat_panel:
        raise ValueError("--nll-from and --heat-panel are for --downstream")
    if args.split is not None:
        raise ValueError(
            "--split is for --runs (a suite folder's report reads the split its suite evaluates)"
        )
    if not args.dirs:
        raise ValueError("give suite folder(s), or --runs RUN [RUN ...] for runs of `kinterval train`")
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    path = build_report(args.dirs, out, clean_blocks=args.clean_blocks or ())
    print(f"report written: {path}")
    return 0


def _runs(args) -> int:
    from kinterval.report.runs_report import runs_report

    if args.dirs or args.clean_blocks:
        raise ValueError("--runs takes run folders instead of suite folders, and no --clean-blocks")
    if args.downstream or args.nll_from or args.heat_panel:  # not silently dropped
        raise ValueError("--runs takes no --downstream, --nll-from or --heat-panel (a separate report)")
    from kinterval.stats.format import num

    rep = runs_report(args.runs, Path(args.out or "report"), split=args.split or "val")
    for r in rep["rows"]:  # num: a value below the fourth decimal in two significant digits, never -0.0000
        ci = f"[{num(r['lo'])}, {num(r['hi'])}]" + (" separated" if r["separated"] else "")
        print(f"{r['operator']:<24} NLL {r['nll']:.4f}  ΔNLL vs softmax {num(r['delta'])}  {ci}")
    for n in rep["notes"]:
        print(f"note: {n}")
    for cond, p in rep.get("probes", {}).items():  # the table itself is probes.md
        seen = (
            f"not run ({p['not_run']})"
            if "not_run" in p
            else f"vs {p['reference']} ({p['reference_operator']})"
        )
        print(f"probes {cond}: {seen}")
    if rep.get("probes"):
        print(f"probe table written: {Path(rep['index']).parent / 'probes.md'}")
    print(f"report written: {rep['index']}")
    return 0


def _downstream(args) -> int:
    from kinterval.report.downstream import downstream_report

    if args.dirs or args.clean_blocks or args.split is not None:
        raise ValueError("--downstream takes downstream-compare --json files instead of suite folders")
    path = downstream_report(
        args.downstream, Path(args.out or "report"), nll_from=args.nll_from, heat_panel=args.heat_panel
    )
    print(f"report written: {path}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="tables (Markdown + LaTeX) and figures from suite result files")
    p.add_argument(
        "dirs",
        nargs="*",
        help="suite folder(s) (with manifest.json); runs are paired with same-seed controls across all",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        metavar="RUN",
        help="instead of suites: run folders of `kinterval train`, each evaluated at its latest checkpoint "
        "(`kinterval eval`); ΔNLL vs the one softmax run among them",
    )
    p.add_argument(
        "--downstream",
        nargs="+",
        metavar="FILE",
        help="instead of suites: `kinterval downstream-compare --json` files: the pp table (tab:stagec), the "
        "heat map (fig:heat) and the BLiMP / LAMBADA intervals (fig:downstream)",
    )
    p.add_argument(
        "--nll-from",
        metavar="REPORT",
        help="with --downstream: a `kinterval report` folder whose ΔNLL vs softmax orders and labels the "
        "conditions named as its operators",
    )
    p.add_argument(
        "--heat-panel",
        action="append",
        metavar="LABEL=COND,COND",
        help="with --downstream: one panel of the heat map (fig:heat) with these conditions, repeatable; "
        "panels may share conditions and leave some out (default: one panel per downstream-compare --group)",
    )
    p.add_argument(
        "--split",
        default=None,
        help="with --runs: the evaluated split, or an evaluation tag of RUN/eval/ (val__op-softmax, "
        "test__ptb; default: val)",
    )
    p.add_argument("--out", default=None, help="output folder (default: DIR/report; with --runs: report)")
    p.add_argument(
        "--clean-blocks",
        action="append",
        metavar="FILE",
        help="a `kinterval data overlap --block-size T --json` file: adds ΔNLL on the blocks that share no "
        "n-gram with the training split (repeatable)",
    )
    p.set_defaults(func=_report)
