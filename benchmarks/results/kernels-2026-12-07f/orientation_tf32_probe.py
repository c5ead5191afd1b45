"""Probe: the dK/dV dots of a softmax-like loop in two orientations, TF32 (fp32 inputs), sm_90a, no GPU.

rows: scores as queries x keys (kinterval's dK/dV kernel): P^T and dS^T are transposed for their dots.
cols: scores as keys x queries (Triton's tutorial): P^T and dS^T are the A operand as computed.
Prints the whole kernel's count of the opcodes that move a tile through shared memory and the MMAs.
"""

import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernel_resources import sass_loop_stats  # noqa: E402


@triton.jit
def dkdv_rows(
    Q, K, V, DO, DK, DV, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr
):
    n0 = tl.program_id(0) * BN
    on = n0 + tl.arange(0, BN)
    od = tl.arange(0, D)
    k = tl.load(K + on[:, None] * D + od[None, :])
    v = tl.load(V + on[:, None] * D + od[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for m0 in range(0, T, BM):
        om = m0 + tl.arange(0, BM)
        q = tl.load(Q + om[:, None] * D + od[None, :])
        do = tl.load(DO + om[:, None] * D + od[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=PREC)
        p = tl.exp2(s)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
        g = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * g
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
    tl.store(DK + on[:, None] * D + od[None, :], dk)
    tl.store(DV + on[:, None] * D + od[None, :], dv)


@triton.jit
def dkdv_cols(
    Q, K, V, DO, DK, DV, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr
):
    n0 = tl.program_id(0) * BN
    on = n0 + tl.arange(0, BN)
    od = tl.arange(0, D)
    k = tl.load(K + on[:, None] * D + od[None, :])
    v = tl.load(V + on[:, None] * D + od[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for m0 in range(0, T, BM):
        om = m0 + tl.arange(0, BM)
        qT = tl.load(Q + om[None, :] * D + od[:, None])
        do = tl.load(DO + om[:, None] * D + od[None, :])
        sT = tl.dot(k, qT, input_precision=PREC)
        pT = tl.exp2(sT)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)
        gT = tl.dot(v, tl.trans(do), input_precision=PREC)
        dsT = pT * gT
        dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=PREC)
    tl.store(DK + on[:, None] * D + od[None, :], dk)
    tl.store(DV + on[:, None] * D + od[None, :], dv)


def compile_probe(fn, BM, BN, D, warps, stages, dtype):
    target = GPUTarget("cuda", 90, 32)
    sig = {n: f"*{dtype}" for n in ["Q", "K", "V", "DO"]} | {"DK": "*fp32", "DV": "*fp32", "T": "i32"}
    sig |= {"BM": "constexpr", "BN": "constexpr", "D": "constexpr", "PREC": "constexpr"}
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={"BM": BM, "BN": BN, "D": D, "PREC": "tf32" if dtype == "fp32" else "ieee"},
        attrs={(i,): [["tt.divisibility", 16]] for i in range(7)},
    )
    out = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
    st = sass_loop_stats(out.asm["cubin"], BM * BN / (32 * warps))
    c = st["opcodes"]
    mix = {
        k: round(c[k] / (BM * BN / (32 * warps)), 2) for k in ("HMMA", "HGMMA", "LDSM", "STSM", "STS", "LDS")
    }
    return f"loop instr/score {st['per_score']:.2f}", mix


if __name__ == "__main__":
    dtypes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["fp32"]
    tiles = [
        (64, 32, 4, 2),
        (64, 64, 4, 1),
        (128, 64, 8, 1),
        (64, 128, 8, 1),
        (32, 128, 8, 1),
        (64, 128, 8, 2),
    ]
    for dtype in dtypes:
        for BM, BN, w, st in tiles:
            for fn in (dkdv_rows, dkdv_cols):
                print(
                    dtype,
                    fn.__name__,
                    f"{BM}x{BN}/{w}/{st}",
                    compile_probe(fn, BM, BN, 64, w, st, dtype),
                    flush=True,
                )
