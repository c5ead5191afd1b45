"""I/O failures of ``suite run``, ``suite gate`` and ``suite merge`` (a full disk, a read-only folder): one
error line naming the file, exit status 1, the suite stopped at the first run a full disk fails, no half
written manifest or record, no half merged destination. Injected: no mount, no root."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from kinterval import atomic, cli
from kinterval.suite import runner as R
from kinterval.suite.gate import RECORD
from kinterval.suite.manifest import MANIFEST, MANIFEST_TSV, read_manifest, write_manifest
from kinterval.suite.runner import run_suite
from tiny_suite import tiny_suite

pytestmark = pytest.mark.xdist_group("suite_io")  # one worker builds the module fixture

TWO = """
[[group]]
name = "softmax"
operators = ["softmax"]
[[group]]
name = "lerp"
operators = ["lerp-k4"]
"""


def refused(code: int, path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    """A tiny suite of one run, trained, evaluated and gated (gate.json)."""
    root = tmp_path_factory.mktemp("io_suite")
    (root / "tiny.toml").write_text(tiny_suite('[[group]]\nname = "softmax"\noperators = ["softmax"]\n'))
    res = run_suite(root / "tiny.toml", root / "out", threads=1, log=lambda *_: None)
    assert set(res.values()) == {"completed"}
    assert cli.main(["suite", "gate", str(root / "out")]) == 0
    return root / "out"


def _hidden(folder):
    """Temporary files left behind (an atomic write's ``.NAME.tmp``)."""
    return sorted(p.name for p in folder.rglob("*.tmp"))


def test_a_manifest_write_on_a_full_disk_keeps_the_old_one_and_leaves_nothing(tmp_path, monkeypatch):
    m = {"suite": "s", "code": {}, "runs": [{"run_id": "a", "run_dir": "runs/a"}]}
    write_manifest(tmp_path, m)
    before = {n: (tmp_path / n).read_bytes() for n in (MANIFEST, MANIFEST_TSV)}

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        write_manifest(tmp_path, {**m, "runs": [*m["runs"], {"run_id": "b", "run_dir": "runs/b"}]})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / MANIFEST)
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)


def test_an_unchanged_manifest_is_not_rewritten_so_a_read_only_suite_resumes(tmp_path, monkeypatch):
    m = {"suite": "s", "code": {}, "runs": [{"run_id": "a", "run_dir": "runs/a"}]}
    write_manifest(tmp_path, m)

    def read_only(src, dst):
        raise refused(errno.EROFS, dst)

    monkeypatch.setattr(os, "replace", read_only)
    write_manifest(tmp_path, json.loads(json.dumps(m)))  # the same bytes: nothing written


def test_a_read_only_folder_is_named_by_the_file_not_its_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "gate.json"

    def no_create(path, mode="r", *args, **kwargs):
        raise refused(errno.EROFS, path)

    def no_unlink(self, missing_ok=False):  # a read-only file system refuses even to remove a missing file
        raise refused(errno.EROFS, self)

    monkeypatch.setattr(atomic, "open", no_create, raising=False)
    monkeypatch.setattr(type(tmp_path), "unlink", no_unlink)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "{}\n")
    assert info.value.errno == errno.EROFS and info.value.filename == str(target)


def test_a_full_disk_stops_the_suite_at_the_first_run_with_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "two.toml").write_text(tiny_suite(TWO, name="two"))
    out, calls = tmp_path / "out", []
    ckpt = out / "runs" / "softmax-s7" / "checkpoints" / "model.safetensors"

    def full(out_, rid, **kwargs):
        calls.append(rid)
        raise refused(errno.ENOSPC, ckpt)

    monkeypatch.setattr(R, "run_one", full)
    rc = cli.main(["suite", "run", str(tmp_path / "two.toml"), "--out", str(out), "--threads", "1"])
    std = capsys.readouterr()
    assert rc == 1 and calls == ["softmax-s7"]  # the next run would fail alike: not started
    assert std.err == f"kinterval suite: error: {ckpt}: No space left on device (ENOSPC)\n"
    assert "softmax-s7: stopped by a file system error" in std.out and "run the same command again" in std.out
    assert read_manifest(out)["n_runs"] == 2 and not _hidden(out)


def test_a_failed_run_whose_log_cannot_be_written_is_a_failed_run_and_the_suite_goes_on(
    tmp_path, monkeypatch
):
    (tmp_path / "two.toml").write_text(tiny_suite(TWO, name="two"))
    out, lines = tmp_path / "out", []

    def broken(out_, rid, **kwargs):
        if not (out / "logs").exists():
            (out / "logs").write_text("a file where the logs folder goes\n")
        raise RuntimeError("a kernel error")

    monkeypatch.setattr(R, "run_one", broken)
    res = run_suite(tmp_path / "two.toml", out, threads=1, log=lines.append)
    assert list(res) == ["softmax-s7", "lerp-k4-s7"]
    assert all(v == "failed (RuntimeError: a kernel error)" for v in res.values())
    assert sum("traceback could not be written" in x for x in lines) == 2


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_the_gate_of_a_read_only_folder_prints_its_verdict_and_one_error_line(
    suite_dir, monkeypatch, capsys, code
):
    record = (suite_dir / RECORD).read_bytes()

    def refuse(path, write):
        raise refused(code, path)

    monkeypatch.setattr(atomic, "write_with", refuse)
    rc = cli.main(["suite", "gate", str(suite_dir)])
    std = capsys.readouterr()
    assert rc == 1 and "1 runs, 2 jobs, 0 errors" in std.out and "not recorded" in std.out
    assert (
        std.err
        == f"kinterval suite: error: {suite_dir / RECORD}: {os.strerror(code)} ({errno.errorcode[code]})\n"
    )
    assert (suite_dir / RECORD).read_bytes() == record and not _hidden(suite_dir)
    for only in (["--no-record"], ["--results-only"]):  # they only read
        assert cli.main(["suite", "gate", str(suite_dir), *only]) == 0, capsys.readouterr().out


def test_the_geometry_probe_on_a_full_disk_leaves_no_partial_file_in_the_run(
    suite_dir, tmp_path, monkeypatch
):
    from kinterval.eval.diagnostics import diagnose_run

    run = tmp_path / "run"
    shutil.copytree(suite_dir / "runs" / "softmax-s7", run)
    probes = run / "diagnostics" / "geometry"
    before = sorted(p.name for p in probes.iterdir())
    (probes / before[0]).unlink()  # probed again

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        diagnose_run(run, "geometry", blocks=2, split="val", data=suite_dir / "data", device="cpu")
    assert info.value.filename == str(probes / before[0])
    assert sorted(p.name for p in probes.iterdir()) == before[1:]


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("existing", [False, True])
def test_a_merge_into_a_full_disk_is_one_line_and_leaves_the_destination_as_it_was(
    suite_dir, tmp_path, monkeypatch, capsys, existing
):
    dst = tmp_path / "results"
    if existing:  # a results folder already: the merge copies it first
        assert cli.main(["suite", "merge", str(suite_dir), str(dst)]) == 0
        capsys.readouterr()
    before = _tree(dst) if existing else None
    copied, real = [], shutil.copyfile

    def full(src, dst_, *, follow_symlinks=True):  # as Linux's sendfile fails: the source named first
        copied.append(dst_)
        if len(copied) == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst_))
        return real(src, dst_, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(shutil, "copyfile", full)
    rc = cli.main(["suite", "merge", str(suite_dir), str(dst)])
    err = capsys.readouterr().err
    rel = os.path.relpath(copied[3], tmp_path / ".results.merging")
    assert rc == 1 and err == f"kinterval suite: error: {dst / rel}: No space left on device (ENOSPC)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["results"] if existing else [])
    if existing:
        assert _tree(dst) == before


def test_a_child_run_on_a_full_disk_exits_74_and_gpus_starts_no_more_runs(tmp_path, monkeypatch, capsys):
    """``suite run-one`` (the child of ``--gpus``) exits EX_IOERR on a file system error, with one line;
    ``--gpus`` then starts no more runs (each would fail alike) and lets the running ones finish."""
    ckpt = tmp_path / "out" / "runs" / "a" / "checkpoints" / "model.safetensors"

    def full(*args, **kwargs):
        raise refused(errno.ENOSPC, ckpt)

    monkeypatch.setattr(R, "run_one", full)
    assert cli.main(["suite", "run-one", "--out", str(tmp_path / "out"), "a"]) == R.EXIT_FILE_SYSTEM == 74
    assert capsys.readouterr().err == f"kinterval suite: error: {ckpt}: No space left on device (ENOSPC)\n"

    started, codes = [], {"r1": R.EXIT_FILE_SYSTEM}

    class Child:  # r0 and r1 run side by side (2 GPUs); r1 fails on the full disk; r0 finishes after it
        def __init__(self, cmd, env, stdout, stderr):
            self.args, self.returncode, self.polls = cmd, None, 0
            started.append(cmd[-1])

        def poll(self):
            self.polls += 1
            if self.polls >= (1 if self.args[-1] == "r1" else 3):
                self.returncode = codes.get(self.args[-1], 0)
            return self.returncode

    monkeypatch.setattr(R.subprocess, "Popen", Child)
    monkeypatch.setattr(R.time, "sleep", lambda s: None)
    logs = []
    res = R._run_gpus(tmp_path / "out", ["r0", "r1", "r2", "r3"], 2, logs.append)
    assert started == ["r0", "r1"]
    assert res == {"r0": "completed", "r1": "failed (exit 74)", "r2": R.NOT_STARTED, "r3": R.NOT_STARTED}
    (line,) = [x for x in logs if "file system" in x]
    assert line.startswith("r1: stopped by a file system error") and "2 runs not started" in line
