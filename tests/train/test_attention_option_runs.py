"""A run with the model's attention options (grouped-query heads, softcap, sinks): set from the command line,
trained, checkpointed with its sinks, resumed only under the same options, evaluated and probed."""

import json

import pytest
import torch

from kinterval.cli import build_parser
from kinterval.data.loader import TokenShards
from kinterval.eval.geometry import geometry_probe
from kinterval.train.checkpoint import CheckpointError
from kinterval.train.commands import config_from_args
from kinterval.train.load import load_run
from kinterval.train.loop import train

OPTIONS = {
    "model.n_kv_head": 1,
    "model.attn_softcap": 20.0,
    "model.attn_sinks": True,
    "model.rope_theta": 1e4,
}


def test_set_flags_reach_the_model_config():
    args = [
        "train",
        "--out",
        "O",
        "--data",
        "D",
        "--set",
        "model.n_kv_head=1",
        "--set",
        "model.attn_softcap=20",
    ]
    cfg = config_from_args(build_parser().parse_args([*args, "--set", "model.attn_sinks=true"]))
    model = cfg.model_config(vocab_size=97)
    assert (model.n_kv_head, model.attn_softcap, model.attn_sinks) == (1, 20, True)
    cfg = config_from_args(build_parser().parse_args(args))
    with pytest.raises(ValueError, match="n_kv_head"):
        cfg.override({"model.n_kv_head": 3}).validate()  # the tiny preset has 2 heads


@pytest.mark.parametrize("option", ["model.attn_softcap=20", "model.attn_sinks=true"])
def test_sdpa_with_a_softcap_or_sinks_is_a_config_error_naming_the_fields(option):
    """It passed the config check and failed when the model was built (after the data note, without a
    field's name), so a suite file with it loaded and trained its other runs first."""
    args = ["train", "--out", "O", "--data", "D", "--set", option]
    cfg = config_from_args(build_parser().parse_args(args))  # softmax: valid
    fields = r"model\.attn_softcap or model\.attn_sinks"
    with pytest.raises(ValueError, match=r"operator\.name 'sdpa' .* " + fields):
        cfg.override({"operator.name": "sdpa"}).validate()


def test_a_run_with_every_option_trains_resumes_and_probes(make_config, tmp_path):
    cfg = make_config(**{"operator.name": "fwm-prob-k4", **OPTIONS})
    run = tmp_path / "run"
    result = train(cfg, run)
    assert torch.isfinite(torch.tensor(result.last_loss))
    state = json.loads((result.last_checkpoint / "state.json").read_text())
    assert {
        k: state["model_config"][k] for k in ("n_kv_head", "attn_softcap", "attn_sinks", "rope_theta")
    } == {
        "n_kv_head": 1,
        "attn_softcap": 20.0,
        "attn_sinks": True,
        "rope_theta": 1e4,
    }
    loaded = load_run(run)
    sinks = loaded.model.transformer.h[0].attn.sinks
    assert sinks is not None and torch.any(sinks != 0)  # learned from zero
    assert "wpe" not in loaded.model.transformer  # rotary positions: no table
    for option in OPTIONS:  # the options are part of what a checkpoint must match
        other = {"model.n_kv_head": 2, "model.attn_softcap": None, "model.attn_sinks": False}.get(option)
        with pytest.raises(CheckpointError, match=f"different config.*{option}"):
            train(
                cfg.override({option: other}) if other is not None else _without(cfg, option),
                run,
                resume=True,
            )
    geo = geometry_probe(loaded.model, _val_tokens(cfg), cfg.block_size, blocks=2)
    assert all(v == v for v in geo["mean"].values())  # every metric defined (no NaN)


def _without(cfg, option):
    d = cfg.to_dict()
    section, name = option.split(".")
    d[section][name] = None
    return type(cfg).from_dict(d)


def _val_tokens(cfg):
    return TokenShards(cfg.data.dir, "val").tokens()
