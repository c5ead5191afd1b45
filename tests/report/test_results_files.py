"""Loading suite results from files: a run killed mid-write leaves a torn last metrics line."""

from __future__ import annotations

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
