"""lm-eval adapter: offline local tasks through lm_eval.simple_evaluate on a tiny random-init checkpoint."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

from kinterval.data.tokenizer import EOT, gpt2_encoding  # noqa: E402
from kinterval.eval.downstream import run_downstream  # noqa: E402
from kinterval.eval.downstream_compare import downstream_compare  # noqa: E402
from kinterval.model import GPT, ModelConfig  # noqa: E402
from kinterval.train.checkpoint import save_checkpoint  # noqa: E402
from kinterval.train.load import load_run  # noqa: E402

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("lm_eval_adapter")

DATA = Path(__file__).parent / "data"


def make_run(root: Path, operator="fwm-prob-k4", seed=0, block=64, vocab=50257, data=None) -> Path:
    """A run folder with one checkpoint of a random-init GPT over the GPT-2 vocabulary (or ``vocab``)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=block, vocab_size=vocab)
    model = GPT(cfg, operator, "closed_form")
    state = {"step": 1, "config": {"operator": {"name": operator, "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    if data is not None:
        state["config"]["data"] = {"dir": str(data)}
    save_checkpoint(root, 1, model.state_dict(), {}, state)
    return root


@pytest.fixture(scope="module", autouse=True)
def index_task_folders_once():
    """lm-eval walks every YAML of its built-in tasks for each TaskManager (10-20 s on CI's two cores,
    once per lm-eval call). The folders cannot change while this module runs, so each is walked once and
    the walk reused, merged in the same order (a later folder overrides an earlier one). Test-only: product
    code runs lm-eval unchanged. Without this private hook (another lm-eval layout) tests only run slower."""
    try:
        from lm_eval.tasks._index import TaskIndex
    except ImportError:
        yield
        return
    build, walked = TaskIndex.build, {}

    def build_once(paths, *, resolve_includes=True):
        index = {}
        for path in paths:
            key = (str(path), resolve_includes)
            if key not in walked:
                walked[key] = build([path], resolve_includes=resolve_includes)
            index.update(walked[key])
        return index

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TaskIndex, "build", staticmethod(build_once))
        yield


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


@pytest.fixture
def in_data(monkeypatch):
    monkeypatch.chdir(DATA)  # the task YAMLs name their JSONL relative to the working directory
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def direct_logprob(model, ctx: list[int], cont: list[int]) -> float:
    x = torch.tensor([ctx + cont])
    with torch.no_grad():
        logits, _ = model(x[:, :-1])
    lp = torch.log_softmax(logits.float(), -1)[0, len(ctx) - 1 :]
    return lp.gather(-1, torch.tensor(cont)[:, None]).sum().item()


def test_multiple_choice_and_rolling_match_direct_nll(run, tmp_path, in_data):
    out = tmp_path / "native"
    summary = run_downstream(run, ["kinterval_tiny_mc", "kinterval_tiny_ppl"], out=out, include_path=DATA)
    assert summary["operator"] == "fwm-prob-k4" and summary["checkpoint_step"] == 1
    assert summary["backend"] == "closed_form"  # "auto" on the CPU, as resolved (no CUDA for triton)
    model = load_run(run).model
    enc = gpt2_encoding()
    docs = [json.loads(line) for line in (DATA / "tiny_mc.jsonl").read_text().splitlines()]
    items = [json.loads(line) for line in (out / "kinterval_tiny_mc.jsonl").read_text().splitlines()]
    assert [it["doc_id"] for it in items] == list(range(len(docs)))
    for it, doc in zip(items, docs):
        ctx = enc.encode_ordinary(doc["question"])
        want = [direct_logprob(model, ctx, enc.encode_ordinary(" " + c)) for c in doc["choices"]]
        np.testing.assert_allclose(it["loglikelihoods"], want, rtol=0, atol=1e-5)
        assert it["metrics"]["acc"] == float(np.argmax(want) == doc["label"])
    # rolling: total log-likelihood after an EOT prefix, in disjoint 64-token windows (T = 64)
    texts = [json.loads(line)["text"] for line in (DATA / "tiny_text.jsonl").read_text().splitlines()]
    rolled = [json.loads(line) for line in (out / "kinterval_tiny_ppl.jsonl").read_text().splitlines()]
    n_two = 0
    for it, text in zip(rolled, texts):
        toks = enc.encode_ordinary(text)
        want = direct_logprob(model, [EOT], toks[:64])
        if len(toks) > 64:  # second window: the last 64 tokens as input, scoring tokens 64.. only
            assert len(toks) <= 128
            want += direct_logprob(model, toks[len(toks) - 65 : 64], toks[64:])
            n_two += 1
        np.testing.assert_allclose(it["loglikelihoods"][0], want, rtol=0, atol=1e-4)
    assert n_two == 1


def test_generate_until_and_softmax_substitution(run, tmp_path, in_data):
    out = tmp_path / "softmax"
    summary = run_downstream(run, ["kinterval_tiny_gen", "kinterval_tiny_mc"], out=out, include_path=DATA,
                             operator="softmax", limit=3)  # fmt: skip
    assert summary["operator"] == "softmax" and summary["native_operator"] == "fwm-prob-k4"
    gen = [json.loads(line) for line in (out / "kinterval_tiny_gen.jsonl").read_text().splitlines()]
    assert len(gen) == 3 and all(isinstance(g["responses"][0], str) for g in gen)
    # greedy output equals a direct greedy decode of the substituted model (up to 8 tokens, stop at . or \n)
    model = load_run(run, operator="softmax").model
    enc = gpt2_encoding()
    doc = json.loads((DATA / "tiny_gen.jsonl").read_text().splitlines()[0])
    toks, new = enc.encode_ordinary(doc["question"]), []
    for _ in range(8):
        with torch.no_grad():
            nxt = int(model(torch.tensor([toks + new]))[0][0, -1].argmax())
        if nxt == EOT:
            break
        new.append(nxt)
        if any(u in enc.decode(new) for u in ("\n", ".")):
            break
    want = enc.decode(new).split("\n")[0].split(".")[0]
    assert gen[0]["responses"][0] == want


def test_downstream_compare_paired(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    rng = np.random.default_rng(0)
    for folder, shift in ((a, 0.0), (b, 0.3)):
        with open(folder / "t.jsonl", "w") as fh:
            for i in range(40):
                acc = float(rng.random() < 0.4 + shift)
                fh.write(
                    json.dumps(
                        {
                            "doc_id": i,
                            "metrics": {"acc": acc, "f1": 0.5},
                            "loglikelihoods": [-1.0, -2.0],
                            "is_greedy": [True, False],
                        }
                    )
                    + "\n"
                )
    rows = downstream_compare(a, b)
    by = {r["metric"]: r for r in rows}
    assert set(by) == {"acc", "f1"} and by["acc"]["n"] == 40
    assert by["acc"]["lo"] <= by["acc"]["diff"] <= by["acc"]["hi"]
    assert 0 < by["acc"]["p"] <= 1 and by["acc"]["q"] >= by["acc"]["p"]
    assert by["f1"]["diff"] == 0 and by["f1"]["p"] == 1.0


def cli(argv):
    """Run one of this module's commands through its own parser (independent of the other layers' CLIs)."""
    import argparse

    from kinterval.eval import downstream_commands

    parser = argparse.ArgumentParser()
    downstream_commands.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_downstream_and_compare(run, tmp_path, in_data, capsys):
    args = ["--run", str(run), "--tasks", "kinterval_tiny_mc", "--include-path", str(DATA), "--limit", "4"]
    assert cli(["downstream", *args, "--out", str(tmp_path / "n")]) == 0
    assert cli(["downstream", *args, "--operator", "softmax", "--out", str(tmp_path / "s")]) == 0
    assert cli(["downstream-compare", str(tmp_path / "s"), str(tmp_path / "n")]) == 0
    assert "kinterval_tiny_mc" in capsys.readouterr().out


def test_downstream_names_a_missing_include_path(run, tmp_path, capsys):
    """A misspelt --include-path was passed on to lm-eval, which said only that the task was not found."""
    from kinterval.cli import main

    args = ["--run", str(run), "--tasks", "kinterval_tiny_mc", "--include-path", str(tmp_path / "nope")]
    assert main(["downstream", *args, "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--include-path" in err and "no such folder" in err and not (tmp_path / "o").exists()


def test_kinterval_lm_eval_command_runs_a_local_task(run, tmp_path, in_data, capsys):
    from kinterval import cli

    argv = ["lm-eval", "--model_args", f"run={run},device=cpu", "--tasks", "kinterval_tiny_mc",
            "--include_path", str(DATA), "--device", "cpu", "--limit", "3",
            "--output_path", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "kinterval_tiny_mc" in out and "acc" in out
    (results,) = tmp_path.rglob("results_*.json")
    assert json.loads(results.read_text())["results"]["kinterval_tiny_mc"]["acc,none"] in (
        0.0,
        1 / 3,
        2 / 3,
        1.0,
    )


def test_model_args_are_checked_and_device_merged(run, tmp_path, in_data, capsys):
    from kinterval import cli
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    with pytest.raises(ValueError, match="unknown --model_args for the kinterval model: operater"):
        KIntervalLM.create_from_arg_string(f"run={run},operater=softmax", {"device": "cpu"})
    lm = KIntervalLM.create_from_arg_string(f"run={run},device=cpu", {"device": "cuda:0", "batch_size": 2})
    assert lm._device == torch.device("cpu") and lm.batch_size == 2
    argv = ["lm-eval", "--model_args", f"run={run},operater=softmax", "--tasks", "kinterval_tiny_mc",
            "--include_path", str(DATA), "--limit", "1"]  # fmt: skip
    assert cli.main(argv) == 2
    assert "operater" in capsys.readouterr().err


def test_vocabulary_and_tokenizer_checked_before_scoring(tmp_path):
    from kinterval.data import prepare
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    synthetic_run = make_run(tmp_path / "syn", vocab=512)
    with pytest.raises(ValueError, match="vocabulary of 512 ids.*GPT-2 BPE"):
        KIntervalLM(run=str(synthetic_run))
    data = tmp_path / "data"
    prepare("synthetic", data, tokens=2000, progress=False)
    other = make_run(tmp_path / "other", data=data)  # GPT-2-sized, but trained on synthetic tokens
    with pytest.raises(ValueError, match="tokenized with 'synthetic'"):
        KIntervalLM(run=str(other))


def test_kinterval_lm_eval_without_tasks_is_one_error_line(capsys):
    """lm-eval itself raised "No tasks specified" as a ValueError traceback."""
    from kinterval import cli

    assert cli.main(["lm-eval", "--model_args", "run=somewhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval lm-eval: error: kinterval lm-eval needs --tasks") and "\n" not in err


def test_continuation_longer_than_the_context_is_refused(run):
    """As lm-eval's HFLM: a continuation over block_size (64) cannot be scored; it wrapped around (negative
    positions) and gave a wrong log-likelihood silently. One of exactly block_size tokens is scored."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    toks = gpt2_encoding().encode_ordinary(" the cat sat on the mat." * 20)
    ctx, cont = toks[:5], toks[5:69]
    ((ll, _),) = lm._loglikelihood_tokens([(None, ctx, cont)])
    np.testing.assert_allclose(ll, direct_logprob(lm.model, ctx[-1:], cont), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="continuation of 65 tokens is longer than the model's context"):
        lm._loglikelihood_tokens([(None, ctx, toks[5:70])])


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_continuation_that_encodes_to_no_tokens_is_refused(run, batch_size):
    """lm-eval encodes context + continuation together: "hello wor" + "ld" is ([hello, " world"], []), the
    continuation absorbed by the context's last token. It scored 0.0 and greedy (so that choice won a
    multiple-choice item silently), or, alone with a one-token context, failed deep in the model. As HFLM,
    it is refused, naming the request."""
    from lm_eval.api.instance import Instance

    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run), batch_size=batch_size)
    reqs = [
        Instance("loglikelihood", {}, pair, i)
        for i, pair in enumerate([(" the cat", " sat"), ("hello wor", "ld")])
    ]
    with pytest.raises(
        ValueError, match=r"continuation 'ld' after the context ending 'hello wor' encodes to no"
    ):
        lm.loglikelihood(reqs)
    with pytest.raises(ValueError, match="encodes to no tokens"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("a", "b"), 0)])


@pytest.mark.parametrize("value, want", [(None, 1), ("auto", 1), ("auto:4", 1), (3, 3), ("8", 8)])
def test_batch_size_accepts_integers_and_auto(value, want):
    from kinterval.eval.lm_eval_adapter import parse_batch_size

    assert parse_batch_size(value) == want


@pytest.mark.parametrize("value", [0, "0", "-1", "auto:0", "four", "2.5"])
def test_batch_size_must_be_positive(value):
    from kinterval.eval.lm_eval_adapter import parse_batch_size

    with pytest.raises(ValueError, match="use a positive integer, auto or auto:N"):
        parse_batch_size(value)


def test_model_args_device_auto_is_resolved_as_load_run(run):
    """torch.device("auto") raised a RuntimeError although load_run accepts "auto"."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM
    from kinterval.train.distributed import pick_device

    lm = KIntervalLM.create_from_arg_string(f"run={run},device=auto", {"device": "cuda:0"})
    assert lm._device == pick_device("auto") == next(lm.model.parameters()).device


def _lm_eval_cli(run, *extra):
    from kinterval import cli

    argv = ["lm-eval", "--model_args", f"run={run}", "--include_path", str(DATA), "--device", "cpu",
            "--limit", "2", *extra]  # fmt: skip
    return cli.main(argv)


def test_kinterval_lm_eval_batch_size_auto_n_runs(run, in_data, capsys):
    """lm-eval's --batch_size auto:4 gave int('auto') a traceback."""
    assert _lm_eval_cli(run, "--tasks", "kinterval_tiny_mc", "--batch_size", "auto:4") == 0
    assert "kinterval_tiny_mc" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tasks", "kinterval_tiny_mc", "--batch_size", "0"], "batch_size '0': use a positive integer"),
        (["--tasks", "no_such_task"], "lm-eval: Tasks not found: no_such_task"),
        (["--tasks", "kinterval_tiny_mc", "-M", "dummy"], "sets --model kinterval itself"),
        (["--tasks", "kinterval_tiny_mc", "-Mdummy"], "sets --model kinterval itself"),
    ],
)
def test_kinterval_lm_eval_bad_options_are_one_error_line(run, in_data, capsys, extra, message):
    """A zero batch size (range() step 0), an unknown task (lm-eval's ValueError) and -M (another model) were
    tracebacks or ran another model; each is one error line, exit 2."""
    assert _lm_eval_cli(run, *extra) == 2
    err = capsys.readouterr().err.strip()  # lm-eval logs its warnings to stderr first
    (line,) = [x for x in err.splitlines() if x.startswith("kinterval lm-eval: error: ")]
    assert message in line and err.endswith(line)


def test_lambada_per_item_perplexity_is_the_target_loglikelihood(run, tmp_path, in_data):
    """lm-eval logs a loglikelihood task's per-item "perplexity" as the target's log-likelihood (its aggregate
    is exp(-mean)); downstream-compare showed it as a row "perplexity" of about -15."""
    out = tmp_path / "lambada"
    run_downstream(run, ["kinterval_tiny_lambada"], out=out, include_path=DATA)
    model, enc = load_run(run).model, gpt2_encoding()
    texts = [json.loads(line)["text"].strip() for line in (DATA / "tiny_text.jsonl").read_text().splitlines()]
    want = []
    for text in texts:
        *words, last = text.split(" ")
        ctx, cont = enc.encode_ordinary(" ".join(words)), enc.encode_ordinary(" " + last)
        want.append(direct_logprob(model, ctx[-(64 + 1 - len(cont)) :], cont))  # the adapter keeps T inputs
    rows = {r["metric"]: r for r in downstream_compare(out, out, n_resamples=50, n_perm=50)}
    assert set(rows) == {"acc", "loglikelihood"}
    assert rows["loglikelihood"]["baseline"] == pytest.approx(np.mean(want), abs=1e-4)


def test_a_task_with_two_filters_gives_each_metric_per_filter(run, tmp_path, in_data):
    """lm-eval logs one sample per (doc, filter): keyed by doc_id alone, the second filter's sample silently
    replaced the first's."""
    out = tmp_path / "filters"
    run_downstream(run, ["kinterval_tiny_filters"], out=out, include_path=DATA)
    logged = [json.loads(line) for line in (out / "kinterval_tiny_filters.jsonl").read_text().splitlines()]
    n_docs = len((DATA / "tiny_gen.jsonl").read_text().splitlines())
    assert len(logged) == 2 * n_docs and {r["filter"] for r in logged} == {"whole", "first-word"}
    rows = downstream_compare(out, out, n_resamples=50, n_perm=50)
    assert {(r["metric"], r["n"]) for r in rows} == {
        ("exact_match,whole", n_docs),
        ("exact_match,first-word", n_docs),
    }


def greedy_next(model, toks: list[int]) -> int:
    with torch.no_grad():
        return int(model(torch.tensor([toks]))[0][0, -1].argmax())


def test_greedy_flag_needs_every_continuation_token_to_be_the_argmax(run):
    """lm-eval's is_greedy (LAMBADA's acc): True only when each continuation token is the model's argmax."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    ctx = gpt2_encoding().encode_ordinary(" the cat sat on the mat")
    greedy = []
    for _ in range(3):
        greedy.append(greedy_next(lm.model, ctx + greedy))
    other = (greedy[0] + 1) % 50257  # not the argmax after ctx
    late = [other, greedy_next(lm.model, ctx + [other])]  # first token not greedy, the last one is
    mixed = [greedy[0], (greedy[1] + 1) % 50257]  # first token greedy, the last one not
    got = lm._loglikelihood_tokens([(None, ctx, c) for c in (greedy, late, mixed)])
    assert [flag for _, flag in got] == [True, False, False]


def test_batched_requests_of_different_lengths_score_as_single_ones(run):
    """batch_size 3: each request keeps its own row and positions (right padding), as scored one by one."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run), batch_size=3)
    toks = gpt2_encoding().encode_ordinary(" the cat sat on the mat and looked at the dog by the door")
    reqs = [(toks[:2], toks[2:5]), (toks[:9], toks[9:11]), (toks[:4], toks[4:5]), (toks[:6], toks[6:8])]
    got = lm._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in reqs])
    want = [direct_logprob(lm.model, ctx, cont) for ctx, cont in reqs]
    np.testing.assert_allclose([ll for ll, _ in got], want, rtol=0, atol=1e-5)


def test_a_context_that_encodes_to_nothing_is_eot(run):
    """A whitespace-only context: lm-eval moves its spaces into the continuation, so the context encodes to
    no tokens and the first continuation token was scored at position -1 (the last token's logits)."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    cont = gpt2_encoding().encode_ordinary("   x")
    (got,) = lm._loglikelihood_tokens([(None, [], cont)])
    assert got[0] == pytest.approx(direct_logprob(lm.model, [EOT], cont), abs=1e-5)
    (ws,) = lm.loglikelihood([_Request("   ", "x")])
    assert ws[0] == pytest.approx(got[0], abs=1e-5)


class _Request:  # lm-eval's Instance as generate_until reads it
    def __init__(self, *args):
        self.args = args


def test_generation_keeps_the_last_block_size_tokens_of_a_long_context(run):
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    text = " the cat sat on the mat." * 20  # 140 tokens, block_size 64
    toks, new = gpt2_encoding().encode_ordinary(text), []
    for _ in range(3):
        new.append(greedy_next(lm.model, (toks + new)[-64:]))
    (got,) = lm.generate_until([_Request(text, {"until": [], "max_gen_toks": 3})])
    assert got == gpt2_encoding().decode(new)


def test_generation_stops_at_eot_a_multi_character_until_string_or_max_gen_toks(run, monkeypatch):
    """A scorer that proposes fixed tokens: " cat" " sat" "." then EOT (token ids 3797, 3332, 13, EOT)."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    n_ctx = len(lm.tok_encode("Q:"))
    plan = [3797, 3332, 13, EOT, 3797]

    def scorer(batch):
        (inp,) = batch
        logp = torch.full((1, len(inp), 50257), -50.0)
        logp[0, -1, plan[len(inp) - n_ctx]] = 0.0
        return logp

    monkeypatch.setattr(lm, "_logprobs", scorer)
    reqs = [
        {"until": [], "max_gen_toks": 10},
        {"until": " sat", "max_gen_toks": 10},
        {"max_gen_toks": 2},
    ]
    gen = lm.generate_until([_Request("Q:", kw) for kw in reqs])
    assert gen == [" cat sat.", " cat", " cat sat"]
    # an empty until string stops nothing (it raised "empty separator" and stopped after one token)
    assert lm.generate_until([_Request("Q:", {"until": ["", "\n"], "max_gen_toks": 10})]) == [" cat sat."]


def test_generation_from_an_empty_context_starts_at_eot(run):
    """An empty context failed inside the model ("idx must be a 2-d integer tensor ... (1, 0)")."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    new = []
    for _ in range(3):
        new.append(greedy_next(lm.model, [EOT] + new))
    assert lm.generate_until([_Request("", {"until": [], "max_gen_toks": 3})]) == [
        gpt2_encoding().decode(new)
    ]


@pytest.mark.parametrize("sha, refused", [("0" * 64, True), (None, False), ("GPT2", False)])
def test_data_tokenized_with_another_bpe_file_named_gpt2_is_refused(tmp_path, sha, refused):
    """meta.json's tokenizer is checked by name and, when recorded, by the BPE file's sha256."""
    from kinterval.data.tokenizer import GPT2_BPE_SHA256
    from kinterval.eval.lm_eval_adapter import check_gpt2_vocabulary

    tokenizer = {"name": "gpt2"} | (
        {} if sha is None else {"sha256": GPT2_BPE_SHA256 if sha == "GPT2" else sha}
    )
    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": tokenizer}))
    state = {"config": {"data": {"dir": str(tmp_path)}}}
    if refused:
        with pytest.raises(ValueError, match="not the GPT-2 BPE"):
            check_gpt2_vocabulary("run", 50257, state, gpt2_encoding())
    else:
        check_gpt2_vocabulary("run", 50257, state, gpt2_encoding())


def test_downstream_unknown_task_or_unreachable_hub_is_one_error_line(run, in_data, capsys, monkeypatch):
    """An unknown task was lm-eval's KeyError traceback; a Hub dataset without network, a ConnectionError."""
    import lm_eval

    from kinterval import cli

    args = ["downstream", "--run", str(run), "--include-path", str(DATA), "--limit", "1"]
    assert cli.main([*args, "--tasks", "kinterval_tiny_mc,no_such_task"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval downstream: error: lm-eval tasks not found: no_such_task (")
    assert "\n" not in err

    def offline(**kwargs):
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    assert cli.main([*args, "--tasks", "kinterval_tiny_mc"]) == 2
    err = capsys.readouterr().err.strip()
    assert "could not download" in err and "--include-path DIR" in err and "\n" not in err


def test_sciq_nosupport_is_sciq_without_the_passage():
    """The paper's seventh layer-3 configuration (App. C.3): a shipped task YAML, sciq minus the passage."""
    import yaml
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import apply_template

    from kinterval.eval.lm_eval_commands import TASKS_DIR

    ours = yaml.safe_load((TASKS_DIR / "sciq_nosupport.yaml").read_text())
    import lm_eval

    sciq = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "sciq" / "sciq.yaml").read_text())
    changed = {"task", "doc_to_text", "doc_to_decontamination_query"}
    assert {k: v for k, v in ours.items() if k not in changed} == {
        k: v for k, v in sciq.items() if k not in changed
    }
    doc = {"support": " Cells divide.", "question": "What divides?", "distractor1": "a", "distractor2": "b",
           "distractor3": "c", "correct_answer": "cells"}  # fmt: skip
    assert apply_template(sciq["doc_to_text"], doc) == "Cells divide.\nQuestion: What divides?\nAnswer:"
    assert apply_template(ours["doc_to_text"], doc) == "Question: What divides?\nAnswer:"
    assert TaskManager(include_path=str(TASKS_DIR)).match_tasks(["sciq_nosupport"]) == ["sciq_nosupport"]


def test_downstream_finds_the_shipped_task_and_passes_its_seed(run, tmp_path, monkeypatch, in_data):
    """run_downstream resolves sciq_nosupport (shipped) beside a user's folder, and seeds lm-eval."""
    import lm_eval

    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise RuntimeError("stop")

    monkeypatch.setattr(lm_eval, "simple_evaluate", fake)
    with pytest.raises(RuntimeError, match="stop"):
        run_downstream(run, ["sciq_nosupport", "kinterval_tiny_mc"], out=tmp_path / "o", include_path=DATA)
    assert seen["tasks"] == ["sciq_nosupport", "kinterval_tiny_mc"]
    seeds = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
    assert {seen[k] for k in seeds} == {20260920}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loglikelihood_is_refused_naming_the_task_and_doc(
    run, tmp_path, in_data, monkeypatch, bad
):
    """A checkpoint whose forward gives NaN was scored silently: every choice NaN, lm-eval's argmax picked
    choice 0 (accuracy of the items whose gold is 0) and results.json held NaN, exit 0."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    real = KIntervalLM._logprobs
    monkeypatch.setattr(KIntervalLM, "_logprobs", lambda self, batch: real(self, batch) + bad)
    for task in ("kinterval_tiny_mc", "kinterval_tiny_ppl"):  # loglikelihood, loglikelihood_rolling
        out = tmp_path / task
        with pytest.raises(
            ValueError, match=rf"task '{task}', doc_id \d+: the log-likelihood is \S+ \(not finite\)"
        ):
            run_downstream(run, [task], out=out, include_path=DATA, limit=2)
        assert not (out / "results.json").exists()


def test_a_non_finite_loglikelihood_without_a_task_names_the_context(run, monkeypatch):
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    monkeypatch.setattr(lm, "_logprobs", lambda batch: torch.full((len(batch), 64, 50257), float("nan")))
    with pytest.raises(ValueError, match="context ' the cat sat': the log-likelihood is nan"):
        lm.loglikelihood([_Request(" the cat sat", " on")])
    with pytest.raises(ValueError, match=r"context ' the cat sat on the mat': the log-likelihood is nan"):
        lm.loglikelihood_rolling([_Request(" the cat sat on the mat")])


def test_a_broken_lm_eval_install_keeps_its_cause(import_with_broken):
    """lm-eval installed but failing to import is not reported as missing: the error names the cause."""
    error = "cannot import name X from datasets"
    res = import_with_broken("lm_eval", error, "kinterval.eval.lm_eval_adapter")
    assert res.returncode != 0
    assert (
        "needs lm-eval: pip install 'kinterval[eval]' (importing it failed: cannot import name X"
        in res.stderr
    )
    code = "import sys; sys.modules['lm_eval'] = None\nimport kinterval.eval.lm_eval_adapter"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (
        "needs lm-eval: pip install 'kinterval[eval]'\n" in res.stderr and "During handling" not in res.stderr
    )


def test_rolling_loglikelihood_of_a_long_text_is_scored_in_disjoint_full_windows(run):
    """A text of several contexts (as HFLM, context_len 1): after the first window ([EOT] + 63 tokens), each
    window scores the next 64 tokens with the one token before them as their only context, the last one the
    rest with the 64 tokens before its end."""
    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run=str(run))
    text = " the cat sat on the mat and looked at the dog by the door." * 15
    toks = gpt2_encoding().encode_ordinary(text)
    n = len(toks)
    assert n > 3 * 64 and n % 64
    want = direct_logprob(lm.model, [EOT], toks[:64])
    for s in range(64, n, 64):
        e = min(s + 64, n)
        want += direct_logprob(lm.model, toks[e - 65 : s], toks[s:e])
    (got,) = lm.loglikelihood_rolling([_Request(text)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)


def test_downstream_without_lm_eval_is_one_error_line_naming_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['lm_eval'] = None\nfrom kinterval.cli import main\n"
        f"sys.exit(main(['downstream', '--run', {str(tmp_path / 'r')!r}, '--tasks', 'sciq', '--out', "
        f"{str(tmp_path / 'o')!r}]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("kinterval downstream: error: kinterval downstream needs lm-eval: pip ")
