"""The result folders committed under docs/results/ are what their files say: each passes the results-only
gate, its report regenerates from its files to the same tables, and the endpoint ΔNLL rows equal a direct
computation from the per-block NLL arrays (mean over blocks of condition − same-seed softmax, at the last
checkpoint). A change to the report or the gate that moves a committed number fails here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kinterval import cli
from kinterval.report.build import build_report

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
FOLDERS = sorted(p.parent.name for p in RESULTS.glob("*/manifest.json"))
TEXT = (".md", ".tex", ".json")  # the figures' PNG bytes depend on the matplotlib version


def test_the_committed_folders_are_found():
    assert {"ci", "mini"} <= set(FOLDERS)


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_committed_folder_passes_the_results_only_gate(folder, capsys):
    assert cli.main(["suite", "gate", str(RESULTS / folder), "--results-only"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_committed_report_regenerates_from_its_files(folder, tmp_path):
    committed = RESULTS / folder / "report"
    build_report(RESULTS / folder, tmp_path)
    names = sorted(p.name for p in committed.iterdir() if p.suffix in TEXT)
    assert names == sorted(p.name for p in tmp_path.iterdir() if p.suffix in TEXT)
    stale = [n for n in names if (committed / n).read_bytes() != (tmp_path / n).read_bytes()]
    assert not stale, f"docs/results/{folder}/report is stale: run `kinterval report docs/results/{folder}`"


def _last_nll(folder: Path, run: dict) -> np.ndarray:
    npz = sorted((folder / run["eval_dir"]).glob("step_*.npz"))[-1]
    with np.load(npz) as z:
        return z["nll"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_endpoint_delta_equals_the_arrays(folder):
    root = RESULTS / folder
    manifest = json.loads((root / "manifest.json").read_text())
    runs = {(r["operator"], r["seed"]): r for r in manifest["runs"]}
    report = json.loads((root / "report" / "report.json").read_text())
    checked = 0
    for row in report["delta"]:
        if row["contrast"] != f"{row['key']['operator']} − softmax" or len(row["seeds"]) != 1:
            continue  # one-seed condition − softmax rows: the paper's endpoint table
        (seed,) = row["seeds"]
        ours = _last_nll(root, runs[(row["key"]["operator"], seed)])
        soft = _last_nll(root, runs[("softmax", seed)])
        assert row["est"]["mean"] == pytest.approx(float(np.mean(ours - soft)), rel=1e-12, abs=1e-15)
        assert row["nll"] == pytest.approx(float(ours.mean()), rel=1e-12)
        assert row["est"]["lo"] < row["est"]["mean"] < row["est"]["hi"]
        checked += 1
    assert checked >= 1, f"no one-seed endpoint row in docs/results/{folder}"
