"""Compile the fused kernels for sm_90 WITHOUT a GPU and print ptxas's resource report (no timing).

For each (kernel, operator, dtype, D, tile config) the table gives registers per thread, spill stores/loads
(bytes), shared memory and the compile time. Spills are the first thing to look at when a kernel is slow.

Usage:  python benchmarks/kernel_resources.py [--ops minmax-prob-k4,softmax] [--dtypes bf16,tf32] [--D 64,128]
        [--configs all|first|BMxBN/W/S,...] [--arch sm_90a] [--mix N] [--gqa G]
(--configs 128x64/8/1,64x64/4/1: those tiles, in the table's BMxBN/warps/stages form, for every kernel,
whether or not they are autotune candidates.)
(--gqa G: grouped-query attention, k and v with HEADS / G heads against q's HEADS. --sinks: with attention
sinks, one per q head. --softcap C: with a softcap. --bias 1: with a (1, HEADS, T, T) fp32 score bias;
--bias 2: one that needs a gradient, which the dQ kernel writes.)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

# "infer" is the forward kernel as an inference call launches it (no backward: nothing saved for one);
# "fused" the one-kernel backward (KINTERVAL_TRITON_BWD=fused), which replaces dq + dkdv
KERNEL_NAMES = ("fwd", "infer", "dq", "dkdv", "fused")
TILE_KIND = {"infer": "fwd"}  # the candidate list a kernel name autotunes over
HEADS = 32  # q heads of the compiled launch (B = 16, T = 1024: _meta_launch)


def nvidia_tool(name: str, arch: int = 90) -> str:
    """The path of the CUDA tool ``name`` (ptxas, nvdisasm) that the installed Triton itself runs for
    ``arch``: Triton 3.9 assembles sm_90 with its newer ``ptxas-blackwell``, whose PTX ISA version the
    bundled ``ptxas`` does not read; before that, ``ptxas``."""
    import triton
    from triton import knobs

    if name == "ptxas":
        try:
            from triton.backends.nvidia.compiler import get_ptxas

            return get_ptxas(arch).path
        except (ImportError, AttributeError, TypeError):  # an older Triton: the bundled ptxas
            pass
    tool = getattr(knobs.nvidia, name, None)
    if tool is not None and tool.path:
        return tool.path
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _run_tool(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run a CUDA tool, or a RuntimeError with what it said: a table of "None" registers or an empty loop
    count would read as a result."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed (exit {res.returncode}): {res.stderr.strip()}")
    return res


def sass_loop_stats(cubin: bytes, scores_per_thread: float) -> dict:
    """The loops of the kernel's SASS (nvdisasm) and what they issue. The kernels are bound by instruction
    issue, so instructions per score are their cost model.

    Returns ``loops``, the instructions per score of every loop in code order (a loop: a branch back to an
    earlier label; the kernels' tile loops are not nested); ``longest`` and ``per_score``, the instructions
    of the longest loop, total and per score; ``opcodes``, that loop's opcodes (``FFMA``, ``ISETP``, ...;
    predicates and modifiers dropped) with their counts; and ``sass``, a hash of the whole instruction
    stream (equal hashes: a code change left the machine code identical)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    txt = _run_tool([nvidia_tool("nvdisasm"), "-c", f.name]).stdout
    os.unlink(f.name)
    addr, label, code = {}, None, []  # label -> address of its first instruction; (address, text)
    for line in txt.splitlines():
        if m := re.match(r"^\s*\.(L_x_\d+):", line):
            label = m.group(1)
        elif m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line):
            a = int(m.group(1), 16)
            if label:
                addr[label], label = a, None
            code.append((a, m.group(2)))
    ends = {}  # loop start -> its last back branch
    for a, ins in code:
        m = re.search(r"BRA\W.*?(L_x_\d+)", ins)
        if m and addr.get(m.group(1), a) < a:
            ends[addr[m.group(1)]] = a
    bodies = [[i for b, i in code if lo <= b <= hi] for lo, hi in sorted(ends.items())]
    body = max(bodies, key=len, default=[])
    opcodes = Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body)
    # kernel parameters are read from constant bank 0 at offsets that follow the argument order: masked,
    # so that regrouping the arguments (same instructions) keeps the hash
    stream = "\n".join(re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][param]", ins) for _, ins in code)
    return dict(
        loops=[len(x) / scores_per_thread for x in bodies],
        longest=len(body),
        per_score=len(body) / scores_per_thread,
        opcodes=opcodes,
        sass=hashlib.sha256(stream.encode()).hexdigest()[:12],
        text=txt,
    )


def launch_configs(kernel: str, dtype_mode: str, D: int) -> list:
    """The candidates a launch of ``kernel`` autotunes over, in order (the first: its default): the list of
    the dot precision (``kernels.tile_list``) less the tiles the launcher's pruner drops for the head dim
    (the FMA list above D = 64, the tensor-core list above D = 128)."""
    import torch

    from kinterval.ops.triton import kernels as K
    from kinterval.ops.triton.autograd import _block_d

    dtype, precision = dtype_and_precision(dtype_mode)
    kind = TILE_KIND.get(kernel, kernel)
    cfgs = K.candidate_configs(kind, tiles=K.tile_list(dtype, precision))
    return K._prune(cfgs, {"Q": torch.empty(0, dtype=dtype)}, kind=kind, BLOCK_D=_block_d(D), PREC=precision)


def explicit_tiles(configs: str) -> list:
    """--configs given as tiles, "128x64/8/1,64x64/4/1" (BLOCK_M x BLOCK_N / warps / stages): their
    triton.Configs; [] for 'all' and 'first'. Anything else stops the tool with the form it takes."""
    if configs in ("all", "first"):
        return []
    import triton

    out = []
    for tile in configs.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)/(\d+)/(\d+)", tile.strip())
        if not m:
            raise SystemExit(f"--configs takes 'all', 'first' or tiles like 128x64/8/1, got {tile!r}")
        bm, bn, warps, stages = map(int, m.groups())
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages))
    return out


def dtype_and_precision(dtype_mode):
    """bf16 / fp16 inputs, or fp32 inputs with the mode's dot precision (tf32, tf32x3, bf16x6, ieee)."""
    import torch

    from kinterval.ops.api import PRECISIONS

    if dtype_mode in ("bf16", "fp16"):
        return {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_mode], "ieee"
    if dtype_mode not in PRECISIONS:
        modes = ", ".join(("bf16", "fp16", *PRECISIONS))
        raise SystemExit(f"unknown dtype mode {dtype_mode!r}; choose from {modes}")
    return torch.float32, dtype_mode


def _meta_launch(
    kernel, spec, dtype_mode, D, causal, has_mask, group=1, B=16, H=HEADS, T=1024, sinks=False, softcap=None,
    bias=0,
):  # fmt: skip
    """The launch that ``triton_attention`` makes for contiguous (B, H, T, D) inputs (k, v with H / group
    heads), built by its own launch builders on meta tensors (no memory, no GPU): the same arguments, so the
    same specialization (ints equal to 1 become constexprs, multiples of 16 and aligned pointers get the
    divisibility hint)."""
    import torch

    from kinterval.ops.triton import autograd

    dtype, prec = dtype_and_precision(dtype_mode)
    q, k, v = (torch.empty(B, h, T, D, dtype=dtype, device="meta") for h in (H, H // group, H // group))
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool, device="meta") if has_mask else None
    sink_t = torch.empty(H, dtype=torch.float32, device="meta") if sinks else None
    bias_t = torch.empty(1, H, T, T, dtype=torch.float32, device="meta") if bias else None
    save = kernel != "infer"
    fwd, saved, consts = autograd.forward_launch(
        q, k, v, mask, spec, causal, 1 / D**0.5, prec, save=save, sinks=sink_t, softcap=softcap, bias=bias_t,
        bias_grad=bias == 2 and save,
    )  # fmt: skip
    if kernel in ("fwd", "infer"):
        return fwd
    if kernel == "fused":
        return autograd.fused_backward(torch.empty_like(q), saved, consts)[0][-1]  # after the row constants
    dq, dkdv, _ = autograd.backward_launches(torch.empty_like(q), saved, consts)
    return {"dq": dq, "dkdv": dkdv}[kernel]


def compile_one(
    kernel, spec, dtype_mode, D, cfg, arch, causal=True, has_mask=False, group=1, sinks=False, softcap=None,
    bias=0,
):  # fmt: skip
    """Compile one (kernel, operator, dtype, D, tile) for sm_90 as Triton's launcher would: its binder
    specializes the launch's arguments, then ``triton.compile`` for a GPUTarget (no device needed)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    launch = _meta_launch(
        kernel, spec, dtype_mode, D, causal, has_mask, group, sinks=sinks, softcap=softcap, bias=bias
    )
    fn = launch.kernel.fn  # the @triton.jit function under the autotuner
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = dict(
        launch.meta,
        **cfg.all_kwargs(),
        debug=knobs.runtime.debug,
        instrumentation_mode=knobs.compilation.instrumentation_mode,
    )
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    t0 = time.perf_counter()
    out = triton.compile(src, target=target, options=options.__dict__)
    secs = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(out.asm["ptx"])
    res = _run_tool([nvidia_tool("ptxas", target.arch), "-v", f"-arch={arch}", f.name, "-o", os.devnull])
    log = res.stdout + res.stderr
    os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    smem = out.metadata.shared
    st, ld = (int(spill.group(1)), int(spill.group(2))) if spill else (None, None)
    per_thread = cfg.kwargs["BLOCK_M"] * cfg.kwargs["BLOCK_N"] / (32 * cfg.num_warps)
    stats = sass_loop_stats(out.asm["cubin"], per_thread)
    return dict(
        regs=int(regs.group(1)) if regs else None,
        spill_st=st,
        spill_ld=ld,
        smem=smem,
        secs=secs,
        loop=stats["longest"],
        per_score=stats["per_score"],
        loops=stats["loops"],
        sass=stats["sass"],
        text=stats["text"],
        mix={op: n / per_thread for op, n in stats["opcodes"].most_common()},  # instructions per score
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--ops", default="softmax,minmax-prob-k4,fwm-weight-k4", help="comma-separated operators")
    p.add_argument("--dtypes", default="bf16", help="from bf16, fp16, tf32, tf32x3, bf16x6, ieee")
    p.add_argument("--D", default="64,128", help="comma-separated head dims")
    p.add_argument("--kernels", default=",".join(KERNEL_NAMES), help="comma-separated kernels")
    p.add_argument(
        "--configs",
        default="all",
        help="'all' (the autotune space), 'first' (the default tile) or tiles BMxBN/warps/stages, "
        "comma-separated (e.g. 128x64/8/1)",
    )
    p.add_argument("--arch", default="sm_90a", help="the GPU architecture compiled for")
    p.add_argument("--masks", default="causal", help="comma-separated from causal, mask, none")
    p.add_argument("--gqa", type=int, default=1, help=f"q heads per k/v head (of {HEADS}; 1: MHA)")
    p.add_argument(
        "--sinks",
        action="store_true",
        help="with attention sinks (the fused backward, which has none, is left out)",
    )
    p.add_argument("--softcap", type=float, help="with a softcap c (scores c tanh(s / c))")
    p.add_argument(
        "--bias",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="1: with a (1, H, T, T) fp32 score bias; 2: one that needs a gradient (with either, the fused "
        "backward, which takes no bias, is left out)",
    )
    p.add_argument(
        "--split-max-d", type=int, help="override kernels.SPLIT_MAX_D, every kernel (0: never split)"
    )
    p.add_argument(
        "--mix",
        type=int,
        default=0,
        metavar="N",
        help="add a column with the loop's N most frequent opcodes, instructions per score each",
    )
    p.add_argument(
        "--count",
        action="append",
        default=[],
        metavar="REGEX",
        help="add a column with the number of SASS instructions (whole kernel) that match REGEX, e.g. "
        "'FMNMX\\.NAN'; repeatable",
    )
    args = p.parse_args(argv)
    if args.gqa < 1 or HEADS % args.gqa:
        raise SystemExit(f"--gqa must divide the {HEADS} q heads, got {args.gqa}")
    os.environ.pop("TRITON_INTERPRET", None)
    from kinterval.ops import OperatorSpec
    from kinterval.ops.triton import kernels as K

    if args.split_max_d is not None:
        K.SPLIT_MAX_D = {"fwd": args.split_max_d, "bwd": args.split_max_d}

    for dm in args.dtypes.split(","):  # an unknown mode stops here, before the table
        dtype_and_precision(dm)
    tiles = explicit_tiles(args.configs)  # a malformed tile too
    extra = ([" opcode mix (instr/score) |"] if args.mix else []) + [f" count({rx}) |" for rx in args.count]
    print(
        "| kernel | operator | dtype | D | BMxBN/warps/stages | regs | spill st/ld B | smem B "
        "| loop instr | instr/score | SASS hash | compile s | every loop (instr/score) |" + "".join(extra)
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra))
    masks = {"causal": (True, False), "mask": (False, True), "none": (False, False)}
    jobs = [(D, dm, name, kernel, mk) for D in (int(x) for x in args.D.split(","))
            for dm in args.dtypes.split(",") for name in args.ops.split(",")
            for kernel in args.kernels.split(",") for mk in args.masks.split(",")
            if not ((args.sinks or args.bias) and kernel == "fused")]  # fmt: skip
    for D, dm, name, kernel, mk in jobs:
        spec = OperatorSpec.from_full_name(name)
        cfgs = tiles or launch_configs(kernel, dm, D)
        for cfg in cfgs[:1] if args.configs == "first" else cfgs:
            r = compile_one(
                kernel,
                spec,
                dm,
                D,
                cfg,
                args.arch,
                *masks[mk],
                group=args.gqa,
                sinks=args.sinks,
                softcap=args.softcap,
                bias=args.bias,
            )
            kw = cfg.kwargs
            c = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}/{cfg.num_warps}/{cfg.num_stages}"
            spill = f"{r['spill_st']}/{r['spill_ld']}"
            sass = f"{r['loop']} | {r['per_score']:.0f} | {r['sass']}"
            mix = " ".join(f"{op} {n:.1f}" for op, n in list(r["mix"].items())[: args.mix])
            mix = f" {mix} |" if args.mix else ""
            ins = [line for line in r["text"].splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]
            mix += "".join(f" {sum(bool(re.search(rx, x)) for x in ins)} |" for rx in args.count)
            loops = " / ".join(f"{n:.1f}" for n in r["loops"])
            print(f"| {kernel} | {name} ({mk}) | {dm} | {D} | {c} | {r['regs']} | {spill} | {r['smem']} "
                  f"| {sass} | {r['secs']:.1f} | {loops} |{mix}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
