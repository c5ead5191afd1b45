"""The model is causal under every operator and backend: the logits at position t do not depend on the tokens
after t (forward), and a loss on positions <= t sends no gradient to the later positions (backward: the
surrogates of eqs. (3)-(4) and the calibration terms of eq. (2) must not reach past the diagonal either).
A leak would show as a lower NLL than softmax, not as an error."""

import pytest
import torch

from kinterval.model import GPT, eval_precision, preset, train_precision
from triton_gate import skip_without_kernels

CFG = preset("tiny", vocab_size=97, block_size=24)
T = 24
# the last kept position: every one for the eager backends; for the kernels (whose tiles are 16 x 16 in the
# interpreter) one inside the first tile's diagonal and the first row of the second tile
CUTS = {"reference": range(T - 1), "closed_form": range(T - 1), "triton": (8, 16)}

OPERATORS = [
    "softmax",
    "sdpa",
    "bf16-exp",
    "fp8-exp",
    "lerp-k32",
    "lerp-k4[range_grad=detach]",
    "lerp-k4[range_grad=p1]",
    "lerp-k4[range_grad=max_only]",
    "minmax-weight-k4[arithmetic=historical]",
    "minmax-prob-k4",
    "fwm-weight-k4",
    "fwm-prob-k4[range_grad=min_only]",
    "resolved-weight-k4",
]
# the fused kernels (Triton's CPU interpreter without a GPU: a few seconds each): one of each family and mode
TRITON_OPERATORS = [
    "lerp-k32",
    "lerp-k4[range_grad=p1]",
    "minmax-weight-k4[arithmetic=historical]",
    "fwm-prob-k4",
]
CASES = [
    (op, be)
    for be in ("reference", "closed_form")
    for op in OPERATORS
    if not (op == "sdpa" and be != "reference")
]
CASES += [pytest.param(op, "triton", marks=pytest.mark.slow) for op in TRITON_OPERATORS]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _model(operator, backend):
    if backend == "triton":
        skip_without_kernels()
    torch.manual_seed(0)
    model = GPT(CFG, operator, "auto" if operator == "sdpa" else backend)
    with torch.no_grad():  # larger weights than the init: wide score rows, several grid intervals per row
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(20)
    return model.to(DEVICE)


def _tokens(cut):
    """Two batches that agree up to position ``cut`` and differ after it."""
    g = torch.Generator().manual_seed(cut)
    a = torch.randint(0, CFG.vocab_size, (2, T), generator=g)
    b = a.clone()
    b[:, cut + 1 :] = (
        a[:, cut + 1 :] + torch.randint(1, CFG.vocab_size, (2, T - cut - 1), generator=g)
    ) % CFG.vocab_size
    return a.to(DEVICE), b.to(DEVICE)


@pytest.mark.parametrize("operator, backend", CASES)
def test_later_tokens_change_no_earlier_logit(operator, backend):
    model = _model(operator, backend)
    for mode in ("train", "eval"):
        model.train(mode == "train")
        precision = train_precision if mode == "train" else eval_precision
        for cut in CUTS[backend]:
            a, b = _tokens(cut)
            with precision(CFG.numerics), torch.no_grad():
                la, _ = model(a)
                lb, _ = model(b)
            assert not torch.equal(la[:, cut + 1 :], lb[:, cut + 1 :]), "the changed tokens changed nothing"
            torch.testing.assert_close(
                la[:, : cut + 1], lb[:, : cut + 1], rtol=0, atol=1e-5, msg=f"{mode}, positions <= {cut}"
            )


@pytest.mark.parametrize("operator, backend", CASES)
def test_a_loss_on_early_positions_sends_no_gradient_to_later_ones(operator, backend):
    model = _model(operator, backend)
    a, _ = _tokens(0)
    for cut in CUTS[backend]:
        model.zero_grad(set_to_none=True)
        logits, _ = model(a)  # the gradient of the position embeddings, row by row, is the check
        logits[:, : cut + 1].float().logsumexp(-1).sum().backward()
        g = model.transformer.wpe.weight.grad
        assert g[: cut + 1].abs().sum() > 0, "no gradient at all: the check could not fail"
        assert torch.count_nonzero(g[cut + 1 :]) == 0, (
            f"{operator} ({backend}): a loss on positions <= {cut} reached later positions, "
            f"max |grad| {g[cut + 1 :].abs().max():.3g}"
        )
