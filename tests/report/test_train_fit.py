"""The training-fit table (``analysis.train_fit``, ``fit.md``): the logged training loss over the last 10% of
the tokens, condition − same-seed softmax on the same steps, beside the evaluation ΔNLL, on planted logs."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report import analysis as A
from kinterval.report.build import build_report
from kinterval.report.results import load_results

EVAL = {"softmax": 0.0, "lerp-k4": 0.04, "minmax-weight-k4": 0.2}  # planted endpoint ΔNLL (others: 0.1)
TRAIN = {"softmax": 0.0, "lerp-k4": -0.03, "minmax-weight-k4": 0.15}  # planted training-loss Δ (others: 0.1)


def _train_loss(r, step):
    """A falling curve, the batch's difficulty (the same for every run of a seed: one data order) and a
    little noise of the run's own."""
    batch = np.random.default_rng([r["seed"], step]).normal(0, 0.2)
    own = np.random.default_rng([zlib.crc32(r["run_id"].encode()), step]).normal(0, 0.002)
    return 3.0 + 2.0 * np.exp(-step / 10) + TRAIN.get(r["operator"], 0.1) + batch + own


def _fit(tmp_path, **kw):
    write_results(tmp_path / "ci", "ci", lambda r, frac: EVAL.get(r["operator"], 0.1) * frac, **kw)
    res = load_results(tmp_path / "ci")
    return _rows(res), res


def _rows(res, skipped=None) -> dict:
    primary = [p for p in res.points if p.primary]
    logs = {(str(res.dir), run): rows for run, rows in res.logs.items()}  # as build_report keys them
    rows, left_out = A.train_fit(A.softmax_pairs(primary), logs)
    if skipped is not None:
        skipped.update(left_out)
    return {r.key.operator: r for r in rows}


def test_the_training_difference_is_paired_per_step_and_sits_beside_the_evaluation(tmp_path):
    rows, res = _fit(tmp_path, train=_train_loss)
    assert "softmax" not in rows and set(rows) >= {
        "lerp-k4",
        "minmax-weight-k4",
        "lerp-k4[range_grad=detach]",
    }
    for op, r in rows.items():
        # the ci suite: 48 steps of 512 tokens; the last 10% of 24,576 tokens are steps 44..48
        assert r.seeds == ((7,) if "detach" in op else (7, 42)) and r.steps == 5 and r.control == "softmax"
        # the batch term (SD 0.2) cancels in the per-step difference: only the runs' own noise is left
        assert r.d_train.mean == pytest.approx(TRAIN.get(op, 0.1), abs=3e-3)
        assert r.d_train.hi - r.d_train.lo < 0.05
        assert r.d_eval == pytest.approx(EVAL.get(op, 0.1), abs=0.02)
        assert r.d_train.interval == ("block bootstrap" if "detach" in op else "t (1 df)")
    # the gap of each run is its endpoint NLL minus its mean training loss over the window, mean over seeds
    r = rows["minmax-weight-k4"]
    by_run = {(p.run_id, p.step): p.mean for p in res.points if p.primary}
    gaps, control_gaps, train = [], [], []
    for seed in (7, 42):
        own = np.mean(
            [
                _train_loss(
                    {"seed": seed, "run_id": f"minmax-weight-k4-s{seed}", "operator": "minmax-weight-k4"}, s
                )
                for s in range(44, 49)
            ]
        )
        ctrl = np.mean(
            [
                _train_loss({"seed": seed, "run_id": f"softmax-s{seed}", "operator": "softmax"}, s)
                for s in range(44, 49)
            ]
        )
        gaps.append(by_run[f"minmax-weight-k4-s{seed}", 48] - own)
        control_gaps.append(by_run[f"softmax-s{seed}", 48] - ctrl)
        train.append(own)
    assert r.gap == pytest.approx(np.mean(gaps)) and r.control_gap == pytest.approx(np.mean(control_gaps))
    assert r.train == pytest.approx(np.mean(train))


def test_runs_without_two_common_logged_steps_in_the_window_are_left_out(tmp_path):
    rows, _ = _fit(tmp_path)  # no training rows logged at all
    assert rows == {}

    # the lerp-k4 runs log only the final step of the window: one step in common with their control
    rows, res = _fit(tmp_path / "sparse", train=_train_loss)
    for run_id, log in res.logs.items():
        if run_id.startswith("lerp-k4-"):
            log[:] = [x for x in log if x["step"] <= 40 or x["step"] == 48]
    skipped = {}
    rows = _rows(res, skipped)
    assert "lerp-k4" not in rows and "minmax-weight-k4" in rows
    # each left-out pair is named with its reason, none silently dropped
    assert sorted(skipped) == [f"lerp-k4-s{s} vs softmax-s{s}" for s in (42, 7)]
    assert set(skipped.values()) == {
        "1 training step(s) logged by both runs in the last 10% of the tokens; the table needs two"
    }


def test_the_report_writes_the_fit_table(tmp_path):
    write_results(
        tmp_path / "ci", "ci", lambda r, frac: EVAL.get(r["operator"], 0.1) * frac, train=_train_loss
    )
    build_report(tmp_path / "ci", tmp_path / "rep")
    index = (tmp_path / "rep" / "index.md").read_text()
    assert "### Training fit at the endpoint: training loss over the last 10% of the tokens" in index
    table = (tmp_path / "rep" / "fit.md").read_text()
    assert (
        "| minmax-weight-k4 | 24.58k | 7,42 | softmax | 5 |" in table
        and (tmp_path / "rep" / "fit.tex").is_file()
    )
    fit = json.loads((tmp_path / "rep" / "report.json").read_text())["train_fit"]
    row = next(x for x in fit if x["key"]["operator"] == "lerp-k4")
    assert row["d_train"]["mean"] == pytest.approx(-0.03, abs=3e-3) and row["steps"] == 5


def test_rows_whose_loss_or_tokens_are_not_numbers_are_left_out(tmp_path):
    """A loss of true counted as 1.0 (a silent wrong Δ); tokens of null or "abc" were a traceback."""
    rows, res = _fit(tmp_path, train=_train_loss)
    want = rows["lerp-k4"].d_train.mean
    for run_id, log in res.logs.items():
        if run_id.startswith("lerp-k4-"):
            for x in log:
                if "event" not in x and x["step"] == 45:
                    x["train_loss"] = True
                elif "event" not in x and x["step"] in (46, 47):
                    x["tokens"] = None if x["step"] == 46 else "abc"
    r = _rows(res)["lerp-k4"]
    assert r.steps == 2 and r.d_train.mean == pytest.approx(want, abs=3e-3)


def test_the_report_lists_the_pairs_it_leaves_out_of_the_fit_table(tmp_path):
    write_results(
        tmp_path / "ci", "ci", lambda r, frac: EVAL.get(r["operator"], 0.1) * frac, train=_train_loss
    )
    for log in (tmp_path / "ci" / "runs").glob("lerp-k4-s*/metrics.jsonl"):
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        log.write_text("".join(json.dumps(x) + "\n" for x in rows if x["step"] <= 40 or x["step"] == 48))
    build_report(tmp_path / "ci", tmp_path / "rep")
    table = (tmp_path / "rep" / "fit_skipped.md").read_text()
    assert "| lerp-k4-s7 vs softmax-s7 | 1 training step(s) logged by both runs" in table
    assert "| Run vs same-seed control | Why it is skipped |" in table  # the header names the pair
    assert "| lerp-k4 |" not in (tmp_path / "rep" / "fit.md").read_text()
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert sorted(data["train_fit_skipped"]) == ["lerp-k4-s42 vs softmax-s42", "lerp-k4-s7 vs softmax-s7"]


def test_two_folders_of_one_suite_keep_their_own_logs(tmp_path):
    """Two unmerged sittings of one suite: their manifests list every run, each folder holding some. The
    logs were keyed by suite name, so the second folder's (empty for the runs it lacks) replaced the first's:
    the clip and fit rows of the first folder's runs vanished or read the other folder's numbers."""
    first = lambda r: r["seed"] == 7  # noqa: E731
    for name, keep, clip in (("a", first, 0.1), ("b", lambda r: not first(r), 0.3)):
        write_results(tmp_path / name, "ci", lambda r, frac: EVAL.get(r["operator"], 0.1) * frac,
                      runs=keep, clip=lambda r, c=clip: c, train=_train_loss)  # fmt: skip
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    clip = {r["key"]["operator"]: r for r in data["clip_fractions"]}
    assert clip["softmax"]["seeds"] == [7, 42] and clip["softmax"]["per_seed"] == [0.1, 0.3]
    assert {r["key"]["operator"] for r in data["train_fit"]} >= {"lerp-k4", "minmax-weight-k4"}
