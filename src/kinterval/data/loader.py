"""Reading prepared datasets: validated token splits, validation blocks and the training sequence order.

A prepared dataset is a folder with ``meta.json`` and flat little-endian uint16 shards (see ``prepare.py``).
Validation block ``k`` of length ``T`` is ``x = data[kT:kT+T]``, ``y = data[kT+1:kT+T+1]`` (non-overlapping).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from kinterval.data.sources import SPLIT_ALIASES
from kinterval.data.tokenizer import file_sha256, gpt2_ids_problem
from kinterval.data.writer import DTYPE, FORMAT_VERSION

DTYPE_TEXT = "little-endian uint16"

CHUNK_TOKENS = 1 << 24  # ids a pass over a whole split reads at a time (32 MiB of uint16)
VOCAB_CHECK_TOKENS = 1_000_000  # ids checked at each end of every shard when a split is opened (training
# checks every batch it loads as well)


def read_meta(root: str | Path) -> dict:
    root = Path(root)
    if not root.is_dir():
        if root.exists():  # a file (or a path under one), not a missing folder
            raise ValueError(f"{root} is not a folder (a dataset folder of `kinterval data prepare`)")
        raise FileNotFoundError(f"dataset directory not found: {root}")
    path = root / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (prepare the dataset with `kinterval data prepare`)")
    try:
        meta = json.loads(path.read_bytes())
    except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: malformed meta.json (a JSON object expected)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
    problem = _meta_problem(meta)
    if problem:
        raise ValueError(f"{path}: malformed meta.json ({problem})")
    return meta


def _meta_problem(meta: dict) -> str | None:
    """What is missing or mistyped in a meta.json (None when the fields the loaders read are fine)."""

    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    # the shards' element type, as the writer records it: the loaders read nothing else
    for key, want in (("dtype", "uint16"), ("byteorder", "little")):
        if meta.get(key) != want:
            return f"{key!r} is {meta.get(key)!r}: shards are read as {DTYPE_TEXT} token ids only"
    for key in ("vocab_size", "eot"):
        if not is_int(meta.get(key)):
            return f"{key!r} must be a non-negative integer, got {meta.get(key)!r}"
    if meta["eot"] >= meta["vocab_size"]:  # an eot no token equals: every split would be one document
        return f"'eot' {meta['eot']} must be below 'vocab_size' {meta['vocab_size']}"
    if not isinstance(meta.get("tokenizer"), dict) or not isinstance(meta["tokenizer"].get("name"), str):
        return "'tokenizer' must be an object with a 'name'"
    if problem := gpt2_ids_problem(meta["tokenizer"]["name"], meta["vocab_size"], meta["eot"]):
        return problem
    if not isinstance(meta.get("splits"), dict):
        return "'splits' must be an object"
    for split, rec in meta["splits"].items():
        if (
            not isinstance(rec, dict)
            or not is_int(rec.get("n_tokens"))
            or not isinstance(rec.get("shards"), list)
        ):
            return f"split {split!r} needs 'n_tokens' and a list of 'shards'"
        for shard in rec["shards"]:
            if not isinstance(shard, dict) or not isinstance(shard.get("file"), str):
                return f"split {split!r}: every shard needs a 'file'"
            if not (is_int(shard.get("n_tokens")) and is_int(shard.get("bytes"))):
                return f"split {split!r}, shard {shard['file']!r}: 'n_tokens' and 'bytes' must be integers"
            if not isinstance(shard.get("sha256"), (str, type(None))):
                return f"split {split!r}, shard {shard['file']!r}: 'sha256' must be a string"
    return None


class ShardedTokens(np.lib.mixins.NDArrayOperatorsMixin):
    """A read-only 1-D view of several token arrays (a split's shard memmaps) as one, end to end.

    Indexing reads only the ids it asks for: an integer gives one id, a slice or an integer array a new
    ndarray (a slice inside one shard: a view of that shard's memmap). ``len``, ``dtype``, ``shape``, ``min``
    and ``max`` work as on an array. ``np.asarray(view)``, numpy functions and operators (``view == eot``)
    work on the whole split read into memory, so leave them to code that needs every id at once."""

    ndim = 1

    def __init__(self, parts: list[np.ndarray]):
        if not parts or any(p.ndim != 1 or p.dtype != parts[0].dtype or p.size == 0 for p in parts):
            raise ValueError("ShardedTokens takes one or more non-empty 1-D arrays of one dtype")
        self.parts = parts
        self.dtype = parts[0].dtype
        self.starts = np.cumsum([0] + [p.size for p in parts])  # part j holds ids starts[j] .. starts[j+1]-1
        self.size = int(self.starts[-1])
        self.shape = (self.size,)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.size)
            if step != 1:
                return self[np.arange(start, stop, step)]
            pieces = [
                p[max(start - a, 0) : min(stop - a, p.size)]
                for p, a in zip(self.parts, self.starts[:-1].tolist())
                if a < stop and a + p.size > start
            ]
            return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else self.parts[0][:0]
        if isinstance(key, tuple):  # a 1-D array takes one index: (i,) is i, (i, j) is too many
            if len(key) != 1:
                raise IndexError(f"too many indices for a 1-D token view: {len(key)} were given")
            return self[key[0]]
        if isinstance(key, (bool, np.bool_)):
            raise IndexError("a token view takes integers, slices and integer arrays, got bool")
        index = np.asarray(key)
        if not np.issubdtype(index.dtype, np.integer):
            raise IndexError(f"a token view takes integers, slices and integer arrays, got {index.dtype}")
        if index.size and (
            index.max() >= self.size or (index.dtype.kind == "i" and index.min() < -self.size)
        ):
            raise IndexError(f"index out of range for {self.size} tokens")
        index = index.astype(np.int64)  # any integer dtype: int8 + size or uint64 - start would not fit
        index[index < 0] += self.size
        part = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty(index.shape, self.dtype)
        for j in np.flatnonzero(np.bincount(part.ravel(), minlength=len(self.parts))).tolist():
            at = part == j
            out[at] = self.parts[j][index[at] - self.starts[j]]
        return out[()] if out.ndim == 0 else out  # an integer (or 0-d array) index: one id, as numpy gives

    def min(self, axis=None, out=None, **kwargs):  # np.min(view) calls view.min(axis=None, out=None)
        if axis is None and out is None and not kwargs:
            return min(p.min() for p in self.parts)
        return np.asarray(self).min(axis=axis, out=out, **kwargs)

    def max(self, axis=None, out=None, **kwargs):
        if axis is None and out is None and not kwargs:
            return max(p.max() for p in self.parts)
        return np.asarray(self).max(axis=axis, out=out, **kwargs)

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a view of several shards cannot become an array without a copy")
        whole = np.concatenate(self.parts)
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(np.asarray(x) if isinstance(x, ShardedTokens) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()

    def __repr__(self) -> str:
        return f"ShardedTokens({len(self.parts)} parts, {self.size} tokens, {self.dtype})"


class TokenShards:
    """One split of a prepared dataset (validated against meta.json)."""

    def __init__(self, root: str | Path, split: str, *, verify: bool = False):
        self.root = Path(root)
        self.meta = read_meta(self.root)
        split = SPLIT_ALIASES.get(split, split)
        if split not in self.meta["splits"]:
            available = ", ".join(sorted(self.meta["splits"]))
            raise ValueError(f"{self.root / 'meta.json'}: unknown split {split!r} (available: {available})")
        self.split = split
        self.vocab_size = int(self.meta["vocab_size"])
        self.eot = int(self.meta["eot"])
        info = self.meta["splits"][split]
        self.n_tokens = int(info["n_tokens"])
        self.paths = [
            self.root / s["file"] for s in info["shards"]
        ]  # "file" may be relative to root (import_bin)
        for path, shard in zip(self.paths, info["shards"]):
            self._check_shard(path, shard, verify)
        if sum(s["n_tokens"] for s in info["shards"]) != self.n_tokens:
            raise ValueError(
                f"{self.root / 'meta.json'}: shard token counts do not add up to {self.n_tokens}"
            )
        self._tokens: np.ndarray | None = None

    def _check_shard(self, path: Path, shard: dict, verify: bool) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"shard not found: {path} (listed in {self.root / 'meta.json'})")
        size = path.stat().st_size
        if size != shard["bytes"] or size != shard["n_tokens"] * DTYPE.itemsize:
            said = f"{shard['bytes']} bytes and {shard['n_tokens']} tokens of {DTYPE.itemsize} bytes"
            raise ValueError(f"{path}: {size} bytes, meta.json says {said} (truncated or corrupt shard)")
        if verify and not shard.get("sha256"):
            raise ValueError(f"{path}: meta.json records no sha256 for it, so its bytes cannot be checked "
                             "(`kinterval data prepare` records one for every shard)")  # fmt: skip
        if verify and file_sha256(path) != shard["sha256"]:
            raise ValueError(f"{path}: sha256 does not match meta.json (corrupt shard)")
        if size:  # cheap vocabulary check on both ends of the shard
            ids = np.memmap(path, dtype=DTYPE, mode="r")
            top = max(int(ids[:VOCAB_CHECK_TOKENS].max()), int(ids[-VOCAB_CHECK_TOKENS:].max()))
            if top >= self.vocab_size:
                raise ValueError(f"{path}: token id {top} >= vocab_size {self.vocab_size} (wrong vocabulary)")

    def tokens(self) -> np.ndarray | ShardedTokens:
        """The whole split as 1-D uint16 ids, read from the files as they are indexed: a read-only memmap
        when there is one shard, a :class:`ShardedTokens` view of the shards end to end when there are
        several (nothing is read into memory until indexed)."""
        if self._tokens is None:
            parts = [np.memmap(p, dtype=DTYPE, mode="r") for p in self.paths if p.stat().st_size]
            if len(parts) == 1:
                self._tokens = parts[0]
            else:
                self._tokens = ShardedTokens(parts) if parts else np.zeros(0, dtype=DTYPE)
        return self._tokens

    def locate(self, position: int) -> str:
        """The shard file that holds token ``position`` of the split, and the token's index in that file."""
        index = position
        for path, shard in zip(self.paths, self.meta["splits"][self.split]["shards"]):
            if 0 <= index < shard["n_tokens"]:
                return f"{path} (token {index:,} of that file)"
            index -= shard["n_tokens"]
        raise ValueError(f"token {position} is outside the {self.split} split of {self.n_tokens} tokens")

    def check_vocab(self, model_vocab_size: int) -> None:
        if self.vocab_size > model_vocab_size:
            meta = self.root / "meta.json"
            raise ValueError(
                f"{meta}: data vocab_size {self.vocab_size} > model vocab_size {model_vocab_size}"
            )

    def check_matches(self, state: dict) -> None:
        """Refuse this split when its tokenizer differs from that of the checkpoint's training data.

        ``state`` is the checkpoint's state.json; its ``identity["data.identity"]`` records the training data.
        Compared: ``vocab_size``, and ``eot`` and the tokenizer's name and sha256 where both sides record
        them. The corpus, split, token counts and shard hashes may differ (held-out corpora of one
        tokenizer). A state that records no training data is not checked."""
        trained = (state.get("identity") or {}).get("data.identity") if isinstance(state, dict) else None
        if not isinstance(trained, dict):
            return
        tok = self.meta["tokenizer"]
        ours = {"vocab_size": self.vocab_size, "eot": self.eot, "tokenizer": tok["name"]}
        ours["tokenizer sha256"] = tok.get("sha256")
        theirs = dict(trained)
        if isinstance(trained.get("tokenizer"), dict):
            theirs["tokenizer"] = trained["tokenizer"].get("name")
            theirs["tokenizer sha256"] = trained["tokenizer"].get("sha256")
        differ = [k for k, v in ours.items() if v is not None and theirs.get(k) not in (None, v)]
        if differ:
            got = ", ".join(f"{k} {ours[k]}" for k in differ)
            want = ", ".join(f"{k} {theirs[k]}" for k in differ)
            raise ValueError(
                f"{self.root / 'meta.json'}: {got}, but the checkpoint was trained on data "
                f"({trained.get('source') or 'unnamed source'}) with {want}: evaluate on data prepared with "
                "the training data's tokenizer"
            )

    def n_blocks(self, T: int) -> int:
        return n_blocks(self.n_tokens, T)

    def require_blocks(self, T: int) -> None:
        """Refuse a split without one block of ``T + 1`` tokens, naming the folder and the split."""
        if self.n_blocks(T) == 0:
            raise ValueError(
                f"{self.root}: the {self.split} split holds no block of {T}+1 tokens ({self.n_tokens} "
                "tokens); evaluate another split (--split) or data (--data)"
            )

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        root, split = str(self.root), self.split
        return f"TokenShards({root!r}, {split!r}, n_tokens={self.n_tokens}, vocab={self.vocab_size})"


def n_blocks(n_tokens: int, T: int) -> int:
    """Number of non-overlapping blocks ``x = data[kT:kT+T]``, ``y = data[kT+1:kT+T+1]``."""
    if T < 1:
        raise ValueError(f"block size must be positive, got {T}")
    return max(0, (n_tokens - 1) // T)


def data_passes(tokens: int, n_tokens: int, T: int) -> float:
    """How many passes over a training split of ``n_tokens`` tokens ``tokens`` training tokens make at block
    size ``T``: one pass is every window of :class:`SequenceSampler` once (``n_blocks(n_tokens, T) * T``
    tokens). Above 1 the run sees every training sequence again, in a new order."""
    windows = n_blocks(n_tokens, T)
    if windows == 0:
        raise ValueError(f"{n_tokens} tokens hold no training window of {T}+1 tokens")
    return tokens / (windows * T)


def passes_text(passes: float) -> str:
    """``passes`` with two decimals, or as many more (up to 6) as a count above 1 needs not to read "1.00"
    (a budget a few tokens over one pass: a note that says it goes over the split more than once)."""
    digits = 2
    while passes > 1 and f"{passes:.{digits}f}" == f"{1:.{digits}f}" and digits < 6:
        digits += 1
    return f"{passes:.{digits}f}"


def first_blocks(n_tokens: int, T: int, blocks: int) -> int:
    """How many of the first ``blocks`` blocks a probe reads (geometry, gradient diagnostics): at most the
    split's; a split without one full block is refused (every per-block average would be NaN)."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks must be a positive integer, got {blocks!r}")
    n = min(blocks, n_blocks(n_tokens, T))
    if n == 0:
        raise ValueError(f"the split holds no block of {T}+1 tokens ({n_tokens} tokens)")
    return n


def check_tokens(tokens, vocab_size: int | None = None, stop: int | None = None) -> None:
    """``tokens`` is a 1-D numpy array (or :class:`ShardedTokens` view) of integer token ids (no float ids
    silently truncated); with ``vocab_size`` every id of ``tokens[:stop]`` is also in ``[0, vocab_size)``.
    The dtype check costs nothing; the id range is one pass, in chunks of ``CHUNK_TOKENS`` ids (a view of
    several shards is never copied whole), so check an array once, not per block."""
    dtype = tokens.dtype if isinstance(tokens, (np.ndarray, ShardedTokens)) else None
    if dtype is None or tokens.ndim != 1 or not np.issubdtype(dtype, np.integer):
        got = f"{dtype} array of shape {tokens.shape}" if dtype is not None else type(tokens).__name__
        raise ValueError(f"tokens must be a 1-D numpy array of integer token ids, got {got}")
    stop = len(tokens) if stop is None else min(stop, len(tokens))
    if vocab_size is None or stop <= 0:
        return
    for start in range(0, stop, CHUNK_TOKENS):
        chunk = tokens[start : min(start + CHUNK_TOKENS, stop)]
        lo, hi = int(chunk.min()), int(chunk.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"tokens: id {bad} is outside the model's vocabulary [0, {vocab_size}) "
                "(data prepared with another tokenizer?)"
            )


def count_id(tokens, token_id: int, start: int = 0, stop: int | None = None) -> int:
    """How many ids of ``tokens[start:stop]`` equal ``token_id``, read in chunks of ``CHUNK_TOKENS`` ids."""
    stop = len(tokens) if stop is None else min(stop, len(tokens))
    return sum(
        int(np.count_nonzero(tokens[a : min(a + CHUNK_TOKENS, stop)] == token_id))
        for a in range(max(start, 0), stop, CHUNK_TOKENS)
    )


def get_block(tokens: np.ndarray, k: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation block ``k``: x, y int64 of shape (T,)."""
    check_tokens(tokens)  # the dtype and shape only: the id range is the caller's, once per array
    if not 0 <= k < n_blocks(len(tokens), T):
        raise IndexError(f"block {k} out of range: {n_blocks(len(tokens), T)} blocks of {T} tokens")
    buf = torch.from_numpy(np.asarray(tokens[k * T : k * T + T + 1], dtype=np.int64))
    return buf[:-1], buf[1:]


class SequenceSampler:
    """Deterministic training sequence order: sequence #i (global index) -> start offset.

    Epoch e is a seeded permutation (np.random.default_rng([seed, e])) of the non-overlapping windows
    [j*T, j*T+T+1); independent of micro-batch size, accumulation and world size, so a run can be resumed
    from a sequence counter and split across ranks exactly."""

    def __init__(self, n_tokens: int, T: int, seed: int):
        self.n_windows = n_blocks(n_tokens, T)
        if self.n_windows == 0:
            raise ValueError(f"{n_tokens} tokens hold no training window of {T}+1 tokens")
        self.n_tokens, self.T, self.seed = n_tokens, T, seed
        self._cache: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) >= 2:  # runs move forward: keep only the newest epochs
                self._cache.pop(min(self._cache))
            self._cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
        return self._cache[epoch]

    def epoch(self, i: int) -> int:
        return i // self.n_windows

    def offsets(self, start: int, count: int) -> np.ndarray:
        """int64 start offsets of sequences ``start .. start+count-1``."""
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got {start}, {count}")
        index = np.arange(start, start + count, dtype=np.int64)
        out = np.empty(count, dtype=np.int64)
        for e in np.unique(index // self.n_windows).tolist():
            mask = index // self.n_windows == e
            out[mask] = self.permutation(e)[index[mask] % self.n_windows] * self.T
        return out


def load_batch(
    tokens: np.ndarray,
    offsets: np.ndarray,
    T: int,
    vocab_size: int | None = None,
    locate: Callable[[int], str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences at ``offsets``: x = tokens[o:o+T], y = tokens[o+1:o+T+1]; int64 tensors of shape (n, T).

    With ``vocab_size`` the ids of the batch are checked against it here, on the host: opening a split checks
    only both ends of each shard, and on CUDA an id in the padding rows of the embedding would train silently.
    ``locate`` (``TokenShards.locate``) names the file of a bad id.
    """
    check_tokens(tokens)  # the dtype and shape only
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.size and (offsets.min() < 0 or offsets.max() + T + 1 > len(tokens)):
        raise ValueError(f"offsets out of range for {len(tokens)} tokens with T={T}")
    ids = np.empty((offsets.size, T + 1), dtype=tokens.dtype)
    for row, o in enumerate(offsets.tolist()):  # one contiguous read a sequence (a gather is 5x slower)
        ids[row] = tokens[o : o + T + 1]
    if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
        row, col = np.unravel_index(int(np.argmax(ids)), ids.shape)
        position = int(offsets[row]) + int(col)
        where = locate(position) if locate else f"token {position:,} of the split"
        raise ValueError(
            f"token id {int(ids.max())} >= vocab_size {vocab_size} at {where} "
            "(a corrupt shard, or data of another vocabulary: `data.verify = true` checks the shard hashes)"
        )
    buf = torch.from_numpy(ids.astype(np.int64))
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def decode_tokens(ids, meta: dict, bpe_file: str | Path | None = None) -> str:
    """Text (GPT-2 data) or a readable rendering (synthetic data) of token ids."""
    if meta["tokenizer"]["name"] == "synthetic":
        from kinterval.data.synthetic import describe

        return describe(ids)
    from kinterval.data.tokenizer import gpt2_encoding

    return gpt2_encoding(bpe_file).decode([int(t) for t in np.asarray(ids).ravel()])
