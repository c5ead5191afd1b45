"""Shared fixtures for the kinterval.data tests (CPU only, offline).

The tokenizer tests run on the GPT-2 ranks file shipped in the package. A few cross-check it against
tiktoken's own ``gpt2`` encoding, built offline from the ``shared`` folder beside the clone when it is there
(``shared/tokenizers``); they skip with a reason when it is not, and fail under ``CI=true``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shared_folder import SHARED_BPE, require_shared


@pytest.fixture(autouse=True)
def _no_bpe_env(monkeypatch):
    # The tests choose the tokenizer route themselves.
    monkeypatch.delenv("KINTERVAL_BPE_FILE", raising=False)


@pytest.fixture(scope="session")
def tiktoken_cache(tmp_path_factory) -> Path:
    """A TIKTOKEN_CACHE_DIR seeded offline by shared/tokenizers/make_tiktoken_cache.py."""
    bpe = require_shared(SHARED_BPE)
    cache = tmp_path_factory.mktemp("tiktoken_cache")
    script = bpe.with_name("make_tiktoken_cache.py")
    subprocess.run([sys.executable, str(script), str(bpe), str(cache)], check=True, capture_output=True)
    return cache


@pytest.fixture()
def reference_gpt2(tiktoken_cache, monkeypatch):
    """tiktoken.get_encoding("gpt2") built from the seeded cache (no network)."""
    import tiktoken

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache))
    return tiktoken.get_encoding("gpt2")
