"""Every bad input gives a clear error that names the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinterval.data import TokenShards, import_bin, prepare


@pytest.fixture()
def ds(tmp_path):
    out = tmp_path / "ds"
    prepare("synthetic", out, tokens=20_000, seed=0, progress=False)
    return out


def test_missing_dir_and_meta(tmp_path, ds):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        TokenShards(tmp_path / "nowhere", "train")
    (ds / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"ds/meta\.json"):
        TokenShards(ds, "train")


def test_missing_shard(ds):
    (ds / "val_0000.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"val_0000\.bin"):
        TokenShards(ds, "val")
    TokenShards(ds, "train")  # other splits still open


def test_truncated_shard(ds):
    path = ds / "train_0000.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"train_0000\.bin.*truncated"):
        TokenShards(ds, "train")


def test_corrupted_shard_caught_by_verify(ds):
    path = ds / "train_0000.bin"
    ids = np.fromfile(path, dtype="<u2")
    ids[:10] = ids[:10][::-1].copy()  # same size, ids still in vocabulary
    ids.tofile(path)
    TokenShards(ds, "train")  # size and vocabulary checks pass
    with pytest.raises(ValueError, match=r"train_0000\.bin.*sha256"):
        TokenShards(ds, "train", verify=True)


def test_wrong_vocabulary_in_shard(ds):
    meta = json.loads((ds / "meta.json").read_text())
    meta["vocab_size"] = 300  # the synthetic ids go up to 511
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"train_0000\.bin.*wrong vocabulary"):
        TokenShards(ds, "train")


def test_vocab_too_large_for_model(ds):
    shards = TokenShards(ds, "train")
    with pytest.raises(ValueError, match=r"meta\.json.*512 > model vocab_size 256"):
        shards.check_vocab(256)


def test_unknown_split_lists_available(ds):
    with pytest.raises(ValueError, match=r"meta\.json.*'dev'.*test, train, val"):
        TokenShards(ds, "dev")


def test_bad_format_version(ds):
    meta = json.loads((ds / "meta.json").read_text())
    meta["format_version"] = 99
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"meta\.json.*format_version"):
        TokenShards(ds, "train")


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match="unknown source 'c4'"):
        prepare("c4", tmp_path / "x", progress=False)
    with pytest.raises(FileNotFoundError, match="no_such_text"):
        prepare(f"text:{tmp_path / 'no_such_text'}", tmp_path / "x", progress=False)
    with pytest.raises(FileNotFoundError, match="no_such_bins"):
        prepare(f"bin:{tmp_path / 'no_such_bins'}", tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="unknown split"):
        prepare("synthetic", tmp_path / "x", splits=("train", "dev"), progress=False)
    bad = tmp_path / "bad.utf8"
    bad.mkdir()
    (bad / "a.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    with pytest.raises(ValueError, match=r"bad\.utf8/a\.txt: not UTF-8"):
        prepare(f"text:{bad}", tmp_path / "x", progress=False)


def test_bad_bin_files(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match=r"odd\.bin.*uint16"):
        import_bin({"train": odd}, tmp_path / "o", progress=False)
    big = tmp_path / "big.bin"
    np.array([1, 2, 60000], dtype="<u2").tofile(big)
    with pytest.raises(ValueError, match=r"big\.bin.*60000 >= vocab_size 50257"):
        import_bin({"train": big}, tmp_path / "o", progress=False)
    with pytest.raises(FileNotFoundError, match=r"gone\.bin"):
        import_bin({"train": tmp_path / "gone.bin"}, tmp_path / "o", progress=False)


def test_import_refuses_to_overwrite_its_source(tmp_path):
    src = tmp_path / "train_0000.bin"
    np.array([1, 2, 3], dtype="<u2").tofile(src)
    with pytest.raises(ValueError, match=r"train_0000\.bin.*overwrite"):
        import_bin({"train": src}, tmp_path, progress=False)
    assert src.stat().st_size == 6
    other = tmp_path / "corpus.train.bin"  # beside meta.json, referenced in place: fine
    np.array([1, 2, 3], dtype="<u2").tofile(other)
    meta = import_bin({"train": other}, tmp_path, copy=False, progress=False)
    assert meta["splits"]["train"]["shards"][0]["file"] == "corpus.train.bin"
    assert TokenShards(tmp_path, "train", verify=True).tokens().tolist() == [1, 2, 3]
