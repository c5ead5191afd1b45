"""First-order-only backward functions: a second derivative through them raises instead of coming out wrong.

``closed_form`` and the triton kernels compute their gradients outside autograd. Differentiated again (a
gradient penalty, ``create_graph=True``), those gradients carry no dependence on the scores, so the second
derivative silently missed most of its terms (lerp-k4, d|dq|^2/dk: 20.4 against the reference's 202).
``torch.autograd.function.once_differentiable`` does not catch this: its error node hangs off the incoming
gradient only (and is not even created when that gradient needs none), so a derivative with respect to q or
k never reaches it. ``first_order_only`` ties the returned gradients to the incoming gradient *and* to the
saved inputs through a node whose backward raises.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

MESSAGE = (
    "{name}: its gradient is first order only (computed outside autograd), so it cannot be differentiated "
    "again (double backward, create_graph=True); use backend='reference', which differentiates the "
    "operator's formulas with autograd to any order"
)


class _SecondOrderError(torch.autograd.Function):
    """Identity on the first ``n`` tensors; the rest are the tensors they depend on. Backward raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(name: str, n: int, *tensors: Tensor):
        return tensors[:n]

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.name = inputs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(MESSAGE.format(name=ctx.name))


def first_order_only(name: str):
    """Decorator for the ``backward`` staticmethod of a ``torch.autograd.Function``: runs it under no_grad
    and, when the gradients are built with ``create_graph=True``, ties them to the incoming gradients and the
    saved tensors, so that differentiating them raises a RuntimeError naming ``name``."""

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grad_outputs):
            with torch.no_grad():
                grads = backward(ctx, *grad_outputs)
            if not torch.is_grad_enabled():  # the usual first-order backward
                return grads
            deps = [
                t for t in (*grad_outputs, *ctx.saved_tensors) if isinstance(t, Tensor) and t.requires_grad
            ]
            single = not isinstance(grads, tuple)
            grads = (grads,) if single else tuple(grads)
            where = [i for i, g in enumerate(grads) if isinstance(g, Tensor)]
            if not deps or not where:
                return grads[0] if single else grads
            tied = _SecondOrderError.apply(name, len(where), *(grads[i] for i in where), *deps)
            tied = (tied,) if isinstance(tied, Tensor) else tied
            out = list(grads)
            for i, g in zip(where, tied):
                out[i] = g
            return out[0] if single else tuple(out)

        return wrapper

    return decorate
