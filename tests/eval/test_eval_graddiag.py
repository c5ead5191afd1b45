"""Zero-sum residual of the implemented score gradient and the fixed-upstream decomposition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kinterval.eval import graddiag
from kinterval.eval.graddiag import (
    decomposition_sums,
    gradient_diagnostics,
    residual_row_counts,
    zero_sum_residual,
)
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


def test_an_exactly_zero_sum_row_has_residual_zero_and_is_not_left_out():
    """Only an all-zero row (0/0) is left out of the residual: a row whose gradient sums to exactly 0 (what an
    exact full gradient gives, e.g. [a, -a] on two keys) has residual 0 and enters the median; masked keys do
    not count."""
    g = torch.tensor(
        [[0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, -0.5, 9.0]], dtype=torch.float64
    )
    valid = torch.tensor([[1, 1, 0]] * 4, dtype=torch.bool)
    torch.testing.assert_close(
        zero_sum_residual(g, valid), torch.tensor([0.0, 1.0, 0.5 / 1.5], dtype=torch.float64)
    )


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


def independent_graddiag(model, tokens, T, blocks, spec):
    """Per-layer diagnostics by autograd of the reference operator in the graph (s and P retain their
    gradients), with every mode's local VJP at the same scores and upstream differentiated separately."""
    import math

    from kinterval.eval.attention import patched_attention
    from kinterval.ops.reference import reference_probs

    captured = {}

    def fn(idx, s, valid, q, k):
        s.retain_grad()
        P = reference_probs(s, valid, spec)
        P.retain_grad()
        captured[idx] = (s, valid, P)
        return P

    def vjp(s, valid, u, mode):
        s = s.detach().clone().requires_grad_()
        (g,) = torch.autograd.grad(
            (reference_probs(s, valid, OperatorSpec.parse(spec, range_grad=mode)) * u).sum(), s
        )
        return g[..., 1:, :].double()

    n_layers = len(model.transformer.h)
    res = [{"r": [], "sq": {}} for _ in range(n_layers)]
    with patched_attention(model, fn), torch.enable_grad():
        for b in range(blocks):
            captured.clear()
            x = torch.from_numpy(tokens[b * T : b * T + T].astype(np.int64))[None]
            y = torch.from_numpy(tokens[b * T + 1 : b * T + T + 1].astype(np.int64))[None]
            (model(x, y)[1] / blocks).backward()
            for L, (s, valid, P) in captured.items():
                v = valid[..., 1:, :]
                g = torch.where(v, s.grad[..., 1:, :].double(), 0.0)
                a = g.abs().sum(-1)
                res[L]["r"].append((g.sum(-1).abs() / a)[a > 0])
                u = P.grad.detach()
                full, det, mx, mn = (vjp(s, valid, u, m) for m in ("full", "detach", "max_only", "min_only"))
                p1 = torch.where(
                    v, det - torch.where(v, det, 0.0).sum(-1, keepdim=True) / v.sum(-1, keepdim=True), 0.0
                )
                terms = {"full": full, "norm_self": det, "norm_M": mx - det, "norm_m": mn - det,
                         "err_detach": det - full, "err_min_only": mn - full, "err_max_only": mx - full,
                         "err_p1_local": p1 - full}  # fmt: skip
                for key, term in terms.items():
                    res[L]["sq"][key] = res[L]["sq"].get(key, 0.0) + float(term.pow(2).sum())
    model.zero_grad(set_to_none=True)
    out = []
    for L in range(n_layers):
        r = torch.cat(res[L]["r"])
        row = {
            "zero_sum_residual": float(np.median(r.numpy())),  # the median: mean of the two middle values
            "rows_above_1e-3": float((r > 1e-3).double().mean()),
        }
        full = math.sqrt(res[L]["sq"]["full"])
        row.update({k: math.sqrt(v) / full for k, v in res[L]["sq"].items() if k != "full"})
        out.append(row)
    return out


@pytest.mark.parametrize(
    "op", ["lerp-k4[range_grad=detach]", "lerp-k8[range_grad=max_only]", "minmax-prob-k8", "fwm-weight-k4"]
)
def test_diagnostics_match_autograd_on_every_layer(op):
    """Each layer's median residual, fraction above 1e-3 and decomposition ratios against autograd of the
    reference operator (the residual's median, its 1e-3 threshold and err_p1_local = ||P1(self) - g_full||
    were untested: a mean, another threshold or P1 against self passed)."""
    torch.manual_seed(0)
    T, blocks = 16, 3
    model = GPT(
        preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=T), op, "closed_form"
    )
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(20)
    tokens = np.random.default_rng(1).integers(0, 64, size=blocks * T + 1).astype(np.uint16)
    got = gradient_diagnostics(model, tokens, blocks=blocks)
    want = independent_graddiag(model, tokens, T, blocks, OperatorSpec.from_full_name(op))
    for L in range(2):
        assert set(got["layers"][L]) == set(want[L])
        for key, value in want[L].items():
            assert got["layers"][L][key] == pytest.approx(value, rel=1e-4, abs=1e-7), (L, key)
    for key in want[0]:  # "mean" is the mean over the layers
        assert got["mean"][key] == pytest.approx(np.mean([w[key] for w in want]), rel=1e-4, abs=1e-7), key
    if "detach" in op or "max_only" in op:  # residuals spread across 1e-3 and far from their mean
        assert want[0]["zero_sum_residual"] > 1e-3 and 0 < want[0]["rows_above_1e-3"]


def test_a_layer_without_a_usable_row_is_left_out_of_the_layer_mean():
    """Layer 0 with every row's probability on one key (FWM, scores scaled up: one key in the window) has no
    residual and no decomposition: its values are NaN, and the mean over layers is layer 1's, with
    ``mean_layers`` saying how many layers entered it (the plain mean was NaN for every key, silently)."""
    torch.manual_seed(2)
    T = 32
    model = GPT(preset("tiny", vocab_size=50, n_layer=2, n_head=2, n_embd=16, block_size=T), "fwm-prob-k4")
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight.mul_(3000.0)
    tokens = np.random.default_rng(0).integers(0, 50, 2 * T + 1).astype(np.uint16)
    diag = gradient_diagnostics(model, tokens, blocks=2)
    empty, used = diag["layers"]
    assert diag["residual_rows"]["layers"][0]["used"] == 0 < diag["residual_rows"]["layers"][1]["used"]
    assert all(np.isnan(v) for v in empty.values()) and all(np.isfinite(v) for v in used.values())
    assert diag["mean"] == used and diag["mean_layers"] == dict.fromkeys(used, 1)


def test_rows_left_out_of_the_residual_are_counted_by_reason():
    """The residual drops every all-zero gradient row; which ones, and why, is counted: a row of one valid
    key, a row with all its probability on one key, and a row with spread probability but a zero gradient."""
    nan = float("nan")
    g = torch.tensor([[0.0, 0, 0], [0, 0, 9], [0, 0, 0], [0, 0, 0], [1, -1, 0], [nan, 1, 0]])
    valid = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    P = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0], [0.5, 0.5, 0], [0.5, 0.5, 0], [0.5, 0.5, 0]])
    # row 1: the 9 sits on a masked key; row 2: one key holds all the probability; row 3: spread, zero grad
    got = residual_row_counts(g, valid, P)
    assert got == {"used": 2, "one_key": 1, "single_weight": 2, "zero_gradient": 1}


def test_a_broken_backward_that_zeroes_the_score_gradient_is_counted_not_hidden(monkeypatch):
    """An operator whose backward gives an all-zero score gradient left no row in the residual (median NaN,
    nothing else said); the rows now count as zero_gradient. A working operator uses every row i >= 1."""
    T, blocks = 16, 2
    model = GPT(preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=T), "lerp-k4")
    tokens = np.random.default_rng(0).integers(0, 64, size=blocks * T + 1).astype(np.uint16)
    rows = 2 * (T - 1) * blocks  # per layer: heads x rows i >= 1 x blocks
    diag = gradient_diagnostics(model, tokens, blocks=8, decompose=False)  # the split holds 2 blocks only
    good = diag["residual_rows"]
    assert diag["n_blocks"] == blocks
    assert good["layers"] == [{"used": rows, "one_key": 0, "single_weight": 0, "zero_gradient": 0}] * 2
    assert good["total"] == {"used": 2 * rows, "one_key": 0, "single_weight": 0, "zero_gradient": 0}

    real = graddiag.closed_form_probs

    def broken(s, valid, spec):  # the forward of the operator, a zero score gradient
        return real(s, valid, spec).detach() + 0 * s

    monkeypatch.setattr(graddiag, "closed_form_probs", broken)
    bad = gradient_diagnostics(model, tokens, blocks=blocks, decompose=False)
    assert bad["residual_rows"]["total"] == {
        "used": 0,
        "one_key": 0,
        "single_weight": 0,
        "zero_gradient": 2 * rows,
    }


def test_diagnostics_give_back_the_callers_gradients_and_train_mode():
    """The probe used to leave the model in eval mode and wipe the caller's .grad (zero_grad)."""
    torch.manual_seed(0)
    model = GPT(
        preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16), "lerp-k4"
    ).train()
    tokens = np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16)
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    gradient_diagnostics(model, tokens, blocks=2)
    assert model.training
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n


def test_the_diagnostic_pass_runs_under_deterministic_algorithms_and_restores_them():
    """App. F: "the diagnostic used deterministic algorithms". The pass requested none; now the forward and
    backward run with them on (on CPU too), the result says so, and the caller's mode is back afterwards."""
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16), "lerp-k4")
    tokens = np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16)
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(torch.are_deterministic_algorithms_enabled()))
    old = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(False, warn_only=True)
        res = gradient_diagnostics(model, tokens, blocks=2)
        assert seen == [True, True] and res["deterministic"] is True
        after = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        assert after == (False, True)
    finally:
        torch.use_deterministic_algorithms(old[0], warn_only=old[1])
