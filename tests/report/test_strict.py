"""tab:strict from planted per-block results: the strict-arithmetic K=4 cells of one seed (a supplementary
suite), a second evaluation of them in another evaluation folder (a secondary evaluator), the same-seed
historical-arithmetic cells (a designed suite) and their evaluations through the strict forward
(``val__op-...``). Every number in report.json is recomputed here from the evaluation arrays (the per-block
contrast, its mean and its block-bootstrap interval) and lies near the planted value; a contrast whose runs
or evaluations are absent is a "not run" row with its reason, never dropped."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from synthetic_results import _write_eval, write_results

from kinterval.report.build import build_report
from kinterval.stats import block_bootstrap_ci, block_length

SUPP = """
name = "supplementary"
title = "strict-forward cells, seed 7"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = [7]
checkpoints = 3

[eval]
split = "val"

[[group]]
name = "strict-forward"
operators = ["minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4", "fwm-prob-k4"]
arithmetic = "strict"
"""
HIST = """
name = "hist"
title = "historical cells, seeds 7 and 42"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = [7, 42]
checkpoints = 3
arithmetic = "historical"

[eval]
split = "val"

[[group]]
name = "softmax"
operators = ["softmax"]

[[group]]
name = "factorial"
operators = ["minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4", "fwm-prob-k4"]
"""
# planted endpoint NLL offsets (the per-seed base cancels in every same-seed contrast)
NEW = {"minmax-weight": 0.30, "minmax-prob": 0.22, "fwm-weight": 0.06, "fwm-prob": 0.02}
OLD = {"minmax-weight": 0.31, "minmax-prob": 0.23, "fwm-weight": 0.05, "fwm-prob": 0.03}
STRICT_SHIFT = {"minmax-prob": 0.004, "fwm-prob": -0.006}  # historical Prob through the strict forward
GPU2_SHIFT = {"minmax-prob": 0.003}  # the secondary evaluator's numerics on one run
N = 40


def _fam(op: str) -> str:
    return op.split("[")[0].rsplit("-k", 1)[0]


def effect(r, frac):
    op = r["operator"]
    if op == "softmax":
        return 0.0
    return (OLD if "historical" in op else NEW)[_fam(op)] * frac


def _endpoint(run_dir):
    """The run's last primary evaluation: (json path, its summary, its per-block NLL)."""
    js = sorted((run_dir / "eval" / "val").glob("step_*.json"))[-1]
    return js, json.loads(js.read_text()), np.load(js.with_suffix(".npz"))["nll"]


def _add_eval(root, r, tag, shift, seed, operator_used=None):
    """Another evaluation of the run's endpoint in RUN/eval/TAG: its primary per-block NLL + ``shift`` + a
    little noise (another device's or another forward's rounding)."""
    js, s, nll = _endpoint(root / r["run_dir"])
    noise = np.random.default_rng(seed).normal(0, 0.0005, nll.size)
    ev = root / r["run_dir"] / "eval" / tag
    _write_eval(ev, s["step"], s["tokens"], root / "data", s["T"], nll + shift + noise)
    if operator_used is not None:  # as `kinterval eval --operator` records it
        out = ev / js.name
        out.write_text(json.dumps({**json.loads(out.read_text()), "operator_used": operator_used}))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strict")
    (tmp / "supp.toml").write_text(SUPP)
    (tmp / "hist.toml").write_text(HIST)
    ms = write_results(tmp / "supp", tmp / "supp.toml", effect, n_blocks=N, noise=0.004)
    mh = write_results(tmp / "hist_native", tmp / "hist.toml", effect, n_blocks=N, noise=0.004)
    shutil.copytree(tmp / "hist_native", tmp / "hist")
    shutil.copytree(tmp / "supp", tmp / "supp_plain")  # without the secondary evaluator
    for i, r in enumerate(ms["runs"]):
        _add_eval(tmp / "supp", r, "val__gpu2", GPU2_SHIFT.get(_fam(r["operator"]), 0.0), i)
    for i, r in enumerate(mh["runs"]):
        fam = _fam(r["operator"])
        if r["seed"] == 7 and fam in STRICT_SHIFT:
            strict = f"{fam}-k4"
            _add_eval(tmp / "hist", r, f"val__op-{strict}", STRICT_SHIFT[fam], 100 + i, strict)
    return tmp


def _report(tmp, *names):
    out = tmp / ("rep-" + "-".join(names))
    if not out.exists():
        build_report([tmp / n for n in names], out)
    return out, json.loads((out / "report.json").read_text())


def _nll(tmp, folder, op, tag):
    """The endpoint per-block NLL of ``op`` seed 7 in ``folder`` at ``tag``."""
    m = json.loads((tmp / folder / "manifest.json").read_text())
    r = next(r for r in m["runs"] if r["operator"] == op and r["seed"] == 7)
    ev = tmp / folder / r["run_dir"] / "eval" / tag
    return np.load(sorted(ev.glob("step_*.npz"))[-1])["nll"]


def _check(row, d, planted):
    """The row is the per-block contrast ``d``: its mean, its block bootstrap (the one rule), the planted
    value within the noise."""
    e = row["est"]
    ref = block_bootstrap_ci(d, block=block_length(d.size), n_resamples=4000)
    assert e["mean"] == pytest.approx(float(d.mean()), abs=1e-12)
    assert (e["lo"], e["hi"]) == pytest.approx((ref.lo, ref.hi), abs=1e-12)
    assert e["interval"] == "block bootstrap" and e["n_seeds"] == 1
    assert e["mean"] == pytest.approx(planted, abs=0.004)


def test_strict_table_every_group(folders):
    tmp = folders
    rep, data = _report(tmp, "hist", "supp")
    rows = data["strict"]
    assert len(rows) == 14 and all(r["est"] is not None for r in rows), [r["why"] for r in rows]
    by = {(r["group"], r["contrast"], r["evaluator"]): r for r in rows}
    assert all(r["seed"] == 7 and r["K"] == 4 for r in rows)

    def new(op, tag="val"):
        return _nll(tmp, "supp", op, tag)

    def old(op, tag="val"):
        return _nll(tmp, "hist", f"{op}[arithmetic=historical]", tag)

    g1, g2, g3, g4 = (
        "strict pairs, training evaluator",
        "strict pairs, secondary evaluator",
        "historical comparisons (frozen weights)",
        "background: historical runs only",
    )
    for group, tag, shift in ((g1, "val", 0.0), (g2, "val__gpu2", GPU2_SHIFT["minmax-prob"])):
        mm = new("minmax-prob-k4", tag) - new("minmax-weight-k4", tag)
        fwm = new("fwm-prob-k4", tag) - new("fwm-weight-k4", tag)
        _check(by[(group, "MinMax: Prob − Weight (strict pair)", tag)], mm, -0.08 + shift)
        _check(by[(group, "FWM: Prob − Weight (strict pair)", tag)], fwm, -0.04)
        _check(by[(group, "Interaction (FWM_P − FWM_W) − (MM_P − MM_W)", tag)], fwm - mm, 0.04 - shift)
    for cal, fam in (("MinMax", "minmax"), ("FWM", "fwm")):
        p, w, strict = f"{fam}-prob-k4", f"{fam}-weight-k4", f"val__op-{fam}-prob-k4"
        row = by[(g3, f"{cal}: new Prob − historical Prob, strict forward on both", "val")]
        _check(
            row,
            new(p) - old(p, strict),
            NEW[f"{fam}-prob"] - OLD[f"{fam}-prob"] - STRICT_SHIFT[f"{fam}-prob"],
        )
        assert any(strict in t for t in row["terms"])
        row = by[(g3, f"{cal}: new strict Weight − historical Weight", "val")]
        _check(row, new(w) - old(w), NEW[f"{fam}-weight"] - OLD[f"{fam}-weight"])
        row = by[(g3, f"{cal}: historical Prob, native − strict forward", "val")]
        _check(row, old(p) - old(p, strict), -STRICT_SHIFT[f"{fam}-prob"])
        row = by[(g4, f"{cal}: historical Prob − historical Weight", "val")]
        _check(row, old(p) - old(w), OLD[f"{fam}-prob"] - OLD[f"{fam}-weight"])
    md = (rep / "strict.md").read_text()
    assert "| not run |" not in md and "val__gpu2" in md and (rep / "strict.tex").is_file()
    assert "[Markdown](strict.md)" in (rep / "index.md").read_text()


def test_strict_table_not_run_rows(folders):
    """Without the historical runs, without a second evaluation and without the strict runs: every contrast
    stays in the table as "not run", with what is missing."""
    tmp = folders
    rep, data = _report(tmp, "supp_plain")
    rows = data["strict"]
    assert len(rows) == 14
    done = [r for r in rows if r["est"] is not None]
    assert {r["group"] for r in done} == {"strict pairs, training evaluator"} and len(done) == 3
    missing = [r for r in rows if r["est"] is None]
    assert all(r["evaluator"] == "-" and r["why"] for r in missing)
    second = [r for r in missing if r["group"] == "strict pairs, secondary evaluator"]
    assert len(second) == 3 and all("second evaluation" in r["why"] for r in second)
    hist = [r for r in missing if r["group"] != "strict pairs, secondary evaluator"]
    assert len(hist) == 8 and all("[arithmetic=historical] run with seed 7" in r["why"] for r in hist)
    md = (rep / "strict.md").read_text()
    assert md.count("| not run |") == 11

    # the historical runs without their evaluation through the strict forward: those rows are not run
    _, data = _report(tmp, "hist_native", "supp")
    rows = {r["contrast"]: r for r in data["strict"] if r["group"].startswith("historical")}
    for cal, fam in (("MinMax", "minmax"), ("FWM", "fwm")):
        for name in (
            "new Prob − historical Prob, strict forward on both",
            "historical Prob, native − strict forward",
        ):
            r = rows[f"{cal}: {name}"]
            assert r["est"] is None and f"through {fam}-prob-k4 [val]" in r["why"]
            assert f"--operator '{fam}-prob-k4'" in r["why"]
        assert rows[f"{cal}: new strict Weight − historical Weight"]["est"] is not None

    # no strict run at all: the table is there, every row not run
    rep, data = _report(tmp, "hist")
    assert len(data["strict"]) == 14
    assert all(r["est"] is None and "no strict-arithmetic factorial run" in r["why"] for r in data["strict"])
    assert (rep / "strict.md").read_text().count("| not run |") == 14


def test_strict_table_missing_cell(folders, tmp_path):
    """One strict cell absent: the contrasts that need it are not run, the others are computed."""
    shutil.copytree(folders / "supp", tmp_path / "supp")
    m = json.loads((tmp_path / "supp" / "manifest.json").read_text())
    run = next(r for r in m["runs"] if r["operator"] == "fwm-prob-k4")
    shutil.rmtree(tmp_path / "supp" / run["run_dir"] / "eval")
    build_report([folders / "hist", tmp_path / "supp"], tmp_path / "rep")
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["strict"]
    pairs = {r["contrast"]: r for r in rows if r["group"] == "strict pairs, training evaluator"}
    assert pairs["MinMax: Prob − Weight (strict pair)"]["est"] is not None
    for name in ("FWM: Prob − Weight (strict pair)", "Interaction (FWM_P − FWM_W) − (MM_P − MM_W)"):
        assert pairs[name]["est"] is None and "no fwm-prob-k4 run with seed 7" in pairs[name]["why"]


def test_the_evaluator_names_the_device_models(folders, tmp_path):
    """The evaluations' recorded device models (``device_name``) name the evaluator: the strict pairs of the
    training GPU and of the secondary evaluator; older files without the field show the tag alone."""
    for name in ("hist", "supp"):
        shutil.copytree(folders / name, tmp_path / name)
    for js in (tmp_path / "supp").glob("runs/*/eval/*/step_*.json"):
        gpu = "RTX 3090" if js.parent.name == "val__gpu2" else "RTX 5090"
        js.write_text(json.dumps({**json.loads(js.read_text()), "device_name": gpu}))
    out = tmp_path / "rep"
    build_report([tmp_path / "hist", tmp_path / "supp"], out)
    rows = json.loads((out / "report.json").read_text())["strict"]
    devices = {(r["group"], r["evaluator"]): tuple(r["devices"]) for r in rows if r["est"] is not None}
    assert devices[("strict pairs, training evaluator", "val")] == ("RTX 5090",)
    assert devices[("strict pairs, secondary evaluator", "val__gpu2")] == ("RTX 3090",)
    assert devices[("background: historical runs only", "val")] == ()  # the planted files record none
    md = (out / "strict.md").read_text()
    assert "| val__gpu2 (RTX 3090) |" in md and "| val (RTX 5090) |" in md


def _md_rows(rep):
    """The body rows of strict.md, each a list of its cells."""
    lines = [x for x in (rep / "strict.md").read_text().splitlines() if x.startswith("| ")]
    return [x[2:-2].split(" | ") for x in lines[1:]]


def test_strict_md_shows_each_estimate_and_its_interval(folders):
    """Each computed row of strict.md prints report.json's Δ and its interval [lo, hi]."""
    rep, data = _report(folders, "hist", "supp")
    md = {(c[0], c[1], c[4]): c for c in _md_rows(rep)}
    for r in data["strict"]:
        e = r["est"]
        cells = md[(r["group"], r["contrast"], r["evaluator"])]
        assert cells[5:8] == [f"{e['mean']:+.4f}", f"[{e['lo']:+.4f}, {e['hi']:+.4f}]", "block bootstrap"]
        assert e["lo"] < e["mean"] < e["hi"]


def test_the_devices_of_a_row_are_those_of_all_its_evaluations(folders, tmp_path):
    """A contrast of a new strict run (one GPU) and a historical run (another GPU) names both."""
    for name, gpu in (("hist", "RTX 4090"), ("supp", "RTX 5090")):
        shutil.copytree(folders / name, tmp_path / name)
        for js in (tmp_path / name).glob("runs/*/eval/*/step_*.json"):
            js.write_text(json.dumps({**json.loads(js.read_text()), "device_name": gpu}))
    out = tmp_path / "rep"
    build_report([tmp_path / "hist", tmp_path / "supp"], out)
    rows = json.loads((out / "report.json").read_text())["strict"]
    devices = {r["contrast"]: tuple(r["devices"]) for r in rows if r["evaluator"] == "val"}
    assert devices["MinMax: new strict Weight − historical Weight"] == ("RTX 4090", "RTX 5090")
    assert devices["FWM: new Prob − historical Prob, strict forward on both"] == ("RTX 4090", "RTX 5090")
    assert devices["FWM: historical Prob − historical Weight"] == ("RTX 4090",)
    assert "| val (RTX 4090, RTX 5090) |" in (out / "strict.md").read_text()


def test_an_evaluation_that_records_another_forward_than_its_folder_says_is_not_used(folders, tmp_path):
    """The historical FWM Prob run's val__op-fwm-prob-k4 evaluation records that it ran the MinMax Prob
    forward: the recorded operator_used wins over the folder name, the rows that need the strict FWM
    forward are not run (the MinMax ones are computed)."""
    shutil.copytree(folders / "hist", tmp_path / "hist")
    m = json.loads((tmp_path / "hist" / "manifest.json").read_text())
    r = next(r for r in m["runs"] if r["operator"] == "fwm-prob-k4[arithmetic=historical]" and r["seed"] == 7)
    (js,) = (tmp_path / "hist" / r["run_dir"] / "eval" / "val__op-fwm-prob-k4").glob("step_*.json")
    js.write_text(json.dumps({**json.loads(js.read_text()), "operator_used": "minmax-prob-k4"}))
    build_report([tmp_path / "hist", folders / "supp"], tmp_path / "rep")
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["strict"]
    hist = {r["contrast"]: r for r in rows if r["group"] == "historical comparisons (frozen weights)"}
    for name in (
        "new Prob − historical Prob, strict forward on both",
        "historical Prob, native − strict forward",
    ):
        assert hist[f"MinMax: {name}"]["est"] is not None
        assert hist[f"FWM: {name}"]["est"] is None
        assert "no evaluation through fwm-prob-k4 [val]" in hist[f"FWM: {name}"]["why"]


def test_strict_runs_of_a_designed_suite_are_not_the_strict_table(folders, tmp_path):
    """tab:strict reads the supplementary (one-seed) strict runs only: the same runs in a designed suite
    (not supplementary) leave every row not run."""
    (tmp_path / "design.toml").write_text(SUPP.replace('name = "supplementary"', 'name = "strict-design"'))
    write_results(tmp_path / "design", tmp_path / "design.toml", effect, n_blocks=N, noise=0.004)
    build_report([folders / "hist", tmp_path / "design"], tmp_path / "rep")
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["strict"]
    assert len(rows) == 14
    assert all(r["est"] is None and "no strict-arithmetic factorial run" in r["why"] for r in rows)


def test_historical_runs_on_other_data_are_not_compared(folders, tmp_path):
    """The historical runs of another data folder (other validation blocks): the rows that need them are
    not run, the strict pairs are computed."""
    (tmp_path / "hist.toml").write_text(HIST)
    write_results(tmp_path / "hist", tmp_path / "hist.toml", effect, n_blocks=N, noise=0.004, data="other")
    build_report([tmp_path / "hist", folders / "supp"], tmp_path / "rep")
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["strict"]
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    assert all(r["est"] is not None for r in by_group["strict pairs, training evaluator"])
    for g in ("historical comparisons (frozen weights)", "background: historical runs only"):
        for r in by_group[g]:
            assert r["est"] is None and "[arithmetic=historical] run with seed 7" in r["why"], r


def test_strict_rows_cells_of_a_run_and_of_a_not_run_row_without_a_seed():
    """A not-run row with no seed shows "-" (not "None") in the Seed column; a run row its evaluator with the
    devices, Δ, CI and the terms it combines."""
    from kinterval.report.analysis import Estimate
    from kinterval.report.analysis.strict import StrictRow
    from kinterval.report.tables import strict_rows

    est = Estimate(0.0123, 0.004, 0.021, "block bootstrap", 1, (0.0123,))
    ran = StrictRow("cells", "FWM − MinMax", 1337, 4, "strict", est, terms=("+1 a [strict]", "-1 b [strict]"),
                    devices=("NVIDIA H200",))  # fmt: skip
    absent = StrictRow("cells", "Prob − Weight", None, 16, "-", None, why="no strict run")
    assert strict_rows([ran, absent])[1] == [
        ["cells", "FWM − MinMax", "4", "1337", "strict (NVIDIA H200)", "+0.0123", "[+0.0040, +0.0210]",
         "block bootstrap", "+1 a [strict]; -1 b [strict]"],
        ["cells", "Prob − Weight", "16", "-", "-", "not run", "-", "-", "no strict run"],
    ]  # fmt: skip
