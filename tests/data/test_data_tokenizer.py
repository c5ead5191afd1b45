from __future__ import annotations

import shutil

import numpy as np
import pytest

from kinterval.data import tokenizer as tk

PACKAGED = tk.PACKAGED_BPE_FILE

HELLO = "Hello world, this is GPT-2."
HELLO_IDS = [15496, 995, 11, 428, 318, 402, 11571, 12, 17, 13]
SAMPLES = [
    HELLO,
    "Ünïcödé — naïve café, 日本語のテキスト, emoji 🚀🧪, Ελληνικά.",
    "tabs\tand   runs of    spaces\n\n\n  indented\r\nline   ",
    "numbers 3.14159, 1,000,000 and 2026-11-22; 0x1F, 1e-9",
    "I'm sure they'll say we've done what you'd've done, isn't it? DON'T",
    "<|endoftext|> stays plain text under encode_ordinary",
    "",
]


def test_reference_route_matches_known_ids(reference_gpt2):
    assert reference_gpt2.encode(HELLO) == HELLO_IDS
    assert reference_gpt2.n_vocab == tk.GPT2_VOCAB


@pytest.fixture()
def ranks_copy(tmp_path):
    """The packaged ranks file copied elsewhere, for the explicit and environment routes."""
    return shutil.copy(PACKAGED, tmp_path / "gpt2.tiktoken")


@pytest.mark.parametrize("route", ["explicit", "env", "packaged"])
def test_offline_routes_resolve_and_encode(route, ranks_copy, monkeypatch):
    if route == "env":
        monkeypatch.setenv(tk.BPE_ENV_VAR, str(ranks_copy))
    bpe = ranks_copy if route == "explicit" else None
    assert tk.resolve_bpe_file(bpe) == (PACKAGED if route == "packaged" else ranks_copy)
    enc = tk.gpt2_encoding(bpe)
    assert enc.n_vocab == tk.GPT2_VOCAB and enc.eot_token == tk.EOT
    assert enc.encode(HELLO) == HELLO_IDS
    packaged = tk.gpt2_encoding()
    for text in SAMPLES:
        assert enc.encode_ordinary(text) == packaged.encode_ordinary(text), text


def test_packaged_route_matches_tiktoken_gpt2(reference_gpt2):
    enc = tk.gpt2_encoding()
    assert enc is not reference_gpt2
    for text in SAMPLES:
        assert enc.encode_ordinary(text) == reference_gpt2.encode_ordinary(text), text


def test_packaged_copy_and_hash(ranks_copy):
    assert PACKAGED.is_file()
    assert tk.file_sha256(PACKAGED) == tk.GPT2_BPE_SHA256
    assert tk.tokenizer_hash() == tk.tokenizer_hash(ranks_copy) == tk.GPT2_BPE_SHA256


def test_bad_bpe_files_are_named(tmp_path, monkeypatch):
    missing = tmp_path / "nope.tiktoken"
    with pytest.raises(FileNotFoundError, match="nope.tiktoken"):
        tk.gpt2_encoding(missing)
    monkeypatch.setenv(tk.BPE_ENV_VAR, str(missing))
    with pytest.raises(FileNotFoundError, match="KINTERVAL_BPE_FILE"):
        tk.gpt2_encoding()
    bad = tmp_path / "bad.tiktoken"
    lines = PACKAGED.read_bytes().splitlines(keepends=True)
    bad.write_bytes(b"".join(lines[:-1]))  # one merge short
    with pytest.raises(ValueError, match="bad.tiktoken"):
        tk.gpt2_encoding(bad)


def test_encode_documents_puts_eot_after_each_document():
    enc = tk.gpt2_encoding()
    docs = ["first doc.", "second <|endoftext|> doc", "third"]
    ids = tk.encode_documents(enc, docs)
    assert ids.dtype == np.uint16
    expected = [t for d in docs for t in enc.encode_ordinary(d) + [tk.EOT]]
    assert ids.tolist() == expected
    assert np.count_nonzero(ids == tk.EOT) == 3 and ids[-1] == tk.EOT


def test_a_ranks_file_corrupted_after_tiktoken_cached_it_is_refused(ranks_copy, tmp_path, monkeypatch):
    """tiktoken's read cache is keyed by the path: without our own sha256 check a good earlier copy of the
    file would hide the corrupted one."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    tk._encoding_from_file.cache_clear()
    assert tk.gpt2_encoding(ranks_copy).encode(HELLO) == HELLO_IDS  # read and cached by tiktoken
    lines = PACKAGED.read_bytes().splitlines(keepends=True)
    ranks_copy.write_bytes(b"".join(lines[:-1]))  # one merge short, same path
    tk._encoding_from_file.cache_clear()
    with pytest.raises(ValueError, match=r"gpt2\.tiktoken: not the GPT-2 ranks file"):
        tk.gpt2_encoding(ranks_copy)
