"""Local sources never touch the network: a socket guard around `kinterval data prepare --source text:`."""

from __future__ import annotations

import socket

import pytest

from kinterval import cli
from kinterval.data import TokenShards


@pytest.fixture()
def no_network(monkeypatch):
    """Every attempt to open a connection is recorded and refused."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test of a local source")

    monkeypatch.setattr(socket.socket, "connect", lambda self, address: refuse(address))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, address: refuse(address))
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


@pytest.mark.parametrize("single_file", [False, True])
def test_prepare_text_makes_no_network_call(tmp_path, no_network, single_file, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"doc{i}.txt").write_text(
            f"Document {i}: a few words of local text.\n\nA second paragraph.\n"
        )
    source = folder / "doc0.txt" if single_file else folder
    out = tmp_path / "prepared"
    assert cli.main(["data", "prepare", "--source", f"text:{source}", "--out", str(out), "--quiet"]) == 0
    assert no_network == []  # datasets swallows the refused connection: the record is what counts
    assert TokenShards(out, "train", verify=True).n_tokens > 0 or TokenShards(out, "val").n_tokens > 0
