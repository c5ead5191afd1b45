"""``kinterval report DIR [DIR ...] [--out DIR]``."""

from __future__ import annotations

from pathlib import Path


def _report(args) -> int:
    from kinterval.report.build import build_report

    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    path = build_report(args.dirs, out, clean_blocks=args.clean_blocks or ())
    print(f"report written: {path}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="tables (Markdown + LaTeX) and figures from suite result files")
    p.add_argument(
        "dirs",
        nargs="+",
        help="suite folder(s) (with manifest.json); runs are paired with same-seed controls across all",
    )
    p.add_argument("--out", default=None, help="output folder (default: DIR/report)")
    p.add_argument(
        "--clean-blocks",
        action="append",
        metavar="FILE",
        help="a `kinterval data overlap --block-size T --json` file: adds ΔNLL on the blocks that share no "
        "n-gram with the training split (repeatable)",
    )
    p.set_defaults(func=_report)
