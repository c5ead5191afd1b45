"""The results folders kept in the repository stay valid: they pass the results-only gate, and the report
regenerates their claims table from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kinterval.report.build import build_report
from kinterval.suite.gate import gate

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if (p / "manifest.json").is_file())


def test_there_is_a_committed_results_folder():
    assert [p.name for p in FOLDERS if p.name == "ci"] == ["ci"]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_committed_results_pass_the_results_only_gate(folder):
    rep = gate(folder, results_only=True)
    assert rep.errors == [] and rep.jobs > 0, rep.errors


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_report_regenerates_the_committed_claims(folder, tmp_path):
    build_report([folder], tmp_path / "report")
    ours = json.loads((tmp_path / "report" / "report.json").read_text())["claims"]
    kept = json.loads((folder / "report" / "report.json").read_text())["claims"]
    assert [(c["claim"], c["ours"]) for c in ours] == [(c["claim"], c["ours"]) for c in kept]


def test_a_tampered_copy_fails_the_gate(tmp_path):
    copy = tmp_path / "ci"
    shutil.copytree(RESULTS / "ci", copy)
    ev = sorted(copy.glob("runs/*/eval/val/*.json"))[0]
    d = json.loads(ev.read_text())
    d["mean_nll"] += 0.01
    ev.write_text(json.dumps(d))
    assert len(gate(copy, results_only=True).errors) == 1
