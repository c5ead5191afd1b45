"""Training throughput and peak memory per attention operator, beside its SDPA anchor of the same numerics.

Times full optimizer steps (forward, backward, AdamW with clipping) of a GPT under the training numerics (bf16
autocast outside attention on CUDA, TF32 on) on random tokens, one step at a time, and prints one table: the
median tokens/s with its spread (interquartile range over steps, and the fastest and slowest step).

Attention numerics (``--attention-dtype``, both may be given): ``float32`` is the paper's policy (fp32 q, k,
v, TF32 dots), its anchor SDPA's fp32 kernel (memory-efficient attention); ``bfloat16`` rounds q, k, v to
bf16 (the operator maths stays fp32), its anchor SDPA flash in bf16. Each row's "× anchor" is its tokens/s
over the anchor's, measured in the same run.

    python benchmarks/train_throughput.py                                # GPT-2 124M, default operators
    python benchmarks/train_throughput.py --attention-dtype float32,bfloat16 --micro-batch max --steps 100
    python benchmarks/train_throughput.py --backend closed_form --operators softmax,lerp-k4
    python benchmarks/train_throughput.py --model tiny --device cpu --steps 3   # CPU smoke check
    python benchmarks/train_throughput.py --n-kv-head 4 --rope-theta 10000     # Llama-style attention

Without a CUDA GPU it stops with a message unless ``--device cpu`` is given. The table (stdout and
``--markdown``) starts with a '# ' line naming the device (and driver), torch, triton and the git commit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import resource
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from kinterval.model import GPT, SDPA, autocast, preset, train_precision
from kinterval.model.config import ATTENTION_DTYPES, ModelConfig
from kinterval.model.gpt import compile_blocks
from kinterval.ops import resolve_backend
from kinterval.ops.commands import split_operators

DEFAULT_OPERATORS = "sdpa,softmax,minmax-weight-k4,fwm-prob-k4"
ANCHOR = {"float32": "SDPA fp32 (memory-efficient on CUDA)", "bfloat16": "SDPA bf16 (flash on CUDA)"}
CPU_MICRO_BATCH = 4  # "--micro-batch max" off CUDA: no memory limit worth probing
MAX_DOUBLINGS = 12


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-124m", help="preset (gpt2-124m, gpt2-1b, small, tiny)")
    p.add_argument(
        "--operators", default=DEFAULT_OPERATORS, help="comma-separated; 'sdpa' (the anchor) is always run"
    )
    p.add_argument("--backend", default="auto", help="auto | reference | closed_form | triton")
    p.add_argument(
        "--attention-dtype",
        default="float32",
        help="float32 (the paper's policy), bfloat16 (bf16 q, k, v), or both comma-separated",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument(
        "--micro-batch",
        default="8",
        help="sequences per step, or 'max' (alias 'auto'): on CUDA the largest power of two that fits every "
        f"row, doubling from --micro-batch-start until out of memory; elsewhere {CPU_MICRO_BATCH}",
    )
    p.add_argument(
        "--micro-batch-start",
        type=int,
        default=8,
        help="first size 'max' tries (halved while it does not fit); the kernels autotune at this size",
    )
    p.add_argument(
        "--micro-batch-cap", type=int, default=0, help="'max' stops doubling at this size (0: no cap)"
    )
    p.add_argument("--block-size", type=int, help="sequence length (default: the preset's context)")
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--steps", type=int, default=100, help="timed optimizer steps per row (and per repeat)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (kernel compilation, caches)")
    p.add_argument(
        "--repeats", type=int, default=1, help="interleaved passes over the rows; their steps are pooled"
    )
    p.add_argument(
        "--precompile",
        type=int,
        default=min(16, os.cpu_count() or 1),
        help="CUDA: processes that fill Triton's kernel cache with every autotune candidate first (0: off)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each block, as `kinterval train --compile` (the K-interval operator stays eager)",
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block in the backward, as `kinterval train --activation-checkpointing`",
    )
    p.add_argument(
        "--n-kv-head",
        type=int,
        help="grouped-query attention: key/value heads of every row's model, the anchor's too (default none)",
    )
    p.add_argument(
        "--rope-theta",
        type=float,
        help="rotary positions with this base in every row's model (default: none)",
    )
    p.add_argument("--markdown", help="also write the table to this file (rewritten after every row)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    args = p.parse_args(argv)
    args.attention_dtypes = [d.strip() for d in args.attention_dtype.split(",") if d.strip()]
    bad = [d for d in args.attention_dtypes if d not in ATTENTION_DTYPES]
    if bad or not args.attention_dtypes:
        p.error(f"--attention-dtype: choose from {ATTENTION_DTYPES}, got {args.attention_dtype!r}")
    if args.micro_batch not in ("max", "auto") and not (
        args.micro_batch.isdigit() and int(args.micro_batch) > 0
    ):
        p.error(f"--micro-batch must be a positive integer or 'max', got {args.micro_batch!r}")
    for name in ("steps", "micro_batch_start"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.compile and args.warmup < 1:  # a timed step would hold the compilation
        p.error("--compile compiles the blocks during the warm-up steps: give --warmup 1 or more")
    ops = split_operators(args.operators)  # a comma inside [...] separates overrides, not names
    args.ops = [SDPA] + [o for o in ops if o != SDPA]  # the anchor first in every numerics group
    return args


def model_preset(args) -> ModelConfig:
    """The rows' model: the preset at --block-size, with the attention options --n-kv-head and --rope-theta
    (both of which SDPA, the anchor, runs too); a bad value is a ValueError naming the field."""
    return preset(
        args.model, vocab_size=args.vocab_size, block_size=args.block_size, n_kv_head=args.n_kv_head,
        rope_theta=args.rope_theta,
    )  # fmt: skip


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process high-water mark (not per row)


def sdpa_backend(op: str, attention_dtype: str, device: torch.device):
    """(a context factory, label): the anchor's SDPA kernel, pinned on CUDA (flash for bf16 inputs,
    memory-efficient for fp32: flash has no fp32 kernel); elsewhere PyTorch's choice."""
    if op != SDPA or device.type != "cuda":
        return contextlib.nullcontext, "torch"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if attention_dtype == "bfloat16":
        return functools.partial(sdpa_kernel, SDPBackend.FLASH_ATTENTION), "sdpa-flash"
    return functools.partial(sdpa_kernel, SDPBackend.EFFICIENT_ATTENTION), "sdpa-efficient"


class Row:
    """One (operator, attention dtype): a fresh model and optimizer, and its training step."""

    def __init__(self, op: str, attention_dtype: str, args, device: torch.device):
        base = model_preset(args)
        self.cfg = replace(base, numerics=replace(base.numerics, attention_dtype=attention_dtype))
        self.cfg.validate()
        self.op, self.attention_dtype, self.device = op, attention_dtype, device
        torch.manual_seed(0)
        with torch.device(device):  # built on the device: a 124M model initializes in a fraction of a second
            self.model = GPT(self.cfg, op, args.backend)
        self.model.activation_checkpointing = args.activation_checkpointing
        if args.compile:  # compiled at the first (warm-up) step
            compile_blocks(self.model)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
        )
        self.pin, self.backend = sdpa_backend(op, attention_dtype, device)
        if op != SDPA:
            dtype = getattr(torch, attention_dtype)
            self.backend = resolve_backend(op, device, dtype, backend=args.backend)  # what runs

    def batch(self, micro_batch: int) -> torch.Tensor:
        g = torch.Generator(device=self.device).manual_seed(micro_batch)
        T = self.cfg.block_size
        return torch.randint(0, self.cfg.vocab_size, (micro_batch, T + 1), device=self.device, generator=g)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        with self.pin(), train_precision(self.cfg.numerics):  # a fresh context each step (single-use)
            with autocast(self.cfg.numerics, self.device):
                _, loss = self.model(x[:, :-1], x[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return loss

    def timed_steps(self, x: torch.Tensor, warmup: int, steps: int) -> list[float]:
        """Milliseconds of each of ``steps`` steps after ``warmup``: CUDA events around every step (no host
        synchronization in between), wall clock on CPU."""
        for _ in range(warmup):
            self.step(x)
        if self.device.type != "cuda":
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                self.step(x).item()
                times.append(1e3 * (time.perf_counter() - t0))
            return times
        torch.cuda.synchronize(self.device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        events[0].record()
        for i in range(steps):
            self.step(x)
            events[i + 1].record()
        torch.cuda.synchronize(self.device)
        return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fits(row: Row, micro_batch: int) -> bool:
    try:
        row.step(row.batch(micro_batch))
        if row.device.type == "cuda":
            torch.cuda.synchronize(row.device)
        return True
    except RuntimeError as err:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if not is_oom(err):
            raise
    row.opt.zero_grad(set_to_none=True)  # outside the except block: its traceback holds the activations
    free(row.device)
    return False


def largest_micro_batch(row: Row, start: int, cap: int = 0) -> int:
    """The largest power-of-two multiple (or fraction) of ``start`` for which one step of ``row`` fits, up to
    ``cap`` (0: none)."""
    mb = start if not cap else min(start, cap)
    while not fits(row, mb):
        if mb == 1:
            raise RuntimeError(f"{row.op} ({row.attention_dtype}): micro-batch 1 does not fit")
        mb //= 2
    for _ in range(MAX_DOUBLINGS):
        if (cap and 2 * mb > cap) or not fits(row, 2 * mb):
            break
        mb *= 2
    return mb


def choose_micro_batch(args, device: torch.device) -> tuple[int, str]:
    if args.micro_batch not in ("max", "auto"):
        return int(args.micro_batch), "--micro-batch"
    if device.type != "cuda":
        return CPU_MICRO_BATCH, "'max' off CUDA: a small fixed size"
    sizes = {}
    for dt in args.attention_dtypes:
        for op in args.ops:
            try:
                row = Row(op, dt, args, device)
                sizes[(op, dt)] = largest_micro_batch(row, args.micro_batch_start, args.micro_batch_cap)
                print(f"largest micro-batch, {op} ({dt}): {sizes[(op, dt)]}", file=sys.stderr, flush=True)
            except (RuntimeError, ValueError) as err:  # the row shows its error in the table
                print(f"{op} ({dt}) not probed: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
            row = None
            free(device)
    if not sizes:
        raise SystemExit("--micro-batch max: no row runs on this device")
    capped = f", capped at {args.micro_batch_cap}" if args.micro_batch_cap else ""
    return min(sizes.values()), f"the largest power of two that fits every row{capped}"


def _compile_worker(job) -> str:
    """fwd+bwd of the fused kernel at one head's training shape (1, H, T, D): the autotuner compiles every
    candidate into Triton's disk cache, where the timing process finds them. H, T and D are the model's, so
    that Triton's integer specialisation (divisibility by 16) matches the timed calls."""
    op, dtype_name, precision, H, T, D, *kv = job
    from kinterval.ops.triton import triton_attention

    g = torch.Generator().manual_seed(0)
    heads = (H, *(kv or [H]) * 2, H)  # --n-kv-head: the group size H / kv is a specialised argument too
    q, k, v, do = (torch.randn(1, h, T, D, generator=g).to("cuda", getattr(torch, dtype_name)) for h in heads)
    for x in (q, k, v):
        x.requires_grad_()
    triton_attention(q, k, v, op, causal=True, precision=precision).backward(do)
    torch.cuda.synchronize()
    return op


def precompile(args, device: torch.device) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    cfg = model_preset(args)
    jobs = []
    for dt in args.attention_dtypes:
        precision = "tf32" if cfg.numerics.tf32_train else "ieee"  # what fp32 inputs get in training
        for op in args.ops:
            if (
                op != SDPA
                and resolve_backend(op, device, getattr(torch, dt), backend=args.backend) == "triton"
            ):
                jobs.append((op, dt, precision if dt == "float32" else None, cfg.n_head, cfg.block_size,
                             cfg.n_embd // cfg.n_head, cfg.kv_heads))  # fmt: skip
    if not jobs:
        return
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(min(args.precompile, len(jobs)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_worker, jobs))
    print(f"precompiled {len(jobs)} kernels in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


def header_line(device: torch.device) -> str:
    """The line that starts the table: what measured it (benchmarks/provenance.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the benchmarks' shared module
    from provenance import provenance

    return f"# kinterval training throughput; {provenance(device)}"


def summarize(op: str, dt: str, backend: str, times_ms: list[float], tokens_per_step: int, peak: int) -> dict:
    t = np.asarray(times_ms)
    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return {
        "operator": op,
        "attention": dt,
        "backend": backend,
        "steps": len(t),
        "tokens_per_s": tokens_per_step / (q50 / 1e3),  # from the median step time
        "tokens_per_s_iqr": (tokens_per_step / (q75 / 1e3), tokens_per_step / (q25 / 1e3)),
        "step_ms": float(q50),
        "step_ms_range": (float(t.min()), float(t.max())),
        "peak_mem": peak,
    }


def table(rows: list[dict], header: str) -> str:
    anchors = {r["attention"]: r["tokens_per_s"] for r in rows if r["operator"] == SDPA and "error" not in r}
    lines = [
        header,
        "",
        "| operator | attention | backend | steps | tokens/s | tokens/s IQR | × anchor | step ms "
        "| step ms min–max | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            why = r["error"].replace("|", "/")  # a '|' of the message would split the Markdown row
            lines.append(f"| {r['operator']} | {r['attention']} | error: {why} | | | | | | | |")
            continue
        anchor = anchors.get(r["attention"])
        rel = f"{r['tokens_per_s'] / anchor:.2f}×" if anchor else "-"
        lo, hi = r["tokens_per_s_iqr"]
        fast, slow = r["step_ms_range"]
        lines.append(
            f"| {r['operator']} | {r['attention']} | {r['backend']} | {r['steps']} | "
            f"{r['tokens_per_s']:,.0f} | {lo:,.0f}–{hi:,.0f} | {rel} | {r['step_ms']:.1f} | "
            f"{fast:.1f}–{slow:.1f} | {r['peak_mem'] / 2**30:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device != "cpu" and not torch.cuda.is_available():  # GPT-2 124M on a CPU would run for hours
        print(
            f"benchmarks/train_throughput.py: no CUDA GPU found (--device {args.device}); pass --device cpu "
            "to measure on the CPU (a smoke check: --model tiny --device cpu --steps 3)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    device = torch.device("cpu" if args.device == "cpu" else "cuda")
    if device.type == "cuda" and args.precompile > 0:
        precompile(args, device)
    micro_batch, how = choose_micro_batch(args, device)
    T = args.block_size or preset(args.model, vocab_size=args.vocab_size).block_size
    combos = [(op, dt) for dt in args.attention_dtypes for op in args.ops]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in combos}
    info: dict[tuple[str, str], dict] = {}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    anchors = ", ".join(f"{dt}: {ANCHOR[dt]}" for dt in args.attention_dtypes)
    header = (
        header_line(device)
        + "\n\n"
        + (
            f"model {args.model}, T {T}, micro-batch {micro_batch} ({how}), device {name}, "
            f"torch {torch.__version__}; {args.steps} timed steps per row after {args.warmup} warm-up"
            + (f", {args.repeats} interleaved repeats pooled" if args.repeats > 1 else "")
            + (", blocks compiled (torch.compile; the K-interval operator eager)" if args.compile else "")
            + (", activation checkpointing" if args.activation_checkpointing else "")
            + (f", {args.n_kv_head} key/value heads" if args.n_kv_head else "")
            + (f", rotary positions (theta {args.rope_theta:g})" if args.rope_theta else "")
            + f"; anchors: {anchors}"
        )
    )

    def current_rows() -> list[dict]:
        return [info[c] if "error" in info.get(c, {}) else _row(c) for c in combos if c in info]

    def _row(c) -> dict:
        return summarize(*c, info[c]["backend"], times[c], micro_batch * T, info[c]["peak_mem"])

    for _ in range(max(1, args.repeats)):  # interleaved, so that drift and order effects hit every row
        for op, dt in combos:
            if "error" in info.get((op, dt), {}):
                continue
            try:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                row = Row(op, dt, args, device)
                times[(op, dt)] += row.timed_steps(row.batch(micro_batch), args.warmup, args.steps)
                info[(op, dt)] = {"backend": row.backend, "peak_mem": peak_memory(device)}
            except (RuntimeError, ValueError) as err:  # e.g. CUDA out of memory: report and go on
                info[(op, dt)] = {"operator": op, "attention": dt, "error": str(err).splitlines()[0][:80]}
            row = None
            free(device)
            print(f"measured {op} ({dt})", file=sys.stderr, flush=True)
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write(table(current_rows(), header))
    print(table(current_rows(), header), end="")
    if device.type == "cpu":
        print("(CPU: peak mem is the process high-water mark so far, not per operator)")


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # a bad argument (an unknown preset or operator): its message, not a traceback
        print(f"train_throughput.py: error: {err}", file=sys.stderr)
        sys.exit(2)
