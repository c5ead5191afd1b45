"""Zero-sum residual of the implemented score gradient and the fixed-upstream decomposition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kinterval.eval.graddiag import decomposition_sums, gradient_diagnostics, zero_sum_residual
from kinterval.model import GPT, preset
from kinterval.ops import OperatorSpec
from kinterval.ops.closed_form import closed_form_probs


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(64, 16, generator=g, dtype=torch.float64) * 3).requires_grad_()
    u = torch.randn(64, 16, generator=g, dtype=torch.float64)
    return s, torch.ones(64, 16, dtype=torch.bool), u


@pytest.mark.parametrize("op", ["lerp-k4", "minmax-weight-k4", "fwm-prob-k4", "softmax"])
def test_full_gradient_is_zero_sum_and_detach_is_not(op):
    s, valid, u = _rows()
    (g_full,) = torch.autograd.grad(closed_form_probs(s, valid, OperatorSpec.parse(op)), s, u)
    assert float(zero_sum_residual(g_full, valid).median()) < 1e-10
    if op != "softmax":
        spec = OperatorSpec.parse(op, range_grad="detach")
        (g_det,) = torch.autograd.grad(closed_form_probs(s, valid, spec), s, u)
        assert float(zero_sum_residual(g_det, valid).median()) > 1e-3


def test_decomposition_identities():
    s, valid, u = _rows(1)
    d = decomposition_sums(s.detach(), valid, OperatorSpec.parse("lerp-k4"), u)
    # detach misses M + m; min_only misses M; max_only misses m.
    assert d["err_min_only"] == pytest.approx(d["norm_M"])
    assert d["err_max_only"] == pytest.approx(d["norm_m"])
    assert d["err_detach"] > 0 and d["full"] > 0
    fwm = decomposition_sums(s.detach(), valid, OperatorSpec.parse("fwm-prob-k4"), u)
    assert fwm["norm_m"] == 0.0  # FWM has no minimum channel


def test_model_level_residual_full_vs_detach():
    torch.manual_seed(0)
    tokens = np.random.default_rng(0).integers(0, 64, size=4 * 32 + 1).astype(np.uint16)
    cfg = preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=32)
    model = GPT(cfg, "lerp-k4", "closed_form")
    full = gradient_diagnostics(model, tokens, blocks=2)
    assert len(full["layers"]) == 2
    assert full["mean"]["zero_sum_residual"] < 1e-5
    model_d = GPT(cfg, "lerp-k4[range_grad=detach]", "closed_form")
    model_d.load_state_dict(model.state_dict())
    det = gradient_diagnostics(model_d, tokens, blocks=2)
    assert det["mean"]["zero_sum_residual"] > max(1e-4, 100 * full["mean"]["zero_sum_residual"])
    # the decomposition uses the full operator at the same upstream: err_detach = norm of the (M, m) terms
    assert det["mean"]["err_detach"] == pytest.approx(full["mean"]["err_detach"], rel=1e-3)


@pytest.mark.parametrize("blocks, n_tokens, message", [(0, 33, "blocks must be"), (8, 10, "holds no block")])
def test_no_block_to_diagnose_is_an_error_not_a_nan_row(blocks, n_tokens, message):
    model = GPT(preset("tiny", vocab_size=32, n_layer=1, n_head=2, n_embd=16, block_size=16), "lerp-k4")
    with pytest.raises(ValueError, match=message):
        gradient_diagnostics(model, np.zeros(n_tokens, dtype=np.uint16), blocks=blocks)


def test_a_non_finite_gradient_row_is_an_error_naming_the_layer():
    """A NaN gradient row was dropped (``keep = a > 0``), so a diverged layer read as a clean residual."""
    g = torch.tensor([[[1.0, -1.0, 0.0], [float("nan"), 1.0, 0.0], [2.0, 0.0, 0.0]]], dtype=torch.float64)
    valid = torch.tensor([[True, False, False], [True, True, False], [True, True, True]]).expand_as(g)
    with pytest.raises(ValueError, match="layer 0: the zero-sum residual is NaN or infinite"):
        zero_sum_residual(g, valid)
    with pytest.raises(ValueError, match="layer 3: the zero-sum residual"):
        zero_sum_residual(g, valid, 3)
    # an all-zero gradient row (a row of one valid key) has no residual; masked keys are not read
    g = torch.tensor([[[0.0, 7.0, 0.0], [0.0, 0.0, 0.0], [2.0, -1.0, 0.0]]], dtype=torch.float64)
    assert zero_sum_residual(g, valid).tolist() == [1 / 3]


def test_a_diverged_model_is_an_error_not_a_nan_row():
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=32, n_layer=2, n_head=2, n_embd=16, block_size=16), "lerp-k4")
    tokens = np.arange(2 * 16 + 1, dtype=np.uint16) % 32
    with torch.no_grad():
        model.transformer.wte.weight[7] = float("nan")  # token 7 sits mid-block
    with pytest.raises(ValueError, match=r"layer \d: the zero-sum residual is NaN or infinite"):
        gradient_diagnostics(model, tokens, blocks=2)
