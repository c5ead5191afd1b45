"""``outside_graph``: ``torch.compiler.disable`` for functions defined at import time, applied lazily
(no kinterval imports: the operators and the model both use it).

``@torch.compiler.disable`` imports ``torch._dynamo`` when the decorated module is imported: a second or
more of start-up in every process that imports the operators or the model (each ``kinterval`` command, each
rank), compiled or not. ``outside_graph`` wraps the function in ``torch.compiler.disable`` at its first call
instead. Under torch.compile the result is the same: the call is a graph break and runs eagerly (a first
call that is itself traced costs one more graph break, at the wrapping, and no recompilation).
"""

from __future__ import annotations

import functools

import torch


def outside_graph(fn):
    """``fn`` as ``torch.compiler.disable(fn)`` behaves, with the decorator's import at the first call."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call
