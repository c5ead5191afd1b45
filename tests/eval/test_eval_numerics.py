"""Every measurement runs the model in eval mode with TF32 off (paper App. C: "evaluation and all diagnostics
use the same split with TF32 off") and gives back the caller's train/eval mode and TF32 setting; layer means
are means over the layers; the probes read the paper's first 8 blocks by default."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kinterval.eval.geometry import geometry_probe
from kinterval.eval.graddiag import gradient_diagnostics
from kinterval.eval.tau_screen import fwm_spec, swapped_nll
from kinterval.model import GPT, preset, tf32
from kinterval.ops.tf32 import tf32_enabled
from kinterval.train.evaluate import token_nll

T = 16

MEASUREMENTS = {
    "token_nll": lambda model, tokens: token_nll(model, tokens, T),
    "geometry": lambda model, tokens: geometry_probe(model, tokens, blocks=2),
    "graddiag": lambda model, tokens: gradient_diagnostics(model, tokens, blocks=2),
    "tau_screen": lambda model, tokens: swapped_nll(model, tokens, fwm_spec(4, 6.0), tail="floor"),
}


def _model(n_layer=2, op="lerp-k4", seed=0):
    torch.manual_seed(seed)
    cfg = preset("tiny", vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32, block_size=T)
    return GPT(cfg, op, "closed_form")


@pytest.mark.parametrize("name", list(MEASUREMENTS))
@pytest.mark.parametrize("caller_training", [True, False])
def test_measurements_run_in_eval_mode_with_tf32_off_and_give_back_the_callers_state(name, caller_training):
    """A model forward is seen in eval mode with TF32 off, also when the caller has TF32 on (as training
    does); afterwards the caller's mode (train or eval) and TF32 come back."""
    model = _model().train(caller_training)
    tokens = np.random.default_rng(0).integers(0, 64, size=2 * T + 1).astype(np.uint16)
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append((m.training, tf32_enabled())))
    with tf32(True):
        MEASUREMENTS[name](model, tokens)
        assert tf32_enabled()
    assert seen and set(seen) == {(False, False)}, seen
    assert all(m.training == caller_training for m in model.modules())


def test_layer_means_are_means_over_the_layers():
    """The "mean" row is the mean over the layers (paper: "reported per layer and as a layer mean"; "mean over
    layers"), checked on three layers, where a median differs from the mean."""
    model = _model(n_layer=3, op="lerp-k4[range_grad=max_only]").eval()
    with torch.no_grad():
        for i, blk in enumerate(model.transformer.h):
            blk.attn.c_attn.weight.mul_(5 * (i + 1) ** 2)  # layers of different spans, unevenly spaced
    tokens = np.random.default_rng(1).integers(0, 64, size=2 * T + 1).astype(np.uint16)
    for res in (geometry_probe(model, tokens, blocks=2), gradient_diagnostics(model, tokens, blocks=2)):
        assert len(res["layers"]) == 3
        spread = 0
        for k, v in res["mean"].items():
            col = [row[k] for row in res["layers"]]
            assert v == pytest.approx(sum(col) / 3, rel=1e-12, abs=1e-15), k
            spread += abs(np.median(col) - v) > 1e-3 * (abs(v) + 1e-12)
        assert spread >= 2  # the layers differ enough for the check to tell a mean from a median


@pytest.mark.parametrize("probe", [geometry_probe, gradient_diagnostics])
def test_probes_read_the_first_8_blocks_by_default(probe):
    """Paper App. C.3 / F: the probes read the first 8 validation blocks (the split here holds 10)."""
    model = _model(n_layer=1).eval()
    tokens = np.random.default_rng(2).integers(0, 64, size=10 * T + 1).astype(np.uint16)
    default = probe(model, tokens)
    assert default["n_blocks"] == 8
    assert default["layers"] == probe(model, tokens, blocks=8)["layers"]
    assert default["layers"] != probe(model, tokens, blocks=9)["layers"]
