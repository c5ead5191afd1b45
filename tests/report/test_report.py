"""Reports regenerated from synthetic result files: numbers, tables (Markdown + LaTeX), figures, index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_results import write_results

from kinterval.report import demo_report
from kinterval.report.build import build_report
from kinterval.report.results import data_label, load_many, load_results
from kinterval.suite.definition import load_suite
from kinterval.suite.manifest import build_manifest, write_manifest

EFFECT = {
    "softmax": 0.0,
    "lerp-k4": 0.05,
    "lerp-k16": 0.01,
    "minmax-weight-k4": 0.20,
    "minmax-prob-k4": 0.14,
    "fwm-weight-k4": 0.04,
    "fwm-prob-k4": 0.013,
    "lerp-k4[range_grad=detach]": 0.5,
}
N = 64


def _fake_suite(root, data="data"):
    """The ci manifest with per-block NLL files: softmax + EFFECT[op] * step fraction (+ seed noise)."""
    m = build_manifest(load_suite("ci"), root, root / data)
    write_manifest(root, m)
    base = np.random.default_rng(0).normal(5.0, 0.3, N)
    for r in m["runs"]:
        ev = root / r["eval_dir"]
        ev.mkdir(parents=True)
        geo = root / r["run_dir"] / "diagnostics" / "geometry"
        geo.mkdir(parents=True)
        for i, step in enumerate(r["checkpoint_steps"]):
            frac = (i + 1) / len(r["checkpoint_steps"])
            noise = np.random.default_rng([r["seed"], i]).normal(0, 0.01, N)
            nll = base + noise + EFFECT[r["operator"]] * frac + (0.002 if r["seed"] == 42 else 0.0)
            if r["operator"] == "softmax":
                nll = base + noise
            name = f"step_{step:06d}"
            np.savez(ev / f"{name}.npz", nll=nll)
            (ev / f"{name}.json").write_text(
                json.dumps(
                    {
                        "step": step,
                        "tokens": step * 512,
                        "operator_used": r["operator"],
                        "operator_override": False,
                        "data_dir": str(root / data),
                        "split": "val",
                        "T": 64,
                        "n_blocks": N,
                        "mean_nll": nll.mean(),
                    }
                )
            )
            (geo / f"{name}.json").write_text(
                json.dumps({"mean": {"span": 3.0 * frac, "h": 0.5, "tv": 0.05}})
            )
    return m


@pytest.fixture
def fake_suite(tmp_path):
    _fake_suite(tmp_path / "ci")
    return tmp_path / "ci"


def test_results_read_identity_from_manifest(fake_suite):
    res = load_results(fake_suite)
    assert len(res.points) == 45
    p = next(p for p in res.points if p.run_id == "fwm-prob-k4-s42")
    assert (p.operator, p.seed, p.spec.calibration, p.spec.surrogate, p.K) == (
        "fwm-prob-k4",
        42,
        "fwm",
        "prob",
        4,
    )
    assert (p.tokens, p.key.data) == (512 * p.step, "data:val (T=64, 64 blocks)")  # the summary's tokens
    assert data_label(("owt", "val", 1024, 48)) == "owt:val (T=1024, 48 blocks)"


def test_report_numbers(fake_suite, tmp_path):
    index = build_report(fake_suite, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    rows = {r["key"]["operator"]: r for r in data["delta"]}
    assert set(rows) == set(EFFECT) - {"softmax"}
    for op, eff in EFFECT.items():
        if op == "softmax":
            continue
        extra = 0.001 if op != "lerp-k4[range_grad=detach]" else 0.0  # mean of seeds 7 (+0) and 42 (+0.002)
        assert rows[op]["est"]["mean"] == pytest.approx(eff + extra, abs=2e-3), op
    assert rows["lerp-k4[range_grad=detach]"]["est"]["interval"] == "block bootstrap"
    assert rows["lerp-k4[range_grad=detach]"]["est"]["lo"] > 0.01
    assert rows["minmax-weight-k4"]["est"]["interval"] == "t (1 df)"
    fac = {r["contrast"]: r["est"] for r in data["factorial"]}
    assert fac["calibration"]["mean"] == pytest.approx(0.5 * (0.04 + 0.013) - 0.5 * (0.20 + 0.14), abs=2e-3)
    assert fac["surrogate"]["mean"] == pytest.approx(0.5 * (0.14 - 0.20) + 0.5 * (0.013 - 0.04), abs=2e-3)
    assert fac["interaction"]["mean"] == pytest.approx((0.013 - 0.04) - (0.14 - 0.20), abs=2e-3)
    trend = data["k_trends"][0]
    assert trend["family"] == "lerp" and trend["est"]["mean"] == pytest.approx((0.01 - 0.05) / 2, abs=2e-3)
    traj = next(v for k, v in data["trajectories"].items() if k.startswith("lerp-k4 "))
    means = [round(t["est"]["mean"], 2) for t in traj]
    assert means == [round(0.05 / 3 + 0.001, 2), round(0.1 / 3 + 0.001, 2), 0.05]
    text = index.read_text()
    for f in ("trajectories.png", "geometry.png", "detach.png", "delta.tex", "factorial.md"):
        assert f in text and (tmp_path / "rep" / f).stat().st_size > 300
    # header, softmax, and the seed-7 softmax of the one-seed detach row
    assert (tmp_path / "rep" / "delta.tex").read_text().count("\\\\") == len(rows) + 3
    assert text.splitlines()[-1] == "All numbers: [report.json](report.json)"  # index.md's last line


def test_cross_setting_table(fake_suite, tmp_path):
    """Two folders on different data: the same operators give separate rows, one column per setting."""
    other = tmp_path / "other"
    _fake_suite(other, data="data2")
    index = build_report([fake_suite, other], tmp_path / "rep").read_text()
    assert "across settings" in index and "data2:val" in index
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert len(data["delta"]) == 2 * (len(EFFECT) - 1)
    assert (tmp_path / "rep" / "cross_setting.tex").is_file()


def test_same_run_in_two_folders_is_an_error(fake_suite, tmp_path):
    other = tmp_path / "other"
    _fake_suite(other)
    with pytest.raises(ValueError, match="is in both"):
        build_report([fake_suite, other], tmp_path / "rep")


def test_demo_report(tmp_path):
    rng = np.random.default_rng(1)
    soft = rng.normal(4.0, 0.2, 40)
    res = demo_report(
        {"softmax": soft, "minmax-weight-k4": soft + 0.1, "fwm-prob-k4": soft + 0.001 * rng.normal(size=40)},
        tmp_path / "demo",
        trajectories={"softmax": [(100, 5.0), (200, 4.0)], "fwm-prob-k4": [(100, 5.1), (200, 4.02)]},
    )
    rows = {r["operator"]: r for r in res["rows"]}
    assert rows["minmax-weight-k4"]["delta"] == pytest.approx(0.1)
    assert rows["minmax-weight-k4"]["nll"] == pytest.approx(soft.mean() + 0.1)  # the condition's NLL
    assert rows["minmax-weight-k4"]["separated"] and not rows["fwm-prob-k4"]["separated"]
    assert rows["fwm-prob-k4"]["lo"] <= rows["fwm-prob-k4"]["delta"] <= rows["fwm-prob-k4"]["hi"]
    for f in ("delta.png", "delta.md", "delta.tex", "trajectories.png", "index.md"):
        assert (tmp_path / "demo" / f).is_file()
    with pytest.raises(ValueError, match="softmax"):
        demo_report({"lerp-k4": soft}, tmp_path / "x")


def test_demo_report_separated_is_a_lower_bound_above_the_margin_not_a_ci_excluding_zero(tmp_path):
    soft = np.random.default_rng(1).normal(4.0, 0.2, 40)
    res = demo_report({"softmax": soft, "lerp-k4": soft + 0.005, "lerp-k16": soft - 0.05}, tmp_path / "demo")
    rows = {r["operator"]: r for r in res["rows"]}
    assert rows["lerp-k4"]["lo"] > 0 and not rows["lerp-k4"]["separated"]
    assert rows["lerp-k16"]["hi"] < 0 and not rows["lerp-k16"]["separated"]


@pytest.mark.parametrize("damage", ["manifest", "npz", "summary"])
def test_corrupt_result_files_are_named_errors(fake_suite, tmp_path, damage, capsys):
    """A corrupt manifest.json, per-block .npz or summary .json used to end in a JSONDecodeError or
    BadZipFile traceback."""
    from kinterval.cli import main

    first = sorted(fake_suite.rglob("eval/*/step_*.npz"))[0]
    target = {"manifest": fake_suite / "manifest.json", "npz": first, "summary": first.with_suffix(".json")}
    target[damage].write_bytes(target[damage].read_bytes()[:20])
    with pytest.raises(ValueError, match=str(target[damage].name)):
        load_results(fake_suite)
    assert main(["report", str(fake_suite), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval report: error: ") and str(target[damage]) in err and "\n" not in err


def test_figures_get_the_seed_mean_geometry_and_the_endpoint_width_gap(fake_suite, tmp_path, monkeypatch):
    """geometry.png plots the seed mean of each checkpoint's geometry (seed 42's span planted at 5 frac, seed
    7's at 3 frac: mean 4 frac) and widthgap.png each condition's endpoint (h, span, ΔNLL)."""
    from kinterval.report import figures as F

    for js in fake_suite.rglob("*-s42/diagnostics/geometry/step_*.json"):
        g = json.loads(js.read_text())
        g["mean"]["span"] *= 5 / 3
        js.write_text(json.dumps(g))
    seen = {}
    monkeypatch.setattr(
        F, "geometry_figure", lambda series, path, title, c=None: seen.setdefault("geo", series)
    )
    monkeypatch.setattr(F, "widthgap_figure", lambda points, path, title: seen.setdefault("gap", points))
    build_report(fake_suite, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    delta = {r["key"]["operator"]: r["est"]["mean"] for r in data["delta"]}
    series = seen["geo"]["lerp-k4"]
    assert [t for t, _ in series] == sorted(t for t, _ in series) and len(series) == 3
    for i, (_, g) in enumerate(series):
        assert g["span"] == pytest.approx(4.0 * (i + 1) / 3) and g["h"] == pytest.approx(0.5)
    # the conditions of the rank statistics: the one-seed lerp-k4[range_grad=detach] row is not among them
    assert set(seen["gap"]) == set(delta) - {"lerp-k4[range_grad=detach]"}
    for op, (h, span, d) in seen["gap"].items():
        assert (h, span, d) == (pytest.approx(0.5), pytest.approx(4.0), pytest.approx(delta[op]))


def test_design_seeds_are_the_union_of_the_folders_plans(tmp_path):
    """A condition planned in two folders (as ``mini`` and ``mini-seeds``) has the seeds of both as its design
    (its BH family and the seeds its rows expect); the second folder here plans seeds 1007 and 1042."""
    _fake_suite(tmp_path / "a")
    _fake_suite(tmp_path / "b")
    manifest = tmp_path / "b" / "manifest.json"
    m = json.loads(manifest.read_text())
    for r in m["runs"]:
        r["seed"] += 1000
    manifest.write_text(json.dumps(m))
    points = [p for res in load_many([tmp_path / "a", tmp_path / "b"]) for p in res.points]
    assert len(points) == 90
    for p in points:
        one_seed = p.operator == "lerp-k4[range_grad=detach]"  # the ci suite runs it with seed 7 only
        assert p.design_seeds == ((7, 1007) if one_seed else (7, 42, 1007, 1042)), p.operator


def test_no_held_out_evaluations_give_no_held_out_tables(fake_suite, tmp_path):
    index = build_report(fake_suite, tmp_path / "rep").read_text()
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "heldout" not in data and "heldout_ordering" not in data
    assert not (tmp_path / "rep" / "heldout_ordering.md").exists() and "Held-out ordering" not in index


def test_delta_table_shows_the_softmax_row_and_each_nll_seed_sd(fake_suite, tmp_path):
    """tab:seedend: the softmax control's mean NLL and seed SD head the setting's rows (``softmax`` in
    report.json), and every condition shows the seed SD of its NLL."""
    build_report(fake_suite, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    last = max(p.step for p in load_results(fake_suite).points)
    means = [p.mean for p in load_results(fake_suite).points if p.operator == "softmax" and p.step == last]
    (soft,) = data["softmax"]
    assert soft["seeds"] == [7, 42] and soft["key"]["operator"] == "softmax"
    assert soft["nll"] == pytest.approx(np.mean(means)) and soft["nll_sd"] == pytest.approx(
        np.std(means, ddof=1)
    )
    lines = (tmp_path / "rep" / "delta.md").read_text().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[:5] == ["Condition", "Seed ids", "NLL", "NLL seed SD", "ΔNLL (nats/token)"]
    first = [c.strip() for c in lines[4].strip("|").split("|")]
    assert first[:5] == ["softmax", "7,42", f"{soft['nll']:.4f}", f"{soft['nll_sd']:.4f}", "-"]
    lerp = next(r for r in data["delta"] if r["key"]["operator"] == "lerp-k4")
    cells = next([c.strip() for c in x.strip("|").split("|")] for x in lines if x.startswith("| lerp-k4 |"))
    assert cells[3] == f"{lerp['nll_sd']:.4f}"


def test_delta_table_shows_the_own_seed_softmax_of_a_one_seed_row(fake_suite, tmp_path):
    """The one-seed detach row is paired with seed 7's softmax, not the mean over seeds 7 and 42: delta.md
    shows that softmax row too, so that the row's NLL minus it is its ΔNLL (the mean row alone did not add
    up)."""
    build_report(fake_suite, tmp_path / "rep")
    lines = (tmp_path / "rep" / "delta.md").read_text().splitlines()
    table = {x.split("|")[1].strip(): [c.strip() for c in x.strip("|").split("|")] for x in lines[4:] if x}
    own, detach = table["softmax, seed 7"], table["lerp-k4[range_grad=detach]"]
    assert own[1] == "7" and detach[1] == "7" and table["softmax"][1] == "7,42"
    assert float(detach[2]) - float(own[2]) == pytest.approx(float(detach[4]), abs=2e-4)
    assert "paired with the softmax row of its seed" in lines[0]


def test_the_detach_endpoints_figure_has_each_modified_run_at_its_endpoint(fake_suite, tmp_path, monkeypatch):
    """fig:detach (c, d): every modified-backward run minus its same-seed full twin at the endpoint, with its
    CI (detach.png draws them along training only)."""
    from kinterval.report import figures

    drawn = []
    real = figures.endpoint_figure
    monkeypatch.setattr(
        figures,
        "endpoint_figure",
        lambda rows, path, *a, **k: drawn.append((rows, path)) or real(rows, path, *a, **k),
    )
    index = build_report(fake_suite, tmp_path / "rep").read_text()
    ((rows, path),) = [(r, p) for r, p in drawn if p.name == "detach_endpoints.png"]
    assert (tmp_path / "rep" / path.name).stat().st_size > 300 and "detach_endpoints.png" in index
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    det = [r for r in data["detach"] if r["contrast"] == "lerp-k4[range_grad=detach] − lerp-k4"]
    last = max(det, key=lambda r: r["tokens"])
    (row,) = rows
    assert row["operator"].startswith("lerp-k4[range_grad=detach]")
    assert (row["delta"], row["lo"], row["hi"]) == pytest.approx(
        (last["est"]["mean"], last["est"]["lo"], last["est"]["hi"])
    )


def _files(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_report_that_stops_partway_leaves_the_previous_report_as_it_was(fake_suite, tmp_path, monkeypatch):
    """`kinterval report` wrote into --out one table at a time with report.json and index.md last, nothing
    cleared first: a rerun cut short left new tables beside the previous index.md and report.json (and its
    claims), a mixed report that looked complete. It is now built beside and published at the end."""
    from kinterval.report import build

    other = tmp_path / "other"
    _fake_suite(other, data="data2")
    out = tmp_path / "rep"
    build_report(fake_suite, out)
    (out / "notes.txt").write_text("the user's own file")
    first = _files(out)
    assert "delta.md" in first and not any(".building" in name for name in first)

    calls = []
    table = build._Index.table

    def cut_short(self, *args, **kwargs):  # the second build stops after its first table
        if calls:
            raise KeyboardInterrupt
        calls.append(args[0])
        return table(self, *args, **kwargs)

    monkeypatch.setattr(build._Index, "table", cut_short)
    with pytest.raises(KeyboardInterrupt):
        build_report([fake_suite, other], out)  # its delta table differs from the first build's
    assert calls == ["delta"]
    assert _files(out) == first  # byte-identical, and no temporary folder left
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []

    monkeypatch.setattr(build._Index, "table", table)
    build_report([fake_suite, other], out)
    second = _files(out)
    assert second["delta.md"] != first["delta.md"] and "cross_setting.md" in second
    assert second["notes.txt"] == b"the user's own file"
    build_report(fake_suite, out)  # the previous report's own files it does not write again go
    assert _files(out) == first


def test_a_report_killed_while_it_is_published_has_no_index(fake_suite, tmp_path, monkeypatch):
    """A kill among the renames that publish a report leaves no index.md nor report.json (they go first and
    come last); a build folder left by a kill is removed by the next build."""
    from kinterval.report import build

    other = tmp_path / "other"
    _fake_suite(other, data="data2")
    out = tmp_path / "rep"
    build_report([fake_suite, other], out)
    replace, moved = build.os.replace, []

    def killed(src, dst):
        if len(moved) == 3:
            raise KeyboardInterrupt
        moved.append(dst)
        return replace(src, dst)

    monkeypatch.setattr(build.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        build_report(fake_suite, out)
    assert len(moved) == 3 and not (out / "index.md").exists() and not (out / "report.json").exists()
    monkeypatch.setattr(build.os, "replace", replace)
    (out / build.BUILDING).mkdir()  # as a SIGKILL would leave it (the finally clause never runs)
    (out / build.BUILDING / "delta.md").write_text("stale")
    index = build_report(fake_suite, out)
    assert index == out / "index.md" and json.loads((out / "report.json").read_text())["delta"]
    assert not (out / build.BUILDING).exists()
    fresh = tmp_path / "fresh"
    build_report(fake_suite, fresh)
    assert _files(out) == _files(fresh)


def test_demo_report_is_published_index_last(tmp_path, monkeypatch):
    from kinterval.report import build

    soft = np.random.default_rng(1).normal(4.0, 0.2, 40)
    demo_report({"softmax": soft, "lerp-k4": soft + 0.1}, tmp_path / "demo")
    first = _files(tmp_path / "demo")
    monkeypatch.setattr(build.F, "endpoint_figure", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        demo_report({"softmax": soft, "lerp-k4": soft + 0.2}, tmp_path / "demo")
    assert _files(tmp_path / "demo") == first


def test_report_json_rows_carry_the_labels(fake_suite, tmp_path):
    """report.json's estimates carry the paper's labels: separated (lo > +0.01), detectable (CI excludes 0),
    within margin (CI inside ±0.01), as the tables show them."""
    build_report([fake_suite], tmp_path / "rep")
    rows = json.loads((tmp_path / "rep" / "report.json").read_text())["delta"]
    for r in rows:
        e = r["est"]
        assert e["separated"] == (e["lo"] > 0.01)
        assert e["detectable"] == (e["lo"] > 0 or e["hi"] < 0)
        assert e["within_margin"] == (-0.01 < e["lo"] and e["hi"] < 0.01)


def test_widthgap_plots_the_rows_of_the_rank_statistics(tmp_path, monkeypatch):
    """fig:widthgap shows the conditions ranks.md's Spearman uses (the setting's designed seed set), not a
    single-seed run evaluated on the same data (suite ci: lerp-k4[range_grad=detach] has seed 7 only)."""
    from kinterval.report import build as B

    geo = lambda r, f: {"span": 20.0 + len(r["operator"]), "h": 0.1 * len(r["operator"]), "tv": 0.1}  # noqa: E731
    write_results(
        tmp_path / "ci",
        "ci",
        lambda r, f: 0.0 if r["operator"] == "softmax" else 0.05,
        n_blocks=32,
        geometry=geo,
    )
    seen = {}
    monkeypatch.setattr(B.F, "widthgap_figure", lambda pts, path, title: seen.update(pts))
    build_report([tmp_path / "ci"], tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    (ranks,) = data["ranks"]
    assert sorted(seen) == sorted(ranks["conditions"]) and not any("range_grad" in c for c in seen)


def test_within_run_spearman_of_span_against_the_gap_along_training(tmp_path):
    """App. D's within-run Spearman of row span against the NLL gap over one run's checkpoints (the paper:
    about 0.9 for its 250M MinMax-Weight run), per seed: the gap grows along training (lerp-k16's shrinks);
    a span that moves with it gives +1, against it -1 (seed 42 of fwm-prob-k4 falls, seed 7 grows), a
    constant span none. The per-seed ΔNLL and span are paired by checkpoint, not by training time."""
    falls = {"lerp-k4"}

    def geo(r, f):
        if r["operator"] == "minmax-prob-k4":
            return {"span": 20.0, "h": 5.0}
        down = r["operator"] in falls or (r["operator"] == "fwm-prob-k4" and r["seed"] == 42)
        return {"span": 20.0 - 10 * f if down else 20.0 + 100 * f, "h": 1.0}

    write_results(
        tmp_path / "ci",
        "ci",
        lambda r, f: {"softmax": 0.0, "lerp-k16": 0.2 * (1.1 - f)}.get(r["operator"], 0.2 * f),
        n_blocks=32,
        noise=0.001,
        geometry=geo,
        runs=lambda r: r["operator"] != "fwm-weight-k4" or r["seed"] == 7,
    )
    build_report([tmp_path / "ci"], tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    rho = {w["key"]["operator"]: (tuple(w["seeds"]), tuple(w["rho"])) for w in data["within_run"]}
    assert rho["lerp-k4"] == rho["lerp-k16"] == ((7, 42), (-1.0, -1.0))
    assert rho["minmax-weight-k4"] == ((7, 42), (1.0, 1.0))
    assert rho["fwm-prob-k4"] == ((7, 42), (1.0, -1.0))
    assert rho["minmax-prob-k4"] == ((7, 42), (None, None))  # a constant span ranks nothing
    assert rho["fwm-weight-k4"] == ((7,), (1.0,))
    assert rho["lerp-k4[range_grad=detach]"] == ((7,), (1.0,))
    # 3 checkpoints: the exact two-sided permutation p of rho = +-1 is 2/3! = 1/3
    assert all(p in (None, 1 / 3) for w in data["within_run"] for p in w["p"])
    table = (tmp_path / "rep" / "within_run.md").read_text()
    assert "| fwm-prob-k4 | " in table and "+1.000 (0.333), -1.000 (0.333)" in table


def test_ranks_table_without_geometry_still_gives_kendall_w(tmp_path):
    """No geometry probes: no Spearman against h or span, but ranks.md still gives the seeds' ordering."""
    write_results(tmp_path / "ci", "ci", lambda r, f: EFFECT[r["operator"]] * f, n_blocks=32)
    build_report([tmp_path / "ci"], tmp_path / "rep")
    (ranks,) = json.loads((tmp_path / "rep" / "report.json").read_text())["ranks"]
    assert ranks["kendall_w"] > 0.9 and ranks["spearman_h"] is None and ranks["spearman_span"] is None
    assert "Kendall" in (tmp_path / "rep" / "ranks.md").read_text()


def _conditions(path):
    """The first cells of a Markdown table's rows."""
    return [x.split("|")[1].strip() for x in path.read_text().splitlines()[4:] if x.startswith("|")]


def test_tables_order_conditions_as_the_paper(tmp_path):
    """One order everywhere (tab:seedend): softmax, baselines, LERP, MinMax–Weight, MinMax–Prob, FWM–Weight,
    FWM–Prob, then the runs with overrides; K ascending numerically (lerp-k4 before lerp-k16)."""
    from kinterval.report.analysis import operator_order

    geo = lambda r, f: {"span": 20.0, "h": 0.5, "tv": 0.1}  # noqa: E731
    eff = lambda r, f: 0.0 if r["operator"] == "softmax" else 0.05  # noqa: E731
    write_results(tmp_path / "ci", "ci", eff, n_blocks=32, geometry=geo, clip=lambda r: 0.01)
    write_results(tmp_path / "B", "B", eff, n_blocks=32, data="fwe")
    build_report([tmp_path / "ci", tmp_path / "B"], tmp_path / "rep")
    want = ["softmax", "lerp-k4", "lerp-k16", "minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4"]
    assert sorted(want[::-1], key=operator_order) == want
    # every family of the catalog has its place (LERP's FWM / resolved calibrations after LERP), none unknown
    fams = ["lerp-k4", "fwm-lerp-k4", "resolved-lerp-k4", "minmax-weight-k4", "resolved-prob-k4", "zeta-k4"]
    assert sorted(fams[::-1], key=operator_order) == fams
    for name in ("geometry.md", "clip.md", "cross_setting.md", "delta.md"):
        got = _conditions(tmp_path / "rep" / name)
        assert "lerp-k4" in got and "lerp-k16" in got, name
        assert got.index("lerp-k4") < got.index("lerp-k16"), name
        got = got[: got.index("softmax", 1)] if got.count("softmax") > 1 else got  # delta.md: one setting
        plain = [c.partition(", seed ")[0] for c in got if "[" not in c]  # a one-seed twin: by its condition
        assert plain == sorted(plain, key=operator_order), (name, plain)


def test_the_cross_table_has_tab_crossfulls_rows(fake_suite, tmp_path):
    """cross_setting.md held the condition − softmax rows only, so tab:cross (the factorial contrasts by
    suite) had to be put together by hand from factorial.md; it now holds both, as tab:crossfull, and
    docs/measurement.md says so."""
    other = tmp_path / "other"
    _fake_suite(other, data="data2")
    build_report([fake_suite, other], tmp_path / "rep")
    cross = (tmp_path / "rep" / "cross_setting.md").read_text()
    for row in (
        "| lerp-k4 |",
        "| interaction (FWM_P − FWM_W) − (MM_P − MM_W), K4 |",
        "| Prob − Weight under FWM, K4 |",
    ):
        assert row in cross, row
    doc = (Path(__file__).resolve().parents[2] / "docs" / "measurement.md").read_text()
    where = doc[doc.index("(`cross_setting.md`") :][:900]
    assert "the factorial contrasts" in where


def test_reproduce_doc_lists_the_substitution_audits_as_report_results():
    """tab:strictaudit and tab:rounding are results (a frozen checkpoint's native evaluation minus that
    under another arithmetic: `heldout.md`'s "native − substituted forward" rows), not descriptions."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reproduce.md").read_text()
    report, rest = doc.split("## From `kinterval report`")[1].split("## Not from result files")
    row = next(x for x in report.splitlines() if x.startswith("| `tab:strictaudit`"))
    assert "`tab:rounding`" in row and "heldout.md" in row and "native − substituted forward" in row
    assert "tab:strictaudit" not in rest and "tab:rounding" not in rest


def test_a_folder_whose_manifest_records_no_code_is_reported(tmp_path):
    """A manifest without ``code`` (written before kinterval recorded it; ``suite run`` and the gate accept
    one): report.json gives its code as null and the report is built, not a TypeError."""
    write_results(tmp_path / "b", "ci", lambda r, f: EFFECT.get(r["operator"], 0.0) * f)
    manifest = tmp_path / "b" / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["code"]
    manifest.write_text(json.dumps(m))
    index = build_report([tmp_path / "b"], tmp_path / "rep").read_text()
    folders = json.loads((tmp_path / "rep" / "report.json").read_text())["folders"]
    assert [f["code"] for f in folders] == [None] and "different operator code" not in index


def test_a_suite_with_an_sdpa_run_reports_it_as_a_reference(tmp_path):
    """sdpa is exact softmax: a row without a Δ of its own, never a K panel's condition (the panels' control
    test parsed 'sdpa' as an operator name and stopped the whole report)."""
    (tmp_path / "s.toml").write_text(
        'name="sd"\nprotocol="tiny-cpu"\nseeds=[7]\ncheckpoints=2\n'
        '[overrides]\n"model.n_layer"=1\n"model.n_head"=1\n"model.n_embd"=32\n"model.block_size"=64\n'
        '"schedule.tokens"=24_576\n"schedule.warmup_tokens"=2_048\n"schedule.micro_batch"=8\n'
        '[[group]]\noperators=["softmax", "sdpa", "lerp-k4", "minmax-weight-k4"]\n'
    )
    effect = {"lerp-k4": 0.05, "minmax-weight-k4": 0.2}
    write_results(tmp_path / "sd", tmp_path / "s.toml", lambda r, f: effect.get(r["operator"], 0.0) * f)
    build_report(tmp_path / "sd", tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert sorted(r["key"]["operator"] for r in data["softmax"]) == ["sdpa", "softmax"]  # the references
    rows = {r["key"]["operator"]: r for r in data["delta"]}
    assert sorted(rows) == ["lerp-k4", "minmax-weight-k4"]  # each vs the same-seed softmax
    assert rows["lerp-k4"]["est"]["mean"] == pytest.approx(0.05, abs=5e-3)
    assert rows["minmax-weight-k4"]["est"]["mean"] == pytest.approx(0.2, abs=5e-3)


def test_report_figures_share_one_colour_map(fake_suite, tmp_path, monkeypatch):
    """build_report passes one colour map to trajectories.png, geometry.png and detach.png, holding every
    line's label: a condition drawn in two of them is drawn in one colour."""
    from kinterval.report import figures as F

    seen = {}
    monkeypatch.setattr(
        F,
        "trajectory_figure",
        lambda s, path, title, colours=None, **kw: seen.setdefault(path.name, (s, colours)),
    )
    monkeypatch.setattr(
        F, "geometry_figure", lambda s, path, title, colours=None: seen.setdefault(path.name, (s, colours))
    )
    build_report(fake_suite, tmp_path / "rep")
    assert {"trajectories.png", "geometry.png", "detach.png"} <= set(seen)
    maps = [c for _, c in seen.values()]
    assert all(c is maps[0] for c in maps)
    for series, colours in seen.values():
        assert set(series) <= set(colours)
    shared = set(seen["trajectories.png"][0]) & set(seen["geometry.png"][0])
    assert shared and "softmax" in seen["geometry.png"][0] and "softmax" not in seen["trajectories.png"][0]


def test_index_names_the_runs_a_folder_lacks():
    """A suite run in sittings: "N of M runs; not run: ..." with M the manifest's count."""
    from types import SimpleNamespace

    from kinterval.report.build import _run_count

    runs = [{"run_id": r} for r in ("softmax-s7", "lerp-k4-s7", "lerp-k4-s42")]
    folder = SimpleNamespace(manifest={"runs": runs}, runs=lambda: {"softmax-s7": None})
    assert _run_count(folder) == "1 of 3 runs; not run: lerp-k4-s7, lerp-k4-s42"


def test_index_run_count_of_a_whole_folder_is_singular_for_one_run():
    from types import SimpleNamespace

    from kinterval.report.build import _run_count

    def folder(*ids):
        runs = [{"run_id": r} for r in ids]
        return SimpleNamespace(manifest={"runs": runs}, runs=lambda: dict.fromkeys(ids))

    assert _run_count(folder("softmax-s7")) == "1 run"
    assert _run_count(folder("softmax-s7", "lerp-k4-s7")) == "2 runs"
