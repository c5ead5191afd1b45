"""``kinterval report --downstream``: tab:stagec, fig:heat and fig:downstream from the rows of
``kinterval downstream-compare --json`` (no command drew the two figures the docs named)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.report.downstream import downstream_report, grid, nll_of, read_rows

N = 200
TASKS = {
    "piqa": ("acc", "acc_norm"),
    "lambada_openai": ("acc",),
    "blimp_anaphor": ("acc",),
    "blimp_island": ("acc",),
    "arc_easy": ("acc",),
}  # fmt: skip  (arc_easy lacks acc_norm, its primary)
DROP = {"base": 0.0, "worst": 0.3, "same": 0.0, "mild": 0.06}  # fraction of correct items turned wrong


def _items(root):
    rng = np.random.default_rng(3)
    for name, drop in DROP.items():
        (root / name).mkdir()
        for t, metrics in TASKS.items():
            ok = (np.random.default_rng(len(t)).random(N) < 0.7).astype(int)
            ok[rng.random(N) < drop] = 0
            with open(root / name / f"{t}.jsonl", "w") as f:
                for i, x in enumerate(ok):
                    f.write(
                        json.dumps({"doc_id": i, "target": "0", "metrics": dict.fromkeys(metrics, int(x))})
                    )
                    f.write("\n")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    _items(root)
    conds = [f"{c}={root / c}" for c in DROP if c != "base"]
    groups = ["--group", "large=worst", "--group", "near=same,mild"]
    assert (
        main(["downstream-compare", str(root / "base"), *conds, *groups, "--json", str(root / "c.json")]) == 0
    )
    return root


def _report_json(path, deltas: dict[str, float], model="6L"):
    rows = [{"contrast": f"{op} − softmax", "key": {"operator": op, "model": model}, "tokens": 100,
             "est": {"mean": d}} for op, d in deltas.items()]  # fmt: skip
    path.write_text(json.dumps({"delta": rows}))
    return path


def test_the_table_is_pp_on_each_tasks_primary_metric_starred_by_q(compared, tmp_path, capsys):
    rows = json.loads((compared / "c.json").read_text())
    nll = _report_json(tmp_path / "report.json", {"mild": 0.02, "worst": 0.9, "same": 0.001})
    out = tmp_path / "rep"
    assert (
        main(["report", "--downstream", str(compared / "c.json"), "--nll-from", str(nll), "--out", str(out)])
        == 0
    )
    assert "report written" in capsys.readouterr().out
    lines = (out / "stagec.md").read_text().splitlines()
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    assert head == ["group", "condition", "ΔNLL", "lambada_openai", "piqa", "blimp"]  # arc_easy: no acc_norm
    cells = [[x.strip() for x in c.strip("|").split("|")] for c in lines[4:]]
    body = {c[1]: c for c in cells}
    assert list(body)[1:] == ["worst", "mild", "same"]  # ΔNLL order, the largest gap first (tab:stagec)
    assert [body[c][0] for c in ("same", "mild", "worst")] == ["near", "near", "large"]
    for cond in ("same", "mild", "worst"):
        for j, task in enumerate(head[3:], start=3):
            want = "acc_norm" if task == "piqa" else "acc"
            (r,) = [r for r in rows if (r["task"], r["metric"], r["condition"]) == (task, want, cond)]
            mark = "*" if r["q"] < 0.05 else "°" if r["lo"] > 0 or r["hi"] < 0 else ""  # the paper's symbols
            assert body[cond][j] == f"{100 * r['diff']:+.1f}{mark}", (cond, task)
    assert body["worst"][2] == "+0.900" and "*" in body["worst"][3] and body["same"][3] == "+0.0"
    base = {r["task"]: r["baseline"] for r in rows}
    assert body["softmax (accuracy, %)"][3:] == [f"{100 * base[t]:.1f}" for t in head[3:]]
    index = (out / "index.md").read_text()
    assert "Not shown (no primary-metric row): arc_easy." in index
    assert "![fig:heat](heat.png)" in index and "![fig:downstream](downstream.png)" in index
    assert (out / "heat.png").stat().st_size > 0 and (out / "downstream.png").stat().st_size > 0
    assert "\\begin{tabular}" in (out / "stagec.tex").read_text()
    data = json.loads((out / "report.json").read_text())
    assert data["dnll"] == {"same": 0.001, "mild": 0.02, "worst": 0.9}


def test_without_blimp_or_lambada_the_interval_figure_is_not_drawn_and_says_why(compared, tmp_path):
    rows = [r for r in json.loads((compared / "c.json").read_text()) if r["task"] == "piqa"]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    index = downstream_report([tmp_path / "p.json"], tmp_path / "rep")
    assert (
        "fig:downstream not drawn" in index.read_text() and not (tmp_path / "rep" / "downstream.png").exists()
    )
    g = grid(rows)
    assert g["conditions"] == ["worst", "same", "mild"] and g["groups"]["mild"] == "near"  # file order


def test_bad_files_are_refused_naming_the_file(compared, tmp_path, capsys):
    rows = json.loads((compared / "c.json").read_text())
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "obj.json").write_text(json.dumps({"delta": []}))
    (tmp_path / "short.json").write_text(json.dumps([{k: v for k, v in rows[0].items() if k != "q"}]))
    (tmp_path / "nan.json").write_text(json.dumps([{**rows[0], "diff": None}]))
    for name, said in (("text.json", "not JSON"), ("obj.json", "not the rows"), ("short.json", "has no q"),
                       ("nan.json", "diff None"), ("none.json", "cannot read it")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            read_rows([tmp_path / name])
    with pytest.raises(ValueError, match="is also in"):
        read_rows([compared / "c.json", compared / "c.json"])
    assert main(["report", "--downstream", str(tmp_path / "obj.json"), "--out", str(tmp_path / "r")]) == 2
    assert "obj.json: not the rows" in capsys.readouterr().err
    assert main(["report", "--nll-from", "x", "--out", str(tmp_path / "r")]) == 2
    assert main(["report", "d", "--downstream", str(compared / "c.json")]) == 2


def test_nll_from_takes_the_largest_budget_and_refuses_two_models(tmp_path):
    rows = [{"contrast": "a − softmax", "key": {"operator": "a", "model": "m"}, "tokens": t,
             "est": {"mean": d}} for t, d in ((50, 0.5), (100, 0.1))]  # fmt: skip
    rows.append(
        {
            "contrast": "a − a[full]",
            "key": {"operator": "a", "model": "m"},
            "tokens": 200,
            "est": {"mean": 9.0},
        }
    )  # fmt: skip  (a contrast with another control: not ΔNLL vs softmax)
    (tmp_path / "report.json").write_text(json.dumps({"delta": rows}))
    assert nll_of(tmp_path) == {"a": 0.1}
    rows.append({"contrast": "a − softmax", "key": {"operator": "a", "model": "n"}, "tokens": 100,
                 "est": {"mean": 0.2}})  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps({"delta": rows}))
    with pytest.raises(ValueError, match="several models or data"):
        nll_of(tmp_path)
    with pytest.raises(ValueError, match="not a `kinterval report`"):
        nll_of(tmp_path / "none")


def test_a_cell_carries_the_papers_marks():
    """tab:stagec: * BH q < 0.05, ° a CI that excludes 0 with q >= 0.05 (the report printed * only)."""
    from kinterval.report.downstream import cell_text

    row = {"diff": -0.0133, "q": 0.186, "lo": -0.0267, "hi": -0.0033}
    assert cell_text({**row, "mark": "°"}) == "-1.3°" and cell_text({**row, "mark": ""}) == "-1.3"
    assert cell_text({**row, "q": 0.01}) == "-1.3*" and cell_text(None) == "–"


def test_heat_panels_may_share_and_leave_out_conditions_as_the_papers_do(compared, tmp_path, capsys):
    """fig:heat's panels are (a) the matched K=4 conditions and (b) the near-baseline group: a subset of the
    conditions each, which may overlap; by default one panel per --group."""
    c = str(compared / "c.json")
    assert main(["report", "--downstream", c, "--out", str(tmp_path / "d")]) == 0
    data = json.loads((tmp_path / "d" / "report.json").read_text())
    assert data["heat_panels"] == {"large": ["worst"], "near": ["same", "mild"]}
    panels = ["--heat-panel", "matched K=4=mild,worst", "--heat-panel", "near=mild, same"]
    assert main(["report", "--downstream", c, *panels, "--out", str(tmp_path / "p")]) == 0
    data = json.loads((tmp_path / "p" / "report.json").read_text())
    assert data["heat_panels"] == {"matched K=4": ["worst", "mild"], "near": ["same", "mild"]}  # table order
    assert (tmp_path / "p" / "heat.png").stat().st_size > 0
    capsys.readouterr()
    for bad, said in ((["near=same,gone"], "gone not among the compared conditions"),
                      (["near"], "expected LABEL=CONDITION"), (["near="], "expected LABEL=CONDITION"),
                      (["=same"], "expected LABEL=CONDITION"),
                      (["a=same", "a=mild"], "'a' is given twice")):  # fmt: skip
        args = [x for b in bad for x in ("--heat-panel", b)]
        assert main(["report", "--downstream", c, *args, "--out", str(tmp_path / "bad")]) == 2
        assert said in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    assert main(["report", str(tmp_path), "--heat-panel", "a=same"]) == 2
    assert "--heat-panel are for --downstream" in capsys.readouterr().err
    run = tmp_path / "run"  # a training run's folder: the report's files would mix with its own
    (run / "checkpoints").mkdir(parents=True)
    (run / "run_config.json").write_text("{}")
    assert main(["report", "--downstream", c, "--out", str(run)]) == 2
    assert "is a kinterval run folder" in capsys.readouterr().err and sorted(run.iterdir()) == [
        run / "checkpoints",
        run / "run_config.json",
    ]
    for flags in (["--heat-panel", "a=same"], ["--nll-from", "x"], ["--downstream", c]):  # were dropped
        assert main(["report", "--runs", str(tmp_path), *flags]) == 2
        assert "--runs takes no --downstream, --nll-from or --heat-panel" in capsys.readouterr().err
