"""``kinterval.atomic``: what a result file holds (its bytes, its JSON layout, its hash) and what an atomic
write leaves behind on a failure or a Ctrl-C: the old file or the new one, and no temporary file."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from kinterval import atomic


def test_the_temporary_file_is_hidden_beside_its_target_and_gone_after_the_write(tmp_path):
    """No reader's pattern (``step_*.json``, ``*.npz``) may match the file being written."""
    target = tmp_path / "step_000001.json"
    assert atomic.temp_path(target) == tmp_path / f".step_000001.json.{os.getpid()}.tmp"
    seen = []
    atomic.write_with(target, lambda fh: (seen.extend(p.name for p in tmp_path.iterdir()), fh.write(b"x")))
    assert seen == [f".step_000001.json.{os.getpid()}.tmp"] and atomic.is_temp(seen[0])
    assert [p.name for p in tmp_path.iterdir()] == [target.name] and target.read_bytes() == b"x"


def test_the_bytes_are_flushed_before_the_fsync(tmp_path, monkeypatch):
    """fsync syncs what the file descriptor holds: bytes still in Python's buffer would not be on disk."""
    sizes, fsync = [], os.fsync

    def record(fd):
        sizes.append(os.fstat(fd).st_size)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    atomic.write_bytes(tmp_path / "a.bin", b"0123456789")
    assert sizes == [10]


def test_a_ctrl_c_inside_the_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old\n")

    def interrupted(fh):
        fh.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic.write_with(target, interrupted)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_an_error_naming_the_temporary_file_names_the_target(tmp_path, monkeypatch):
    """A folder that refuses the rename (or the temporary file) names the file the command was writing."""
    target = tmp_path / "summary.json"

    def refuse(src, dst):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(src))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "x")
    assert info.value.errno == errno.EACCES and info.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []
    other = tmp_path / "elsewhere.json"  # an error naming another file keeps its name

    def refuse_other(src, dst):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(other))

    monkeypatch.setattr(os, "replace", refuse_other)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "x")
    assert info.value.filename == str(other)


def test_a_target_whose_folder_is_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(
        ValueError, match=r"^--json .*x\.json: a part of this path is a file$"
    ):  # not "no folder"
        atomic.check_target(tmp_path / "afile" / "x.json")
    with pytest.raises(ValueError, match=r"^--json .*x\.json: the folder .*none does not exist$"):
        atomic.check_target(tmp_path / "none" / "x.json")


def test_json_text_and_hashes_are_the_documented_bytes(tmp_path):
    """write_json: indent 1 and a final newline (the committed reports are compared byte for byte); text
    is UTF-8 (ΔNLL); sha256_file hashes the whole file, beyond its first 1 MiB read, as sha256_bytes does."""
    atomic.write_json(tmp_path / "a.json", {"a": [1, 2]})
    assert (tmp_path / "a.json").read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    atomic.write_text(tmp_path / "t.md", "ΔNLL − softmax")
    assert (tmp_path / "t.md").read_bytes() == "ΔNLL − softmax".encode()
    data = os.urandom(1 << 20) + b"tail"
    (tmp_path / "big.bin").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert atomic.sha256_file(tmp_path / "big.bin") == atomic.sha256_bytes(data) == want
    assert atomic.sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def _hold(lock, busy, remove, ready, release):
    """In another process: hold ``lock`` until ``release`` is set."""
    from kinterval import atomic

    with atomic.exclusive(lock, busy, remove=remove):
        ready.set()
        release.wait(60)


@pytest.mark.parametrize("remove", [False, True])
def test_exclusive_refuses_a_second_process_and_frees_the_lock_when_done(tmp_path, remove):
    import multiprocessing

    from kinterval import atomic

    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    lock = tmp_path / "out" / ".x.lock"
    holder = ctx.Process(target=_hold, args=(lock, "{who} holds it", remove, ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(ValueError, match=rf"^pid {holder.pid} on .+ holds it$"):
            with atomic.exclusive(lock, "{who} holds it", remove=remove):
                pass
    finally:
        release.set()
        holder.join(60)
    assert lock.exists() != remove  # removed by its holder when asked
    with atomic.exclusive(lock, "{who} holds it", remove=remove):  # free again
        assert lock.read_text().startswith(f"pid {os.getpid()} ")


def test_data_prepare_and_report_take_their_folders_lock(tmp_path, monkeypatch):
    """Two prepares (or two reports) of one folder shared its staging folder: one's meta.json could end over
    the other's shards. The second one now stops, naming the holder; neither leaves its lock file behind."""
    from kinterval import atomic
    from kinterval.data.prepare import PREPARE_LOCK, prepare
    from kinterval.report import build

    held = []
    real = atomic.exclusive

    def spy(lock, busy, remove=False):
        held.append((Path(lock).name, busy, remove))
        return real(lock, busy, remove)

    monkeypatch.setattr(atomic, "exclusive", spy)
    prepare("synthetic", tmp_path / "data", tokens=20_000, progress=False)
    busy = f"{tmp_path / 'data'} is being prepared by {{who}}: wait for it to finish, or prepare into "
    busy += "another --out"
    assert held == [(PREPARE_LOCK, busy, True)]
    assert not (tmp_path / "data" / PREPARE_LOCK).exists()
    with real(tmp_path / "data" / PREPARE_LOCK, "x"):  # as another process would hold it (a second open file)
        with pytest.raises(ValueError, match="is being prepared by pid"):
            prepare("synthetic", tmp_path / "data", tokens=20_000, progress=False)
    out = tmp_path / "rep"
    with real(out / build.LOCK, "x"):
        with pytest.raises(ValueError, match="is being written by another report"):
            build.demo_report({"softmax": np.zeros(4)}, out)
    assert held[-1][0] == build.LOCK and not (out / build.BUILDING).exists()
    (out / build.LOCK).unlink()
    rng = np.random.default_rng(0)
    build.demo_report({"softmax": rng.random(40), "lerp-k4": rng.random(40)}, out)
    assert (out / "index.md").is_file() and not (out / build.LOCK).exists()


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    """Two processes writing one result (two evaluations of a run at once) wrote through the same
    ``.NAME.tmp``: one truncated the other's, a torn mix could be renamed into place and the other's rename
    failed. Each writer has its own now; the last rename wins, whole."""
    import subprocess
    import sys

    target = tmp_path / "summary.json"
    code = (
        "import sys; from kinterval import atomic\n"
        "for i in range(300): atomic.write_bytes(sys.argv[1], sys.argv[2].encode() * 20000)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target), c]) for c in "ab"]
    assert [p.wait() for p in procs] == [0, 0]
    assert target.read_bytes() in (b"a" * 20000, b"b" * 20000)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_the_next_write_removes_temporary_files_of_killed_writers_only(tmp_path):
    target = tmp_path / "a[1].json"  # a glob character in the name
    dead = subprocess_pid_gone()
    for name in (
        f".a[1].json.{dead}.tmp",
        ".a[1].json.tmp",
        f".a[1].json.{os.getppid()}.tmp",
        f".b.{dead}.tmp",
    ):
        (tmp_path / name).write_bytes(b"half")
    atomic.write_text(target, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".a[1].json.{os.getppid()}.tmp", f".b.{dead}.tmp", "a[1].json"]  # a live writer's, another file's
    )


def subprocess_pid_gone() -> int:
    """The pid of a process that has exited."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_is_temp_names_only_hidden_tmp_files():
    """The gate and the merge pass over exactly the temporary files of writes (and older ``.NAME.tmp``):
    a hidden file or a ``.tmp`` file of the run's own is a result file like any other."""
    assert atomic.is_temp(atomic.temp_path("a/step_000001.json").name) and atomic.is_temp(".x.json.tmp")
    for name in ("notes.tmp", ".hidden", ".x.json", "x.json.1.tmp"):
        assert not atomic.is_temp(name), name


def test_a_writer_of_another_user_counts_as_alive(tmp_path, monkeypatch):
    """``os.kill(pid, 0)`` refuses (EPERM) a process of another user: it is running, and its temporary
    file is kept."""
    (tmp_path / ".a.json.4242.tmp").write_bytes(b"half")
    real_kill = os.kill

    def kill(pid, sig):
        if pid == 4242:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        return real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    atomic.write_text(tmp_path / "a.json", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.json.4242.tmp", "a.json"]


def test_temporary_files_of_other_files_with_a_longer_name_are_kept(tmp_path):
    """``.a.json.*tmp`` also matches the temporary files of ``a.json.bak`` (older ``.a.json.bak.tmp``) and of
    ``a.json.5.json``: they are not this file's, and the write neither fails on them nor removes them."""
    dead = subprocess_pid_gone()
    others = [".a.json.bak.tmp", f".a.json.5.json.{dead}.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"half")
    atomic.write_text(tmp_path / "a.json", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, "a.json"])


def test_exclusive_refuses_a_lock_file_removed_between_its_open_and_its_lock(tmp_path, monkeypatch):
    """With ``remove``, the last holder removes the lock file: a process that opened it just before holds
    a file no longer at the path once it locks it, so a third process could lock a new one at once. It is
    refused, naming the holder the file names."""
    import fcntl

    lock = tmp_path / ".x.lock"
    lock.write_text("pid 1 on host\n")
    real = fcntl.flock

    def removed_first(fh, op):  # the holder finishes (and removes the file) after this open
        lock.unlink(missing_ok=True)
        return real(fh, op)

    monkeypatch.setattr(fcntl, "flock", removed_first)
    with pytest.raises(ValueError, match=r"^pid 1 on host holds it$"):
        with atomic.exclusive(lock, "{who} holds it", remove=True):
            pass


def test_exclusive_removes_the_folders_it_made_unless_the_caller_wrote_there(tmp_path):
    lock = tmp_path / "a" / "b" / ".x.lock"
    with atomic.exclusive(lock, "busy", remove=True):
        assert lock.is_file()
    assert list(tmp_path.iterdir()) == []
    with atomic.exclusive(lock, "busy", remove=True):
        (lock.parent / "out.txt").write_text("x")
    assert [p.name for p in lock.parent.iterdir()] == ["out.txt"]


def test_exclusive_goes_on_unlocked_on_a_file_system_without_locks(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fh, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = []
    with atomic.exclusive(tmp_path / ".x.lock", "busy", remove=True):
        ran.append(1)
    assert ran == [1] and not (tmp_path / ".x.lock").exists()


def test_exclusive_names_a_holder_that_wrote_nothing_yet_another_process(tmp_path):
    """The holder writes its pid just after it locks: a second process in between reads an empty file."""
    import fcntl

    lock = tmp_path / ".x.lock"
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=r"^another process holds it$"):
            with atomic.exclusive(lock, "{who} holds it"):
                pass
