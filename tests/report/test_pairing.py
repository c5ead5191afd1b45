"""Pairing across folders (issue 13): rows keyed by (operator, budget, data, tag); detach paired with its
same-seed full twin from another folder; runs without a valid control listed as such."""

from __future__ import annotations

import json

import pytest
from synthetic_results import write_results

from kinterval.report.build import build_report

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("pairing")

SUITE = """
name = "{name}"
protocol = "tiny-cpu"
seeds = [7, 42]
checkpoints = 2

[overrides]
"model.n_layer" = 1
"model.n_head" = 1
"model.n_embd" = 32
"model.block_size" = 64
"schedule.tokens" = {tokens}
"schedule.warmup_tokens" = 2_048
"schedule.micro_batch" = 8

{groups}
"""

MAIN = """
[[group]]
name = "softmax"
operators = ["softmax", "lerp-k4", "lerp-k32"]
"""

SUPP = """
[[group]]
name = "detach-replication"
operators = ["lerp-k32[range_grad=detach]", "lerp-k32[range_grad=max_only]"]

[[group]]
name = "short"
operators = ["softmax", "lerp-k4"]
seeds = [7]
overrides = { "schedule.tokens" = 12_288 }

[[group]]
name = "orphan"
operators = ["minmax-weight-k8[range_grad=detach]"]
seeds = [1337]
"""

# Planted endpoint effects by (operator, seed): the full LERP K32 twin differs between seeds, so a pairing
# with the mean of the full runs over seeds would not give the planted same-seed differences.
EFFECT = {
    ("lerp-k32", 7): 0.0,
    ("lerp-k32", 42): 0.2,
    ("lerp-k32[range_grad=detach]", 7): 0.5,
    ("lerp-k32[range_grad=detach]", 42): 0.9,
    ("lerp-k32[range_grad=max_only]", 7): 0.01,
    ("lerp-k32[range_grad=max_only]", 42): 0.27,
    ("lerp-k4", 7): 0.09,
    ("lerp-k4", 42): 0.09,
}


def _effect(r, frac):
    e = EFFECT.get((r["operator"], r["seed"]), 0.0) * frac
    return e + (0.05 if r["overrides"].get("schedule.tokens") == 12_288 and r["operator"] == "lerp-k4" else 0)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pairing")
    for name, tokens, groups in (("main", 24_576, MAIN), ("supp", 24_576, SUPP)):
        (tmp / f"{name}.toml").write_text(SUITE.format(name=name, tokens=tokens, groups=groups))
        write_results(tmp / name, tmp / f"{name}.toml", _effect, n_blocks=64, noise=0.002)
    build_report([tmp / "main", tmp / "supp"], tmp / "rep")
    return json.loads((tmp / "rep" / "report.json").read_text()), (tmp / "rep" / "index.md").read_text()


def test_different_budget_gives_separate_rows(report):
    data, _ = report
    rows = [r for r in data["delta"] if r["key"]["operator"] == "lerp-k4"]
    by_budget = {r["key"]["budget"]: r for r in rows}
    assert sorted(by_budget) == [12_288, 24_576]
    assert by_budget[24_576]["seeds"] == [7, 42] and by_budget[24_576]["est"]["interval"] == "t (1 df)"
    assert by_budget[12_288]["seeds"] == [7] and by_budget[12_288]["est"]["interval"] == "block bootstrap"
    assert by_budget[12_288]["est"]["mean"] == pytest.approx(0.09 + 0.05, abs=2e-3)
    assert by_budget[24_576]["est"]["mean"] == pytest.approx(0.09, abs=2e-3)


def test_detach_paired_with_its_same_seed_full_twin_across_folders(report):
    data, _ = report
    det = [r for r in data["detach"] if r["key"]["operator"] == "lerp-k32[range_grad=detach]"]
    end = max(det, key=lambda r: r["tokens"])
    assert end["seeds"] == [7, 42]
    assert end["est"]["per_seed"] == pytest.approx([0.5, 0.7], abs=2e-3)  # same-seed twins: 0.5-0, 0.9-0.2
    assert end["est"]["interval"] == "t (1 df)"
    mid = min(det, key=lambda r: r["tokens"])
    assert mid["est"]["per_seed"] == pytest.approx([0.25, 0.35], abs=2e-3)
    mx = max((r for r in data["detach"] if "max_only" in r["key"]["operator"]), key=lambda r: r["tokens"])
    # gap recovery (detach - x) / (detach - full): seed 7 (0.5-0.01)/0.5, seed 42 (0.9-0.27)/0.7
    assert mx["recovery"] == pytest.approx((0.98 + 0.9) / 2, abs=1e-2)
    (vs_det,) = [r for r in data["detach"] if r["contrast"].endswith("− lerp-k32[range_grad=detach]")]
    assert vs_det["est"]["per_seed"] == pytest.approx([0.01 - 0.5, 0.27 - 0.9], abs=2e-3)


def test_run_without_a_valid_control_is_listed(report):
    data, index = report
    orphan = [k for k in data["unpaired"] if k.startswith("minmax-weight-k8.range_grad-detach-s1337")]
    assert len(orphan) == 2  # no softmax seed 1337, no full twin
    assert "no softmax run with seed 1337" in data["unpaired"][orphan[0]] + data["unpaired"][orphan[1]]
    assert "Runs with no valid control" in index
    assert not any(r["key"]["operator"].startswith("minmax-weight-k8") for r in data["delta"])
