"""Instrumented attention: recompute each layer's fp32 scores exactly as the operator does and swap the
probability function, for the geometry probe, the gradient diagnostics and the tau screen.

``patched_attention(model, fn)`` replaces each
:class:`~kinterval.model.CausalSelfAttention` forward by one that
computes ``q, k, v`` with the layer's own ``c_attn`` (under the caller's autocast, as the model does), the
scores
``s = (q k^T) * scale`` in fp32 with autocast off, the causal mask, then
``P = fn(layer, s, valid, q, k)``; the
output is ``P v`` through the layer's ``c_proj``. It relies on the layer's public submodules (``c_attn``,
``c_proj``, ``n_head``) only.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from kinterval.model import SDPA, CausalSelfAttention
from kinterval.ops import OperatorSpec

ProbsFn = Callable[..., Tensor]  # fn(layer index, scores, valid, q, k) -> probabilities


def layer_spec(module: CausalSelfAttention) -> OperatorSpec:
    """The layer's operator as a spec (PyTorch SDPA counts as softmax)."""
    return OperatorSpec.parse("softmax") if module.operator == SDPA else module.operator


def attention_layers(model: torch.nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def qkv_scores(module: CausalSelfAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(q, k, v, s, valid): fp32 heads (B, H, T, D), fp32 scores and the causal mask (B, H, T, T)."""
    B, T, C = x.shape
    q, k, v = module.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, module.n_head, C // module.n_head).transpose(1, 2).float() for t in (q, k, v))
    with torch.autocast(device_type=x.device.type, enabled=False):
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    i = torch.arange(T, device=x.device)
    valid = (i[None, :] <= i[:, None]).expand(s.shape)
    return q, k, v, s, valid


@contextlib.contextmanager
def patched_attention(model: torch.nn.Module, fn: ProbsFn) -> Iterator[None]:
    layers = attention_layers(model)
    saved = [m.forward for m in layers]

    def make(idx: int):
        def forward(self, x: Tensor) -> Tensor:
            B, T, C = x.shape
            q, k, v, s, valid = qkv_scores(self, x)
            with torch.autocast(device_type=x.device.type, enabled=False):
                y = torch.matmul(fn(idx, s, valid, q, k), v)
            return self.c_proj(y.to(x.dtype).transpose(1, 2).contiguous().view(B, T, C))

        return forward

    try:
        for idx, m in enumerate(layers):
            m.forward = types.MethodType(make(idx), m)
        yield
    finally:
        for m, f in zip(layers, saved):
            m.forward = f
