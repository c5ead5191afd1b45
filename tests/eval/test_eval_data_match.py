"""Evaluation data must come from the training data's tokenizer: `eval`, `geometry`, `graddiag` and
`tau-screen` refuse data of another one, and accept another corpus of the same one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from kinterval.cli import main
from kinterval.data.prepare import prepare
from kinterval.train.config import TrainConfig
from kinterval.train.loop import train


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """A tiny softmax run trained on GPT-2 BPE data (vocab 50257), the synthetic corpus (vocab 512, eot 511)
    and a held-out GPT-2 BPE corpus of other documents (another source, shards and token count)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("datamatch")
    for name, words in (("train_docs", "alpha beta gamma"), ("heldout_docs", "delta epsilon")):
        (root / name).mkdir()
        for i in range(40):
            (root / name / f"d{i}.txt").write_text(f"{words} {i} " * 120)
    prepare(f"text:{root / 'train_docs'}", root / "gpt2", progress=False)
    prepare(f"text:{root / 'heldout_docs'}", root / "heldout", split="val", progress=False)
    prepare("synthetic", root / "syn", tokens=20_000, seed=0, progress=False)
    cfg = TrainConfig.from_toml("tiny-cpu").override(
        {
            "data.dir": str(root / "gpt2"),
            "model.n_layer": 1,
            "model.n_embd": 16,
            "model.n_head": 2,
            "model.block_size": 32,
            "schedule.tokens": 512,
            "schedule.warmup_tokens": 256,
            "schedule.micro_batch": 8,
            "checkpoint.count": 1,
            "log.progress": False,
            "operator.backend": "closed_form",
        }  # fmt: skip
    )
    train(cfg, root / "run")
    cwd = Path.cwd()
    try:  # a run trained with a relative data folder (`--data gpt2` in the folder above it)
        os.chdir(root)
        train(cfg.override({"data.dir": "gpt2"}), root / "relative")
    finally:
        os.chdir(cwd)
    return root


COMMANDS = {
    "eval": ["--max-blocks", "2", "--quiet"],
    "geometry": ["--blocks", "2"],
    "graddiag": ["--blocks", "2"],
    "tau-screen": ["--stages", "3", "--K", "4", "--taus", "6", "--max-blocks", "2", "--resamples", "20"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_data_of_another_tokenizer_is_refused(gpt2_run, tmp_path, capsys, command):
    """A GPT-2 BPE model evaluated on the synthetic corpus used to print an NLL (or a probe) and exit 0: only
    data with a larger vocabulary than the model's was refused."""
    argv = [command, "--run", str(gpt2_run / "run"), "--data", str(gpt2_run / "syn"), "--split", "val"]
    assert main(argv + ["--device", "cpu", "--out", str(tmp_path / "out")] + COMMANDS[command]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"kinterval {command}: error:" in err
    assert "syn/meta.json: vocab_size 512" in err and "with vocab_size 50257" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_another_corpus_of_the_same_tokenizer_is_accepted(gpt2_run, tmp_path, capsys, command):
    """Held-out corpora (WikiText, PTB, C4 for a FineWebEdu run) differ in source, shards and token counts."""
    argv = [command, "--run", str(gpt2_run / "run"), "--data", str(gpt2_run / "heldout"), "--split", "val"]
    assert main(argv + ["--device", "cpu", "--out", str(tmp_path / "out")] + COMMANDS[command]) == 0
    assert capsys.readouterr().err.strip() == ""
    assert any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_training_data_folder_is_checked_before_it_is_the_default(
    gpt2_run, tmp_path, monkeypatch, capsys, command
):
    """Without --data every command reads the folder the checkpoint was trained on, a path as it was typed:
    a relative one read from another working directory that held another corpus under that name was
    evaluated (exit 0, the run's own result replaced). Now the folder's training split must be the one the
    checkpoint records (its shard hashes); else, or when there is no such folder, a one-line error."""
    shutil.copytree(gpt2_run / "relative", tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    argv = [command, "--run", "run", "--device", "cpu", "--out", "out", "--split", "val", *COMMANDS[command]]

    def refused(why):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and why in err and "'gpt2' (relative to the folder training ran" in err, err
        assert "(--data)" in err, err
        assert not (tmp_path / "out").exists()

    refused("which holds no prepared data here")
    shutil.copytree(gpt2_run / "heldout", tmp_path / "gpt2")  # another corpus, no train split
    refused("it has no train split there")
    shutil.rmtree(tmp_path / "gpt2")
    prepare(f"text:{gpt2_run / 'heldout_docs'}", tmp_path / "gpt2", progress=False)  # another train split
    refused("its train split there is other data")
    shutil.rmtree(tmp_path / "gpt2")
    shutil.copytree(gpt2_run / "gpt2", tmp_path / "gpt2")  # the training data itself: its val split is empty
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "gpt2: the val split holds no block of 32+1 tokens (0 tokens)" in err and "(--split)" in err, err
    argv[argv.index("val")] = "train"
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_shard_that_is_not_what_meta_json_lists_is_refused(gpt2_run, tmp_path, capsys, command):
    """One token changed in a held-out shard (sizes and vocabulary intact) was scored with exit 0, and the
    result stored under meta.json's shard hashes; after a restore, `eval` served that result as cached."""
    data = tmp_path / "heldout"
    shutil.copytree(gpt2_run / "heldout", data)
    (shard,) = data.glob("val_*.bin")
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 1  # token 0 stays below the vocabulary size
    shard.write_bytes(bytes(raw))
    argv = [command, "--run", str(gpt2_run / "run"), "--data", str(data), "--split", "val", "--device", "cpu"]
    assert main(argv + ["--out", str(tmp_path / "out")] + COMMANDS[command]) == 2
    err = capsys.readouterr().err
    assert f"{shard.name}: sha256 does not match meta.json" in err and not (tmp_path / "out").exists(), err
    meta = json.loads((data / "meta.json").read_text())
    del meta["splits"]["val"]["shards"][0]["sha256"]  # a hand-made meta.json: named, not a KeyError
    (data / "meta.json").write_text(json.dumps(meta))
    assert main(argv + ["--out", str(tmp_path / "out")] + COMMANDS[command]) == 2
    assert "meta.json records no sha256 for it" in capsys.readouterr().err
