"""Benchmark the fused Triton kernels against SDPA flash, FlexAttention and the reference backend.

One run prints ONE table; each row is (operator, dtype mode, T, D), with columns

    fwd ms | f+b ms | f+b IQR ms | n | TFLOP/s | SDPA f+b ms | x SDPA | x flex | x ref eager |
    x ref compiled | err vs fp64 | torch fp32 err | torch same-precision err | peak MiB | ref MiB | tiles

* dtype modes: bf16 / fp16 inputs; fp32 inputs with TF32 dots ("tf32"), split dots with near-fp32 accuracy on
  the tensor cores ("tf32x3": three TF32 products; "bf16x6": three bf16 parts per operand, six bf16 products)
  or full-precision FMA dots ("ieee");
* fwd+bwd FLOPs follow FlashAttention's convention: causal forward 4 B H T^2 D / 2, backward 2.5 x forward;
* "x SDPA" = kernel fwd+bwd time / SDPA flash (softmax) fwd+bwd time at the same shape, in bf16 (flash has no
  fp32 kernel, so fp32 rows -- tf32, tf32x3, bf16x6, ieee -- are compared with bf16 flash, as the targets are
  stated);
* "flex-softmax" rows: softmax through ``torch.nn.attention.flex_attention`` (``torch.compile``d, causal by a
  ``create_block_mask`` block mask), one per (dtype mode, T, D), in the mode's input dtype: bf16 / fp16 as is;
  fp32 with TF32 dots for "tf32"; fp32 without TF32 for "ieee", "tf32x3" and "bf16x6" (FlexAttention has no
  split-dot mode, so the near-fp32 kernel is set against FlexAttention's full-precision fp32). "x flex" =
  kernel fwd+bwd time / that flex-softmax fwd+bwd time (same shape, same mode). "-" where FlexAttention is off
  (--no-flex) or could not run; the reason is printed once;
* "x ref eager" / "x ref compiled" = reference-backend fwd+bwd time / kernel time (> 1: the kernel is faster);
  "OOM" where the reference does not fit in memory, "-" where it was not run (see --ref-max-t, --compile-t);
* "err vs fp64" = max |out - out64| of the forward output, where out64 is the reference backend in float64 on
  the same (dtype-rounded) inputs; "torch fp32 err" = the same for torch's own fp32 evaluation of the row's
  operator, TF32 off (softmax: SDPA's math backend; every other operator, the rounded-exp baselines too:
  the reference backend), on fp32 inputs; "torch same-precision err" = the same for torch at the row's own
  precision, the bound a kernel in that precision is held to (flash-attention's test: twice torch's error
  at the same precision): softmax through SDPA flash on bf16 / fp16 inputs and SDPA math with TF32 matmuls
  for tf32; the other operators through the reference backend on the dtype-rounded inputs (its maths in
  fp32, TF32 matmuls for tf32, the output in the input dtype); for ieee, tf32x3 and bf16x6, which aim at
  fp32, the fp32 value. All at one small shape per (operator, mode, D): B = 1, H = --err-heads, T = --err-t
  (float64 at the benchmark's B*T would not fit), the same value on every T of that (operator, mode, D),
  cached, so each costs one call per (operator, mode, D). For K-interval
  operators a score within rounding of a grid boundary can land in the other interval in any two fp32
  evaluations (an error of O(1/K) in that row), so both columns leave out the rows that hold such a
  decision (``kinterval.ops.flips.flip_rows``; a line under the table gives their share). A mode whose
  scores are less accurate than fp32's flips rows outside that set, and its error shows it;
* times are medians over n timed calls (CUDA events around each call, a 256 MiB buffer overwritten before each
  as ``triton.testing.do_bench`` does, one synchronization at the end): after an untimed first call and
  --warmup ms of warm-up, n = max(--min-samples, --rep / (the warm-up's median)), so a call of 60 ms gets
  --min-samples samples (do_bench took max(1, rep / estimate): one). "f+b IQR ms" is the 25th-75th
  percentile range of the f+b samples and "n" their number; the CSV has the median, q25, q75 and n of every
  timing (fwd, f+b, SDPA f+b, ref eager, ref compiled). Every call also rotates through several input sets
  so that no call finds its inputs in L2 from the previous one; peak MiB is the peak allocation of one
  fwd+bwd call above the inputs;
* "tiles" = the configs the autotuner chose at the timed shape, read right after the timed fwd+bwd; "-" for
  a kernel the row did not launch (the fused backward in a split row, dQ and dK/dV in a fused one);
* --gqa G: grouped-query attention, G q heads per k/v head ("H kv" = H / G); the kernels read each k/v head
  in place, SDPA, FlexAttention and the reference get the same k, v with ``enable_gqa=True``; the error
  columns use H = --err-heads q heads on --err-heads / G k/v heads. G = 1 (default): multi-head attention;
* --softcap C: the kernels, the reference rows (eager, compiled) and every error column (float64 reference,
  torch's own evaluations) use the scores C tanh(scale q.k / C) (Gemma 2); the flex-softmax rows too, through
  flex_attention's ``score_mod``. --sinks: attention sinks (gpt-oss), one per q head, the fixed
  ``torch.linspace(-2, 2, H)`` in the inputs' dtype (a spread around the typical score of N(0, 1) inputs at
  scale D^-1/2; requires_grad in the timed rows, as a learned parameter: f+b includes their gradient), for the
  kernels, the reference rows and the error columns alike; FlexAttention has no sinks, so with --sinks the
  flex-softmax rows (and their error columns) stay plain softmax. SDPA flash has neither: its rows and
  "x SDPA" stay plain softmax, the baseline a user compares with. With either, the torch error columns of
  softmax use the reference backend (SDPA cannot) as the other operators do, and the flip-prone rows are
  found on the softcapped scores with the sink as one more key; a line under the table says what was set;
* --bias alibi|t5: an additive score bias in fp32 (the kernels also take bf16 / fp16), added after the
  softcap, for the kernels, the reference rows, the flex-softmax rows (through ``score_mod``) and every error
  column: "alibi" is ALiBi as BLOOM adds it, slope 2^(-8 (h+1) / H) times the key index, (1, H, 1, T), read in
  place with stride 0 over the rows, fixed (no gradient); "t5" stands for a learned position bias, a seeded
  N(0, 1) (1, H, T, T) that requires_grad, so f+b includes the bias gradient (the dQ kernel then writes
  dL/ds of every score into an fp32 (B, H, T, T) buffer: O(T^2) memory, as the bias itself). SDPA flash has
  no bias: its rows stay plain softmax;
* the table (stdout) and the CSV start with '# ' lines: device, driver, torch, triton, the git commit of the
  checkout (and whether it had uncommitted changes) and the command line.

Usage (GPU):  python benchmarks/attention.py [--ops lerp-k4,fwm-prob-k4] [--dtypes bf16,tf32,bf16x6,ieee]
              [--T 512,1024,2048,4096,8192] [--D 64,128] [--tokens 16384] [--model-dim 2048] [--no-flex]
              [--gqa G] [--softcap C] [--sinks] [--bias alibi|t5] [--err-t 1024] [--csv out.csv]
On a machine without CUDA it refuses, unless ``--smoke``: a tiny shape in Triton's CPU interpreter (timings
meaningless; checks that the script and kernels run end to end; the first two operators and the first dtype
mode unless --ops / --dtypes are given).
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
               "tf32x3": ("float32", "tf32x3"), "bf16x6": ("float32", "bf16x6"),
               "ieee": ("float32", "ieee")}  # fmt: skip
COLUMNS = ["operator", "dtype", "T", "D", "B", "H", "H kv", "fwd ms", "f+b ms", "f+b IQR ms", "n", "TFLOP/s",
           "SDPA f+b ms", "x SDPA", "x flex", "x ref eager", "x ref compiled", "err vs fp64",
           "torch fp32 err", "torch same-precision err", "peak MiB", "ref MiB", "tiles"]  # fmt: skip
TIMINGS = ("fwd", "f+b", "SDPA f+b", "ref eager", "ref compiled")  # each: "<t> ms" (median), q25, q75, n
CSV_COLUMNS = ([c for c in COLUMNS if c not in ("f+b IQR ms", "n")] + ["ref eager ms", "ref compiled ms"]
               + [f"{t} {s}" for t in TIMINGS for s in ("q25 ms", "q75 ms", "n")])  # fmt: skip
MIN_SAMPLES = 10
BIASES = ("alibi", "t5")  # the --bias kinds (module doc)
L2_FLUSH_BYTES = 256 * 2**20  # overwritten before every timed call, as triton.testing.do_bench does
FLEX = "flex-softmax"  # operator name of the FlexAttention rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=None, help=f"comma-separated operator names (default: {DEFAULT_OPS})")
    p.add_argument("--dtypes", default=None, help=f"comma-separated from {', '.join(DTYPE_MODES)} "
                   "(default: bf16,tf32)")  # fmt: skip
    p.add_argument("--T", default="512,1024,2048,4096,8192", help="sequence lengths, Tq = Tk (%(default)s)")
    p.add_argument("--D", default="64,128", help="head dims (default %(default)s)")
    p.add_argument("--tokens", type=int, default=16384, help="B * T held fixed (FlashAttention's convention)")
    p.add_argument("--model-dim", type=int, default=2048, help="H * D held fixed")
    p.add_argument("--no-causal", action="store_true", help="full attention instead of causal")
    p.add_argument(
        "--gqa", type=int, default=1, help="q heads per k/v head (grouped-query attention); 1: MHA"
    )
    p.add_argument("--softcap", type=float, default=None,
                   help="score softcap C (Gemma 2): C tanh(scale q.k / C); default none")  # fmt: skip
    p.add_argument("--sinks", action="store_true",
                   help="attention sinks (gpt-oss): linspace(-2, 2, H) in the inputs' dtype")  # fmt: skip
    p.add_argument("--bias", choices=BIASES, default=None,
                   help="an additive fp32 score bias: alibi (fixed, (1, H, 1, T), read in place) or t5 "
                   "(learned, (1, H, T, T), with its gradient); default none")  # fmt: skip
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
    p.add_argument(
        "--bwd",
        default="split",
        help="comma-separated backward kernels to time, from split "
        "(dQ then dK/dV) and fused (one kernel, atomic dQ; KINTERVAL_TRITON_BWD)",
    )
    p.add_argument(
        "--no-sdpa", action="store_true", help="no SDPA flash timing ('SDPA f+b ms' and 'x SDPA' show '-')"
    )
    p.add_argument("--no-flex", action="store_true", help="no FlexAttention rows and no 'x flex' values")
    p.add_argument(
        "--err-t", type=int, default=1024, help="T of the forward-error shape (0: no error columns)"
    )
    p.add_argument("--err-heads", type=int, default=8, help="heads of the forward-error shape (B = 1)")
    p.add_argument("--rotate", type=int, default=3, help="input sets rotated between calls")
    p.add_argument(
        "--warmup", type=int, default=25, help="warm-up before each timing (ms, at least one call)"
    )
    p.add_argument("--rep", type=int, default=100, help="time spent on the timed calls of each timing (ms)")
    p.add_argument("--min-samples", type=int, default=MIN_SAMPLES,
                   help="timed calls at least, however long one takes")  # fmt: skip
    p.add_argument("--csv", default=None, help="also write the table as CSV")
    p.add_argument("--smoke", action="store_true", help="tiny run; on CPU in the Triton interpreter")
    return p.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _check_gqa(gqa: int, model_dim: int, Ds, err_t: int, err_heads: int) -> None:
    """Refuse a --gqa that does not divide the q heads H = model_dim / D of every D, or --err-heads."""
    if gqa < 1:
        raise SystemExit(f"--gqa must be >= 1, got {gqa}")
    for D in Ds:
        if max(1, model_dim // D) % gqa:
            raise SystemExit(f"--gqa {gqa} must divide H = {max(1, model_dim // D)} (D = {D})")
    if err_t and err_heads % gqa:
        raise SystemExit(f"--gqa {gqa} must divide --err-heads {err_heads}")


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
    ops = [OperatorSpec.from_full_name(n) for n in _names(args.ops or DEFAULT_OPS)]
    modes = _names(args.dtypes or "bf16,tf32")
    for m in modes:
        if m not in DTYPE_MODES:
            raise SystemExit(f"unknown dtype mode {m!r}; choose from {sorted(DTYPE_MODES)}")
    Ts, Ds = _ints(args.T), _ints(args.D)
    compile_ts = set(_ints(args.compile_t))
    err_t, err_heads = args.err_t, args.err_heads
    if args.smoke:
        Ts, Ds, compile_ts = [64] if not on_gpu else [256], [32] if not on_gpu else [64], set()
        # two k/v heads (one per q head without --gqa), so that --gqa G runs at any G
        heads = 2 * max(1, args.gqa)
        args.tokens, args.model_dim = Ts[0], heads * Ds[0]
        err_t, err_heads = (Ts[0], heads) if err_t else (0, 0)
        if not on_gpu:  # the interpreter is slow: a subset unless asked for explicitly
            ops = ops if args.ops else ops[:2]
            modes = modes if args.dtypes else modes[:1]
    _check_gqa(args.gqa, args.model_dim, Ds, err_t, err_heads)
    softcap = args.softcap
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise SystemExit(f"--softcap must be a finite number > 0, got {softcap}")
    bwds = _names(args.bwd)
    for b in bwds:
        if b not in ("split", "fused"):
            raise SystemExit(f"unknown backward {b!r}; choose from split, fused")
    causal = not args.no_causal
    compile_ops = None if args.compile_ops == "all" else set(args.compile_ops.split(","))
    compile_modes, compile_ds = set(args.compile_dtypes.split(",")), set(_ints(args.compile_D))
    if on_gpu and args.precompile > 0:
        _precompile(ops, modes, Ds, causal, args.precompile, bwds, (softcap, args.sinks, args.bias), args.gqa)

    header = _provenance(on_gpu, ["benchmarks/attention.py", *(sys.argv[1:] if argv is None else argv)])
    bench = _make_bench(on_gpu, args)
    notes: list[str] = []  # one line per reason a cell shows "-" (printed once, and again under the table)
    _note_mods(notes, softcap, args.sinks, "fused" in bwds, args.bias)
    if not on_gpu:
        _note(notes, "SDPA f+b, x SDPA: '-' without CUDA (SDPA flash is a CUDA kernel)")
    elif args.no_sdpa:
        _note(notes, "SDPA f+b, x SDPA: '-' (--no-sdpa)")
    errors = _Errors(
        causal, device, err_t, err_heads, kinterval_attention, notes, args.gqa, softcap, args.sinks, args.bias
    )
    # FlexAttention has no sinks: its rows, and their error columns, are softmax with the softcap and bias
    flex_errors = errors if not args.sinks else _Errors(
        causal, device, err_t, err_heads, kinterval_attention, notes, args.gqa, softcap, bias=args.bias
    )  # fmt: skip
    rows = []
    sdpa_cache: dict = {}
    flex_cache: dict = {}
    try:  # SIGINT (e.g. `timeout -s INT`) still prints the rows measured so far
        for D in Ds:
            H = max(1, args.model_dim // D)
            for T in Ts:
                B = max(1, args.tokens // T)
                shape = {"T": T, "D": D, "B": B, "H": H, "H kv": H // args.gqa}
                flops = 3.5 * 4 * B * H * T * T * D / (2 if causal else 1)  # fwd+bwd, FlashAttention's count
                for mode in modes:
                    dtype = getattr(torch, DTYPE_MODES[mode][0])
                    precision = DTYPE_MODES[mode][1]
                    sets = _inputs(B, H, T, D, dtype, device, args.rotate, args.gqa)
                    sinks = _sinks(H, dtype, device) if args.sinks else None
                    bias = _bias(args.bias, H, T, device) if args.bias else None
                    mods = {"softcap": softcap, "sinks": None if sinks is None else sinks.requires_grad_(),
                            "bias": bias}  # fmt: skip
                    sdpa = None  # the SDPA flash samples of this shape
                    if on_gpu and not args.no_sdpa:
                        key = (B, H, T, D)
                        if key not in sdpa_cache:
                            sdpa_cache[key] = _time_sdpa(
                                bench, (B, H, T, D, args.gqa), device, causal, args.rotate
                            )
                        sdpa = sdpa_cache[key]
                    flex_ms = None
                    if not args.no_flex:
                        flex_row = _flex_row(bench, mode, sets, causal, flex_cache, notes, softcap, bias)
                        flex_ms = flex_row.get("f+b ms")
                        if flex_ms is not None:
                            flex_row.update(zip(ERROR_COLUMNS, flex_errors.flex(mode, D)))
                        rows.append(_finish(flex_row, FLEX, mode, shape, flops, sdpa, flex_ms))
                    for spec, bwd in ((spec, bwd) for spec in ops for bwd in bwds):
                        os.environ["KINTERVAL_TRITON_BWD"] = bwd  # read by each backward
                        label = spec.full_name + ("" if bwd == "split" else f" ({bwd} bwd)")
                        wanted = compile_ops is None or spec.full_name in compile_ops
                        run_compiled = (
                            wanted and T in compile_ts and mode in compile_modes and D in compile_ds
                        )
                        t_row = time.perf_counter()
                        row = _measure(bench, spec, sets, causal, precision, on_gpu, T <= args.ref_max_t,
                                       run_compiled, triton_attention, kinterval_attention,
                                       mods)  # fmt: skip
                        # after the tiles were read: these launch the kernel at the error shape
                        row.update(zip(ERROR_COLUMNS, errors.kernel(spec, mode, D, triton_attention)))
                        rows.append(_finish(row, label, mode, shape, flops, sdpa, flex_ms))
                        print(
                            f"{_fmt_row(rows[-1])}  [{time.perf_counter() - t_row:.0f} s]",
                            file=sys.stderr,
                            flush=True,
                        )  # progress on stderr; fmt: skip
                    del sets, sinks, bias, mods
                    if on_gpu:
                        torch.cuda.empty_cache()
    except KeyboardInterrupt:
        print(f"interrupted after {len(rows)} rows", file=sys.stderr)
    errors.note_left_out()
    _print_table(rows, notes, header)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            f.writelines(f"# {line}\n" for line in header)  # csv.DictReader: skip the lines starting "# "
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c) for c in CSV_COLUMNS})
    return 0


ERROR_COLUMNS = ("err vs fp64", "torch fp32 err", "torch same-precision err")


def _finish(row, operator, mode, shape, flops, sdpa, flex_ms):
    """Add the shape and the columns derived from the row's fwd+bwd time (None: not measured) and the SDPA
    samples of the shape (None: not timed)."""
    if sdpa:
        _put(row, "SDPA f+b", sdpa)
    fb, sdpa_ms = row.get("f+b ms"), row.get("SDPA f+b ms")
    row.update({"operator": operator, "dtype": mode, **shape,
                "TFLOP/s": flops / (fb * 1e-3) / 1e12 if fb else None,
                "x SDPA": fb / sdpa_ms if (fb and sdpa_ms) else None,
                "x flex": fb / flex_ms if (fb and flex_ms) else None})  # fmt: skip
    return row


def _put(row: dict, timing: str, samples: list[float]) -> float:
    """Store the median ("<timing> ms"), the 25th / 75th percentiles and the number of ``samples`` of a
    timing in ``row``; the table's "f+b IQR ms" and "n" come from those of f+b. Returns the median."""
    import numpy as np

    q25, q50, q75 = (float(x) for x in np.percentile(samples, [25, 50, 75]))
    row.update({f"{timing} ms": q50, f"{timing} q25 ms": q25, f"{timing} q75 ms": q75,
                f"{timing} n": len(samples)})  # fmt: skip
    if timing == "f+b":
        row["f+b IQR ms"], row["n"] = f"{_cell(q25)}–{_cell(q75)}", len(samples)
    return q50


def _provenance(on_gpu: bool, argv: list[str]) -> list[str]:
    """The lines that start the table and the CSV: what measured it (benchmarks/provenance.py) and the
    command line."""
    import shlex

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the benchmarks' shared module
    from provenance import provenance

    device = torch.device("cuda" if on_gpu else "cpu")
    what = provenance(device, cpu="CPU (Triton interpreter: timings meaningless)")
    return [f"kinterval triton attention benchmark; {what}", "command " + shlex.join(argv)]


def _note(notes: list[str], line: str) -> None:
    """Print a reason once (stderr, at once; stdout, under the table)."""
    if line not in notes:
        notes.append(line)
        print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ precompile
def _compile_worker(job):
    """Run fwd+bwd once at a small shape: the autotuner compiles every candidate into Triton's disk cache,
    where the timing process finds them. Same specialisation as the timed shapes: Triton specialises integer
    arguments on divisibility by 16, so H, T and the strides must all be multiples of 16 here as there; and
    with the run's --softcap / --sinks / --bias (each a compile-time flag of the kernels)."""
    name, dtype_name, precision, D, causal, bwds, *rest = job
    softcap, sinks, bias = rest[0] if rest else (None, False, None)
    group = rest[1] if len(rest) > 1 else 1  # --gqa: the q heads per k/v head, a specialised argument too
    import torch

    from kinterval.ops.triton import triton_attention

    g = torch.Generator().manual_seed(0)
    heads = (16 * group, 16, 16, 16 * group)  # q, k, v, dO: 16 k/v heads, so every count is a multiple of 16
    q, k, v, do = (
        torch.randn(1, h, 256, D, generator=g).to("cuda", getattr(torch, dtype_name)) for h in heads
    )
    for x in (q, k, v):
        x.requires_grad_()
    mods = {} if softcap is None else {"softcap": softcap}
    if sinks:
        mods["sinks"] = _sinks(q.shape[1], q.dtype, q.device).requires_grad_()
    if bias:
        mods["bias"] = _bias(bias, q.shape[1], q.shape[2], q.device)
    for bwd in bwds:  # each backward kernel timed (KINTERVAL_TRITON_BWD is read at each backward)
        os.environ["KINTERVAL_TRITON_BWD"] = bwd
        triton_attention(q, k, v, name, causal=causal, precision=precision, **mods).backward(do)
    with torch.no_grad():  # the inference forward ("fwd ms"): Prob-STE compiles its own
        triton_attention(q, k, v, name, causal=causal, precision=precision, **mods)
    torch.cuda.synchronize()
    return name


def _forget_tiles() -> None:
    """Clear each kernel's last choice, so that _tiles() names only the kernels launched after this ("-" for
    the others: the fused kernel in a split row, dQ and dK/dV in a fused one)."""
    from kinterval.ops.triton import kernels as K

    for kern in K.KERNELS.values():
        if hasattr(kern, "best_config"):
            kern.best_config = None


def _tiles() -> str:
    """BLOCK_M x BLOCK_N / warps / stages that each kernel ran last (autotuned or default)."""
    from kinterval.ops.triton import kernels as K

    out = []
    for name, kern in K.KERNELS.items():
        c = getattr(kern, "best_config", None)
        out.append(f"{name} " + ("-" if c is None else "{}x{}/{}/{}".format(*K._tile(c))))
    return ", ".join(out)


def _precompile(ops, modes, Ds, causal, workers, bwds=("split",), mods=(None, False, None), group=1):
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = [(spec.full_name, DTYPE_MODES[m][0], DTYPE_MODES[m][1], D, causal, tuple(bwds), mods, group)
            for spec in ops for m in modes for D in Ds]  # fmt: skip
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile_worker, jobs))
    print(f"precompiled {len(jobs)} operator/dtype/D combinations in {time.perf_counter() - t0:.0f} s "
          f"({workers} processes)", file=sys.stderr, flush=True)  # fmt: skip


# ---------------------------------------------------------------------------------------------- timing
def _make_bench(on_gpu: bool, args):
    """``bench(fn) -> list of ms``, one per timed call. On the GPU: ``_samples`` with CUDA events (module
    doc); in the interpreter smoke run one wall-clock call."""
    if on_gpu:

        def bench(fn):
            return _samples(fn, _cuda_times, args.warmup, args.rep, args.min_samples)

        return bench

    def bench_cpu(fn):
        t0 = time.perf_counter()
        fn()
        return [(time.perf_counter() - t0) * 1e3]

    return bench_cpu


def _samples(fn, timer, warmup_ms: float, rep_ms: float, min_samples: int = MIN_SAMPLES) -> list[float]:
    """ms of each timed call of ``fn``: one untimed call (compilation, autotuning), warm-up calls in batches
    of 1, 2, 4, ... until ``warmup_ms`` have run (the last batch's median is the estimate), then
    max(min_samples, rep_ms / estimate) timed calls. ``timer(fn, n)`` times n calls (``_cuda_times``)."""
    import statistics

    fn()
    batch, spent = 1, 0.0
    while True:
        warm = timer(fn, batch)
        spent += sum(warm)
        if spent >= warmup_ms or batch >= 1024:
            break
        batch *= 2
    estimate = max(statistics.median(warm), 1e-6)
    return timer(fn, max(min_samples, math.ceil(rep_ms / estimate)))


def _cuda_times(fn, n: int) -> list[float]:
    """ms of each of n calls of ``fn``: CUDA events around each call, the L2 flush buffer overwritten before
    each (no call finds the previous one's data in L2), one synchronization after the last."""
    import torch

    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        _FLUSH.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


_FLUSH = None  # the L2 flush buffer, allocated at the first timing


def _inputs(B, H, T, D, dtype, device, n, group=1):
    """n input sets (q, k, v, dO); k and v with H / group heads (grouped-query attention for group > 1)."""
    import torch

    sets = []
    for i in range(max(1, n)):
        g = torch.Generator(device="cpu").manual_seed(1000 + i)
        heads = (H, H // group, H // group, H)
        q, k, v, do = (torch.randn(B, h, T, D, generator=g).to(device=device, dtype=dtype) for h in heads)
        sets.append([q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do])
    return sets


def _sinks(H, dtype, device):
    """The --sinks attention sinks (module doc): ``torch.linspace(-2, 2, H)`` in ``dtype``, one per q head."""
    import torch

    return torch.linspace(-2, 2, H).to(device=device, dtype=dtype)


def _bias(kind, H, T, device):
    """The --bias score bias (module doc), fp32. alibi: (1, H, 1, T), slope 2^(-8 (h+1) / H) times the key
    index j, as BLOOM adds it (the row's constant -slope i of ALiBi's -slope (i - j) changes no operator of
    the family: each is shift-invariant along a row), read in place with stride 0 over the rows; no
    gradient. t5: a learned (1, H, T, T) bias, N(0, 1) (seeded), requires_grad."""
    import torch

    if kind == "alibi":
        slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float64) / H)
        b = slopes[:, None] * torch.arange(T, dtype=torch.float64)
        return b.to(device=device, dtype=torch.float32)[None, :, None, :]
    if kind != "t5":
        raise ValueError(f"unknown bias {kind!r}; choose from {', '.join(BIASES)}")
    g = torch.Generator(device="cpu").manual_seed(11)
    return torch.randn(1, H, T, T, generator=g).to(device).requires_grad_()


def _reference_mods(mods: dict) -> dict:
    """The kernel's keywords as ``kinterval_attention`` takes them: the bias as a float ``attn_mask``."""
    mods = dict(mods)
    if "bias" in mods:
        mods["attn_mask"] = mods.pop("bias")
    return mods


def _note_mods(notes, softcap, sinks: bool, fused: bool, bias=None) -> None:
    """The lines under the table that say which score modifications the rows ran with (module doc)."""
    if softcap is not None:
        _note(notes, f"softcap {softcap:g}: scores {softcap:g} tanh(scale q.k / {softcap:g}) in the kernel, "
              "reference and flex-softmax rows and every error column; SDPA f+b (x SDPA) is plain "
              "softmax")  # fmt: skip
    if sinks:
        _note(notes, "sinks: torch.linspace(-2, 2, H) in the inputs' dtype (requires_grad) in the kernel and "
              "reference rows and the error columns; SDPA f+b (x SDPA) and flex-softmax rows have no "
              "sinks")  # fmt: skip
        if fused:
            _note(notes, "sinks: the fused-bwd rows ran the split backward (the fused one takes no sinks)")
    if bias == "alibi":
        _note(notes, "bias alibi: slope_h * j, (1, H, 1, T) fp32, no gradient, in the kernel, reference and "
              "flex-softmax rows and every error column; SDPA f+b (x SDPA) is plain softmax")  # fmt: skip
    elif bias == "t5":
        _note(notes, "bias t5: N(0, 1), (1, H, T, T) fp32, requires_grad (f+b includes its gradient), in the "
              "kernel, reference and flex-softmax rows and every error column; SDPA f+b (x SDPA) is plain "
              "softmax")  # fmt: skip
    if bias and fused:
        _note(notes, "bias: the fused-bwd rows ran the split backward (the fused one takes no bias)")


def _gqa(q, k) -> bool:
    """Whether k has fewer heads than q: the ``enable_gqa`` of SDPA, FlexAttention and the reference."""
    return k.shape[1] != q.shape[1]


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
             kinterval_attention, mods=None):  # fmt: skip
    """The kernel's row; ``mods``: the --softcap / --sinks keywords of every call (kernel and reference)."""
    import torch

    mods = {k: x for k, x in (mods or {}).items() if x is not None}  # plain calls: no keywords

    def fresh():  # the sinks' and the bias's gradients do not pile up over the calls
        for x in (mods.get("sinks"), mods.get("bias")):
            if x is not None:
                x.grad = None

    def fwd(q, k, v, do):
        with torch.no_grad():
            return triton_attention(q, k, v, spec, causal=causal, precision=precision, **mods)

    def fwd_bwd(q, k, v, do):
        fresh()
        triton_attention(q, k, v, spec, causal=causal, precision=precision, **mods).backward(do)

    row: dict = {}
    _forget_tiles()
    _put(row, "fwd", bench(_rotating(sets, fwd)))
    _put(row, "f+b", bench(_rotating(sets, fwd_bwd)))
    row["tiles"] = _tiles()  # the autotuner's choice at this shape, before anything launches another one
    row["peak MiB"] = _peak_mib(fwd_bwd, sets)

    def ref_call(fn):
        def call(q, k, v, do):
            fresh()
            with _tf32(precision == "tf32"):
                fn(q, k, v).backward(do)

        return call

    def ref(q, k, v):
        return kinterval_attention(
            q, k, v, spec, causal=causal, backend="reference", enable_gqa=_gqa(q, k), **_reference_mods(mods)
        )

    row["x ref eager"] = row["x ref compiled"] = row["ref MiB"] = "-"
    if run_ref:
        try:
            row["ref MiB"] = _peak_mib(ref_call(ref), sets)
            row["x ref eager"] = _put(row, "ref eager", bench(_rotating(sets, ref_call(ref)))) / row["f+b ms"]
        except torch.OutOfMemoryError:
            row["x ref eager"] = row["ref MiB"] = "OOM"
        torch.cuda.empty_cache() if on_gpu else None
    if run_compiled and row["x ref eager"] != "OOM":
        try:
            compiled = torch.compile(ref, dynamic=False)
            samples = bench(_rotating(sets, ref_call(compiled)))
            row["x ref compiled"] = _put(row, "ref compiled", samples) / row["f+b ms"]
        except torch.OutOfMemoryError:
            row["x ref compiled"] = "OOM"
        except Exception as err:  # a compiler failure is reported, not fatal
            row["x ref compiled"] = f"error: {type(err).__name__}"
        torch.cuda.empty_cache() if on_gpu else None
    return row


def _tf32(on: bool):
    """torch's fp32 matmuls (cuBLAS, and Inductor's generated dots) with or without TF32 (kinterval's one
    place that sets it: the legacy ``allow_tf32`` flag raises on torch >= 2.9 after the new API was used)."""
    from kinterval.ops.tf32 import tf32

    return tf32(on)


def _flex_numerics(mode: str) -> tuple[str, bool]:
    """FlexAttention's input dtype and TF32 setting for a dtype mode (module doc: what "x flex" compares)."""
    dtype_name, precision = DTYPE_MODES[mode]
    return dtype_name, precision == "tf32"


def _causal(b, h, q_idx, kv_idx):  # FlexAttention mask_mod: query i sees keys j <= i (Tq = Tk)
    return q_idx >= kv_idx


def _flex(causal: bool, T: int, device):
    """``torch.compile``d flex_attention and its block mask (None: full attention)."""
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # one compiled graph per shape, dtype, TF32 setting and grad mode: more than dynamo's default of 8
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(cfg, name, max(getattr(cfg, name), 256))
    block_mask = create_block_mask(_causal, None, None, T, T, device=device) if causal else None
    return torch.compile(flex_attention, dynamic=False), block_mask


def _flex_mods(softcap, bias=None) -> dict:
    """flex_attention's keywords for --softcap and --bias: a ``score_mod`` c tanh(score / c) + bias[h, i, j]
    (none without either)."""
    import torch

    if softcap is None and bias is None:
        return {}

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if bias is not None:  # (1, H, 1, T) for alibi: every row reads row 0
            score = score + bias[0, h, q_idx if bias.shape[2] > 1 else 0, kv_idx]
        return score

    return {"score_mod": score_mod}


def _flex_row(bench, mode, sets, causal, cache, notes, softcap=None, bias=None):
    """FlexAttention softmax, fwd and fwd+bwd ms on ``sets`` converted to the mode's flex dtype; None on
    failure (the reason goes to ``notes``). Cached per shape and flex numerics (ieee and the split dots
    share)."""
    import torch

    dtype_name, tf32 = _flex_numerics(mode)
    dtype = getattr(torch, dtype_name)
    B, H, T, D = sets[0][0].shape
    key = (B, H, T, D, dtype_name, tf32)
    if key not in cache:
        fsets = [[x.detach().to(dtype).requires_grad_(x.requires_grad) for x in s] for s in sets]
        cache[key] = {}
        try:
            flex, block_mask = _flex(causal, T, fsets[0][0].device)
            mods = _flex_mods(softcap, bias)

            def fwd(q, k, v, do):
                with torch.no_grad():
                    return flex(q, k, v, block_mask=block_mask, enable_gqa=_gqa(q, k), **mods)

            def fwd_bwd(q, k, v, do):
                if bias is not None:  # its gradient does not pile up over the calls
                    bias.grad = None
                flex(q, k, v, block_mask=block_mask, enable_gqa=_gqa(q, k), **mods).backward(do)

            with _tf32(tf32):
                row: dict = {}
                _put(row, "f+b", bench(_rotating(fsets, fwd_bwd)))
                _put(row, "fwd", bench(_rotating(fsets, fwd)))
                row["peak MiB"] = _peak_mib(fwd_bwd, fsets)
                cache[key] = row
        except Exception as err:  # unavailable, no backward on this device, compiler failure, OOM
            msg = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            _note(notes, f"flex-softmax rows: flex_attention failed ({type(err).__name__}: {msg})")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return dict(cache[key])


class _Errors:
    """Forward errors against float64 at one small shape per (operator, mode, D) (module doc), cached; k and
    v with H / group heads; every evaluation (the float64 reference, torch's, the kernel's) with the scores
    softcapped at ``softcap``, with ``sinks`` the --sinks attention sinks in the inputs' dtype, and with
    ``bias`` the --bias score bias of that kind at this shape."""

    def __init__(self, causal, device, T, H, kinterval_attention, notes, group=1, softcap=None, sinks=False,
                 bias=None):  # fmt: skip
        self.causal, self.device, self.T, self.H, self.group = causal, device, T, H, group
        self.kinterval_attention, self.notes = kinterval_attention, notes
        self.softcap, self.sinks = softcap, sinks
        self.bias = None if bias is None else _bias(bias, H, T, device).detach()
        self.cache: dict = {}
        self.left_out: dict = {}  # (K-interval operator, D, dtype) -> share of flip-prone rows left out

    def _inputs(self, D, dtype):
        import torch

        g = torch.Generator(device="cpu").manual_seed(7)
        heads = (self.H, self.H // self.group, self.H // self.group)
        return [torch.randn(1, h, self.T, D, generator=g).to(self.device, dtype) for h in heads]

    def mods(self, q) -> dict:
        """The kernel's softcap / sinks / bias keywords of a call on ``q`` (sinks in q's dtype, on its
        device; the fp32 bias); {} if none."""
        mods = {} if self.softcap is None else {"softcap": self.softcap}
        if self.sinks:
            mods["sinks"] = _sinks(q.shape[1], q.dtype, q.device)
        if self.bias is not None:
            mods["bias"] = self.bias
        return mods

    def _ref64(self, spec, q, k, v):
        import torch

        mods = self.mods(q)  # the sinks rounded to the inputs' dtype, then exact in float64
        for name in ("sinks", "bias"):
            if name in mods:
                mods[name] = mods[name].double()
        with torch.no_grad():
            return self.kinterval_attention(
                *(x.double() for x in (q, k, v)), spec, causal=self.causal, backend="reference",
                enable_gqa=_gqa(q, k), **_reference_mods(mods),
            )  # fmt: skip

    def _flips(self, spec, q, k, D, valid):
        """``flip_rows`` on the softcapped scores plus the bias, with the sinks as one more key of every
        row."""
        from kinterval.ops.flips import flip_rows

        sinks = self.mods(q).get("sinks") if self.sinks else None
        k = k.repeat_interleave(self.group, 1)
        return flip_rows(spec, q, k, D**-0.5, valid, softcap=self.softcap, sinks=sinks, bias=self.bias)

    def _err(self, key, spec, dtype, D, fn, tf32=False):
        """max |fn(q, k, v) - ref64| on the (dtype-rounded) inputs, over the rows that hold no grid decision
        within fp32 rounding of a discontinuity (module doc), cached under key."""
        import torch

        from kinterval.ops.api import valid_mask

        if key not in self.cache:
            q, k, v = self._inputs(D, dtype)
            with torch.no_grad(), _tf32(tf32):
                out = fn(q, k, v)
            row_err = (out.double() - self._ref64(spec, q, k, v)).abs().amax(-1).cpu()
            valid = valid_mask((*q.shape[:-1], k.shape[-2]), "cpu", causal=self.causal, mask=None)
            flips = self._flips(spec, q, k, D, valid)
            if spec.kind != "softmax":
                self.left_out[(spec.full_name, D, str(dtype))] = flips.float().mean().item()
            self.cache[key] = row_err[~flips].max().item() if (~flips).any() else 0.0
        return self.cache[key]

    def note_left_out(self) -> None:
        """One line under the table: the share of flip-prone rows (K-interval operators, rounded-exp
        baselines) the error columns left out."""
        from kinterval.ops import OperatorSpec

        by_kind: dict[str, list[float]] = {}  # baselines flip far more rows than K-interval
        for (name, _, _), share in self.left_out.items():
            kind = OperatorSpec.from_full_name(name).kind
            by_kind.setdefault("K-interval operators" if kind == "kinterval" else kind, []).append(share)
        if by_kind:
            parts = [f"{k} {100 * min(v):.1f}-{100 * max(v):.1f}%" for k, v in sorted(by_kind.items())]
            _note(self.notes, f"error columns: rows left out ({', '.join(parts)}), a decision within fp32 "
                  "rounding of a discontinuity (kinterval.ops.flips)")  # fmt: skip

    def _torch(self, spec, sdpa_backend):
        """torch's evaluation of ``spec``: SDPA with ``sdpa_backend`` for plain softmax; the reference backend
        for every other operator (K-interval operators and the rounded-exp baselines alike) and for softmax
        with a softcap or sinks (SDPA has neither)."""
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        def fn(q, k, v):
            gqa, mods = _gqa(q, k), self.mods(q)
            if spec.kind != "softmax" or mods:
                return self.kinterval_attention(
                    q, k, v, spec, causal=self.causal, backend="reference", enable_gqa=gqa,
                    **_reference_mods(mods),
                )  # fmt: skip
            with sdpa_kernel(sdpa_backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa)

        return fn

    def torch_fp32(self, spec, D):
        """torch's own fp32 evaluation of ``spec``, TF32 off: SDPA math for softmax, else the reference."""
        import torch
        from torch.nn.attention import SDPBackend

        fn = self._torch(spec, SDPBackend.MATH)
        return self._err(("torch", spec.full_name, D), spec, torch.float32, D, fn)

    def torch_same(self, spec, mode, D):
        """torch's own evaluation of ``spec`` at the precision of ``mode`` (module doc): bf16 / fp16 inputs
        (softmax: SDPA flash), fp32 with TF32 matmuls for tf32 (softmax: SDPA math); ieee and the split dots
        aim at fp32: ``torch_fp32``."""
        import torch
        from torch.nn.attention import SDPBackend

        dtype_name, precision = DTYPE_MODES[mode]
        if dtype_name == "float32" and precision != "tf32":
            return self.torch_fp32(spec, D)
        tf32 = precision == "tf32"
        backend = SDPBackend.MATH if tf32 else SDPBackend.FLASH_ATTENTION
        key = ("torch-same", spec.full_name, dtype_name, tf32, D)
        try:
            return self._err(key, spec, getattr(torch, dtype_name), D, self._torch(spec, backend), tf32)
        except RuntimeError as err:  # SDPA flash unavailable on this device / head dim
            _note(self.notes, f"torch same-precision err of softmax in {mode}: SDPA flash failed "
                  f"({type(err).__name__}); '-'")  # fmt: skip
            self.cache[key] = None
            return None

    def kernel(self, spec, mode, D, triton_attention):
        """(err vs fp64, torch fp32 err, torch same-precision err) of the kernel in ``mode``; Nones without
        --err-t."""
        import torch

        if not self.T:
            return None, None, None
        dtype_name, precision = DTYPE_MODES[mode]

        def fn(q, k, v):
            return triton_attention(q, k, v, spec, causal=self.causal, precision=precision, **self.mods(q))

        key = ("kernel", spec.full_name, mode, D)
        err = self._err(key, spec, getattr(torch, dtype_name), D, fn)
        return err, self.torch_fp32(spec, D), self.torch_same(spec, mode, D)

    def flex(self, mode, D):
        """(err vs fp64, torch fp32 err, torch same-precision err) of FlexAttention softmax in the mode's
        flex numerics, with the softcap and the bias as its ``score_mod`` (FlexAttention has no sinks: self
        has none)."""
        import torch

        from kinterval.ops import OperatorSpec

        if not self.T:
            return None, None, None
        softmax = OperatorSpec.from_full_name("softmax")
        dtype_name, tf32 = _flex_numerics(mode)
        try:
            flex, block_mask = _flex(self.causal, self.T, self.device)
            err = self._err(("flex", dtype_name, tf32, D), softmax, getattr(torch, dtype_name), D,
                            lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=_gqa(q, k),
                                                 **_flex_mods(self.softcap, self.bias)),
                            tf32)  # fmt: skip
        except Exception as e:  # as in _flex_row
            _note(self.notes, f"flex-softmax error column: flex_attention failed ({type(e).__name__})")
            err = None
        return err, self.torch_fp32(softmax, D), self.torch_same(softmax, mode, D)


def _time_sdpa(bench, shape, device, causal, n):
    """SDPA flash fwd+bwd samples in bf16 at ``shape`` = (B, H, T, D, q heads per k/v head); None where flash
    cannot run."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D, group = shape
    sets = _inputs(B, H, T, D, torch.bfloat16, device, n, group)

    def call(q, k, v, do):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=group > 1).backward(do)

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


def _print_table(rows, notes, header):
    for line in header:
        print(f"# {line}")
    cells = [COLUMNS] + [[_cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    for j, row in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in notes:
        print(f"# {line}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as err:  # a bad argument (an unknown operator, --T 1,x): its message, not a traceback
        print(f"attention.py: error: {err}", file=sys.stderr)
        sys.exit(2)
