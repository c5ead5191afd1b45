"""``kinterval demo``: the whole pipeline in minutes on a CPU.

Prepares the embedded synthetic corpus, trains softmax and K-interval operators from the same seed on the same
data order, evaluates each on the full validation split (per-block NLL, batch 1, TF32 off) and prints final
validation NLL and ΔNLL against softmax (positive: worse than softmax).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kinterval.data.loader import TokenShards
from kinterval.data.prepare import prepare
from kinterval.environment import check_threads_bound
from kinterval.model import operator_name
from kinterval.ops.seeds import check_seed
from kinterval.train.checkpoint import check_not_other_folder, check_outside_runs
from kinterval.train.config import TrainConfig
from kinterval.train.evaluate import evaluate_nll
from kinterval.train.load import load_run
from kinterval.train.loop import train

DEFAULT_OPERATORS = ("softmax", "minmax-weight-k4", "fwm-prob-k4")
FULL = {"data_tokens": 1_000_000, "tokens": 600_000}
QUICK = {"data_tokens": 100_000, "tokens": 16_384, "warmup_tokens": 4096}  # full: tiny-cpu.toml's warmup


def check_options(tokens, seed, quick: bool, flag: str = "") -> None:
    """A ValueError for ``tokens`` or ``seed`` (named ``{flag}tokens``, ``{flag}seed``: ``flag="--"`` from the
    CLI), raised before any data is prepared: a run's tokens must exceed the warmup the demo sets, which its
    users cannot change (too few failed after the corpus was prepared, naming schedule.warmup_tokens)."""
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"{flag}tokens must be a positive integer (left out: the default), got {tokens!r}")
    warmup = QUICK["warmup_tokens"] if quick else TrainConfig.from_toml("tiny-cpu").schedule.warmup_tokens
    if tokens is not None and tokens <= warmup:
        mode = "quick" if quick else "full"
        raise ValueError(f"{flag}tokens must be at least {warmup + 1} for the {mode} demo (more than its "
                         f"{warmup} warmup tokens), got {tokens}")  # fmt: skip
    check_seed(seed, f"{flag}seed")


def run_demo(
    out: str | Path | None = None,
    *,
    tokens: int | None = None,
    operators=DEFAULT_OPERATORS,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    threads: int | None = 1,
) -> list[dict]:
    """Run the demo; returns one row per operator {operator, val_nll, delta_nll, train_s, train_loss}.

    ``threads`` sets torch's CPU threads for the run (1 by default: the tiny model gains little from more, and
    OpenMP spin-waiting on a busy machine can make it many times slower); None keeps torch's setting.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise ValueError(f"threads must be an integer >= 0 (0 or None: torch's setting), got {threads!r}")
    if threads:
        check_threads_bound(threads)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(out, tokens, operators, quick, seed, progress)
    finally:
        torch.set_num_threads(old_threads)


def _run(out, tokens, operators, quick, seed, progress) -> list[dict]:
    operators = [operators] if isinstance(operators, str) else list(operators)
    check_options(tokens, seed, quick)
    if not operators:
        raise ValueError("operators names no operator (softmax is added to those given)")
    # canonical names (every one checked before any data or training): "SOFTMAX" is the softmax reference
    operators = [operator_name(op) for op in operators]
    twice = sorted({n for n in operators if operators.count(n) > 1})
    if twice:
        raise ValueError(f"operators names {', '.join(twice)} more than once: each operator trains one run")
    if "softmax" not in operators:
        operators.insert(0, "softmax")
    sizes = QUICK if quick else FULL
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="kinterval-demo-"))
    out = Path(out)
    check_outside_runs(out, "the demo's data and runs would mix with the run's")
    check_not_other_folder(out, "the demo")  # its runs/ and data/ would go in beside that folder's own
    data = out / "data"
    if not (data / "meta.json").is_file():
        prepare("synthetic", data, tokens=sizes["data_tokens"], seed=seed, progress=progress)
    base = TrainConfig.from_toml("tiny-cpu").override(
        {
            "data.dir": str(data),
            "seed": seed,
            "schedule.tokens": tokens or sizes["tokens"],
            "log.progress": progress,
        }
    )
    if quick:
        base = base.override({"schedule.warmup_tokens": QUICK["warmup_tokens"], "checkpoint.count": 1})
    val = TokenShards(data, "val").tokens()
    rows = []
    for op in operators:
        run = out / "runs" / op
        cfg = base.override({"operator.name": op})
        t0 = time.perf_counter()
        result = train(cfg, run, resume=True)  # resume: re-running the demo reuses finished runs
        if result.status != "completed":
            raise ValueError(f"demo run {op} stopped: {result.status}")
        # A reused run reports the training time recorded in its checkpoint, not this call's.
        train_s = result.train_s if result.train_s is not None else time.perf_counter() - t0
        nll = evaluate_nll(load_run(run).model, val, cfg.block_size)
        np.save(run / "val_nll.npy", nll)
        rows.append(
            {
                "operator": op,
                "val_nll": float(nll.mean()),
                "blocks": len(nll),
                "train_s": train_s,
                "train_loss": result.last_loss,
                "per_block": nll,
            }
        )
    ref = next(r for r in rows if r["operator"] == "softmax")["per_block"]
    for r in rows:
        d = r["per_block"] - ref
        r["delta_nll"] = float(d.mean())
    return rows
