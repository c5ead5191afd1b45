"""Training throughput and peak memory per attention operator, against PyTorch SDPA softmax.

Times full optimizer steps (forward, backward, AdamW) of a GPT under the training numerics (bf16 autocast
outside attention on CUDA, fp32 operator, TF32 on) on random tokens, and prints one table.

    python benchmarks/train_throughput.py                                # GPT-2 124M, default operators
    python benchmarks/train_throughput.py --backend closed_form --operators softmax,lerp-k4
    python benchmarks/train_throughput.py --model tiny --device cpu --steps 3   # CPU smoke check
"""

from __future__ import annotations

import argparse
import gc
import resource
import time

import torch

from kinterval.model import GPT, autocast, preset, train_precision
from kinterval.ops import resolve_backend

DEFAULT_OPERATORS = "softmax,sdpa,minmax-weight-k4,fwm-prob-k4"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-124m", help="preset (gpt2-124m, gpt2-1b, small, tiny)")
    p.add_argument(
        "--operators", default=DEFAULT_OPERATORS, help="comma-separated; 'sdpa' is PyTorch softmax"
    )
    p.add_argument("--backend", default="auto", help="auto | reference | closed_form | triton")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--block-size", type=int, help="sequence length (default: the preset's context)")
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (kernel compilation, caches)")
    p.add_argument(
        "--repeats", type=int, default=1, help="interleaved passes over the operators; median shown"
    )
    p.add_argument("--threads", type=int, help="torch CPU threads")
    return p.parse_args(argv)


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process high-water mark (not per row)


def measure(op: str, args, device: torch.device) -> dict:
    cfg = preset(args.model, vocab_size=args.vocab_size, block_size=args.block_size)
    T = cfg.block_size
    torch.manual_seed(0)
    model = GPT(cfg, op, args.backend).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )
    x = torch.randint(0, cfg.vocab_size, (args.micro_batch, T + 1), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        with autocast(cfg.numerics, device):
            _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    with train_precision(cfg.numerics):
        for _ in range(args.warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
    backend = "torch" if op == "sdpa" else resolve_backend(op, device, backend=args.backend)  # what ran
    row = {
        "operator": op,
        "backend": backend,
        "tokens_per_s": args.steps * args.micro_batch * T / dt,
        "step_ms": 1e3 * dt / args.steps,
        "peak_mem": peak_memory(device),
    }
    return row


def _median_row(runs: list[dict]) -> dict:
    """The run with the median tokens/s (an error if any run failed)."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    return sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    ops = [o.strip() for o in args.operators.split(",") if o.strip()]
    runs: dict[str, list[dict]] = {op: [] for op in ops}
    for _ in range(max(1, args.repeats)):  # interleaved, so that drift and order effects hit every operator
        for op in ops:
            try:
                runs[op].append(measure(op, args, device))
            except (RuntimeError, ValueError) as err:  # e.g. CUDA out of memory: report and go on
                runs[op].append({"operator": op, "error": str(err).splitlines()[0][:60]})
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    rows = [_median_row(runs[op]) for op in ops]
    sdpa = next((r["tokens_per_s"] for r in rows if r["operator"] == "sdpa" and "error" not in r), None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"model {args.model}, micro-batch {args.micro_batch}, device {name}, torch {torch.__version__}, "
        f"{args.steps} timed steps after {args.warmup} warmup, median of {max(1, args.repeats)} interleaved "
        "runs"
    )
    print(f"{'operator':<22}{'backend':<13}{'tokens/s':>12}{'vs sdpa':>9}{'step ms':>10}{'peak mem GiB':>14}")
    for r in rows:
        if "error" in r:
            print(f"{r['operator']:<22}error: {r['error']}")
            continue
        rel = f"{r['tokens_per_s'] / sdpa:.2f}x" if sdpa else "-"
        print(
            f"{r['operator']:<22}{r['backend']:<13}{r['tokens_per_s']:>12,.0f}{rel:>9}{r['step_ms']:>10.1f}"
            f"{r['peak_mem'] / 2**30:>14.2f}"
        )
    if device.type == "cpu":
        print("(CPU: peak mem is the process high-water mark so far, not per operator)")


if __name__ == "__main__":
    main()
