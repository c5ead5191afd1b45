"""Snapshot of the fused kernels' results on every interpreter case of test_triton.py, to show that a change
of the kernel code leaves the results bit-identical. Not collected by pytest (about 6 minutes on 2 CPU cores).

    python tests/ops/kernel_snapshot.py save BEFORE.pt     # on the old code
    python tests/ops/kernel_snapshot.py compare BEFORE.pt  # on the new code: bitwise, NaN equal to NaN

It runs tests/ops/test_triton.py in Triton's CPU interpreter and records, for every call of the kernels
(``triton_attention``, also through ``kinterval_attention(backend="triton")``), the output and the gradients
that reach q, k and v, keyed by the test's id and the call's index within the test.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder:
    """pytest plugin: wraps the kernels' entry point for the duration of each test."""

    def __init__(self):
        self.records: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.test = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        from kinterval.ops.triton import autograd

        original = autograd.triton_attention
        self.test = item.nodeid.split("::", 1)[1]

        def recorded(q, k, v, spec, **kwargs):
            key = f"{self.test}#{self.calls[self.test]}"
            self.calls[self.test] += 1
            out = original(q, k, v, spec, **kwargs)
            self.records[f"{key}/out"] = out.detach().clone()
            for name, x in zip("qkv", (q, k, v)):
                if x.requires_grad:
                    x.register_hook(lambda g, n=name: self.records.__setitem__(f"{key}/d{n}", g.clone()))
            return out

        autograd.triton_attention = recorded
        try:
            yield
        finally:
            autograd.triton_attention = original


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, with NaN equal to NaN (several cases test NaN rows; torch.equal calls NaN != NaN)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0))


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "compare"):
        print(__doc__)
        return 2
    action, path = sys.argv[1:]
    os.environ["TRITON_INTERPRET"] = "1"
    rec = Recorder()
    code = pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_triton.py")], plugins=[rec])
    cases = sorted({k.rsplit("#", 1)[0] for k in rec.records})
    print(
        f"{len(rec.records)} tensors from {sum(rec.calls.values())} kernel calls in {len(cases)} test cases"
    )
    if action == "save":
        torch.save(rec.records, path)
        return int(code)
    before = torch.load(path)
    missing = sorted(set(before) ^ set(rec.records))
    differ = [k for k in sorted(set(before) & set(rec.records)) if not _same(before[k], rec.records[k])]
    for k in missing:
        print("only in one snapshot:", k)
    for k in differ:
        print("differs:", k)
    common = len(set(before) & set(rec.records))
    print(f"bit-identical: {common - len(differ)} of the {common} tensors in both snapshots")
    return int(bool(missing or differ or code))


if __name__ == "__main__":
    sys.exit(main())
