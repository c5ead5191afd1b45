from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kinterval.data import tokenizer as tk

SHARED_BPE = Path(__file__).parents[2].parent / "shared/tokenizers/gpt2.tiktoken"

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


@pytest.mark.parametrize("route", ["explicit", "env", "packaged"])
def test_offline_routes_match_tiktoken_gpt2(route, reference_gpt2, monkeypatch):
    if route == "env":
        monkeypatch.setenv(tk.BPE_ENV_VAR, str(SHARED_BPE))
    bpe = SHARED_BPE if route == "explicit" else None
    assert tk.resolve_bpe_file(bpe) == (SHARED_BPE if route != "packaged" else tk.PACKAGED_BPE_FILE)
    enc = tk.gpt2_encoding(bpe)
    assert enc is not reference_gpt2
    assert enc.n_vocab == tk.GPT2_VOCAB and enc.eot_token == tk.EOT
    assert enc.encode(HELLO) == HELLO_IDS
    for text in SAMPLES:
        assert enc.encode_ordinary(text) == reference_gpt2.encode_ordinary(text), text


def test_packaged_copy_and_hash():
    assert tk.PACKAGED_BPE_FILE.is_file()
    assert tk.file_sha256(tk.PACKAGED_BPE_FILE) == tk.GPT2_BPE_SHA256
    assert tk.tokenizer_hash() == tk.tokenizer_hash(SHARED_BPE) == tk.GPT2_BPE_SHA256


def test_bad_bpe_files_are_named(tmp_path, monkeypatch):
    missing = tmp_path / "nope.tiktoken"
    with pytest.raises(FileNotFoundError, match="nope.tiktoken"):
        tk.gpt2_encoding(missing)
    monkeypatch.setenv(tk.BPE_ENV_VAR, str(missing))
    with pytest.raises(FileNotFoundError, match="KINTERVAL_BPE_FILE"):
        tk.gpt2_encoding()
    bad = tmp_path / "bad.tiktoken"
    lines = SHARED_BPE.read_bytes().splitlines(keepends=True)
    bad.write_bytes(b"".join(lines[:-1]))  # one merge short
    with pytest.raises(ValueError, match="bad.tiktoken"):
        tk.gpt2_encoding(bad)


def test_encode_documents_puts_eot_after_each_document():
    enc = tk.gpt2_encoding(SHARED_BPE)
    docs = ["first doc.", "second <|endoftext|> doc", "third"]
    ids = tk.encode_documents(enc, docs)
    assert ids.dtype == np.uint16
    expected = [t for d in docs for t in enc.encode_ordinary(d) + [tk.EOT]]
    assert ids.tolist() == expected
    assert np.count_nonzero(ids == tk.EOT) == 3 and ids[-1] == tk.EOT
