"""Evaluation data must come from the training data's tokenizer: `eval`, `geometry`, `graddiag` and
`tau-screen` refuse data of another one, and accept another corpus of the same one."""

from __future__ import annotations

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
