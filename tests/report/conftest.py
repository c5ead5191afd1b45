"""Fixtures shared by the report tests."""

from __future__ import annotations

import pytest

from kinterval.report import figures as F


@pytest.fixture
def figs(monkeypatch):
    """The figures a test draws, kept open (``plt.close`` deferred) so that their axes can be read."""
    kept, close = [], F.plt.close
    monkeypatch.setattr(F.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)
