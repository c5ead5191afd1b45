"""tab:hardware and tab:dstack (``hardware.md``, ``stack.md``): the training stack each run's
``environment.jsonl`` records, the evaluation devices, the training hours, and operator family by stack.
Planted files on the synthetic ci results: no training."""

from __future__ import annotations

import json

import pytest
from synthetic_results import write_results

from kinterval.environment import ENVIRONMENT_FILE
from kinterval.report import analysis as A
from kinterval.report import tables as T
from kinterval.report.build import build_report
from kinterval.report.results import load_many

H200 = {"device": "cuda", "device_name": "NVIDIA H200", "processes": 1, "torch": "2.5.1", "cuda": "12.4",
        "triton": "3.1.0", "python": "3.11.7", "host": "node1"}  # fmt: skip


def session(step=0, **changes):
    return {"step": step, "time": "2025-01-01T00:00:00+00:00", **H200, **changes}


def plant(root, m, *, train_s=1800.0):
    """Every run: one session on H200, 1800 s of training, world size 1; evaluations on an H200."""
    for r in m["runs"]:
        run = root / r["run_dir"]
        (run / ENVIRONMENT_FILE).write_text(json.dumps(session()) + "\n")
        steps = r["checkpoint_steps"]
        status = {"status": "completed", "step": steps[-1], "steps": steps[-1], "train_s": train_s}
        (run / "status.json").write_text(json.dumps(status))
        (run / "run_config.json").write_text(json.dumps({"world_size": 1}))
        for js in run.glob("eval/*/step_*.json"):
            js.write_text(json.dumps({**json.loads(js.read_text()), "device_name": "NVIDIA H200"}))


@pytest.fixture
def ci(tmp_path):
    root = tmp_path / "ci"
    m = write_results(root, "ci", lambda r, frac: 0.01 * frac * (r["operator"] != "softmax"))
    return root, m


def rows_by_group(hw):
    return {row.group: row for row in hw.rows}


def table(path):
    """A Markdown table's rows (header row first), cells stripped."""
    lines = [x for x in path.read_text().splitlines() if x.startswith("|") and not x.startswith("|---")]
    return [[c.strip() for c in x.strip("|").split("|")] for x in lines]


def test_recorded_runs_give_one_stack_its_counts_and_the_train_hours(ci, tmp_path):
    root, m = ci
    plant(root, m)
    build_report(root, tmp_path / "rep")
    rows = {r[1]: r for r in table(tmp_path / "rep" / "hardware.md")}
    assert rows["Group"][2:] == ["Runs", "Training stack", "Evaluation device(s)", "Train hours"]
    assert rows["softmax"] == ["ci", "softmax", "2", "S1 (2 runs)", "NVIDIA H200", "1"]  # 2 x 1800 s
    assert rows["factorial"] == ["ci", "factorial", "8", "S1 (8 runs)", "NVIDIA H200", "4"]
    assert rows["detach"][2:4] == ["1", "S1 (1 run)"]
    caption = (tmp_path / "rep" / "hardware.md").read_text().splitlines()[0]
    assert "S1: NVIDIA H200 ×1 process, torch 2.5.1, CUDA 12.4, Python 3.11.7" in caption
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["hardware"]["stacks"] == {"S1": {f: H200[f] for f in A.STACK_FIELDS}}
    assert set(data["hardware"]["runs"].values()) == {"S1"} and len(data["hardware"]["runs"]) == 15
    stack = table(tmp_path / "rep" / "stack.md")
    assert stack[0] == ["Family", "S1", "Total"]
    assert stack[1] == ["softmax", "2", "2"] and stack[-1] == ["Total", "15", "15"]
    assert ["minmax-weight", "2", "2"] in stack and ["lerp[range_grad=detach]", "1", "1"] in stack
    assert "### Training and evaluation hardware" in (tmp_path / "rep" / "index.md").read_text()


def test_a_run_without_records_is_not_recorded_and_its_hours_come_from_what_is_there(ci):
    root, m = ci
    plant(root, m)
    softmax = [root / r["run_dir"] for r in m["runs"] if r["group"] == "softmax"]
    (softmax[0] / ENVIRONMENT_FILE).unlink()
    (softmax[0] / "run_config.json").write_text(json.dumps({"world_size": 4}))  # 4 processes x 1800 s
    lerp = [root / r["run_dir"] for r in m["runs"] if r["group"] == "lerp"]
    (lerp[0] / "status.json").write_text(json.dumps({"status": "completed", "step": 1, "steps": 1}))
    for js in softmax[1].glob("eval/*/step_*.json"):  # an evaluation that records no device model
        summary = json.loads(js.read_text())
        del summary["device_name"]
        js.write_text(json.dumps(summary))
    rows = rows_by_group(A.hardware(load_many([root])))
    assert rows["softmax"].stacks == {"not recorded": 1, "S1": 1}
    assert rows["softmax"].train_hours == pytest.approx(2.5)  # 4 x 0.5 h + 1 x 0.5 h
    assert rows["softmax"].eval_devices == ["NVIDIA H200", "not recorded"]
    _, cells = T.hardware_rows(A.hardware(load_many([root])))
    by_group = {c[1]: c for c in cells}
    assert by_group["softmax"][3] == "not recorded (1 run); S1 (1 run)"
    assert by_group["lerp"][5] == "1.5 (3 of 4 runs)"


def test_no_records_at_all_give_not_recorded_and_no_stack_table(ci, tmp_path):
    root, m = ci
    build_report(root, tmp_path / "rep")
    rows = {r[1]: r for r in table(tmp_path / "rep" / "hardware.md")}
    assert rows["softmax"][2:] == ["2", "not recorded (2 runs)", "not recorded", "—"]
    assert not (tmp_path / "rep" / "stack.md").exists()
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "stack" not in data and data["hardware"]["stacks"] == {}


def test_a_second_stack_is_numbered_by_first_appearance_and_counted_by_family(ci):
    root, m = ci
    plant(root, m)
    runs = {r["run_id"]: r for r in m["runs"]}
    mw = next(rid for rid, r in runs.items() if r["operator"] == "minmax-weight-k4")
    (root / runs[mw]["run_dir"] / ENVIRONMENT_FILE).write_text(
        json.dumps(session(device_name="NVIDIA A100-SXM4-80GB")) + "\n"
    )
    fp = next(rid for rid, r in runs.items() if r["operator"] == "fwm-prob-k4")
    both = [session(0), session(10, device_name="NVIDIA A100-SXM4-80GB", cuda="12.1")]
    (root / runs[fp]["run_dir"] / ENVIRONMENT_FILE).write_text("".join(json.dumps(s) + "\n" for s in both))
    hw = A.hardware(load_many([root]))
    assert list(hw.stacks) == ["S1", "S2", "S3"]
    assert hw.stacks["S2"]["device_name"] == "NVIDIA A100-SXM4-80GB" and hw.stacks["S3"]["cuda"] == "12.1"
    assert hw.run_stacks[f"ci/{mw}"] == "S2" and hw.run_stacks[f"ci/{fp}"] == "S1+S3"
    assert rows_by_group(hw)["factorial"].stacks == {"S2": 1, "S1": 6, "S1+S3": 1}
    headers, cells = T.stack_rows(hw)
    assert headers == ["Family", "S1", "S2", "S1+S3", "Total"]
    by_family = {c[0]: c[1:] for c in cells}
    assert by_family["minmax-weight"] == ["1", "1", "0", "2"]
    assert by_family["fwm-prob"] == ["1", "0", "1", "2"]
    assert by_family["Total"] == ["13", "1", "1", "15"]


def test_a_run_resumed_on_another_process_count_counts_each_session_at_its_own(ci):
    root, m = ci
    plant(root, m)  # every run: 1800 s on one process
    lerp = next(r for r in m["runs"] if r["group"] == "lerp")

    def seconds(sessions):
        (root / lerp["run_dir"] / ENVIRONMENT_FILE).write_text(
            "".join(json.dumps(s) + "\n" for s in sessions)
        )
        (res,) = load_many([root])
        return A.process_seconds(res.records[lerp["run_id"]]), rows_by_group(A.hardware([res]))["lerp"]

    # 600 s on one process, then 1200 s on four
    total, row = seconds([session(0, train_s=0.0), session(10, train_s=600.0, processes=4)])
    assert total == pytest.approx(600 + 1200 * 4)
    assert row.train_hours == pytest.approx(1.5 + (len(row.runs) - 1) * 0.5)
    # lines written before train_s was recorded, or times that do not add up: the first session's count
    assert seconds([session(0), session(10, processes=4)])[0] == pytest.approx(1800)
    assert seconds([session(0, train_s=0.0), session(10, train_s=2000.0, processes=4)])[0] == pytest.approx(
        1800
    )
    assert seconds([session(0, processes=2, train_s=5.0)])[0] == pytest.approx(3600)


# --- A.hardware on hand-made records: folders, stacks and devices the ci results do not have ---


def _rec(run_id, group="g", operator="lerp-k4", sessions=(), train_s=None, world_size=1):
    from types import SimpleNamespace

    return SimpleNamespace(run_id=run_id, group=group, operator=operator, sessions=list(sessions),
                           train_s=train_s, world_size=world_size)  # fmt: skip


def _res(suite, records, devices=()):
    """A folder: its records, and (run_id, device_name) per evaluation."""
    from types import SimpleNamespace

    points = [SimpleNamespace(run_id=r, device_name=d) for r, d in devices]
    return SimpleNamespace(suite=suite, records={r.run_id: r for r in records}, points=points)


def test_stacks_beyond_nine_folders_and_devices_are_kept_apart_and_in_order():
    """S10 sorts after S2 in a run's label; two folders with a group of the same name are two rows; the
    evaluation devices are sorted whatever order they were seen in; a field a session lacks is "not
    recorded"; "not recorded" is the last column even when seen first."""
    many = [_rec(f"r{i}", sessions=[session(device_name=f"GPU {i}")]) for i in range(9)]
    both = _rec("both", sessions=[session(device_name="GPU 1"), session(10, device_name="GPU X")])
    bare = _rec("bare", sessions=[{k: v for k, v in session().items() if k != "cuda"}])
    first = _res("a", [_rec("none"), *many], devices=[("r0", "NVIDIA H200"), ("r1", "NVIDIA A100")])
    hw = A.hardware([first, _res("b", [both, bare])])
    assert hw.run_stacks["b/both"] == "S2+S10"
    assert hw.stacks["S11"]["cuda"] == "not recorded" and hw.stacks["S11"]["torch"] == H200["torch"]
    assert [(row.suite, row.group, len(row.runs)) for row in hw.rows] == [("a", "g", 10), ("b", "g", 2)]
    assert hw.rows[0].eval_devices == ["NVIDIA A100", "NVIDIA H200"]
    assert hw.columns()[0] == "S1" and hw.columns()[-1] == "not recorded"


def test_a_first_session_that_trained_no_time_counts_nothing_and_the_rest_at_their_own_count():
    """A session killed before its first step (train_s equal to the next one's): a share of 0 s, not
    "times that do not add up"."""
    rec = _rec("r", sessions=[session(0, train_s=0.0), session(0, train_s=0.0, processes=4)], train_s=1800.0)
    assert A.process_seconds(rec) == pytest.approx(1800 * 4)
