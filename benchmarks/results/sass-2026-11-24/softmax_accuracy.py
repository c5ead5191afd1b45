"""Softmax probabilities against a float64 softmax of the same fp32 scores, by magnitude (NOTES section 2).

Usage: PYTHONPATH=src python benchmarks/results/sass-2026-11-24/softmax_accuracy.py [1,1e2,1e5]

Columns: the triton kernel (interpreter, key tiles of 16), torch.softmax in fp32, and FlashAttention's exp2
form emulated in fp32 (x = fma(q.k, RN(scale log2e), -RN(M log2e)), one rounding: products of fp32 values are
exact in fp64) over one block, over blocks of 16 with the rescale 2^{RN((M_old - M) log2e)} (the old kernel)
or 2^{RN(M_old log2e) - RN(M log2e)} (the kernel now), and the (s - M) log2e form. Each cell: the largest
relative error of an entry with P > 1e-4 / the relative Frobenius error, worst of 4 seeds.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
import numpy as np  # noqa: E402
import torch  # noqa: E402

from kinterval.ops.triton import triton_attention  # noqa: E402

T, SCALE = 64, 0.125
L32 = np.float32(np.log2(np.e))


def scores(c, seed):
    g = torch.Generator().manual_seed(seed)
    u = -8 * torch.rand(T, T, generator=g, dtype=torch.float64)  # spread of 8 below the max
    sign = torch.where(torch.rand(T, 1, generator=g) < 0.5, -1.0, 1.0).double()
    return (c * sign + u).float()  # the fp32 scores every method gets


def errors(P, s):
    P64 = torch.softmax(s.double(), -1)
    big = P64 > 1e-4
    d = P.double() - P64
    return (d.abs() / P64)[big].max().item(), (d.norm() / P64.norm()).item()


def kernel(s):
    # k = identity, q = s / scale (a power of two): scale q k^T is s exactly; v = identity: O = P
    q = (s / SCALE).view(1, 1, T, T)
    eye = torch.eye(T).view(1, 1, T, T)
    return triton_attention(q, eye, eye, "softmax", scale=SCALE)[0, 0]


def online(s, block, form):
    """The online softmax in fp32 over key blocks; form: "fa" (old rescale), "offsets" (new), "s-M"."""
    qk = (s / SCALE).double()
    c = np.float64(np.float32(SCALE * L32))
    M = torch.full((T,), -np.inf, dtype=torch.float32)
    W, acc = torch.zeros(T), torch.zeros(T, T)
    for j0 in range(0, T, block):
        blk = qk[:, j0 : j0 + block]
        Mn = torch.maximum(M.double() / SCALE, blk.max(-1).values).float() * np.float32(SCALE)
        off = Mn * L32  # RN(M log2e)
        if form == "s-M":
            w = torch.exp2((blk * SCALE - Mn.double()[:, None]).float() * L32)
        else:
            w = torch.exp2((blk * c - off.double()[:, None]).float())
        if form == "offsets":
            alpha = torch.exp2(M * L32 - off)
        else:
            alpha = torch.exp2((M - Mn) * L32)
        e = torch.zeros(T, T)
        e[:, j0 : j0 + block] = w
        W, acc, M = W * alpha + w.sum(-1), acc * alpha[:, None] + e, Mn
    return acc * (1 / W)[:, None]


METHODS = {
    "triton kernel": kernel,
    "torch.softmax fp32": lambda s: torch.softmax(s, -1),
    "FA form, one block": lambda s: online(s, T, "fa"),
    "FA form, blocks of 16": lambda s: online(s, 16, "fa"),
    "FA form, rescale from the rounded offsets": lambda s: online(s, 16, "offsets"),
    "(s - M) log2e form, blocks of 16": lambda s: online(s, 16, "s-M"),
}

if __name__ == "__main__":
    mags = [float(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,1e2,1e3,1e4,1e5,1e6").split(",")]
    print("| |s| | " + " | ".join(METHODS) + " |")
    print("|---" * (len(METHODS) + 1) + "|")
    for c in mags:
        cells = []
        for fn in METHODS.values():
            worst = np.max([errors(fn(scores(c, seed)), scores(c, seed)) for seed in range(4)], axis=0)
            cells.append(f"{worst[0]:.1e} / {worst[1]:.1e}")
        print(f"| {c:g} | " + " | ".join(cells) + " |")
