"""``kinterval sample`` and :func:`kinterval.eval.sample.generate` (nanoGPT's sampler)."""

import json

import numpy as np
import pytest
import torch
from scipy import stats

from kinterval.cli import main
from kinterval.data.tokenizer import EOT, gpt2_encoding
from kinterval.eval.sample import generate, sample_run
from kinterval.model import GPT, ModelConfig


def tiny(vocab=64, block=16, operator="lerp-k4"):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=block, vocab_size=vocab)
    model = GPT(cfg, operator, "closed_form").eval()
    with torch.no_grad():  # a peaked next-token distribution, so that greedy and sampled paths differ
        model.lm_head.weight.mul_(40)
    return model


def last_logits(model, idx):
    with torch.no_grad():
        return model(idx[:, -model.config.block_size :])[0][:, -1, :].float()


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_non_finite_logits_are_refused_not_sampled(temperature):
    """A checkpoint of NaN weights printed token 0s greedily and stopped in torch.multinomial otherwise."""
    model = tiny()
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="logits hold NaN or infinite values"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 2, temperature=temperature)


def test_temperature_zero_and_top_one_are_greedy_and_the_context_is_cropped():
    model = tiny()
    idx = torch.randint(0, 64, (2, 20))  # longer than block_size 16
    want = idx
    for _ in range(6):
        want = torch.cat([want, last_logits(model, want).argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generate(model, idx, 6, temperature=0), want)
    g = torch.Generator().manual_seed(1)
    assert torch.equal(generate(model, idx, 6, temperature=1.0, top_k=1, generator=g), want)


def test_every_sampled_token_is_among_the_top_k_and_seeds_repeat():
    model = tiny()
    idx = torch.zeros(8, 1, dtype=torch.long)
    out = generate(model, idx, 12, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(0))
    for t in range(1, out.size(1)):
        top = torch.topk(last_logits(model, out[:, :t]), 3).indices
        assert (top == out[:, t : t + 1]).any(dim=1).all(), t
    again = generate(model, idx, 12, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(0))
    other = generate(model, idx, 12, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again) and not torch.equal(out, other)


def test_the_first_token_follows_softmax_of_logits_over_temperature():
    """6000 one-token samples of an 8-token vocabulary against softmax(logits / 0.7): chi-square."""
    model = tiny(vocab=8)
    with torch.no_grad():
        model.lm_head.weight.div_(8)  # spread enough that every token has a count
    idx = torch.full((6000, 3), 2, dtype=torch.long)
    out = generate(model, idx, 1, temperature=0.7, generator=torch.Generator().manual_seed(0))[:, -1]
    p = torch.softmax(last_logits(model, idx[:1]).double() / 0.7, dim=-1)[0].numpy()
    counts = np.bincount(out.numpy(), minlength=8)
    assert stats.chisquare(counts, p * counts.sum()).pvalue > 1e-3
    wrong = torch.softmax(last_logits(model, idx[:1]).double(), dim=-1)[0].numpy()  # temperature 1
    assert stats.chisquare(counts, wrong * counts.sum()).pvalue < 1e-6


def test_tiny_and_huge_temperatures_give_greedy_and_uniform_samples_not_nan():
    """logits / 1e-45 overflowed to inf (float32), and softmax of inf is NaN: torch.multinomial raised."""
    model = tiny()
    idx = torch.randint(0, 64, (4, 5))
    greedy = generate(model, idx, 5, temperature=0)
    for t in (1e-30, 1e-45, 1e-300, 5e-324):
        g = torch.Generator().manual_seed(0)
        assert torch.equal(generate(model, idx, 5, temperature=t, top_k=10, generator=g), greedy), t
        assert torch.equal(generate(model, idx, 5, temperature=t, generator=g), greedy), t
    out = generate(model, torch.zeros(4000, 1, dtype=torch.long), 1, temperature=1e300, generator=g)[:, -1]
    assert stats.chisquare(np.bincount(out.numpy(), minlength=64)).pvalue > 1e-3  # uniform


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"temperature": -1.0}, "temperature must be a number >= 0"), ({"temperature": float("inf")}, "finite"),
     ({"top_k": 0}, "top_k must be a positive integer"), ({"max_new_tokens": -1}, "max_new_tokens")],
)  # fmt: skip
def test_bad_sampling_settings_are_refused(kw, message):
    args = {"max_new_tokens": 2} | kw
    with pytest.raises(ValueError, match=message):
        generate(tiny(), torch.zeros(1, 1, dtype=torch.long), args.pop("max_new_tokens"), **args)


def test_a_gpt2_run_takes_and_prints_text(softmax_run, tmp_path, capsys):
    softmax_run(50257)
    run = tmp_path / "run"
    rows = sample_run(run, prompt="Hello world", max_new_tokens=5, samples=2, device="cpu")
    enc = gpt2_encoding()
    assert len(rows) == 2 and all(len(r["new_ids"]) == 5 for r in rows)
    assert rows[0]["ids"][:2] == enc.encode_ordinary("Hello world")
    assert rows[0]["text"] == enc.decode(rows[0]["ids"]) and rows[0]["text"].startswith("Hello world")
    assert sample_run(run, max_new_tokens=1, device="cpu")[0]["ids"][0] == EOT  # no prompt: <|endoftext|>
    # <|endoftext|> in a prompt is the token, as the printed text shows it (it was encoded as 7 tokens)
    (row,) = sample_run(run, prompt="A.<|endoftext|>B", max_new_tokens=1, device="cpu")
    assert row["ids"][:3] == [*enc.encode_ordinary("A."), EOT] and row["text"].startswith("A.<|endoftext|>B")
    assert main(["sample", "--run", str(run), "--prompt", "Hello world", "--tokens", "5", "--samples", "2",
                 "--device", "cpu"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert (
        out == rows[0]["text"] + "\n" + "-" * 40 + "\n" + rows[1]["text"] + "\n"
    )  # seed 0: the same samples


def test_any_run_takes_ids_and_refuses_text_without_gpt2_vocabulary(softmax_run, tmp_path, capsys):
    softmax_run(512)
    run = str(tmp_path / "run")
    assert (
        main(["sample", "--run", run, "--prompt-ids", "1, 2,3", "--tokens", "4", "--json", "--device", "cpu"])
        == 0
    )
    (row,) = json.loads(capsys.readouterr().out)
    assert row["ids"][:3] == [1, 2, 3] and len(row["new_ids"]) == 4 and row["text"] is None
    for argv, message in (
        (["--prompt", "hi"], "vocabulary (512 tokens) is not GPT-2's"),
        ([], "give --prompt-ids"),
        (["--prompt-ids", "1,512"], "prompt ids must lie in [0, 512), got [512]"),
        (["--prompt-ids", "1,x"], "--prompt-ids takes integers"),
        (["--prompt-ids", "1", "--samples", "0"], "samples must be a positive integer"),
        # torch took a negative seed silently and refused 2^64 with "Overflow when unpacking long long"
        (["--prompt-ids", "1", "--seed", "-1"], "seed must be an integer from 0 to 4294967295"),
        (["--prompt-ids", "1", "--seed", str(2**64)], "seed must be an integer from 0 to 4294967295"),
        # the library's message named its unset value (None), while the option's "no cut" is 0
        (["--prompt-ids", "1", "--top-k", "-3"], "--top-k must be an integer >= 0 (0: no top-k cut), got -3"),
    ):
        assert main(["sample", "--run", run, "--device", "cpu", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit):  # argparse: one or the other
        main(["sample", "--run", run, "--prompt", "a", "--prompt-ids", "1"])


def test_last_only_logits_are_the_last_row_of_the_full_logits():
    """Sampling asks the model for the last position's logits alone: (B, 1, vocab) instead of (B, T, vocab)
    (a 124M model at T = 1024 would otherwise hold 200 MB of logits per sample per token)."""
    model = tiny(vocab=50)
    idx = torch.randint(0, 50, (3, 16))
    with torch.no_grad():
        full, _ = model(idx)
        last, loss = model(idx, last_only=True)
    assert last.shape == (3, 1, 50) and loss is None
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="takes no targets"):
        model(idx, idx, last_only=True)


def test_a_top_k_of_the_whole_vocabulary_or_more_is_no_cut():
    """top_k >= the vocabulary (the default 200 on a small-vocabulary run) samples from every token, as
    top_k unset (torch.topk would fail on k > vocabulary)."""
    model, idx = tiny(vocab=64), torch.zeros(1, 3, dtype=torch.long)
    want = generate(model, idx, 6, top_k=None, generator=torch.Generator().manual_seed(1))
    for k in (64, 200):
        assert torch.equal(generate(model, idx, 6, top_k=k, generator=torch.Generator().manual_seed(1)), want)


def test_an_empty_text_prompt_starts_from_endoftext(softmax_run, tmp_path):
    softmax_run(50257)
    (row,) = sample_run(tmp_path / "run", prompt="", max_new_tokens=1, device="cpu")
    assert row["ids"][0] == EOT and len(row["ids"]) == 2 and len(row["new_ids"]) == 1


def test_top_one_is_greedy_where_the_largest_logits_tie():
    """The cut kept every logit >= the k-th, so top_k=1 with two tied largest logits drew between them
    (107/93 of 200), where greedy takes the lower id; bf16 logits on a GPU tie often enough."""

    class Tied(torch.nn.Module):
        config = ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=6)

        def forward(self, idx, last_only=False):
            logits = torch.tensor([0.0, 1.0, 3.0, 0.5, 3.0, 2.0]).expand(idx.size(0), idx.size(1), 6)
            return logits, None

    idx = torch.zeros(200, 1, dtype=torch.long)
    for k in (1, 2, 3):
        out = generate(Tied(), idx, 1, temperature=1.0, top_k=k, generator=torch.Generator().manual_seed(0))
        drawn = set(out[:, -1].tolist())
        assert drawn == {1: {2}, 2: {2, 4}, 3: {2, 4, 5}}[k], (k, drawn)
    assert torch.equal(generate(Tied(), idx[:1], 1, temperature=0)[:, -1], torch.tensor([2]))
