"""``import_bin``: wrap existing flat uint16 token files (a pre-tokenized corpus) as a prepared dataset."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from kinterval.data import sources
from kinterval.data.tokenizer import (
    EOT,
    GPT2_BPE_SHA256,
    GPT2_VOCAB,
    file_sha256,
    gpt2_ids_problem,
    resolve_bpe_file,
    tokenizer_hash,
)
from kinterval.data.writer import DTYPE, ShardWriter, replacing, warn_short, write_meta


def gpt2_tokenizer(bpe_file: str | Path | None = None) -> dict:
    """meta.json's tokenizer record of GPT-2 BPE ids: ``{"name": "gpt2", "sha256": ...}`` of the ranks file
    ``gpt2_encoding(bpe_file)`` would use. A missing ranks file (FileNotFoundError) or one that is not GPT-2's
    (ValueError) is refused, as it is when text is tokenized."""
    sha = tokenizer_hash(bpe_file)
    if sha != GPT2_BPE_SHA256:
        path = resolve_bpe_file(bpe_file)
        raise ValueError(f"{path}: not the GPT-2 ranks file (sha256 differs from {GPT2_BPE_SHA256})")
    return {"name": "gpt2", "sha256": sha}


def find_bin_files(directory: str | Path) -> dict[str, list[Path]]:
    """Flat uint16 files of a folder by split: ``*.{split}.bin``, ``{split}.bin`` or ``{split}_*.bin``, in
    natural order (``train_2.bin`` before ``train_10.bin``)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"bin source directory not found: {directory}")
    found: dict[str, list[Path]] = {}
    # every entry, a dangling symlink too (glob leaves it out): import_bin then names it as not found
    entries = list(directory.iterdir())
    for split in sources.SPLITS:
        names = [split] + [a for a, s in sources.SPLIT_ALIASES.items() if s == split]
        files = sorted(
            {
                p
                for n in names
                for pat in (f"*.{n}.bin", f"{n}.bin", f"{n}_*.bin")
                for p in entries
                if fnmatch.fnmatchcase(p.name, pat)
            },
            key=lambda p: sources.natural_key(p.name),
        )
        if files:
            found[split] = files
    if not found:
        raise ValueError(f"no *.train.bin / *.val.bin / *.test.bin files in {directory}")
    return found


def import_bin(
    files: dict[str, str | Path | list[str | Path]],
    out: str | Path,
    *,
    vocab_size: int = GPT2_VOCAB,
    eot: int = EOT,
    tokenizer: dict | None = None,
    source: str = "bin",
    copy: bool = True,
    shard_tokens: int = 100_000_000,
    progress: bool = True,
    tokens: int | None = None,
) -> dict:
    """Wrap existing flat little-endian uint16 token files as a prepared dataset.

    ``copy=True`` re-shards them into ``out``; ``copy=False`` references them in place (meta.json stores their
    paths relative to ``out``). Every id is checked against ``vocab_size`` before the dataset already in
    ``out`` is removed; sha256 is recorded either way.
    ``tokens`` caps the train split at its first ``tokens`` ids (copy only: a referenced file is whole).
    ``tokenizer`` is meta.json's tokenizer record; by default GPT-2's (:func:`gpt2_tokenizer`), checked before
    anything in ``out`` is removed.
    """
    out = Path(out)
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    if tokens is not None and not copy:
        raise ValueError(
            "a train-token cap (--tokens) copies the first ids of the train split; referenced files "
            "(--reference, copy=False) are used whole: drop one of the two"
        )
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens must be a positive integer, got {shard_tokens!r}")
    if not 0 <= eot < vocab_size <= 1 << 16:
        raise ValueError(
            f"need 0 <= eot < vocab_size <= 65536 (uint16 ids), got eot {eot}, vocab_size {vocab_size}"
        )
    tokenizer = tokenizer or gpt2_tokenizer()  # a missing or wrong ranks file must not cost ``out`` either
    if problem := gpt2_ids_problem(tokenizer.get("name"), vocab_size, eot):  # the loader would refuse it
        raise ValueError(f"{problem}: pass the tokenizer record of these ids (tokenizer={{'name': ...}})")
    files = {
        sources.SPLIT_ALIASES.get(s, s): [Path(p) for p in (f if isinstance(f, list) else [f])]
        for s, f in files.items()
    }
    if tokens is not None and "train" not in files:
        raise ValueError(
            f"a train-token cap (--tokens) needs a train split; the files are of {sorted(files)}"
        )
    for path in (p for group in files.values() for p in group):
        if not path.is_file():
            raise FileNotFoundError(f"token file not found: {path}")
        if path.stat().st_size % DTYPE.itemsize:
            raise ValueError(f"{path}: odd byte size, not a flat uint16 token file")
        _check_not_wider(path)
        if path.resolve().parent == out.resolve() and path.name.startswith(tuple(f"{s}_" for s in files)):
            raise ValueError(f"{path}: importing into its own folder would overwrite it; choose another out")
        if copy and path.resolve().parent == out.resolve():  # the next bin: prepare would read both
            raise ValueError(
                f"--out {out} is the folder of the token files it imports: their copies would lie beside "
                "them and a later prepare of that folder would read both; choose another --out, or "
                "--reference to wrap the files in place"
            )
    # Every id is checked (and the documents counted) before anything is written: a file of another
    # vocabulary must not cost the dataset in ``out``. The copies go to a staging folder, which replaces that
    # dataset only once they are all written (a full disk or Ctrl-C leaves it whole).
    limits = {s: tokens if s == "train" else None for s in files}
    n_docs = {s: _scan_split(g, vocab_size, eot, progress, limits[s]) for s, g in files.items()}
    with replacing(out, files) as stage:
        records = {
            s: _import_split(out, stage, s, g, vocab_size, copy, shard_tokens, progress, limits[s], n_docs[s])
            for s, g in files.items()
        }
    if tokens is not None:
        warn_short(f"{source} files", {"train": (records["train"]["n_tokens"], tokens)}, stacklevel=2)
    params = {
        "files": {s: [str(p) for p in g] for s, g in files.items()},
        "copy": copy,
        "shard_tokens": shard_tokens,
        "tokens": tokens,
    }
    return write_meta(out, source, records, vocab_size, eot, tokenizer, None, params)


def _check_not_wider(path: Path, sample: int = 1 << 20) -> None:
    """Refuse int32/int64 token files, which read as uint16 give twice (or 4x) the ids with zeros between.

    Little-endian ids below 65536 stored as int32 leave every second uint16 zero (int64: three in four). A
    real uint16 token stream never has a zero at every odd position of its first ``sample`` ids, so at least
    16 ids with all odd positions zero and some even position non-zero identify a wider file.
    """
    ids = np.memmap(path, dtype=DTYPE, mode="r") if path.stat().st_size else np.zeros(0, DTYPE)
    head = np.asarray(ids[:sample])
    if len(head) >= 16 and not head[1::2].any() and head[0::2].any():
        width = "int64" if not head[1::4].any() and not head[2::4].any() and not head[3::4].any() else "int32"
        raise ValueError(
            f"{path}: looks like {width} token ids (every second uint16 is 0); bin: needs flat little-endian "
            f"uint16 files: convert with np.fromfile(path, np.{width}).astype(np.uint16).tofile(new_path)"
        )


def _split_ids(group: list[Path], limit: int | None):
    """(path, uint16 ids) of each file of a split; ``limit`` keeps the split's first ``limit`` ids."""
    for path in group:
        ids = np.memmap(path, dtype=DTYPE, mode="r") if path.stat().st_size else np.zeros(0, DTYPE)
        if limit is not None:
            ids, limit = ids[:limit], limit - len(ids[:limit])
        yield path, ids


def _chunks(ids: np.ndarray, desc: str, progress: bool):
    with tqdm(total=len(ids), desc=desc, unit="tok", disable=not progress) as bar:
        for start in range(0, len(ids), 1 << 24):
            chunk = np.asarray(ids[start : start + (1 << 24)])
            yield chunk
            bar.update(len(chunk))


def _scan_split(group, vocab_size, eot, progress, limit=None) -> int:
    """Check every id of a split against ``vocab_size``; return its number of documents (``eot`` ids)."""
    n_docs = 0
    for path, ids in _split_ids(group, limit):
        for chunk in _chunks(ids, f"check {path.name}", progress):
            if int(chunk.max()) >= vocab_size:
                raise ValueError(f"{path}: token id {int(chunk.max())} >= vocab_size {vocab_size}")
            n_docs += int(np.count_nonzero(chunk == eot))
    return n_docs


def _import_split(out, stage, split, group, vocab_size, copy, shard_tokens, progress, limit, n_docs) -> dict:
    """Copy (into ``stage``) or reference (by a path relative to ``out``) the (checked) files of one split;
    ``limit`` (copy only) keeps its first ``limit`` ids. Returns the split record of meta.json (``n_docs``
    from ``_scan_split``)."""
    writer = ShardWriter(stage, split, vocab_size, shard_tokens) if copy else None
    shards = []
    for path, ids in _split_ids(group, limit):
        if writer is not None:
            for chunk in _chunks(ids, f"import {path.name}", progress):
                writer.write(chunk)
        else:  # referenced in place, by a path relative to out
            rel = os.path.relpath(path.resolve(), out.resolve())
            shards.append(
                {"file": rel, "n_tokens": len(ids), "bytes": path.stat().st_size, "sha256": file_sha256(path)}
            )
    shards = writer.close() if writer is not None else shards
    return {"n_tokens": sum(s["n_tokens"] for s in shards), "n_documents": n_docs, "shards": shards}
