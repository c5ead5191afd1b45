"""The demo end to end (--quick) and a CPU smoke run of the throughput benchmark."""

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.data.loader import TokenShards, n_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_quick_demo_end_to_end(tmp_path, capsys):
    rc = main(
        [
            "demo",
            "--quick",
            "--out",
            str(tmp_path),
            "--operators",
            "minmax-weight-k4,fwm-prob-k4",
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    assert {"softmax", "minmax-weight-k4", "fwm-prob-k4"} <= set(lines)
    assert float(lines["softmax"][2]) == 0.0  # ΔNLL of softmax against itself
    # ΔNLL with block-bootstrap CIs, and a small report with a figure
    lo, hi = (float(x.strip("[],")) for x in lines["minmax-weight-k4"][3:5])
    assert lo <= float(lines["minmax-weight-k4"][2]) <= hi
    assert (tmp_path / "report" / "delta.png").stat().st_size > 1000
    assert (tmp_path / "report" / "index.md").is_file()
    for op in ("softmax", "minmax-weight-k4", "fwm-prob-k4"):
        nll = np.load(tmp_path / "runs" / op / "val_nll.npy")
        val = TokenShards(tmp_path / "data", "val")
        assert len(nll) == n_blocks(val.n_tokens, 128) > 10 and np.isfinite(nll).all()  # the full split
        assert abs(float(lines[op][1]) - nll.mean()) < 1e-4
        assert nll.mean() < np.log(512)  # learned something beyond uniform


def run_benchmark(monkeypatch, capsys, *args) -> list[list[str]]:
    """The throughput script as a user runs it on CPU; the table's rows split into cells."""
    argv = ["train_throughput.py", "--model", "tiny", "--device", "cpu", "--vocab-size", "64"]
    argv += ["--block-size", "16", "--warmup", "1", *args]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "tokens/s" in out and "error" not in out
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")
    ]


def test_demo_refuses_a_dataset_suite_or_run_folder_as_out(tmp_path, capsys):
    """``demo --out DATA`` (or a suite or a run folder) put the demo's data/ and runs/ in with its files."""
    for name, said in (("meta.json", "is a prepared dataset"), ("manifest.json", "is a suite folder"),
                       ("run_config.json", "is a kinterval run folder")):  # fmt: skip
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        (out / name).write_text("{}")
        assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 2
        assert said in capsys.readouterr().err and [p.name for p in out.iterdir()] == [name]


@pytest.mark.parametrize(
    "flags, message",
    [(["--tokens", "0"], "tokens must be a positive integer"), (["--threads", "-1"], "threads must be"),
     (["--threads", "1000000"], "--threads must be at most"),
     (["--operators", "softmax,bogus"], "unknown operator name 'bogus'"),
     (["--operators", ""], "argument --operators: an empty value"),
     (["--operators", " , "], "names no operator"),
     (["--operators", "fwm-prob-k4,FWM-Prob-K4"], "names fwm-prob-k4 more than once"),
     (["--operators", "softmax,softmax"], "names softmax more than once"),
     # a comma inside [...] separates overrides, not names (as in kinterval ops --operators)
     (["--operators", "fwm-prob-k4[tau=5,range_grad=detach],fwm-prob-k4[range_grad=detach,tau=5]"],
      "names fwm-prob-k4[tau=5,range_grad=detach] more than once")],
)  # fmt: skip
def test_demo_checks_its_flags_before_any_work(tmp_path, capsys, flags, message):
    """--tokens 0 silently meant the default, --threads -1 was torch's RuntimeError, an unknown operator
    failed only after the data was prepared and softmax trained, and --operators "" trained softmax alone and
    printed a table without a single ΔNLL."""
    assert main(["demo", "--quick", "--out", str(tmp_path / "d"), "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_benchmark_cpu_smoke(monkeypatch, capsys):
    args = ("--micro-batch", "2", "--steps", "1", "--operators", "sdpa,softmax,lerp-k4")
    rows = run_benchmark(monkeypatch, capsys, *args)[1:]  # without the header row
    assert [r[:2] for r in rows] == [["sdpa", "float32"], ["softmax", "float32"], ["lerp-k4", "float32"]]
    assert rows[0][6] == "1.00×"


def test_benchmark_takes_full_names_with_overrides(monkeypatch, capsys):
    """A comma inside [...] separates overrides, not names (as in kinterval ops --operators)."""
    args = ("--micro-batch", "2", "--steps", "1", "--operators", "fwm-prob-k4[tau=5,range_grad=detach]")
    rows = run_benchmark(monkeypatch, capsys, *args)[1:]
    assert [r[0] for r in rows] == ["sdpa", "fwm-prob-k4[tau=5,range_grad=detach]"]


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_benchmark_without_a_gpu_asks_for_device_cpu(monkeypatch, capsys, device):
    """--device auto fell back to the CPU and set out to time GPT-2 124M there (hours, no message). Exit
    status 2, as benchmarks/attention.py without a GPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        bench_module()["main"](["--device", device, "--steps", "1"])
    assert stop.value.code == 2 and "no CUDA GPU found" in capsys.readouterr().err


@pytest.mark.parametrize(("device", "expected"), [("auto", "cuda"), ("cuda", "cuda"), ("cpu", "cpu")])
def test_benchmark_measures_on_the_gpu_where_there_is_one(monkeypatch, device, expected):
    """With a CUDA GPU, --device auto (the default) measures on it, as --device cuda does; --device cpu
    stays on the CPU. The benchmark is stopped at its first use of the device (the micro-batch choice)."""
    import torch

    class Stop(Exception):
        pass

    def stop(args, dev):
        raise Stop(str(dev))

    main = bench_module()["main"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(main.__globals__, "precompile", lambda args, dev: None)
    monkeypatch.setitem(main.__globals__, "choose_micro_batch", stop)
    with pytest.raises(Stop) as chosen:
        main(["--device", device, "--steps", "1", "--precompile", "0"])
    assert str(chosen.value) == expected


def test_benchmark_both_attention_dtypes_beside_their_anchors(monkeypatch, capsys, tmp_path):
    md = tmp_path / "table.md"
    args = ["--attention-dtype", "float32,bfloat16", "--micro-batch", "max", "--steps", "3", "--repeats", "2"]
    rows = run_benchmark(monkeypatch, capsys, *args, "--operators", "lerp-k4", "--markdown", str(md))
    header, rows = rows[0], rows[1:]
    assert header[:4] == ["operator", "attention", "backend", "steps"] and header[6] == "× anchor"
    # the anchor (sdpa) is added and put first in each numerics group
    assert [r[:3] for r in rows] == [
        ["sdpa", "float32", "torch"],
        ["lerp-k4", "float32", "closed_form"],
        ["sdpa", "bfloat16", "torch"],
        ["lerp-k4", "bfloat16", "closed_form"],
    ]
    tokens = [float(r[4].replace(",", "")) for r in rows]
    for i in (0, 2):
        assert rows[i][6] == "1.00×"
        # against the anchor of its own dtype; the table's tokens/s are rounded to integers, the ratio is not
        ratio, (a, b) = float(rows[i + 1][6].rstrip("×")), (tokens[i], tokens[i + 1])
        assert (b - 0.5) / (a + 0.5) - 0.005 <= ratio <= (b + 0.5) / (a - 0.5) + 0.005
    for r in rows:
        assert r[3] == "6"  # 3 timed steps x 2 repeats, pooled
        lo, hi = (float(x.replace(",", "")) for x in r[5].split("–"))
        assert lo <= float(r[4].replace(",", "")) <= hi  # the median inside its interquartile range
    text = md.read_text()
    assert "micro-batch 4 ('max' off CUDA" in text and text.count("| lerp-k4 |") == 2


def bench_module():
    return runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"))


def test_benchmark_statistics_and_largest_micro_batch():
    import torch

    b = bench_module()
    r = b["summarize"]("op", "float32", "torch", [50.0, 10.0, 40.0, 20.0, 30.0], 1000, 0)
    assert r["steps"] == 5 and r["step_ms"] == 30.0 and r["step_ms_range"] == (10.0, 50.0)
    assert r["tokens_per_s"] == 1000 / 0.030
    assert r["tokens_per_s_iqr"] == (1000 / 0.040, 1000 / 0.020)  # from the 75th and 25th step time

    class FakeRow:  # one step fits up to `limit` sequences, then CUDA runs out of memory
        op, attention_dtype, device = "lerp-k4", "bfloat16", torch.device("cpu")

        def __init__(self, limit):
            self.limit, self.tried = limit, []
            self.opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

        def batch(self, mb):
            return torch.zeros(mb, 2)

        def step(self, x):
            self.tried.append(len(x))
            if len(x) > self.limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return torch.zeros(())

    row = FakeRow(limit=40)
    assert b["largest_micro_batch"](row, 8) == 32 and row.tried == [8, 16, 32, 64]
    row = FakeRow(limit=5)
    assert b["largest_micro_batch"](row, 8) == 4 and row.tried == [8, 4, 8]
    row = FakeRow(limit=1000)
    assert b["largest_micro_batch"](row, 8, cap=32) == 32 and row.tried == [8, 16, 32]
    with pytest.raises(RuntimeError, match="micro-batch 1 does not fit"):
        b["largest_micro_batch"](FakeRow(limit=0), 8)
    for bad in (["--attention-dtype", "float16"], ["--micro-batch", "lots"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            b["parse_args"](bad)


class _DemoLayers:
    """``run_demo`` with the layers below it replaced by recorders: ``prepare`` and ``train`` record their
    arguments (and the torch threads in use), ``load_run`` returns the run's operator as its "model" and
    ``evaluate_nll`` gives fixed per-block NLL: softmax 1, 2, 3, 4; every other operator softmax + 0.1, 0.3,
    0.2, 0.4 (ΔNLL 0.25, standard error std(ddof=1) / 2)."""

    DELTA = np.array([0.1, 0.3, 0.2, 0.4])

    def __init__(self, monkeypatch, status="completed"):
        from types import SimpleNamespace

        import torch

        from kinterval.train import demo

        self.prepared, self.trained = [], []
        val = self.val = np.arange(10, dtype=np.uint16)

        def prepare(source, out, **kw):
            self.prepared.append((source, Path(out), kw))

        def train(cfg, run, resume=False):
            self.trained.append((cfg, Path(run), resume, torch.get_num_threads()))
            Path(run).mkdir(parents=True, exist_ok=True)
            return SimpleNamespace(status=status, train_s=12.5, last_loss=3.25)

        def evaluate_nll(model, tokens, block_size):
            assert tokens is val and block_size == 128
            soft = np.array([1.0, 2.0, 3.0, 4.0])
            return soft if model == "softmax" else soft + self.DELTA

        monkeypatch.setattr(demo, "prepare", prepare)
        monkeypatch.setattr(demo, "train", train)
        monkeypatch.setattr(demo, "TokenShards", lambda data, split: SimpleNamespace(tokens=lambda: val))
        monkeypatch.setattr(demo, "load_run", lambda run: SimpleNamespace(model=Path(run).name))
        monkeypatch.setattr(demo, "evaluate_nll", evaluate_nll)


def test_demo_defaults_are_the_documented_protocol(tmp_path, monkeypatch):
    """docs/training.md: the default demo trains 600k tokens per operator (the tiny-cpu row), from the same
    seed (0 by default, as the README's demo protocol) on a 1,000,000-token synthetic corpus (README: "the
    demo's corpus"); softmax is always trained, first, as the reference; a finished run's recorded training
    time and loss are reported. Rows: ΔNLL = mean of the per-block differences to softmax and its standard
    error std(ddof=1) / sqrt(n). (The end-to-end test runs --quick only, which sets its own sizes.)"""
    from kinterval.train.demo import run_demo

    layers = _DemoLayers(monkeypatch)
    rows = run_demo(tmp_path, operators=["fwm-prob-k4"], progress=False)
    assert layers.prepared == [
        ("synthetic", tmp_path / "data", {"tokens": 1_000_000, "seed": 0, "progress": False})
    ]
    assert [(c.operator.name, run, resume) for c, run, resume, _ in layers.trained] == [
        ("softmax", tmp_path / "runs" / "softmax", True),
        ("fwm-prob-k4", tmp_path / "runs" / "fwm-prob-k4", True),
    ]
    for cfg, *_ in layers.trained:
        assert (cfg.schedule.tokens, cfg.seed, cfg.log.progress) == (600_000, 0, False)
        assert cfg.data.dir == str(tmp_path / "data")
    assert [r["operator"] for r in rows] == ["softmax", "fwm-prob-k4"]
    assert [(r["train_s"], r["train_loss"], r["blocks"]) for r in rows] == [(12.5, 3.25, 4)] * 2
    assert rows[0]["delta_nll"] == 0.0
    assert rows[1]["delta_nll"] == pytest.approx(0.25)  # worse than softmax: positive
    assert "delta_se" not in rows[1]  # the interval is the report's block bootstrap (demo_report), not iid


def test_demo_passes_tokens_and_seed_and_reuses_the_prepared_corpus(tmp_path, monkeypatch):
    """--tokens and --seed reach every run (and the corpus: docs/data.md, the synthetic corpus is
    deterministic from its seed); a folder that already holds the corpus is not prepared again (re-running
    the demo with the same --out reuses it)."""
    from kinterval.train.demo import run_demo

    layers = _DemoLayers(monkeypatch)
    run_demo(tmp_path, tokens=8192, operators=["softmax"], quick=True, seed=5, progress=False)
    assert [(p[2]["tokens"], p[2]["seed"]) for p in layers.prepared] == [(100_000, 5)]
    assert [(c.schedule.tokens, c.seed) for c, *_ in layers.trained] == [(8192, 5)]
    (tmp_path / "data" / "meta.json").parent.mkdir(parents=True)
    (tmp_path / "data" / "meta.json").write_text("{}")
    run_demo(tmp_path, operators=["softmax"], quick=True, seed=5, progress=False)
    assert len(layers.prepared) == 1


def test_demo_threads_are_set_for_the_runs_and_restored(tmp_path, monkeypatch):
    """run_demo's ``threads`` (docstring): torch's CPU threads during the runs, restored afterwards; 0 or None
    keep torch's setting (``kinterval demo --threads 0``)."""
    import torch

    from kinterval.train.demo import run_demo

    layers = _DemoLayers(monkeypatch)
    torch.set_num_threads(2)
    try:
        for threads, during in ((1, 1), (0, 2), (None, 2)):
            run_demo(tmp_path, operators=["softmax"], quick=True, progress=False, threads=threads)
            assert layers.trained[-1][3] == during and torch.get_num_threads() == 2, threads
    finally:
        torch.set_num_threads(1)


def test_a_demo_run_that_stops_is_an_error(tmp_path, monkeypatch):
    """A run that ends with a non-finite loss must not be evaluated and reported as if it had finished."""
    from kinterval.train.demo import run_demo

    _DemoLayers(monkeypatch, status="nonfinite_loss")
    with pytest.raises(ValueError, match="demo run softmax stopped: nonfinite_loss"):
        run_demo(tmp_path, operators=["softmax"], quick=True, progress=False)
    assert not (tmp_path / "runs" / "softmax" / "val_nll.npy").exists()


def test_demo_command_passes_its_flags_and_prints_the_reports_intervals(tmp_path, monkeypatch, capsys):
    """`kinterval demo`: its defaults are the documented ones (docs/training.md: softmax, minmax-weight-k4
    and fwm-prob-k4; 1 CPU thread; seed 0), each flag reaches run_demo (empty names in --operators are
    dropped), and the table prints what the report computed: the interval, "separated" exactly where the
    report says so (lower bound > +0.01, not > 0) and the report's bootstrap block."""
    import kinterval.report
    from kinterval.train import demo

    calls = []

    def run_demo(out, **kw):
        calls.append((out, kw))
        nll = {
            "softmax": np.array([1.0, 2.0]),
            "lerp-k4": np.array([1.2, 2.1]),
            "fwm-prob-k4": np.array([1, 2.01]),
        }
        return [
            {"operator": op, "val_nll": float(v.mean()), "blocks": 2, "train_s": 1.0,
             "delta_nll": float((v - nll["softmax"]).mean()), "per_block": v}
            for op, v in nll.items()
        ]  # fmt: skip

    shown_seeds = []

    def demo_report(per_block, out, seeds):
        assert list(per_block) == ["softmax", "lerp-k4", "fwm-prob-k4"] and out == tmp_path / "report"
        shown_seeds.append(seeds)  # the demo's seed, shown in the table's Seeds column
        rows = [
            {"operator": "lerp-k4", "lo": 0.05, "hi": 0.2, "separated": True, "block": 7},
            {"operator": "fwm-prob-k4", "lo": 0.004, "hi": 0.02, "separated": False, "block": 7},
        ]
        return {"rows": rows, "index": out / "index.md"}

    monkeypatch.setattr(demo, "run_demo", run_demo)
    monkeypatch.setattr(kinterval.report, "demo_report", demo_report)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # progress bars on a terminal only
    assert main(["demo", "--out", str(tmp_path)]) == 0
    assert calls[-1] == (
        tmp_path,
        {"tokens": None, "operators": ["softmax", "minmax-weight-k4", "fwm-prob-k4"], "quick": False,
         "seed": 0, "progress": True, "threads": 1},
    )  # fmt: skip
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line[:1].isalpha()}
    assert "[+0.0500, +0.2000] separated" in lines["lerp-k4"]
    assert "[+0.0040, +0.0200]" in lines["fwm-prob-k4"] and "separated" not in lines["fwm-prob-k4"]
    assert "(2 validation blocks;" in out and "block 7, 4000 resamples" in out
    assert f"report: {tmp_path / 'report' / 'index.md'}" in out

    # softmax alone: no interval, so no bootstrap legend (it printed "block 16" for a bootstrap never run)
    monkeypatch.setattr(
        kinterval.report, "demo_report", lambda per_block, out, seeds: {"rows": [], "index": out}
    )
    assert main(["demo", "--out", str(tmp_path), "--operators", "softmax"]) == 0
    out = capsys.readouterr().out
    assert (
        "(2 validation blocks; ΔNLL > 0: worse than softmax, nats/token)" in out and "bootstrap," not in out
    )
    monkeypatch.setattr(kinterval.report, "demo_report", demo_report)

    flags = ["--tokens", "8192", "--operators", "lerp-k4,,fwm-prob-k4,", "--seed", "3", "--quick"]
    assert main(["demo", "--out", str(tmp_path), *flags, "--threads", "0", "--no-progress"]) == 0
    kw = calls[-1][1]
    assert (kw["tokens"], kw["operators"], kw["seed"], kw["quick"]) == (
        8192,
        ["lerp-k4", "fwm-prob-k4"],
        3,
        True,
    )
    assert kw["progress"] is False and not kw["threads"]  # 0 or None: torch's setting
    assert shown_seeds == [0, 3]


def test_demo_trains_each_operator_once_under_its_canonical_name(tmp_path, monkeypatch):
    """--operators SOFTMAX,FWM-Prob-K4: softmax was added again beside "SOFTMAX" (two softmax runs), and the
    runs were named as typed. The names are canonical before anything is prepared or trained."""
    from kinterval.train import demo as demo_module

    trained = []

    class Stop(Exception):
        pass

    def fake_train(cfg, run, resume):
        trained.append((cfg.operator.name, run.name))
        run.mkdir(parents=True)
        if len(trained) == 2:
            raise Stop

        class Done:
            status, train_s, last_loss = "completed", 0.0, 0.0

        return Done()

    monkeypatch.setattr(demo_module, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(demo_module, "TokenShards", lambda *a: type("T", (), {"tokens": lambda self: None})())
    monkeypatch.setattr(demo_module, "train", fake_train)
    monkeypatch.setattr(demo_module, "load_run", lambda run: type("R", (), {"model": None})())
    monkeypatch.setattr(demo_module, "evaluate_nll", lambda *a: np.zeros(2))
    with pytest.raises(Stop):
        demo_module._run(tmp_path, None, ["SOFTMAX", "FWM-Prob-K4"], True, 0, False)
    assert trained == [("softmax", "softmax"), ("fwm-prob-k4", "fwm-prob-k4")]


def test_demo_prints_a_value_below_the_fourth_decimal_in_two_significant_digits(
    tmp_path, monkeypatch, capsys
):
    """`kinterval demo --quick` printed fwm's interval as "[-0.0001, -0.0000]": an interval that excludes 0
    read as one that touches it, and a Δ of -3e-05 as "-0.0000" (the report's tables print -3.0e-05)."""
    import kinterval.report
    from kinterval.train import demo

    def run_demo(out, **kw):
        return [
            {"operator": op, "val_nll": 5.5, "blocks": 64, "train_s": 1.0, "delta_nll": d, "per_block": None}
            for op, d in (("softmax", 0.0), ("fwm-prob-k4", -3e-05))
        ]

    def demo_report(per_block, out, seeds):
        rows = [{"operator": "fwm-prob-k4", "lo": -1e-04, "hi": -3e-05, "separated": False, "block": 16}]
        return {"rows": rows, "index": out / "index.md"}

    monkeypatch.setattr(demo, "run_demo", run_demo)
    monkeypatch.setattr(kinterval.report, "demo_report", demo_report)
    assert main(["demo", "--out", str(tmp_path), "--operators", "softmax,fwm-prob-k4", "--no-progress"]) == 0
    lines = {
        line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()
    }
    assert lines["softmax"][2] == "+0.0000"  # an exact zero stays 0.0000
    assert lines["fwm-prob-k4"][2:5] == ["-3.0e-05", "[-0.0001,", "-3.0e-05]"]


def test_the_quick_demo_sets_its_warmup_and_one_checkpoint_and_evaluates_the_validation_split(
    tmp_path, monkeypatch
):
    """--quick trains with its own warmup (4096 tokens: the default's 50,000 would exceed its 16,384 tokens)
    and one checkpoint; every demo evaluates on the validation split of its corpus, never on train."""
    from types import SimpleNamespace

    from kinterval.train import demo
    from kinterval.train.demo import run_demo

    layers = _DemoLayers(monkeypatch)
    read = []
    monkeypatch.setattr(
        demo,
        "TokenShards",
        lambda data, split: read.append((Path(data), split)) or SimpleNamespace(tokens=lambda: layers.val),
    )
    run_demo(tmp_path, operators=["lerp-k4"], quick=True, progress=False)
    assert read == [(tmp_path / "data", "val")]
    for cfg, *_ in layers.trained:
        assert (cfg.schedule.tokens, cfg.schedule.warmup_tokens, cfg.checkpoint.count) == (16_384, 4096, 1)


def test_demo_shows_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    """A log file or a pipe gets no bar, --no-progress or not (docs: "there is none when stderr is not a
    terminal")."""
    import kinterval.report
    from kinterval.train import demo

    calls = []
    rows = [
        {
            "operator": "softmax",
            "val_nll": 1.0,
            "blocks": 2,
            "train_s": 1.0,
            "delta_nll": 0.0,
            "per_block": None,
        }
    ]
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: calls.append(kw) or rows)
    monkeypatch.setattr(
        kinterval.report, "demo_report", lambda per_block, out, seeds: {"rows": [], "index": out}
    )
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main(["demo", "--out", str(tmp_path), "--operators", "softmax"]) == 0
    assert calls[-1]["progress"] is False
