"""`evaluate_run` on a tiny trained run: full split, resumability, override, documents; tau screen."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kinterval.cli import main
from kinterval.data.loader import TokenShards
from kinterval.data.prepare import prepare
from kinterval.eval.checkpoints import list_checkpoints
from kinterval.eval.evaluate import (
    applied_numerics,
    eval_dir,
    evaluate_checkpoint,
    evaluate_run,
    load_result,
    result_paths,
)
from kinterval.eval.nll import document_ids, per_document
from kinterval.eval.tau_screen import Stage, floor_probs, fwm_spec, run_stage, stage3_table
from kinterval.model import NumericsConfig
from kinterval.ops.reference import reference_probs
from kinterval.stats import block_bootstrap_ci
from kinterval.train import checkpoint as C
from kinterval.train.config import TrainConfig
from kinterval.train.load import load_run
from kinterval.train.loop import train

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("eval_run")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evalrun")
    prepare("synthetic", root / "data", tokens=40_000, seed=0, progress=False)
    train(tiny_config(root / "data"), root / "run")
    return root


def tiny_config(data, overrides: dict | None = None) -> TrainConfig:
    """The tiny run's training config (2,048 tokens, two checkpoints), with ``overrides`` on top."""
    base = {
        "data.dir": str(data),
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
    return TrainConfig.from_toml("tiny-cpu").override({**base, **(overrides or {})})


def test_full_split_and_summary(tiny_run):
    rows = evaluate_run(tiny_run / "run")
    shards = TokenShards(tiny_run / "data", "val")
    assert len(rows) == 2 == len(list_checkpoints(tiny_run / "run"))
    for r in rows:
        assert r["n_blocks"] == shards.n_blocks(32) and r["all_blocks"]
        assert r["operator_used"] == r["operator_trained"] == "softmax" and not r["operator_override"]
        assert r["backend"] == "closed_form"  # what ran the operator: "auto" resolved on the CPU
        assert r["train_code"]["ops_sha256"] == r["eval_code"]["ops_sha256"]
        assert r["device_name"] and r["device"] == "cpu"  # the CPU's model (a second evaluator: tab:strict)
        # the passes over the train split its weights were trained on (the checkpoint's data identity)
        n_train = TokenShards(tiny_run / "data", "train").n_tokens
        assert r["train_passes"] == pytest.approx(r["tokens"] / (n_train - 1 - (n_train - 1) % 32), abs=5e-7)
        # the training data by content (the report tells runs trained on other corpora apart by it)
        train_shards = TokenShards(tiny_run / "data", "train").meta["splits"]["train"]["shards"]
        assert r["train_data"]["shards_sha256"] == [s["sha256"] for s in train_shards]
        assert r["train_data"]["n_tokens"] == n_train and "source" not in r["train_data"]
        with np.load(eval_dir(tiny_run / "run") / f"{r['checkpoint']}.npz") as z:
            assert z["nll"].shape == (r["n_blocks"],)
            assert z["nll"].mean() == pytest.approx(r["mean_nll"])
    for r, ckpt in zip(rows, list_checkpoints(tiny_run / "run")):
        # the checkpoint the result is of, as its state.json records it (the report pairs results by step and
        # tokens), its block size and batch 1
        state = C.read_state(ckpt)
        assert (r["checkpoint"], r["step"], r["tokens"]) == (ckpt.name, state["step"], state["tokens"])
        assert r["checkpoint_files"] == state["files"] and state["files"]
        assert (r["T"], r["batch"]) == (32, 1)


def test_train_passes_need_the_checkpoints_data_identity():
    from kinterval.eval.evaluate import train_passes

    data = {"n_tokens": 1001}
    assert train_passes({"tokens": 2500, "identity": {"data.identity": data}}, 10) == 2.5
    for state in ({"tokens": 2500}, {"tokens": 5, "identity": {"data.identity": {"n_tokens": True}}}):
        assert train_passes(state, 10) is None  # a checkpoint that records no (valid) data identity
    assert train_passes({"tokens": 5, "identity": {"data.identity": {"n_tokens": 10}}}, 10) is None


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


def test_per_block_nll_is_each_blocks_mean_cross_entropy(tiny_run, tmp_path):
    """Block k is x = tokens[kT:kT+T], y = tokens[kT+1:kT+T+1]; its NLL is the mean token cross-entropy,
    recomputed here with the model called directly on those slices."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    r = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    with np.load(tmp_path / f"{ckpt.name}.npz") as z:
        nll = z["nll"]
    tokens = np.asarray(TokenShards(tiny_run / "data", "val").tokens(), dtype=np.int64)
    T = 32
    assert nll.size == r["n_blocks"] == (tokens.size - 1) // T
    model = load_run(ckpt).model.eval()
    for k in (0, 1, nll.size - 1):
        x = torch.from_numpy(tokens[k * T : k * T + T])[None]
        y = torch.from_numpy(tokens[k * T + 1 : k * T + T + 1])
        with torch.no_grad():
            logits, _ = model(x)
        assert nll[k] == pytest.approx(F.cross_entropy(logits[0].float(), y).item(), rel=1e-5), k
    assert r["mean_nll"] == pytest.approx(nll.mean(), rel=1e-12)


def test_partial_evaluation_is_not_marked_as_the_full_split(tiny_run, tmp_path):
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    r = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=3)
    assert r["n_blocks"] == 3 and r["all_blocks"] is False


def test_a_short_evaluation_records_its_block_and_a_non_degenerate_ci(tiny_run, tmp_path):
    """Six blocks: block 3 (stats.block_length), recorded as mean_ci95_block; the old block min(16, 6) = 6
    made every resample a rotation of the series and mean_ci95 a zero-width interval at the mean."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    r = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=6)
    with np.load(tmp_path / f"{r['checkpoint']}.npz") as z:
        nll = z["nll"]
    lo, hi = r["mean_ci95"]
    assert lo < r["mean_nll"] < hi, (lo, r["mean_nll"], hi)
    ci = block_bootstrap_ci(nll, block=3)
    assert r["mean_ci95_block"] == 3 and (lo, hi) == (ci.lo, ci.hi)
    full = evaluate_checkpoint(ckpt, out_dir=tmp_path / "full")
    assert full["n_blocks"] >= 32 and full["mean_ci95_block"] == 16


def test_evaluation_of_a_replaced_checkpoint_is_redone(tiny_run, tmp_path):
    """An up-to-date result is skipped; one of other checkpoint bytes (state.json hash) is redone."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    assert evaluate_checkpoint(ckpt, out_dir=tmp_path)["skipped"] is True
    state = ckpt / "state.json"
    original = state.read_bytes()
    try:
        resaved = dict(json.loads(original), note="re-saved")
        resaved["state_sha256"] = C.state_sha256(resaved)  # a re-save records its own hash
        state.write_text(json.dumps(resaved))
        again = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    finally:
        state.write_bytes(original)
    assert again["skipped"] is False
    assert again["checkpoint_state_sha256"] != first["checkpoint_state_sha256"]


def test_a_summary_of_an_older_version_is_redone(tiny_run, tmp_path):
    """A cached summary written by an older SUMMARY_VERSION (without fields the gate reads) is not current."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    path = next(tmp_path.glob("*.json"))
    old = {k: v for k, v in json.loads(path.read_text()).items() if k != "mean_ci95_block"}
    path.write_text(json.dumps(dict(old, summary_version=first["summary_version"] - 1)))
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    assert again["skipped"] is False and again["mean_ci95_block"] == first["mean_ci95_block"]
    assert json.loads(path.read_text())["summary_version"] == first["summary_version"]


@pytest.mark.parametrize("max_blocks", [None, 1])
def test_a_non_finite_nll_names_the_checkpoint_and_block_and_writes_nothing(
    tiny_run, tmp_path, monkeypatch, max_blocks
):
    """A diverged block raised the bootstrap's unnamed "x contains NaN or infinite values"; with one block
    (no bootstrap) a NaN mean was written silently."""
    import kinterval.eval.evaluate as E

    real = E.token_nll

    def diverged(*args, **kw):
        tok = real(*args, **kw)
        tok[tok.shape[0] - 1, 5] = np.nan
        return tok

    monkeypatch.setattr(E, "token_nll", diverged)
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    last = 0 if max_blocks == 1 else TokenShards(tiny_run / "data", "val").n_blocks(32) - 1
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt}: non-finite NLL \(nan\) in block {last} "):
        evaluate_checkpoint(ckpt, out_dir=tmp_path / "out", max_blocks=max_blocks, force=True)
    assert not (tmp_path / "out").exists()


def test_a_cached_result_answers_only_the_same_request(tiny_run, tmp_path):
    """The cache compared only the checkpoint hash: a capped result answered the full request, and one
    output folder answered another operator or split with the first result."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    n = TokenShards(tiny_run / "data", "val").n_blocks(32)
    out = tmp_path / "out"
    capped = evaluate_checkpoint(ckpt, out_dir=out, max_blocks=3)
    full = evaluate_checkpoint(ckpt, out_dir=out)
    assert (capped["n_blocks"], full["n_blocks"], full["all_blocks"], full["skipped"]) == (3, n, True, False)
    assert evaluate_checkpoint(ckpt, out_dir=out)["skipped"] is True  # the same request is still cached
    other_op = evaluate_checkpoint(ckpt, out_dir=out, operator="fwm-prob-k4")
    assert other_op["skipped"] is False and other_op["operator_used"] == "fwm-prob-k4"
    other_split = evaluate_checkpoint(ckpt, out_dir=out, split="test")
    assert other_split["skipped"] is False and other_split["split"] == "test"
    docs = evaluate_checkpoint(ckpt, out_dir=out, split="test", doc_clusters=True)
    assert docs["skipped"] is False and docs["n_documents"] >= 2
    assert docs["request"]["doc_clusters"] is True and docs["request"]["max_blocks"] is None


def test_a_capped_evaluation_does_not_replace_the_full_split_one(tiny_run, tmp_path, capsys):
    """`eval --max-blocks N` (a quick look) replaced the checkpoint's full-split evaluation (which the gate
    and the report read) with N blocks: the gate then failed with "did not cover the full split"."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    full = evaluate_checkpoint(ckpt, out_dir=out)
    with pytest.raises(ValueError, match="every block; --max-blocks 2 would replace it"):
        evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2)
    assert evaluate_checkpoint(ckpt, out_dir=out) == dict(full, skipped=True)  # kept as it was
    assert evaluate_checkpoint(ckpt, out_dir=tmp_path / "elsewhere", max_blocks=2)["n_blocks"] == 2
    argv = ["eval", "--run", str(tiny_run / "run"), "--checkpoint", "latest", "--out", str(out)]
    assert main([*argv, "--max-blocks", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval eval: error:") and "--force" in err and "\n" not in err
    assert evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, force=True)["n_blocks"] == 2
    assert evaluate_checkpoint(ckpt, out_dir=out)["all_blocks"] is True  # the full one replaces a capped one


def test_a_cap_at_or_above_the_split_is_the_full_evaluation(tiny_run, tmp_path):
    """A --max-blocks at or above the split's block count read every block but was recorded as capped
    (`all_blocks` false: "did not cover the full split" in the gate) and missed the full result's cache."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    n = TokenShards(tiny_run / "data", "val").n_blocks(32)
    out = tmp_path / "out"
    full = evaluate_checkpoint(ckpt, out_dir=out)
    for cap in (n, n + 5):
        r = evaluate_checkpoint(ckpt, out_dir=out, max_blocks=cap)
        assert r == dict(full, skipped=True), cap
    r = evaluate_checkpoint(ckpt, out_dir=tmp_path / "b", max_blocks=n + 5)
    assert (r["n_blocks"], r["all_blocks"], r["request"]["max_blocks"]) == (n, True, None)


def test_the_tau_screen_refuses_checkpoint_all(tiny_run, tmp_path, capsys, monkeypatch):
    """`tau-screen --checkpoint all` (which its help offered) screened the latest checkpoint alone."""
    monkeypatch.setattr("kinterval.train.load.load_run", lambda *a, **k: pytest.fail("the model was loaded"))
    argv = ["tau-screen", "--run", str(tiny_run / "run"), "--stages", "3", "--out", str(tmp_path / "ts")]
    assert main([*argv, "--checkpoint", "all"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: --checkpoint" in err and "one checkpoint" in err and "\n" not in err


def test_the_request_names_the_data_by_content_not_by_folder(tiny_run, tmp_path):
    """The request held the data folder's absolute path: a moved data folder (a moved suite folder) made
    every finished evaluation stale. The same shards in another folder are the same request; other shards
    are not."""
    import shutil

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    first = evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2)
    moved = shutil.copytree(tiny_run / "data", tmp_path / "elsewhere" / "data")
    again = evaluate_checkpoint(ckpt, data=moved, out_dir=out, max_blocks=2)
    assert again["skipped"] is True and again["request"] == first["request"]
    prepare("synthetic", tmp_path / "other", tokens=40_000, seed=1, progress=False)
    other = evaluate_checkpoint(ckpt, data=tmp_path / "other", out_dir=out, max_blocks=2)
    assert other["skipped"] is False
    assert other["request"]["shards_sha256"] != first["request"]["shards_sha256"]


def test_a_summary_without_a_request_is_not_current(tiny_run, tmp_path):
    """A summary written before the request was recorded cannot show what it answered: it is redone."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    js = tmp_path / f"{ckpt.name}.json"
    old = json.loads(js.read_text())
    del old["request"]
    js.write_text(json.dumps(old))
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    assert again["skipped"] is False and again["request"] == first["request"]


def test_a_summary_whose_numbers_are_not_its_arrays_is_redone_and_refused(tiny_run, tmp_path):
    """An edited mean_nll beside intact arrays was served as cached ("mean NLL 4.0000 [cached]"); an NPZ
    swapped in with the summary's npz_sha256 removed was read as the checkpoint's; a damaged summary stopped
    `report --runs` with a traceback."""
    from kinterval.eval.evaluate import load_result, read_summary

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    js = tmp_path / f"{ckpt.name}.json"
    good = js.read_text()
    js.write_text(json.dumps(dict(json.loads(good), mean_nll=4.0)))
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    assert again["skipped"] is False and again["mean_nll"] == first["mean_nll"]
    with pytest.raises(ValueError, match="block count or mean NLL differs"):  # the report's reader
        js.write_text(json.dumps({k: v for k, v in dict(json.loads(good), mean_nll=4.0).items()
                                  if k != "npz_sha256"}))  # fmt: skip
        load_result(js)
    bad = (("[]", "a JSON object expected"), (good[:100], "not a readable evaluation summary"),
           (json.dumps(dict(json.loads(good), step=float("nan"))), "no integer step"),
           (json.dumps(dict(json.loads(good), mean_nll=None)), "no finite mean_nll"),
           (json.dumps(dict(json.loads(good), tokens="abc")), "no integer tokens"),
           (json.dumps(dict(json.loads(good), operator_used=None)), "no operator_used"))  # fmt: skip
    for text, said in bad:
        js.write_text(text)
        with pytest.raises(ValueError, match=said):
            read_summary(js)


@pytest.mark.parametrize("kind", ["geometry", "graddiag"])
def test_a_cached_diagnostic_answers_only_the_same_request(tiny_run, tmp_path, kind):
    """The diagnostics cache was keyed on the checkpoint hash and --as only: --blocks 4, --split test or
    other --data returned the stored result of the first call (its n_blocks and split) as if computed. A
    stored result of other options is not replaced either (it may be a suite's probe, which the gate reads)
    unless --force, or replace_other (the suite runner)."""
    import shutil

    from kinterval.eval.diagnostics import diagnose_checkpoint

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    kw = {"out_dir": tmp_path / "out", "device": "cpu"}
    path = tmp_path / "out" / f"{ckpt.name}.json"
    first = diagnose_checkpoint(ckpt, kind, blocks=1, **kw)
    assert first["skipped"] is False
    assert diagnose_checkpoint(ckpt, kind, blocks=1, **kw)["skipped"] is True
    kept = path.read_bytes()
    with pytest.raises(ValueError, match=r"for 1 block, not for the options given.*--force"):
        diagnose_checkpoint(ckpt, kind, blocks=2, **kw)
    assert path.read_bytes() == kept
    more = diagnose_checkpoint(ckpt, kind, blocks=2, force=True, **kw)
    assert (more["skipped"], more["n_blocks"]) == (False, 2)
    with pytest.raises(ValueError, match="for split 'val', not"):
        diagnose_checkpoint(ckpt, kind, blocks=2, split="test", **kw)
    test = diagnose_checkpoint(ckpt, kind, blocks=2, split="test", replace_other=True, **kw)
    assert (test["skipped"], test["split"]) == (False, "test")
    moved = shutil.copytree(tiny_run / "data", tmp_path / "elsewhere" / "data")  # the same shards elsewhere
    assert diagnose_checkpoint(ckpt, kind, blocks=2, split="test", data=moved, **kw)["skipped"] is True
    prepare("synthetic", tmp_path / "other", tokens=40_000, seed=1, progress=False)
    with pytest.raises(ValueError, match="for other data, not"):
        diagnose_checkpoint(ckpt, kind, blocks=2, split="test", data=tmp_path / "other", **kw)
    other = diagnose_checkpoint(ckpt, kind, blocks=2, split="test", data=tmp_path / "other", force=True, **kw)
    assert other["skipped"] is False and other["mean"] != test["mean"]
    stored = json.loads(path.read_text())
    del stored["request"]  # a result written before the request was recorded: recomputed, not refused
    path.write_text(json.dumps(stored))
    again = diagnose_checkpoint(ckpt, kind, blocks=1, **kw)
    assert again["skipped"] is False and again["request"] == first["request"]
    assert (first["request"]["max_blocks"], test["request"]["split"]) == (1, "test")


def test_a_cached_geometry_of_another_operator_is_not_replaced_by_as(tiny_run, tmp_path):
    """--as into a folder holding the run's own probe (or another --as) replaced it without a word, though
    other --blocks were refused."""
    from kinterval.eval.diagnostics import diagnose_checkpoint

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    kw = {"out_dir": tmp_path / "out", "device": "cpu", "blocks": 1}
    own = diagnose_checkpoint(ckpt, "geometry", **kw)
    kept = (tmp_path / "out" / f"{ckpt.name}.json").read_bytes()
    with pytest.raises(ValueError, match=f"for operator {own['request']['operator']}, not for the options"):
        diagnose_checkpoint(ckpt, "geometry", spec="lerp-k4", **kw)
    assert (tmp_path / "out" / f"{ckpt.name}.json").read_bytes() == kept
    assert (
        diagnose_checkpoint(ckpt, "geometry", spec="lerp-k4", force=True, **kw)["request"]["operator"]
        == "lerp-k4"
    )


def test_the_eval_numerics_used_are_recorded(tiny_run, tmp_path, monkeypatch):
    """The summary said "tf32": false whatever the checkpoint's numerics.tf32_eval; the fused kernels' eval
    dot precision ($KINTERVAL_EVAL_DOT_PRECISION) is recorded and is part of the request on CUDA. Off CUDA
    no fused kernel runs: the CPU result is "ieee" whatever the variable says, and answers the same
    request."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]  # tf32_eval = false, attention inputs float32
    r = evaluate_checkpoint(ckpt, out_dir=tmp_path / "a", max_blocks=2)
    assert (r["tf32"], r["attention_dtype"], r["eval_dot_precision"]) == (False, "float32", "ieee")
    monkeypatch.setenv("KINTERVAL_EVAL_DOT_PRECISION", "tf32x3")
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path / "a", max_blocks=2)
    assert again["skipped"] is True and again["eval_dot_precision"] == "ieee"
    assert applied_numerics(NumericsConfig(), torch.device("cuda"))["eval_dot_precision"] == "tf32x3"
    assert (
        applied_numerics(NumericsConfig(tf32_eval=True), torch.device("cuda"))["eval_dot_precision"] is None
    )
    over = {"schedule.tokens": 512, "checkpoint.count": 1}
    over |= {"numerics.tf32_eval": True, "numerics.attention_dtype": "bfloat16"}
    train(tiny_config(tiny_run / "data", over), tmp_path / "tf32run")
    r = evaluate_checkpoint(list_checkpoints(tmp_path / "tf32run")[-1], out_dir=tmp_path / "b", max_blocks=2)
    assert (r["tf32"], r["attention_dtype"], r["eval_dot_precision"]) == (True, "bfloat16", None)


def test_zero_or_negative_block_caps_are_named_errors(tiny_run, capsys):
    """eval --max-blocks 0 blamed the split and -2 raised numpy's error; tau-screen --max-blocks 0 meant
    "no cap" and ran the whole split."""
    run = str(tiny_run / "run")
    positive, two = "must be a positive integer", "must be an integer >= 2"  # a screen's bootstrap needs 2
    for argv, flag, want in (
        (["eval", "--run", run, "--max-blocks", "0", "--quiet"], "--max-blocks", positive),
        (["eval", "--run", run, "--max-blocks", "-2", "--quiet"], "--max-blocks", positive),
        (["tau-screen", "--run", run, "--stages", "1", "--max-blocks", "0"], "--max-blocks", two),
        (["tau-screen", "--run", run, "--stages", "2a", "--subset-blocks", "0"], "--subset-blocks", two),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"error: {flag} {want}" in err and "\n" not in err


def test_tau_screen_checks_its_arguments_before_running_any_condition(
    tiny_run, tmp_path, capsys, monkeypatch
):
    """--resamples 0 used to be refused only by the bootstrap, after every condition of the stage had run, and
    nothing was saved; a K or tau outside the family likewise failed only once the model was loaded."""
    monkeypatch.setattr("kinterval.train.load.load_run", lambda *a, **k: pytest.fail("the model was loaded"))
    run, out = str(tiny_run / "run"), str(tmp_path / "ts")
    for extra, message in (
        (["--resamples", "0"], "--resamples must be an integer >= 1, got 0"),
        (["--taus", "0"], "--K 4 --taus 0 (stage 3): tau must be a finite number in (0, 1000], got 0.0"),
        (["--K", "0"], "--K 0 --taus 6 (stage 3): K must be an integer in [1, 16777216], got 0"),
        (["--stages", "3,9"], "unknown stage '9'"),
    ):
        argv = [
            "tau-screen",
            "--run",
            run,
            "--out",
            out,
            "--stages",
            "3",
            "--K",
            "4",
            "--taus",
            "6",
            "--max-blocks",
            "2",
        ]
        assert main(argv + extra) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "stage 3" not in captured.out and "(operator" not in captured.err
    assert not (tmp_path / "ts").exists()


def test_tau_screen_saves_the_per_block_arrays_before_the_statistics(tiny_run, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("bootstrap failed")

    monkeypatch.setattr("kinterval.eval.tau_screen.contrasts", broken)
    argv = ["tau-screen", "--run", str(tiny_run / "run"), "--out", str(tmp_path), "--stages", "2b"]
    with pytest.raises(RuntimeError, match="bootstrap failed"):
        main(argv + ["--K", "4", "--taus", "6", "--subset-blocks", "2"])
    with np.load(tmp_path / "stage2b.npz") as z:
        assert set(z.files) == {"K=4 tau=6", "softmax"} and z["softmax"].size == 2


def test_document_ids_assign_each_target_to_its_document():
    # EOT = 9 ends a document. Targets are tokens[1:9] = 9 3 4 9 | 7 8 2 1: the first 9 ends document 0,
    # the second ends document 1, everything after it is document 2.
    tokens = np.array([5, 9, 3, 4, 9, 7, 8, 2, 1, 9])
    np.testing.assert_array_equal(document_ids(tokens, 9, 2, 4), [[0, 1, 1, 1], [2, 2, 2, 2]])
    nll = np.arange(8.0).reshape(2, 4)
    ids, total, count = per_document(nll, document_ids(tokens, 9, 2, 4))
    np.testing.assert_array_equal(ids, [0, 1, 2])
    np.testing.assert_allclose(total, [0.0, 1 + 2 + 3, 4 + 5 + 6 + 7])
    np.testing.assert_array_equal(count, [1, 3, 4])


def test_operator_override_is_recorded_separately(tiny_run, capsys):
    own = evaluate_run(tiny_run / "run", checkpoint="latest")[0]  # the run's own result (or its cache)
    own_file = eval_dir(tiny_run / "run") / f"{own['checkpoint']}.json"
    own_bytes = own_file.read_bytes()
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
    assert summary["checkpoint"] == own["checkpoint"] and own["operator_used"] == "softmax"
    assert own_file.read_bytes() == own_bytes  # the run's own result is untouched


def test_document_clusters_on_test_split(tiny_run):
    rows = evaluate_run(tiny_run / "run", checkpoint="latest", split="test", doc_clusters=True)
    r = rows[0]
    assert r["split"] == "test" and r["n_documents"] >= 2
    # targets tokens[1 : nT + 1]: a new document starts after every EOT among tokens[1 : nT]
    shards = TokenShards(tiny_run / "data", "test")
    tokens = np.asarray(shards.tokens())
    assert r["n_documents"] == 1 + int((tokens[1 : r["n_blocks"] * 32] == shards.eot).sum())
    # the split's documents: those wholly in the unscored last partial block are not among n_documents
    assert r["n_documents_split"] == 1 + int((tokens[1:-1] == shards.eot).sum())  # as over every target
    assert r["n_documents_split"] >= r["n_documents"]
    tail = tokens[r["n_blocks"] * 32 : -1]  # a document that starts in the unscored tail is not scored
    assert r["n_documents_split"] - r["n_documents"] == int((tail == shards.eot).sum())
    lo, hi = r["doc_cluster_ci95"]
    assert lo <= r["doc_cluster_mean_nll"] <= hi
    with np.load(eval_dir(tiny_run / "run", "test") / f"{r['checkpoint']}.npz") as z:
        # token-weighted document mean equals the block mean (every target belongs to one document)
        assert z["doc_nll"].sum() / z["doc_tokens"].sum() == pytest.approx(r["mean_nll"])
        # the document-cluster statistic is token-weighted: the same mean, not a mean of document means
        assert r["doc_cluster_mean_nll"] == pytest.approx(r["mean_nll"], rel=1e-12)
        assert not np.allclose(z["doc_nll"] / z["doc_tokens"], r["mean_nll"])


def test_floor_tail_is_fwm_with_the_tail_at_the_window_edge():
    s = torch.tensor([[0.0, -1.0, -9.0, -20.0]])
    valid = torch.ones_like(s, dtype=torch.bool)
    spec = fwm_spec(4, 6.0)
    assert torch.equal(
        floor_probs(s, valid, spec), reference_probs(torch.tensor([[0.0, -1.0, -6.0, -6.0]]), valid, spec)
    )


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


NUMERICS = ("device", "device_type", "autocast", "attention_dtype", "tf32", "eval_dot_precision")


class _Loaded(Exception):
    """Raised by a stubbed load_run: the call went on to compute instead of answering from the cache."""


def _cuda_request(monkeypatch, module):
    """Requests through ``module`` resolve to CUDA (only the device; the model is never loaded)."""

    def load_run(*args, **kwargs):
        raise _Loaded

    monkeypatch.setattr(module, "pick_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(module, "load_run", load_run)


def test_a_cached_result_answers_only_the_same_numerics(tiny_run, tmp_path, monkeypatch):
    """The request recorded neither the device nor whether autocast applied (bf16 outside attention on CUDA,
    off on CPU by default): a CPU result came back "skipped" for a CUDA request and vice versa, mixing
    numerics in one suite. The device is resolved before the cache and its numerics are in the request."""
    from kinterval.eval import evaluate as E
    from kinterval.model import NumericsConfig, autocast

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    first = evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, device="cpu")
    want = dict(device_type="cpu", autocast="none", attention_dtype="float32", tf32=False)
    assert {k: first["request"][k] for k in want} == want and first["autocast"] == "none"
    assert evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, device="cpu")["skipped"] is True
    js = out / f"{ckpt.name}.json"
    stored = json.loads(js.read_text())
    with monkeypatch.context() as m:  # CUDA after CPU: evaluated, not the CPU result
        _cuda_request(m, E)
        with pytest.raises(_Loaded):
            evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, device="cuda")
    cuda = E.request(C.read_state(ckpt), TokenShards(tiny_run / "data", "val"), None, 2, False,
                     torch.device("cuda"))  # fmt: skip
    assert (cuda["device_type"], cuda["autocast"]) == ("cuda", "bfloat16")
    js.write_text(json.dumps(dict(stored, request=cuda)))  # a CUDA result does not answer a CPU request
    assert evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, device="cpu")["skipped"] is False
    old = {k: v for k, v in first["request"].items() if k not in NUMERICS}  # written before the fields
    js.write_text(json.dumps(dict(stored, request=old)))
    assert evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2, device="cpu")["skipped"] is False
    # autocast on CPU (numerics.autocast_on_cpu) is another request, and the rule is autocast()'s own
    for on_cpu in (False, True):
        numerics = NumericsConfig(autocast_on_cpu=on_cpu)
        ctx = autocast(numerics, "cpu")
        on = isinstance(ctx, torch.autocast) and ctx._enabled  # "none" is autocast switched off
        applied = str(ctx.fast_dtype).removeprefix("torch.") if on else "none"
        assert E.applied_numerics(numerics, torch.device("cpu"))["autocast"] == applied
        assert applied == ("bfloat16" if on_cpu else "none")


@pytest.mark.parametrize("kind", ["geometry", "graddiag"])
def test_a_diagnostic_records_its_numerics_and_answers_only_the_same(tiny_run, tmp_path, monkeypatch, kind):
    """The geometry / graddiag JSON recorded no numerics and its cache no device: a CPU probe answered a CUDA
    request. It now records them under an evaluation summary's field names (graddiag: deterministic too)."""
    from kinterval.eval import diagnostics as D

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    kw = {"out_dir": tmp_path / "out", "blocks": 1}
    res = D.diagnose_checkpoint(ckpt, kind, device="cpu", **kw)
    summary = evaluate_checkpoint(ckpt, out_dir=tmp_path / "eval", max_blocks=1, device="cpu")
    assert {k: res[k] for k in NUMERICS} == {k: summary[k] for k in NUMERICS}
    assert {k: res["request"][k] for k in NUMERICS[1:]} == {k: res[k] for k in NUMERICS[1:]}
    assert res.get("deterministic") is (True if kind == "graddiag" else None)
    assert D.diagnose_checkpoint(ckpt, kind, device="cpu", **kw)["skipped"] is True
    _cuda_request(monkeypatch, D)
    with pytest.raises(_Loaded):
        D.diagnose_checkpoint(ckpt, kind, device="cuda", **kw)


def test_a_summary_beside_the_arrays_of_another_request_is_not_current(tiny_run, tmp_path):
    """An evaluation killed between its two renames left the new NPZ beside the old JSON (the NPZ was moved
    into place before the JSON was invalidated): the JSON of ``max_blocks=2`` beside the 4-block arrays of
    ``max_blocks=4`` answered the next ``max_blocks=2`` request as [cached]. Recreated here on disk, with and
    without the ``npz_sha256`` a summary now records (an older summary: its block count is checked)."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    js = tmp_path / f"{first['checkpoint']}.json"
    summary_a = json.loads(js.read_text())
    assert evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=4)["n_blocks"] == 4
    for summary in (summary_a, {k: v for k, v in summary_a.items() if k != "npz_sha256"}):
        js.write_text(json.dumps(summary))  # the JSON of request A beside the NPZ of request B
        again = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
        assert again["skipped"] is False and again["n_blocks"] == 2
        with np.load(tmp_path / f"{first['checkpoint']}.npz") as z:
            assert z["nll"].size == 2
        assert evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)["skipped"] is True
        assert evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=4)["skipped"] is False


def test_the_old_summary_goes_before_the_arrays_are_replaced(tiny_run, tmp_path, monkeypatch):
    """A re-evaluation cut short while its NPZ is written leaves no summary: the old JSON is removed first, so
    it never describes the new arrays; no temporary file is left behind."""
    from kinterval import atomic

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    npz_before = (tmp_path / f"{first['checkpoint']}.npz").read_bytes()

    class Killed(BaseException):
        pass

    def killed(path, data):
        assert not (tmp_path / f"{first['checkpoint']}.json").exists()  # gone before the NPZ is replaced
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(atomic, "write_bytes", killed)
        with pytest.raises(Killed):
            evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{first['checkpoint']}.npz"]
    assert (tmp_path / f"{first['checkpoint']}.npz").read_bytes() == npz_before
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)  # no summary: evaluated again
    assert again["skipped"] is False and again["npz_sha256"] == atomic.sha256_file(
        tmp_path / f"{first['checkpoint']}.npz"
    )


def test_device_name_is_the_gpu_model(monkeypatch):
    """A CUDA evaluation records the GPU model (two evaluators of tab:strict are told apart by it)."""
    import torch

    from kinterval.eval.evaluate import device_name

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    assert device_name(torch.device("cuda:0")) == "NVIDIA H200"
    assert device_name(torch.device("cpu"))


@pytest.mark.parametrize("kind", ["geometry", "graddiag"])
@pytest.mark.parametrize("damage", ["torn", "binary", "not an object"])
def test_an_unreadable_stored_diagnostic_is_recomputed_not_a_traceback(
    tiny_run, tmp_path, capsys, kind, damage
):
    """A stored probe cut short, of binary bytes or not a JSON object stopped `kinterval geometry` (and
    `graddiag`, and every `suite run` of that run) with a JSONDecodeError or AttributeError traceback. It is a
    cache entry that says nothing: recomputed and replaced, as an unreadable evaluation summary is."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    args = [
        kind,
        "--run",
        str(tiny_run / "run"),
        "--checkpoint",
        "latest",
        "--blocks",
        "1",
        "--device",
        "cpu",
    ]
    assert main([*args, "--out", str(out)]) == 0
    path = out / f"{ckpt.name}.json"
    good = json.loads(path.read_text())
    text = path.read_bytes()
    bad = {"torn": text[: len(text) // 2], "binary": b"\xff\xfe\x00{", "not an object": b"[1, 2]\n"}[damage]
    path.write_bytes(bad)
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    again = json.loads(path.read_text())
    assert again["mean"] == good["mean"] and again["request"] == good["request"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_plain_evaluation_keeps_the_document_cluster_one(tiny_run, tmp_path):
    """A plain `eval` after `eval --doc-clusters` of the same checkpoint recomputed the per-block NLL and
    replaced the summary, losing the per-document arrays and the document-cluster CI."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    docs = evaluate_checkpoint(ckpt, out_dir=out, split="test", doc_clusters=True)
    plain = evaluate_checkpoint(ckpt, out_dir=out, split="test")
    assert plain["skipped"] is True and plain["doc_cluster_ci95"] == docs["doc_cluster_ci95"]
    summary, arrays = load_result(result_paths(out, ckpt)[1])
    assert summary["request"]["doc_clusters"] is True and "doc_nll" in arrays
    # the other way round is a new request: a plain result does not answer --doc-clusters
    plain_first = tmp_path / "plain"
    assert evaluate_checkpoint(ckpt, out_dir=plain_first, split="test")["skipped"] is False
    again = evaluate_checkpoint(ckpt, out_dir=plain_first, split="test", doc_clusters=True)
    assert again["skipped"] is False and again["n_documents"] >= 2


def test_an_older_summary_beside_other_arrays_of_its_block_count_is_not_current(tiny_run, tmp_path):
    """A summary without ``npz_sha256`` (an older kinterval's) is current only beside the arrays it was
    written with: the block count and the mean NLL both match. The arrays of another operator's evaluation
    with as many blocks do not answer it."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    first = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    js = tmp_path / f"{first['checkpoint']}.json"
    summary_a = {k: v for k, v in json.loads(js.read_text()).items() if k != "npz_sha256"}
    other = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2, operator="fwm-prob-k4")
    assert other["n_blocks"] == 2 and other["mean_nll"] != first["mean_nll"]
    js.write_text(json.dumps(summary_a))  # the older JSON of request A beside the NPZ of the other operator
    again = evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)
    assert again["skipped"] is False and again["mean_nll"] == first["mean_nll"]


def test_a_capped_look_may_replace_a_full_evaluation_of_other_checkpoint_bytes(tiny_run, tmp_path):
    """The full-split evaluation a capped look must not replace is one of these checkpoint bytes: a stored
    full evaluation of other bytes (the checkpoint re-saved since) is stale, and the capped look goes on."""
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    full = evaluate_checkpoint(ckpt, out_dir=tmp_path)
    js = tmp_path / f"{full['checkpoint']}.json"
    js.write_text(json.dumps(dict(json.loads(js.read_text()), checkpoint_state_sha256="0" * 64)))
    assert evaluate_checkpoint(ckpt, out_dir=tmp_path, max_blocks=2)["n_blocks"] == 2


# ------------------------------------------------------- mutation audit of the diagnostics cache (eval)
def test_a_diagnostic_of_an_unknown_kind_or_block_count_is_refused_before_reading_the_checkpoint(tmp_path):
    from kinterval.eval.diagnostics import diagnose_checkpoint

    missing = tmp_path / "run" / "checkpoints" / "step_000001"  # never read: the arguments come first
    with pytest.raises(ValueError, match=r"kind must be one of \('geometry', 'graddiag'\), got 'geom'"):
        diagnose_checkpoint(missing, "geom")
    for blocks in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match=rf"blocks must be a positive integer, got {blocks!r}"):
            diagnose_checkpoint(missing, "geometry", blocks=blocks)


@pytest.mark.parametrize("kind", ["geometry", "graddiag"])
def test_a_stored_diagnostic_of_other_checkpoint_bytes_is_recomputed_not_reused_or_refused(
    tiny_run, tmp_path, kind
):
    """The cache answers only for the same checkpoint bytes: a result of another checkpoint of the same step
    name (a run trained again into its folder) is recomputed for the same request and replaced, without the
    refusal that guards a result of the same checkpoint under other options."""
    from kinterval.eval.diagnostics import diagnose_checkpoint

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    kw = {"out_dir": tmp_path / "out", "device": "cpu"}
    path = tmp_path / "out" / f"{ckpt.name}.json"
    first = diagnose_checkpoint(ckpt, kind, blocks=1, **kw)

    def other_bytes():
        stored = json.loads(path.read_text())
        path.write_text(json.dumps(stored | {"checkpoint_state_sha256": "0" * 64}))

    other_bytes()
    again = diagnose_checkpoint(ckpt, kind, blocks=1, **kw)
    assert again["skipped"] is False and again["checkpoint_state_sha256"] == first["checkpoint_state_sha256"]
    other_bytes()
    more = diagnose_checkpoint(ckpt, kind, blocks=2, **kw)  # other options too: replaced, not refused
    assert (more["skipped"], more["n_blocks"]) == (False, 2)
    assert json.loads(path.read_text())["checkpoint_state_sha256"] == first["checkpoint_state_sha256"]


def test_a_probe_in_the_run_folder_records_its_checkpoint_and_one_under_as_gets_its_own(tiny_run, tmp_path):
    """Without --out a probe goes to RUN/diagnostics/<kind> (created), and one under another operator
    (--as) to RUN/diagnostics/geometry__as-<operator, file-system safe>, computed with that operator's
    grid and never answered by the run's own probe; in one --out folder it does not replace that probe
    without --force (it did, silently). The result records the
    checkpoint's step, tokens and code, the split as the data names it and the device used."""
    import shutil

    from kinterval.eval.diagnostics import diagnose_checkpoint, diagnose_run

    run = shutil.copytree(tiny_run / "run" / "checkpoints", tmp_path / "run" / "checkpoints").parent
    ckpt = list_checkpoints(run)[-1]
    state = json.loads((ckpt / "state.json").read_text())
    own = diagnose_checkpoint(ckpt, "geometry", blocks=1, split="validation", device="auto")
    assert own["path"] == str(run / "diagnostics" / "geometry" / f"{ckpt.name}.json")
    assert (own["split"], own["device"], own["operator_trained"], own["probe_operator_arg"]) == (
        "val", "cpu", "softmax", None,
    )  # fmt: skip
    assert (own["step"], own["tokens"], own["train_code"]) == (state["step"], state["tokens"], state["code"])
    spec = "fwm-prob-k4[tau=5]"
    other = diagnose_checkpoint(ckpt, "geometry", blocks=1, spec=spec, device="cpu")
    assert other["path"] == str(run / "diagnostics" / "geometry__as-fwm-prob-k4.tau-5" / f"{ckpt.name}.json")
    assert (other["skipped"], other["probe_operator_arg"], other["operator_trained"]) == (
        False, spec, "softmax",
    )  # fmt: skip
    assert other["request"]["operator"] != own["request"]["operator"]
    assert not math.isnan(other["mean"]["tv"]) and math.isnan(own["mean"]["tv"])  # the grid of --as
    out = {"out_dir": tmp_path / "out", "blocks": 1, "device": "cpu"}
    assert diagnose_checkpoint(ckpt, "geometry", **out)["skipped"] is False
    with pytest.raises(ValueError, match="for operator softmax, not for the options given"):
        diagnose_checkpoint(ckpt, "geometry", spec=spec, **out)
    assert diagnose_checkpoint(ckpt, "geometry", spec=spec, force=True, **out)["skipped"] is False
    rows = diagnose_run(run, "graddiag", checkpoint="latest", blocks=1, device="cpu")
    assert [r["checkpoint"] for r in rows] == [ckpt.name] and len(list_checkpoints(run)) == 2
    # the .old-step_* copy that stands for a step whose re-save was killed: filed under the step's name
    old = ckpt.rename(ckpt.with_name(C.OLD_PREFIX + ckpt.name))
    res = diagnose_checkpoint(old, "graddiag", blocks=1, device="cpu")
    assert (
        res["path"] == str(run / "diagnostics" / "graddiag" / f"{ckpt.name}.json") and res["skipped"] is True
    )


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_evaluation(
    tiny_run, tmp_path, monkeypatch
):
    """`eval --out FILE/sub` failed only after the whole checkpoint was evaluated (38 s on a loaded CPU);
    geometry, graddiag and the others refused it at once."""
    from kinterval.eval import evaluate

    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(evaluate, "load_run", lambda *a, **k: pytest.fail("evaluated before the check"))
    ckpt = list_checkpoints(tiny_run / "run")[-1]
    with pytest.raises(NotADirectoryError):
        evaluate_checkpoint(ckpt, data=tiny_run / "data", out_dir=tmp_path / "file" / "sub")


def test_a_result_written_by_a_concurrent_command_is_not_replaced_either(tiny_run, tmp_path, monkeypatch):
    """The never-replace checks ran before the computation only: an `eval --max-blocks 2` (or a `geometry
    --blocks 2`) started beside a full evaluation (a `--blocks 1` probe) passed its check before the other
    wrote, and replaced its result when it finished, exit 0. The check runs again before writing."""
    import kinterval.eval.diagnostics as D
    import kinterval.eval.evaluate as E

    ckpt = list_checkpoints(tiny_run / "run")[-1]
    out = tmp_path / "out"
    nll, done = E.token_nll, []

    def beside(model, tokens, T, max_blocks=None, **kw):  # the other command finishes while this one runs
        if not done:
            done.append(None)  # the nested call computes as usual
            done[0] = evaluate_checkpoint(ckpt, out_dir=out)
        return nll(model, tokens, T, max_blocks=max_blocks, **kw)

    monkeypatch.setattr(E, "token_nll", beside)
    with pytest.raises(ValueError, match="every block; --max-blocks 2 would replace it"):
        evaluate_checkpoint(ckpt, out_dir=out, max_blocks=2)
    assert evaluate_checkpoint(ckpt, out_dir=out) == dict(done[0], skipped=True)

    probe, geo = [], D.geometry_probe

    def beside_geo(model, tokens, blocks, spec=None):
        if not probe:
            probe.append(None)
            probe[0] = D.diagnose_checkpoint(ckpt, "geometry", blocks=1, out_dir=out / "g", device="cpu")
        return geo(model, tokens, blocks=blocks, spec=spec)

    monkeypatch.setattr(D, "geometry_probe", beside_geo)
    with pytest.raises(ValueError, match=r"for 1 block, not for the options given"):
        D.diagnose_checkpoint(ckpt, "geometry", blocks=2, out_dir=out / "g", device="cpu")
    assert json.loads((out / "g" / f"{ckpt.name}.json").read_text())["n_blocks"] == 1
