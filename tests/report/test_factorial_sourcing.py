"""fig:2x2 takes its panels from two settings (paper: (a, b) the one-seed 124M @ 250M suite B at K=4 and 16,
block-bootstrap intervals; (c, d) the five-seed suite D): planted per-block results of a three-seed setting,
a one-seed setting with the four cells at two K (B-like) and a longer one-seed setting with them at one K
(A-like); report.json's ``factorial_cells`` records which setting each panel plots and its numbers come
from there."""

from __future__ import annotations

import json

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report.build import build_report
from kinterval.stats import block_bootstrap_ci, block_length

FACTORIAL = '["minmax-weight-k{K}", "minmax-prob-k{K}", "fwm-weight-k{K}", "fwm-prob-k{K}"]'


def _suite(name: str, seeds: list[int], tokens: int, Ks: list[int]) -> str:
    return f"""
name = "{name}"
title = "{name}"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = {seeds}
checkpoints = 2

[overrides]
"schedule.tokens" = {tokens}
"schedule.warmup_tokens" = 2_048

[eval]
split = "val"

[[group]]
name = "softmax"
operators = ["softmax"]

[[group]]
name = "lerp"
operators = ["lerp-k4"]

[[group]]
name = "factorial"
operators = {FACTORIAL}
K = {Ks}
"""


SUITES = {  # name -> (seeds, token budget, K with the four cells)
    "Dlike": ([7, 42, 253], 24_576, [4, 16]),
    "Blike": ([1337], 49_152, [4, 16]),
    "Alike": ([1337], 98_304, [4]),
}
BASE = {"lerp": 0.05, "minmax-weight": 0.30, "minmax-prob": 0.12, "fwm-weight": 0.04, "fwm-prob": 0.02}
SCALE = {"Dlike": 1.0, "Blike": 2.0, "Alike": 3.0}  # each setting its own planted values
OFFSET = {7: -0.004, 42: 0.001, 253: 0.003, 1337: 0.0}


def planted(suite: str, op: str) -> float:
    fam, K = op.rsplit("-k", 1)
    return SCALE[suite] * BASE[fam] * 4 / int(K)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fig2x2")
    for name, (seeds, tokens, Ks) in SUITES.items():
        (tmp / f"{name}.toml").write_text(_suite(name, seeds, tokens, Ks))

        def effect(r, frac, name=name):
            op = r["operator"]
            return 0.0 if op == "softmax" else (planted(name, op) + OFFSET[r["seed"]]) * frac

        write_results(tmp / name, tmp / f"{name}.toml", effect, n_blocks=40, noise=0.004)
    return tmp


def _report(tmp, *names):
    """report.json of the folders ``names`` (built once per module)."""
    out = tmp / ("rep-" + "-".join(names))
    if not out.exists():
        build_report([tmp / n for n in names], out)
    return json.loads((out / "report.json").read_text())


def _cells(tmp, *names):
    return _report(tmp, *names)["factorial_cells"]


def _nll(tmp, suite, op, seed):
    m = json.loads((tmp / suite / "manifest.json").read_text())
    r = next(r for r in m["runs"] if r["operator"] == op and r["seed"] == seed)
    return np.load(sorted((tmp / suite / r["run_dir"] / "eval" / "val").glob("step_*.npz"))[-1])["nll"]


def test_cells_from_the_one_seed_factorial_setting(folders):
    """(a, b): the B-like setting (one seed, the four cells at K=4 and 16; preferred over the longer A-like
    setting with them at K=4 only), block bootstrap per cell; (c, d): the three-seed setting."""
    fc = _cells(folders, "Dlike", "Blike", "Alike")
    panels = fc["panels"]
    assert (
        panels["ab"]["setting"][0] == 49_152 and panels["ab"]["seeds"] == 1 and panels["ab"]["K"] == [4, 16]
    )
    assert panels["c"]["setting"][0] == 24_576 and panels["c"]["seeds"] == 3
    assert panels["d"]["setting"][0] == 24_576 and panels["d"]["seeds"] == 3
    assert fc["setting"] == panels["ab"]["setting"] and fc["arithmetic"] == "strict"
    assert sorted(map(int, fc["cells"])) == [4, 16]
    for K, cs in fc["cells"].items():
        assert set(cs) == (
            {"mm_w", "mm_p", "fwm_w", "fwm_p", "lerp"} if K == "4" else {"mm_w", "mm_p", "fwm_w", "fwm_p"}
        )
        for c in cs.values():
            e, op = c["est"], c["operator"]
            d = _nll(folders, "Blike", op, 1337) - _nll(folders, "Blike", "softmax", 1337)
            ref = block_bootstrap_ci(d, block=block_length(d.size), n_resamples=4000)
            assert e["per_seed"] == pytest.approx([d.mean()], abs=1e-12)
            assert (e["lo"], e["hi"]) == pytest.approx((ref.lo, ref.hi), abs=1e-12)
            assert e["mean"] == pytest.approx(planted("Blike", op), abs=0.004)
    # (c) the three-seed families (LERP at its one K too, as a point: the paper's panel has every family),
    # (d) Prob − Weight paired by seed: t intervals over the three seeds
    fams = fc["families"]
    assert set(fams) == {"minmax-weight", "minmax-prob", "fwm-weight", "fwm-prob", "lerp"}
    for fam, by_K in fams.items():
        for K, e in by_K.items():
            assert e["n_seeds"] == 3 and e["mean"] == pytest.approx(
                planted("Dlike", f"{fam}-k{K}"), abs=0.004
            )
    for cal, fam in (("MinMax", "minmax"), ("FWM", "fwm")):
        for K, x in fc["surrogate_effect"][cal].items():
            want = planted("Dlike", f"{fam}-prob-k{K}") - planted("Dlike", f"{fam}-weight-k{K}")
            assert x["seeds"] == [7, 42, 253] and x["est"]["mean"] == pytest.approx(want, abs=0.004)


def test_cells_fall_back(folders):
    """Without a one-seed setting (a, b) are the most-seeds setting's, as (c, d); with only the A-like
    one-seed setting, (a, b) are its K=4 cells."""
    fc = _cells(folders, "Dlike")
    assert {p["setting"][0] for p in fc["panels"].values()} == {24_576}
    assert fc["panels"]["ab"]["seeds"] == 3 and sorted(map(int, fc["cells"])) == [4, 16]
    fc = _cells(folders, "Dlike", "Alike")
    assert fc["panels"]["ab"]["setting"][0] == 98_304 and fc["panels"]["ab"]["K"] == [4]
    assert fc["panels"]["c"]["setting"][0] == 24_576
    assert fc["cells"]["4"]["mm_w"]["est"]["mean"] == pytest.approx(
        planted("Alike", "minmax-weight-k4"), abs=0.004
    )


def test_k_figure_is_of_the_longest_horizon(folders):
    """fig:k plots the longest-horizon setting (the A-like one at 98k tokens, one seed, K=4) over the
    three-seed and the B-like settings."""
    k = _report(folders, "Dlike", "Blike", "Alike")["k_figure"]
    assert k["setting"][0] == 98_304 and k["K"] == 4
    for fam, by_K in k["final"].items():
        assert list(by_K) == ["4"]
        assert by_K["4"]["est"]["mean"] == pytest.approx(planted("Alike", f"{fam}-k4"), abs=0.004)


PARTIAL16 = """
[[group]]
name = "weight16"
operators = ["minmax-weight-k16", "fwm-weight-k16"]
"""


def test_cells_only_at_the_k_with_all_four(tmp_path):
    """A K with two of the four cells (suites A and C: the Weight-STE cells at K=16) is not a 2x2: the cells
    panel shows K=4 only."""
    (tmp_path / "a.toml").write_text(_suite("A16", [1337], 49_152, [4]) + PARTIAL16)
    write_results(tmp_path / "A16", tmp_path / "a.toml", lambda r, frac: 0.0, n_blocks=40, noise=0.004)
    build_report([tmp_path / "A16"], tmp_path / "rep")
    fc = json.loads((tmp_path / "rep" / "report.json").read_text())["factorial_cells"]
    assert list(fc["cells"]) == ["4"] and fc["panels"]["ab"]["K"] == [4]
    assert set(fc["cells"]["4"]) == {"mm_w", "mm_p", "fwm_w", "fwm_p", "lerp"}
