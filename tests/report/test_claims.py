"""The "Paper claims" table on a mini-shaped suite at tiny size with planted per-block results: claims that
agree, a planted reversal that disagrees, and claims whose runs are absent listed as "not run"."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report.build import build_report
from kinterval.report.claims import paper_claims
from kinterval.report.results import Point, load_results

# The mini suite's conditions (softmax; LERP K4/16/32; LERP K32 detach; the 2x2 factorial at K4 in historical
# arithmetic) at a tiny size, in the suite-file syntax of suite/suites/mini.toml.
MINI_SHAPED = """
name = "mini-shaped"
title = "mini-shaped: the mini conditions at a tiny size"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = [1337]
checkpoints = 3

[overrides]
"model.n_layer" = 1
"model.n_head" = 1
"model.n_embd" = 32
"model.block_size" = 64
"schedule.tokens" = 24_576
"schedule.warmup_tokens" = 2_048
"schedule.micro_batch" = 8

[[group]]
name = "softmax"
operators = ["softmax"]

[[group]]
name = "lerp"
operators = ["lerp-k{K}"]
K = [4, 16, 32]

[[group]]
name = "detach"
operators = ["lerp-k32[range_grad=detach]"]

[[group]]
name = "factorial"
operators = ["minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4", "fwm-prob-k4"]
arithmetic = "historical"
"""

# Planted endpoint ΔNLL vs softmax (the paper's direction everywhere).
PLANTED = {
    "softmax": 0.0,
    "lerp-k4": 0.09,
    "lerp-k16": 0.03,
    "lerp-k32": 0.001,
    "lerp-k32[range_grad=detach]": 0.7,
    "minmax-weight-k4[arithmetic=historical]": 0.20,
    "minmax-prob-k4[arithmetic=historical]": 0.14,
    "fwm-weight-k4[arithmetic=historical]": 0.03,
    "fwm-prob-k4[arithmetic=historical]": 0.013,
}


def _claims(tmp_path, planted, suite=MINI_SHAPED, **kw):
    path = tmp_path / "mini-shaped.toml"
    path.write_text(suite)
    write_results(tmp_path / "mini", path, lambda r, frac: planted[r["operator"]] * frac, n_blocks=96, **kw)
    build_report(tmp_path / "mini", tmp_path / "rep")
    claims = json.loads((tmp_path / "rep" / "report.json").read_text())["claims"]
    return claims, (tmp_path / "rep" / "index.md").read_text()


def _suite(tmp_path, planted, **kw):
    claims, index = _claims(tmp_path, planted, **kw)
    return {c["claim"]: c for c in claims}, index


def _ours(c) -> float:
    return c["estimate"]["mean"]


def test_claims_agree(tmp_path):
    claims, index = _suite(tmp_path, PLANTED)
    assert len(claims) == 7 and all(c["direction_agrees"] is True for c in claims.values()), claims
    det = claims["LERP K32: detach − full > 0"]
    assert _ours(det) == pytest.approx(0.7 - 0.001, abs=3e-3) and det["detectable"] is True
    mm = claims["MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax"]
    assert _ours(mm) == pytest.approx(0.20 - 0.013, abs=3e-3)
    # paired per block: the shared per-block difficulty (SD 0.3) cancels, only the 0.01 noise is left
    assert mm["estimate"]["hi"] - mm["estimate"]["lo"] < 0.02
    inter = claims["factorial interaction > 0 (K4)"]
    assert _ours(inter) == pytest.approx((0.013 - 0.03) - (0.14 - 0.20), abs=3e-3)
    assert claims["calibration main effect FWM − MinMax < 0 (K4)"]["detectable"] is True
    noise = claims["LERP K32 within noise of softmax"]
    assert -0.01 < noise["estimate"]["lo"] < _ours(noise) < noise["estimate"]["hi"] < 0.01
    trend = claims["ΔNLL decreasing in K for LERP"]
    lo, hi = trend["estimate"]["lo"], trend["estimate"]["hi"]
    assert lo < _ours(trend) < hi < 0  # planted slope (0.001 - 0.09) / ... < 0, a one-seed block CI
    for c in claims.values():
        assert {"claim", "paper", "ours", "direction_agrees", "detectable"} <= set(c)
        assert "tab:" in c["paper"] and "[" in c["ours"]
    assert "### Paper claims" in index and "| agrees |" in index and "| disagrees |" not in index
    # evaluations that record no passes over the train split: no multi-pass note anywhere
    assert "passes" not in index and all(c["train_passes"] is None for c in claims.values())


def test_claims_name_the_passes_over_the_train_split(tmp_path):
    """Runs that saw their training data 2.46 times by their endpoint: each claim's setting says so, with
    the number in report.json, and the index lists the runs; at 0.8 passes nothing is flagged."""
    for d in ("multi", "single"):
        (tmp_path / d).mkdir()
    claims, index = _suite(tmp_path / "multi", PLANTED, passes=lambda r, frac: 2.4648 * frac)
    for c in claims.values():
        assert "(2.46 passes over the train split)" in c["setting"], c
        assert c["train_passes"] == pytest.approx(2.4648)
    assert "**Runs that saw their training data more than once**" in index
    assert "mini-shaped/softmax-s1337 2.46" in index and "lerp-k32-s1337 2.46" in index
    report = json.loads((tmp_path / "multi" / "rep" / "report.json").read_text())
    assert report["train_passes"]["mini-shaped/lerp-k4-s1337"] == pytest.approx(2.4648)

    claims, index = _suite(tmp_path / "single", PLANTED, passes=lambda r, frac: 0.8 * frac)
    for c in claims.values():
        assert "passes" not in c["setting"] and c["train_passes"] == pytest.approx(0.8)
    assert "more than once" not in index


def test_passes_note_names_the_runs_that_do_not_record_them(tmp_path):
    """Evaluations of an older kinterval record no passes: the multi-pass note names those runs, so that its
    list is not read as all the runs that saw their data again; runs that record them are listed as before."""
    old = {"softmax-s1337", "lerp-k32-s1337"}
    _, index = _suite(tmp_path, PLANTED, passes=lambda r, frac: None if r["run_id"] in old else 2.4648 * frac)
    note = next(line for line in index.splitlines() if "more than once" in line)
    listed, _, unrecorded = note.partition("Not recorded by the evaluations of ")
    assert "lerp-k4-s1337 2.46" in listed and "softmax-s1337" not in listed
    assert unrecorded.rstrip(".").split(", ") == ["mini-shaped/lerp-k32-s1337", "mini-shaped/softmax-s1337"]


def test_claims_disagree_on_a_planted_reversal(tmp_path):
    planted = dict(PLANTED)
    planted["fwm-prob-k4[arithmetic=historical]"] = 0.35  # FWM-Prob now worse than MinMax-Weight
    planted["lerp-k32[range_grad=detach]"] = -0.05  # detach better than full
    planted["lerp-k32"] = 0.05  # LERP K32 clearly above softmax
    claims, index = _suite(tmp_path, planted)
    assert claims["MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax"]["direction_agrees"] is False
    assert claims["LERP K32: detach − full > 0"]["direction_agrees"] is False
    assert claims["LERP K32 within noise of softmax"]["direction_agrees"] is False
    assert claims["LERP K32 within noise of softmax"]["detectable"] is True
    inter = claims["factorial interaction > 0 (K4)"]  # (0.35 - 0.03) - (0.14 - 0.20) > 0: still agrees
    assert inter["direction_agrees"] is True
    assert claims["surrogate main effect Prob − Weight < 0 (K4)"]["direction_agrees"] is False
    assert "| disagrees |" in index


def test_claims_without_their_runs_are_not_run(tmp_path):
    dropped = ("lerp-k32[range_grad=detach]", "fwm-prob-k4[arithmetic=historical]", "lerp-k16", "lerp-k4")
    claims, index = _suite(tmp_path, PLANTED, runs=lambda r: r["operator"] not in dropped)
    assert len(claims) == 7
    for name in (
        "LERP K32: detach − full > 0",
        "MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax",
        "factorial interaction > 0 (K4)",
        "calibration main effect FWM − MinMax < 0 (K4)",
        "surrogate main effect Prob − Weight < 0 (K4)",
        "ΔNLL decreasing in K for LERP",
    ):
        c = claims[name]
        assert c["ours"] == "not run" and c["direction_agrees"] is None and c["detectable"] is None, name
    assert claims["LERP K32 within noise of softmax"]["direction_agrees"] is True
    claims_table = index.split("[Markdown](claims.md)")[0]  # strict.md has "not run" rows of its own
    assert claims_table.count("| not run |") == 6


def test_claims_pool_seeds_across_folders(tmp_path):
    """mini's seed 1337 in one folder, seeds 7 and 42 of the factorial and detach conditions (and their
    controls) in another, as suites mini and mini-seeds write them: one report over both folders gives those
    claims a 3-seed t interval, while LERP K4/K16 (seed 1337 only) keep a one-seed block CI."""
    seeds_suite = MINI_SHAPED.replace('name = "mini-shaped"', 'name = "mini-shaped-seeds"')
    seeds_suite = seeds_suite.replace("seeds = [1337]", "seeds = [7, 42]").replace(
        "K = [4, 16, 32]", "K = [32]"
    )
    (tmp_path / "mini-shaped.toml").write_text(MINI_SHAPED)
    (tmp_path / "mini-shaped-seeds.toml").write_text(seeds_suite)
    for name, folder in (("mini-shaped", "mini"), ("mini-shaped-seeds", "seeds")):
        write_results(
            tmp_path / folder,
            tmp_path / f"{name}.toml",
            lambda r, frac: PLANTED[r["operator"]] * frac * (1 + 0.1 * (r["seed"] % 3)),
            n_blocks=96,
            data="../data",
        )
    build_report([tmp_path / "mini", tmp_path / "seeds"], tmp_path / "rep")
    claims = {c["claim"]: c for c in json.loads((tmp_path / "rep" / "report.json").read_text())["claims"]}
    for name in ("LERP K32: detach − full > 0", "factorial interaction > 0 (K4)"):
        est = claims[name]["estimate"]
        assert est["n_seeds"] == 3 and est["interval"].startswith("t"), (name, est)
        assert claims[name]["direction_agrees"] is True
    trend = claims["ΔNLL decreasing in K for LERP"]
    assert trend["estimate"]["n_seeds"] == 1 and trend["direction_agrees"] is True
    index = (tmp_path / "rep" / "index.md").read_text()
    assert "different operator code" not in index
    # seeds run by another kinterval version: the report says so (it still pools them)
    manifest = tmp_path / "seeds" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["code"] = {**m["code"], "ops_sha256": "0123456789ab" + "0" * 52}
    manifest.write_text(json.dumps(m))
    build_report([tmp_path / "mini", tmp_path / "seeds"], tmp_path / "rep")
    index = (tmp_path / "rep" / "index.md").read_text()
    assert (
        "**The folders ran different operator code**" in index and "mini-shaped-seeds `0123456789ab`" in index
    )
    folders = json.loads((tmp_path / "rep" / "report.json").read_text())["folders"]
    assert [f["code"]["ops_sha256"][:12] for f in folders][1] == "0123456789ab"


def test_lerp_within_noise_one_seed_inside_the_margin_agrees_though_detectable(tmp_path):
    """One seed, LERP K32 0.004 nats above softmax with a tight CI: detectable (the CI excludes zero), yet
    wholly inside the ±0.01-nat margin below which single-seed differences are not interpreted (§4): agrees;
    detectability and margin status are separate."""
    claims, _ = _suite(tmp_path, dict(PLANTED, **{"lerp-k32": 0.004}))
    c = claims["LERP K32 within noise of softmax"]
    assert c["estimate"]["n_seeds"] == 1
    assert 0.0 < c["estimate"]["lo"] and c["estimate"]["hi"] < 0.01, c["estimate"]
    assert c["detectable"] is True and c["direction_agrees"] is True and c["status"] == "agrees"


def test_claims_say_detectable_for_a_ci_that_excludes_zero_not_separated(tmp_path):
    """claims.md headed its CI-excludes-zero column "Separated", the word delta.md uses for a lower bound
    above +0.01 (§4): one row, CI inside (0, 0.01), was "separated" in claims.md and not in delta.md. The
    paper's word for a CI that excludes zero is "detectable" (App. C.3)."""
    claims, _ = _suite(tmp_path, dict(PLANTED, **{"lerp-k32": 0.004}))
    c = claims["LERP K32 within noise of softmax"]
    assert 0.0 < c["estimate"]["lo"] < c["estimate"]["hi"] < 0.01
    assert c["detectable"] is True
    # report.json keeps the claims list's key `separated` for the same test: the CI excludes zero
    assert all(x["separated"] is x["detectable"] for x in claims.values()) and c["separated"] is True
    rep = tmp_path / "rep"
    lines = (rep / "claims.md").read_text().splitlines()
    cols = [x.strip() for x in next(x for x in lines if x.startswith("| Claim |")).strip("|").split("|")]
    rows = [x for x in lines if x.startswith("| ")]
    assert "Detectable (CI excludes 0)" in cols and not any("Separated" in x for x in cols)
    (row,) = [r for r in rows if r.startswith("| LERP K32 within noise")]
    assert [x.strip() for x in row.strip("|").split("|")][cols.index("Detectable (CI excludes 0)")] == "yes"
    delta = (rep / "delta.md").read_text().splitlines()
    dcols = [x.strip() for x in next(x for x in delta if "Separated (lo > +0.01)" in x).strip("|").split("|")]
    (drow,) = [r for r in delta if r.startswith("| lerp-k32 |")]
    assert [x.strip() for x in drow.strip("|").split("|")][dcols.index("Separated (lo > +0.01)")] == "no"


def test_claims_separated_is_the_ci_test_not_the_verdict(tmp_path):
    """report.json's `separated` is whether the CI excludes zero, whatever the claim's verdict: a claim that
    agrees with a CI that includes zero is not separated; one that disagrees, its CI excluding zero, is."""
    claims, _ = _suite(tmp_path, dict(PLANTED, **{"lerp-k32": 0.0, "lerp-k32[range_grad=detach]": -0.5}))
    noise, detach = claims["LERP K32 within noise of softmax"], claims["LERP K32: detach − full > 0"]
    assert (noise["status"], noise["detectable"], noise["separated"]) == ("agrees", False, False)
    assert (detach["status"], detach["detectable"], detach["separated"]) == ("disagrees", True, True)


N = 48


def _lerp32_claim(deltas: dict[int, float]):
    """The claim on in-memory points: LERP K32 minus same-seed softmax is ``deltas[seed]`` in every block."""
    pts = []
    for s, d in deltas.items():
        base = np.random.default_rng(s).normal(4.0, 0.2, N)
        for op, nll in (("softmax", base), ("lerp-k32", base + d)):
            pts.append(Point("s", f"{op}-s{s}", "g", op, s, 1000, 10, 1000, "val", ("d", "val", 64, N), nll))
    (c,) = [c for c in paper_claims(pts) if c.claim == "LERP K32 within noise of softmax"]
    return c


@pytest.mark.parametrize("shift", [+0.001, -0.001])
def test_a_sign_within_the_noise_is_not_detectable(shift):
    """A claim of a sign (detach − full > 0) whose 95% CI includes 0 takes its sign from noise: the status
    says so ("agrees (not detectable)", "disagrees (not detectable)"); direction_agrees keeps the sign."""
    full = np.random.default_rng(0).normal(4.0, 0.2, N)
    noise = np.random.default_rng(1).normal(0.0, 0.05, N)
    detach = full + noise - noise.mean() + shift  # the mean difference is exactly `shift`
    ops = (("lerp-k32", full), ("lerp-k32[range_grad=detach]", detach))
    pts = [Point("s", f"{op}-s1", "g", op, 1, 1000, 10, 1000, "val", ("d", "val", 64, N), x) for op, x in ops]
    (c,) = [c for c in paper_claims(pts) if c.claim == "LERP K32: detach − full > 0"]
    assert c.detectable is False and c.direction_agrees is (shift > 0)
    assert c.status == ("agrees" if shift > 0 else "disagrees") + " (not detectable)"
    assert c.to_dict()["status"] == c.status


def test_lerp_within_noise_the_papers_five_seed_row_agrees():
    """tab:seedend: LERP K32 +0.0076, seed SD of Δ 0.0063, t interval [−0.000, +0.015]: the CI includes 0, "no
    detectable difference from softmax" (§5.1), so the claim agrees (the old rule, CI inside ±0.01, said
    "disagrees" on the paper's own row)."""
    z = np.array([-1.2, 0.3, 1.1, -0.7, 0.5])
    z = (z - z.mean()) / z.std(ddof=1)
    c = _lerp32_claim(dict(zip((7, 42, 253, 1337, 2026), 0.0076 + 0.0063 * z)))
    e = c.estimate
    assert (e.n_seeds, e.mean, e.sd) == (5, pytest.approx(0.0076), pytest.approx(0.0063))
    assert e.lo == pytest.approx(-0.0002, abs=5e-5) and e.hi == pytest.approx(0.0154, abs=5e-5)
    assert c.status == "agrees" and c.detectable is False


def test_lerp_within_noise_several_seeds_need_a_ci_that_includes_zero():
    """Five seeds +0.004 with a tight t interval inside ±0.01 that excludes 0: a detected difference, and the
    ±0.01 margin is for single-seed rows only: disagrees."""
    c = _lerp32_claim({s: 0.004 + 0.0002 * i for i, s in enumerate((7, 42, 253, 1337, 2026))})
    assert c.estimate.n_seeds == 5 and 0 < c.estimate.lo < c.estimate.hi < 0.01
    assert c.status == "disagrees" and c.detectable is True
    one = _lerp32_claim({1337: 0.004})  # the same difference on one seed: inside the margin, agrees
    assert one.estimate.n_seeds == 1 and 0 < one.estimate.lo and one.status == "agrees"
    wide = _lerp32_claim({1337: 0.02})  # one seed, outside the margin and excluding 0: disagrees
    assert wide.status == "disagrees"


def test_claims_use_only_their_own_rows(tmp_path):
    """With the factorial also at K16 (effects reversed) and every run also evaluated on a held-out corpus,
    each claim still has one entry: the K4 factorial rows (not K16, pooled or K×), the LERP family's K trend
    (not FWM–Prob's over K4/K16), the suite's own evaluations (not the held-out ones)."""
    suite = MINI_SHAPED.replace(
        'operators = ["minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4", "fwm-prob-k4"]',
        'operators = ["minmax-weight-k{K}", "minmax-prob-k{K}", "fwm-weight-k{K}", "fwm-prob-k{K}"]'
        "\nK = [4, 16]",
    )
    reversed_k16 = {k.replace("-k4[", "-k16["): 0.3 - v for k, v in PLANTED.items() if "-k4[" in k}
    planted = {**PLANTED, **reversed_k16}
    heldout = {"test__ptb": ("ptb", 32, lambda r: planted[r["operator"]], False)}
    claims, _ = _claims(tmp_path, planted, suite=suite, heldout=heldout)
    assert len(claims) == len({c["claim"] for c in claims}) == 7, [c["claim"] for c in claims]
    assert all(c["direction_agrees"] is True for c in claims), claims
    assert not any("test__ptb" in c["setting"] for c in claims)
    # paper_claims itself keeps to the primary evaluations when handed every point of the folder
    direct = paper_claims(load_results(tmp_path / "mini").points)
    assert len(direct) == 7 and not any("test__ptb" in c.setting for c in direct)


def test_detach_claim_is_minmax_lerp_only(tmp_path):
    """An FWM–LERP K32 detach pair (another calibration) is not "LERP K32: detach − full"."""
    suite = (
        MINI_SHAPED
        + '\n[[group]]\nname = "fwm"\noperators = ["fwm-lerp-k32", "fwm-lerp-k32[range_grad=detach]"]\n'
    )
    planted = dict(PLANTED, **{"fwm-lerp-k32": 0.02, "fwm-lerp-k32[range_grad=detach]": -0.3})
    claims, _ = _claims(tmp_path, planted, suite=suite)
    (det,) = [c for c in claims if c["claim"] == "LERP K32: detach − full > 0"]
    assert det["direction_agrees"] is True and _ours(det) == pytest.approx(0.7 - 0.001, abs=3e-3)


def test_factorial_claims_keep_to_the_papers_design(tmp_path):
    """The paper's factorial is of FWM at tau = 6 with the full gradient: a factorial of FWM at another tau
    or of detached cells (effects reversed) is another operator family, not "run" against the paper's claim
    (as the MinMax–Weight ≫ FWM–Prob claim never takes ``fwm-prob-k4[tau=4]`` for ``fwm-prob-k4``); its
    effects are in factorial.md."""
    suite = (
        MINI_SHAPED
        + '\n[[group]]\nname = "tau4"\noperators = ["fwm-weight-k4[tau=4]", "fwm-prob-k4[tau=4]"]\n'
        + 'arithmetic = "historical"\n'
        + '\n[[group]]\nname = "detached"\noperators = ["minmax-weight-k4[range_grad=detach]", '
        + '"minmax-prob-k4[range_grad=detach]", "fwm-weight-k4[range_grad=detach]", '
        + '"fwm-prob-k4[range_grad=detach]"]\n'
    )
    reversed_cells = {
        "fwm-weight-k4[tau=4,arithmetic=historical]": 0.5,
        "fwm-prob-k4[tau=4,arithmetic=historical]": 0.1,
        "minmax-weight-k4[range_grad=detach]": 0.01,
        "minmax-prob-k4[range_grad=detach]": 0.3,
        "fwm-weight-k4[range_grad=detach]": 0.4,
        "fwm-prob-k4[range_grad=detach]": 0.2,
    }
    claims, index = _claims(tmp_path, {**PLANTED, **reversed_cells}, suite=suite)
    factorial = [c for c in claims if "effect" in c["claim"] or "interaction" in c["claim"]]
    assert len(factorial) == 3, [(c["claim"], c["setting"]) for c in factorial]
    assert all(c["direction_agrees"] is True and "range_grad=full, tau=6" in c["setting"] for c in factorial)
    assert "tau=4" in index and "range_grad=detach" in index  # still in the factorial table


PAPER = Path(__file__).resolve().parents[2] / ".." / "shared" / "paper" / "pretraining-quantized-softmax.tex"
NUMBER = re.compile(r"[-−+]?\d*\.\d+")


def _table(tex: str, label: str) -> str:
    """The LaTeX of the table labelled ``label``: from its \\label to the end of its table."""
    start = tex.index(f"\\label{{{label}}}")
    return tex[start : tex.index("\\end{table}", start)]


def _close(value: str, table: str) -> bool:
    """``value`` (e.g. "+0.208") appears in ``table`` to its own precision (+0.2076 rounds to +0.208)."""
    x = abs(float(value.replace("−", "-")))
    half = 0.5 * 10 ** -len(value.split(".")[1])
    return any(abs(abs(float(n.replace("−", "-"))) - x) <= half + 1e-12 for n in NUMBER.findall(table))


def test_each_claim_cites_tables_that_hold_its_values():
    """Each parenthesised citation of a claim's paper value, e.g. "(tab:crossfull, tab:seedend)", names tables
    that hold the first value quoted before it (tab:cross has no condition-vs-softmax rows)."""
    if not PAPER.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the paper beside the clone ({PAPER})")
        pytest.skip("the paper is not beside the clone (../shared/paper)")
    tex = PAPER.read_text(encoding="utf-8")
    wrong = []
    for c in paper_claims([], {}):
        last = 0
        for m in re.finditer(r"\(([^()]*tab:[^()]*)\)", c.paper):
            value = NUMBER.findall(c.paper[last : m.start()])[0]
            for label in re.findall(r"tab:[a-z0-9]+", m.group(1)):
                if not _close(value, _table(tex, label)):
                    wrong.append((c.claim, value, label))
            last = m.end()
        assert last > 0, c.paper  # every claim cites a table
    assert not wrong


def test_factorial_claims_state_the_weights_the_code_uses():
    """The interaction is (FWM_P − FWM_W) − (MM_P − MM_W), weights ±1; ±1/2 are the main effects' weights."""
    from kinterval.report.claims import paper_claims
    from kinterval.stats import FACTORIAL_WEIGHTS

    tests = {c.claim: c.test for c in paper_claims([], {})}
    (inter,) = [t for t in tests.values() if t.startswith("interaction")]
    assert "±1 weights" in inter and {abs(w) for w in FACTORIAL_WEIGHTS["interaction"].values()} == {1.0}
    main = [t for t in tests.values() if t.startswith(("calibration effect", "surrogate effect"))]
    assert len(main) == 2 and all("±1/2 weights" in t for t in main)


def test_the_quoted_contrast_difference_is_the_papers_five_seed_difference():
    """The MinMax–Weight vs FWM–Prob claim quotes the difference of tab:seedend's five-seed mean ΔNLL
    (+0.2076 − +0.0132 = +0.1944, quoted +0.194), not of the values rounded to three digits (+0.195, a number
    the paper does not give), and the two means themselves."""
    if not PAPER.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the paper beside the clone ({PAPER})")
        pytest.skip("the paper is not beside the clone (../shared/paper)")
    seedend = _table(PAPER.read_text(encoding="utf-8"), "tab:seedend")

    def mean(row: str) -> str:  # the row's ΔNLL column: condition & NLL & NLL SD & ΔNLL & ...
        return re.search(rf"{row} & [\d.]+ & [\d.]+ & ([-+][\d.]+) &", seedend).group(1)

    mw, fp = mean("MinMax--Weight K4"), mean("FWM--Prob K4")
    (c,) = [c for c in paper_claims([], {}) if c.claim.startswith("MinMax–Weight K4")]
    assert f"{mw} vs {fp}, difference {float(mw) - float(fp):+.3f} (tab:seedend)" in c.paper, (
        mw,
        fp,
        c.paper,
    )


def test_runs_stopped_by_a_non_finite_loss_are_entries_of_their_own(tmp_path):
    """A run the trainer stopped with a non-finite loss (status.json "nonfinite_loss", no checkpoint from that
    step on) is neither "not run" nor silently compared at an earlier checkpoint: each claim that involves its
    operator lists it, agreeing when the claim says that operator is the worse one, disagreeing when it says
    the other is (or that it is within noise of softmax), not estimable in a factorial effect; the report has
    a table of stopped runs and names the stop where it leaves the run out of a row."""
    stops = {"lerp-k32[range_grad=detach]": 40, "minmax-weight-k4[arithmetic=historical]": 40, "lerp-k32": 20}
    claims, index = _claims(tmp_path, PLANTED, stopped=lambda r: stops.get(r["operator"]))
    by: dict[str, list] = {}
    for c in claims:
        by.setdefault(c["claim"], []).append(c)

    def stopped(name):
        return [c for c in by[name] if c["stopped"]]

    # no estimate at the last checkpoint before a stop, where the run may still have tracked its control
    assert all(c["stopped"] for c in by["LERP K32: detach − full > 0"])
    full, det = stopped("LERP K32: detach − full > 0")  # both lerp-k32 runs stopped, the full one at step 20
    assert (full["status"], full["direction_agrees"]) == ("disagrees (run stopped)", False)
    assert (det["status"], det["direction_agrees"]) == ("agrees (run stopped)", True)
    det = [det]
    assert det[0]["ours"].startswith("lerp-k32.range_grad-detach-s1337: non-finite loss at step 40 (20480 of")
    assert "last evaluated at 16384 tokens" in det[0]["ours"] and det[0]["detectable"] is None
    assert det[0]["estimate"] is None and det[0]["tokens"] == 20480
    (mm,) = stopped("MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax")
    assert mm["status"] == "agrees (run stopped)" and mm["ours"].startswith("minmax-weight-k4")
    for name in ("factorial interaction > 0 (K4)", "surrogate main effect Prob − Weight < 0 (K4)"):
        assert [c["status"] for c in by[name]] == ["not estimable (run stopped)"], name  # no cell at the end
    (noise,) = by["LERP K32 within noise of softmax"]
    assert noise["status"] == "disagrees (run stopped)" and noise["ours"].startswith("lerp-k32-s1337")
    trend = by["ΔNLL decreasing in K for LERP"]  # K4 and K16 still give a slope; K32 is listed
    assert [c["status"] for c in trend] == ["agrees", "not estimable (run stopped)"]
    assert "not run" not in {c["status"] for c in claims}
    assert "### Runs stopped by a non-finite loss" in index
    assert "| lerp-k32-s1337 | lerp-k32 | 1337 | 20 | 10240 of 24576 | 8192 tokens |" in index
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert set(report["stopped"]) == {
        "lerp-k32-s1337",
        "lerp-k32.range_grad-detach-s1337",
        "minmax-weight-k4.arithmetic-historical-s1337",
    }
    left = [v for k, v in report["unpaired"].items() if k.startswith("lerp-k32-s1337")]
    assert left and all(v.startswith("stopped by a non-finite loss at step 20 (10240 tokens)") for v in left)


def test_a_run_stopped_before_its_first_checkpoint_is_not_called_not_run(tmp_path):
    """No evaluation, so no per-block point: the claim still lists the stop (from status.json and the
    manifest), and the table of stopped runs has it with no last evaluation."""
    claims, index = _claims(tmp_path, PLANTED, stopped=lambda r: 10 if "detach" in r["operator"] else None)
    (det,) = [c for c in claims if c["claim"] == "LERP K32: detach − full > 0"]
    assert det["status"] == "agrees (run stopped)" and det["estimate"] is None
    assert det["ours"] == (
        "lerp-k32.range_grad-detach-s1337: non-finite loss at step 10 (5120 of 24576 tokens), before its "
        "first checkpoint"
    )
    assert det["setting"] == "5120 of 24576 tokens, 1L 1H d32, seed 1337"
    row = (
        "| lerp-k32.range_grad-detach-s1337 | lerp-k32[range_grad=detach] | 1337 | 10 | 5120 of 24576 | - | -"
    )
    assert row in index
    assert sum(c["status"] == "not run" for c in claims) == 0


def test_the_modern_attention_suite_checks_the_claims_it_has_runs_for(tmp_path):
    """mini-modern's conditions (softmax, the Table 3 contrast, LERP K32) on a model with grouped-query
    heads, rotary positions and sinks, at a tiny size: the contrast and the within-noise claim are checked,
    the rest are "not run", and the table names the model with its options."""
    from kinterval.suite.definition import load_suite

    shipped = load_suite("mini-modern")
    ops = [r.operator for r in shipped.runs]
    suite = MINI_SHAPED.replace('"model.n_head" = 1', '"model.n_head" = 2').replace(
        "[overrides]",
        '[overrides]\n"model.n_kv_head" = 1\n"model.rope_theta" = 1e4\n"model.attn_sinks" = true',
    )
    suite = suite.split("[[group]]")[0] + '[[group]]\noperators = ["softmax", "lerp-k32"]\n'
    suite += '[[group]]\noperators = ["minmax-weight-k4", "fwm-prob-k4"]\narithmetic = "historical"\n'
    claims, index = _suite(tmp_path, PLANTED, suite=suite)
    hist = "k4[arithmetic=historical]"
    assert set(ops) == {"softmax", "lerp-k32", f"minmax-weight-{hist}", f"fwm-prob-{hist}"}  # as above
    checked = {n for n, c in claims.items() if c["ours"] != "not run"}
    assert checked == {
        "MinMax–Weight K4 − softmax ≫ FWM–Prob K4 − softmax",
        "LERP K32 within noise of softmax",
    }
    assert all(claims[n]["direction_agrees"] is True for n in checked)
    assert "1L 2H d32 1KV sinks rope10000" in index


def test_ours_never_prints_a_nonzero_value_as_zero():
    """claims.md's "Ours" column printed +.4f: an interval of [+2e-05, +4e-05], which excludes 0, read
    "[+0.0000, +0.0000]" and a mean of -3e-05 "-0.0000", while every other report table prints such a value
    in two significant digits (stats.format.num)."""
    from kinterval.report.analysis import Estimate
    from kinterval.report.claims import _ours

    e = Estimate(mean=-3e-05, lo=2e-05, hi=4e-05, interval="block bootstrap", n_seeds=1, per_seed=(-3e-05,))
    assert _ours(e, [7]) == "-3.0e-05 [+2.0e-05, +4.0e-05] (block bootstrap; seed 7)"
    e = Estimate(mean=0.0123, lo=-0.001, hi=0.02, interval="t (1 df)", n_seeds=2, per_seed=(0.01, 0.0146))
    assert _ours(e, [7, 42]) == "+0.0123 [-0.0010, +0.0200] (t (1 df); seed 7,42)"


def test_exactly_one_pass_over_the_train_split_is_not_flagged(tmp_path):
    """A run whose endpoint is exactly one pass over its train split saw no sequence twice: no multi-pass
    note in the index, no passes in the claims' settings."""
    claims, index = _suite(tmp_path, PLANTED, passes=lambda r, frac: 1.0 * frac)
    assert all(c["train_passes"] == 1.0 and "passes" not in c["setting"] for c in claims.values())
    assert "more than once" not in index
