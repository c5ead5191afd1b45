"""``kinterval report`` includes the probe tables (tab:probeab, tab:probec) of the runs that have
``kinterval probes`` output (``RUN/probes/native``), each run against its same-seed softmax."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from synthetic_results import PROBE_SLOPE, write_probes, write_results

from kinterval import cli
from kinterval import suite as suite_package
from kinterval.eval.probes import in_probeab
from kinterval.report.build import build_report
from kinterval.report.probes import NO_PROBES
from kinterval.suite.gate import RECORD, gate
from kinterval.suite.runner import run_suite
from tiny_suite import tiny_suite

NOT_EVALUATED = ("softmax-s42", "lerp-k16-s7")
DELTA = 0.5  # planted: every sample NLL of the condition = softmax's + 0.5 (probe C: + the slope's share)


@pytest.fixture
def suite(tmp_path):
    root = tmp_path / "ci"
    write_results(root, "ci", lambda r, f: 0.0, n_blocks=16)
    return root


def test_the_report_includes_the_probe_tables_against_the_same_seed_softmax(suite, tmp_path):
    write_probes(suite / "runs" / "softmax-s7", "softmax", 0.0)
    write_probes(suite / "runs" / "lerp-k4-s7", "lerp-k4", DELTA)
    index = build_report([suite], tmp_path / "rep").read_text()
    rep = tmp_path / "rep"
    probes = json.loads((rep / "report.json").read_text())["probes"]
    c = probes["lerp-k4-s7"]
    assert (c["operator"], c["reference_operator"], c["reference"]) == ("lerp-k4", "softmax", "softmax-s7")
    assert (c["run"], c["reference_run"]) == ("ci/lerp-k4-s7", "ci/softmax-s7")
    ab = [r for r in c["deltas"] if in_probeab(r)]
    assert len(ab) == 5  # probe A nll, gain and acc, probe B nll and acc
    for r in ab:  # the planted delta comes back, within its CI (acc and gain: none planted)
        want = DELTA if r["metric"] == "nll" else 0.0
        assert r["lo"] < want + 1e-9 and want - 1e-9 < r["hi"], r
        assert r["delta"] == pytest.approx(want, abs=1e-9), r
    (slope,) = [r for r in c["slopes"] if r["probe"] == "C"]
    assert slope["lo"] < PROBE_SLOPE - 1e-3 and PROBE_SLOPE + 1e-3 < slope["hi"]
    assert slope["params"] == [32, 64, 128]
    # every other condition of the suite is listed, not run (no probes), never dropped
    runs = json.loads((suite / "manifest.json").read_text())["runs"]
    others = {r["run_id"] for r in runs if r["operator"] != "softmax"} - {"lerp-k4-s7"}
    assert {k for k, v in probes.items() if "not_run" in v} == others
    assert "no probes" in probes["lerp-k4-s42"]["not_run"]
    md = (rep / "probes.md").read_text()
    assert "probes.md" in index and "tab:probeab" in (rep / "probes.tex").read_text()
    line = next(x for x in md.splitlines() if "| A | nll | all | induction |" in x)
    assert line.startswith("| lerp-k4-s7 | softmax-s7 (softmax) |") and "| +0.50" in line
    assert line.endswith("| tab:probeab |")
    assert "| C | nll | slope vs log2 [32, 64, 128] | copy | - | +0.1" in md
    assert "| lerp-k4-s42 | - | - | - | - | - | - | not run |" in md
    # the reference's absolute value (the paper's softmax row) beside each difference
    head = [
        x.strip()
        for x in next(x for x in md.splitlines() if x.startswith("| Condition")).strip("|").split("|")
    ]
    cells = [x.strip() for x in line.strip("|").split("|")]
    ref = next(r for r in ab if (r["probe"], r["metric"]) == ("A", "nll"))
    assert cells[head.index("Reference value")] == f"{ref['reference']:.4f}"


def test_a_condition_whose_control_has_no_probes_or_that_has_no_control_is_not_run(tmp_path):
    """Probes of a run whose softmax has none, of a run whose softmax was never evaluated (no control: the
    ΔNLL pairing's), and of a run never evaluated itself: each listed as not run, with why."""
    root = tmp_path / "ci"
    write_results(root, "ci", lambda r, f: 0.0, n_blocks=16, runs=lambda r: r["run_id"] not in NOT_EVALUATED)
    for run in ("lerp-k4-s7", "lerp-k4-s42", "lerp-k16-s7"):
        write_probes(root / "runs" / run, run.rsplit("-", 1)[0], DELTA, seed=int(run.rsplit("-s", 1)[1]))
    build_report([root], tmp_path / "rep")
    probes = json.loads((tmp_path / "rep" / "report.json").read_text())["probes"]
    assert probes["lerp-k4-s7"]["not_run"].startswith("its control softmax-s7 has no probes")
    assert probes["lerp-k4-s42"]["not_run"] == "no same-seed softmax control"
    assert probes["lerp-k16-s7"]["not_run"] == "not evaluated"
    # no control and no probes of its own: what it lacks first is probes
    assert probes["lerp-k16-s42"]["not_run"] == NO_PROBES
    assert all("not_run" in v for v in probes.values())


def test_probe_c_rows_at_each_copied_length_are_in_tab_probec(suite, tmp_path):
    """Probe C's difference at each copied length L stands in tab:probec beside its slope, one row a
    (metric, L, sample) of report.json's deltas."""
    write_probes(suite / "runs" / "softmax-s7", "softmax", 0.0)
    write_probes(suite / "runs" / "lerp-k4-s7", "lerp-k4", DELTA)
    build_report([suite], tmp_path / "rep")
    c = json.loads((tmp_path / "rep" / "report.json").read_text())["probes"]["lerp-k4-s7"]
    want = [r for r in c["deltas"] if r["probe"] == "C"]
    assert {r["param"] for r in want} >= {32, 64, 128}
    md = (tmp_path / "rep" / "probes.md").read_text().splitlines()
    rows = [x for x in md if x.startswith("| lerp-k4-s7 | softmax-s7 (softmax) | C |") and "slope" not in x]
    assert len(rows) == len(want) and all(x.endswith("| tab:probec |") for x in rows)
    for r in want:
        cells = f"| C | {r['metric']} | {r['param']} | {r['condition']} | {r['reference']:.4f} |"
        assert any(cells in x for x in rows), r


def test_two_suites_with_the_same_run_ids_keep_both_probe_conditions(tmp_path):
    """Two folders run the same run ids (ci and a copy at half the tokens under another name): each condition
    is named ``suite/run_id`` and compared with its own suite's softmax, none overwriting the other."""
    text = (Path(suite_package.__file__).parent / "suites" / "ci.toml").read_text()
    text = text.replace('name = "ci"', 'name = "ci2"', 1).replace("= 24_576", "= 12_288", 1)
    (tmp_path / "ci2.toml").write_text(text)
    for folder, suite, delta in (("a", "ci", DELTA), ("b", tmp_path / "ci2.toml", 2 * DELTA)):
        write_results(tmp_path / folder, suite, lambda r, f: 0.0, n_blocks=16, data="../data")
        write_probes(tmp_path / folder / "runs" / "softmax-s7", "softmax", 0.0)
        write_probes(tmp_path / folder / "runs" / "lerp-k4-s7", "lerp-k4", delta)
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "rep")
    probes = json.loads((tmp_path / "rep" / "report.json").read_text())["probes"]
    assert "lerp-k4-s7" not in probes
    for suite, delta in (("ci", DELTA), ("ci2", 2 * DELTA)):
        c = probes[f"{suite}/lerp-k4-s7"]
        assert (c["run"], c["reference"]) == (f"{suite}/lerp-k4-s7", f"{suite}/softmax-s7")
        nll = [r["delta"] for r in c["deltas"] if in_probeab(r) and r["metric"] == "nll"]
        assert nll and nll == pytest.approx([delta] * len(nll), abs=1e-9)


def test_without_probes_the_report_has_no_probe_section(suite, tmp_path):
    index = build_report([suite], tmp_path / "rep").read_text()
    assert not (tmp_path / "rep" / "probes.md").exists() and "probes.md" not in index
    assert "probes" not in json.loads((tmp_path / "rep" / "report.json").read_text())


def test_probes_scored_at_another_batch_size_are_refused_naming_both_folders(suite, tmp_path, capsys):
    write_probes(suite / "runs" / "softmax-s7", "softmax", 0.0)
    write_probes(suite / "runs" / "lerp-k4-s7", "lerp-k4", DELTA, batch_size=8)
    assert cli.main(["report", str(suite), "--out", str(tmp_path / "rep")]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("kinterval report: error: probes of lerp-k4-s7") and "batch_size differs" in err
    assert str(suite / "runs" / "softmax-s7" / "probes" / "native") in err
    assert not (tmp_path / "rep" / "index.md").exists()


def empty_probes(run_dir, operator):
    """The output an older ``kinterval probes`` wrote when no probe fit block size 32: no samples."""
    write_probes(run_dir, operator, 0.0)
    out = run_dir / "probes" / "native"
    (out / "samples.jsonl").write_bytes(b"")
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps(dict(summary, block_size=32, table=[])))


@pytest.mark.parametrize("empty", ["condition", "control"])
def test_probes_without_samples_are_not_run_with_why(suite, tmp_path, empty):
    """An output without samples aborted the report ("holds no samples; rerun kinterval probes", which wrote
    the same empty file again): it is listed not run, with why, as a run without probes is."""
    for run, op in (("softmax-s7", "softmax"), ("lerp-k4-s7", "lerp-k4")):
        if (op == "softmax") == (empty == "control"):
            empty_probes(suite / "runs" / run, op)
        else:
            write_probes(suite / "runs" / run, op, 0.0)
    assert cli.main(["report", str(suite), "--out", str(tmp_path / "rep")]) == 0
    why = json.loads((tmp_path / "rep" / "report.json").read_text())["probes"]["lerp-k4-s7"]["not_run"]
    own = "probes/native/samples.jsonl holds no samples (no probe fit block_size 32)"
    assert why == (own if empty == "condition" else f"its control softmax-s7's {own}")
    assert f"| not run | - | - | {why} |" in (tmp_path / "rep" / "probes.md").read_text()


TINY = tiny_suite(
    """
[[group]]
operators = ["softmax", "lerp-k4"]
""",
    geometry=False,
)


def test_the_gate_signs_off_the_probe_files_and_a_copy_is_held_against_them(tmp_path):
    """A real (tiny) suite with probes: the full gate records their files in gate.json, ``--results-only``
    checks a copy without checkpoints against them (one error for an edited probe file), and the report of
    the copy has the probe table."""
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    res = run_suite(tmp_path / "tiny.toml", out, threads=1, log=lambda *_: None)
    assert set(res.values()) == {"completed"}
    write_probes(out / "runs" / "softmax-s7", "softmax", 0.0)
    write_probes(out / "runs" / "lerp-k4-s7", "lerp-k4", DELTA)
    rep = gate(out)
    assert rep.ok, rep.errors
    files = json.loads((out / RECORD).read_text())["files"]
    for run in ("softmax-s7", "lerp-k4-s7"):
        assert {f"runs/{run}/probes/native/{n}" for n in ("summary.json", "samples.jsonl")} <= set(files)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("checkpoints", "data"))
    assert gate(copy, results_only=True).ok
    build_report([copy], tmp_path / "rep")
    probes = json.loads((tmp_path / "rep" / "report.json").read_text())["probes"]
    assert probes["lerp-k4-s7"]["reference"] == "softmax-s7"
    edits = {
        "summary.json": (b'"batch_size": 1', b'"batch_size": 8'),
        "samples.jsonl": (b'"nll": 1', b'"nll": 2'),
    }
    for name, (was, now) in edits.items():
        edited = tmp_path / f"edited-{name}"
        shutil.copytree(copy, edited)
        path = edited / "runs" / "lerp-k4-s7" / "probes" / "native" / name
        assert was in path.read_bytes()
        path.write_bytes(path.read_bytes().replace(was, now, 1))
        (err,) = gate(edited, results_only=True).errors
        assert f"runs/lerp-k4-s7/probes/native/{name}: differs from the bytes {RECORD} has" in err


@pytest.mark.parametrize(
    ("block", "fit"),
    [(32, "no probe fit block_size 32"), (None, "no probe fit the model"), ("32", "no probe fit the model")],
)
def test_a_samples_file_of_blank_lines_holds_no_samples_and_only_an_integer_block_size_is_named(
    tmp_path, block, fit
):
    """Blank lines are no samples (compare_probes skips them and refuses the file); a block size that is not
    an integer (missing, or of another schema) is not printed as one."""
    from kinterval.report.probes import no_samples

    (tmp_path / "samples.jsonl").write_bytes(b"\n  \n")
    (tmp_path / "summary.json").write_text(json.dumps({"operator": "lerp-k4", "block_size": block}))
    assert no_samples(tmp_path) == f"probes/native/samples.jsonl holds no samples ({fit})"
    (tmp_path / "samples.jsonl").write_bytes(b'\n{"probe": "A"}\n')
    assert no_samples(tmp_path) is None
