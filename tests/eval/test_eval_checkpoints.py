"""Evaluation selects checkpoints as training lists and finds them (one listing, one lookup)."""

from __future__ import annotations

import os

import pytest
import torch

from kinterval.eval.checkpoints import checkpoint_name, select_checkpoints
from kinterval.eval.evaluate import result_paths
from kinterval.model import GPT, ModelConfig
from kinterval.train import checkpoint as C


@pytest.fixture
def run(tmp_path):
    """Checkpoints at steps 2, 4, 999999 and 1000000; step 4 left only as ``.old-step_000004`` (a kill
    between the two renames of its re-save)."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16)
    weights = GPT(cfg).state_dict()
    run = tmp_path / "run"
    for step in (2, 4, 999_999, 1_000_000):
        C.save_checkpoint(run, step, weights, {}, {"step": step, "model_config": cfg.to_dict()})
    root = C.checkpoint_dir(run)
    os.replace(root / "step_000004", root / ".old-step_000004")
    return run


def test_all_is_training_s_listing_by_step(run):
    """The eval listing used to skip the ``.old-`` copy and sort by name (step_1000000 before step_999999)."""
    root = C.checkpoint_dir(run)
    want = [root / n for n in ("step_000002", ".old-step_000004", "step_999999", "step_1000000")]
    assert C.list_checkpoints(run) == want
    assert select_checkpoints(run) == select_checkpoints(run, "all") == want
    # a checkpoint folder given as the run: all is that one (it was "no checkpoints under CKPT/checkpoints")
    assert select_checkpoints(want[0]) == select_checkpoints(want[0], "all") == [want[0]]


def test_one_checkpoint_by_step_latest_or_path(run, tmp_path, monkeypatch):
    root = C.checkpoint_dir(run)
    assert select_checkpoints(run, 4) == select_checkpoints(run, "4") == [root / ".old-step_000004"]
    assert select_checkpoints(run, "latest") == [C.latest_checkpoint(run)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a path relative to the run folder, as find_checkpoint takes it
    assert select_checkpoints(run, "checkpoints/step_000002") == [run / "checkpoints" / "step_000002"]
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 3 .*'step_000002'"):
        select_checkpoints(run, 3)
    with pytest.raises(FileNotFoundError, match="no checkpoint 'nowhere'"):
        select_checkpoints(run, "nowhere")


def test_results_of_an_old_copy_are_filed_under_its_step(run, tmp_path):
    """The ``.old-step_*`` copy stands for its step: its results are ``step_000004.*``, not hidden files."""
    old = C.checkpoint_dir(run) / ".old-step_000004"
    assert checkpoint_name(old) == checkpoint_name(old.with_name("step_000004")) == "step_000004"
    assert [p.name for p in result_paths(tmp_path, old)] == ["step_000004.npz", "step_000004.json"]
