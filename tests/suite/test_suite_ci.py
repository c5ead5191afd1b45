"""The ``ci`` suite end to end on a CPU: manifest, training, evaluation, geometry, gate, report; and the
gate's detection of a missing evaluation, a config mismatch and a code identity mismatch."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from kinterval.cli import main
from kinterval.suite.definition import load_suite
from kinterval.suite.gate import gate
from kinterval.suite.manifest import read_manifest
from kinterval.suite.runner import run_suite

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("suite_ci")]  # one worker builds the module fixture


@pytest.fixture(scope="session")  # not "module": a worker that runs another module's test between two of
def ci_dir(tmp_path_factory):  # these tears a module fixture down, and the suite (~65 s) ran twice
    out = tmp_path_factory.mktemp("ci_suite") / "ci"
    t0 = time.perf_counter()
    res = run_suite("ci", out, threads=1, log=lambda *_: None)
    print(f"ci suite wall time {time.perf_counter() - t0:.1f}s")
    assert set(res.values()) == {"completed"}
    return out


def test_manifest_and_gate_green(ci_dir, capsys):
    m = read_manifest(ci_dir)
    assert m["n_runs"] == 15 and m["n_jobs"] == 45
    assert {r["run_id"] for r in m["runs"]} == {r.run_id for r in load_suite("ci").runs}
    assert (ci_dir / "manifest.tsv").read_text().count("\n") == 15 + 2
    assert main(["suite", "gate", str(ci_dir)]) == 0
    assert "15 runs, 45 jobs, 0 errors" in capsys.readouterr().out


def test_rerun_skips_finished_work(ci_dir):
    logs = []
    run_suite("ci", ci_dir, only=["softmax-s7", "fwm-*"], threads=1, log=logs.append)
    done = [x for x in logs if x.startswith(("softmax-s7", "fwm-"))]
    assert len(done) == 5 and all("cached" in x and "(0 new)" in x for x in done)


def test_report_tables_and_figures(ci_dir):
    assert main(["report", str(ci_dir), "--out", str(ci_dir / "report")]) == 0
    rep = ci_dir / "report"
    index = (rep / "index.md").read_text()
    for op in (
        "lerp-k4",
        "lerp-k16",
        "minmax-weight-k4",
        "minmax-prob-k4",
        "fwm-weight-k4",
        "fwm-prob-k4",
        "lerp-k4[range_grad=detach]",
    ):
        assert f"| {op} |" in index
    assert "interaction" in index and "| lerp | 4,16 | 2 |" in index
    for name in (
        "delta.md",
        "delta.tex",
        "factorial.tex",
        "ktrend.md",
        "trajectories.png",
        "geometry.png",
        "detach.png",
        "report.json",
    ):
        assert (rep / name).is_file() and (rep / name).stat().st_size > 0, name
        assert name in index or name == "delta.tex"
    assert "\\toprule" in (rep / "delta.tex").read_text()
    data = json.loads((rep / "report.json").read_text())
    assert len(data["delta"]) == 7


def _copy(ci_dir, tmp_path):
    """A copy of the suite folder; its data folder (``data``, recorded relative to it) comes along."""
    dst = tmp_path / "copy"
    shutil.copytree(ci_dir, dst, ignore=shutil.ignore_patterns("report"))
    return dst


def _state(d, run_id="lerp-k4-s7"):
    ck = sorted((d / "runs" / run_id / "checkpoints").glob("step_*"))[-1]
    return ck, json.loads((ck / "state.json").read_text())


def test_gate_detects_missing_evaluation(ci_dir, tmp_path, capsys):
    d = _copy(ci_dir, tmp_path)
    ev = sorted((d / "runs" / "fwm-prob-k4-s42" / "eval" / "val").glob("step_*.json"))[0]
    ev.unlink()
    rep = gate(d)
    assert len(rep.errors) == 1 and "not evaluated" in rep.errors[0] and "fwm-prob-k4-s42" in rep.errors[0]
    assert main(["suite", "gate", str(d)]) == 1
    assert "15 runs, 45 jobs, 1 errors" in capsys.readouterr().out


def test_gate_detects_config_mismatch(ci_dir, tmp_path):
    d = _copy(ci_dir, tmp_path)
    ck, st = _state(d)
    st["config"]["optim"]["lr"] = 1.0
    (ck / "state.json").write_text(json.dumps(st))
    errs = gate(d).errors
    assert any("config differs" in e and "optim.lr" in e for e in errs)


def test_gate_detects_code_identity_mismatch(ci_dir, tmp_path):
    d = _copy(ci_dir, tmp_path)
    ck, st = _state(d, "softmax-s42")
    st["code"]["ops_sha256"] = "0" * 64
    (ck / "state.json").write_text(json.dumps(st))
    errs = gate(d).errors
    assert any("code identity" in e and "softmax-s42" in e for e in errs)


def test_gate_detects_missing_checkpoint(ci_dir, tmp_path):
    d = _copy(ci_dir, tmp_path)
    ck, _ = _state(d, "minmax-prob-k4-s7")
    shutil.rmtree(ck)
    errs = gate(d).errors
    assert any("checkpoint missing" in e for e in errs)
