"""``kinterval data prepare`` wiring: each flag reaches its parameter of ``prepare`` (docs/data.md), with a
recorder in place of the real preparation."""

from kinterval import cli
from kinterval.data import commands


def record(monkeypatch):
    calls = {}

    def prepare(source, out, **kw):
        calls["prepare"] = (source, out, kw)
        return {"source": source, "vocab_size": 512, "eot": 0}

    monkeypatch.setattr(commands, "prepare", prepare)
    monkeypatch.setattr(commands, "summary_table", lambda meta, T: calls.setdefault("T", T) and "table")
    return calls


def test_prepare_passes_each_flag(monkeypatch, tmp_path):
    calls = record(monkeypatch)
    argv = ["data", "prepare", "--source", "bin:some/dir", "--out", str(tmp_path / "o"), "--tokens", "123",
            "--seed", "7", "--bpe-file", "ranks.tiktoken", "--block-size", "64", "--shard-tokens", "1000",
            "--reference", "--quiet", "--split", "val", "--documents", "9", "--hf-config", "c",
            "--hf-split", "validation", "--text-field", "body"]  # fmt: skip
    assert cli.main(argv) == 0
    source, out, kw = calls["prepare"]
    assert (source, str(out)) == ("bin:some/dir", str(tmp_path / "o"))
    assert kw == {"tokens": 123, "seed": 7, "bpe_file": "ranks.tiktoken", "shard_tokens": 1000,
                  "copy": False, "progress": False, "split": "val", "documents": 9, "hf_config": "c",
                  "hf_split": "validation", "text_field": "body"}  # fmt: skip
    assert calls["T"] == 64


def test_prepare_defaults_are_the_documented_ones(monkeypatch, tmp_path):
    """docs/data.md: --block-size 1024 (printed block counts), --shard-tokens 100M, no seed (prepare's
    synthetic default 0), copy, progress,
    the source's own splits, c4's default document count; progress bars on a terminal."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    calls = record(monkeypatch)
    assert cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "o")]) == 0
    _, _, kw = calls["prepare"]
    assert kw == {"tokens": None, "seed": None, "bpe_file": None, "shard_tokens": 100_000_000, "copy": True,
                  "progress": True, "split": None, "documents": None, "hf_config": None, "hf_split": None,
                  "text_field": None}  # fmt: skip
    assert calls["T"] == 1024
    calls = record(monkeypatch)
    assert cli.main(["data", "prepare", "--source", "synthetic", "--out", str(tmp_path / "o"),
                     "--block-size", "1"]) == 0  # fmt: skip
    assert calls["T"] == 1  # the smallest positive block size is accepted
