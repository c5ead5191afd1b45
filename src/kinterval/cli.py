"""The ``kinterval`` command line.

Each layer that offers commands has a ``commands.py`` with ``register(subparsers)``; this file only lists
them, so that dependencies keep pointing one way (cli imports everything, nothing imports cli).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# One line per layer; each module defines ``register(subparsers) -> None``.
COMMAND_MODULES = (
    "kinterval.ops.commands",
    "kinterval.data.commands",
    "kinterval.train.commands",
    "kinterval.eval.commands",
    "kinterval.eval.downstream_commands",
    "kinterval.suite.commands",
    "kinterval.report.commands",
    "kinterval.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinterval",
        description="K-interval quantized attention: operators, pretraining and measurement.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError) as err:
        # Bad input is reported as one clear line, not a traceback.
        print(f"kinterval {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
