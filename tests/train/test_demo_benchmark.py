"""The demo end to end (--quick) and a CPU smoke run of the throughput benchmark."""

import runpy
import sys
from pathlib import Path

import numpy as np

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


def test_benchmark_cpu_smoke(monkeypatch, capsys):
    argv = [
        "train_throughput.py",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--vocab-size",
        "64",
        "--block-size",
        "16",
        "--micro-batch",
        "2",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--operators",
        "sdpa,softmax,lerp-k4",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(ROOT / "benchmarks" / "train_throughput.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "tokens/s" in out and "error" not in out
    rows = [
        line.split() for line in out.splitlines() if line.split()[:1] in (["sdpa"], ["softmax"], ["lerp-k4"])
    ]
    assert len(rows) == 3 and rows[0][3] == "1.00x"
