"""tab:graddecomp: the report reads `kinterval graddiag` outputs and tabulates the planted layer means."""

from __future__ import annotations

import json

from synthetic_results import write_graddiag, write_results

from kinterval.eval.graddiag import DECOMP
from kinterval.report.build import build_report


def test_graddiag_outputs_make_the_decomposition_table(tmp_path):
    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0)
    ids = [r["run_id"] for r in m["runs"] if r["operator"] in ("lerp-k4", "softmax")][:3]
    planted = {}

    def mean(r, step):
        if r["run_id"] not in ids or step not in r["checkpoint_steps"][-2:]:
            return None
        i, j = ids.index(r["run_id"]), r["checkpoint_steps"].index(step)
        v = {k: 0.1 * (n + 1) + 0.01 * i + 0.001 * j for n, k in enumerate(DECOMP)}
        planted[(r["run_id"], step)] = dict(
            v, zero_sum_residual=1e-9 * (i + 1), **{"rows_above_1e-3": 0.25 * j}
        )
        return planted[(r["run_id"], step)]

    write_graddiag(tmp_path / "ci", m, mean)
    build_report([tmp_path / "ci"], tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["graddecomp"]
    assert {(r["run_id"], r["step"]) for r in rows} == set(planted) and len(planted) == 6
    for r in rows:
        want = planted[(r["run_id"], r["step"])]
        assert r["terms"] == {k: want[k] for k in DECOMP}
        assert r["zero_sum_residual"] == want["zero_sum_residual"] and r["n_blocks"] == 8
    table = (tmp_path / "out" / "graddecomp.md").read_text()
    assert f"{planted[(rows[0]['run_id'], rows[0]['step'])]['err_max_only']:.3g}" in table


def test_no_graddiag_outputs_no_table(tmp_path):
    write_results(tmp_path / "ci", "ci", lambda r, f: 0.0)
    build_report([tmp_path / "ci"], tmp_path / "out")
    assert not (tmp_path / "out" / "graddecomp.md").exists()
    assert "graddecomp" not in json.loads((tmp_path / "out" / "report.json").read_text())


def test_a_graddiag_output_without_the_residual_is_a_clear_error(tmp_path):
    """An output lacking `zero_sum_residual` names its folder, step and key (ValueError; CLI: one line,
    exit 2), never a KeyError traceback."""
    import subprocess
    import sys

    import pytest

    m = write_results(tmp_path / "ci", "ci", lambda r, f: 0.0, n_blocks=8)
    full = {k: 0.1 for k in DECOMP} | {"zero_sum_residual": 1e-7, "rows_above_1e-3": 0.0}
    older = {k: v for k, v in full.items() if k != "zero_sum_residual"}  # an older graddiag output

    def mean(r, step):
        return None if r["operator"] != "lerp-k4" else full if r["seed"] == 7 else older

    write_graddiag(tmp_path / "ci", m, mean)
    with pytest.raises(ValueError, match=r"graddiag: the output of step \d+ has no 'zero_sum_residual'"):
        build_report([tmp_path / "ci"], tmp_path / "out")
    cmd = [sys.executable, "-m", "kinterval", "report", str(tmp_path / "ci"), "--out", str(tmp_path / "o")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "zero_sum_residual" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
