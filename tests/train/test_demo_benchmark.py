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


@pytest.mark.parametrize(
    "flags, message",
    [(["--tokens", "0"], "tokens must be a positive integer"), (["--threads", "-1"], "threads must be"),
     (["--operators", "softmax,bogus"], "unknown operator name 'bogus'")],
)  # fmt: skip
def test_demo_checks_its_flags_before_any_work(tmp_path, capsys, flags, message):
    """--tokens 0 silently meant the default, --threads -1 was torch's RuntimeError, and an unknown operator
    failed only after the data was prepared and softmax trained."""
    assert main(["demo", "--quick", "--out", str(tmp_path / "d"), "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_benchmark_cpu_smoke(monkeypatch, capsys):
    args = ("--micro-batch", "2", "--steps", "1", "--operators", "sdpa,softmax,lerp-k4")
    rows = run_benchmark(monkeypatch, capsys, *args)[1:]  # without the header row
    assert [r[:2] for r in rows] == [["sdpa", "float32"], ["softmax", "float32"], ["lerp-k4", "float32"]]
    assert rows[0][6] == "1.00×"


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
        assert rows[i + 1][6] == f"{tokens[i + 1] / tokens[i]:.2f}×"  # against the anchor of its own dtype
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
