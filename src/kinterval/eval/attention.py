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
import types
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from kinterval.model import SDPA, CausalSelfAttention
from kinterval.model.numerics import autocast_off
from kinterval.model.scores import attention_scores
from kinterval.ops import OperatorSpec

ProbsFn = Callable[..., Tensor]  # fn(layer index, scores, valid, q, k) -> probabilities


def layer_spec(module: CausalSelfAttention) -> OperatorSpec:
    """The layer's operator as a spec (PyTorch SDPA counts as softmax)."""
    return OperatorSpec.parse("softmax") if module.operator == SDPA else module.operator


def attention_layers(model: torch.nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


# (q, k, v, s, valid) of a layer on its input: fp32 heads, fp32 scores and the causal mask (one definition,
# shared with training's validation log).
qkv_scores = attention_scores


@contextlib.contextmanager
def patched_attention(model: torch.nn.Module, fn: ProbsFn) -> Iterator[None]:
    layers = attention_layers(model)
    saved = [m.forward for m in layers]

    def make(idx: int):
        def forward(self, x: Tensor) -> Tensor:
            B, T, C = x.shape
            q, k, v, s, valid = qkv_scores(self, x)
            with autocast_off(x.device.type):
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
