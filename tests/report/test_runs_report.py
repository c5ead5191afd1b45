"""``kinterval report --runs RUN ...``: endpoint ΔNLL of runs of `kinterval train` against the softmax run
among them, from their own evaluations, without a suite."""

from __future__ import annotations

import json
import shutil

import pytest
from synthetic_results import write_probes

from kinterval.cli import main

pytestmark = pytest.mark.xdist_group("runs_report")  # the runs are trained once per module


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_config):
    """softmax, lerp-k4 (seed 0) and fwm-prob-k4 (seed 5), two checkpoints each, evaluated on val."""
    import torch

    from kinterval.train.loop import train

    root = tmp_path_factory.mktemp("runs_report")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models run fastest on one thread
    try:
        for name, op, seed in (("soft", "softmax", 0), ("lerp", "lerp-k4", 0), ("fwm", "fwm-prob-k4", 5)):
            train(shared_config(**{"checkpoint.count": 2, "operator.name": op, "seed": seed}), root / name)
            assert main(["eval", "--run", str(root / name), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return root


def test_each_run_against_the_softmax_run_with_its_seed_and_a_note(runs, capsys):
    from kinterval.eval.evaluate import eval_dir, load_result
    from kinterval.stats.format import num

    out = runs / "rep"
    argv = ["report", "--runs", *(str(runs / n) for n in ("lerp", "soft", "fwm")), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "note: fwm-prob-k4 ran seed 5, the control seed 0: its Δ holds seed variation too" in printed
    nll = {
        n: load_result(sorted(eval_dir(runs / n).glob("step_*.json"))[-1])[1]["nll"] for n in ("soft", "lerp")
    }
    delta = float((nll["lerp"] - nll["soft"]).mean())
    # delta is of order 1e-08 here: printed in two significant digits (it read "-0.0000")
    assert f"lerp-k4                  NLL {nll['lerp'].mean():.4f}  ΔNLL vs softmax {num(delta)}" in printed
    table = (out / "delta.md").read_text()
    assert "| fwm-prob-k4 | 5 |" in table and "| lerp-k4 | 0 |" in table
    index = (out / "index.md").read_text()
    assert "control softmax" in index and "- fwm-prob-k4 ran seed 5" in index
    assert (out / "delta.png").is_file() and (out / "trajectories.png").is_file()  # two checkpoints each


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "lerp", "fwm"], "exactly one softmax (or sdpa) run as the control; found none"),
        (["--runs", "soft", "lerp", "--split", "test"], "has no evaluation on test; run `kinterval eval"),
        # an evaluation tag: the command to run gives --operator and --data, not the tag as --split (which
        # eval refuses: unknown split)
        (
            ["--runs", "soft", "lerp", "--split", "val__op-softmax"],
            "--checkpoint latest --split val --operator softmax`",
        ),
        (
            ["--runs", "soft", "lerp", "--split", "test__ptb"],
            "--split test --data DIR/ptb` (DIR/ptb: the data",
        ),
        (["--runs", "soft", "lerp", "lerp"], "lerp is given twice (as lerp and lerp)"),
        (["--runs", "soft", "./soft", "lerp"], "soft is given twice (as soft and ./soft)"),
        (["soft", "--runs", "lerp"], "--runs takes run folders instead of suite folders"),
        (["soft", "--split", "val"], "--split is for --runs"),
        ([], "give suite folder(s), or --runs RUN"),
        (["--runs", "soft", "lerp", "--out", "soft/report"], "the report's files would mix with the run's"),
    ],
)
def test_what_cannot_be_compared_is_one_error_line(runs, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(runs)
    out = [] if "--out" in argv else ["--out", str(runs / "bad")]
    assert main(["report", *argv, *out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval report: error: ") and message in err and "\n" not in err, err
    assert not (runs / "bad").exists() and not (runs / "soft" / "report").exists()


def test_runs_evaluated_on_other_blocks_are_refused(runs, capsys):
    """A capped evaluation (other blocks) is no paired comparison with a full one."""
    assert main(["eval", "--run", str(runs / "lerp"), "--max-blocks", "3", "--force", "--quiet"]) == 0
    try:
        assert (
            main(["report", "--runs", str(runs / "soft"), str(runs / "lerp"), "--out", str(runs / "x")]) == 2
        )
        assert "max_blocks: 3 vs None" in capsys.readouterr().err
    finally:  # the full evaluation back, for the other tests
        assert main(["eval", "--run", str(runs / "lerp"), "--force", "--quiet"]) == 0
    summary = json.loads(sorted((runs / "lerp" / "eval" / "val").glob("step_*.json"))[-1].read_text())
    assert summary["all_blocks"]


def test_a_run_of_other_data_protocol_or_length_is_compared_with_a_note_for_each(runs, capsys):
    """What besides the operator differs from the control (the training data, a protocol field, the tokens
    of the latest checkpoint) is named in a note, as the seed is: the Δ holds it too."""
    import shutil

    other = runs / "other"
    shutil.copytree(runs / "lerp", other)
    path = sorted((other / "eval" / "val").glob("step_*.json"))[-1]
    s = json.loads(path.read_text())
    s["train_data"] = dict(s["train_data"], shards_sha256=["f" * 64])  # trained on another corpus
    s["train_config"]["optim"]["lr"] = 0.5
    s["tokens"] += s["tokens"] // s["step"]  # one optimizer step more
    s["step"] += 1
    path.write_text(json.dumps(s))
    batch = runs / "half_the_steps"  # the same tokens in half the optimizer steps: twice the batch
    shutil.copytree(runs / "lerp", batch)
    path = sorted((batch / "eval" / "val").glob("step_*.json"))[-1]
    s = json.loads(path.read_text())
    assert s["step"] % 2 == 0
    s["step"] //= 2
    path.write_text(json.dumps(s))
    out = runs / "rep_other"
    assert main(["report", "--runs", str(runs / "soft"), str(other), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: lerp-k4 trained on other data (train data#" in printed
    assert "lerp-k4 trained under another protocol (optim.lr=0.5 (control " in printed
    assert "tokens, the control's" in printed and "seed" not in printed.split("note:", 1)[1]
    index = (out / "index.md").read_text()
    assert index.count("its Δ holds") == 3
    assert main(["report", "--runs", str(runs / "soft"), str(batch), "--out", str(runs / "rep_batch")]) == 0
    printed = capsys.readouterr().out
    assert "note: lerp-k4 trained with another batch (" in printed and printed.count("note:") == 1, printed
    assert main(["report", "--runs", str(runs / "soft"), str(runs / "lerp"), "--out", str(out)]) == 0
    assert "note:" not in capsys.readouterr().out  # the same data, protocol, seed and length: no note


def test_the_protocol_note_names_every_differing_field(runs, capsys):
    """The note was cut at four fields without saying so: model.rope_theta and schedule.warmup_tokens were
    dropped."""
    other = runs / "six_fields"
    shutil.copytree(runs / "lerp", other)
    path = sorted((other / "eval" / "val").glob("step_*.json"))[-1]
    s = json.loads(path.read_text())
    config = s["train_config"]
    changed = {("optim", "lr"): 0.5, ("optim", "weight_decay"): 0.5, ("optim", "beta1"): 0.5,
               ("optim", "beta2"): 0.5, ("model", "rope_theta"): 500.0,
               ("schedule", "warmup_tokens"): 7}  # fmt: skip
    for (section, key), value in changed.items():
        config[section][key] = value
    path.write_text(json.dumps(s))
    assert main(["report", "--runs", str(runs / "soft"), str(other), "--out", str(runs / "rep_six")]) == 0
    (note,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert all(f"{section}.{key}=" in note for section, key in changed), note


def test_no_note_for_an_unrecorded_training_data_or_another_execution_field(runs, capsys):
    """An evaluation of an older kinterval records no train_data: nothing to compare, no note (not "other
    data"); execution fields (log.every, data.dir, device) are no protocol: no note either."""
    import shutil

    older = runs / "older"
    shutil.copytree(runs / "lerp", older)
    path = sorted((older / "eval" / "val").glob("step_*.json"))[-1]
    s = json.loads(path.read_text())
    del s["train_data"]
    s["train_config"]["log"]["every"] += 1
    s["train_config"]["data"]["dir"] = str(runs / "elsewhere")
    s["train_config"]["device"] = "cuda:3"
    path.write_text(json.dumps(s))
    assert main(["report", "--runs", str(runs / "soft"), str(older), "--out", str(runs / "rep_older")]) == 0
    assert "note:" not in capsys.readouterr().out


PROBE_DELTA = 0.5  # planted: every probe sample NLL of lerp-k4 = the control's + 0.5 (probe C: + the slope)


@pytest.fixture
def probe_runs(runs, tmp_path):
    """Copies of the runs soft, lerp and fwm (the module's stay without probes) and ``probes(name, ...)``: its
    ``kinterval probes`` output, as :func:`write_probes` writes it."""
    for name in ("soft", "lerp", "fwm"):
        shutil.copytree(runs / name, tmp_path / name)
    op = {"soft": "softmax", "lerp": "lerp-k4", "fwm": "fwm-prob-k4"}
    return tmp_path, lambda name, delta=0.0, **kw: write_probes(tmp_path / name, op[name], delta, **kw)


def test_runs_with_probes_get_the_probe_table_against_the_control(runs, probe_runs):
    """The probes of a run against the control's, as a suite's report pairs them (probes.md, probes.tex, an
    index.md section, ``probes``); a run without probes is listed "not run"; a later report of runs without
    probes takes the table away again."""
    from kinterval.eval.probes import in_probeab
    from kinterval.report.runs_report import runs_report

    root, probes = probe_runs
    probes("soft")
    probes("lerp", PROBE_DELTA)
    out = root / "rep"
    rep = runs_report([root / "soft", root / "lerp", root / "fwm"], out)
    c = rep["probes"]["lerp-k4"]
    assert (c["operator"], c["reference_operator"], c["reference"]) == ("lerp-k4", "softmax", "soft")
    assert (c["run"], c["reference_run"]) == (str(root / "lerp"), str(root / "soft"))
    nll = [r["delta"] for r in c["deltas"] if in_probeab(r) and r["metric"] == "nll"]
    assert nll and nll == pytest.approx([PROBE_DELTA] * len(nll), abs=1e-9)
    assert rep["probes"]["fwm-prob-k4"]["not_run"].startswith("no probes (probes/native")
    md = (out / "probes.md").read_text()
    line = next(x for x in md.splitlines() if "| A | nll | all | induction |" in x)
    assert line.startswith("| lerp-k4 | soft (softmax) |") and line.endswith("| tab:probeab |")
    assert "| fwm-prob-k4 | - | - | - | - | - | - | not run |" in md
    assert "tab:probec" in (out / "probes.tex").read_text()
    index = (out / "index.md").read_text()
    assert "### Synthetic probes vs the control" in index and "[Markdown](probes.md)" in index
    assert index.index("delta.png") < index.index("probes.md")
    # the same folder, runs without probes: the report of today, no probe table left behind
    rep = runs_report([runs / "soft", runs / "lerp"], out)
    assert "probes" not in rep and not (out / "probes.md").exists() and not (out / "probes.tex").exists()
    assert "probes" not in (out / "index.md").read_text()


def test_a_run_whose_control_has_no_probes_is_not_run(probe_runs):
    from kinterval.report.runs_report import runs_report

    root, probes = probe_runs
    probes("lerp", PROBE_DELTA)
    rep = runs_report([root / "soft", root / "lerp", root / "fwm"], root / "rep")
    assert rep["probes"]["lerp-k4"] == {
        "operator": "lerp-k4",
        "run": str(root / "lerp"),
        "not_run": "its control soft has no probes (probes/native)",
    }
    assert rep["probes"]["fwm-prob-k4"]["not_run"].startswith("no probes")
    assert "| lerp-k4 | - | - | - | - | - | - | not run |" in (root / "rep" / "probes.md").read_text()


def test_probes_without_samples_are_not_run_not_an_abort(probe_runs, capsys):
    """An output without samples (an older ``kinterval probes`` on a model too short for every probe) aborted
    the report with "rerun kinterval probes", which wrote the same empty output again."""
    root, probes = probe_runs
    probes("soft")
    probes("lerp", PROBE_DELTA)
    (root / "lerp" / "probes" / "native" / "samples.jsonl").write_bytes(b"")
    out = root / "rep"
    assert main(["report", "--runs", str(root / "soft"), str(root / "lerp"), "--out", str(out)]) == 0
    why = "probes/native/samples.jsonl holds no samples (no probe fit block_size 1024)"
    assert f"probes lerp-k4: not run ({why})" in capsys.readouterr().out.splitlines()
    assert why in (out / "probes.md").read_text()


def test_the_printed_summary_names_each_runs_probes(probe_runs, capsys):
    root, probes = probe_runs
    probes("soft")
    probes("lerp", PROBE_DELTA)
    out = root / "rep"
    assert (
        main(
            ["report", "--runs", str(root / "soft"), str(root / "lerp"), str(root / "fwm"), "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert "probes lerp-k4: vs soft (softmax)" in printed
    assert any(x.startswith("probes fwm-prob-k4: not run (no probes (probes/native") for x in printed)
    assert f"probe table written: {out / 'probes.md'}" in printed
    assert printed[-1] == f"report written: {out / 'index.md'}"


def test_probes_that_cannot_be_paired_are_one_error_line_naming_both_folders(probe_runs, capsys):
    root, probes = probe_runs
    probes("soft")
    probes("lerp", PROBE_DELTA, batch_size=8)
    out = root / "rep"
    assert main(["report", "--runs", str(root / "soft"), str(root / "lerp"), "--out", str(out)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("kinterval report: error: probes of lerp-k4") and "batch_size differs" in err
    assert str(root / "lerp" / "probes" / "native") in err and str(root / "soft" / "probes" / "native") in err
    assert not (out / "index.md").exists()


def test_two_runs_of_one_operator_are_refused(runs, tmp_path, capsys):
    shutil.copytree(runs / "lerp", tmp_path / "lerp2")
    argv = ["report", "--runs", str(runs / "soft"), str(runs / "lerp"), str(tmp_path / "lerp2")]
    assert main([*argv, "--out", str(tmp_path / "bad")]) == 2
    assert "both ran lerp-k4: give one run per operator" in capsys.readouterr().err


def test_trajectories_of_the_same_blocks_and_an_sdpa_control_named_softmax(runs, monkeypatch, tmp_path):
    """A run's trajectory holds its checkpoints evaluated on the latest one's blocks (max_blocks) only, and
    only a run with two or more such points has one; the control is the row "softmax" whether it ran
    softmax or sdpa."""
    from kinterval.report import runs_report as rr

    seen = {}
    monkeypatch.setattr(rr, "demo_report", lambda per_block, out, **kw: seen.update(kw, rows=per_block) or {})
    soft, lerp, fwm = (tmp_path / n for n in ("soft", "lerp", "fwm"))
    for name, to in (("soft", soft), ("lerp", lerp), ("fwm", fwm)):
        shutil.copytree(runs / name, to)
    first, last = sorted((lerp / "eval" / "val").glob("step_*.json"))
    s = json.loads(first.read_text())
    s["request"]["max_blocks"] = 1  # an earlier checkpoint evaluated on fewer blocks
    first.write_text(json.dumps(s))
    sorted((fwm / "eval" / "val").glob("step_*.json"))[0].unlink()  # one checkpoint evaluated
    path = sorted((soft / "eval" / "val").glob("step_*.json"))[-1]
    s = json.loads(path.read_text())
    s["operator_used"] = "sdpa"
    path.write_text(json.dumps(s))
    rr.runs_report([soft, lerp, fwm], tmp_path / "rep")
    assert sorted(seen["rows"]) == ["fwm-prob-k4", "lerp-k4", "softmax"]
    assert sorted(seen["trajectories"]) == ["softmax"] and len(seen["trajectories"]["softmax"]) == 2
    assert rr._evaluated(lerp, "val").trajectory == [(json.loads(last.read_text())["tokens"],
                                                      json.loads(last.read_text())["mean_nll"])]  # fmt: skip


def test_the_printed_summary_gives_a_small_delta_in_two_significant_digits(monkeypatch, capsys, tmp_path):
    """`kinterval report --runs` printed a Δ of -3e-05 as "-0.0000" and an interval [-1e-04, -3e-05], which
    excludes 0, as "[-0.0001, -0.0000]"; delta.md prints them in two significant digits."""
    import kinterval.report.runs_report as rr

    row = {
        "operator": "fwm-prob-k4",
        "nll": 5.5,
        "delta": -3e-05,
        "lo": -1e-04,
        "hi": -3e-05,
        "separated": False,
    }
    monkeypatch.setattr(
        rr, "runs_report", lambda runs, out, split: {"rows": [row], "notes": [], "index": "i.md"}
    )
    assert main(["report", "--runs", "soft", "fwm", "--out", str(tmp_path / "rep")]) == 0
    assert "ΔNLL vs softmax -3.0e-05  [-0.0001, -3.0e-05]" in capsys.readouterr().out


def test_a_stopped_run_is_compared_at_its_last_evaluated_checkpoint(runs, tmp_path, capsys):
    """A run stopped by a non-finite loss whose last checkpoint holds the diverging weights cannot be
    evaluated there: the report asked for that evaluation (which fails) and never reported the run. Now its
    last evaluated checkpoint is its row, with a note; the row of a finite but absurd one says so too."""
    from kinterval.eval.evaluate import eval_dir

    run = tmp_path / "lerp"
    shutil.copytree(runs / "lerp", run)
    last = sorted(eval_dir(run).glob("step_*.json"))[-1]
    step = int(last.stem.removeprefix("step_"))
    (run / "status.json").write_text(json.dumps({"status": "nonfinite_loss", "step": step + 1}))
    last.unlink()
    last.with_suffix(".npz").unlink()
    assert main(["report", "--runs", str(runs / "soft"), str(run), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert (
        f"note: lerp-k4 ({run}) was stopped by a non-finite loss at step {step + 1}: its row is its last"
        in (printed)
    )
    # a stopped control: its note once, not once per compared run
    soft = shutil.copytree(runs / "soft", tmp_path / "soft")
    (soft / "status.json").write_text(json.dumps({"status": "nonfinite_loss", "step": 10**6}))
    argv = [
        "report",
        "--runs",
        str(soft),
        str(runs / "lerp"),
        str(runs / "fwm"),
        "--out",
        str(tmp_path / "r3"),
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.count(f"softmax ({soft}) was stopped by a non-finite loss") == 1
    for f in eval_dir(run).glob("step_*"):
        f.unlink()
    assert main(["report", "--runs", str(runs / "soft"), str(run), "--out", str(tmp_path / "rep2")]) == 2
    assert "none of its checkpoints is evaluated on val" in capsys.readouterr().err


def test_an_unreadable_status_is_named_not_read_as_a_run_that_did_not_stop(runs, tmp_path, capsys):
    run = shutil.copytree(runs / "lerp", tmp_path / "lerp")
    (run / "status.json").write_text('{"status": "nonfinite_lo')
    assert main(["report", "--runs", str(runs / "soft"), str(run), "--out", str(tmp_path / "rep")]) == 2
    assert f"{run / 'status.json'}: unreadable" in capsys.readouterr().err
