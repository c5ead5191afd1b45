"""Probe: what loading q and dO through TMA tensor descriptors saves in a softmax-like dK/dV loop (Triton 3.6,
sm_90a, compiled without a GPU). One kernel, its loads switched by the constexpr TMA: scores in kinterval's
orientation (queries x keys), P in the exponent, dV += P^T dO, dS = P (g - D), dK += dS^T q. `ptr` loads q
and dO by pointer with the row mask of the real kernel's last tile; `tma` through device-side descriptors of
the (T, D) matrices (rows past T come back as zeros, so no mask). Prints the loop's instructions per score
and its top opcodes.

    python benchmarks/results/kernels-2026-12-07/tma_probe.py
"""

import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
from benchmarks.kernel_resources import sass_loop_stats  # noqa: E402


@triton.jit
def dkdv(Q, K, V, DO, Row, DK, DV, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    n0 = tl.program_id(0) * BN
    on = n0 + tl.arange(0, BN)
    od = tl.arange(0, D)
    k = tl.load(K + on[:, None] * D + od[None, :])
    v = tl.load(V + on[:, None] * D + od[None, :])
    if TMA:  # device-side descriptors of the (T, D) matrices: rows past T load as zeros
        q_desc = tl.make_tensor_descriptor(Q, shape=[T, D], strides=[D, 1], block_shape=[BM, D])
        do_desc = tl.make_tensor_descriptor(DO, shape=[T, D], strides=[D, 1], block_shape=[BM, D])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for m0 in range(0, T, BM):
        om = m0 + tl.arange(0, BM)
        rmask = om < T
        if TMA:
            q = q_desc.load([m0, 0])
            do = do_desc.load([m0, 0])
        else:
            q = tl.load(Q + om[:, None] * D + od[None, :], mask=rmask[:, None], other=0.0)
            do = tl.load(DO + om[:, None] * D + od[None, :], mask=rmask[:, None], other=0.0)
        off = tl.load(Row + om, mask=rmask, other=float("inf"))
        dd = tl.load(Row + T + om, mask=rmask, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k)) - off[:, None])
        dv += tl.dot(tl.trans(p.to(tl.bfloat16)), do)
        g = tl.dot(do, tl.trans(v))
        ds = p * (g - dd[:, None])
        dk += tl.dot(tl.trans(ds.to(tl.bfloat16)), q)
    tl.store(DK + on[:, None] * D + od[None, :], dk)
    tl.store(DV + on[:, None] * D + od[None, :], dv)


def compile_probe(tma, BM, BN, D, warps, stages):
    sig = {n: "*bf16" for n in ["Q", "K", "V", "DO"]} | {"Row": "*fp32", "DK": "*fp32", "DV": "*fp32"}
    sig |= {"T": "i32", "BM": "constexpr", "BN": "constexpr", "D": "constexpr", "TMA": "constexpr"}
    # as Triton's launcher specializes a launch at T = 1024: every pointer and T divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(8)}
    consts = {"BM": BM, "BN": BN, "D": D, "TMA": tma}
    src = ASTSource(fn=dkdv, signature=sig, constexprs=consts, attrs=attrs)
    out = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    )
    scores = BM * BN / (32 * warps)  # scores a thread computes per loop trip
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(out.asm["ptx"])
    log = subprocess.run(
        [ptxas, "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True
    )
    os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", log.stdout + log.stderr)
    spill = re.search(r"(\d+) bytes spill stores", log.stdout + log.stderr)
    res = (regs.group(1) if regs else "-", spill.group(1) if spill else "-", out.metadata.shared)
    return sass_loop_stats(out.asm["cubin"], scores), res


print("| loads | tile BMxBN/warps/stages | regs | spill B | smem KB | loop instr/score | top opcodes |")
print("|---|---|---|---|---|---|---|")
for BM, BN, w, st in [(64, 32, 4, 2), (128, 64, 8, 1), (128, 64, 8, 2)]:
    for tma in (False, True):
        loads = "tma" if tma else "ptr"
        try:
            stats, (regs, spill, smem) = compile_probe(tma, BM, BN, 64, w, st)
        except Exception as e:  # a tile this Triton cannot build: say so and go on
            tile = f"{BM}x{BN}/{w}/{st}"
            print(f"| {loads} | {tile} | - | - | - | - | {type(e).__name__}: {str(e)[:80]} |")
            continue
        top = ", ".join(f"{op} {n / (BM * BN / (32 * w)):.2f}" for op, n in stats["opcodes"].most_common(8))
        row = [
            loads,
            f"{BM}x{BN}/{w}/{st}",
            regs,
            spill,
            smem // 1024,
            f"{stats['per_score']:.2f}",
            top,
        ]
        print("| " + " | ".join(map(str, row)) + " |")
