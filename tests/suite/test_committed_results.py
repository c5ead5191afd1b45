"""The results folders kept in the repository stay valid: they pass the results-only gate, their reports
regenerate from their files to the same tables, and the endpoint ΔNLL rows equal a direct computation from the
per-block NLL arrays (mean over blocks of condition − same-seed softmax, at the last checkpoint). A change to
the report or the gate that moves a committed number fails here."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from kinterval.report.build import build_report
from kinterval.suite.gate import gate

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if (p / "manifest.json").is_file())
TEXT = (".md", ".tex", ".json")  # the figures' PNG bytes depend on the matplotlib version


def test_there_is_a_committed_results_folder():
    assert {"ci", "mini"} <= {p.name for p in FOLDERS}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_committed_results_pass_the_results_only_gate(folder):
    rep = gate(folder, results_only=True)
    assert rep.errors == [] and rep.jobs > 0, rep.errors


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_a_committed_report_regenerates_from_its_files(folder, tmp_path):
    committed = folder / "report"
    build_report([folder], tmp_path)
    names = sorted(p.name for p in committed.iterdir() if p.suffix in TEXT)
    assert names == sorted(p.name for p in tmp_path.iterdir() if p.suffix in TEXT)
    stale = [n for n in names if not _same_report_file(committed / n, tmp_path / n)]
    assert not stale, (
        f"{folder.name}'s report is stale in {stale}: run `kinterval report docs/results/{folder.name}`"
    )
    # the figures too, by name: a figure index.md links that the build no longer draws is a stale report
    assert sorted(p.name for p in committed.iterdir()) == sorted(p.name for p in tmp_path.iterdir())


def _numbers_differ(a, b, path: str = "") -> str | None:
    """The first path at which two parsed JSON documents differ: structure and every non-float value exactly,
    floats to 1e-9 relative (or 1e-12 absolute near 0)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a.keys() ^ b.keys())}"
        return next((d for k in a if (d := _numbers_differ(a[k], b[k], f"{path}/{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} against {len(b)} items"
        return next(
            (d for i, (x, y) in enumerate(zip(a, b)) if (d := _numbers_differ(x, y, f"{path}[{i}]"))), None
        )
    if isinstance(a, float) and isinstance(b, float):
        same = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
        return None if same else f"{path}: {a!r} against {b!r}"
    return None if type(a) is type(b) and a == b else f"{path}: {a!r} against {b!r}"


def _same_report_file(committed: Path, built: Path) -> bool:
    """The tables (.md, .tex) byte for byte. report.json's numbers to 1e-9 relative: they print every digit,
    and a 2-seed t-interval's last digits move with scipy's t quantile (t.ppf(0.975, 1) is
    12.706204736174694 in scipy 1.17 and 12.706204736432095 in 1.15), while the tables, rounded, do not."""
    if committed.suffix != ".json":
        return committed.read_bytes() == built.read_bytes()
    return _numbers_differ(json.loads(committed.read_text()), json.loads(built.read_text())) is None


def _last_nll(folder: Path, run: dict) -> np.ndarray:
    npz = sorted((folder / run["eval_dir"]).glob("step_*.npz"))[-1]
    with np.load(npz) as z:
        return z["nll"]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_endpoint_delta_equals_the_arrays(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    runs = {(r["operator"], r["seed"]): r for r in manifest["runs"]}

    def refuse(constant):  # strict JSON: NaN / Infinity are Python's extension, other readers refuse them
        raise AssertionError(f"report.json holds {constant}")

    report = json.loads((folder / "report" / "report.json").read_text(), parse_constant=refuse)
    checked = 0
    for row in report["delta"]:
        if row["contrast"] != f"{row['key']['operator']} − softmax" or len(row["seeds"]) != 1:
            continue  # one-seed condition − softmax rows: the paper's endpoint table
        (seed,) = row["seeds"]
        ours = _last_nll(folder, runs[(row["key"]["operator"], seed)])
        soft = _last_nll(folder, runs[("softmax", seed)])
        assert row["est"]["mean"] == pytest.approx(float(np.mean(ours - soft)), rel=1e-12, abs=1e-15)
        assert row["nll"] == pytest.approx(float(ours.mean()), rel=1e-12)
        assert row["est"]["lo"] < row["est"]["mean"] < row["est"]["hi"]
        checked += 1
    assert checked >= 1, f"no one-seed endpoint row in {folder.name}"


def test_a_tampered_copy_fails_the_gate(tmp_path):
    copy = tmp_path / "ci"
    shutil.copytree(RESULTS / "ci", copy)
    ev = sorted(copy.glob("runs/*/eval/val/*.json"))[0]
    d = json.loads(ev.read_text())
    d["mean_nll"] += 0.01
    ev.write_text(json.dumps(d))
    assert len(gate(copy, results_only=True).errors) == 1


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_this_checkout_continues_a_committed_folder(folder, tmp_path):
    """A later sitting (`suite run --skip-gated`, then `suite merge`) compares this checkout's manifest with
    the committed one: a config field added to kinterval since (read at its default) must not be a
    difference, or every later sitting of the suite is refused."""
    from kinterval.suite.definition import load_suite
    from kinterval.suite.manifest import build_manifest, read_manifest
    from kinterval.suite.merge import manifest_differences
    from kinterval.suite.runner import _without_data_dir

    old = read_manifest(folder)
    new = build_manifest(load_suite(old["suite"]), tmp_path, tmp_path / "data", previous=old)
    assert manifest_differences(_without_data_dir(new), _without_data_dir(old)) == []
    raw = json.loads((folder / "manifest.json").read_text())["runs"][0]["config"]
    assert "compile" not in raw  # the case this guards: a manifest older than the `compile` field
