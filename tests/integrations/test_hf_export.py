"""kinterval export-hf: a run's checkpoint reloaded as a transformers GPT-2 gives kinterval's logits."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

# only a missing transformers skips: an ImportError inside kinterval.integrations.hf is an error
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from kinterval import cli  # noqa: E402
from kinterval.integrations import hf  # noqa: E402
from kinterval.model import GPT, ModelConfig  # noqa: E402
from kinterval.train.checkpoint import save_checkpoint  # noqa: E402
from kinterval.train.load import load_run  # noqa: E402


def make_run(root, operator, seed, vocab_size=50257, **config):
    """A run folder with one checkpoint (step 1) of a random-init GPT over the GPT-2 vocabulary."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=vocab_size, **config)
    model = GPT(cfg, operator, "closed_form")
    state = {"step": 1, "config": {"operator": {"name": operator, "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(root, 1, model.state_dict(), {}, state)
    return root


OPERATORS = [
    "softmax",
    "fwm-prob-k4",
    "fwm-prob-k4[arithmetic=historical]",
    "minmax-weight-k5[range_grad=detach]",
]
IDS = torch.randint(0, 50257, (2, 48), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("operator", OPERATORS)
def test_export_round_trip_gives_kinterval_logits(tmp_path, operator, capsys):
    """The route the exported README and config.json give loads every operator, overrides and K outside
    AUTO_K included, and the README names the folder, not the exporting machine's path."""
    run = make_run(tmp_path / "run", operator=operator, seed=3)
    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run", str(run), "--checkpoint", "1", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    impl = config["kinterval_attn_implementation"]
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["kinterval_operator"] == operator
    # the run's MLP is exact GELU; "gelu_new" (the tanh form) is within the round trip's tolerance at init
    assert config["activation_function"] == "gelu"
    readme = (out / "README.md").read_text()
    assert "import kinterval.integrations.hf" in readme
    assert f'from_pretrained("hf", attn_implementation="{impl}")' in readme
    assert str(tmp_path) not in readme
    assert "step 1, whose attention" in readme and f"operator `{operator}`" in readme  # the checkpoint's
    assert (
        "The tokenizer is GPT-2's BPE (tiktoken's `gpt2`, 50257 tokens), saved in this folder" in readme
    )  # a GPT-2-vocabulary run

    model = load_run(run).model
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation=impl).eval()
    assert reloaded.lm_head.weight.data_ptr() == reloaded.transformer.wte.weight.data_ptr()  # tied
    ids = IDS
    with torch.no_grad(), hf.expect_kinterval(impl):
        ours, theirs = model(ids)[0], reloaded(ids).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    if operator != "softmax":  # the operator matters: transformers' own softmax gives other logits
        reloaded.set_attn_implementation("sdpa")
        with torch.no_grad():
            assert (reloaded(ids).logits - ours).abs().max() > 1e-4


@pytest.mark.parametrize("operator", OPERATORS)
def test_exported_readme_loads_in_a_fresh_process(tmp_path, operator):
    """The exported README's code, run as written (beside the folder, in a new process: no name registered by
    the export), loads the model with kinterval's logits, for operators with overrides too."""
    run = make_run(tmp_path / "run", operator=operator, seed=3)
    assert cli.main(["export-hf", "--run", str(run), "--checkpoint", "1", "--out", str(tmp_path / "hf")]) == 0
    (code,) = re.findall(r"```python\n(.*?)```", (tmp_path / "hf" / "README.md").read_text(), re.S)
    np.save(tmp_path / "ids.npy", IDS.numpy())
    code += (
        "import numpy, torch\n"
        "with torch.no_grad():\n"
        "    logits = model.eval()(torch.from_numpy(numpy.load('ids.npy'))).logits\n"
        "numpy.save('logits.npy', logits.numpy())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    with torch.no_grad():
        ours = load_run(run).model(IDS)[0]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "logits.npy")), ours, rtol=0, atol=1e-5)


def test_a_bias_free_sdpa_run_exports_with_zero_biases_and_sdpa_attention(tmp_path, monkeypatch):
    """model.bias = false: transformers' GPT-2 has biases, which must be zero; an sdpa run (softmax through
    PyTorch's fused kernel) is exported to transformers' own sdpa attention, with no kinterval name."""
    torch.manual_seed(4)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=512, bias=False)
    model = GPT(cfg, "sdpa")
    state = {
        "step": 1,
        "config": {"operator": {"name": "sdpa", "backend": "auto"}},
        "model_config": cfg.to_dict(),
    }
    save_checkpoint(tmp_path / "run", 1, model.state_dict(), {}, state)
    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["kinterval_attn_implementation"] == "sdpa" and config["n_positions"] == 64
    readme = (out / "README.md").read_text()  # 512 ids (the synthetic corpus): no GPT-2 tokenizer promised
    assert "The vocabulary has 512 token ids, not GPT-2's 50257" in readme and "BPE (tiktoken" not in readme
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    biases = [p for name, p in reloaded.named_parameters() if name.endswith(".bias")]
    assert len(biases) == 2 * 6 + 1 and all(
        not p.any() for p in biases
    )  # per block: ln_1, ln_2 and 4 linears
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(IDS % 512).logits, load_run(tmp_path / "run").model(IDS % 512)[0], rtol=0, atol=1e-5
        )
    # a mapping that leaves a transformers weight at its random init is refused, not saved
    from kinterval.integrations import hf_export

    real = hf_export.gpt2_state_dict
    monkeypatch.setattr(
        hf_export, "gpt2_state_dict", lambda m: {k: v for k, v in real(m).items() if "ln_f" not in k}
    )
    with pytest.raises(RuntimeError, match="GPT-2 weight mapping incomplete: missing.*ln_f"):
        hf_export.export_hf(tmp_path / "run", tmp_path / "hf2")


def test_a_run_with_bf16_attention_inputs_is_refused(tmp_path):
    """The export fed fp32 q, k, v where the run rounds them to bf16: logits 0.05 off the run's, silently."""
    from kinterval.integrations.hf_export import export_hf
    from kinterval.model.config import NumericsConfig

    run = make_run(tmp_path / "run", "fwm-prob-k4", 0, numerics=NumericsConfig(attention_dtype="bfloat16"))
    with pytest.raises(ValueError, match="attention takes q, k, v in bfloat16"):
        export_hf(run, tmp_path / "hf")
    argv = ["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")]
    assert cli.main(argv) == 2
    assert not (tmp_path / "hf").exists()


def snapshot(folder):
    """Everything under ``folder`` (relative path -> bytes, None for a folder): what a refused export must
    leave as it was."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")
    }


def refused(capsys, run, out, match):
    """export-hf into ``out``: a ValueError naming the problem (CLI: exit 2, one line); nothing written."""
    from kinterval.integrations.hf_export import export_hf

    before = snapshot(run.parent)
    with pytest.raises(ValueError, match=match):
        export_hf(run, out, checkpoint="1")
    capsys.readouterr()
    assert cli.main(["export-hf", "--run", str(run), "--checkpoint", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and re.search(match, err), err
    assert snapshot(run.parent) == before  # the checkpoint's bytes, and every other file, unchanged


def test_export_into_a_checkpoint_folder_is_refused(tmp_path, capsys):
    """--out RUN/checkpoints/step_N replaced the checkpoint's model.safetensors and config with the GPT-2
    files: the run could no longer resume, evaluate or export. Refused, also inside it and through a link."""
    run = make_run(tmp_path / "run", "fwm-prob-k4", 0)
    ckpt = run / "checkpoints" / "step_000001"
    refused(capsys, run, ckpt, r"step_000001 is a kinterval checkpoint folder \(it holds state.json\)")
    refused(capsys, run, ckpt / "hf", r"lies inside .*step_000001, which is a kinterval checkpoint folder")
    (tmp_path / "link").symlink_to(ckpt, target_is_directory=True)
    refused(capsys, run, tmp_path / "link", "is a kinterval checkpoint folder")
    refused(capsys, run, tmp_path / "x" / ".." / "link" / "hf", "lies inside .*checkpoint folder")


def test_export_into_a_run_folder_is_refused(tmp_path, capsys):
    """--out RUN dropped config.json, model.safetensors and README.md among the run's files. Refused, and so
    is any folder inside a run, and a run that has no checkpoint yet (status.json, run_config.json)."""
    run = make_run(tmp_path / "run", "fwm-prob-k4", 0)
    refused(capsys, run, run, r"run is a kinterval run folder \(it holds run_config.json, status.json or")
    refused(capsys, run, run / "checkpoints", r"lies inside .*run, which is a kinterval run folder")
    refused(capsys, run, run / "exports" / "hf", "lies inside .*run, which is a kinterval run folder")
    for marker in ("status.json", "run_config.json"):
        (tmp_path / marker.split(".")[0]).mkdir()
        (tmp_path / marker.split(".")[0] / marker).write_text("{}\n")
        refused(capsys, run, tmp_path / marker.split(".")[0] / "hf", "which is a kinterval run folder")


def test_export_into_a_foreign_folder_or_file_is_refused(tmp_path, capsys):
    """A non-empty --out that export-hf did not write (another model's config.json included) would be
    overwritten in part: refused. So is an --out that is a file."""
    run = make_run(tmp_path / "run", "fwm-prob-k4", 0)
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    refused(capsys, run, out, "notes is a non-empty folder that is not an earlier export-hf output")
    other = tmp_path / "llama"  # a transformers model with the kinterval attention, not an export-hf folder
    other.mkdir()
    (other / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "kinterval_operator": "fwm-prob-k4"})
    )
    (other / "model.safetensors").write_bytes(b"weights")
    refused(capsys, run, other, "llama is a non-empty folder that is not an earlier export-hf output")
    config = {"architectures": ["LlamaForCausalLM"], "kinterval_attn_implementation": "kinterval"}
    (other / "config.json").write_text(json.dumps(config))  # names the attention, but is not a GPT-2
    refused(capsys, run, other, "llama is a non-empty folder that is not an earlier export-hf output")
    gpt2 = (
        tmp_path / "gpt2"
    )  # transformers' own GPT-2 (say a downloaded one): no kinterval_attn_implementation
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    (gpt2 / "model.safetensors").write_bytes(b"weights")
    refused(capsys, run, gpt2, "gpt2 is a non-empty folder that is not an earlier export-hf output")
    (tmp_path / "file").write_text("x")
    refused(capsys, run, tmp_path / "file", "is a file, not a folder")


def test_re_export_into_an_export_folder_or_an_empty_folder_works(tmp_path):
    """An earlier export-hf folder is overwritten with the new export; an empty folder is written."""
    run_a = make_run(tmp_path / "a", "fwm-prob-k4", 0)
    run_b = make_run(tmp_path / "b", "softmax", 1)
    (tmp_path / "hf").mkdir()  # empty
    (tmp_path / "fresh").mkdir()
    assert cli.main(["export-hf", "--run", str(run_a), "--out", str(tmp_path / "hf")]) == 0
    assert cli.main(["export-hf", "--run", str(run_b), "--out", str(tmp_path / "hf")]) == 0
    assert cli.main(["export-hf", "--run", str(run_b), "--out", str(tmp_path / "fresh")]) == 0
    hf_files, fresh = snapshot(tmp_path / "hf"), snapshot(tmp_path / "fresh")
    fresh["README.md"] = fresh["README.md"].replace(b"fresh", b"hf")  # the README names its folder
    assert hf_files == fresh  # b's export, nothing of a's left
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["kinterval_operator"] == "softmax"


def test_a_gpt2_vocabulary_export_carries_gpt2_s_tokenizer_and_end_of_text(tmp_path):
    """A run over GPT-2's BPE exports its tokenizer (offline; AutoTokenizer and lm-eval's --model hf load it
    from the folder: without it transformers silently builds an empty GPT-2 tokenizer that encodes any text
    to no ids) and <|endoftext|> as bos/eos, so generate stops at a document's end. A re-export of a
    token-id run (no tokenizer) leaves none of those files behind."""
    from transformers import AutoTokenizer

    from kinterval.data.tokenizer import EOT, gpt2_encoding

    out = tmp_path / "hf"
    assert (
        cli.main(["export-hf", "--run", str(make_run(tmp_path / "a", "softmax", 0)), "--out", str(out)]) == 0
    )
    tok = AutoTokenizer.from_pretrained(out)
    text = "Quantized attention: K = 4 intervals,\n\n  naïve café 🙂<|endoftext|>"
    assert tok(text).input_ids == gpt2_encoding().encode(text, allowed_special="all")
    assert tok.eos_token_id == tok.bos_token_id == EOT and tok.model_max_length == 64
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == config["bos_token_id"] == EOT
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == EOT

    run_ids = make_run(tmp_path / "b", "softmax", 0, vocab_size=512)
    assert cli.main(["export-hf", "--run", str(run_ids), "--out", str(out)]) == 0
    assert not any((out / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    assert json.loads((out / "config.json").read_text())["eos_token_id"] is None


def test_export_into_a_run_with_only_a_checkpoint_folder_is_refused(tmp_path):
    """A run folder holding only checkpoints/step_N/ (no LATEST, status.json or run_config.json) is a run."""
    from kinterval.integrations.hf_export import check_out

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000100").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"run is a kinterval run folder"):
        check_out(run)
    with pytest.raises(ValueError, match=r"lies inside .*run, which is a kinterval run folder"):
        check_out(run / "hf")


def test_an_export_with_more_heads_than_layers_keeps_both_counts(tmp_path):
    """The runs above have as many heads as layers (2 and 2), so a head count mapped from the layer count
    went unseen: 3 layers of 4 heads reload as 3 layers of 4 heads, with the run's logits (attention weights
    scaled up so that the scores, hence the head split, matter well above rounding)."""
    torch.manual_seed(5)
    cfg = ModelConfig(n_layer=3, n_head=4, n_embd=32, block_size=64, vocab_size=512)
    model = GPT(cfg, "fwm-prob-k4", "closed_form")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(30)
    state = {"step": 1, "config": {"operator": {"name": "fwm-prob-k4", "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(tmp_path / "run", 1, model.state_dict(), {}, state)
    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["n_layer"], config["n_head"], config["n_embd"]) == (3, 4, 32)
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="kinterval").eval()
    ids = IDS % 512
    with torch.no_grad():
        ours = load_run(tmp_path / "run").model(ids)[0]
        torch.testing.assert_close(reloaded(ids).logits, ours, rtol=0, atol=1e-5)
    wrong = AutoModelForCausalLM.from_pretrained(out, attn_implementation="kinterval", n_head=2).eval()
    with torch.no_grad():  # the check has the power to see a wrong head split
        assert (wrong(ids).logits - ours).abs().max() > 1e-3


@pytest.mark.parametrize(
    "option, named",
    [
        (dict(n_kv_head=1), "n_kv_head = 1"),
        (dict(attn_softcap=30.0), "attn_softcap = 30.0"),
        (dict(attn_sinks=True), "attn_sinks = True"),
        (dict(rope_theta=1e4), "rope_theta = 10000.0"),
    ],
)
def test_a_run_with_attention_options_beyond_gpt2_is_not_exported(tmp_path, capsys, option, named):
    """Grouped-query heads, a softcap or sinks have no place in transformers' GPT-2: the export would drop
    them and give other logits, so it refuses and names them."""
    run = make_run(tmp_path / "run", "fwm-prob-k4", 0, vocab_size=512, **option)
    assert cli.main(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert named in err and "GPT-2-shaped runs only" in err and not (tmp_path / "hf").exists()


def test_n_kv_head_equal_to_n_head_is_plain_gpt2_and_exports(tmp_path):
    run = make_run(tmp_path / "run", "softmax", 0, vocab_size=512, n_kv_head=2)
    assert cli.main(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0


def test_a_padded_embedding_table_is_cut_to_the_vocabulary(tmp_path):
    """``vocab_multiple`` pads wte for speed only: the export holds the ``vocab_size`` real rows."""
    from kinterval.integrations.hf_export import export_hf, gpt2_state_dict

    run = make_run(tmp_path / "run", "softmax", 0, vocab_size=100, vocab_multiple=64)
    model = load_run(run).model
    assert model.transformer.wte.weight.shape[0] == 128
    sd = gpt2_state_dict(model)
    assert torch.equal(sd["transformer.wte.weight"], model.transformer.wte.weight[:100])
    out = export_hf(run, tmp_path / "hf")
    from transformers import GPT2LMHeadModel

    assert GPT2LMHeadModel.from_pretrained(out).transformer.wte.weight.shape == (100, 32)


def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path, capsys):
    """A diverged run's NaN weights were exported without a word."""
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50257)
    model = GPT(cfg, "softmax", "closed_form")
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[0, 0] = float("nan")
    state = {"step": 1, "config": {"operator": {"name": "softmax", "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(tmp_path / "run", 1, model.state_dict(), {}, state)
    refused(
        capsys, tmp_path / "run", tmp_path / "hf", r"weights are not finite \(transformer\.h\.0\.attn\.c_attn"
    )


def test_a_re_export_cut_short_leaves_the_earlier_export_whole(tmp_path, monkeypatch):
    """A re-export wrote config.json, then the weights, in place: cut short at the weights, the folder held
    the new operator's config beside the old weights and README, and still looked like a finished export.
    It is now written beside the folder and put in its place whole."""
    import transformers.modeling_utils as mu

    run_a, run_b = make_run(tmp_path / "a", "softmax", 0), make_run(tmp_path / "b", "fwm-prob-k4", 1)
    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run", str(run_a), "--out", str(out)]) == 0
    before = snapshot(out)

    def cut(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(mu, "safe_save_file", cut)
    assert cli.main(["export-hf", "--run", str(run_b), "--out", str(out)]) == 130  # Ctrl-C's exit
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "hf"]  # no staging folder left
    monkeypatch.undo()
    assert cli.main(["export-hf", "--run", str(run_b), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["kinterval_operator"] == "fwm-prob-k4"
