"""Atomic writing of token shards (flat little-endian uint16, no header) and of meta.json."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from kinterval import atomic

DTYPE = np.dtype("<u2")
FORMAT_VERSION = 1


def shard_name(split: str, k: int) -> str:
    return f"{split}_{k:04d}.bin"


class ShardWriter:
    """Appends token ids of one split to ``{split}_{k:04d}.bin`` files of at most ``shard_tokens`` ids each.

    Each shard is written as ``*.tmp`` and renamed when complete; ``close()`` returns the shard records
    ``{"file", "n_tokens", "bytes", "sha256"}`` for meta.json.
    """

    def __init__(self, out: str | Path, split: str, vocab_size: int, shard_tokens: int = 100_000_000):
        if vocab_size > 1 << 16:
            raise ValueError(f"vocab_size {vocab_size} does not fit the uint16 token files")
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
        self.out, self.split, self.vocab_size, self.shard_tokens = Path(out), split, vocab_size, shard_tokens
        self.shards: list[dict] = []
        self.n_tokens = 0
        self._f = None

    def _open(self) -> None:
        self._path = self.out / shard_name(self.split, len(self.shards))
        self._tmp = self._path.with_name(self._path.name + ".tmp")
        self._f = open(self._tmp, "wb")
        self._hash, self._count = hashlib.sha256(), 0

    @contextlib.contextmanager
    def _writing(self):
        """A failed write (a full disk) names the shard and removes its partial ``.tmp``, which holds the
        space."""
        try:
            with atomic.naming(self._path):
                yield
        except BaseException:
            with contextlib.suppress(OSError):
                self._f.close()
            self._tmp.unlink(missing_ok=True)
            self._f = None
            raise

    def _finish(self) -> None:
        with self._writing():
            self._f.close()
            os.replace(self._tmp, self._path)
        self.shards.append(
            {"file": self._path.name, "n_tokens": self._count, "bytes": self._count * DTYPE.itemsize,
             "sha256": self._hash.hexdigest()}
        )  # fmt: skip
        self._f = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids)
        if ids.size and (int(ids.max()) >= self.vocab_size or int(ids.min()) < 0):
            raise ValueError(f"token id out of range [0, {self.vocab_size}) for split {self.split!r}")
        ids = ids.astype(DTYPE, copy=False)
        while ids.size:
            if self._f is None:
                self._open()
            take = min(ids.size, self.shard_tokens - self._count)
            blob = ids[:take].tobytes()
            with self._writing():
                self._f.write(blob)
            self._hash.update(blob)
            self._count += take
            self.n_tokens += take
            ids = ids[take:]
            if self._count == self.shard_tokens:
                self._finish()

    def close(self) -> list[dict]:
        if self._f is not None:
            self._finish()
        return self.shards


def write_json_atomic(path: str | Path, obj: dict) -> None:
    path = Path(path)
    atomic.write_text(path, json.dumps(obj, indent=2) + "\n")


def clear_outputs(out: Path, splits: Iterable[str]) -> None:
    """Make ``out``; remove what a previous prepare left (meta.json first: the folder is invalid now): the
    shards of ``splits`` and of every split the old meta.json lists, so no split of another dataset stays."""
    out.mkdir(parents=True, exist_ok=True)
    names = set(splits)
    try:
        listed = json.loads((out / "meta.json").read_text()).get("splits", {})
        names |= (
            {n for n in listed if isinstance(n, str) and n.isidentifier()}
            if isinstance(listed, dict)
            else set()
        )
    except (OSError, ValueError, AttributeError):  # no meta.json, or a damaged one: its splits are unknown
        pass
    (out / "meta.json").unlink(missing_ok=True)
    for split in names:
        for old in out.glob(f"{split}_*.bin*"):
            old.unlink()


def write_meta(out, source, records, vocab_size, eot, tokenizer, seed, params) -> dict:
    """Write meta.json (atomically, last) and return it."""
    meta = {
        "format": "kinterval-tokens",
        "format_version": FORMAT_VERSION,
        "source": source,
        "dtype": "uint16",
        "byteorder": "little",
        "vocab_size": vocab_size,
        "eot": eot,
        "tokenizer": tokenizer,
        "seed": seed,
        "params": params,
        "splits": records,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json_atomic(Path(out) / "meta.json", meta)
    return meta
