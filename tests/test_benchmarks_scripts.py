"""The GPU-session driver (benchmarks/gpu_session.sh) and the training-throughput benchmark's header, run here
without a GPU: a mistake that would show only on a lent machine costs that session's one call. No timing is
checked."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "benchmarks" / "gpu_session.sh"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def session(tmp_path, *stages, **env):
    """``bash benchmarks/gpu_session.sh STAGES`` with OUT in tmp_path and this Python; (rc, stdout+stderr, the
    files it left under OUT)."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, **env}
    r = subprocess.run(["bash", str(SESSION), *stages], capture_output=True, text=True, env=env, timeout=600)
    files = sorted(p.name for p in out.iterdir()) if out.exists() else []
    return r.returncode, r.stdout + r.stderr, files


@needs_bash
@pytest.mark.parametrize("stages", [("bogus",), ("bench-quick", "bogus")])
def test_an_unknown_stage_runs_nothing(tmp_path, stages):
    """Stage names were checked only when reached: `bench-quick bogus` spent the bench-quick stage first."""
    rc, text, files = session(tmp_path, *stages)
    assert rc == 2 and "unknown stage 'bogus'" in text
    assert files == [] and "== stage" not in text


@needs_bash
def test_stages_over_one_commands_budget_are_refused(tmp_path):
    """The old default (tests bench-quick train) added up to 1080 s of limits, more than one 600 s command."""
    rc, text, files = session(tmp_path, "tests", "bench-quick", "train")
    assert rc == 2 and "over the budget" in text and files == []
    rc, text, files = session(tmp_path, "--plan", "tests", "bench-quick", "train", GPU_SESSION_BUDGET="0")
    assert rc == 0 and "over the budget" not in text and files == []  # 0: no budget (no 10-minute limit)


@needs_bash
@pytest.mark.parametrize("stages", [(), ("kernel",)])
def test_the_default_and_the_kernel_plan_fit_one_command(tmp_path, stages):
    """--plan prints each stage's limit and their sum, and runs nothing."""
    rc, text, files = session(tmp_path, "--plan", *stages)
    assert rc == 0 and files == []
    total = [line for line in text.splitlines() if line.startswith("total")]
    assert total and int(total[0].split()[1]) <= 560, text


@needs_bash
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the stage would run in full")
def test_a_failed_stage_fails_the_session(tmp_path):
    """Without CUDA benchmarks/attention.py exits 2; the session exited 0 all the same. Now the stage's
    summary line says it failed, and so does the exit status."""
    rc, text, files = session(tmp_path, "bench-quick")
    assert rc != 0
    assert any(line.startswith("== stage bench-quick: FAILED (exit 2)") for line in text.splitlines()), text
    assert "needs a CUDA GPU" in (tmp_path / "out" / "bench_quick.err").read_text()
    assert "env.txt" in files


@needs_bash
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the stages would run in full")
def test_more_than_eight_files_come_back_as_one_archive(tmp_path):
    """A lent machine brings back at most 8 files from $OUT; five bench stages left 11 and three would have
    stayed behind. Past 8, everything but env.txt is packed into session.tar.gz."""
    import tarfile

    stages = ("bench-quick", "bench-ieee", "bench-eval", "bench-gqa", "bench-baselines")
    rc, text, files = session(tmp_path, *stages, GPU_SESSION_BUDGET="0")
    assert rc != 0 and files == ["env.txt", "session.tar.gz"], (files, text)
    with tarfile.open(tmp_path / "out" / "session.tar.gz") as tar:
        names = sorted(n.removeprefix("./") for n in tar.getnames())
    assert len(names) == 10 and "bench_quick.err" in names and "packed into" in text
    rc, text, files = session(tmp_path / "one", "bench-quick")
    assert "session.tar.gz" not in files and "bench_quick.err" in files  # 8 or fewer: as they are


def test_the_two_test_shares_are_the_whole_file_once(request, monkeypatch):
    """tests-1 and tests-2 (KINTERVAL_TEST_SHARD=1/2, 2/2) split a test file too long for one command: every
    test in exactly one share; a bad share is a usage error. The hook is called here on stand-in items; one
    real collection shows that pytest applies it."""
    conftest = ROOT / "tests" / "conftest.py"
    hooks = next(
        p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", "") == str(conftest)
    )
    deselected = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))

    def share(shard, n=7):
        monkeypatch.setenv("KINTERVAL_TEST_SHARD", shard)
        items = list(range(n))
        hooks.pytest_collection_modifyitems(config, items)
        return items

    one, two = share("1/2"), share("2/2")
    assert one == [0, 2, 4, 6] and two == [1, 3, 5] and sorted(deselected) == list(range(7))
    assert share("3/3", 2) == [] and share("1/1") == list(range(7))
    for bad in ("3/2", "0/2", "1", "a/b"):
        with pytest.raises(pytest.UsageError, match="KINTERVAL_TEST_SHARD must be i/n"):
            share(bad)
    # without CI: the collecting process need not import the dev extras the CI guard checks (4 s)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"KINTERVAL_TEST_SHARD": "2/2"}
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    r = subprocess.run(
        [*cmd, "tests/test_paper_constants.py"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    tests = [x for x in r.stdout.splitlines() if "::" in x]
    assert r.returncode == 0 and tests and re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", r.stdout)


def test_throughput_table_starts_with_versions_and_commit(tmp_path, capsys):
    """The table on stdout and the --markdown file begin with the provenance line."""
    bench = runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"))
    md = tmp_path / "t.md"
    argv = ["--model", "tiny", "--device", "cpu", "--vocab-size", "64", "--block-size", "16", "--steps", "1"]
    bench["main"](
        [*argv, "--warmup", "0", "--micro-batch", "2", "--operators", "sdpa", "--markdown", str(md)]
    )
    want = "# kinterval training throughput; " + provenance()["provenance"](torch.device("cpu"))
    for text in (capsys.readouterr().out, md.read_text()):
        assert text.splitlines()[0] == want


def test_throughput_compiles_the_blocks_when_asked(capsys):
    """--compile: every row's blocks through torch.compile (the operator eager), and the header says so."""
    from torch._dynamo.utils import counters

    bench = runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"))
    argv = ["--model", "tiny", "--device", "cpu", "--vocab-size", "64", "--block-size", "16", "--steps", "1"]
    torch._dynamo.reset()
    counters.clear()
    bench["main"]([*argv, "--warmup", "1", "--micro-batch", "2", "--operators", "sdpa,lerp-k4", "--compile"])
    assert counters["stats"]["unique_graphs"] > 0  # the blocks went through dynamo
    out = capsys.readouterr().out
    assert "blocks compiled (torch.compile; the K-interval operator eager)" in out
    rows = [line for line in out.splitlines() if line.startswith(("| sdpa", "| lerp-k4"))]
    assert len(rows) == 2 and not any("error" in r for r in rows), out
    args = bench["parse_args"](["--compile"])
    assert args.compile and not bench["parse_args"]([]).compile
    with pytest.raises(SystemExit):  # the blocks compile in the warm-up: without one a timed step would
        bench["parse_args"](["--compile", "--warmup", "0"])


def test_throughput_checkpoints_activations_when_asked(capsys):
    """--activation-checkpointing: every row's model recomputes its blocks, and the header says so."""
    bench = runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"))
    args = bench["parse_args"](["--model", "tiny", "--vocab-size", "64", "--activation-checkpointing"])
    row = bench["Row"]("lerp-k4", "float32", args, torch.device("cpu"))
    assert (
        row.model.activation_checkpointing
        and not bench["Row"](
            "lerp-k4",
            "float32",
            bench["parse_args"](["--model", "tiny", "--vocab-size", "64"]),
            torch.device("cpu"),
        ).model.activation_checkpointing
    )
    argv = ["--model", "tiny", "--device", "cpu", "--vocab-size", "64", "--block-size", "16", "--steps", "1"]
    bench["main"](
        [*argv, "--warmup", "0", "--micro-batch", "2", "--operators", "sdpa", "--activation-checkpointing"]
    )
    assert ", activation checkpointing" in capsys.readouterr().out


def provenance():
    return runpy.run_path(str(ROOT / "benchmarks" / "provenance.py"))  # the module's globals


def test_provenance_names_versions_and_the_commit_with_its_state(tmp_path, monkeypatch):
    """Device, torch, triton and the checkout's commit, marked when it has uncommitted changes; in a copy
    without .git (a lent GPU machine), KINTERVAL_COMMIT."""
    try:
        import triton

        triton_version = f"triton {triton.__version__}"
    except ImportError:
        triton_version = "no triton"
    describe = provenance()["provenance"]
    line = describe(torch.device("cpu"))
    assert line.startswith(f"device cpu; torch {torch.__version__}, {triton_version}; commit ")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if head:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        assert line.endswith(f"commit {head}" + (" with uncommitted changes" if dirty else ""))
    copy = tmp_path / "copy"  # the file alone, outside any checkout
    copy.mkdir()
    shutil.copy(ROOT / "benchmarks" / "provenance.py", copy)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    alone = runpy.run_path(str(copy / "provenance.py"))["provenance"]
    assert alone(torch.device("cpu")).endswith("commit unknown (not a git checkout; set KINTERVAL_COMMIT)")
    monkeypatch.setenv("KINTERVAL_COMMIT", "abc123")
    assert alone(torch.device("cpu")).endswith("commit abc123 (KINTERVAL_COMMIT)")


def test_run_throughput_adds_step_times_into_a_clock(tmp_path, capsys):
    """benchmarks/run_throughput.py: 100 steps of 1M tokens at 100k tokens/s (10 s each), then 50 steps at
    1M tokens/s (1 s each): 1050 s of training, windows of 500 s at 100k, 100k and 1M tokens/s."""
    run = tmp_path / "runs" / "a-s1"
    run.mkdir(parents=True)
    rows = [{"step": s, "tokens": 10**6 * s, "tokens_per_s": 1e5 if s <= 100 else 1e6} for s in range(1, 151)]
    rows.insert(
        5, {"event": "eval", "step": 5, "tokens": 5 * 10**6, "val_loss": 3.0}
    )  # no tokens_per_s: skipped
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main = runpy.run_path(str(ROOT / "benchmarks" / "run_throughput.py"))["main"]
    assert main([str(tmp_path), "--window", "500"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-1] == "| a-s1 | 1050 | 100 | 100 | 1000 |", table  # thousands of tokens/s
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none")])


def test_run_throughput_median_default_window_only_and_ragged_rows(tmp_path, capsys):
    """The documented defaults and options (module docstring): WINDOW 30 s, the median of each window,
    --only by run id, evaluation rows (no tokens_per_s) are not steps, one column per window of the longest
    run and an empty cell where a shorter run has ended."""

    def write(rid, rows):
        (tmp_path / "runs" / rid).mkdir(parents=True)
        (tmp_path / "runs" / rid / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    # a-s1: 5 s, 5 s and 2 s steps at 1k, 1k, 4k tokens/s (window 0: median 1k, mean 2k), then 40 s at 1k
    write("a-s1", [{"step": 1, "tokens": 5000, "tokens_per_s": 1000.0},
                   {"step": 2, "tokens": 10000, "tokens_per_s": 1000.0},
                   {"step": 3, "tokens": 18000, "tokens_per_s": 4000.0},
                   {"step": 4, "tokens": 58000, "tokens_per_s": 1000.0}])  # fmt: skip
    # b-s1: one 1 s step at 2k tokens/s, then an evaluation row
    write("b-s1", [{"step": 1, "tokens": 2000, "tokens_per_s": 2000.0},
                   {"event": "eval", "step": 1, "tokens": 2000, "val_loss": 3.0}])  # fmt: skip
    main = runpy.run_path(str(ROOT / "benchmarks" / "run_throughput.py"))["main"]
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "median tokens/s (thousands) per 30 s of training",
        "| run | train s | 0- | 30- |",
        "|---|---|---|---|",
        "| a-s1 | 52 | 1 | 1 |",
        "| b-s1 | 1 | 2 |  |",
    ]
    assert main([str(tmp_path), "--only", "b-*"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "| b-s1 | 1 | 2 |"


def test_run_throughput_keeps_a_window_without_steps_in_its_column(tmp_path, capsys):
    """A step longer than the window (a compile, a stall) leaves windows in which no step ended: they stay
    empty columns, so that every later median stays under its own window's header, and a run without
    steps prints a table whose header and rows have as many cells as its separator."""
    (tmp_path / "runs" / "a-s1").mkdir(parents=True)
    rows = [{"step": 1, "tokens": 10000, "tokens_per_s": 1000.0},  # 10 s: window 0
            {"step": 2, "tokens": 40000, "tokens_per_s": 500.0},  # 60 s: ends at 70 s, window 60-
            {"step": 3, "tokens": 44000, "tokens_per_s": 4000.0}]  # 1 s: window 60-  # fmt: skip
    (tmp_path / "runs" / "a-s1" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main = runpy.run_path(str(ROOT / "benchmarks" / "run_throughput.py"))["main"]
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "| run | train s | 0- | 30- | 60- |",
        "|---|---|---|---|---|",
        "| a-s1 | 71 | 1 |  | 2 |",
    ]
    (tmp_path / "runs" / "b-s1").mkdir(parents=True)
    (tmp_path / "runs" / "b-s1" / "metrics.jsonl").write_text(json.dumps({"step": 0, "val_loss": 3.0}) + "\n")
    assert main([str(tmp_path), "--only", "b-*"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["| run | train s |", "|---|---|", "| b-s1 | 0 |"]


def test_throughput_takes_grouped_query_heads_and_rotary_positions(capsys):
    """--n-kv-head and --rope-theta: every row's model has them, the SDPA anchor's too, and the header says
    so; a count that does not divide the heads is refused."""
    bench = runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"))
    args = bench["parse_args"](
        ["--model", "tiny", "--vocab-size", "64", "--n-kv-head", "1", "--rope-theta", "1e4"]
    )
    for op in ("sdpa", "lerp-k4"):
        cfg = bench["Row"](op, "float32", args, torch.device("cpu")).cfg
        assert (cfg.n_kv_head, cfg.rope_theta) == (1, 1e4)
    argv = ["--model", "tiny", "--device", "cpu", "--vocab-size", "64", "--block-size", "16", "--steps", "1"]
    bench["main"]([*argv, "--warmup", "0", "--micro-batch", "2", "--operators", "sdpa,lerp-k4", "--n-kv-head",
                   "1", "--rope-theta", "1e4"])  # fmt: skip
    out = capsys.readouterr().out
    assert ", 1 key/value heads, rotary positions (theta 10000)" in out
    rows = [line for line in out.splitlines() if line.startswith(("| sdpa", "| lerp-k4"))]
    assert len(rows) == 2 and not any("error" in r for r in rows), out
    with pytest.raises(ValueError, match="n_kv_head"):
        bench["Row"]("sdpa", "float32", bench["parse_args"](["--model", "tiny", "--n-kv-head", "3"]), "cpu")
