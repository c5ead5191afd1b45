"""The test command runs pytest-xdist with ``--dist loadgroup``: the tests of one ``xdist_group`` run in one
worker, so that their module fixture (a trained suite, a report) is built once. pytest 9.2 with
pytest-xdist 3.8 broke it without a word (pytest-xdist issue 1386): a CI run built the ci suite (a minute)
on both workers, and every other shared fixture too. This test fails where the grouping does not hold."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.xdist_group("xdist_groups")


def test_a_grouped_test_runs_as_its_group(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist with --dist loadgroup (the README's test command)")
    # pytest-xdist 3.x hands the group to its scheduler as a node-ID suffix
    assert request.node.nodeid.endswith("@xdist_groups"), (
        f"{request.node.nodeid}: pytest-xdist did not group this test (pytest {pytest.__version__}); shared "
        "module fixtures are built once per worker: pin pytest below the version that broke it"
    )
