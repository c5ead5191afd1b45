"""``outside_graph``: torch.compiler.disable applied at the first call (kinterval/graph_break.py)."""

from __future__ import annotations

import pytest
import torch

from kinterval.graph_break import outside_graph


@pytest.mark.parametrize("first_call", ["compiled", "eager"])
def test_a_call_runs_eagerly_outside_the_graph_as_torch_compiler_disable_makes_it(first_call):
    from torch._dynamo.testing import CompileCounter

    seen = []

    def op(x):
        seen.append(torch.compiler.is_compiling())  # traced, this would be True (and run once, at tracing)
        return x.exp()

    lazy = outside_graph(op)
    assert lazy.__name__ == "op"
    if first_call == "eager":
        lazy(torch.zeros(1))
        seen.clear()
    counts = {}
    for name, fn in (("lazy", lazy), ("disable", torch.compiler.disable(op))):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(lambda x, fn=fn: fn(x * 2) + 1, backend=counter)
        x = torch.randn(5)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), (x * 2).exp() + 1)
        counts[name] = (counter.frame_count, counter.op_count)
    assert seen == [False] * 6  # every call ran, eagerly
    assert counts["lazy"] == counts["disable"] == (2, 2), counts  # the graphs either side, compiled once
