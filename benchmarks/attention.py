"""Benchmark the fused Triton kernels against SDPA flash and the reference backend (eager and torch.compile).

One run prints ONE table; each row is (operator, dtype mode, T, D), with columns

    fwd ms | f+b ms | TFLOP/s | SDPA f+b ms | x SDPA | x ref eager | x ref compiled | peak MiB | ref MiB

* fwd+bwd FLOPs follow FlashAttention's convention: causal forward 4 B H T^2 D / 2, backward 2.5 x forward;
* "x SDPA" = kernel fwd+bwd time / SDPA flash (softmax) fwd+bwd time at the same shape, in bf16 (flash has no
  fp32 kernel, so fp32 rows -- TF32 or IEEE dots -- are compared with bf16 flash, as the targets are stated);
* "x ref eager" / "x ref compiled" = reference-backend fwd+bwd time / kernel time (> 1: the kernel is faster);
  "OOM" where the reference does not fit in memory, "-" where it was not run (see --ref-max-t, --compile-t);
* times are medians of ``triton.testing.do_bench``; every call rotates through several input sets so that no
  call finds its inputs in L2 from the previous one; peak MiB is the peak allocation of one fwd+bwd call
  above the inputs.

Usage (GPU):  python benchmarks/attention.py [--ops lerp-k4,fwm-prob-k4] [--dtypes bf16,tf32,ieee]
              [--T 512,1024,2048,4096,8192] [--D 64,128] [--tokens 16384] [--model-dim 2048] [--csv out.csv]
On a machine without CUDA it refuses, unless ``--smoke``: a tiny shape in Triton's CPU interpreter (timings
meaningless; checks that the script and kernels run end to end).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

DEFAULT_OPS = "softmax,lerp-k4,minmax-weight-k4,minmax-prob-k4,fwm-weight-k4,fwm-prob-k4"
DTYPE_MODES = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "tf32": ("float32", "tf32"),
               "ieee": ("float32", "ieee")}  # fmt: skip
COLUMNS = ["operator", "dtype", "T", "D", "B", "H", "fwd ms", "f+b ms", "TFLOP/s", "SDPA f+b ms", "x SDPA",
           "x ref eager", "x ref compiled", "peak MiB", "ref MiB", "tiles"]  # fmt: skip


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=DEFAULT_OPS, help="comma-separated operator names (default: %(default)s)")
    p.add_argument("--dtypes", default="bf16,tf32", help="comma-separated from bf16, fp16, tf32, ieee")
    p.add_argument("--T", default="512,1024,2048,4096,8192", help="sequence lengths (Tq = Tk)")
    p.add_argument("--D", default="64,128", help="head dims")
    p.add_argument("--tokens", type=int, default=16384, help="B * T held fixed (FlashAttention's convention)")
    p.add_argument("--model-dim", type=int, default=2048, help="H * D held fixed")
    p.add_argument("--no-causal", action="store_true", help="full attention instead of causal")
    p.add_argument(
        "--ref-max-t", type=int, default=8192, help="largest T at which the eager reference is tried"
    )
    p.add_argument("--compile-t", default="1024", help="T values at which torch.compile(reference) is timed "
                   "('' for none; compiling costs ~1 min per shape)")  # fmt: skip
    p.add_argument("--compile-ops", default="minmax-weight-k4,fwm-prob-k4",
                   help="operators whose compiled reference is timed ('all' for every operator)")  # fmt: skip
    p.add_argument("--compile-dtypes", default="tf32", help="dtype modes whose compiled reference is timed")
    p.add_argument("--compile-D", default="64", help="head dims at which the compiled reference is timed")
    p.add_argument("--precompile", type=int, default=min(16, os.cpu_count() or 1),
                   help="worker processes that fill Triton's kernel cache (every autotune candidate of every "
                   "operator/dtype/D) before timing; 0 = compile lazily in the timing process")  # fmt: skip
    p.add_argument("--no-sdpa", action="store_true")
    p.add_argument("--rotate", type=int, default=3, help="input sets rotated between calls")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warmup (ms)")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetitions (ms)")
    p.add_argument("--csv", default=None, help="also write the table as CSV")
    p.add_argument("--smoke", action="store_true", help="tiny run; on CPU in the Triton interpreter")
    return p.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        if not args.smoke:
            print(
                "benchmarks/attention.py needs a CUDA GPU (none found); use --smoke for a tiny "
                "CPU-interpreter run that only checks the script end to end.",
                file=sys.stderr,
            )
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before triton / the kernels are imported
    import triton  # noqa: F401

    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.triton import triton_attention

    device = "cuda" if on_gpu else "cpu"
    ops = [OperatorSpec.from_full_name(n) for n in args.ops.split(",") if n.strip()]
    modes = [m.strip() for m in args.dtypes.split(",") if m.strip()]
    for m in modes:
        if m not in DTYPE_MODES:
            raise SystemExit(f"unknown dtype mode {m!r}; choose from {sorted(DTYPE_MODES)}")
    Ts, Ds = _ints(args.T), _ints(args.D)
    compile_ts = set(_ints(args.compile_t))
    if args.smoke:
        Ts, Ds, compile_ts = [64] if not on_gpu else [256], [32] if not on_gpu else [64], set()
        args.tokens, args.model_dim = Ts[0], 2 * Ds[0]
        if not on_gpu:
            ops, modes = ops[:2], modes[:1]
    causal = not args.no_causal
    compile_ops = None if args.compile_ops == "all" else set(args.compile_ops.split(","))
    compile_modes, compile_ds = set(args.compile_dtypes.split(",")), set(_ints(args.compile_D))
    if on_gpu and args.precompile > 0:
        _precompile(ops, modes, Ds, causal, args.precompile)

    bench = _make_bench(on_gpu, args)
    rows = []
    sdpa_cache: dict = {}
    try:  # SIGINT (e.g. `timeout -s INT`) still prints the rows measured so far
        for D in Ds:
            H = max(1, args.model_dim // D)
            for T in Ts:
                B = max(1, args.tokens // T)
                for mode in modes:
                    dtype = getattr(torch, DTYPE_MODES[mode][0])
                    precision = DTYPE_MODES[mode][1]
                    sets = _inputs(B, H, T, D, dtype, device, args.rotate)
                    sdpa_ms = None
                    if on_gpu and not args.no_sdpa:
                        key = (B, H, T, D)
                        if key not in sdpa_cache:
                            sdpa_cache[key] = _time_sdpa(bench, B, H, T, D, device, causal, args.rotate)
                        sdpa_ms = sdpa_cache[key]
                    for spec in ops:
                        wanted = compile_ops is None or spec.full_name in compile_ops
                        run_compiled = (
                            wanted and T in compile_ts and mode in compile_modes and D in compile_ds
                        )
                        t_row = time.perf_counter()
                        row = _measure(bench, spec, sets, causal, precision, on_gpu, T <= args.ref_max_t,
                                       run_compiled, triton_attention, kinterval_attention)  # fmt: skip
                        fb = row["f+b ms"]
                        row["tiles"] = _tiles()  # the tiles the autotuner chose (or the defaults)
                        flops_fwd = 4 * B * H * T * T * D / (2 if causal else 1)
                        row.update({"operator": spec.full_name, "dtype": mode, "T": T, "D": D, "B": B, "H": H,
                                    "TFLOP/s": (3.5 * flops_fwd / (fb * 1e-3) / 1e12) if fb else None,
                                    "SDPA f+b ms": sdpa_ms,
                                    "x SDPA": (fb / sdpa_ms) if (fb and sdpa_ms) else None})  # fmt: skip
                        rows.append(row)
                        print(
                            f"{_fmt_row(row)}  [{time.perf_counter() - t_row:.0f} s; {row['tiles']}]",
                            file=sys.stderr,
                            flush=True,
                        )  # progress on stderr; fmt: skip
                    del sets
                    if on_gpu:
                        torch.cuda.empty_cache()
    except KeyboardInterrupt:
        print(f"interrupted after {len(rows)} rows", file=sys.stderr)
    _print_table(rows, device, on_gpu)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c) for c in COLUMNS})
    return 0


# ------------------------------------------------------------------------------------------ precompile
def _compile_worker(job):
    """Run fwd+bwd once at a small shape: the autotuner compiles every candidate into Triton's disk cache,
    where the timing process finds them. Same specialisation as the timed shapes: Triton specialises integer
    arguments on divisibility by 16, so H, T and the strides must all be multiples of 16 here as there."""
    name, dtype_name, precision, D, causal = job
    import torch

    from kinterval.ops.triton import triton_attention

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (
        torch.randn(1, 16, 256, D, generator=g).to("cuda", getattr(torch, dtype_name)) for _ in range(4)
    )
    for x in (q, k, v):
        x.requires_grad_()
    triton_attention(q, k, v, name, causal=causal, precision=precision).backward(do)
    torch.cuda.synchronize()
    return name


def _tiles() -> str:
    """BLOCK_M x BLOCK_N / warps / stages that each kernel ran last (autotuned or default)."""
    from kinterval.ops.triton import kernels as K

    out = []
    for name, kern in K.KERNELS.items():
        c = getattr(kern, "best_config", None)
        out.append(f"{name} " + ("-" if c is None else "{}x{}/{}/{}".format(*K._tile(c))))
    return ", ".join(out)


def _precompile(ops, modes, Ds, causal, workers):
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = [(spec.full_name, DTYPE_MODES[m][0], DTYPE_MODES[m][1], D, causal)
            for spec in ops for m in modes for D in Ds]  # fmt: skip
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_worker, jobs))
    print(f"precompiled {len(jobs)} operator/dtype/D combinations in {time.perf_counter() - t0:.0f} s "
          f"({workers} processes)", file=sys.stderr, flush=True)  # fmt: skip


# ---------------------------------------------------------------------------------------------- timing
def _make_bench(on_gpu: bool, args):
    if on_gpu:
        from triton.testing import do_bench

        def bench(fn):
            return do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

        return bench

    def bench_cpu(fn):  # interpreter smoke run: a couple of wall-clock calls, median
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    return bench_cpu


def _inputs(B, H, T, D, dtype, device, n):
    import torch

    sets = []
    for i in range(max(1, n)):
        g = torch.Generator(device="cpu").manual_seed(1000 + i)
        q, k, v, do = (torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype) for _ in range(4))
        sets.append([q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do])
    return sets


def _rotating(sets, call):
    """A closure running ``call(q, k, v, do)`` on the next input set each time (no L2 reuse between calls)."""
    state = {"i": 0}

    def fn():
        q, k, v, do = sets[state["i"] % len(sets)]
        state["i"] += 1
        for x in (q, k, v):
            x.grad = None
        return call(q, k, v, do)

    return fn


def _peak_mib(call, sets):
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    q, k, v, do = sets[0]
    call(q, k, v, do)
    torch.cuda.synchronize()
    for x in (q, k, v):
        x.grad = None
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _measure(bench, spec, sets, causal, precision, on_gpu, run_ref, run_compiled, triton_attention,
             kinterval_attention):  # fmt: skip
    import torch

    def fwd(q, k, v, do):
        with torch.no_grad():
            return triton_attention(q, k, v, spec, causal=causal, precision=precision)

    def fwd_bwd(q, k, v, do):
        triton_attention(q, k, v, spec, causal=causal, precision=precision).backward(do)

    row = {"fwd ms": bench(_rotating(sets, fwd)), "f+b ms": bench(_rotating(sets, fwd_bwd))}
    row["peak MiB"] = _peak_mib(fwd_bwd, sets)

    tf32 = precision == "tf32"

    def ref_call(fn):
        def call(q, k, v, do):
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                fn(q, k, v).backward(do)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old

        return call

    def ref(q, k, v):
        return kinterval_attention(q, k, v, spec, causal=causal, backend="reference")

    row["x ref eager"] = row["x ref compiled"] = row["ref MiB"] = "-"
    if run_ref:
        try:
            row["ref MiB"] = _peak_mib(ref_call(ref), sets)
            row["x ref eager"] = bench(_rotating(sets, ref_call(ref))) / row["f+b ms"]
        except torch.OutOfMemoryError:
            row["x ref eager"] = row["ref MiB"] = "OOM"
        torch.cuda.empty_cache() if on_gpu else None
    if run_compiled and row["x ref eager"] != "OOM":
        try:
            compiled = torch.compile(ref, dynamic=False)
            row["x ref compiled"] = bench(_rotating(sets, ref_call(compiled))) / row["f+b ms"]
        except torch.OutOfMemoryError:
            row["x ref compiled"] = "OOM"
        except Exception as err:  # a compiler failure is reported, not fatal
            row["x ref compiled"] = f"error: {type(err).__name__}"
        torch.cuda.empty_cache() if on_gpu else None
    return row


def _time_sdpa(bench, B, H, T, D, device, causal, n):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sets = _inputs(B, H, T, D, torch.bfloat16, device, n)

    def call(q, k, v, do):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)

    try:
        return bench(_rotating(sets, call))
    except RuntimeError:  # flash unavailable for this shape / GPU
        return None


# ---------------------------------------------------------------------------------------------- output
def _cell(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return str(x)


def _fmt_row(row) -> str:
    return " | ".join(_cell(row.get(c)) for c in COLUMNS)


def _print_table(rows, device, on_gpu):
    import torch

    name = torch.cuda.get_device_name() if on_gpu else "CPU (Triton interpreter: timings meaningless)"
    print(f"# kinterval triton attention benchmark on {name}; torch {torch.__version__}")
    cells = [COLUMNS] + [[_cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    for j, row in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    sys.exit(main())
