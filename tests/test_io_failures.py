"""I/O failures (a full disk, a read-only folder): one error line naming the file, exit status 1, and no
partial file left behind to hold the space or trip a later command."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from safetensors import SafetensorError

from kinterval import atomic, cli
from kinterval.data import writer as W
from kinterval.train import checkpoint as C
from kinterval.train.loop import run_lock

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a flush or close raises it: no file name


def test_an_atomic_write_that_fails_names_its_file_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "step_000001.json"
    target.write_text("old\n")

    def full(fd):
        raise ENOSPC

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "new\n")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_checkpoint_save_on_a_full_disk_keeps_the_last_one_and_no_partial_folder(tmp_path, monkeypatch):
    model = {"w": torch.ones(3)}
    C.save_checkpoint(tmp_path, 1, model, {}, {})
    calls = []

    def full(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return C.__dict__["_real_save_file"](tensors, path, metadata=metadata)

    monkeypatch.setattr(C, "_real_save_file", C.save_file, raising=False)
    monkeypatch.setattr(C, "save_file", full)
    with pytest.raises(OSError) as info:
        C.save_checkpoint(tmp_path, 2, model, {}, {})
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename.endswith("optimizer.safetensors")
    root = C.checkpoint_dir(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_000001"]
    assert C.latest_checkpoint(tmp_path).name == "step_000001"
    assert sorted(p.name for p in (root / "step_000001").iterdir()) == sorted((*C.FILES, "state.json"))


def test_the_run_lock_on_a_full_disk_names_the_lock_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise ENOSPC

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as info, run_lock(tmp_path):
        pass
    assert info.value.filename == str(C.checkpoint_dir(tmp_path) / ".lock")


def test_data_prepare_on_a_full_disk_is_one_line_and_leaves_no_partial_shard(tmp_path, monkeypatch, capsys):
    opened = W.ShardWriter._open

    def open_full(self):
        opened(self)
        real = self._f

        class Full:
            def write(self, blob):
                raise ENOSPC

            def close(self):
                real.close()

        self._f = Full()

    monkeypatch.setattr(W.ShardWriter, "_open", open_full)
    out = tmp_path / "new" / "d"
    rc = cli.main(["data", "prepare", "--source", "synthetic", "--tokens", "20000", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    shard = out / W.STAGING / "train_0000.bin"  # the new shards are written there first
    assert err == f"kinterval data: error: {shard}: No space left on device (ENOSPC)\n"
    assert not (tmp_path / "new").exists()  # no partial shard, no staging folder: the folders made go too


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_folder_is_one_line_with_exit_status_1(tmp_path, monkeypatch, capsys, code):
    def refuse(path, text):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(atomic, "write_text", refuse)
    out = tmp_path / "new" / "d"
    rc = cli.main(["data", "prepare", "--source", "synthetic", "--tokens", "20000", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert err.startswith(f"kinterval data: error: {out / 'meta.json'}: {os.strerror(code)}")
