"""An attention layer's fp32 scores recomputed from its input, and their row span.

Shared by training's validation log and the evaluation layer's geometry probe (paper §4 and App. C.3): the
scores are ``s = (q k^T) / sqrt(D)`` in fp32 with autocast off, exactly as the operator receives them (q, k,
v rounded to bf16 first under ``numerics.attention_dtype = "bfloat16"``), under the causal mask; the row span
is ``M - m``, the largest minus the smallest valid score of a row. A layer's own score modifications are
applied as its operator applies them: rotary positions (q and k from the layer's own ``heads``), the softcap
(``s = c tanh(s / c)``), grouped-query heads (k and v repeated for their q heads), and the sinks, as one more
key per row whose value is zero.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kinterval.model.gpt import CausalSelfAttention
from kinterval.model.numerics import attention_inputs, autocast_off


def attention_scores(module: CausalSelfAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(q, k, v, s, valid) of ``module`` on its input ``x`` (B, T, C): fp32 heads (B, H, T, D), fp32 scores
    and the causal mask (B, H, T, T). ``c_attn`` runs under the caller's autocast, as in the model. With
    grouped-query attention k and v are repeated to H heads; with sinks, s and valid have T + 1 keys (the
    last one the head's sink, valid unless it is -inf) and v has a zero row T, so that ``P v`` is the layer's
    output."""
    B, T, C = x.shape
    q, k, v = module.heads(x)
    q, k, v = attention_inputs(module.attention_dtype, q, k, v)  # fp32 tensors (bf16-rounded values if set)
    if module.n_kv_head != module.n_head:
        k, v = (t.repeat_interleave(module.n_head // module.n_kv_head, dim=1) for t in (k, v))
    with autocast_off(x.device.type):
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        i = torch.arange(T, device=x.device)
        valid = (i[None, :] <= i[:, None]).expand(s.shape)
        # The operator's own rules (ops.api.modified_scores and with_sinks, written out here so that this
        # module also runs beside the operator code a suite sitting pins): the softcap c tanh(s / c), and the
        # sink as key T, valid unless it is -inf (tests/model/test_attention_options.py holds the two to it).
        if module.softcap is not None:
            s = module.softcap * torch.tanh(s / module.softcap)
        if module.sinks is not None:
            sink = module.sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
            s, valid = torch.cat([s, sink], -1), torch.cat([valid, ~torch.isneginf(sink)], -1)
            v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], -2)
    return q, k, v, s, valid


def row_span(s: Tensor, valid: Tensor) -> Tensor:
    """``M - m`` of every row of ``s`` over its valid entries (shape ``s.shape[:-1]``)."""
    M = s.masked_fill(~valid, float("-inf")).amax(-1)
    m = s.masked_fill(~valid, float("inf")).amin(-1)
    return M - m
