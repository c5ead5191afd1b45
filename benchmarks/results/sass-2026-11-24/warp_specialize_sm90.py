"""Does Triton's automatic warp specialization (tl.range(..., warp_specialize=True)) act on Hopper? (NOTES
section 6.) Compiles a flash-style key loop (bf16 QK^T, exp2, PV) with and without the flag for sm_90 and
sm_100, no GPU needed, and prints the PTX hash and the number of ttg.warp_specialize regions.

Usage: python benchmarks/results/sass-2026-11-24/warp_specialize_sm90.py
"""

import hashlib

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def loop(Q, K, O, N, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, WS: tl.constexpr):
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    acc = tl.zeros([BM, D], tl.float32)
    for n in tl.range(0, N, BN, warp_specialize=WS):
        k = tl.load(K + (n + tl.arange(0, BN))[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        p = tl.exp2(s - tl.max(s, 1)[:, None])
        acc += tl.dot(p.to(tl.bfloat16), k)
    tl.store(O + offs_m[:, None] * D + offs_d[None, :], acc)


SIGNATURE = {"Q": "*bf16", "K": "*bf16", "O": "*fp32", "N": "i32"}
SIGNATURE.update({c: "constexpr" for c in ("BM", "BN", "D", "WS")})

print(f"triton {triton.__version__}")
for arch in (90, 100):
    for ws in (False, True):
        src = ASTSource(fn=loop, signature=SIGNATURE, constexprs={"BM": 128, "BN": 64, "D": 64, "WS": ws})
        options = {"num_warps": 8, "num_stages": 2}
        out = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        ptx = hashlib.sha256(out.asm["ptx"].encode()).hexdigest()[:10]
        regions = out.asm["ttgir"].count("ttg.warp_specialize")
        print(f"sm_{arch} warp_specialize={ws}: PTX {ptx}, {regions} ttg.warp_specialize regions")
