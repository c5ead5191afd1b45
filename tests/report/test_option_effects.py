"""Attention options across models (``analysis.option_effects``, ``options.md``): a suite with the options and
one without them, reported together, give each operator's option effect and the change of its penalty vs
softmax, paired per block with the same operator and seed of the other model; runs that differ in anything
else (protocol, data, seed) are not paired."""

from __future__ import annotations

import json

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report import analysis as A
from kinterval.report.build import build_report
from kinterval.report.results import load_many

SUITE = """
name = "{name}"
protocol = "tiny-cpu"
seeds = {seeds}
checkpoints = 2
[overrides]
"model.n_layer" = 1
"model.n_head" = 2
"model.n_embd" = 32
"model.block_size" = 64
"schedule.tokens" = 12_288
"schedule.warmup_tokens" = 2_048
"schedule.micro_batch" = 8
{overrides}
[[group]]
name = "g"
operators = ["softmax", "fwm-prob-k4", "minmax-weight-k4"]
"""
MODERN = '"model.n_kv_head" = 1\n"model.attn_sinks" = true\n"model.rope_theta" = 1e4'
PENALTY = {  # ΔNLL vs softmax planted in each model
    False: {"softmax": 0.0, "fwm-prob-k4": 0.05, "minmax-weight-k4": 0.2},
    True: {"softmax": 0.0, "fwm-prob-k4": 0.05, "minmax-weight-k4": 0.1},
}
SOFTMAX_GAIN = -0.02  # the options' effect on softmax itself


def _effect(r, frac):
    """The planted NLL shift, with each model's own noise per block (the run ids repeat across the suites)."""
    modern = bool(r["config"]["model"]["attn_sinks"])
    noise = np.random.default_rng([modern, r["seed"], len(r["operator"]), int(frac * 4)]).normal(0, 0.003, 48)
    return frac * ((SOFTMAX_GAIN if modern else 0.0) + PENALTY[modern][r["operator"]]) + noise


def _write(tmp_path, seeds="[7]", modern_overrides=MODERN, **kw):
    for name, extra in (("plain", ""), ("modern", modern_overrides)):
        text = SUITE.format(name=name, seeds=seeds, overrides=extra)
        (tmp_path / f"{name}.toml").write_text(text)
        write_results(tmp_path / name, tmp_path / f"{name}.toml", _effect, n_blocks=48, **kw)
    return [tmp_path / "plain", tmp_path / "modern"]


@pytest.mark.parametrize("seeds", ["[7]", "[7, 42, 1337]"])
def test_option_effect_and_penalty_change_come_back(tmp_path, seeds):
    build_report(_write(tmp_path, seeds), tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    got = {e["effect"]["key"]["operator"]: e for e in data["option_effects"]}
    assert set(got) == {"softmax", "fwm-prob-k4", "minmax-weight-k4"}
    n = len(json.loads(seeds))
    for op, e in got.items():
        assert e["options"] == "1KV sinks rope10000" and e["base"] == "1L 2H d32"
        assert e["effect"]["key"]["model"] == "1L 2H d32 1KV sinks rope10000"
        want = SOFTMAX_GAIN + PENALTY[True][op] - PENALTY[False][op]
        est = e["effect"]["est"]
        assert est["mean"] == pytest.approx(want, abs=2e-3) and len(e["effect"]["seeds"]) == n
        assert est["lo"] <= est["mean"] <= est["hi"]
        assert est["interval"] == ("block bootstrap" if n == 1 else f"t ({n - 1} df)")
        pen = e["penalty"]
        if op == "softmax":
            assert pen is None
            continue
        change = PENALTY[True][op] - PENALTY[False][op]
        assert pen["est"]["mean"] == pytest.approx(change, abs=2e-3)
        assert pen["nll"] == pytest.approx(PENALTY[True][op], abs=2e-3)  # the penalty with the options
        assert pen["control_nll"] == pytest.approx(PENALTY[False][op], abs=2e-3)  # and without
    # MinMax–Weight's gap narrows by 0.1, detectably (FWM–Prob's changes by noise alone: within 0.002 above)
    assert got["minmax-weight-k4"]["penalty"]["est"]["hi"] < 0
    if n > 1:
        assert all(e["effect"]["q"] is not None for e in got.values())
    table = (tmp_path / "rep" / "options.md").read_text()
    assert "| minmax-weight-k4 | 1KV sinks rope10000 | 1L 2H d32 | " in table
    assert "Attention options across models" in (tmp_path / "rep" / "index.md").read_text()


def test_the_per_block_contrasts_are_the_model_differences(tmp_path):
    """The effect row's estimate is the mean of the per-block difference of the two runs, and the penalty
    change that of the per-block difference in differences."""
    results = load_many(_write(tmp_path))
    points = [p for r in results for p in r.points if p.primary]
    effects = A.option_effects(points, {})
    end = max(p.tokens for p in points)

    def nll(op, modern):
        (p,) = [p for p in points if p.operator == op and bool(p.options) == modern and p.tokens == end]
        return p.nll

    mm = next(e for e in effects if e.effect.key.operator == "minmax-weight-k4")
    d = nll("minmax-weight-k4", True) - nll("minmax-weight-k4", False)
    assert mm.effect.est.mean == pytest.approx(float(d.mean()), abs=1e-12)
    did = d - (nll("softmax", True) - nll("softmax", False))
    assert mm.penalty.est.mean == pytest.approx(float(did.mean()), abs=1e-12)
    assert mm.effect.tokens == mm.penalty.tokens == end


def test_runs_that_differ_in_more_than_the_options_are_not_compared(tmp_path):
    """Another learning rate beside the options: the two models are not one comparison, and no table is
    written; nor are runs of a model without options compared with each other."""
    dirs = _write(tmp_path, modern_overrides=MODERN + '\n"optim.lr" = 1e-3')
    build_report(dirs, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "option_effects" not in data and not (tmp_path / "rep" / "options.md").exists()
    assert len({r["key"]["model"] for r in data["delta"]}) == 2  # each model paired with its own softmax
    build_report(dirs[:1], tmp_path / "one")
    assert "option_effects" not in json.loads((tmp_path / "one" / "report.json").read_text())


def test_a_seed_without_its_pair_at_the_endpoint_is_listed(tmp_path):
    """Seed 7's modern MinMax–Weight run lacks its last checkpoint: the comparison's endpoint is that of
    seed 42, which alone makes the row, and seed 7's run is listed as left out (never compared at an earlier
    checkpoint beside the other seed's endpoint)."""
    dirs = _write(tmp_path, "[7, 42]")
    ev = sorted((tmp_path / "modern").glob("runs/minmax-weight-k4-s7/eval/*/step_*.json"))[-1]
    ev.unlink()
    ev.with_suffix(".npz").unlink()
    build_report(dirs, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    got = {e["effect"]["key"]["operator"]: e for e in data["option_effects"]}
    assert got["minmax-weight-k4"]["effect"]["seeds"] == [42] == got["minmax-weight-k4"]["penalty"]["seeds"]
    assert got["softmax"]["effect"]["seeds"] == [7, 42]
    left = [k for k in data["unpaired"] if "attention-option" in k]
    assert len(left) == 1 and "minmax-weight-k4-s7" in left[0], data["unpaired"]
    assert np.isfinite([e["effect"]["est"]["mean"] for e in data["option_effects"]]).all()


def _bh(ps):
    """Benjamini-Hochberg q values, written out: q_(i) = min over j >= i of m p_(j) / j, at most 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    q, running = [0.0] * len(ps), 1.0
    for rank in range(len(ps), 0, -1):
        i = order[rank - 1]
        running = min(running, len(ps) * ps[i] / rank)
        q[i] = running
    return q


def test_the_options_table_shows_each_rows_numbers(tmp_path):
    """options.md, cell by cell against report.json: NLL without and with the options, the option effect,
    the penalty without and with them and its change, each with its BH q (several seeds); the penalties' q
    are the BH correction of their own p values."""
    build_report(_write(tmp_path, "[7, 42, 1337]"), tmp_path / "rep")
    effects = json.loads((tmp_path / "rep" / "report.json").read_text())["option_effects"]
    lines = [ln for ln in (tmp_path / "rep" / "options.md").read_text().splitlines() if ln.startswith("|")]
    split = lambda ln: [c.strip() for c in ln.strip("|").split("|")]  # noqa: E731
    head, rows = split(lines[0]), [split(ln) for ln in lines[2:]]
    assert head[5:] == [
        *("NLL without", "NLL with", "Δ option (nats/token)", "95% CI", "BH q"),
        *("Penalty without", "Penalty with", "Δ penalty", "95% CI", "BH q", "Interval"),
    ]
    assert len(rows) == len(effects) == 3
    penalties = [e["penalty"] for e in effects if e["penalty"] is not None]
    assert len(penalties) == 2
    for q, want in zip([p["q"] for p in penalties], _bh([p["est"]["p"] for p in penalties]), strict=True):
        assert q == pytest.approx(want, abs=1e-12)
    for row, e in zip(rows, effects, strict=True):
        assert row[0] == e["effect"]["key"]["operator"]
        r, pen = e["effect"], e["penalty"]
        cells = dict(zip(head[5:10], row[5:10], strict=True))
        assert float(cells["NLL without"]) == pytest.approx(r["control_nll"], abs=6e-5)
        assert float(cells["NLL with"]) == pytest.approx(r["nll"], abs=6e-5)
        assert float(cells["Δ option (nats/token)"]) == pytest.approx(r["est"]["mean"], abs=6e-5)
        assert float(cells["BH q"]) == pytest.approx(r["q"], abs=6e-4)
        if pen is None:
            assert row[10:15] == ["-"] * 5
            continue
        assert float(row[10]) == pytest.approx(pen["control_nll"], abs=6e-5)  # penalty without
        assert float(row[11]) == pytest.approx(pen["nll"], abs=6e-5)  # and with the options
        assert float(row[12]) == pytest.approx(pen["est"]["mean"], abs=6e-5)
        assert float(row[14]) == pytest.approx(pen["q"], abs=6e-4)
