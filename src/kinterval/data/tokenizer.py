"""GPT-2 BPE through tiktoken, with an offline route that never needs the network.

``gpt2_encoding()`` looks for the GPT-2 ranks file (``gpt2.tiktoken``: ``base64(token) rank`` per line) in
this order: an explicit path, ``$KINTERVAL_BPE_FILE``, the copy shipped inside this package, and only then
``tiktoken.get_encoding("gpt2")`` (which downloads unless ``$TIKTOKEN_CACHE_DIR`` is pre-filled). All routes
give the same ids: tiktoken's ``gpt2`` and ``r50k_base`` are one encoding.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str

EOT = 50256  # <|endoftext|>, appended after every document (nanoGPT convention)
GPT2_VOCAB = 50257
GPT2_BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
BPE_ENV_VAR = "KINTERVAL_BPE_FILE"
PACKAGED_BPE_FILE = Path(__file__).with_name("gpt2.tiktoken")


def gpt2_ids_problem(tokenizer_name, vocab_size: int, eot: int) -> str | None:
    """What is wrong with a dataset that says its ids are GPT-2's (None when nothing): another vocabulary size
    or end-of-text id would move every document boundary (--doc-clusters, overlap) without a word."""
    if tokenizer_name == "gpt2" and (vocab_size, eot) != (GPT2_VOCAB, EOT):
        return f"GPT-2 tokens have vocab_size {GPT2_VOCAB} and eot {EOT}, got {vocab_size}, {eot}"
    return None


def resolve_bpe_file(bpe_file: str | Path | None = None) -> Path | None:
    """The ranks file to use, or None when only tiktoken's own registry is left."""
    if bpe_file is not None:
        path, origin = Path(bpe_file), "bpe_file"
    elif os.environ.get(BPE_ENV_VAR):
        path, origin = Path(os.environ[BPE_ENV_VAR]), f"${BPE_ENV_VAR}"
    elif PACKAGED_BPE_FILE.is_file():
        return PACKAGED_BPE_FILE
    else:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"GPT-2 BPE ranks file not found: {path} (from {origin})")
    return path


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def _encoding_from_file(path: str) -> tiktoken.Encoding:
    # Check the file itself: tiktoken's read cache could otherwise hide a corrupted file behind a good copy.
    if file_sha256(path) != GPT2_BPE_SHA256:
        raise ValueError(f"{path}: not the GPT-2 ranks file (sha256 differs from {GPT2_BPE_SHA256})")
    ranks = tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=GPT2_BPE_SHA256)
    return tiktoken.Encoding(
        name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOT}
    )


def gpt2_encoding(bpe_file: str | Path | None = None) -> tiktoken.Encoding:
    """GPT-2 BPE (50257 ids, ``<|endoftext|>`` = 50256); offline unless no ranks file can be found."""
    path = resolve_bpe_file(bpe_file)
    if path is None:
        return tiktoken.get_encoding("gpt2")
    return _encoding_from_file(str(path.resolve()))


def tokenizer_hash(bpe_file: str | Path | None = None) -> str:
    """sha256 of the ranks file in use (tiktoken's registry checks the same hash for ``gpt2``)."""
    path = resolve_bpe_file(bpe_file)
    return GPT2_BPE_SHA256 if path is None else file_sha256(path)


def encode_documents(enc: tiktoken.Encoding, texts: Sequence[str], *, eot: int = EOT) -> np.ndarray:
    """Encode documents (no special tokens inside) and join them, with ``eot`` after each one, as uint16."""
    pieces = []
    for ids in enc.encode_ordinary_batch(list(texts)):
        pieces.append(np.asarray(ids, dtype=np.uint16))
        pieces.append(np.array([eot], dtype=np.uint16))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)
