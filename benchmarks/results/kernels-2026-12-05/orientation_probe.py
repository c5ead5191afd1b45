"""Probe: which MMA does Triton 3.6 pick (sm_90a) for the dK/dV dots in two orientations."""

import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def dkdv_rows(Q, K, V, DO, DK, DV, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    # scores as (queries x keys), transposes for dv and dk (kinterval's current orientation)
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
        s = tl.dot(q, tl.trans(k))
        p = tl.exp2(s)
        dv += tl.dot(tl.trans(p.to(tl.bfloat16)), do)
        g = tl.dot(do, tl.trans(v))
        ds = p * g
        dk += tl.dot(tl.trans(ds.to(tl.bfloat16)), q)
    tl.store(DK + on[:, None] * D + od[None, :], dk)
    tl.store(DV + on[:, None] * D + od[None, :], dv)


@triton.jit
def dkdv_cols(Q, K, V, DO, DK, DV, T, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    # scores as (keys x queries): the tutorial's orientation
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
        sT = tl.dot(k, qT)
        pT = tl.exp2(sT)
        dv += tl.dot(pT.to(tl.bfloat16), do)
        gT = tl.dot(v, tl.trans(do))
        dsT = pT * gT
        dk += tl.dot(dsT.to(tl.bfloat16), tl.trans(qT))
    tl.store(DK + on[:, None] * D + od[None, :], dk)
    tl.store(DV + on[:, None] * D + od[None, :], dv)


def compile_probe(fn, BM, BN, D, warps, stages):
    target = GPUTarget("cuda", 90, 32)
    sig = {n: "*bf16" for n in ["Q", "K", "V", "DO"]} | {"DK": "*fp32", "DV": "*fp32", "T": "i32"}
    sig |= {"BM": "constexpr", "BN": "constexpr", "D": "constexpr"}
    src = ASTSource(fn=fn, signature=sig, constexprs={"BM": BM, "BN": BN, "D": D})
    out = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
    nvd = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(out.asm["cubin"])
    txt = subprocess.run([nvd, "-c", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", txt)
    from collections import Counter

    c = Counter(ops)
    return {k: c[k] for k in ("HMMA", "HGMMA", "LDSM", "STSM", "STS", "LDS")}, len(ops)


for BM, BN, w in [(64, 32, 4), (64, 64, 4), (128, 64, 8), (64, 128, 8)]:
    for fn in (dkdv_rows, dkdv_cols):
        print(fn.__name__, BM, BN, w, compile_probe(fn, BM, BN, 64, w, 2))
