"""An attention layer's fp32 scores recomputed from its input, and their row span.

Shared by training's validation log and the evaluation layer's geometry probe (paper §4 and App. C.3): the
scores are ``s = (q k^T) / sqrt(D)`` in fp32 with autocast off, exactly as the operator receives them (q, k,
v rounded to bf16 first under ``numerics.attention_dtype = "bfloat16"``), under the causal mask; the row span
is ``M - m``, the largest minus the smallest valid score of a row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kinterval.model.gpt import CausalSelfAttention
from kinterval.model.numerics import attention_inputs


def attention_scores(module: CausalSelfAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(q, k, v, s, valid) of ``module`` on its input ``x`` (B, T, C): fp32 heads (B, H, T, D), fp32 scores
    and the causal mask (B, H, T, T). ``c_attn`` runs under the caller's autocast, as in the model."""
    B, T, C = x.shape
    q, k, v = module.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, module.n_head, C // module.n_head).transpose(1, 2) for t in (q, k, v))
    q, k, v = attention_inputs(module.attention_dtype, q, k, v)  # fp32 tensors (bf16-rounded values if set)
    with torch.autocast(device_type=x.device.type, enabled=False):
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    i = torch.arange(T, device=x.device)
    valid = (i[None, :] <= i[:, None]).expand(s.shape)
    return q, k, v, s, valid


def row_span(s: Tensor, valid: Tensor) -> Tensor:
    """``M - m`` of every row of ``s`` over its valid entries (shape ``s.shape[:-1]``)."""
    M = s.masked_fill(~valid, float("-inf")).amax(-1)
    m = s.masked_fill(~valid, float("inf")).amin(-1)
    return M - m
