"""Skips for the tests that run the fused kernels (on a GPU or in Triton's CPU interpreter): where triton is
missing, or older than the kernels need (``kinterval.ops.backends.triton_problem``), they skip with that
reason. Under ``CI=true`` tests/conftest.py imports triton first, so CI cannot skip them for a missing one."""

import pytest

from kinterval.ops.backends import triton_problem

PROBLEM = triton_problem()
needs_kernels = pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))


def skip_without_kernels(module: bool = False) -> None:
    """Skip the calling test (or, with ``module=True``, the whole module) where the kernels cannot run."""
    if PROBLEM is not None:
        pytest.skip(PROBLEM, allow_module_level=module)
