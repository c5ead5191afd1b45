"""Trust in the run's files: finished runs, torn logs, edited state, a misdirected LATEST, atomic saves,
clip statistics across a resume and a block size that cannot fit."""

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from kill_hook import Killed, kill_at
from kinterval.cli import main
from kinterval.model import GPT, ModelConfig
from kinterval.train import checkpoint as C
from kinterval.train import trainer as trainer_module
from kinterval.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("trust")


def train_rows(run):
    return [r for r in read_metrics(run) if "event" not in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_config):
    """A full run and the same run killed one step past its checkpoint at step 4 (checkpoints 2, 4, 6, 8);
    grad_clip 0.9 clips some of the steps before the kill and none after it."""
    torch.set_num_threads(1)
    cfg = shared_config(**{"optim.grad_clip": 0.9})
    root = tmp_path_factory.mktemp("runs")
    train(cfg, root / "full")
    with pytest.raises(Killed):
        train(cfg, root / "killed", on_step=kill_at(5))
    return cfg, root


def copy_run(runs, name, tmp_path):
    shutil.copytree(runs[1] / name, tmp_path / name)
    return tmp_path / name


# ---------------------------------------------------------------------- 3. finished runs
def test_resume_of_finished_run_changes_nothing(data_dir, tmp_path, capsys):
    args = ["train", "--data", str(data_dir), "--model", "tiny", "--tokens", "512", "--block-size", "32",
            "--micro-batch", "4", "--accum", "1", "--warmup-tokens", "128", "--checkpoints", "1",
            "--set", "model.n_embd=32", "--device", "cpu", "--no-progress"]  # fmt: skip
    args += ["--out", str(tmp_path / "run")]
    assert main(args) == 0
    status = (tmp_path / "run" / "status.json").read_bytes()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    last = json.loads(status)["last_loss"]
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already complete" in out and f"{last:.4f}" in out
    assert (tmp_path / "run" / "status.json").read_bytes() == status
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == metrics


def test_finished_run_reports_its_recorded_loss_and_time(runs):
    cfg, root = runs
    result = train(cfg, root / "full", resume=True)
    status = json.loads((root / "full" / "status.json").read_text())
    assert result.status == "completed" and result.resumed_finished
    assert result.last_loss == status["last_loss"] == train_rows(root / "full")[-1]["train_loss"]
    assert result.train_s == status["train_s"] > 0


def test_a_finished_run_killed_before_its_final_status_is_marked_completed_on_resume(runs, tmp_path):
    """A kill after the final checkpoint but before the final status leaves status.json "running" (docs §3: a
    killed run stays "running"). Resuming has nothing to redo, and writes the "completed" status the run
    would have written, with the checkpoint's loss and training time (Trainer.finish); metrics.jsonl stays."""
    cfg, _ = runs
    run = copy_run(runs, "full", tmp_path)
    want = json.loads((run / "status.json").read_text())
    metrics = (run / "metrics.jsonl").read_bytes()
    (run / "status.json").write_text(json.dumps({"status": "running", "step": 0, "steps": 8}))
    result = train(cfg, run, resume=True)
    assert result.resumed_finished and result.last_checkpoint == run / "checkpoints" / "step_000008"
    got = json.loads((run / "status.json").read_text())
    assert got.pop("last_checkpoint") == str(run / "checkpoints" / "step_000008")
    assert got == {k: v for k, v in want.items() if k != "last_checkpoint"} and got["status"] == "completed"
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_a_finished_run_is_not_resumed_under_another_config(runs, tmp_path):
    """docs/training.md §5: the checkpoint must match the requested config, a finished one too: "already
    complete" under another seed would report the recorded run as if it were the requested one."""
    cfg, _ = runs
    run = copy_run(runs, "full", tmp_path)
    status = (run / "status.json").read_bytes()
    with pytest.raises(CheckpointError, match=r"different config.*seed: 0 -> 5"):
        train(cfg.override({"seed": 5}), run, resume=True)
    assert (run / "status.json").read_bytes() == status


def test_the_same_shards_prepared_from_another_source_path_resume(runs, data_dir, tmp_path):
    """docs/training.md §5: the data identity is the vocabulary, token count and shard hashes. The --source
    string the folder was prepared from was compared too: the same corpus prepared as text:corpus and as
    text:ABSOLUTE/corpus (identical shards) was refused. Resuming on such a copy now gives the full run."""
    cfg, _ = runs
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["source"] = "text:elsewhere/corpus"
    (copy / "meta.json").write_text(json.dumps(meta))
    run = copy_run(runs, "killed", tmp_path)
    train(cfg.override({"data.dir": str(copy)}), run, resume=True)
    full = runs[1] / "full"
    assert [r["train_loss"] for r in train_rows(run)] == [r["train_loss"] for r in train_rows(full)]
    a, b = (load_checkpoint(r / "checkpoints" / "step_000008") for r in (full, run))
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    # other tokens (two ids swapped, meta.json's hash updated to match) are still refused
    other = tmp_path / "other"
    shutil.copytree(copy, other)
    ids = np.fromfile(other / "train_0000.bin", dtype="<u2")
    ids[:2] = ids[1::-1].copy()
    ids.tofile(other / "train_0000.bin")
    meta["splits"]["train"]["shards"][0]["sha256"] = hashlib.sha256(ids.tobytes()).hexdigest()
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"different config.*data.identity.shards_sha256"):
        train(cfg.override({"data.dir": str(other)}), copy_run(runs, "killed", tmp_path / "x"), resume=True)


def test_demo_rerun_shows_the_real_numbers(tmp_path):
    from kinterval.train.demo import run_demo

    kw = {"operators": ["softmax"], "quick": True, "tokens": 8192, "progress": False}
    first = run_demo(tmp_path, **kw)[0]
    again = run_demo(tmp_path, **kw)[0]
    assert again["train_loss"] == first["train_loss"] is not None
    assert again["train_s"] == first["train_s"] > 0
    assert again["val_nll"] == first["val_nll"]


# ---------------------------------------------------------------------- 4. torn metrics.jsonl
def test_torn_last_metrics_line_is_dropped_on_resume(runs, tmp_path):
    cfg, root = runs
    run = copy_run(runs, "killed", tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train_loss": 3.1')  # a kill in the middle of a write
    after = []
    assert train(cfg, run, resume=True, on_step=lambda step, model: after.append(step)).status == "completed"
    assert after == [5, 6, 7, 8]  # continued from the step-4 checkpoint
    assert train_rows(run) == [
        {**r, **_volatile(s)} for r, s in zip(train_rows(root / "full"), train_rows(run))
    ]


@pytest.mark.parametrize("damage", ["removed", "cut before the checkpoint's row", "intact", "hole"])
def test_a_log_without_the_checkpoint_steps_row_is_warned_of_on_resume(runs, tmp_path, damage):
    """A metrics.jsonl deleted or cut short since the checkpoint was saved was resumed in silence: the run
    logged on from the checkpoint above a gap, and the report's clipping tail, largest gradient norm and
    largest loss rise left the lost steps out. A kill never causes it (a step's row is written before its
    checkpoint), so an intact log, torn last line and all, gives no warning."""
    import warnings

    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    log = run / "metrics.jsonl"
    if damage == "removed":
        log.unlink()
    elif damage == "hole":  # rows 2 and 3 lost below an intact checkpoint row
        log.write_text("".join(f"{json.dumps(r)}\n" for r in read_metrics(run) if r["step"] not in (2, 3)))
    elif damage == "intact":
        with open(log, "a") as f:
            f.write('{"step": 6, "train_loss": 3.1')  # a kill in the middle of a write
    else:
        log.write_text("".join(f"{json.dumps(r)}\n" for r in read_metrics(run) if r["step"] < 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert train(cfg, run, resume=True).status == "completed"
    said = [str(w.message) for w in caught if "row(s) up to step 4, the checkpoint resumed" in str(w.message)]
    if damage == "intact":
        assert said == []
    else:  # the killed run logged every step (log.every 1): steps 1-4 lost, or step 4 alone
        lost, steps = {"removed": ("4", "1 to 4"), "hole": ("2", "2 to 3")}.get(damage, ("1", "4 to 4"))
        lost, steps = f"lacks {lost} row(s) up to step 4", f"(steps {steps})"
        assert len(said) == 1 and lost in said[0] and steps in said[0] and "logs from step 5 on" in said[0]


def test_a_resume_with_another_log_every_is_no_lost_row(runs, tmp_path):
    """log.every may change on resume: the resumed session logs the change (event log_every, the cadence
    before and after), and the next resume, or a suite's gate, expects each stretch's own rows. It warned
    that the steps the earlier cadence skipped were lost from the log. A session that started from a
    checkpoint is redone, its cadence row with it, when the run resumes from that checkpoint again."""
    import warnings

    from kinterval.train.metrics import LOG_EVERY, missing_steps

    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)  # every step logged, checkpoint at step 4
    every3 = cfg.override({"log.every": 3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Killed):
            train(every3, run, resume=True, on_step=kill_at(7))  # checkpoint at 6
        assert train(every3, run, resume=True).status == "completed"
    assert not [str(w.message) for w in caught if "lost from the log" in str(w.message)]
    rows = read_metrics(run)
    change = [r for r in rows if r.get("event") == LOG_EVERY]
    assert change == [{"event": LOG_EVERY, "step": 4, "every": 3, "was_every": 1}]
    assert [r["step"] for r in train_rows(run)] == [1, 2, 3, 4, 6, 8]  # the last step is always logged
    assert missing_steps(rows, 1, 8) == []
    assert missing_steps([r for r in rows if r["step"] != 3], 1, 8) == [3]  # a hole is still found
    assert missing_steps([r for r in rows if r["step"] != 6], 1, 8) == [6]
    # from step 4 again, with the first cadence: the session that logged the change is redone
    shutil.rmtree(run / "checkpoints" / "step_000006")
    shutil.rmtree(run / "checkpoints" / "step_000008")
    (run / "checkpoints" / "LATEST").unlink(missing_ok=True)
    (run / "status.json").unlink()
    assert train(cfg, run, resume=True).status == "completed"
    rows = read_metrics(run)
    assert not [r for r in rows if r.get("event") == LOG_EVERY]
    assert [r["step"] for r in train_rows(run)] == list(range(1, 9)) and missing_steps(rows, 1, 8) == []


def test_corrupt_metrics_line_in_the_middle_is_refused(runs, tmp_path):
    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is corrupt"):
        train(cfg, run, resume=True)


def _volatile(row):
    """Timing and memory differ between sessions; everything else must be equal."""
    return {k: row[k] for k in ("tokens_per_s", "peak_mem")}


# ---------------------------------------------------------------------- 5. state.json
def test_an_edited_state_json_is_refused_and_an_older_one_without_its_hash_read(runs, tmp_path):
    """An edit no other check sees (the operator a run was trained with): its hash differs. A state.json
    without state_sha256 is what kinterval versions before it wrote at the same format version: read."""
    from kinterval.train.checkpoint import read_state

    run = copy_run(runs, "killed", tmp_path)
    ck = run / "checkpoints" / "step_000004"
    state = json.loads((ck / "state.json").read_text())
    state["config"]["operator"]["name"] = "lerp-k4"
    (ck / "state.json").write_text(json.dumps(state))
    read_state(ck)  # without verify: the folder's own listing reads it
    with pytest.raises(CheckpointError, match="state.json was modified"):
        read_state(ck, verify=True)
    del state["state_sha256"]
    (ck / "state.json").write_text(json.dumps(state))
    assert read_state(ck, verify=True)["config"]["operator"]["name"] == "lerp-k4"


@pytest.mark.parametrize("edit", ["step", "step_rehashed", "step_and_folder"])
def test_edited_state_step_is_refused(runs, tmp_path, edit):
    from kinterval.train.checkpoint import state_sha256

    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    ck = run / "checkpoints" / "step_000004"
    state = json.loads((ck / "state.json").read_text())
    state["step"] = 2
    match = "folder name says 4"  # the step's own check comes before the hash's
    if edit != "step":  # its hash recomputed: the step still disagrees with the folder and the optimizer
        state["state_sha256"] = state_sha256(state)
    if edit == "step_and_folder":  # a consistent-looking forgery: only the optimizer's counters disagree
        shutil.rmtree(run / "checkpoints" / "step_000002")
        ck = ck.rename(run / "checkpoints" / "step_000002")
        (run / "checkpoints" / "LATEST").write_text("step_000002\n")
        match = r"says step 2, the optimizer has taken \[4\] steps"
    (ck / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=match):
        train(cfg, run, resume=True)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", "not a JSON object"),
        ('{"format": "kinterval-checkpoint", "format_version": 1}', "no valid step"),
        ('{"format": "kinterval-checkpoint", "format_version": 1, "step": 4}', "lacks a valid 'files'"),
    ],
)
def test_malformed_state_json_is_a_checkpoint_error(runs, tmp_path, text, match):
    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    (run / "checkpoints" / "step_000004" / "state.json").write_text(text)
    with pytest.raises(CheckpointError, match=match):
        train(cfg, run, resume=True)


def test_a_damaged_newest_checkpoint_names_the_way_on_and_the_way_works(runs, tmp_path):
    """A bit flip in the newest checkpoint is refused, with the step to fall back to; removing that folder,
    as the message says, resumes from the checkpoint before it and ends where the uninterrupted run ends."""
    cfg, root = runs
    run = copy_run(runs, "killed", tmp_path)
    newest = run / "checkpoints" / "step_000004"
    model = newest / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-3] ^= 0x10
    model.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"\(remove {newest} to resume from step_000002\)$"):
        train(cfg, run, resume=True)
    shutil.rmtree(newest)
    with pytest.warns(UserWarning, match="LATEST does not name a checkpoint of this run"):
        assert train(cfg, run, resume=True).status == "completed"
    assert len(train_rows(run)) == len(train_rows(root / "full"))
    assert train_rows(run) == [
        {**r, **_volatile(s)} for r, s in zip(train_rows(root / "full"), train_rows(run))
    ]


# ---------------------------------------------------------------------- 6. LATEST
def test_latest_pointing_at_another_run_is_not_followed(runs, tmp_path):
    cfg, root = runs
    run = copy_run(runs, "killed", tmp_path)
    (run / "checkpoints" / "LATEST").write_text(str(root / "full" / "checkpoints" / "step_000008") + "\n")
    with pytest.warns(UserWarning, match="does not name a checkpoint of this run"):
        assert latest_checkpoint(run) == run / "checkpoints" / "step_000004"
    with pytest.warns(UserWarning):
        assert train(cfg, run, resume=True).status == "completed"
    assert [r["train_loss"] for r in train_rows(run)] == [r["train_loss"] for r in train_rows(root / "full")]


@pytest.mark.parametrize(
    "content", [b"", b"\xff\xfe\x00garbage", b"../../full/checkpoints/step_000008", b"step_4"]
)
def test_unreadable_latest_falls_back_to_the_newest_checkpoint(runs, tmp_path, content):
    run = copy_run(runs, "killed", tmp_path)
    (run / "checkpoints" / "LATEST").write_bytes(content)
    with pytest.warns(UserWarning, match="LATEST does not name"):
        assert latest_checkpoint(run) == run / "checkpoints" / "step_000004"


# ---------------------------------------------------------------------- 7. atomic saves
def tiny_state():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    return GPT(cfg).state_dict(), {"step": 1, "config": {}, "model_config": cfg.to_dict()}


def test_files_and_folders_are_fsynced_before_their_renames(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc to name file descriptors")

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(a)))
        real_replace(a, b)

    monkeypatch.setattr(C.os, "fsync", fsync)
    monkeypatch.setattr(C.os, "replace", replace)
    msd, state = tiny_state()
    save_checkpoint(tmp_path, 1, msd, {}, state)
    root = str(tmp_path / "checkpoints")
    tmp, latest_tmp = f"{root}/.tmp-step_000001", f"{root}/.LATEST.{os.getpid()}.tmp"  # kinterval.atomic's
    order = {e: i for i, e in enumerate(events)}
    for f in (*C.FILES, "state.json"):
        assert order[("fsync", f"{tmp}/{f}")] < order[("replace", tmp)]
    assert order[("fsync", tmp)] < order[("replace", tmp)]  # the folder's entries
    assert order[("fsync", latest_tmp)] < order[("replace", latest_tmp)]
    assert events[-1] == ("fsync", root)  # the renames themselves


def test_resave_killed_between_renames_keeps_the_checkpoint(tmp_path, monkeypatch):
    msd, state = tiny_state()
    save_checkpoint(tmp_path, 1, msd, {}, state)
    real_replace = os.replace

    def replace(a, b):
        if os.path.basename(a).startswith(".tmp-"):
            raise Killed  # after the old copy moved aside, before the new one is renamed in
        real_replace(a, b)

    monkeypatch.setattr(C.os, "replace", replace)
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, 1, msd, {}, state)
    monkeypatch.setattr(C.os, "replace", real_replace)
    assert not (tmp_path / "checkpoints" / "step_000001").exists()
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == ".old-step_000001"
    assert torch.equal(load_checkpoint(path).model["transformer.wte.weight"], msd["transformer.wte.weight"])
    save_checkpoint(tmp_path, 1, msd, {}, state)  # the next save completes the swap
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["LATEST", "step_000001"]


# ---------------------------------------------------------------------- 8. clip statistics across a resume
def test_clip_statistics_survive_kill_and_resume(runs, tmp_path):
    cfg, root = runs
    run = copy_run(runs, "killed", tmp_path)
    after = []
    train(cfg, run, resume=True, on_step=lambda step, model: after.append(step))
    assert after == [5, 6, 7, 8]  # the counts before step 4 come from the checkpoint, not a retrain
    full = [(r["clipped"], r["clipped_frac"]) for r in train_rows(root / "full")]
    assert [(r["clipped"], r["clipped_frac"]) for r in train_rows(run)] == full
    n = sum(c for c, _ in full)
    assert 0 < n < len(full) and full[-1][1] == n / len(full)  # a running fraction over the whole run


def test_training_time_adds_up_over_the_sessions_of_a_run(runs, tmp_path):
    """docs/training.md §3: train_s is the training wall time over all sessions of the run. The killed run's
    checkpoint at step 4 is given 1000 s of earlier training (state.json rehashed): the resumed run reports,
    records in status.json and saves at its final checkpoint 1000 s plus this session's few seconds."""
    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    ck = run / "checkpoints" / "step_000004"
    state = json.loads((ck / "state.json").read_text())
    state["train_s"] = 1000.0
    state["state_sha256"] = C.state_sha256(state)
    (ck / "state.json").write_text(json.dumps(state))
    result = train(cfg, run, resume=True)
    final = load_checkpoint(latest_checkpoint(run)).state
    assert final["step"] == 8 and 1000 < result.train_s == final["train_s"] < 1000 + 120
    assert json.loads((run / "status.json").read_text())["train_s"] == result.train_s


# ---------------------------------------------------------------------- 9. block size
def test_a_step_larger_than_the_token_budget_is_refused_up_front(make_config, tmp_path):
    """The steps are rounded up, so a step of more tokens than the run's budget (--accum 1e12) trained that
    whole step: 2.5e11 times the tokens asked for, after an allocation the size of the step."""
    cfg = make_config(**{"schedule.accum": 10**12})
    with pytest.raises(ValueError, match=r"one optimizer step trains [\d,]+ tokens .* accum 1000000000000 .*"
                       r"more than the run's [\d,]+: lower --accum"):  # fmt: skip
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_block_size_longer_than_the_data_is_refused_up_front(make_config, tmp_path):
    with pytest.raises(ValueError, match=r"model\.block_size 100000 needs 100001 tokens.*has 6\d{4}"):
        train(make_config(**{"model.block_size": 100_000}), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # The boundary: a window is T + 1 tokens, so T = the split's 60000 tokens does not fit either.
    with pytest.raises(ValueError, match=r"model\.block_size 60000 needs 60001 tokens.*has 60000"):
        train(make_config(**{"model.block_size": 60_000}), tmp_path / "run")


def test_block_size_beyond_device_memory_is_refused_before_allocating(make_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: 2**30)  # a 1 GiB machine
    cfg = make_config(**{"model.block_size": 20_000, "operator.backend": "closed_form"})
    # (2 per layer * 2 layers + 6 at once) * 4 sequences * 2 heads * 20000^2 * 4 bytes = 119.2 GiB
    with pytest.raises(
        ValueError, match=r"model\.block_size 20000: .* 10 x .* 119\.2 GiB, more than the 1\.0 GiB"
    ):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("operator", "matrices"), [("softmax", 10), ("bf16-exp", 10), ("lerp-k4", 20)])
def test_unfused_attention_is_checked_against_memory(make_config, monkeypatch, operator, matrices):
    """check_fits (docs/training.md): the bound counts the T x T matrices an unfused operator holds, more for
    a K-interval operator than for a baseline. (check_fits is called directly: a run that were not refused
    would allocate them.)"""
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: 2**30)
    cfg = make_config(
        **{"model.block_size": 20_000, "operator.name": operator, "operator.backend": "closed_form"}
    )
    need = matrices * 4 * 2 * 20_000**2 * 4 / 2**30
    with pytest.raises(ValueError, match=rf"{matrices} x .* = {need:.1f} GiB, more than the 1\.0 GiB"):
        trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))
    small = make_config(**{"operator.name": operator, "operator.backend": "closed_form"})  # T = 32: 0.6 MiB
    trainer_module.check_fits(small, small.model_config(512), 60_000, torch.device("cpu"))


def test_with_activation_checkpointing_the_bound_keeps_one_layer(make_config, monkeypatch):
    """A checkpointed layer keeps only its input: the bound counts the kept matrices of the one layer being
    recomputed (2 + 16 for lerp-k4), not 2 a layer; it refused 16-layer runs that fit."""
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: 2**30)
    cfg = make_config(**{"model.block_size": 20_000, "model.n_layer": 16, "operator.name": "lerp-k4",
                         "operator.backend": "closed_form", "activation_checkpointing": True})  # fmt: skip
    need = 18 * 4 * 2 * 20_000**2 * 4 / 2**30
    with pytest.raises(ValueError, match=rf"18 x .* = {need:.1f} GiB") as info:
        trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))
    assert "--activation-checkpointing" not in str(info.value)
    cfg = make_config(**{"model.block_size": 20_000, "model.n_layer": 16, "operator.name": "lerp-k4"})
    with pytest.raises(ValueError, match=r"48 x .*--micro-batch, --activation-checkpointing"):
        trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))


def test_sdpa_keeps_no_t_by_t_matrix_so_it_is_not_bounded(make_config, monkeypatch):
    """PyTorch's SDPA runs flash attention on the CPU too (a 16384-token CPU training step of the tiny model
    peaks at 0.7 GiB, where one layer's probabilities would be 4 GiB): check_fits does not bound it."""
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: 2**30)
    cfg = make_config(**{"model.block_size": 20_000, "operator.name": "sdpa"})
    trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))


MEMORY_STEP = """
import sys, torch
from kinterval.model.config import ModelConfig
from kinterval.model.gpt import GPT

def peak():  # this process's peak resident memory in bytes (ru_maxrss would start at the parent's at exec)
    line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

torch.set_num_threads(1)
cfg = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=1024, vocab_size=512)
model = GPT(cfg, sys.argv[1], backend="closed_form")
def step(T):
    x = torch.randint(0, 512, (1, T))
    model(x, x)[1].backward()
step(64)  # the allocator's and the model's own memory
before = peak()
step(1024)
print((peak() - before) / (2 * 1024**2 * 4))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc/self/status")
@pytest.mark.parametrize(("operator", "kind"), [("softmax", "baseline"), ("lerp-k4", "kinterval")])
def test_the_memory_bound_is_below_a_real_step_and_not_far_below(operator, kind):
    """check_fits's count of T x T matrices is a lower bound of what one training step (2 layers, 1 sequence,
    T = 1024, closed_form on the CPU) adds to the process's peak memory, within a factor 3 of it: a bound
    above it would refuse runs that fit, one far below lets runs through that the machine kills."""
    out = subprocess.run([sys.executable, "-c", MEMORY_STEP, operator], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    grown = float(out.stdout)  # in (1, 2, 1024, 1024) fp32 matrices
    bound = trainer_module.KEPT_PER_LAYER * 2 + trainer_module.AT_ONCE[kind]
    assert bound <= grown <= 3 * bound, (bound, grown)


def test_running_out_of_memory_mid_run_is_one_line_and_keeps_the_checkpoints(
    data_dir, tmp_path, monkeypatch, capsys
):
    """An allocation the machine refuses (here a real 1 TiB request to torch's CPU allocator at step 6, as a
    block size past the bound would make) ends `kinterval train` with one line and exit status 1, not a
    traceback; the checkpoints written before it stay, and --resume finishes the run."""
    real, calls = trainer_module.accumulate_gradients, []

    def allocate_at_step_6(*args, **kw):
        calls.append(1)
        if len(calls) == 6:
            torch.empty(2**40, dtype=torch.uint8)
        return real(*args, **kw)

    monkeypatch.setattr(trainer_module, "accumulate_gradients", allocate_at_step_6)
    flags = ["--data", str(data_dir), "--model", "tiny", "--block-size", "32", "--tokens", "2048",
             "--micro-batch", "4", "--accum", "2", "--device", "cpu", "--set", "model.n_embd=32",
             "--set", "checkpoint.count=4", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(["train", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kinterval train: error: out of memory on the CPU (tried to allocate 1024.00 GiB)")
    assert "--resume" in err and "Traceback" not in err and err.count("\n") == 1
    assert latest_checkpoint(tmp_path / "run").name == "step_000004"
    monkeypatch.setattr(trainer_module, "accumulate_gradients", real)
    assert main(["train", *flags, "--resume"]) == 0
    assert latest_checkpoint(tmp_path / "run").name == "step_000008"


def test_out_of_memory_messages_name_the_device_and_size():
    from kinterval.cli import is_out_of_memory, out_of_memory_message

    cuda = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
    )
    assert out_of_memory_message(cuda, "eval") == (
        "out of memory on the GPU (tried to allocate 2.00 GiB): this command needs more memory than is "
        "free on the device"
    )
    small = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 256 bytes")
    assert out_of_memory_message(small).startswith("out of memory on the CPU (tried to allocate 256 bytes): ")
    with pytest.raises(MemoryError) as info:
        np.ones(2**50)  # numpy's own: "Unable to allocate 8.00 PiB ..."
    assert is_out_of_memory(info.value)
    assert out_of_memory_message(info.value).startswith(
        "out of memory on the CPU (tried to allocate 8.00 PiB): "
    )
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_val_split_without_a_block_is_refused_before_any_step(make_config, tmp_path, monkeypatch):
    """With log.eval_every the run validates on the val split; a split shorter than one block of T+1 tokens
    is refused when the Trainer is built, not at the first validation after the steps up to it. (The test
    data's val split is 8193 tokens: no block of 8193 + 1.)"""
    from kinterval.train import distributed as D
    from kinterval.train.trainer import Trainer

    monkeypatch.setattr(trainer_module, "device_memory", lambda device: None)  # no memory bound here
    cfg = make_config(**{"model.block_size": 8193, "log.eval_every": 4, "schedule.micro_batch": 1,
                         "schedule.accum": 8, "schedule.tokens": 8193 * 8})  # fmt: skip
    with pytest.raises(
        ValueError, match=r"log\.eval_every: the val split of .* holds no block of 8193\+1 tokens"
    ):
        Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- 10. RNG states
def draws():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), np.random.randn(), random.random()  # noqa: NPY002


def test_a_run_seeds_numpys_and_pythons_global_generators_from_its_seed(make_config, tmp_path):
    """Besides torch (the model's init), a run seeds numpy's legacy global generator and python's ``random``
    from its seed, so user code and hooks draw the same numbers in every run of a seed (and other numbers
    under another seed); a resume then restores the checkpoint's states instead (test below)."""
    from kinterval.train import distributed as D
    from kinterval.train.trainer import Trainer

    for seed in (3, 4):
        Trainer(make_config(seed=seed), tmp_path / f"run{seed}", D.setup("cpu"))
        assert random.random() == random.Random(seed).random()
        assert np.random.rand() == np.random.RandomState(seed).rand()  # noqa: NPY002


def test_checkpoint_rng_states_round_trip(tmp_path):
    """rng.safetensors + state.json hold torch's, numpy's and python's generator states at the save: restoring
    them replays the same draws (numpy's cached Gaussian included)."""
    msd, state = tiny_state()
    torch.manual_seed(5)
    np.random.seed(6)  # noqa: NPY002
    random.seed(7)
    np.random.randn()  # noqa: NPY002 (leaves numpy a cached Gaussian)
    save_checkpoint(tmp_path, 1, msd, {}, state)
    want = draws()
    draws()  # move every generator on
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    C.restore_rng(ckpt.rng["tensors"], ckpt.rng["json"])
    assert draws() == want


def test_cuda_rng_states_are_restored_in_device_order(monkeypatch):
    """The keys torch_cuda_0..11 were sorted as text: device 2 got the state saved for device 10."""
    tensors, meta = C.capture_rng()
    tensors.update({f"torch_cuda_{i}": torch.full((4,), i, dtype=torch.uint8) for i in range(12)})
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 12)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: got.extend(int(s[0]) for s in states))
    C.restore_rng(tensors, meta)
    assert got == list(range(12))


def test_resume_restores_the_checkpoint_rng_states(runs, tmp_path):
    """docs/training.md §5: --resume restores the RNG states (as user code and hooks see them)."""
    from kinterval.train import distributed as D
    from kinterval.train.trainer import Trainer

    cfg, _ = runs
    run = copy_run(runs, "killed", tmp_path)
    ckpt = load_checkpoint(latest_checkpoint(run))
    C.restore_rng(ckpt.rng["tensors"], ckpt.rng["json"])
    want = draws()
    trainer = Trainer(cfg, run, D.setup("cpu"))  # seeds the generators from cfg.seed
    draws()  # and user code moves them on
    trainer.resume()
    assert trainer.done == 4 and draws() == want


def test_checkpoint_without_a_clip_count_counts_clips_from_the_resume(shared_config, tmp_path):
    """A checkpoint written before ``clipped_steps`` was recorded: ``clipped_frac`` after the resume is the
    fraction of the steps since the resume (nothing is known about the steps before it)."""
    cfg = shared_config(**{"optim.grad_clip": 1e-3})  # every step clips
    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=kill_at(5))
    ck = tmp_path / "run" / "checkpoints" / "step_000004"
    state = json.loads((ck / "state.json").read_text())
    del state["clipped_steps"]
    state["state_sha256"] = C.state_sha256(state)
    (ck / "state.json").write_text(json.dumps(state))
    train(cfg, tmp_path / "run", resume=True)
    rows = train_rows(tmp_path / "run")
    assert [r["clipped"] for r in rows] == [True] * 8
    assert [r["clipped_frac"] for r in rows] == [1.0] * 8  # 4/4 before, (s - 4)/(s - 4) after the resume


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_resave_killed_before_the_old_copy_is_gone_uses_the_new_one(tmp_path, monkeypatch, order):
    """A kill after the new ``step_*`` is in place but while its ``.old-step_*`` copy is being removed: both
    folders exist, and the new one is the checkpoint, whatever order the folder lists them in."""
    msd, state = tiny_state()
    save_checkpoint(tmp_path, 1, msd, {}, state)
    new = {k: v + 1 for k, v in msd.items()}
    real_rmtree = shutil.rmtree

    def rmtree(path, *a, **k):
        if os.path.basename(path).startswith(C.OLD_PREFIX):
            raise Killed
        real_rmtree(path, *a, **k)

    monkeypatch.setattr(C.shutil, "rmtree", rmtree)
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, 1, new, {}, state)
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert (root / "step_000001").is_dir() and (root / ".old-step_000001").is_dir()
    real_iterdir = type(root).iterdir
    monkeypatch.setattr(
        type(root), "iterdir", lambda p: iter(sorted(real_iterdir(p), reverse=order == "reversed"))
    )
    assert C.list_checkpoints(tmp_path) == [root / "step_000001"]
    path = latest_checkpoint(tmp_path)
    assert path == root / "step_000001"
    assert torch.equal(load_checkpoint(path).model["transformer.wte.weight"], new["transformer.wte.weight"])


def test_a_bad_token_id_in_the_middle_of_a_shard_is_refused_where_the_model_does_not_check(
    data_dir, make_config, tmp_path, monkeypatch
):
    """Opening a split checks the ids at both ends of each shard; the model checks ids only off CUDA. A
    corrupt id mid-shard used to train there silently, on a padding row of the embedding."""
    from kinterval.data import loader

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    shard = data / meta["splits"]["train"]["shards"][0]["file"]
    ids = np.memmap(shard, dtype=np.uint16, mode="r+")
    ids[len(ids) // 2 :] = meta["vocab_size"] + 3  # every window past the middle holds a bad id
    ids.flush()
    monkeypatch.setattr(loader, "VOCAB_CHECK_TOKENS", 100)  # the ends stay clean
    ids[-100:] = 0
    ids.flush()
    monkeypatch.setattr(GPT, "_check_ids", lambda self, what, ids: None)  # as on CUDA
    with pytest.raises(ValueError) as info:
        train(make_config(**{"data.dir": str(data)}), tmp_path / "run")
    # the message names the shard file and a token of it that holds the bad id
    said = re.fullmatch(
        rf"token id {meta['vocab_size'] + 3} >= vocab_size {meta['vocab_size']} at {re.escape(str(shard))} "
        r"\(token ([\d,]+) of that file\) \(a corrupt shard.*",
        str(info.value),
    )
    assert said, str(info.value)
    assert ids[int(said[1].replace(",", ""))] == meta["vocab_size"] + 3


# ---------------------------------------------------------------------- one process per run folder
def test_a_second_train_of_a_folder_in_training_is_refused(make_config, tmp_path, capsys):
    """Two processes training one folder (a suite rerun while the children of a killed --gpus parent still
    trained, a command started twice) both passed the no-checkpoint check and wrote the same checkpoints.
    Now the second is refused while the first holds the folder; a killed holder leaves no stale lock."""
    import subprocess
    import sys

    from kinterval.train.loop import run_lock

    cfg = make_config()
    out = tmp_path / "run"
    with run_lock(out):
        with pytest.raises(ValueError, match=f"is being trained by pid {os.getpid()} on "):
            train(cfg, out)
        assert main(["train", "--config", "tiny-cpu", "--data", cfg.data.dir, "--out", str(out)]) == 2
        assert "is being trained by pid" in capsys.readouterr().err
    assert latest_checkpoint(out) is None
    holder = subprocess.Popen(  # another process takes the lock, then is killed with it held
        [sys.executable, "-c", f"from kinterval.train.loop import run_lock\nwith run_lock({str(out)!r}):\n"
         "    print('held', flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ValueError, match=f"being trained by pid {holder.pid} "):
        train(cfg, out)
    holder.kill()
    holder.wait()
    assert train(cfg, out).status == "completed"  # the kernel released the dead holder's lock


@pytest.mark.parametrize("edit", ["no config", "no model_config", "config a string"])
@pytest.mark.parametrize("command", ["eval", "geometry"])
def test_a_state_json_without_its_configs_is_one_error_line(runs, tmp_path, capsys, command, edit):
    """eval and geometry read state.json unverified and indexed state["config"]: a KeyError / TypeError
    traceback. read_state now requires both configs to be JSON objects."""
    run = copy_run(runs, "full", tmp_path)
    ck = latest_checkpoint(run)
    state = json.loads((ck / "state.json").read_text())
    key = "model_config" if edit == "no model_config" else "config"
    if edit == "config a string":
        state["config"] = "x"
    else:
        del state[key]
    state["state_sha256"] = C.state_sha256(state)  # an edit its own hash cannot see
    (ck / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=f"lacks a valid '{key}' entry"):
        C.read_state(ck)
    assert main([command, "--run", str(run), "--checkpoint", "latest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"kinterval {command}: error: checkpoint {ck}: " in err, err
    assert f"lacks a valid '{key}' entry" in err


def test_the_memory_bound_skips_fused_kernels_and_devices_of_unknown_memory(make_config, monkeypatch):
    """The triton backend keeps no T x T matrix, and a device whose memory is unknown (device_memory None)
    bounds nothing: neither is refused, however long the block."""
    cfg = make_config(
        **{"model.block_size": 20_000, "operator.name": "lerp-k4", "operator.backend": "closed_form"}
    )
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: None)
    trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))
    monkeypatch.setattr(trainer_module, "device_memory", lambda device: 2**30)
    monkeypatch.setattr(trainer_module, "resolve_backend", lambda *a, **kw: "triton")
    trainer_module.check_fits(cfg, cfg.model_config(512), 60_000, torch.device("cpu"))


def test_an_out_of_memory_error_of_any_kind_is_recognised():
    """torch's CUDA OutOfMemoryError (whatever its text), a CUDA runtime "out of memory" error and a
    MemoryError are allocation failures; other RuntimeErrors are not. The GPU is named for torch's error
    without "CUDA" in its text (MPS) and for the CUDA runtime's; numpy's older "256. TiB" reads "256 TiB";
    1024 bytes are 1.00 KiB."""
    from kinterval.cli import is_out_of_memory, out_of_memory_message

    assert is_out_of_memory(torch.OutOfMemoryError("Tried to allocate 20.00 MiB"))  # no "CUDA" in it
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be ..."))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    mps = torch.OutOfMemoryError("MPS backend out of memory. Tried to allocate 20.00 MiB on private pool.")
    assert out_of_memory_message(mps).startswith("out of memory on the GPU (tried to allocate 20.00 MiB): ")
    cuda_runtime = RuntimeError("CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` ...")
    assert out_of_memory_message(cuda_runtime).startswith("out of memory on the GPU: ")
    old_numpy = MemoryError("Unable to allocate 256. TiB for an array with shape (2**45,)")
    assert out_of_memory_message(old_numpy).startswith(
        "out of memory on the CPU (tried to allocate 256 TiB): "
    )
    kib = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes")
    assert out_of_memory_message(kib).startswith("out of memory on the CPU (tried to allocate 1.00 KiB): ")


def test_the_command_line_reports_a_memory_error_and_keeps_other_runtime_errors(capsys):
    """A MemoryError (numpy's) is one line with exit 1, as torch's allocation failure; a RuntimeError that is
    no allocation failure is a bug and keeps its traceback."""
    from types import SimpleNamespace

    from kinterval.cli import _run

    def numpy_oom(args):
        np.ones(2**50)

    assert _run(SimpleNamespace(command="eval", func=numpy_oom)) == 1
    assert capsys.readouterr().err.startswith("kinterval eval: error: out of memory on the CPU")

    def bug(args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        _run(SimpleNamespace(command="eval", func=bug))
