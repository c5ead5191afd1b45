"""``kinterval ops`` wiring: ``verify``'s exit status and the flags of the table."""

import numpy as np
import pytest

from kinterval import cli
from kinterval.ops import commands, verify


@pytest.mark.parametrize("status", [0, 1])
def test_ops_verify_exits_with_the_status_of_the_check(monkeypatch, status):
    monkeypatch.setattr(verify, "main", lambda argv: status)
    assert cli.main(["ops", "verify"]) == status


def test_ops_table_passes_its_flags(monkeypatch, capsys):
    seen = {}
    real = commands.attention_probs

    def probs(s, spec, **kw):
        seen.setdefault("T", s.shape[-1])
        seen.setdefault("s", s.clone())
        if not isinstance(spec, str):
            seen.setdefault("specs", []).append(spec.full_name)
        return real(s, spec, **kw)

    monkeypatch.setattr(commands, "attention_probs", probs)
    argv = ["ops", "--operators", "softmax,lerp-k4", "--T", "4", "--scale", "2", "--seed", "3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "T=4, score sd 2" in out and seen["T"] == 4 and seen["specs"] == ["softmax", "lerp-k4"]
    first = seen.pop("s")
    seen.clear()
    assert cli.main([*argv[:-1], "4"]) == 0  # another --seed: other scores
    assert not first.equal(seen["s"])
    seen.clear()
    assert cli.main(["ops", "--operators", "fwm-prob-k4", "--T", "2", "--range-grad", "detach"]) == 0
    assert seen["specs"] == ["fwm-prob-k4[range_grad=detach]"]  # --range-grad reaches the spec


def test_ops_table_defaults_are_the_ones_its_help_gives(monkeypatch, capsys):
    """--help states each default; run without flags, the table uses them (T = 128, sd 6, full gradient)."""
    with pytest.raises(SystemExit):
        cli.main(["ops", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    for default in ("(default: full)", "(default: 128)", "(default: 6,", "(default: 0)"):
        assert default in helptext
    seen = []
    real = commands.attention_probs
    monkeypatch.setattr(
        commands, "attention_probs", lambda s, spec, **kw: seen.append(s.shape) or real(s, spec, **kw)
    )
    assert cli.main(["ops", "--operators", "fwm-prob-k4"]) == 0
    assert "T=128, score sd 6," in capsys.readouterr().out and seen[0] == (4, 4, 128, 128)


def test_ops_verify_passes_its_flags_and_refuses_the_tables(monkeypatch, capsys):
    """`ops verify` called verify.main([]) whatever it was given: --T 5 ran T = 33, and --range-grad bogus
    passed. The table ignored --range-grad bogus when it listed no K-interval operator."""
    seen = []
    monkeypatch.setattr(verify, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["ops", "verify", "--T", "5", "--scale", "2.5", "--K", "4", "32"]) == 0
    assert seen == [["--K", "4", "32", "--T", "5", "--scale", "2.5"]]
    for flags in (["--operators", "lerp-k4"], ["--range-grad", "detach"], ["--seed", "3"]):
        assert cli.main(["ops", "verify", *flags]) == 2
        assert f"not {flags[0]}" in capsys.readouterr().err
    assert cli.main(["ops", "verify", "--T", "1"]) == 2 and len(seen) == 1
    assert cli.main(["ops", "--operators", "softmax", "--range-grad", "bogus"]) == 2
    assert "--range-grad must be one of full, detach, max_only, min_only, p1" in capsys.readouterr().err
    assert cli.main(["ops", "--operators", "softmax", "--K", "4"]) == 2
    assert "--K is for `kinterval ops verify`" in capsys.readouterr().err


def test_ops_verify_runs_with_the_flags_given(capsys):
    assert cli.main(["ops", "verify", "--K", "2", "--T", "6"]) == 0
    out = capsys.readouterr().out
    assert "lerp-k2" in out and "lerp-k4" not in out


def test_ops_table_tv_is_over_the_rows_with_two_or_more_keys(capsys):
    """The TV mean counted row 0 (one key: TV 0 for every operator) while the residual left it out, which
    pulled the mean down by 1/T (to 7/8 at T = 8); the geometry probe's TV is over rows i >= 1 too."""
    import torch

    from kinterval.ops import attention_probs

    assert cli.main(["ops", "--operators", "lerp-k4", "--T", "8", "--seed", "0"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("lerp-k4"))
    s = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(0)) * 6.0
    P, E = attention_probs(s, "lerp-k4", causal=True), attention_probs(s, "softmax", causal=True)
    tv = 0.5 * (P - E).abs().sum(-1)[..., 1:]
    assert row.split()[1:3] == [f"{tv.mean():.4f}", f"{tv.max():.4f}"]


def test_ops_table_json_holds_the_printed_numbers_and_the_setting(capsys, tmp_path):
    """The table's numbers for scripts (`--json`, as `ops consistency`); a path that cannot be written is
    refused before the tensors are built."""
    import json

    out = tmp_path / "table.json"
    argv = ["ops", "--operators", "softmax,fwm-prob-k4[tau=5]", "--T", "8", "--seed", "3", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[3:]}
    data = json.loads(out.read_text())
    assert data["setting"] == {"T": 8, "scale": 6.0, "seed": 3, "range_grad": "full", "dtype": "float32"}
    assert [r["operator"] for r in data["rows"]] == ["softmax", "fwm-prob-k4[tau=5]"]
    for r in data["rows"]:
        assert printed[r["operator"]] == [
            f"{r['tv_mean']:.4f}",
            f"{r['tv_max']:.4f}",
            f"{r['residual_median']:.1e}",
            f"{r['residual_max']:.1e}",
        ]
    assert data["rows"][1]["tv_mean"] > 0 == data["rows"][0]["tv_mean"]
    assert cli.main(["ops", "--T", "8", "--json", str(tmp_path / "no" / "t.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_ops_table_residual_is_over_the_causal_rows_with_two_or_more_keys(capsys, tmp_path):
    """The residual columns, recomputed by autograd of L = <up, P> on the table's draws (scores, then the
    upstream gradient from the same generator), causal, over the rows i >= 1 (row 0's gradient is 0)."""
    import json

    import torch

    from kinterval.ops import attention_probs

    out = tmp_path / "t.json"
    argv = ["ops", "--operators", "lerp-k4", "--range-grad", "detach", "--T", "8", "--seed", "1"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(4, 4, 8, 8, generator=gen) * 6.0
    up = torch.randn(s.shape, generator=gen)
    x = s.clone().requires_grad_()
    (g,) = torch.autograd.grad((attention_probs(x, "lerp-k4[range_grad=detach]", causal=True) * up).sum(), x)
    rho = (g.sum(-1).abs() / g.abs().sum(-1))[..., 1:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["residual_median"] == pytest.approx(float(np.median(rho.numpy())), rel=1e-5)
    assert row["residual_max"] == pytest.approx(rho.max().item(), rel=1e-5) and row["residual_max"] > 0.1
