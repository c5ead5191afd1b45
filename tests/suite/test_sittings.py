"""A suite run in sittings (a lent machine's time limit cuts each short): ``suite gate --partial`` signs off
the completed runs, ``suite run --skip-gated`` runs only the rest, ``suite merge`` gathers the sittings into
one results folder that the results-only gate and the report read. Every refusal leaves the results folder as
it was. A tiny real suite (3 runs x 2 checkpoints, CPU, seconds)."""

from __future__ import annotations

import json
import shutil

import pytest
from test_gate import TINY

import kinterval.train.checkpoint as checkpoint
from kinterval.cli import main
from kinterval.data.prepare import prepare
from kinterval.report.build import build_report
from kinterval.suite.gate import RECORD, gate
from kinterval.suite.merge import merge
from kinterval.suite.runner import run_suite

pytestmark = pytest.mark.xdist_group("sittings")  # one worker builds the module fixture

QUIET = {"threads": 1, "log": lambda *_: None}
ALL = ["softmax-s7", "lerp-k4-s7", "lerp-k4-s42"]


def _killed(out, rid):
    """A run cut short by the time limit: a run folder whose status is not ``completed``."""
    (out / "runs" / rid).mkdir(parents=True)
    (out / "runs" / rid / "status.json").write_text(json.dumps({"status": "running"}))
    (out / "runs" / rid / "metrics.jsonl").write_text('{"step": 1}\n')


def _tree(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def sittings(tmp_path_factory):
    root = tmp_path_factory.mktemp("sittings")
    (root / "tiny.toml").write_text(TINY)
    suite = root / "tiny.toml"
    # sitting 1: softmax finished, lerp-k4-s7 was killed by the time limit
    assert run_suite(suite, root / "s1", only=["softmax"], **QUIET) == {"softmax-s7": "completed"}
    _killed(root / "s1", "lerp-k4-s7")
    (root / "s1" / "logs").mkdir()  # as `suite run --gpus` writes them
    for rid in ("softmax-s7", "lerp-k4-s7"):
        (root / "s1" / "logs" / f"{rid}.log").write_text(f"{rid}: trained\n")
    rep1 = gate(root / "s1", partial=True)
    merge(root / "s1", root / "res1")
    # sitting 2: the runs res1 lacks
    res2 = run_suite(suite, root / "s2", skip_gated=root / "res1", **QUIET)
    rep2 = gate(root / "s2", partial=True)
    return root, suite, rep1, res2, rep2


def test_a_partial_gate_signs_off_the_completed_runs(sittings):
    root, _, rep1, _, _ = sittings
    assert rep1.ok and (rep1.runs, rep1.jobs, rep1.not_run) == (1, 2, ["lerp-k4-s7", "lerp-k4-s42"])
    assert "partial: 2 of 3 runs not run" in rep1.summary()
    rec = json.loads((root / "s1" / RECORD).read_text())
    assert rec["partial"] is True and rec["runs"] == ["softmax-s7"]
    assert set(rec["checkpoints"]) == {"softmax-s7/step_000008", "softmax-s7/step_000016"}
    assert not [f for f in rec["files"] if f.startswith("runs/lerp")]  # the killed run is not signed off
    # without --partial the same folder fails: two runs are not complete
    assert len(gate(root / "s1", write_record=False).errors) > 0


def test_skip_gated_runs_only_what_the_results_folder_lacks(sittings):
    _, _, _, res2, rep2 = sittings
    assert res2 == {"lerp-k4-s7": "completed", "lerp-k4-s42": "completed"}
    assert rep2.ok and rep2.not_run == ["softmax-s7"]


def test_merged_sittings_make_one_complete_results_folder(sittings, tmp_path):
    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    rep = gate(res, results_only=True)
    assert rep.ok and rep.not_run == ["lerp-k4-s7", "lerp-k4-s42"], rep.errors
    assert not (res / "runs" / "lerp-k4-s7").exists()
    out = merge(root / "s2", res)
    assert (out.added, out.already, out.not_run) == (["lerp-k4-s7", "lerp-k4-s42"], [], [])
    rep = gate(res, results_only=True)
    assert rep.ok and (rep.runs, rep.jobs, rep.not_run) == (3, 6, []), rep.errors
    rec = json.loads((res / RECORD).read_text())
    assert rec["partial"] is False and rec["runs"] == ALL and len(rec["checkpoints"]) == 6
    assert not list(res.rglob("*.safetensors")) and not (res / "data").exists()
    assert [p.name for p in (res / "logs").iterdir()] == ["softmax-s7.log"]  # not the killed run's
    before = _tree(res)
    again = merge(root / "s2", res)  # merging a sitting twice changes nothing
    assert (again.added, again.already) == ([], ["lerp-k4-s7", "lerp-k4-s42"]) and _tree(res) == before
    build_report([res], tmp_path / "report")  # the report reads a merged folder like any other
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    code = json.loads((res / "manifest.json").read_text())["code"]  # the folder's operator code, as recorded
    assert rep["folders"] == [{"suite": "tiny", "title": "tiny", "runs": 3, "not_run": [], "code": code}]
    # lerp-k4 of sitting 2 paired with the softmax control of sitting 1 (seed 42 has no control)
    assert [(r["contrast"], r["seeds"]) for r in rep["delta"]] == [("lerp-k4 − softmax", [7])], rep["delta"]


def test_a_partial_results_folder_reports_its_missing_runs_as_not_run(sittings, tmp_path, capsys):
    root, *_ = sittings
    assert main(["suite", "gate", str(root / "res1"), "--results-only"]) == 0
    out = capsys.readouterr().out
    assert "not run (2): lerp-k4-s7 lerp-k4-s42" in out
    assert "1 runs, 2 jobs, 0 errors; partial: 2 of 3 runs not run" in out
    index = build_report([root / "res1"], tmp_path / "report").read_text()
    assert "suite tiny (tiny; 1 of 3 runs; not run: lerp-k4-s7, lerp-k4-s42)" in index
    folders = json.loads((tmp_path / "report" / "report.json").read_text())["folders"]
    code = json.loads((root / "res1" / "manifest.json").read_text())["code"]
    assert folders == [
        {"suite": "tiny", "title": "tiny", "runs": 1, "not_run": ["lerp-k4-s7", "lerp-k4-s42"], "code": code}
    ]


def test_results_of_a_run_the_record_does_not_sign_off_are_one_error(sittings, tmp_path):
    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    shutil.copytree(root / "s2" / "runs" / "lerp-k4-s7", res / "runs" / "lerp-k4-s7")
    shutil.rmtree(res / "runs" / "lerp-k4-s7" / "checkpoints")
    errors = gate(res, results_only=True).errors
    assert len(errors) == 1 and errors[0].startswith("runs/lerp-k4-s7: results of run lerp-k4-s7"), errors


def test_a_tampered_sitting_is_refused_and_the_results_folder_is_left_as_it_was(sittings, tmp_path):
    root, *_ = sittings
    res, src = tmp_path / "res", tmp_path / "s2"
    shutil.copytree(root / "res1", res)
    shutil.copytree(root / "s2", src)
    ev = src / "runs" / "lerp-k4-s7" / "eval" / "val" / "step_000016.json"
    d = json.loads(ev.read_text())
    d["mean_nll"] -= 0.01
    ev.write_text(json.dumps(d))
    before = _tree(res)
    with pytest.raises(ValueError, match="SRC .* fails the results-only gate"):
        merge(src, res)
    assert _tree(res) == before and not list(tmp_path.glob(".res.*"))


def test_a_sitting_of_other_operator_code_is_refused(sittings, tmp_path, monkeypatch):
    root, suite, *_ = sittings
    monkeypatch.setattr(checkpoint, "ops_sha256", lambda: "0" * 64)
    with pytest.raises(ValueError, match="run by other operator code"):
        run_suite(suite, tmp_path / "s", skip_gated=root / "res1", **QUIET)
    assert not (tmp_path / "s").exists()  # refused before the folder is made
    run_suite(suite, tmp_path / "s", only=["lerp-k4-s42"], **QUIET)
    assert gate(tmp_path / "s", partial=True).ok
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    before = _tree(res)
    with pytest.raises(ValueError, match=r"differ in .*code\.ops_sha256"):
        merge(tmp_path / "s", res)
    assert _tree(res) == before


def test_a_sitting_of_another_learning_rate_is_refused(sittings, tmp_path):
    """The same suite name and operator code, another optim.lr: not a sitting of the same suite run."""
    root, *_ = sittings
    (tmp_path / "tiny.toml").write_text(TINY.replace("[overrides]", '[overrides]\n"optim.lr" = 1e-3'))
    run_suite(tmp_path / "tiny.toml", tmp_path / "s", only=["lerp-k4-s42"], **QUIET)
    assert gate(tmp_path / "s", partial=True).ok
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    before = _tree(res)
    with pytest.raises(ValueError, match="not sittings of one suite run: their manifests differ in .*runs"):
        merge(tmp_path / "s", res)
    assert _tree(res) == before


def test_sittings_on_other_data_or_with_other_results_are_refused(sittings, tmp_path):
    root, suite, *_ = sittings
    other = tmp_path / "s3"
    prepare("synthetic", other / "data", tokens=20_000, seed=1, progress=False)  # other tokens, same layout
    run_suite(suite, other, data=other / "data", only=["softmax"], **QUIET)
    assert gate(other, partial=True).ok
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)  # softmax-s7 of sitting 1, on the suite's own data
    with pytest.raises(ValueError, match="softmax-s7 is signed off in both .* different results"):
        merge(other, res)
    lerps = tmp_path / "lerps"
    merge(root / "s2", lerps)  # a results folder made by the merge
    assert gate(lerps, results_only=True).not_run == ["softmax-s7"]
    with pytest.raises(ValueError, match="different data"):
        merge(other, lerps)


def test_merge_and_skip_gated_refuse_what_is_not_a_results_folder_of_the_suite(sittings, tmp_path):
    root, suite, *_ = sittings
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty and holds no suite manifest"):
        merge(root / "s2", tmp_path / "junk")
    with pytest.raises(ValueError, match="same folder"):
        merge(root / "res1", root / "res1")
    with pytest.raises(FileNotFoundError):
        run_suite(suite, tmp_path / "s", skip_gated=tmp_path / "nowhere", **QUIET)
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace('name = "tiny"', 'name = "tiny2"'))
    with pytest.raises(ValueError, match="holds suite tiny, not tiny2"):
        run_suite(other, tmp_path / "s", skip_gated=root / "res1", **QUIET)


def test_partial_goes_with_the_full_gate_only(sittings, capsys):
    root, *_ = sittings
    assert main(["suite", "gate", str(root / "res1"), "--results-only", "--partial"]) == 2
    assert "--partial goes with the full gate" in capsys.readouterr().err
    with pytest.raises(ValueError, match="partial goes with the full gate"):
        gate(root / "res1", results_only=True, partial=True)


def test_merge_command_says_what_it_merged_and_what_is_left(sittings, tmp_path, capsys):
    root, *_ = sittings
    assert main(["suite", "merge", str(root / "s1"), str(tmp_path / "res")]) == 0
    out = capsys.readouterr().out
    assert f"merged 1 runs into {tmp_path / 'res'}: softmax-s7" in out
    assert "still lacks 2 runs of the suite: lerp-k4-s7 lerp-k4-s42" in out
    assert main(["suite", "merge", str(root / "s1"), str(tmp_path / "res")]) == 0
    assert "already there, same bytes (1): softmax-s7" in capsys.readouterr().out
    assert main(["suite", "merge", str(tmp_path / "nowhere"), str(tmp_path / "res")]) == 2


def test_a_suite_folder_not_yet_gated_is_refused_with_the_command_that_gates_it(sittings, tmp_path):
    root, *_ = sittings
    src = tmp_path / "s2"
    shutil.copytree(root / "s2", src)
    (src / RECORD).unlink()
    with pytest.raises(ValueError, match=f"no gate.json; .*kinterval suite gate {src} --partial"):
        merge(src, tmp_path / "res")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("cut", ["before the last evaluation's summary", "before the last geometry probe"])
def test_a_run_cut_short_after_training_is_not_run(sittings, tmp_path, cut):
    root, *_ = sittings
    s = tmp_path / "s2"
    shutil.copytree(root / "s2", s)
    (s / RECORD).unlink()
    run = s / "runs" / "lerp-k4-s7"
    sub = "eval/val" if "evaluation" in cut else "diagnostics/geometry"
    (run / sub / "step_000016.json").unlink()  # the npz of an evaluation stays: it is written first
    rep = gate(s, partial=True)
    assert rep.ok and rep.not_run == ["softmax-s7", "lerp-k4-s7"], rep.errors
    assert json.loads((s / RECORD).read_text())["runs"] == ["lerp-k4-s42"]


def test_a_results_folder_without_its_record_is_refused_as_such(sittings, tmp_path):
    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    (res / RECORD).unlink()
    with pytest.raises(
        ValueError, match="DST .*: no gate.json; a results folder is made by `kinterval suite merge`"
    ):
        merge(root / "s2", res)


def test_a_partial_gate_with_no_finished_run_fails_and_signs_off_nothing(sittings, tmp_path):
    root, *_ = sittings
    s = tmp_path / "s1"
    shutil.copytree(root / "s1", s)
    (s / RECORD).unlink()
    (s / "runs" / "softmax-s7" / "status.json").write_text(json.dumps({"status": "running"}))
    rep = gate(s, partial=True)
    assert rep.errors == ["partial gate: no run of the manifest is complete; nothing to sign off"]
    assert rep.not_run == ALL and not (s / RECORD).exists()


def test_a_merge_whose_result_fails_the_gate_leaves_the_results_folder_as_it_was(
    sittings, tmp_path, monkeypatch
):
    """The merge checks its own product: a defect in the record it writes never replaces DST."""
    import kinterval.suite.merge as merge_module

    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    before = _tree(res)
    real = merge_module.write_record
    monkeypatch.setattr(
        merge_module, "write_record", lambda out, m, runs, cks, files: real(out, m, runs, cks, {})
    )
    with pytest.raises(RuntimeError, match="the merged folder fails the results-only gate"):
        merge(root / "s2", res)
    assert _tree(res) == before and not list(tmp_path.glob(".res.*"))


def test_a_merge_killed_between_its_two_renames_loses_no_sitting(sittings, tmp_path, monkeypatch, capsys):
    """DST was renamed aside, then the merged folder failed to take its place: DST was gone, and the next
    merge treated it as new and deleted the earlier sittings' runs."""
    from pathlib import Path

    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    before = _tree(res)
    real = Path.rename

    def killed(self, target):
        if self.name == ".res.merging":
            raise KeyboardInterrupt  # the kill, between the two renames
        return real(self, target)

    monkeypatch.setattr(Path, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        merge(root / "s2", res)
    assert _tree(res) == before  # put back at once
    res.rename(tmp_path / ".res.replaced")  # a harder kill: DST still aside when the next merge starts
    monkeypatch.setattr(Path, "rename", real)
    from kinterval.cli import main

    assert main(["suite", "gate", str(res), "--results-only"]) == 2  # the gate says how to get DST back
    err = capsys.readouterr().err
    assert f"an interrupted `kinterval suite merge` left it as {tmp_path / '.res.replaced'}" in err
    out = merge(root / "s2", res)
    assert out.added == ["lerp-k4-s7", "lerp-k4-s42"] and "runs/softmax-s7/status.json" in _tree(res)
    assert gate(res, results_only=True).ok and not (tmp_path / ".res.replaced").exists()


def test_merge_into_the_working_directory(sittings, tmp_path, monkeypatch, capsys):
    """`kinterval suite merge ../s2 .` ended in a traceback (PosixPath('.') has an empty name)."""
    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    monkeypatch.chdir(res)
    assert main(["suite", "merge", str(root / "s2"), "."]) == 0
    assert gate(res, results_only=True).ok


def test_a_runs_record_is_its_own_not_a_run_whose_id_extends_it():
    """Run ids of seeds 4 and 42 (``lerp-k4-s4``, ``lerp-k4-s42``): the files and checkpoints a record signs
    off for one are its own, not those of every run whose id starts with it (the merge compares and copies
    a run's record by them)."""
    from kinterval.suite.merge import _run_record

    rec = {
        "files": {
            "manifest.json": "m",
            "runs/lerp-k4-s4/status.json": "a",
            "runs/lerp-k4-s4/eval/val/step_000008.json": "b",
            "runs/lerp-k4-s42/status.json": "c",
        },
        "checkpoints": {
            "lerp-k4-s4/step_000008": {"n_blocks": 1},
            "lerp-k4-s42/step_000008": {"n_blocks": 2},
        },
    }
    assert _run_record(rec, "lerp-k4-s4") == (
        {"runs/lerp-k4-s4/status.json": "a", "runs/lerp-k4-s4/eval/val/step_000008.json": "b"},
        {"lerp-k4-s4/step_000008": {"n_blocks": 1}},
    )


def test_each_run_the_partial_record_does_not_sign_off_is_its_own_error(sittings, tmp_path):
    """Results of two runs the record does not sign off: one error for each run (one per subject), each
    naming its run."""
    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    for rid in ("lerp-k4-s7", "lerp-k4-s42"):
        shutil.copytree(
            root / "s2" / "runs" / rid, res / "runs" / rid, ignore=shutil.ignore_patterns("checkpoints")
        )
    errors = gate(res, results_only=True).errors
    assert [e.split(":")[0] for e in errors] == ["runs/lerp-k4-s42", "runs/lerp-k4-s7"], errors


def test_a_record_counts_the_jobs_it_signs_off(sittings, tmp_path):
    """gate.json's n_jobs: the checkpoints of the runs it signs off (2 per run), partial or merged."""
    root, *_ = sittings
    assert json.loads((root / "s1" / RECORD).read_text())["n_jobs"] == 2
    assert json.loads((root / "s2" / RECORD).read_text())["n_jobs"] == 4
    merge(root / "s2", tmp_path / "res")
    merge(root / "s1", tmp_path / "res")
    assert json.loads((tmp_path / "res" / RECORD).read_text())["n_jobs"] == 6


def test_a_partial_gate_reports_a_run_whose_status_is_corrupt(sittings, tmp_path):
    """A run whose status.json does not read (written atomically, so corrupt) is gated and reported, not
    passed over as a run cut short: the partial gate fails and signs off nothing."""
    root, *_ = sittings
    s = tmp_path / "s2"
    shutil.copytree(root / "s2", s)
    (s / RECORD).unlink()
    (s / "runs" / "lerp-k4-s7" / "status.json").write_text("garbage")
    rep = gate(s, partial=True)
    assert rep.not_run == ["softmax-s7"], rep.not_run
    assert any(e.startswith("runs/lerp-k4-s7/status.json: unreadable") for e in rep.errors), rep.errors
    assert not (s / RECORD).exists()


def test_skip_gated_says_what_it_skips():
    """The runs a --skip-gated folder signs off are left out, and the log says how many (and when none is
    left)."""
    from kinterval.suite.runner import skip_signed_off

    m, lines = {"suite": "tiny", "runs": []}, []
    assert skip_signed_off(m, ["a", "b", "c"], "res", m, ["b", "x"], lines.append) == ["a", "c"]
    assert lines == ["--skip-gated res: 1 runs signed off there, not run again"]
    lines.clear()
    assert skip_signed_off(m, ["b"], "res", m, ["b"], lines.append) == []
    assert lines == [
        "--skip-gated res: 1 runs signed off there, not run again",
        "nothing to run: every selected run is signed off in res",
    ]


def test_a_second_merge_into_one_folder_stops_at_once_and_temp_files_stay_out(sittings, tmp_path, capsys):
    """Two merges into one DST built their folders from DST as it was, and the later rename dropped the
    earlier one's runs (both said "merged"). The second now stops at once, naming the first. A temporary file
    a killed write left in a sitting (``.NAME.<pid>.tmp``) is neither signed off by the gate nor merged."""
    from kinterval import atomic

    root, *_ = sittings
    res = tmp_path / "res"
    shutil.copytree(root / "res1", res)
    with atomic.exclusive(tmp_path / ".res.merge.lock", "busy", remove=True):  # a merge in progress
        assert main(["suite", "merge", str(root / "s2"), str(res)]) == 2
    assert "is being merged into by pid" in capsys.readouterr().err
    assert gate(res, results_only=True).not_run == ["lerp-k4-s7", "lerp-k4-s42"]  # left as it was
    s2 = tmp_path / "s2"
    shutil.copytree(root / "s2", s2)
    eval_dir = next((s2 / "runs" / "lerp-k4-s7" / "eval").iterdir())
    (eval_dir / ".step_000002.npz.4242.tmp").write_bytes(b"half")
    assert gate(s2, partial=True).ok
    assert not any(atomic.is_temp(f) for f in json.loads((s2 / RECORD).read_text())["files"])
    merge(s2, res)
    assert not [p for p in res.rglob("*") if atomic.is_temp(p.name)]
    assert not (tmp_path / ".res.merge.lock").exists()


def test_a_second_suite_run_of_one_folder_stops_at_once(sittings, tmp_path, capsys):
    """A second `suite run` of a folder reported the first's run in training as failed (a traceback log the
    merge then copied) and evaluated its finished runs at the same time; it now stops at once."""
    from kinterval import atomic
    from kinterval.suite.runner import SUITE_LOCK

    root, suite, *_ = sittings
    out = tmp_path / "s"
    with atomic.exclusive(out / SUITE_LOCK, "busy", remove=True):
        argv = ["suite", "run", str(suite), "--out", str(out), "--only", "softmax", "--threads", "1"]
        assert main(argv) == 2
    assert "is being run by pid" in capsys.readouterr().err and not (out / "runs").exists()
