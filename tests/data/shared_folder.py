"""The ``shared`` folder beside the clone: cross-checks use it when it is there and skip when it is not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
SHARED_BPE = SHARED / "tokenizers" / "gpt2.tiktoken"


def require_shared(path: Path) -> Path:
    """``path`` in the shared folder; skip when absent (fail under CI, where it is part of the setup)."""
    if not path.exists():
        message = f"cross-check needs {path.name} from the shared folder beside the clone ({path} is absent)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
