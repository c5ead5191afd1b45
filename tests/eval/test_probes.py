"""Synthetic probes: deterministic generators, verified structure, scoring, CLI path on a tiny checkpoint."""

import argparse
import json

import numpy as np
import pytest
import torch

from kinterval.eval import probes
from kinterval.eval.probes import EOT, PREFIX
from kinterval.model import GPT, ModelConfig
from kinterval.train.checkpoint import save_checkpoint
from kinterval.train.load import load_run

V = 1000


def test_generators_are_deterministic():
    a1, _ = probes.all_samples(3, V, 1024, seed=5)
    a2, _ = probes.all_samples(3, V, 1024, seed=5)
    b, _ = probes.all_samples(3, V, 1024, seed=6)
    assert [s.tokens for s in a1] == [s.tokens for s in a2]
    assert [s.tokens for s in a1] != [s.tokens for s in b]


def test_induction_structure_and_skipped_distances():
    samples, skipped = probes.induction_samples(4, V, 300, seed=0)
    assert skipped == [512, 896]  # PREFIX + d + 1 > 300
    by = {(s.family, s.param, s.condition): s for s in samples}
    assert len(by) == 4 * 3 * 2
    for (f, d, cond), s in by.items():
        t = s.tokens
        assert len(t) == PREFIX + d + 2 and s.score_pos == [PREFIX + d]
        a, b = t[PREFIX + d], t[PREFIX + d + 1]
        assert a != b and EOT not in t
        if cond == "induction":
            assert t[PREFIX] == a and t[PREFIX + 1] == b and t.count(a) == 2 and t.count(b) == 2
            assert t[PREFIX + d] == t[PREFIX]  # the A at distance d recurs
        else:
            control = t
            induction = by[(f, d, "induction")].tokens
            assert control.count(a) == 1 and control.count(b) == 1  # no earlier occurrence
            diff = [i for i in range(len(t)) if control[i] != induction[i]]
            assert diff == [PREFIX, PREFIX + 1]  # matched: only the earlier bigram differs
    # one family shares its bigram and filler across distances
    s64, s128 = by[(0, 64, "induction")].tokens, by[(0, 128, "induction")].tokens
    assert s64[:PREFIX] == s128[:PREFIX] and s64[PREFIX] == s128[PREFIX]


def test_retrieval_and_copy_structure():
    samples, skipped = probes.retrieval_samples(3, V, 1024, seed=0)
    assert skipped == [] and len(samples) == 3 * 3 * 2
    for s in samples:
        keys, values = s.tokens[0 : 2 * s.param : 2], s.tokens[1 : 2 * s.param : 2]
        assert len(set(keys)) == s.param and not set(keys) & set(values)
        i = keys.index(s.tokens[-2])
        assert s.tokens[-1] == values[i] and s.score_pos == [2 * s.param]
        q = max(1, s.param // 4)
        assert (i >= s.param - q) if s.condition == "near" else (i < q)
    copies, skipped = probes.copy_samples(3, V, 200, seed=0)
    assert skipped == [128]
    for s in copies:
        L, t = s.param, s.tokens
        sep = t[PREFIX + L]
        assert sep == V - 1 and sep not in t[: PREFIX + L] and t[PREFIX : PREFIX + L] == t[PREFIX + L + 1 :]
        assert s.score_pos == list(range(PREFIX + L, PREFIX + 2 * L))


class InductionStub(torch.nn.Module):
    """Predicts, at each position, the token that followed the previous occurrence of the current token."""

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, V)
        for b in range(B):
            seen = {}
            for i in range(T):
                tok = int(idx[b, i])
                if tok in seen:
                    logits[b, i, int(idx[b, seen[tok] + 1])] = 10.0
                if i + 1 < T:
                    seen[tok] = i
        return logits, None


def test_copying_model_has_positive_induction_gain():
    samples, _ = probes.all_samples(6, V, 300, seed=0)
    rows = probes.score(InductionStub(), samples)
    table = probes.summarize(rows, n_resamples=200)
    gain = next(r for r in table if r["metric"] == "gain" and r["param"] == "all")
    assert gain["mean"] > 5 and gain["lo"] > 0 and gain["n"] == 6 * 3
    acc = {(r["probe"], r["condition"], r["param"]): r["mean"] for r in table if r["metric"] == "acc"}
    assert acc[("A", "induction", 64)] == 1.0 and acc[("A", "control", 64)] == 0.0
    assert acc[("B", "near", 16)] == 1.0 and acc[("C", "copy", 32)] > 0.9


def make_run(root, operator="fwm-prob-k4", block=160):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=block, vocab_size=V)
    model = GPT(cfg, operator, "closed_form")
    state = {"step": 1, "config": {"operator": {"name": operator, "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(root, 1, model.state_dict(), {}, state)
    return root


def test_cli_probes_on_tiny_checkpoint(tmp_path, capsys):
    from kinterval.eval import downstream_commands

    run = make_run(tmp_path / "run")
    parser = argparse.ArgumentParser()
    downstream_commands.register(parser.add_subparsers())
    for op in (None, "softmax"):
        argv = ["probes", "--run", str(run), "--families", "3", "--out", str(tmp_path / f"p-{op}")]
        args = parser.parse_args(argv + (["--operator", op] if op else []))
        assert args.func(args) == 0
    assert "skipped" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "p-None" / "samples.jsonl").read_text().splitlines()]
    assert {r["probe"] for r in rows} == {"A", "B", "C"} and all(np.isfinite(r["nll"]) for r in rows)
    summary = json.loads((tmp_path / "p-None" / "summary.json").read_text())
    assert summary["skipped"]["A"] == [256, 512, 896] and summary["operator"] == "fwm-prob-k4"
    table = probes.probe_tables(tmp_path / "p-softmax")
    assert table[0]["operator"] == "softmax" and {"probe", "metric", "param", "mean", "lo", "hi"} <= set(
        table[0]
    )


@pytest.mark.parametrize("bad", ["nope"])
def test_missing_checkpoint_is_a_clear_error(tmp_path, bad):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_run(tmp_path / bad)
