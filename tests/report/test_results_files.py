"""Loading suite results from files: a run killed mid-write leaves a torn last metrics line; a non-finite
per-block NLL is an error naming its file."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report.results import load_results


def test_a_torn_last_metrics_line_is_left_out(tmp_path):
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, clip=lambda r: 0.1)
    run = m["runs"][0]
    log = tmp_path / "ci" / run["run_dir"] / "metrics.jsonl"
    n = len(log.read_text().splitlines())
    with log.open("a") as f:
        f.write('{"step": 99, "clipped_fr')
    logs = load_results(tmp_path / "ci").logs[run["run_id"]]
    assert len(logs) == n and all(r["clipped_frac"] == 0.1 for r in logs)


def test_a_non_finite_per_block_nll_names_its_file(tmp_path):
    """The old code loaded it and failed later in the bootstrap with "x contains NaN or infinite values"."""
    write_results(tmp_path / "ci", "ci", lambda r, f: 0.0)
    npz = sorted((tmp_path / "ci").glob("runs/*/eval/val/step_*.npz"))[0]
    with np.load(npz) as z:
        nll = z["nll"].copy()
    nll[5] = np.inf
    np.savez(npz, nll=nll)
    with pytest.raises(ValueError, match=rf"{npz}: 'nll' holds a non-finite value \(inf\) at index 5"):
        load_results(tmp_path / "ci")
