"""Shared fixtures for the kinterval.data tests (CPU only, offline)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).parents[2].parent / "shared"
SHARED_BPE = SHARED / "tokenizers/gpt2.tiktoken"


@pytest.fixture(autouse=True)
def _no_bpe_env(monkeypatch):
    # The tests choose the tokenizer route themselves.
    monkeypatch.delenv("KINTERVAL_BPE_FILE", raising=False)


@pytest.fixture(scope="session")
def tiktoken_cache(tmp_path_factory) -> Path:
    """A TIKTOKEN_CACHE_DIR seeded offline by shared/tokenizers/make_tiktoken_cache.py."""
    if not SHARED_BPE.is_file():
        pytest.skip(f"{SHARED_BPE} not available")
    cache = tmp_path_factory.mktemp("tiktoken_cache")
    script = SHARED_BPE.with_name("make_tiktoken_cache.py")
    subprocess.run(
        [sys.executable, str(script), str(SHARED_BPE), str(cache)], check=True, capture_output=True
    )
    return cache


@pytest.fixture()
def reference_gpt2(tiktoken_cache, monkeypatch):
    """tiktoken.get_encoding("gpt2") built from the seeded cache (no network)."""
    import tiktoken

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache))
    return tiktoken.get_encoding("gpt2")
