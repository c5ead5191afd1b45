"""Endpoint ΔNLL on the validation blocks that share no text with the training split (GPT-3's "clean"
subsets), beside the blocks that do: whether a difference between operators comes from memorized text. Each
block's share of targets inside an n-gram window that also stands in the training split comes from
``kinterval data overlap DATA --block-size T --json FILE`` (:func:`read_coverage`); the report takes it with
``--clean-blocks FILE``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kinterval.report.analysis.core import Estimate, delta_table, softmax_pairs
from kinterval.report.results import Key, Point


@dataclass
class CleanRow:
    """One condition's endpoint ΔNLL vs same-seed softmax on all blocks, on the clean blocks (no target in
    a found window) and on the covered ones (None: fewer than two such blocks)."""

    key: Key
    seeds: tuple[int, ...]
    n: int  # the overlap's window length (n-gram)
    all: Estimate
    clean: Estimate | None
    covered: Estimate | None
    n_clean: int
    n_covered: int


def read_coverage(path: str | Path) -> dict:
    """A ``kinterval data overlap --block-size T --json`` file, checked: its window length ``n``, the
    ``block_size``, the split's ``shards_sha256`` and ``block_coverage`` (numpy, shares in [0, 1])."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None

    def count(x) -> bool:  # a positive integer (not a bool, not 13.7)
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    def share(x) -> bool:  # a real number in [0, 1] (not a string, a bool, a list or NaN)
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1

    ok = (
        isinstance(d, dict)
        and count(d.get("n"))
        and count(d.get("block_size"))
        and isinstance(d.get("shards_sha256"), list)
        and all(isinstance(s, str) for s in d["shards_sha256"])
        and isinstance(d.get("block_coverage"), list)
        and all(share(c) for c in d["block_coverage"])
    )
    cover = np.asarray(d["block_coverage"] if ok else [], dtype=float)
    if not ok or cover.size == 0:
        raise ValueError(
            f"{path}: not a block coverage file (write one with `kinterval data overlap DATA --block-size T "
            "--json FILE`: it needs n, block_size, shards_sha256 and block_coverage)"
        )
    return {**d, "path": str(path), "block_coverage": cover, "shards_sha256": tuple(d["shards_sha256"])}


def clean_blocks(points: list[Point], coverages: list[dict]) -> list[CleanRow]:
    """:class:`CleanRow` per condition and coverage file, for the primary evaluations of the split the file
    describes (the same shard hashes, block size and block count). ``ValueError`` for a file that matches no
    evaluation."""
    out, seen = [], {}
    for cov in coverages:
        c = cov["block_coverage"]
        same = (cov["shards_sha256"], cov["block_size"], cov["n"])
        if same in seen:  # two rows per condition that the table could not tell apart
            raise ValueError(
                f"{cov['path']} and {seen[same]} both give the {cov['n']}-gram coverage of one split at "
                f"block size {cov['block_size']}: give one of them"
            )
        seen[same] = cov["path"]
        sel = [
            p
            for p in points
            if p.primary and p.shards == cov["shards_sha256"] and p.data[2] == cov["block_size"]
            and p.nll.size <= c.size
        ]  # fmt: skip
        if not sel:
            raise ValueError(
                f"{cov['path']}: no evaluation of that split ({c.size} blocks of {cov['block_size']} tokens, "
                f"shards {', '.join(s[:12] for s in cov['shards_sha256'])}) in these folders"
            )
        # the same shards and block size give the same blocks: an evaluation with fewer (`--max-blocks`)
        # read the first ones, so its coverage is the file's first entries
        for size in sorted({p.nll.size for p in sel}, reverse=True):
            out += _rows(cov["n"], c[:size], [p for p in sel if p.nll.size == size])
    return out


def _rows(n: int, c: np.ndarray, sel: list[Point]) -> list[CleanRow]:
    """The rows of one coverage ``c`` over the evaluations ``sel``, all of ``c.size`` blocks."""
    rows, out = {}, []
    for name, mask in (("all", None), ("clean", c == 0), ("covered", c > 0)):
        if mask is not None and mask.sum() < 2:
            rows[name] = {}
            continue
        pts = sel if mask is None else [dataclasses.replace(p, nll=p.nll[mask]) for p in sel]
        rows[name] = {r.key: r for r in delta_table(softmax_pairs(pts))}
    for key, r in rows["all"].items():
        clean, covered = rows["clean"].get(key), rows["covered"].get(key)
        out.append(
            CleanRow(
                key,
                r.seeds,
                int(n),
                r.est,
                clean.est if clean else None,
                covered.est if covered else None,
                int((c == 0).sum()),
                int((c > 0).sum()),
            )
        )
    return out
