"""kinterval export-hf: a run's checkpoint reloaded as a transformers GPT-2 gives kinterval's logits."""

import json

import pytest
import torch

pytest.importorskip("transformers")
hf = pytest.importorskip("kinterval.integrations.hf")

from transformers import AutoModelForCausalLM  # noqa: E402

from kinterval import cli  # noqa: E402
from kinterval.model import GPT, ModelConfig  # noqa: E402
from kinterval.train.checkpoint import save_checkpoint  # noqa: E402
from kinterval.train.load import load_run  # noqa: E402


def make_run(root, operator, seed):
    """A run folder with one checkpoint (step 1) of a random-init GPT over the GPT-2 vocabulary."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50257)
    model = GPT(cfg, operator, "closed_form")
    state = {"step": 1, "config": {"operator": {"name": operator, "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(root, 1, model.state_dict(), {}, state)
    return root


@pytest.mark.parametrize("operator", ["softmax", "fwm-prob-k4"])
def test_export_round_trip_gives_kinterval_logits(tmp_path, operator, capsys):
    run = make_run(tmp_path / "run", operator=operator, seed=3)
    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run", str(run), "--checkpoint", "1", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    impl = f"kinterval-{operator}"
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["kinterval_attn_implementation"] == impl
    readme = (out / "README.md").read_text()
    assert "import kinterval.integrations.hf" in readme and f'attn_implementation="{impl}"' in readme

    model = load_run(run).model
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation=impl).eval()
    assert reloaded.lm_head.weight.data_ptr() == reloaded.transformer.wte.weight.data_ptr()  # tied
    ids = torch.randint(0, 50257, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), hf.expect_kinterval(impl):
        ours, theirs = model(ids)[0], reloaded(ids).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    if operator != "softmax":  # the operator matters: transformers' own softmax gives other logits
        reloaded.set_attn_implementation("sdpa")
        with torch.no_grad():
            assert (reloaded(ids).logits - ours).abs().max() > 1e-4
