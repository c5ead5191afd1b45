"""Compile the fused kernels for sm_90 WITHOUT a GPU and print ptxas's resource report (no timing).

For each (kernel, operator, dtype, D, tile config) the table gives registers per thread, spill stores/loads
(bytes), shared memory and the compile time. Spills are the first thing to look at when a kernel is slow.

Usage:  python benchmarks/kernel_resources.py [--ops minmax-prob-k4,softmax] [--dtypes bf16,tf32] [--D 64,128]
        [--configs all|default] [--arch sm_90a]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

KERNEL_NAMES = ("fwd", "dq", "dkdv")


def _signature(fn, ptr_ty: str) -> dict[str, str]:
    """Triton signature strings of a kernel's arguments, read off its argument names (kernels.py)."""
    sig = {}
    for n in fn.arg_names:
        if n.isupper() and n not in ("Q", "V", "O", "OL", "DO", "DQ", "DK", "DV", "H", "D"):
            sig[n] = "constexpr"  # CALIB, MODE, ..., BLOCK_D
        elif n in ("scale", "kf", "tau"):
            sig[n] = "fp32"
        elif n.startswith("s") or n in ("H", "Tq", "Tk", "D"):
            sig[n] = "i32"  # strides and sizes
        elif n == "Mask":
            sig[n] = "*u8"
        elif n in ("Amax", "Amin"):
            sig[n] = "*i32"
        elif n in ("Q", "Kp", "V", "O", "DO", "DQ", "DK", "DV"):
            sig[n] = ptr_ty
        else:
            sig[n] = "*fp32"  # per-row statistics and O^L
    return sig


def _runtime_specialization(fn, sig, D, has_mask, B=16, H=32, T=1024):
    """What Triton's launcher specializes for contiguous (B, H, T, D) inputs at this shape: ints equal to 1
    become constexprs, ints divisible by 16 and 16-byte-aligned pointers get the divisibility hint. Without
    this the compile would assume unit strides might not be 1 (no vector loads), unlike the real launch."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    ints = {"H": H, "Tq": T, "Tk": T, "D": D}
    for t in "qkv":
        ints.update(
            zip((f"s{t}b", f"s{t}h", f"s{t}{'m' if t == 'q' else 'n'}", f"s{t}d"), (H * T * D, T * D, D, 1))
        )
    ints.update(zip(("smb", "smh", "smm", "smn"), (T, 0, 0, 1) if has_mask else (0, 0, 0, 0)))
    constexprs, attrs = {}, {}
    for i, (name, ty) in enumerate(sig.items()):
        if ty.startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ints:
            kind, key = native_specialize_impl(BaseBackend, ints[name], False, True, True)
            if kind == "constexpr":
                constexprs[name] = key
            elif "D" in key:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return constexprs, attrs


def sass_loop_stats(cubin: bytes, scores_per_thread: float) -> tuple[int, float]:
    """(instructions, instructions per score) of the longest loop in the SASS (nvdisasm): the kernels are
    bound by instruction issue, so this per-score count is their cost model."""
    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    txt = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True).stdout
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
    longest = 0
    for a, ins in code:  # a loop: a branch back to an earlier label
        m = re.search(r"BRA\W.*?(L_x_\d+)", ins)
        if m and addr.get(m.group(1), a) < a:
            longest = max(longest, sum(1 for b, _ in code if addr[m.group(1)] <= b <= a))
    return longest, longest / scores_per_thread


def compile_one(kernel, spec, dtype_mode, D, cfg, arch, causal=True, has_mask=False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kinterval.ops.triton import kernels as K
    from kinterval.ops.triton.autograd import operator_constants

    fn = K.KERNELS[kernel].fn
    ptr_ty = {"bf16": "*bf16", "fp16": "*fp16", "tf32": "*fp32", "ieee": "*fp32"}[dtype_mode]
    prec = {"bf16": "ieee", "fp16": "ieee", "tf32": "tf32", "ieee": "ieee"}[dtype_mode]
    flags, _, _ = operator_constants(spec)
    block_d = max(16, triton.next_power_of_2(D))
    split = K.split_loops(kernel, 2 if dtype_mode in ("bf16", "fp16") else 4, block_d, has_mask)
    tile = dict(BLOCK_M=cfg.kwargs["BLOCK_M"], BLOCK_N=cfg.kwargs["BLOCK_N"], BLOCK_D=block_d)
    constexprs = dict(**flags, IS_CAUSAL=causal, HAS_MASK=has_mask, PREC=prec, SPLIT=split, **tile)
    sig = _signature(fn, ptr_ty)
    runtime_constexprs, attrs = _runtime_specialization(fn, sig, D, has_mask)
    constexprs.update(runtime_constexprs)
    for name in runtime_constexprs:
        sig[name] = "constexpr"
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={(list(sig).index(k),): v for k, v in constexprs.items()},
        attrs=attrs,
    )
    t0 = time.perf_counter()
    out = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    )
    secs = time.perf_counter() - t0
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(out.asm["ptx"])
    res = subprocess.run(
        [ptxas, "-v", f"-arch={arch}", f.name, "-o", os.devnull], capture_output=True, text=True
    )
    os.unlink(f.name)
    log = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    smem = out.metadata.shared
    st, ld = (int(spill.group(1)), int(spill.group(2))) if spill else (None, None)
    per_thread = cfg.kwargs["BLOCK_M"] * cfg.kwargs["BLOCK_N"] / (32 * cfg.num_warps)
    loop, per_score = sass_loop_stats(out.asm["cubin"], per_thread)
    return dict(
        regs=int(regs.group(1)) if regs else None,
        spill_st=st,
        spill_ld=ld,
        smem=smem,
        secs=secs,
        loop=loop,
        per_score=per_score,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="softmax,minmax-prob-k4,fwm-weight-k4")
    p.add_argument("--dtypes", default="bf16")
    p.add_argument("--D", default="64,128")
    p.add_argument("--kernels", default=",".join(KERNEL_NAMES))
    p.add_argument("--configs", default="all", help="'all' (the autotune space) or 'first'")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--masks", default="causal", help="comma-separated from causal, mask, none")
    p.add_argument(
        "--split-max-d", type=int, help="override kernels.SPLIT_MAX_D, every kernel (0: never split)"
    )
    args = p.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    from kinterval.ops import OperatorSpec
    from kinterval.ops.triton import kernels as K

    if args.split_max_d is not None:
        K.SPLIT_MAX_D = {"fwd": args.split_max_d, "bwd": args.split_max_d}

    print(
        "| kernel | operator | dtype | D | BMxBN/warps/stages | regs | spill st/ld B | smem B "
        "| loop instr | instr/score | compile s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    masks = {"causal": (True, False), "mask": (False, True), "none": (False, False)}
    jobs = [(D, dm, name, kernel, mk) for D in (int(x) for x in args.D.split(","))
            for dm in args.dtypes.split(",") for name in args.ops.split(",")
            for kernel in args.kernels.split(",") for mk in args.masks.split(",")]  # fmt: skip
    for D, dm, name, kernel, mk in jobs:
        spec = OperatorSpec.from_full_name(name)
        cfgs = K.candidate_configs(kernel, fma=dm == "ieee")  # fp32 ieee dots: the FMA list
        for cfg in cfgs[:1] if args.configs == "first" else cfgs:
            r = compile_one(kernel, spec, dm, D, cfg, args.arch, *masks[mk])
            kw = cfg.kwargs
            c = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}/{cfg.num_warps}/{cfg.num_stages}"
            spill = f"{r['spill_st']}/{r['spill_ld']}"
            print(f"| {kernel} | {name} ({mk}) | {dm} | {D} | {c} | {r['regs']} | {spill} | {r['smem']} "
                  f"| {r['loop']} | {r['per_score']:.0f} | {r['secs']:.1f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
