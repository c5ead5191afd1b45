"""``kinterval ops``: out-of-range table sizes are one error line, not a torch traceback or a NaN table."""

from __future__ import annotations

import pytest

from kinterval import cli


@pytest.mark.parametrize(
    "flags, message", [(["--T", "0"], "--T"), (["--T", "1"], "--T"), (["--T", "-5"], "--T"),
                       (["--scale", "nan"], "--scale"), (["--scale", "0"], "--scale")],
)  # fmt: skip
def test_ops_table_rejects_out_of_range_sizes(flags, message, capsys):
    assert cli.main(["ops", "--operators", "lerp-k4", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kinterval ops: error: {message} must be") and "\n" not in err
