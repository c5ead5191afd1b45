"""How much of one token split also stands in another: n-gram overlap, e.g. of a validation split with the
training data (GPT-3's contamination check uses 13-grams).

Every window of ``n`` consecutive tokens that holds no end-of-text token (so no window spans two documents)
is hashed to 64 bits (FNV-1a over the token ids). The windows of the checked split are looked up among
those of the other, which is read in chunks, so its size is not bounded by memory. Two different windows
share a hash with probability about 2^-64 each: over a billion-token ``against`` a false match is expected
for about one window in 10^10.

A run that goes over its train split several times can memorize what the validation split shares with it;
this says how much that is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinterval.data.loader import TokenShards, n_blocks

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
CHUNK_TOKENS = 1 << 24  # tokens of ``against`` hashed at a time (about 300 MB of work arrays)


def window_hashes(tokens: np.ndarray, n: int, eot: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hash of every window ``tokens[i:i+n]`` (uint64, one per start ``i``) and whether the window
    holds no ``eot`` (bool). Empty arrays when there are fewer than ``n`` tokens."""
    if n < 1:
        raise ValueError(f"n must be a positive window length, got {n}")
    x = np.asarray(tokens).astype(np.uint64)
    m = x.size - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, bool)
    h = np.full(m, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):  # FNV-1a: xor the next id, multiply by the prime (wrapping mod 2^64)
            h ^= x[i : i + m]
            h *= _FNV_PRIME
    if eot is None:
        return h, np.ones(m, bool)
    ends = np.concatenate([[0], np.cumsum(np.asarray(tokens) == eot)])  # EOTs before each position
    return h, ends[n : n + m] == ends[:m]


def _within(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Whether each entry of ``x`` is in the sorted array ``ref`` (np.isin is ~100x slower here)."""
    if ref.size == 0:
        return np.zeros(x.shape, bool)
    i = np.minimum(np.searchsorted(ref, x), ref.size - 1)
    return ref[i] == x


@dataclass
class Overlap:
    """n-gram overlap of ``tokens`` (the checked split) with ``against``."""

    n: int
    tokens: int  # tokens of the checked split, its end-of-text tokens left out
    windows: int  # its windows of n tokens without an end-of-text token
    found: int  # of those, the windows that also stand in ``against``
    covered: int  # tokens (not end-of-text) inside at least one found window
    against_tokens: int
    doc_coverage: np.ndarray = field(repr=False)  # per document of the checked split: share of tokens covered
    token_covered: np.ndarray = field(repr=False)  # per token of the checked split: inside a found window
    shards_sha256: tuple = ()  # the checked split's shard hashes, as an evaluation records them
    split: str = ""  # the checked split's name in its folder ("val" for "validation")

    def block_coverage(self, T: int) -> np.ndarray:
        """Per evaluation block ``k`` of ``T`` tokens (targets ``kT+1 .. kT+T``, as ``kinterval eval``
        scores them): the share of its targets inside a found window. 0: a block with none ("clean")."""
        k = n_blocks(self.token_covered.size, T)
        return self.token_covered[1 : k * T + 1].reshape(k, T).mean(axis=1)

    @property
    def window_share(self) -> float:
        return self.found / self.windows if self.windows else 0.0

    @property
    def token_share(self) -> float:
        return self.covered / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "tokens": self.tokens,
            "windows": self.windows,
            "found": self.found,
            "window_share": self.window_share,
            "covered": self.covered,
            "token_share": self.token_share,
            "against_tokens": self.against_tokens,
            "documents": int(self.doc_coverage.size),
            "documents_touched": int((self.doc_coverage > 0).sum()),
            "documents_over_half": int((self.doc_coverage > 0.5).sum()),
            "doc_coverage": [round(float(c), 6) for c in self.doc_coverage],
        }


def ngram_overlap(
    tokens: np.ndarray, against: np.ndarray, n: int = 13, eot: int | None = None, chunk: int = CHUNK_TOKENS
) -> Overlap:
    """The windows of ``tokens`` that also stand in ``against`` and the tokens they cover. Documents are
    the runs of tokens each ended by ``eot`` (a last one without it counts too); without ``eot`` the whole
    array is one document."""
    if chunk < n:
        raise ValueError(f"chunk ({chunk}) must be at least n ({n})")
    tokens = np.asarray(tokens)
    h, valid = window_hashes(tokens, n, eot)
    wanted = np.unique(h[valid])
    seen = np.zeros(wanted.size, bool)
    for start in range(0, max(len(against) - n + 1, 0), chunk - n + 1):  # chunks overlap by n - 1 tokens
        ch, cvalid = window_hashes(against[start : start + chunk], n, eot)
        seen |= _within(wanted, np.sort(ch[cvalid]))
    found = valid & _within(h, wanted[seen])
    # tokens inside a found window: +1 where one starts, -1 where it ends
    depth = np.zeros(tokens.size + 1, np.int64)
    starts = np.flatnonzero(found)
    np.add.at(depth, starts, 1)
    np.add.at(depth, starts + n, -1)
    covered = np.cumsum(depth[:-1]) > 0
    text = tokens != eot if eot is not None else np.ones(tokens.size, bool)
    doc = np.cumsum(~text)  # a text token's document: the end-of-text tokens before it
    size = np.bincount(doc[text])
    hit = np.bincount(doc[text & covered], minlength=size.size)
    keep = size > 0  # two end-of-text tokens in a row end no document
    return Overlap(
        n=n,
        tokens=int(text.sum()),
        windows=int(valid.sum()),
        found=int(found.sum()),
        covered=int((covered & text).sum()),
        against_tokens=int(len(against)),
        doc_coverage=hit[keep] / size[keep],
        token_covered=covered,
    )


def split_overlap(
    data: str | Path, split: str = "val", against: str = "train", against_data: str | Path | None = None,
    n: int = 13,
) -> Overlap:  # fmt: skip
    """:func:`ngram_overlap` of a prepared folder's ``split`` with its ``against`` split, or with the
    ``against`` split of ``against_data`` (another folder of the same tokenizer: held-out corpora against a
    training corpus)."""
    # the shards' bytes checked against meta.json, as every evaluation checks them: the result records the
    # split's shard hashes, by which `report --clean-blocks` matches it to evaluations of the same data
    checked = TokenShards(data, split, verify=True)
    other = TokenShards(against_data if against_data is not None else data, against, verify=True)
    if against_data is not None:
        mine, theirs = checked.meta["tokenizer"], other.meta["tokenizer"]
        same = (checked.vocab_size, checked.eot, mine.get("name"), mine.get("sha256")) == (
            other.vocab_size, other.eot, theirs.get("name"), theirs.get("sha256"),
        )  # fmt: skip
        if not same:
            raise ValueError(
                f"{data} and {against_data} were prepared with different tokenizers "
                f"({mine.get('name')}, vocab {checked.vocab_size} vs {theirs.get('name')}, vocab "
                f"{other.vocab_size}): their token ids cannot be compared"
            )
    o = ngram_overlap(checked.tokens(), other.tokens(), n=n, eot=checked.eot)
    o.shards_sha256 = tuple(s.get("sha256") for s in checked.meta["splits"][checked.split]["shards"])
    o.split = checked.split
    return o
