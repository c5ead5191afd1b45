"""Atomic writing of token shards (flat little-endian uint16, no header) and of meta.json."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Iterator
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


def warn_short(source: str, short: dict[str, tuple[int, int]], stacklevel: int = 3) -> None:
    """Warn that ``source`` ended before a split's token budget was met: ``short``, split -> (tokens
    written, budget), those below their budget only (every source says it the same way)."""
    short = {s: (n, b) for s, (n, b) in short.items() if n < b}
    if short:
        said = "; ".join(f"{s}: {n:,} of {b:,} tokens" for s, (n, b) in short.items())
        warnings.warn(f"the {source} ended before every budget was met ({said})", stacklevel=stacklevel + 1)


def write_json_atomic(path: str | Path, obj: dict) -> None:
    path = Path(path)
    atomic.write_text(path, json.dumps(obj, indent=2) + "\n")


STAGING = ".prepare-staging"  # the folder inside ``out`` that a prepare writes its new shards to
META_FORMAT = "kinterval-tokens"


def _is_shard(name: str, split: str) -> bool:
    """A file name that ShardWriter writes for ``split``: ``train_0000.bin`` or its ``.tmp``."""
    return re.fullmatch(rf"{re.escape(split)}_\d{{4,}}\.bin(\.tmp)?", name) is not None


def _old_splits(out: Path) -> set[str]:
    """The splits the meta.json in ``out`` lists; ``ValueError`` when ``out`` holds a meta.json that is not a
    kinterval dataset's (replacing it would delete another tool's files)."""
    path = out / "meta.json"
    if not path.exists():
        return set()
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise ValueError(
            f"{path} is not the meta.json of a kinterval dataset: preparing there would replace it and the "
            "shard files beside it; choose an empty --out or one that holds a kinterval dataset"
        )
    listed = meta.get("splits")
    if not isinstance(listed, dict):
        return set()
    return {n for n in listed if isinstance(n, str) and n.isidentifier()}


def check_replaceable(out: str | Path, splits: Iterable[str]) -> set[str]:
    """The splits whose shards a prepare into ``out`` replaces (``splits`` and every split of the old
    meta.json); ``ValueError`` when ``out`` holds files that a prepare would delete or write beside but did
    not write: another meta.json, or a ``{split}_*.bin`` of another name (``train_1.bin``: a ``bin:`` folder,
    which a later import would read together with the new shards)."""
    out = Path(out)
    names = set(splits) | _old_splits(out)
    if out.is_dir():
        for split in sorted(names):
            for f in sorted(out.glob(f"{split}_*.bin*")):
                if not _is_shard(f.name, split):
                    raise ValueError(
                        f"{f} is not a shard that kinterval writes: preparing into {out} would delete it or "
                        "leave it beside the new shards; choose another --out"
                    )
    return names


def clear_outputs(out: Path, splits: Iterable[str]) -> None:
    """Make ``out``; remove what a previous prepare left (meta.json first: the folder is invalid now): the
    shards of ``splits`` and of every split the old meta.json lists, so no split of another dataset stays.
    Refuses (``check_replaceable``) a folder holding files that no prepare wrote."""
    names = check_replaceable(out, splits)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)
    for split in names:
        for old in out.glob(f"{split}_*.bin*"):
            old.unlink()


@contextlib.contextmanager
def replacing(out: str | Path, splits: Iterable[str]) -> Iterator[Path]:
    """Write a new dataset's shards into a staging folder inside ``out`` (yielded); only when they are all
    written is the dataset already in ``out`` removed (:func:`clear_outputs`) and the new shards moved in.
    A source that fails part way (a bad row deep in a stream, a full disk) leaves the old dataset whole, and
    no partial shard behind. The caller writes meta.json afterwards."""
    out = Path(out)
    splits = list(splits)
    check_replaceable(out, splits)
    stage = out / STAGING
    shutil.rmtree(stage, ignore_errors=True)  # a killed prepare's
    stage.mkdir(parents=True)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    clear_outputs(out, splits)
    for f in sorted(stage.iterdir()):
        os.replace(f, out / f.name)
    stage.rmdir()


def write_meta(out, source, records, vocab_size, eot, tokenizer, seed, params) -> dict:
    """Write meta.json (atomically, last) and return it."""
    meta = {
        "format": META_FORMAT,
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
