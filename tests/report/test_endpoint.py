"""Endpoint rows are at one training-token count: a run whose last evaluation is earlier (a crashed run) is
left out of the row and listed as unpaired with the reason, never averaged in with the other seeds'
endpoints."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report import analysis as A
from kinterval.report import claims as C
from kinterval.report.build import build_report
from kinterval.report.results import Point, load_results
from kinterval.stats import bh_q

N = 48
BASE = np.random.default_rng(0).normal(4.0, 0.2, N)
EARLY = 0.5  # every run is this much worse at the half-budget checkpoint; a mixed-in one shows it


def point(op, seed, effect, tokens):
    nll = BASE + 0.01 * seed + effect + (EARLY if tokens == 500 else 0.0)
    return Point(
        "s", f"{op}-s{seed}", "g", op, seed, 1000, tokens // 100, tokens, "val", ("d", "val", 64, N), nll
    )


def runs(effects: dict[str, float], seeds=(7, 42), crashed=()) -> list[Point]:
    """Checkpoints at 500 and 1000 tokens of each operator and seed; (operator, seed) in ``crashed`` stops
    after 500."""
    return [
        point(op, s, e * (0.5 if t == 500 else 1.0), t)
        for op, e in effects.items()
        for s in seeds
        for t in (500, 1000)
        if not (t == 1000 and (op, s) in crashed)
    ]


def test_delta_row_leaves_out_a_run_that_stopped_early():
    pts = runs({"softmax": 0.0, "lerp-k4": 0.05}, seeds=(7, 42, 1337), crashed={("lerp-k4", 42)})
    pairing = A.softmax_pairs(pts)
    (row,) = A.delta_table(pairing)
    assert row.seeds == (7, 1337) and row.tokens == 1000
    assert row.est.per_seed == pytest.approx((0.05, 0.05))  # the crashed run's 0.025 at 500 tokens is not in
    assert pairing.unpaired == {
        "lerp-k4-s42 [val] in ΔNLL vs softmax": (
            "no paired evaluation at the endpoint (1000 training tokens); its last is at 500"
        )
    }


def test_delta_row_leaves_out_a_run_whose_control_stopped_early():
    pts = runs({"softmax": 0.0, "lerp-k4": 0.05}, crashed={("softmax", 42)})
    pairing = A.softmax_pairs(pts)
    (row,) = A.delta_table(pairing)
    assert row.seeds == (7,) and row.tokens == 1000 and row.est.mean == pytest.approx(0.05)
    assert list(pairing.unpaired) == ["lerp-k4-s42 [val] in ΔNLL vs softmax"]


def test_softmax_reference_row_is_at_the_endpoint_with_the_seed_sd():
    """tab:seedend's first row: the softmax NLL over the seeds at the endpoint (a seed stopped early is left
    out, not averaged in at 500 tokens) and its seed SD with n - 1 in the denominator."""
    pts = runs({"softmax": 0.0}, seeds=(7, 42, 1337), crashed={("softmax", 42)})
    (ref,) = A.softmax_rows(pts)
    assert ref.seeds == (7, 1337) and ref.tokens == 1000
    means = [(BASE + 0.01 * s).mean() for s in (7, 1337)]
    assert ref.per_seed == pytest.approx(tuple(means), rel=1e-12)
    assert ref.nll == pytest.approx(np.mean(means), rel=1e-12)
    assert ref.nll_sd == pytest.approx(np.std(means, ddof=1), rel=1e-9)


def test_factorial_cells_are_at_one_endpoint():
    effects = {"minmax-weight-k4": 0.2, "minmax-prob-k4": 0.14, "fwm-weight-k4": 0.04, "fwm-prob-k4": 0.01}
    pts = runs(effects, crashed={("fwm-prob-k4", 42)})
    unpaired: dict[str, str] = {}
    rows = {r.contrast: r for r in A.factorial_effects(pts, unpaired) if r.K == 4}
    inter = rows["interaction"]
    assert inter.seeds == (7,) and inter.tokens == 1000
    assert inter.est.mean == pytest.approx((0.01 - 0.04) - (0.14 - 0.2))
    (key,) = unpaired
    assert key.startswith("fwm-prob-k4-s42 [val] in factorial K4") and "its last is at 500" in unpaired[key]
    with pytest.raises(ValueError, match=r"fwm-prob-k4-s42 \[val\] in factorial K4 .*endpoint \(1000"):
        A.factorial_effects(pts)  # no channel for the left-out run: an error, not a silent mix


def test_factorial_lerp_contrast_uses_the_lerp_run_at_the_endpoint():
    effects = {"minmax-weight-k4": 0.2, "minmax-prob-k4": 0.14, "fwm-weight-k4": 0.04, "fwm-prob-k4": 0.01}
    pts = runs({**effects, "lerp-k4": 0.09}, crashed={("lerp-k4", 42)})
    unpaired: dict[str, str] = {}
    rows = {r.contrast: r for r in A.factorial_effects(pts, unpaired)}
    vs = rows["FWM–Prob K4 − LERP K4"]
    assert vs.seeds == (7,) and vs.est.mean == pytest.approx(0.01 - 0.09)
    assert rows["interaction"].seeds == (7, 42)
    assert [k.split(" in ")[0] for k in unpaired] == ["lerp-k4-s42 [val]"]


def test_k_trend_uses_one_endpoint_for_every_K():
    pts = runs(
        {"softmax": 0.0, "lerp-k4": 0.09, "lerp-k16": 0.05, "lerp-k64": 0.01}, crashed={("lerp-k16", 42)}
    )
    pairing = A.softmax_pairs(pts)
    (row,) = A.k_trends(pairing)
    assert row.seeds == (7,) and row.tokens == 1000
    assert row.est.mean == pytest.approx(-0.02)  # (0.01 - 0.09) / (log2 64 - log2 4), exact: no noise
    assert "lerp-k16-s42 [val] in K trend of lerp" in pairing.unpaired


def test_a_family_of_one_K_has_no_trend_to_leave_a_run_out_of():
    """FWM–Prob at K4 alone has no K-trend row: its run without an endpoint evaluation is left out of the ΔNLL
    row (unpaired.md says so), not of a "K trend of fwm-prob" that does not exist."""
    pts = runs(
        {"softmax": 0.0, "fwm-prob-k4": 0.02, "lerp-k4": 0.09, "lerp-k16": 0.05},
        crashed={("fwm-prob-k4", 42)},
    )
    pairing = A.softmax_pairs(pts)
    assert [r.family for r in A.k_trends(pairing)] == ["lerp"]
    assert not any("K trend" in k for k in pairing.unpaired)


def test_tail_decomposition_needs_the_three_runs_at_one_endpoint():
    ops = {"minmax-weight-k4": 0.2, "resolved-weight-k4": 0.1, "fwm-weight-k4": 0.04}
    pts = runs(ops, seeds=(7,), crashed={("resolved-weight-k4", 7)})
    unpaired: dict[str, str] = {}
    assert A.tail_decomposition(pts, unpaired) == []
    assert list(unpaired) == ["resolved-weight-k4-s7 [val] in the tail decomposition"]
    rows = A.tail_decomposition(runs(ops, seeds=(7,)))
    assert rows[0].tokens == 1000 and rows[0].recovery == pytest.approx((0.2 - 0.1) / (0.2 - 0.04))


def test_tail_decomposition_rows_are_the_planted_contrasts():
    """tab:taildecomp at seed 7: each run − softmax, MinMax − resolved and resolved − FWM with their signs,
    and the path ratio (MinMax − resolved) / (MinMax − FWM) with its interval around it."""
    ops = {"softmax": 0.0, "minmax-weight-k4": 0.2, "resolved-weight-k4": 0.1, "fwm-weight-k4": 0.04}
    rows = {r.contrast: r for r in A.tail_decomposition(runs(ops, seeds=(7,)))}
    want = {
        "MinMax − softmax (weight-STE, K4)": 0.2,
        "FWM − softmax (weight-STE, K4)": 0.04,
        "resolved − softmax (weight-STE, K4)": 0.1,
        "MinMax − resolved (weight-STE, K4)": 0.2 - 0.1,
        "resolved − FWM (weight-STE, K4)": 0.1 - 0.04,
    }
    assert set(rows) == set(want)
    for name, value in want.items():
        assert rows[name].est.mean == pytest.approx(value, abs=1e-12), name
        assert rows[name].seeds == (7,) and rows[name].tokens == 1000
    ratio = rows["resolved − FWM (weight-STE, K4)"].recovery
    assert ratio == pytest.approx((0.2 - 0.1) / (0.2 - 0.04), rel=1e-12)
    r = rows["MinMax − resolved (weight-STE, K4)"]
    assert (r.recovery, r.recovery_lo, r.recovery_hi) == (ratio, pytest.approx(ratio), pytest.approx(ratio))


def test_tail_decomposition_pairs_resolved_with_the_fwm_of_its_tau():
    """Resolved keeps FWM's step tau/K and origin -tau (App. D.4): resolved at tau = 2.5 was paired with an
    FWM run at tau = 4 of the same report, and a resolved run whose tau has no FWM run with the FWM of
    another."""
    ops = {"minmax-prob-k3": 0.2, "fwm-prob-k3[tau=2.5]": 0.03, "fwm-prob-k3[tau=4]": 0.05}
    ops |= {"resolved-prob-k3[tau=2.5]": 0.1, "resolved-weight-k3[tau=4]": 0.1, "minmax-weight-k3": 0.2}
    ops |= {"fwm-weight-k3[tau=2.5]": 0.04}
    rows = {r.contrast: r for r in A.tail_decomposition(runs(ops, seeds=(7,)))}
    assert rows["resolved − FWM (prob-STE, K3, tau=2.5)"].est.mean == pytest.approx(0.1 - 0.03, abs=1e-12)
    assert rows["MinMax − resolved (prob-STE, K3, tau=2.5)"].recovery == pytest.approx(
        (0.2 - 0.1) / (0.2 - 0.03)
    )
    assert not any("weight-STE" in c for c in rows)  # no FWM-Weight at tau = 4: no row, not tau = 2.5's
    assert not any("tau=4" in c for c in rows)


def test_tail_decomposition_gives_weight_ste_before_prob_ste():
    """tab:taildecomp's order: the Weight-STE decomposition, then the Prob-STE one (the Prob runs listed
    first here)."""
    ops = {"minmax-prob-k4": 0.14, "resolved-prob-k4": 0.05, "fwm-prob-k4": 0.01}
    ops |= {"minmax-weight-k4": 0.2, "resolved-weight-k4": 0.1, "fwm-weight-k4": 0.04}
    rows = A.tail_decomposition(runs(ops, seeds=(7,)))
    assert [r.contrast for r in rows] == [
        "MinMax − resolved (weight-STE, K4)",
        "resolved − FWM (weight-STE, K4)",
        "MinMax − resolved (prob-STE, K4)",
        "resolved − FWM (prob-STE, K4)",
    ]
    assert rows[2].recovery == pytest.approx((0.14 - 0.05) / (0.14 - 0.01), rel=1e-12)


def test_claim_contrast_is_at_one_endpoint():
    pts = runs({"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01}, crashed={("minmax-weight-k4", 42)})
    unpaired: dict[str, str] = {}
    (row,) = C._contrast_rows(pts, "minmax-weight-k4", "fwm-prob-k4", unpaired)
    assert row.seeds == (7,) and row.tokens == 1000 and row.est.mean == pytest.approx(0.2 - 0.01)
    assert list(unpaired) == ["minmax-weight-k4-s42 [val] in the claim minmax-weight-k4 − fwm-prob-k4"]


def test_a_claim_names_the_checkpoint_it_is_computed_at():
    """Every run of a claim stopped at 500 of its 1000 tokens: the claim is computed at that last checkpoint,
    and its Runs column says so ("500 of 1000 tokens") and ``tokens`` is 500; it showed the budget alone."""
    ops = {"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01}
    (claim,) = [c for c in C.paper_claims(runs(ops), {}) if c.claim.startswith("MinMax–Weight")]
    assert claim.setting.startswith("1000 tokens,") and claim.tokens == 1000
    early = runs(ops, crashed={(op, s) for op in ops for s in (7, 42)})
    (claim,) = [c for c in C.paper_claims(early, {}) if c.claim.startswith("MinMax–Weight")]
    assert claim.setting.startswith("500 of 1000 tokens,") and claim.tokens == 500
    assert claim.estimate.mean == pytest.approx(0.5 * (0.2 - 0.01)) and claim.to_dict()["tokens"] == 500
    (not_run,) = [c for c in C.paper_claims([], {}) if c.claim.startswith("MinMax–Weight")]
    assert not_run.tokens is None and not_run.setting == ""


@pytest.mark.parametrize("tau_run_first", [True, False])
def test_claim_contrast_takes_the_default_tau_operator_only(tau_run_first):
    """A same-seed fwm-prob-k4[tau=5] run (another operator: its tau override) must not stand in for
    fwm-prob-k4 in the claim MinMax–Weight K4 ≫ FWM–Prob K4, whatever the order of the points; the
    historical-arithmetic cells still count (only the arithmetic override is ignored)."""
    ops = {"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01, "fwm-prob-k4[tau=5]": 0.15}
    pts = runs(ops)
    pts.sort(key=lambda p: ("[tau=5]" in p.operator) != tau_run_first)
    (row,) = C._contrast_rows(pts, "minmax-weight-k4", "fwm-prob-k4", None)
    assert row.est.mean == pytest.approx(0.2 - 0.01) and row.seeds == (7, 42)
    hist = runs({f"{op}[arithmetic=historical]": e for op, e in ops.items() if "tau" not in op})
    hist += runs({"fwm-prob-k4[tau=5,arithmetic=historical]": 0.15})
    (row,) = C._contrast_rows(hist, "minmax-weight-k4", "fwm-prob-k4", None)
    assert row.est.mean == pytest.approx(0.2 - 0.01) and row.family == "arithmetic=historical"


SUITE = """
name = "crash"
protocol = "tiny-cpu"
seeds = [7, 42]
checkpoints = 2

[overrides]
"model.n_layer" = 1
"model.n_head" = 1
"model.n_embd" = 32
"model.block_size" = 64
"schedule.tokens" = 24_576
"schedule.warmup_tokens" = 2_048
"schedule.micro_batch" = 8

[[group]]
name = "g"
operators = ["softmax", "lerp-k4", "lerp-k16"]
"""


def test_report_lists_the_run_that_stopped_early(tmp_path):
    (tmp_path / "crash.toml").write_text(SUITE)
    eff = {"softmax": 0.0, "lerp-k4": 0.08, "lerp-k16": 0.02}
    m = write_results(
        tmp_path / "crash", tmp_path / "crash.toml", lambda r, f: eff[r["operator"]] * f, noise=0.0
    )
    (run,) = [r for r in m["runs"] if r["run_id"] == "lerp-k4-s42"]
    last = tmp_path / "crash" / run["run_dir"] / "eval" / "val" / f"step_{run['checkpoint_steps'][-1]:06d}"
    last.with_suffix(".json").unlink()  # the run crashed before its last checkpoint was evaluated
    last.with_suffix(".npz").unlink()
    build_report(tmp_path / "crash", tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    (row,) = [r for r in data["delta"] if r["key"]["operator"] == "lerp-k4"]
    assert row["seeds"] == [7] and row["est"]["mean"] == pytest.approx(0.08)
    assert {"lerp-k4-s42 [val] in ΔNLL vs softmax", "lerp-k4-s42 [val] in K trend of lerp"} <= set(
        data["unpaired"]
    )
    assert "lerp-k4-s42 [val] in ΔNLL vs softmax" in (tmp_path / "rep" / "unpaired.md").read_text()
    # the figures' lines and the rank statistics say so too: the trajectory's last point is seed 7's alone
    assert data["unpaired"]["lerp-k4-s42 [val] in the ΔNLL trajectory"] == (
        f"no paired evaluation at {run['tokens']} training tokens: the line's point there is the mean of "
        "the other seeds"
    )
    assert [p["seeds"] for p in data["trajectories"]["lerp-k4 (24.58k, data:val)"]][-2:] == [[7, 42], [7]]
    assert "lerp-k4 (7; 24576 tokens, data:val, val) in the rank statistics and widthgap" in data["unpaired"]


def test_bh_family_keeps_a_condition_that_lacks_a_seed_at_the_endpoint():
    """BH q is over the conditions of the setting's design: lerp-k16's seed-42 run stopped early, so its row
    has two seeds, yet it stays in the family of the three conditions (the old family, the realized seed
    tuple, put it alone, q = p, and corrected the other two over a family of two)."""
    pts = runs(
        {"softmax": 0.0, "lerp-k4": 0.05, "lerp-k8": 0.02, "lerp-k16": 0.01},
        seeds=(7, 42, 1337),
        crashed={("lerp-k16", 42)},
    )
    rows = A.delta_table(A.softmax_pairs(pts))
    assert [r.seeds for r in rows] == [(7, 42, 1337), (7, 42, 1337), (7, 1337)]
    assert [r.q for r in rows] == pytest.approx(list(bh_q([r.est.p for r in rows])))
    assert rows[0].q == pytest.approx(0.375)  # p = 2/8 of three seeds, ranked in a family of three


DESIGN_SUITE = SUITE.replace("seeds = [7, 42]", "seeds = [7, 42, 1337]").replace(
    'operators = ["softmax", "lerp-k4", "lerp-k16"]',
    'operators = ["softmax", "lerp-k4", "lerp-k8", "lerp-k16"]\n\n'
    '[[group]]\nname = "supplementary"\noperators = ["minmax-weight-k4"]\nseeds = [1337]',
)


def test_bh_family_is_the_planned_design_not_the_seeds_evaluated(tmp_path):
    """A run that was never evaluated (lerp-k16 seed 42) is in the manifest: its condition keeps the design
    seeds (7, 42, 1337) and its family; a group planned on one seed in the same setting is a family of its
    own."""
    (tmp_path / "design.toml").write_text(DESIGN_SUITE)
    eff = {"softmax": 0.0, "lerp-k4": 0.08, "lerp-k8": 0.03, "lerp-k16": 0.01, "minmax-weight-k4": 0.2}
    write_results(
        tmp_path / "d",
        tmp_path / "design.toml",
        lambda r, f: eff[r["operator"]] * f,
        runs=lambda r: r["run_id"] != "lerp-k16-s42",
        heldout={"test__ptb": ("ptb", 32, lambda r: eff[r["operator"]], False)},
    )
    points = load_results(tmp_path / "d").points
    primary = [p for p in points if p.primary]
    for table in (A.delta_table(A.softmax_pairs(primary)), A.heldout_table(points)):
        rows = {r.key.operator: r for r in table if r.q is not None}
        lerp = [rows[op] for op in ("lerp-k4", "lerp-k8", "lerp-k16")]
        assert rows["lerp-k16"].seeds == (7, 1337)
        assert [r.q for r in lerp] == pytest.approx(list(bh_q([r.est.p for r in lerp])))
        supp = rows["minmax-weight-k4"]
        assert supp.seeds == (1337,) and supp.q == supp.est.p
    assert {p.design_seeds for p in points if p.operator == "lerp-k16"} == {(7, 42, 1337)}


def _geo_point(seed, tokens, h, span):
    nll = BASE + 0.01 * seed
    p = Point(
        "s",
        f"lerp-k4-s{seed}",
        "g",
        "lerp-k4",
        seed,
        1000,
        tokens // 100,
        tokens,
        "val",
        ("d", "val", 64, N),
        nll,
    )
    p.geometry = {"h": h, "span": span}
    return p


def test_final_geometry_is_at_the_endpoint():
    """Seed 42 stopped at 500 tokens: its early geometry is not averaged with seed 7's endpoint geometry (the
    old code took each run's last checkpoint: h 1.5, span 20), it is left out and listed."""
    pts = [_geo_point(7, 500, 1.0, 10.0), _geo_point(7, 1000, 2.0, 30.0), _geo_point(42, 500, 1.0, 10.0)]
    unpaired: dict[str, str] = {}
    (geo,) = A.final_geometry(pts, unpaired).values()
    assert geo == {"h": 2.0, "span": 30.0}
    assert list(unpaired) == ["lerp-k4-s42 [val] in geometry"]
    with pytest.raises(ValueError, match="lerp-k4-s42 .val. in geometry: no evaluation at the endpoint"):
        A.final_geometry(pts)


def test_final_geometry_averages_the_finite_values_of_the_seeds():
    """The seed mean of each metric takes its finite values only: a seed whose span is NaN (a probe that
    overflowed) leaves the mean of the others, and a metric NaN on every seed is dropped."""
    pts = [_geo_point(7, 1000, 2.0, 30.0), _geo_point(42, 1000, 4.0, float("nan"))]
    pts += [_geo_point(1337, 1000, 3.0, 50.0)]
    (geo,) = A.final_geometry(pts).values()
    assert geo == {"h": pytest.approx(3.0), "span": pytest.approx(40.0)}
    (geo,) = A.final_geometry([_geo_point(7, 1000, 2.0, float("nan"))]).values()
    assert geo == {"h": 2.0}


def _results_with_geometry(tmp_path) -> dict:
    """SUITE's results with an evaluation and a geometry probe at every checkpoint (h = f, span = 10 f at the
    fraction f of training); returns the manifest."""
    (tmp_path / "crash.toml").write_text(SUITE)
    eff = {"softmax": 0.0, "lerp-k4": 0.08, "lerp-k16": 0.02}
    return write_results(
        tmp_path / "crash",
        tmp_path / "crash.toml",
        lambda r, f: eff[r["operator"]] * f,
        geometry=lambda r, f: {"h": f, "span": 10.0 * f},
    )


def test_report_geometry_and_width_gap_are_at_the_endpoint(tmp_path):
    m = _results_with_geometry(tmp_path)
    (run,) = [r for r in m["runs"] if r["run_id"] == "lerp-k4-s42"]
    last = f"step_{run['checkpoint_steps'][-1]:06d}"
    run_dir = tmp_path / "crash" / run["run_dir"]
    for f in (run_dir / "eval" / "val" / f"{last}.json", run_dir / "eval" / "val" / f"{last}.npz"):
        f.unlink()  # the run crashed before its last checkpoint was evaluated and probed
    (run_dir / "diagnostics" / "geometry" / f"{last}.json").unlink()
    build_report(tmp_path / "crash", tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    geo = {k.split(" ")[0]: g for k, g in data["geometry"].items()}
    assert geo["lerp-k4"] == {"h": 1.0, "span": 10.0}, geo  # seed 7 at the endpoint only
    assert "lerp-k4-s42 [val] in geometry" in data["unpaired"]


def test_report_builds_when_every_seed_of_a_condition_lacks_its_last_evaluation(tmp_path):
    """One seed (or all) trained to the end but not evaluated there, its geometry probed: the report stopped
    with an IndexError (no seed left for the endpoint geometry) instead of listing the runs as unpaired."""
    m = _results_with_geometry(tmp_path)
    for run in (r for r in m["runs"] if r["operator"] == "lerp-k4"):
        last = (
            tmp_path / "crash" / run["run_dir"] / "eval" / "val" / f"step_{run['checkpoint_steps'][-1]:06d}"
        )
        last.with_suffix(".json").unlink()
        last.with_suffix(".npz").unlink()  # trained to the end (status completed), not evaluated there
        status = {"status": "completed", "tokens": run["tokens"]}
        (tmp_path / "crash" / run["run_dir"] / "status.json").write_text(json.dumps(status))
    build_report(tmp_path / "crash", tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert not any(k.startswith("lerp-k4 ") for k in data["geometry"]) and data["geometry"]
    assert {"lerp-k4-s7 [val] in geometry", "lerp-k4-s42 [val] in geometry"} <= set(data["unpaired"])


def test_the_minmax_weight_over_fwm_prob_claim_has_one_entry_per_arithmetic():
    """The strict and the historical K4 cells side by side: the claim has an entry for each, with its own
    estimate, not the first alone."""
    pts = runs({"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01})
    pts += runs({"minmax-weight-k4[arithmetic=historical]": 0.3, "fwm-prob-k4[arithmetic=historical]": 0.02})
    claims = [c for c in C.paper_claims(pts, {}) if c.claim.startswith("MinMax–Weight")]
    got = {c.setting.rsplit("; ", 1)[1]: c.estimate.mean for c in claims}
    assert got == pytest.approx({"arithmetic=historical": 0.3 - 0.02, "arithmetic=strict": 0.2 - 0.01})
    assert all(c.status == "agrees" for c in claims)


def test_a_claim_leaves_out_a_seed_whose_two_runs_have_other_block_counts():
    """Hand-made points whose fwm-prob-k4 seed 42 holds fewer blocks than its minmax-weight-k4 (the points'
    data label says the same blocks): that seed is left out of the per-block contrast, no numpy error."""
    pts = runs({"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01})
    short = next(p for p in pts if (p.operator, p.seed, p.tokens) == ("fwm-prob-k4", 42, 1000))
    short.nll = short.nll[: N // 2]
    (claim,) = [c for c in C.paper_claims(pts, {}) if c.claim.startswith("MinMax–Weight")]
    assert claim.estimate.mean == pytest.approx(0.2 - 0.01) and claim.ours.endswith("; seed 7)")


def _minmax_weight_claims(pts):
    return [c for c in C.paper_claims(pts, {}) if c.claim.startswith("MinMax–Weight")]


def test_a_claims_ours_is_its_estimate_and_interval_in_order():
    """The Ours cell is "mean [lo, hi] (interval; seed ...)", lower bound first; the direction agrees on the
    sign of the mean ("agrees if > 0"), whether or not the CI excludes 0 (that is the Detectable column)."""
    pts = runs({"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01})
    for p in pts:
        if (p.operator, p.seed) == ("minmax-weight-k4", 42):
            p.nll = p.nll - 0.2  # seed 42: −0.01, seed 7: +0.19; mean +0.09, a t interval across 0
    (c,) = _minmax_weight_claims(pts)
    e = c.estimate
    assert e.lo < 0 < e.mean < e.hi and e.mean == pytest.approx(0.09)
    assert c.ours == f"{e.mean:+.4f} [{e.lo:+.4f}, {e.hi:+.4f}] (t (1 df); seed 7,42)"
    assert c.direction_agrees is True and c.detectable is False and c.status == "agrees (not detectable)"


def test_a_supplementary_runs_claim_names_its_seed():
    """A supplementary run (one row per seed, never pooled): each seed's entry says which seed it is."""
    pts = runs({"minmax-weight-k4": 0.2, "fwm-prob-k4": 0.01})
    for p in pts:
        p.per_seed = True
    got = sorted(c.setting for c in _minmax_weight_claims(pts))
    assert got == [
        f"1000 tokens, d:val (T=64, {N} blocks), val, seed {s}; arithmetic=strict" for s in (42, 7)
    ]


def test_the_detach_claim_is_the_detach_pair_only():
    """A LERP K32 run under the other modified backward (``range_grad=p1``, its own pair with the same
    full-gradient twin) is not "LERP K32: detach − full": the claim keeps one entry, the detach pair's."""
    pts = runs({"lerp-k32": 0.001, "lerp-k32[range_grad=detach]": 0.7, "lerp-k32[range_grad=p1]": -0.3})
    (c,) = [c for c in C.paper_claims(pts, {}) if c.claim.startswith("LERP K32: detach")]
    assert c.estimate.mean == pytest.approx(0.7 - 0.001) and c.status == "agrees"


def test_a_run_trained_to_its_end_but_not_evaluated_there_stays_out_of_the_row():
    """A row of one run killed between its last checkpoint and that checkpoint's evaluation showed its
    earlier checkpoint as the endpoint (next to rows at the full budget), unpaired.md silent; the endpoint
    counts the checkpoint the run reached (Point.reached)."""
    pts = runs({"softmax": 0.0, "lerp-k4": 0.05}, seeds=(7,), crashed={("lerp-k4", 7)})
    pts = [dataclasses.replace(p, reached=1000) for p in pts]
    pairing = A.softmax_pairs(pts)
    assert A.delta_table(pairing) == []
    assert pairing.unpaired == {
        "lerp-k4-s7 [val] in ΔNLL vs softmax": (
            "no paired evaluation at the endpoint (1000 training tokens); its last is at 500"
        )
    }


def test_load_results_reads_how_far_each_run_trained(tmp_path):
    (tmp_path / "crash.toml").write_text(SUITE)
    m = write_results(tmp_path / "s", tmp_path / "crash.toml", lambda r, f: 0.0, noise=0.0)
    assert {p.reached for p in load_results(tmp_path / "s").points} == {0}  # no status, no checkpoints
    for r in m["runs"]:
        status = {"status": "completed", "step": r["steps"], "tokens": r["tokens"]}
        (tmp_path / "s" / r["run_dir"] / "status.json").write_text(json.dumps(status))
    ckpt = tmp_path / "s" / m["runs"][0]["run_dir"] / "checkpoints" / "step_000005"
    ckpt.mkdir(parents=True)  # a killed run: its status says running, its last checkpoint is step 5
    (ckpt / "state.json").write_text("{}")
    status = {"status": "running", "step": 0, "tokens": 0}
    (tmp_path / "s" / m["runs"][0]["run_dir"] / "status.json").write_text(json.dumps(status))
    reached = {p.run_id: p.reached for p in load_results(tmp_path / "s").points}
    r0 = m["runs"][0]
    assert reached.pop(r0["run_id"]) == 5 * r0["tokens"] // r0["steps"]
    assert set(reached.values()) == {int(r0["tokens"])}


def test_a_row_whose_runs_all_stop_short_of_their_budget_is_left_out_not_shown_as_the_endpoint():
    """A report of a suite still training (or of runs that stopped) took each row's endpoint as the largest
    count its own runs reached: a lone run at 500 of its 1000 tokens filled the endpoint ΔNLL, geometry and
    training-fit rows with its half-budget values, unmarked. Those rows now leave it out and say why; a
    claim, which names its tokens ("500 of 1000 tokens"), keeps it."""
    pts = runs({"softmax": 0.0, "lerp-k4": 0.05}, crashed={("lerp-k4", 7), ("lerp-k4", 42)})
    pairing = A.softmax_pairs(pts)
    assert A.delta_table(pairing) == []
    why = "not trained to its endpoint: its last checkpoint is at 500 of 1000 training tokens"
    assert pairing.unpaired == {f"lerp-k4-s{s} [val] in ΔNLL vs softmax": why for s in (7, 42)}
    rows, skipped = A.train_fit(pairing, {})
    assert rows == [] and skipped == {
        f"lerp-k4-s{s} vs softmax-s{s}": "its last paired evaluation is at 500 of 1000 training tokens, not "
        "the endpoint"
        for s in (7, 42)
    }
    geo = [dataclasses.replace(p, geometry={"span": float(p.tokens)}) for p in pts]
    unpaired: dict[str, str] = {}
    assert [k.operator for k in A.final_geometry(geo, unpaired)] == ["softmax"]
    assert unpaired == {f"lerp-k4-s{s} [val] in geometry": why for s in (7, 42)}
    # the clip table reads the whole log: a run still training is left out; one trained to the end but not
    # yet evaluated there, or stopped by a non-finite loss, is in
    log = [{"step": 1, "clipped_frac": 0.5, "grad_norm": 1.0, "train_loss": 3.0}]
    logs = {("", p.run_id): log for p in pts}
    assert [r.key.operator for r in A.clip_fractions(pts, logs)] == ["softmax"]
    done = [dataclasses.replace(p, reached=1000) if p.operator == "lerp-k4" else p for p in pts]
    assert [r.key.operator for r in A.clip_fractions(done, logs)] == ["softmax", "lerp-k4"]
