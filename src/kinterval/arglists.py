"""Number lists on the command line: ``--K 4 16``, ``--K 4,16`` and ``--K 4, 16`` are the same list, as the
operator, stage and task lists take commas too.

No kinterval imports: every layer's commands may use it.
"""

from __future__ import annotations

import argparse


def check_no_empty_item(text: str) -> None:
    """Refuse ``1,,2``: an empty item between two commas is a value left out by mistake, not a separator
    (a comma at either end, ``--K 4, 16``, is one)."""
    if any(not x.strip() for x in text.split(",")[1:-1]):
        raise argparse.ArgumentTypeError(f"an empty item between commas in {text!r}")


def numbers(kind=int):
    """An argparse ``type`` for one value of a ``nargs="+"`` number list that also takes commas (with
    ``action=Extend``)."""

    def parse(text: str) -> list:
        check_no_empty_item(text)
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
