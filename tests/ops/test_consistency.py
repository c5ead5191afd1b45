"""``kinterval ops consistency``: the gradient-consistency diagnostics of App. F (A1-A4, P1-0) as a table.

The numbers must show the paper's pattern: the forward is shift invariant for every operator; softmax and the
full calibration gradient sum to zero per row while detach does not (A2) and moves the loss along s + c 1,
where the forward does not (A3); interior slopes match finite differences (A4); P1 keeps detach's forward
bit for bit and removes exactly the common-mode gradient (P1-0).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kinterval import cli
from kinterval.ops import OperatorSpec, commands, diagnostics
from kinterval.ops.api import valid_mask
from kinterval.ops.diagnostics import (
    all_ones_directional,
    consistency_table,
    score_gradient,
    shift_invariance,
    zero_sum_residual,
)
from kinterval.ops.reference import project_zero_sum

KS = (2, 8, 32)


@pytest.fixture(scope="module")
def table():
    return consistency_table(T=12, Ks=KS, seed=0)


def _rows(table, **where):
    return [r for r in table["rows"] if all(r[k] == v for k, v in where.items())]


def test_the_operators_and_backwards_run(table):
    """Softmax once; LERP and Nearest (MinMax-Weight, MinMax-Prob) at each K, under full, detach and p1."""
    got = {(r["operator"], r["range_grad"]) for r in table["rows"]}
    want = {("softmax", "full")} | {
        (f"{fam}-k{K}", mode)
        for K in KS
        for fam in ("lerp", "minmax-weight", "minmax-prob")
        for mode in ("full", "detach", "p1")
    }
    assert got == want and len(table["rows"]) == len(want)
    assert table["settings"]["dtype"] == "float64" and table["settings"]["T"] == 12
    default = consistency_table(T=3)  # the default K: 2 ... 32, as the paper's table
    assert sorted({r["K"] for r in default["rows"] if r["K"]}) == [2, 4, 8, 16, 32]


def test_a1_forward_shift_invariance_to_fp64_rounding(table):
    for r in table["rows"]:
        assert r["shift_max_abs"] <= table["settings"]["shift_tol"], r
        assert r["shift_max_abs"] < 1e-13, r
    assert table["summary"]["shift_pass"] and table["summary"]["operators"] == 1 + 3 * len(KS)


def test_a2_residual_softmax_and_full_zero_detach_not(table):
    for r in _rows(table, range_grad="full"):  # softmax included
        assert r["residual_max"] < 1e-6, r
    for r in _rows(table, range_grad="p1"):
        assert r["residual_max"] < 1e-12, r
    for r in _rows(table, range_grad="detach"):
        assert r["residual_median"] > 1e-3 and r["residual_max"] > 0.1, r


def test_a3_all_ones_directional_full_zero_detach_not(table):
    for r in table["rows"]:
        assert abs(r["directional_fd"]) < 1e-8, r  # the forward does not move along s + c 1
        if r["range_grad"] == "detach":
            assert abs(r["directional_autograd"]) > 1e-3, r  # the spurious common-mode component
        else:  # softmax, full and the projected p1
            assert abs(r["directional_autograd"]) < 1e-10, r


def test_a4_interior_slopes_match_for_softmax_full_and_detach(table):
    for r in table["rows"]:
        if r["operator"] == "softmax" or r["operator"].startswith("lerp"):
            assert r["interior_keys"] > 0, r
            if r["range_grad"] in ("full", "detach"):
                assert r["interior_rel_err"] < 1e-6, r
            else:  # p1 subtracts the row mean from every key: its interior slopes are not the derivative
                assert r["interior_rel_err"] > 1e-3, r
        else:  # Nearest: the hard forward is locally constant, A4 does not apply
            assert r["interior_rel_err"] is None and r["interior_keys"] is None, r


def test_p1_forward_is_detach_and_projection_is_exact(table):
    for r in _rows(table, range_grad="p1"):
        assert r["forward_equals_detach"] is True, r
        assert r["residual_max"] < 1e-12 and r["max_abs_vs_full"] > 1e-6, r
    for r in _rows(table, range_grad="full"):
        assert r["max_abs_vs_full"] == 0 and r["forward_equals_detach"] is None


def test_numbers_are_those_of_the_single_diagnostics(table):
    """Each number recomputed on the same scores with the per-diagnostic functions (and P1 as the projection
    of the detached gradient): a diagnostic that computed something else would fail here."""
    g = torch.Generator().manual_seed(0)
    s32 = torch.randn(4, 4, 12, 12, generator=g) * 6.0
    s, up = s32.double(), torch.randn(s32.shape, generator=g).double()
    valid = valid_mask(s.shape, s.device, causal=True, mask=None)
    row = {mode: _rows(table, operator="lerp-k8", range_grad=mode)[0] for mode in ("full", "detach", "p1")}
    grads = {
        mode: score_gradient(s, OperatorSpec.parse("lerp-k8", range_grad=mode), up, causal=True)
        for mode in row
    }
    for mode, r in row.items():
        rho = zero_sum_residual(grads[mode], valid)[..., 1:]
        assert r["residual_median"] == pytest.approx(float(np.median(rho.numpy())), rel=1e-12, abs=1e-30)
        assert r["residual_max"] == pytest.approx(rho.max().item(), rel=1e-12, abs=1e-30)
        a3 = all_ones_directional(s, OperatorSpec.parse("lerp-k8", range_grad=mode), up, causal=True)
        assert r["directional_autograd"] == pytest.approx(a3.autograd, rel=1e-9, abs=1e-12)
        assert r["directional_fd"] == pytest.approx(a3.finite_difference, abs=1e-9)
        assert r["max_abs_vs_full"] == pytest.approx((grads[mode] - grads["full"]).abs().max().item())
    torch.testing.assert_close(grads["p1"], project_zero_sum(grads["detach"], valid), rtol=0, atol=1e-15)
    assert row["full"]["shift_max_abs"] == shift_invariance(s, "lerp-k8", 0.1, causal=True)
    # max |g - g_full| of every operator and backward (its largest difference may be negative)
    for r in table["rows"]:
        spec = OperatorSpec.from_full_name(r["operator"])
        g = score_gradient(s, OperatorSpec.parse(spec, range_grad=r["range_grad"]), up, causal=True)
        full = score_gradient(s, spec, up, causal=True)
        assert r["max_abs_vs_full"] == pytest.approx((g - full).abs().max().item(), rel=1e-12, abs=0), r
    # A4 from a gradient of twice the slopes: |autograd - FD| = |g| at each key, relative to max |2 g|: 1/2
    spec = OperatorSpec.parse("lerp-k8")
    rows, _ = diagnostics._interior_keys(s, valid, spec, diagnostics.EPS_A4)
    rel, n = diagnostics._interior_fd_rows(s, spec, up, 2 * grads["full"], valid)
    assert rel == pytest.approx(0.5, abs=1e-6) and n == int(rows.sum()) < rows.numel()
    assert row["full"]["interior_keys"] == n


def test_summary_aggregates_the_rows(table):
    fams = table["summary"]["families"]
    assert set(fams) == {"softmax", "lerp", "minmax-weight", "minmax-prob"}
    det = _rows(table, family="lerp", range_grad="detach")
    s = fams["lerp"]["detach"]
    assert s["residual_median_min"] == min(r["residual_median"] for r in det)
    assert s["residual_median_max"] == max(r["residual_median"] for r in det)
    assert s["K_top"] == 32 and s["directional_autograd_top"] == det[-1]["directional_autograd"]
    # the largest residual over K, which for detach is at the smallest K, not at K_top
    assert s["residual_max"] == max(r["residual_max"] for r in det) > det[-1]["residual_max"]
    assert fams["lerp"]["p1"]["forward_equals_detach_all"] is True
    assert fams["minmax-weight"]["full"]["interior_keys"] is None
    full = _rows(table, family="lerp", range_grad="full")
    assert fams["lerp"]["full"]["interior_rel_err_max"] == max(r["interior_rel_err"] for r in full)
    assert (
        fams["lerp"]["full"]["interior_keys"]
        == sum(r["interior_keys"] for r in full)
        > full[0]["interior_keys"]
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [({"T": 2}, "T must be an integer >= 3"), ({"T": 4.0}, "T must be"), ({"scale": 0}, "scale must be"),
     ({"scale": float("nan")}, "scale must be"), ({"scale": 1e39}, "overflow"), ({"seed": -1}, "seed must"),
     ({"scale": True}, "scale must be"), ({"scale": float("inf")}, "scale must be a finite number"),
     ({"Ks": []}, "Ks must be"), ({"Ks": [0]}, "Ks must be"), ({"Ks": "4"}, "Ks must be"),
     ({"Ks": [True]}, "Ks must be"),
     ({"Ks": [4], "operators": ["lerp-k4"]}, "not both"), ({"operators": []}, "names no operator"),
     ({"operators": ["lerp-k4[range_grad=detach]"]}, "sets range_grad"),
     ({"operators": ["lerp-k4", "lerp-k4"]}, "given twice"), ({"operators": ["bogus"]}, "unknown operator")],
)  # fmt: skip
def test_bad_input_is_a_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        consistency_table(**{"T": 3, **kwargs})


def test_a_broken_operator_is_reported(monkeypatch, capsys):
    """An operator whose forward moves with s + c 1, and a p1 whose forward is not detach's: A1 and P1-0 say
    so (FAIL, NO), they do not print the expected values regardless."""
    real = diagnostics.attention_probs

    def broken(s, spec, **kw):
        P = real(s, spec, **kw)
        if spec == "softmax" or getattr(spec, "kind", None) == "softmax":
            P = P * (1 + 1e-9 * s.mean())  # not shift invariant
        if getattr(spec, "range_grad", None) == "p1":
            P = P + 1e-15 * P  # a forward that differs from detach's in the last bits
        return P

    monkeypatch.setattr(diagnostics, "attention_probs", broken)
    out = consistency_table(T=4, Ks=[4])
    assert not out["summary"]["shift_pass"]
    assert not out["summary"]["families"]["lerp"]["p1"]["forward_equals_detach_all"]
    assert cli.main(["ops", "consistency", "--T", "4", "--K", "4"]) == 0
    printed = capsys.readouterr().out
    assert "FAIL" in printed and "forward bitwise equal to detach: NO" in printed
    assert ["lerp-k4", "p1", "differs"] in [
        [*x.split()[:2], x.split()[-1]] for x in printed.splitlines() if x
    ]


def test_p1_forward_broken_at_one_k_is_reported(monkeypatch, capsys):
    """A p1 forward that differs from detach's at K=4 only (K=8 bit for bit): the family's flag is False and
    the CLI prints NO."""
    real = diagnostics.attention_probs

    def broken(s, spec, **kw):
        P = real(s, spec, **kw)
        if getattr(spec, "range_grad", None) == "p1" and spec.K == 4:
            P = P + 1e-15 * P
        return P

    monkeypatch.setattr(diagnostics, "attention_probs", broken)
    out = consistency_table(T=4, Ks=[4, 8])
    rows = _rows(out, family="lerp", range_grad="p1")
    assert [(r["K"], r["forward_equals_detach"]) for r in rows] == [(4, False), (8, True)]
    assert out["summary"]["families"]["lerp"]["p1"]["forward_equals_detach_all"] is False
    assert cli.main(["ops", "consistency", "--T", "4", "--K", "4", "8"]) == 0
    assert "forward bitwise equal to detach: NO" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_prints_every_diagnostic_and_writes_json(tmp_path, capsys):
    path = tmp_path / "consistency.json"
    argv = ["ops", "consistency", "--T", "8", "--K", "2", "32", "--seed", "1", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "T=8, score sd 6, seed 1" in lines[0]
    assert lines[1].split() == ["Diagnostic", "Question", "Result"]
    for label in ("A1 forward shift invariance", "A2 gradient shift residual", "A3 all-ones directional FD",
                  "A4 interior finite difference", "P1-0 projection sanity"):  # fmt: skip
        assert any(line.startswith(label) for line in lines), label
    assert "pass for all 7 operators" in out and "lerp detach: median" in out
    assert "forward bitwise equal to detach: yes" in out
    assert "minmax-weight, minmax-prob: n/a (hard forward, locally constant)" in out
    det = json.loads(path.read_text())["summary"]["families"]["lerp"]["detach"]
    lo, hi = f"{det['residual_median_min']:.3f}", f"{det['residual_median_max']:.3f}"
    assert lo != hi and f"lerp detach: median {lo}-{hi} over K, max" in out  # the range of the K's medians
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(consistency_table(T=8, Ks=[2, 32], seed=1)))
    for r in written["rows"]:  # every operator and backward has its line in the second table
        assert any(line.split()[:2] == [r["operator"], r["range_grad"]] for line in lines), r
    p1 = next(line.split() for line in lines if line.split()[:2] == ["lerp-k32", "p1"])
    assert p1[-1] == "bitwise"


def test_cli_passes_its_flags(monkeypatch, capsys):
    seen = []
    real = commands.consistency_table
    monkeypatch.setattr(commands, "consistency_table", lambda **kw: seen.append(kw) or real(**{**kw, "T": 3}))
    assert cli.main(["ops", "consistency"]) == 0
    assert seen[-1] == {"T": 64, "scale": 6.0, "seed": 0, "Ks": None, "operators": None}
    argv = [
        "ops",
        "consistency",
        "--T",
        "5",
        "--scale",
        "2",
        "--seed",
        "3",
        "--operators",
        "softmax,fwm-prob-k4",
    ]
    assert cli.main(argv) == 0
    assert seen[-1] == {"T": 5, "scale": 2.0, "seed": 3, "Ks": None, "operators": ["softmax", "fwm-prob-k4"]}
    assert "fwm-prob-k4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [(["--T", "2"], "--T must be an integer >= 3"), (["--range-grad", "p1"], "does not take --range-grad"),
     (["--K", "0"], "--K must be integers >= 1"), (["--K", "4", "--operators", "lerp-k4"], "own K"),
     (["--json", "/nonexistent-folder/x.json"], "does not exist"), (["--seed", "-1"], "--seed must be"),
     (["--operators", "lerp-k4[range_grad=p1]"], "sets range_grad"), (["--scale", "0"], "--scale must be")],
)  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(flags, message, capsys, monkeypatch):
    if "--operators" not in flags:  # names are read by consistency_table itself, before any tensor is drawn
        monkeypatch.setattr(commands, "consistency_table", lambda **kw: pytest.fail("ran before the checks"))
    argv = ["ops", "consistency", *flags] if "--T" in flags else ["ops", "consistency", "--T", "3", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval ops: error: ") and "\n" not in err and message in err, err


def test_json_is_not_for_verify(capsys, tmp_path):
    assert cli.main(["ops", "verify", "--T", "3", "--json", str(tmp_path / "x.json")]) == 2
    assert "--json is for the table and `kinterval ops consistency`" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a4_keys_avoid_the_extrema_and_the_grid_points():
    """A central difference across a grid point of LERP would average two slopes: such keys are not used."""
    valid = torch.ones(2, 5, dtype=torch.bool)
    s = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 1.5, 3.0, 4.0]], dtype=torch.float64)
    rows, key = diagnostics._interior_keys(s, valid, OperatorSpec.parse("lerp-k4"), 1e-5)
    assert rows.tolist() == [False, True] and key[1] == 2  # row 0: every key on a grid point or an extremum
    rows, key = diagnostics._interior_keys(s, valid, OperatorSpec.parse("softmax"), 1e-5)
    assert rows.all() and key.tolist() == [2, 2]  # softmax: the key nearest the middle of the range
    # no key but the extrema (a tie at the minimum), or a LERP key just below a grid point (t = 0.995)
    rows, _ = diagnostics._interior_keys(torch.tensor([[0.0, 0.0, 4.0]], dtype=torch.float64),
                                         valid[:1, :3], OperatorSpec.parse("softmax"), 1e-5)  # fmt: skip
    assert rows.tolist() == [False]
    rows, _ = diagnostics._interior_keys(torch.tensor([[0.0, 1.0, 2.995, 4.0]], dtype=torch.float64),
                                         valid[:1, :4], OperatorSpec.parse("lerp-k4"), 1e-5)  # fmt: skip
    assert rows.tolist() == [False]


def test_the_summary_names_a_family_without_an_interior_key():
    """A family whose rows hold no key away from the extrema and the grid's kinks (a small --T) is named in
    A4's line, with the way out, not left out silently."""
    result = consistency_table(T=3, Ks=[4])
    result["summary"]["families"]["lerp"]["full"]["interior_keys"] = 0
    result["summary"]["families"]["lerp"]["full"]["interior_rel_err_max"] = None
    text = str(commands._summary_table(result))
    assert "lerp: no key away from the extrema and the grid's kinks (use a larger --T)" in text
    assert "softmax: no key" not in text
