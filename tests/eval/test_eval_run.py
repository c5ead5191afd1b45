"""`evaluate_run` on a tiny trained run: full split, resumability, override, documents; tau screen."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kinterval.cli import main
from kinterval.data.loader import TokenShards
from kinterval.data.prepare import prepare
from kinterval.eval.checkpoints import list_checkpoints
from kinterval.eval.evaluate import eval_dir, evaluate_run
from kinterval.eval.tau_screen import Stage, floor_tail, run_stage, stage3_table
from kinterval.train.config import TrainConfig
from kinterval.train.load import load_run
from kinterval.train.loop import train


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evalrun")
    prepare("synthetic", root / "data", tokens=40_000, seed=0, progress=False)
    cfg = TrainConfig.from_toml("tiny-cpu").override(
        {
            "data.dir": str(root / "data"),
            "model.n_embd": 32,
            "model.n_head": 2,
            "model.block_size": 32,
            "schedule.tokens": 2048,
            "schedule.warmup_tokens": 256,
            "schedule.micro_batch": 8,
            "checkpoint.count": 2,
            "log.progress": False,
            "operator.backend": "closed_form",
        }
    )
    train(cfg, root / "run")
    return root


def test_full_split_and_summary(tiny_run):
    rows = evaluate_run(tiny_run / "run")
    shards = TokenShards(tiny_run / "data", "val")
    assert len(rows) == 2 == len(list_checkpoints(tiny_run / "run"))
    for r in rows:
        assert r["n_blocks"] == shards.n_blocks(32) and r["all_blocks"]
        assert r["operator_used"] == r["operator_trained"] == "softmax" and not r["operator_override"]
        assert r["train_code"]["ops_sha256"] == r["eval_code"]["ops_sha256"]
        with np.load(eval_dir(tiny_run / "run") / f"{r['checkpoint']}.npz") as z:
            assert z["nll"].shape == (r["n_blocks"],)
            assert z["nll"].mean() == pytest.approx(r["mean_nll"])


def test_resumable(tiny_run):
    first = evaluate_run(tiny_run / "run")
    js = eval_dir(tiny_run / "run") / f"{first[0]['checkpoint']}.json"
    mtime = js.stat().st_mtime_ns
    again = evaluate_run(tiny_run / "run")
    assert all(r["skipped"] for r in again)
    assert js.stat().st_mtime_ns == mtime
    js.unlink()  # a missing result is redone, the others are kept
    third = evaluate_run(tiny_run / "run")
    assert [r["skipped"] for r in third] == [False, True]


def test_operator_override_is_recorded_separately(tiny_run, capsys):
    assert (
        main(
            [
                "eval",
                "--run",
                str(tiny_run / "run"),
                "--checkpoint",
                "latest",
                "--operator",
                "fwm-prob-k4",
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "override of softmax" in out
    d = eval_dir(tiny_run / "run", operator="fwm-prob-k4")
    summary = json.loads(next(d.glob("step_*.json")).read_text())
    assert summary["operator_override"] is True
    assert summary["operator_used"] == "fwm-prob-k4" and summary["operator_trained"] == "softmax"
    base = json.loads((eval_dir(tiny_run / "run") / f"{summary['checkpoint']}.json").read_text())
    assert base["operator_used"] == "softmax"  # the run's own result is untouched


def test_document_clusters_on_test_split(tiny_run):
    rows = evaluate_run(tiny_run / "run", checkpoint="latest", split="test", doc_clusters=True)
    r = rows[0]
    assert r["split"] == "test" and r["n_documents"] >= 2
    lo, hi = r["doc_cluster_ci95"]
    assert lo <= r["doc_cluster_mean_nll"] <= hi
    with np.load(eval_dir(tiny_run / "run", "test") / f"{r['checkpoint']}.npz") as z:
        # token-weighted document mean equals the block mean (every target belongs to one document)
        assert z["doc_nll"].sum() / z["doc_tokens"].sum() == pytest.approx(r["mean_nll"])


def test_floor_tail_transform():
    s = torch.tensor([[0.0, -1.0, -9.0, -20.0]])
    valid = torch.ones_like(s, dtype=torch.bool)
    assert floor_tail(s, valid, 6.0).tolist() == [[0.0, -1.0, -6.0, -6.0]]


def test_tau_screen_on_softmax_checkpoint(tiny_run, capsys):
    model = load_run(list_checkpoints(tiny_run / "run")[-1], backend="closed_form").model
    tokens = TokenShards(tiny_run / "data", "val").tokens()
    sub = run_stage(model, tokens, Stage("2a", "floor", (4,), (4.0, 8.0), 3))
    assert set(sub.nll) == {"K=4 tau=4", "K=4 tau=8", "softmax"} and sub.per_block["K=4 tau=4"].size == 3
    res = run_stage(model, tokens, Stage("3", "zero", (4, 8), (5.0, 6.0), 12, minmax=True))
    assert "softmax" in res.nll and "K=8 minmax" in res.nll
    md, rows = stage3_table(res, n_resamples=200)
    assert md.count("**") == 2 * 2  # one best tau marked per K
    assert [r["K"] for r in rows] == [4, 8]
    d = res.per_block[f"K=4 tau={res.global_tau():g}"] - res.per_block["softmax"]
    assert rows[0]["delta"] == pytest.approx(d.mean())
    assert (
        main(
            [
                "tau-screen",
                "--run",
                str(tiny_run / "run"),
                "--stages",
                "3",
                "--K",
                "4",
                "--taus",
                "6",
                "--max-blocks",
                "4",
                "--resamples",
                "100",
            ]
        )
        == 0
    )
    assert "tau*=6 - softmax" in capsys.readouterr().out
    out = tiny_run / "run" / "diagnostics" / "tau_screen"
    record = json.loads((out / "stage3.json").read_text())
    with np.load(out / record["per_block"]) as z:
        assert set(z.files) == {"K=4 tau=6", "K=4 minmax", "softmax"} and z["softmax"].size == 4
        d = z["K=4 tau=6"] - z["softmax"]
    assert [c["condition"] for c in record["contrasts"]] == ["K=4 tau=6", "K=4 minmax"]
    assert record["contrasts"][0]["delta"] == pytest.approx(d.mean())
