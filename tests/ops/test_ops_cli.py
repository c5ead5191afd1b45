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


# ---------------------------------------------------------------------- audit fixes (seed, --T, --operators)
def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval ops: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("action", [[], ["verify"]])
def test_ops_refuses_a_T_whose_tensors_do_not_fit(action, capsys, monkeypatch):
    """--T 100000 was an allocator RuntimeError traceback (640 GB asked for), after the table had begun."""
    assert cli.main(["ops", *action, "--T", "100000"]) == 2
    assert "--T 100000 needs about" in _one_error_line(capsys)
    from kinterval.ops import commands

    monkeypatch.setattr(commands, "_memory_available", lambda: 2**30)  # 1 GiB: T = 1024 needs 3
    assert cli.main(["ops", *action, "--T", "1024"]) == 2
    assert "more than the 1.0 GiB available; use a smaller --T" in _one_error_line(capsys)


@pytest.mark.parametrize("seed", ["99999999999999999999999", "4294967296", "-1"])
def test_ops_table_refuses_a_seed_out_of_range(seed, capsys):
    """torch's manual_seed failed with "Overflow when unpacking long long" (a traceback)."""
    assert cli.main(["ops", "--operators", "lerp-k4", "--T", "2", "--seed", seed]) == 2
    assert "--seed must be an integer from 0 to 4294967295" in _one_error_line(capsys)
    assert cli.main(["ops", "--operators", "lerp-k4", "--T", "2", "--seed", "4294967295"]) == 0


def test_ops_table_names_read_back_as_operators(capsys):
    """The printed full names (`lerp-k4[range_grad=detach]`, overrides with a comma between them) were
    'unknown operator name' as --operators: the list was split at every comma and parsed without overrides."""

    def table(*flags) -> list[list[str]]:
        assert cli.main(["ops", "--T", "5", *flags]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [
            line.split() for line in lines[lines.index(next(x for x in lines if x.startswith("---"))) + 1 :]
        ]

    first = table("--operators", "softmax,fwm-prob-k4[tau=5],lerp-k4", "--range-grad", "detach")
    names = [row[0] for row in first]
    assert names == ["softmax", "fwm-prob-k4[tau=5,range_grad=detach]", "lerp-k4[range_grad=detach]"]
    assert table("--operators", ",".join(names)) == first  # the same operators, the same numbers
    assert table("--operators", " , ".join(names) + ",") == first  # spaces and a trailing comma


def test_ops_table_reports_the_override_error_itself(capsys):
    """tau=0 was reported as an 'unknown operator name', not as tau out of range."""
    assert cli.main(["ops", "--T", "2", "--operators", "softmax,fwm-prob-k4[tau=0]"]) == 2
    err = _one_error_line(capsys)
    assert "tau must be a finite number in (0, 1000], got 0.0" in err and "unknown operator" not in err
    assert (
        cli.main(["ops", "--T", "2", "--operators", "lerp-k4[range_grad=p1]", "--range-grad", "detach"]) == 2
    )
    assert "sets range_grad=p1, --range-grad says detach" in _one_error_line(capsys)
    for name, flag in (("lerp-k4[range_grad=full]", "detach"), ("lerp-k4[range_grad=detach]", "full")):
        assert cli.main(["ops", "--T", "2", "--operators", name, "--range-grad", flag]) == 2  # was silent
        assert f"--range-grad says {flag}" in _one_error_line(capsys)
    assert cli.main(["ops", "--T", "2", "--operators", " , "]) == 2
    assert "--operators names no operator" in _one_error_line(capsys)


@pytest.mark.parametrize("action", [[], ["verify"], ["consistency"]])
def test_ops_names_the_scale_that_overflows_float32(action, capsys):
    """--scale 1e39 made the table and verify say only "scores contain NaN or +inf on keys that are not
    masked" (their float32 draws overflowed), naming no flag."""
    assert cli.main(["ops", *action, "--scale", "1e39", "--T", "8"]) == 2
    assert "--scale 1e+39 makes float32 scores overflow; use a smaller --scale" in _one_error_line(capsys)
    # a finite scale whose draws overflow (8 sd above float32's largest value): named the same way
    assert cli.main(["ops", *action, "--scale", "1e38", "--T", "8"]) == 2
    assert "--scale 1e+38 makes float32 scores overflow; use a smaller --scale" in _one_error_line(capsys)


def test_ops_table_range_grad_is_case_insensitive(capsys):
    """--range-grad P1 (the paper's spelling) was refused, while the same override in a name or through
    OperatorSpec.parse is case-insensitive."""
    assert cli.main(["ops", "--T", "3", "--operators", "lerp-k4", "--range-grad", "P1"]) == 0
    upper = capsys.readouterr().out
    assert cli.main(["ops", "--T", "3", "--operators", "lerp-k4", "--range-grad", "p1"]) == 0
    assert "lerp-k4[range_grad=p1]" in upper and upper == capsys.readouterr().out
