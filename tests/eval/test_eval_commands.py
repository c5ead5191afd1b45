"""CLI glue of ``kinterval eval``, ``geometry``, ``graddiag`` and ``tau-screen``: each flag reaches its
parameter, with the documented defaults (mutation audit, benchmarks/results/mutation-2026-11-24/cli_glue.md).
"""

import json
from pathlib import Path

import pytest

from kinterval.cli import build_parser, main


class Stop(Exception):
    pass


def test_eval_passes_each_flag_to_evaluate_run(monkeypatch):
    import sys

    from kinterval.eval import evaluate

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar unless --quiet

    seen = {}
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, **k: seen.update(k, run=run) or [])
    argv = ["eval", "--run", "R", "--checkpoint", "4", "--operator", "softmax", "--split", "test",
            "--data", "D", "--out", "O", "--doc-clusters", "--device", "cpu", "--max-blocks", "3", "--force",
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert seen == {"run": "R", "checkpoint": "4", "operator": "softmax", "split": "test", "data": "D",
                    "out_dir": "O", "doc_clusters": True, "device": "cpu", "max_blocks": 3, "force": True,
                    "progress": False}  # fmt: skip
    assert main(["eval", "--run", "R"]) == 0  # help: all checkpoints, val split, auto device
    assert (seen["checkpoint"], seen["split"], seen["device"], seen["force"], seen["progress"]) == (
        "all", "val", "auto", False, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    "trained, used, noted",
    [
        ("lerp-k4", "lerp-k4[range_grad=detach]", True),
        ("fwm-prob-k4[range_grad=max_only,tau=4]", "fwm-prob-k4[tau=4]", True),
        ("lerp-k4", "lerp-k8", False),
        ("lerp-k4", "lerp-k4[range_grad=full]", False),  # the run's own operator, spelled out
        ("fwm-prob-k4", "fwm-prob-k4[tau=4,range_grad=detach]", False),
        ("softmax", "sdpa", False),
    ],
)
def test_an_override_that_changes_only_range_grad_is_noted(monkeypatch, capsys, trained, used, noted):
    """range_grad changes the backward alone: such an evaluation repeats the run's own forward."""
    from kinterval.eval import evaluate

    row = {
        "checkpoint": "step_000004",
        "step": 4,
        "operator_used": used,
        "operator_trained": trained,
        "operator_override": True,
        "split": "val",
        "n_blocks": 2,
        "mean_nll": 3.0,
        "skipped": False,
    }
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, **k: [row, dict(row, checkpoint="step_000008")])
    assert main(["eval", "--run", "R", "--operator", used, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("only in range_grad") == noted  # once per trained operator, not per checkpoint


@pytest.mark.parametrize(
    ("extra", "printed"),
    [
        ({"n_documents": 3, "doc_cluster_mean_nll": 3.25}, "  doc-cluster 3.2500  [evaluated]"),
        ({"n_documents": 1}, "  doc-cluster - (1 document: needs 2)  [evaluated]"),  # printed nothing
        ({"n_documents": 3, "n_documents_split": 3, "doc_cluster_mean_nll": 3.25}, "3.2500  [evaluated]"),
        (
            {"n_documents": 3, "n_documents_split": 5, "doc_cluster_mean_nll": 3.25},
            "  doc-cluster 3.2500 (3 of the split's 5 documents scored)  [evaluated]",
        ),
        ({}, "nats/token  [evaluated]"),  # no --doc-clusters
    ],
)
def test_eval_prints_the_document_cluster_mean_or_why_there_is_none(monkeypatch, capsys, extra, printed):
    from kinterval.eval import evaluate

    row = {"checkpoint": "step_000004", "step": 4, "operator_used": "softmax", "operator_trained": "softmax",
           "operator_override": False, "split": "val", "n_blocks": 2, "mean_nll": 3.0,
           "skipped": False}  # fmt: skip
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, **k: [dict(row, **extra)])
    assert main(["eval", "--run", "R", "--quiet"]) == 0
    assert printed in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["geometry", "graddiag"])
def test_diagnostics_pass_their_flags_and_default_to_8_blocks(monkeypatch, kind):
    from kinterval.eval import diagnostics

    seen = {}
    monkeypatch.setattr(diagnostics, "diagnose_run", lambda run, k, **kw: seen.update(kw, kind=k) or [])
    assert main([kind, "--run", "R"]) == 0
    assert (seen["kind"], seen["blocks"], seen["force"]) == (kind, 8, False)
    extra = ["--as", "fwm-prob-k4"] if kind == "geometry" else []
    assert main([kind, "--run", "R", "--blocks", "2", "--force", *extra]) == 0
    assert (seen["blocks"], seen["force"]) == (2, True)
    if kind == "geometry":
        assert seen["spec"] == "fwm-prob-k4"
    else:
        assert "spec" not in seen


def test_tau_screen_stages_take_the_overrides_and_their_block_counts(monkeypatch):
    """--K and --taus replace every stage's lists; the subset stages (1, 2a, 2b) use --subset-blocks
    (default 32) and the full-split stage 3 uses --max-blocks (default: no cap)."""
    from kinterval.eval import checkpoints, tau_screen

    stages, specs = [], []
    real_stage, real_spec = tau_screen.Stage, tau_screen.fwm_spec
    monkeypatch.setattr(tau_screen, "Stage", lambda *a, **k: stages.append(real_stage(*a, **k)) or stages[-1])
    monkeypatch.setattr(tau_screen, "fwm_spec", lambda *a: specs.append(a) or real_spec(*a))

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(checkpoints, "select_checkpoints", stop)
    with pytest.raises(Stop):
        main(
            ["tau-screen", "--run", "R", "--stages", "1,3", "--K", "8", "--taus", "5.5", "--max-blocks", "9"]
        )
    assert [(s.name, s.K, s.taus, s.blocks) for s in stages] == [
        ("1", (8,), (5.5,), 32),
        ("3", (8,), (5.5,), 9),
    ]
    assert set(specs) == {(8, 5.5, "nearest")}
    stages.clear()
    with pytest.raises(Stop):
        main(["tau-screen", "--run", "R", "--stages", "2a,3", "--subset-blocks", "4"])
    assert [(s.name, s.blocks) for s in stages] == [("2a", 4), ("3", None)]
    assert stages[0].K == (4, 16, 32)  # the paper's K of stage 2a without --K


def test_tau_screen_help_defaults():
    args = build_parser().parse_args(["tau-screen", "--run", "R"])
    got = (args.checkpoint, args.stages, args.subset_blocks, args.reconstruction)
    assert got == ("latest", "1,2a,2b,3", 32, "nearest")


@pytest.mark.parametrize("name", ["softmax", "bf16-exp", "bogus"])
def test_geometry_as_refuses_an_operator_without_a_grid(monkeypatch, tmp_path, capsys, name):
    """``--as softmax`` ran and wrote h/top_bucket_mass/eff_buckets/tv = NaN: --as defines the grid those
    come from, so a baseline (or an unknown name) is refused up front, naming --as, with nothing written."""
    from kinterval.eval import diagnostics

    def called(*a, **k):
        raise AssertionError("diagnose_run ran")

    monkeypatch.setattr(diagnostics, "diagnose_run", called)
    out = tmp_path / "geo"
    assert main(["geometry", "--run", "R", "--as", name, "--out", str(out)]) == 2
    assert "--as" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("command", ["eval", "geometry", "graddiag", "tau-screen"])
def test_a_checkpoint_without_a_data_folder_asks_for_one(tmp_path, capsys, softmax_run, command):
    """A state.json whose config records no data folder (a checkpoint written by hand or by another tool):
    without --data each command says so in one line (exit 2); it raised KeyError: 'data'."""
    softmax_run(vocab_size=64, block_size=16)
    assert main([command, "--run", str(tmp_path / "run"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "records no data folder" in err and "--data" in err and len(err.splitlines()) == 1, err


def test_a_latest_checkpoint_without_state_json_is_named_in_one_warning_line(tmp_path, capsys, softmax_run):
    """LATEST names a step folder whose state.json is missing (a checkpoint copied in part): the command
    says so in one ``kinterval eval: warning:`` line (it said LATEST "does not name a checkpoint of this run"
    as a Python UserWarning with its source line) and uses the newest complete one; asked for by its step,
    the error names the missing state.json."""
    softmax_run(vocab_size=64, block_size=16)
    root = tmp_path / "run" / "checkpoints"
    (root / "step_000002").mkdir()
    (root / "LATEST").write_text("step_000002\n")
    assert main(["eval", "--run", str(tmp_path / "run"), "--checkpoint", "latest", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        f"kinterval eval: warning: {root / 'LATEST'} names step_000002, which has no state.json (an "
        "incomplete or damaged checkpoint); using the newest complete one, step_000001"
    ), err
    assert len(err) == 2 and "records no data folder" in err[1], err  # step 1 was used
    assert main(["eval", "--run", str(tmp_path / "run"), "--checkpoint", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint at step 2" in err and "step_000002 has no state.json (incomplete or damaged)" in err
    assert "have: ['step_000001']" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", ["eval", "geometry", "graddiag"])
def test_each_command_names_the_folder_it_wrote(tmp_path, capsys, softmax_run, command):
    """eval, geometry and graddiag printed their rows but not where the files went (their default folder
    depends on the split, data and operator); tau-screen, train and report name theirs."""
    from kinterval.data.prepare import prepare
    from kinterval.data.synthetic import VOCAB_SIZE

    prepare("synthetic", tmp_path / "data", tokens=8_000, seed=0, progress=False)
    softmax_run(VOCAB_SIZE)
    argv = [command, "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--device", "cpu"]
    argv += {"eval": ["--max-blocks", "2", "--quiet"], "geometry": ["--blocks", "1", "--as", "lerp-k4"]}.get(
        command, ["--blocks", "1"]
    )
    for _ in range(2):  # written, then cached: named both times
        assert main(argv) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert (
            last.startswith("written to ")
            and (Path(last[len("written to ") :]) / "step_000001.json").is_file()
        )


def test_tau_screen_of_a_run_not_trained_with_softmax_warns_on_stderr(tmp_path, capsys, monkeypatch):
    """The warning was a bare ``warning: ...`` line on stdout, among the screen's tables."""
    import torch

    from kinterval.data.prepare import prepare
    from kinterval.data.synthetic import VOCAB_SIZE
    from kinterval.model import GPT, ModelConfig
    from kinterval.train.checkpoint import save_checkpoint

    prepare("synthetic", tmp_path / "data", tokens=8_000, seed=0, progress=False)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=VOCAB_SIZE)
    state = {"step": 1, "config": {"operator": {"name": "lerp-k4", "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(tmp_path / "run", 1, GPT(cfg, "lerp-k4", "closed_form").state_dict(), {}, state)
    argv = ["tau-screen", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--out",
            str(tmp_path / "ts"), "--device", "cpu", "--stages", "1", "--K", "4", "--taus", "4",
            "--subset-blocks", "2", "--resamples", "10"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out and out.splitlines()[-1] == f"written to {tmp_path / 'ts'}"
    assert err.startswith("kinterval tau-screen: warning: ") and "trained with lerp-k4" in err
    # the record keeps it too: App. C.3's screen is of softmax checkpoints
    assert json.loads((tmp_path / "ts" / "stage1.json").read_text())["trained_operator"] == "lerp-k4"


@pytest.mark.parametrize("tty", [False, True])
def test_progress_bars_only_on_a_terminal(tmp_path, capsys, monkeypatch, softmax_run, tty):
    """eval and data prepare drew their bars into a log file or a pipe (thousands of carriage-return
    updates); as train, they draw one only when stderr is a terminal."""
    import sys

    from kinterval.data.synthetic import VOCAB_SIZE

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert (
        main(
            ["data", "prepare", "--source", "synthetic", "--tokens", "8000", "--out", str(tmp_path / "data")]
        )
        == 0
    )
    assert ("synthetic train" in capsys.readouterr().err) == tty
    softmax_run(VOCAB_SIZE)
    argv = ["eval", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--device", "cpu"]
    assert main([*argv, "--max-blocks", "2"]) == 0
    assert ("eval step_000001:" in capsys.readouterr().err) == tty  # the bar names the checkpoint


@pytest.mark.parametrize("command", ["geometry", "graddiag"])
def test_a_probe_on_data_of_a_larger_vocabulary_is_one_line_naming_both(
    tmp_path, capsys, softmax_run, command
):
    """A checkpoint that records no training data is not checked against the data's tokenizer: the probe
    compares the vocabularies itself (on CUDA, ids past the embedding table are a device-side assert)."""
    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "data", tokens=4_000, seed=0, progress=False)
    softmax_run(vocab_size=64, block_size=16)
    argv = [command, "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--device", "cpu"]
    assert main([*argv, "--blocks", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "data vocab_size 512 > model vocab_size 64" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run" / "diagnostics").exists()


def test_an_evaluation_tag_parses_back_into_its_parts():
    """report --runs reads a tag back into the eval options that made it (its hint for a missing one)."""
    from kinterval.eval.evaluate import eval_tag, parse_eval_tag

    assert parse_eval_tag(eval_tag("val")) == ("val", [], [])
    assert parse_eval_tag(eval_tag("test", "/data/ptb", "lerp-k4")) == ("test", ["ptb"], ["lerp-k4"])
    assert parse_eval_tag(eval_tag("val", None, "softmax")) == ("val", [], ["softmax"])
