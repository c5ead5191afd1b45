"""Geometry probe (paper §4, App. C.3): what the operator does to the model's own learned scores.

On the first 8 validation blocks forward pre-hooks on every attention layer recompute its fp32 scores exactly
as the operator does (``eval.attention.qkv_scores``) while the model runs unchanged. For every row ``i >= 1``
(at least two keys) we record the span ``M - m``, the native width ``h`` (``(M-m)/K`` MinMax, ``tau/K``
FWM/resolved), the 0.1% quantile of ``z = s - M``, the per-token query/key norms, the softmax entropy, the
fraction of keys with ``z < -6``, the top-bucket mass (softmax mass on
keys in the operator's top interval (LERP) or top level (Nearest)), the effective number of buckets
``exp H(q)`` with ``q_b ~ sum_{j in b} P^E_j`` (tail keys truncated by FWM form one bucket) and
``TV = 1/2 sum_j |P^native_j - P^E_j|``. A model with attention sinks (``model.attn_sinks``) also gets the
sink's share of each row, under the operator (``sink_mass``) and under softmax (``sink_mass_softmax``); the
sink is one more key of every row, for the span and the grid too. App. D.4's tail measures come with a
K-interval operator: the operator's and softmax's probability mass on the tail keys ``z < -tau`` (the keys
FWM sets to zero; tau = 6 for MinMax) and, under Nearest, the distinct nonzero grid levels of a row. Rows are
averaged per layer; the layer mean is reported too. A
NaN or infinite value on a row with two or more keys (non-finite scores: a diverged checkpoint) is a
``ValueError`` naming the layer, never a dropped row.
For a softmax run the operator-dependent quantities need ``spec`` (e.g. the operator one would deploy).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from kinterval.data.loader import first_blocks, get_block
from kinterval.eval.attention import attention_layers, layer_spec, qkv_scores
from kinterval.model import autocast, eval_precision
from kinterval.ops import OperatorSpec
from kinterval.ops.reference import grid, reference_probs, row_extrema

SOFTMAX = OperatorSpec.parse("softmax")

ROW_METRICS = ("span", "h", "z_q001", "entropy", "frac_z_below_6", "top_bucket_mass", "eff_buckets", "tv")
OPERATOR_METRICS = ("h", "top_bucket_mass", "eff_buckets", "tv")  # defined by a K-interval operator's grid
METRICS = (*ROW_METRICS, "q_norm", "k_norm")
SINK_METRICS = ("sink_mass", "sink_mass_softmax")  # layers with attention sinks only
TAIL_METRICS = ("tail_mass", "tail_mass_softmax", "levels")  # App. D.4 (levels: Nearest reconstruction only)


def _quantile(z: Tensor, valid: Tensor, q: float) -> Tensor:
    """Per-row ``q`` quantile of the valid entries (linear interpolation, as numpy/torch.quantile)."""
    zs = torch.where(valid, z, torch.full_like(z, float("inf"))).sort(-1).values
    n = valid.sum(-1, keepdim=True)
    pos = q * (n - 1).clamp(min=0).to(z.dtype)
    lo = pos.floor().long()
    hi = torch.minimum(lo + 1, (n - 1).clamp(min=0))
    a, b = zs.gather(-1, lo), zs.gather(-1, hi)
    return (a + (pos - lo.to(z.dtype)) * (b - a)).squeeze(-1)


def _buckets(s: Tensor, valid: Tensor, spec: OperatorSpec) -> tuple[Tensor, Tensor, Tensor]:
    """(bucket id, top-bucket indicator, tail indicator) per key: the interval index r (LERP) or the level
    l = r + [t >= 1/2] (Nearest); keys the operator sets to zero (FWM tail) are the tail."""
    ext = row_extrema(s, valid)
    s_safe = torch.where(valid, s, ext.M.expand_as(s))
    g = grid(s_safe, valid, spec, ext.M, ext.m)
    ids = g.r if spec.reconstruction == "lerp" else g.r + (g.t >= 0.5).to(s.dtype)
    top_id = spec.K - 1 if spec.reconstruction == "lerp" else spec.K
    ids = torch.where(g.ones, torch.full_like(ids, top_id), ids)  # degenerate MinMax rows: one bucket
    top = (g.keep & (ids == top_id)) | g.ones
    return ids, top, valid & ~g.keep & ~g.ones


def effective_buckets(PE: Tensor, ids: Tensor, tail: Tensor, valid: Tensor) -> Tensor:
    """exp H(q) with q_b proportional to the softmax mass of the keys in bucket b (the tail is one bucket)."""
    shape = PE.shape[:-1]
    PE, ids, tail, valid = (x.reshape(-1, x.shape[-1]) for x in (PE, ids, tail, valid))
    inb = valid & ~tail
    lo = ids.masked_fill(~inb, float("inf")).amin(-1, keepdim=True)
    lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    idx = torch.where(inb, (ids - lo).round().long(), torch.zeros_like(ids, dtype=torch.long))
    nb = int(idx.max()) + 2 if idx.numel() else 2
    idx = torch.where(tail, torch.full_like(idx, nb - 1), idx)
    q = torch.zeros(idx.shape[0], nb, dtype=PE.dtype, device=PE.device)
    q.scatter_add_(1, idx, torch.where(valid, PE, torch.zeros_like(PE)))
    q = q / q.sum(-1, keepdim=True).clamp(min=1e-300)
    H = -(q * torch.where(q > 0, q.log(), torch.zeros_like(q))).sum(-1)
    return H.exp().reshape(shape)


def distinct_levels(ids: Tensor, keep: Tensor) -> Tensor:
    """The number of distinct values of ``ids`` over the keys in ``keep``, per row."""
    srt = torch.where(keep, ids, torch.full_like(ids, float("inf"))).sort(-1).values
    new = torch.ones_like(keep)
    new[..., 1:] = srt[..., 1:] != srt[..., :-1]
    return (new & torch.isfinite(srt)).sum(-1).to(ids.dtype)


def row_geometry(s: Tensor, valid: Tensor, spec: OperatorSpec | str | None = None) -> dict[str, Tensor]:
    """Per-row geometry of scores ``s`` (..., T) under ``spec``; rows with fewer than two valid keys are NaN.

    Operator-dependent values (h, top-bucket mass, effective buckets, TV, the tail masses and levels) are NaN
    when ``spec`` is None or a baseline (softmax, bf16-exp, fp8-exp); ``levels`` is NaN under LERP too (its
    weights interpolate between levels).
    """
    s = s.double() if s.dtype == torch.float64 else s.float()
    spec = OperatorSpec.from_full_name(spec) if isinstance(spec, str) else spec
    ext = row_extrema(s, valid)
    z = torch.where(valid, s - ext.M, torch.zeros_like(s))
    nv = valid.sum(-1).to(s.dtype)
    ok = nv >= 2
    PE = reference_probs(s, valid, SOFTMAX)
    logP = torch.where(PE > 0, PE.log(), torch.zeros_like(PE))
    out = {
        "span": (ext.M - ext.m).squeeze(-1),
        "z_q001": _quantile(z, valid, 0.001),
        "entropy": -(PE * logP).sum(-1),
        "frac_z_below_6": (valid & (z < -6)).sum(-1).to(s.dtype) / nv.clamp(min=1),
    }
    nan = torch.full_like(out["span"], float("nan"))
    if spec is not None and spec.is_kinterval:
        span = out["span"]
        out["h"] = span / spec.K if spec.calibration == "minmax" else torch.full_like(span, spec.tau / spec.K)
        ids, top, tail = _buckets(s, valid, spec)
        out["top_bucket_mass"] = (PE * top).sum(-1)
        out["eff_buckets"] = effective_buckets(PE, ids, tail, valid)
        Pn = reference_probs(s, valid, spec)
        out["tv"] = 0.5 * (Pn - PE).abs().sum(-1)
        tail_keys = valid & (z < -spec.tau)  # App. D.4: below FWM's window, whatever the operator does there
        out["tail_mass"] = (Pn * tail_keys).sum(-1)
        out["tail_mass_softmax"] = (PE * tail_keys).sum(-1)
        out["levels"] = distinct_levels(ids, valid & (Pn > 0)) if spec.reconstruction == "nearest" else nan
    else:
        out.update({k: nan.clone() for k in ("h", "top_bucket_mass", "eff_buckets", "tv", *TAIL_METRICS)})
    return {k: torch.where(ok, v, torch.full_like(v, float("nan"))) for k, v in out.items()}


@torch.no_grad()
def geometry_probe(
    model: torch.nn.Module,
    tokens: np.ndarray,
    T: int | None = None,
    *,
    blocks: int = 8,
    spec: OperatorSpec | str | None = None,
) -> dict:
    """Layer-wise geometry over the first ``blocks`` validation blocks (rows i >= 1, averaged over rows).

    ``spec``: the operator whose grid defines h, buckets and TV; default each layer's own operator.
    Returns ``{"layers": [{metric: value}], "mean": {metric: layer mean}, "operator": name, "n_blocks": n}``.
    """
    T = T or model.config.block_size
    n = first_blocks(len(tokens), T, blocks)
    layers = attention_layers(model)
    sums = [dict.fromkeys(METRICS, 0.0) for _ in layers]
    counts = [dict.fromkeys(METRICS, 0) for _ in layers]
    used = {}

    def hook(idx):
        def pre_hook(module, args):
            q, k, _, s, valid = qkv_scores(module, args[0])
            if not torch.isfinite(s[valid]).all():  # before the grid, which assumes finite scores
                raise ValueError(
                    f"geometry: layer {idx}: the scores are NaN or infinite (a diverged checkpoint?)"
                )
            own = layer_spec(module)
            probe_spec = OperatorSpec.from_full_name(spec) if isinstance(spec, str) else (spec or own)
            used[idx] = probe_spec.full_name
            rows = row_geometry(s[..., 1:, :], valid[..., 1:, :], probe_spec)
            rows["q_norm"] = q[..., 1:, :].norm(dim=-1)
            rows["k_norm"] = k[..., 1:, :].norm(dim=-1)
            if module.sinks is not None:  # the sink is each row's last key (model.scores)
                for key, sink_spec in zip(SINK_METRICS, (probe_spec, SOFTMAX)):
                    rows[key] = reference_probs(s[..., 1:, :], valid[..., 1:, :], sink_spec)[..., -1]
            has_value = valid[..., 1:, :].sum(-1) >= 2  # rows of one key have no geometry
            for key, v in rows.items():
                if key in OPERATOR_METRICS + TAIL_METRICS and not probe_spec.is_kinterval:
                    continue  # no grid under a baseline: the layer's value is NaN
                if key == "levels" and probe_spec.reconstruction != "nearest":
                    continue  # LERP's weights are not on the levels
                v = v[has_value.expand_as(v)]
                if not torch.isfinite(v).all():
                    raise ValueError(f"geometry: layer {idx}: {key} is NaN or infinite on "
                                     f"{int((~torch.isfinite(v)).sum())} of {v.numel()} rows")  # fmt: skip
                sums[idx][key] = sums[idx].get(key, 0.0) + float(v.double().sum())
                counts[idx][key] = counts[idx].get(key, 0) + v.numel()

        return pre_hook

    numerics = model.config.numerics
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(layers)]
    try:
        with eval_precision(numerics):
            for b in range(n):
                x, _ = get_block(tokens, b, T)
                with autocast(numerics, device):
                    model(x[None].to(device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    # the tail measures where a layer has a grid (levels: where it reconstructs by Nearest; LERP's weights
    # are not on levels), the sink's share where a layer has sinks
    tail = tuple(k for k in TAIL_METRICS if any(counts[i].get(k) for i in range(len(layers))))
    metrics = METRICS + tail + (SINK_METRICS if any(m.sinks is not None for m in layers) else ())
    per_layer = [
        {k: (sums[i][k] / counts[i][k] if counts[i].get(k) else float("nan")) for k in metrics}
        for i in range(len(layers))
    ]
    mean = {k: float(np.mean([row[k] for row in per_layer])) for k in metrics}
    return {"layers": per_layer, "mean": mean, "operator": used.get(0), "n_blocks": n}
