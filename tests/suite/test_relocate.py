"""A suite folder moved after it ran (``mv OUT OUT2``): its data folder, inside it, moves with it. The
manifest and run configs recorded the data folder's absolute path, so the gate could not count blocks, a
resume refused the old path, and the evaluation cache (keyed by that path) recomputed finished
evaluations."""

from __future__ import annotations

import json
import shutil

import pytest

from kinterval.cli import main
from kinterval.suite.gate import gate
from kinterval.suite.manifest import read_manifest, same_data_dir
from kinterval.suite.runner import run_suite
from tiny_suite import tiny_suite

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("relocate")

TINY = tiny_suite(
    """
[[group]]
name = "lerp"
operators = ["lerp-k4"]
""",
    name="tiny-move",
    tokens=2_048,
)
RUN = "lerp-k4-s7"


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The suite run into ``before/out``, then moved to ``after/out2`` (``before`` is gone)."""
    root = tmp_path_factory.mktemp("relocate")
    (root / "tiny.toml").write_text(TINY)
    assert run_suite(root / "tiny.toml", root / "before" / "out", threads=1, log=lambda *_: None) == {
        RUN: "completed"
    }
    (root / "after").mkdir()
    shutil.move(root / "before" / "out", root / "after" / "out2")
    shutil.rmtree(root / "before")
    return root


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def _last_eval(d):
    return sorted((d / "runs" / RUN / "eval" / "val").glob("step_*.json"))[-1]


def test_the_manifest_records_the_data_folder_inside_the_suite_folder_relative(moved):
    m = read_manifest(moved / "after" / "out2")
    assert m["data_dir"] == "data" and m["runs"][0]["config"]["data"]["dir"] == "data"


def test_a_moved_suite_folder_passes_the_gate(moved, tmp_path, capsys):
    d = _copy(moved / "after" / "out2", tmp_path)
    assert main(["suite", "gate", str(d)]) == 0
    assert "suite tiny-move: 1 runs, 2 jobs, 0 errors" in capsys.readouterr().out


def test_a_moved_suite_folder_resumes_without_recomputing(moved, tmp_path):
    d = _copy(moved / "after" / "out2", tmp_path)
    evals = sorted((d / "runs" / RUN / "eval" / "val").glob("step_*.json"))
    before = {p.name: p.read_bytes() for p in evals}
    logs = []
    assert run_suite(moved / "tiny.toml", d, threads=1, log=logs.append) == {RUN: "completed"}
    assert any(f"{RUN}: cached; 2 checkpoints evaluated (0 new)" in line for line in logs), logs
    assert {p.name: p.read_bytes() for p in evals} == before
    assert sorted(p.name for p in (d / "runs" / RUN / "eval").iterdir()) == ["val"]
    assert read_manifest(d)["data_dir"] == "data"


def test_a_moved_suite_folder_still_reports_tampering(moved, tmp_path):
    d = _copy(moved / "after" / "out2", tmp_path)
    js = _last_eval(d)
    s = json.loads(js.read_text())
    s["mean_nll"] += 0.01
    js.write_text(json.dumps(s, indent=1))
    assert len(gate(d, write_record=False).errors) == 1


def test_evaluated_on_other_data_is_an_error_in_a_moved_folder(moved, tmp_path):
    """Data is told by content: an evaluation of the same data in another folder (its shard hashes the
    suite's) is no error; one whose hashes differ is, wherever its folder was; without recorded hashes the
    folder's path decides."""
    d = _copy(moved / "after" / "out2", tmp_path)
    js = _last_eval(d)
    s = json.loads(js.read_text())
    s["data_dir"] = "/somewhere/else/tokens"
    js.write_text(json.dumps(s, indent=1))
    assert gate(d, write_record=False).errors == []
    s["request"]["shards_sha256"] = ["0" * 64]
    js.write_text(json.dumps(s, indent=1))
    (err,) = gate(d, write_record=False).errors
    assert "1 of 2 evaluations record val shard hashes other than it holds" in err
    del s["request"]["shards_sha256"]
    js.write_text(json.dumps(s, indent=1))
    (err,) = gate(d, write_record=False).errors
    assert "evaluated on data /somewhere/else/tokens" in err


@pytest.mark.parametrize(
    ("recorded", "expected", "same"),
    [
        ("data", "data", True),
        ("/old/place/out/data", "data", True),
        ("/old/place/out/tokens", "data", False),
        ("/old/place/out/sub/data", "sub/data", True),
        ("/old/place/out/other/data", "sub/data", False),  # the whole relative path must match
        ("/data/fineweb", "/data/fineweb", True),
        ("/moved/fineweb", "/data/fineweb", False),
        ("data", "/old/out/data", False),
        ("elsewhere/data", "data", False),  # only an absolute path names the folder where the suite was
        (None, "data", False),
    ],
)
def test_same_data_dir(recorded, expected, same):
    assert same_data_dir(recorded, expected) is same
