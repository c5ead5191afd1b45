"""A plain-text table for the command-line reports (``kinterval ops``, ``python -m kinterval.ops.verify``)."""

from __future__ import annotations


class Table:
    """Columns added with a justification, rows of strings; ``str(table)`` is the aligned text."""

    def __init__(self, title: str = ""):
        self.title = title
        self.columns: list[tuple[str, str]] = []
        self.rows: list[tuple[str, ...]] = []

    def add_column(self, header: str, justify: str = "left") -> None:
        self.columns.append((header, justify))

    def add_row(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells, the table {len(self.columns)} columns")
        self.rows.append(tuple(map(str, cells)))

    def __str__(self) -> str:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows]) for i, (h, _) in enumerate(self.columns)]

        def line(cells) -> str:
            return "  ".join(
                c.ljust(w) if j == "left" else c.rjust(w) for c, w, (_, j) in zip(cells, widths, self.columns)
            ).rstrip()

        rule = "  ".join("-" * w for w in widths)
        body = [line(h for h, _ in self.columns), rule, *map(line, self.rows)]
        return "\n".join(([self.title] if self.title else []) + body)
