"""Number lists on the command line: ``--K 4 16``, ``--K 4,16`` and ``--K 4, 16`` are the same list, as the
operator, stage and task lists take commas too.

No kinterval imports: every layer's commands may use it.
"""

from __future__ import annotations

import argparse


def numbers(kind=int):
    """An argparse ``type`` for one value of a ``nargs="+"`` number list that also takes commas (with
    ``action=Extend``)."""

    def parse(text: str) -> list:
        items = [x for x in text.split(",") if x.strip()]
        if not items and "," not in text:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        try:
            return [kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None

    return parse


class Extend(argparse.Action):
    """Flattens the lists of :func:`numbers` into one."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [x for v in values for x in v])
