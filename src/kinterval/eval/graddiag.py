"""Gradient diagnostics (paper App. F): zero-sum residual of the implemented score gradient along training and
the fixed-upstream decomposition of the score gradient into self, M and m terms.

The loss over the first ``blocks`` validation blocks is back-propagated block by block (``loss_b / blocks``)
through the checkpoint's own operator with the closed-form backward (the implemented gradient, including any
``range_grad`` modification). Per layer we record

* the zero-sum residual ``|sum_j g_ij| / sum_j |g_ij|`` of every row ``i >= 1`` whose gradient is not all
  zero (0/0 has no residual: rows of one valid key, FWM rows with one key in the window); summarised as the
  median over rows and the fraction of rows above 1e-3, then the mean over layers; the rows left out are
  counted by reason (``residual_rows``: one valid key; one key holding all the probability; an all-zero
  gradient on a row whose probability is spread over two or more keys, which a correct backward does not
  give and so flags a broken one);
* with the upstream ``u = dL/dP`` of that layer fixed, the terms ``self``, ``M``, ``m`` of the full-gradient
  operator at the same scores (:func:`kinterval.ops.closed_form.score_grad_terms`), ``g_full = self + M + m``:
  norm ratios ``||term|| / ||g_full||`` and relative errors ``||g_mode - g_full|| / ||g_full||`` for detach
  (self), min_only (self + m), max_only (self + M) and "P1 (local)" (the zero-sum projection of self);
  per layer, then averaged over layers. This local VJP is not the whole-model in-graph backward.

The pass runs as the paper's did: deterministic algorithms (``deterministic`` in the result; the caller's
mode comes back afterwards), the checkpoint's evaluation numerics (fp32 attention, bf16 autocast outside it
on CUDA, TF32 off).

A NaN or infinite gradient on such a row is a ``ValueError`` naming the layer, never a dropped or good row.
"""

from __future__ import annotations

import numpy as np
import torch

from kinterval.data.loader import first_blocks, get_block
from kinterval.eval.attention import attention_layers, layer_spec, patched_attention
from kinterval.model import autocast, eval_precision
from kinterval.ops import OperatorSpec
from kinterval.ops.closed_form import closed_form_probs, score_grad_terms
from kinterval.ops.diagnostics import zero_sum_residual as row_zero_sum_residual
from kinterval.ops.reference import project_zero_sum
from kinterval.train.loop import deterministic

DECOMP = ("norm_self", "norm_M", "norm_m", "err_detach", "err_min_only", "err_max_only", "err_p1_local")


def median(x: torch.Tensor) -> float:
    """The median of ``x``'s values (the mean of the two middle ones for an even count; ``torch.median`` gives
    the lower), NaN when empty. Kept here, not imported from the operators' diagnostics, so that the command
    also runs against the operator code a suite folder was pinned to."""
    return float(np.median(x.detach().double().cpu().numpy())) if x.numel() else float("nan")


def zero_sum_residual(g: torch.Tensor, valid: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """``|sum_j g_j| / sum_j |g_j|`` over valid keys (``ops.diagnostics.zero_sum_residual``, float64) of every
    row whose gradient is not all zero (such a row, e.g. one of a single valid key, has no residual),
    flattened. A NaN or infinite row is kept, and is a ``ValueError`` naming the layer."""
    g = torch.where(valid, g, torch.zeros_like(g)).double()
    r = row_zero_sum_residual(g)
    r = r[g.abs().sum(-1) != 0]  # NaN != 0: a non-finite row is never dropped
    check_finite(r, layer, "the zero-sum residual")
    return r


ROW_REASONS = ("used", "one_key", "single_weight", "zero_gradient")


def residual_row_counts(g: torch.Tensor, valid: torch.Tensor, P: torch.Tensor) -> dict[str, int]:
    """How many rows enter the zero-sum residual (``used``) and why the others do not, for gradient ``g``,
    mask ``valid`` and forward probabilities ``P`` (rows are the last dim). A row is left out when its
    gradient on the valid keys is all zero (0/0): ``one_key``, at most one valid key (nothing to vary);
    ``single_weight``, two or more valid keys but all the probability on one of them (e.g. FWM with one key
    in the window), where the exact gradient is zero; ``zero_gradient``, the probability spread over two or
    more keys and still an all-zero gradient: not a property of the operator (bar a degenerate MinMax row of
    span <= 1e-12) but a broken backward, which the residual alone would hide."""
    g = torch.where(valid, g, torch.zeros_like(g))
    zero = g.abs().sum(-1) == 0  # a NaN row is not zero: it is used (and raises in zero_sum_residual)
    n_valid = valid.sum(-1)
    spread = ((P > 0) & valid).sum(-1) >= 2
    counts = {
        "used": ~zero,
        "one_key": zero & (n_valid <= 1),
        "single_weight": zero & (n_valid >= 2) & ~spread,
        "zero_gradient": zero & (n_valid >= 2) & spread,
    }
    return {k: int(v.sum()) for k, v in counts.items()}


def check_finite(x: torch.Tensor, layer: int, what: str) -> None:
    """``ValueError`` naming the layer when ``x`` holds a NaN or an infinity (a diverged checkpoint)."""
    if not torch.isfinite(x).all():
        raise ValueError(f"layer {layer}: {what} is NaN or infinite (the score gradient is not finite)")


def full_spec(spec: OperatorSpec) -> OperatorSpec:
    return OperatorSpec.parse(spec, range_grad="full") if spec.is_kinterval else spec


def decomposition_sums(s, valid, spec: OperatorSpec, u) -> dict[str, float]:
    """Squared norms of g_full, the three terms of dL/ds, eq. (2) (direct, through M, through m) and the mode
    errors for one layer and block."""
    t = score_grad_terms(s, valid, full_spec(spec), u)
    full = t["self"] + t["M"] + t["m"]
    p1 = project_zero_sum(t["self"], valid)

    def sq(x):
        return float(x.double().pow(2).sum())

    return {
        "full": sq(full),
        "norm_self": sq(t["self"]),
        "norm_M": sq(t["M"]),
        "norm_m": sq(t["m"]),
        "err_detach": sq(t["M"] + t["m"]),
        "err_min_only": sq(t["M"]),
        "err_max_only": sq(t["m"]),
        "err_p1_local": sq(p1 - full),
    }


def gradient_diagnostics(
    model: torch.nn.Module,
    tokens: np.ndarray,
    T: int | None = None,
    *,
    blocks: int = 8,
    decompose: bool = True,
) -> dict:
    """Zero-sum residual (and optionally the decomposition) over the first ``blocks`` blocks."""
    T = T or model.config.block_size
    n = first_blocks(len(tokens), T, blocks)
    layers = attention_layers(model)
    specs = [layer_spec(m) for m in layers]
    residuals: list[list[torch.Tensor]] = [[] for _ in layers]
    sums = [dict.fromkeys(("full", *DECOMP), 0.0) for _ in layers]
    row_counts = [dict.fromkeys(ROW_REASONS, 0) for _ in layers]
    captured: dict[int, dict] = {}

    def fn(idx, s, valid, q, k):
        P = closed_form_probs(s, valid, specs[idx])
        slot = captured.setdefault(idx, {"s": s.detach(), "valid": valid, "P": P.detach()})
        s.register_hook(lambda g: slot.__setitem__("g", g.detach()))
        P.register_hook(lambda u: slot.__setitem__("u", u.detach()))
        return P

    numerics = model.config.numerics
    device = next(model.parameters()).device
    # the probe's gradients accumulate in .grad: the caller's are put aside and given back, as is train mode
    was_training, params = model.training, list(model.parameters())
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    model.eval()
    try:
        with (
            deterministic(device, required=True),
            eval_precision(numerics),
            patched_attention(model, fn),
            torch.enable_grad(),
        ):
            used_deterministic = torch.are_deterministic_algorithms_enabled()
            for b in range(n):
                captured.clear()
                x, y = get_block(tokens, b, T)
                with autocast(numerics, device):
                    _, loss = model(x[None].to(device), y[None].to(device))
                (loss / n).backward()
                for idx, slot in captured.items():
                    rows = (slot["s"][..., 1:, :], slot["valid"][..., 1:, :])
                    g_rows = slot["g"][..., 1:, :]
                    residuals[idx].append(zero_sum_residual(g_rows, rows[1], idx).cpu())
                    for key, v in residual_row_counts(g_rows, rows[1], slot["P"][..., 1:, :]).items():
                        row_counts[idx][key] += v
                    if decompose:
                        d = decomposition_sums(*rows, specs[idx], slot["u"][..., 1:, :])
                        check_finite(torch.tensor(list(d.values())), idx, "the decomposition")
                        for key, v in d.items():
                            sums[idx][key] += v
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        model.train(was_training)
    per_layer = []
    for idx in range(len(layers)):
        r = torch.cat(residuals[idx]) if residuals[idx] else torch.zeros(0)
        row = {
            "zero_sum_residual": median(r),
            "rows_above_1e-3": float((r > 1e-3).double().mean()) if r.numel() else float("nan"),
        }
        if decompose:
            full = np.sqrt(sums[idx]["full"])
            row.update({k: (np.sqrt(sums[idx][k]) / full if full > 0 else float("nan")) for k in DECOMP})
        per_layer.append(row)
    # the mean over the layers that have the value: a layer without a usable row (every row FWM's single
    # key in the window, or degenerate MinMax) has none, and is counted in ``mean_layers``, not averaged in
    have = {k: [row[k] for row in per_layer if np.isfinite(row[k])] for k in per_layer[0]}
    mean = {k: float(np.mean(v)) if v else float("nan") for k, v in have.items()}
    total = {k: sum(c[k] for c in row_counts) for k in ROW_REASONS}
    return {
        "layers": per_layer,
        "mean": mean,
        "mean_layers": {k: len(v) for k, v in have.items()},
        "operator": specs[0].full_name,
        "n_blocks": n,
        "residual_rows": {"layers": row_counts, "total": total},
        "deterministic": used_deterministic,
    }
