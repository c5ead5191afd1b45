"""Forward error of near-fp32 tensor-core dots, emulated on a CPU (NOTES.md): which split mode could meet
"error against float64 <= 2x torch's fp32 attention" before a GPU measures it.

Usage: PYTHONPATH=src python benchmarks/results/numerics-2026-11-24/split_dot_error.py [T] [H] [rn|rz]

Each mode evaluates both products of attention (S = Q K^T and O = P V, P computed in fp32 from the mode's
S) the way Triton 3.6's F32DotTC pass rewrites an fp32 tl.dot, in float64 arithmetic with explicit
roundings:
- tf32x3: big = cvt.rna.tf32(a), small = a - big (exact in fp32); dots small.big + big.small (NaNs zeroed)
  + big.big. The tensor core reads an fp32 operand as TF32 by dropping its low 13 bits, so ``small`` is
  truncated ("tf32x3"); "tf32x3-rn" rounds it instead (CUTLASS's 3xTF32), to show what that truncation costs.
- bf16x3 / bf16x6: a = hi + mid + lo, each part round-to-nearest-even bf16 of what is left; products in
  Triton's order (bf16x6: mid.mid, lo.hi, hi.lo, mid.hi, hi.mid, then hi.hi; bf16x3 drops the first three).
- Every product of two parts is exact in fp32. The tensor core's fp32 accumulator is rounded to nearest
  after each k-step (8 for TF32, 16 for bf16), or toward zero with "rz" (tensor cores align the addends
  to the largest exponent and truncate; rz is the mildest form of that, and biased as it is). Each key
  block of 64 is one tl.dot from zero, added to the running output in fp32.
- ieee: the kernel's FMA dot, one fp32 rounding per product added (sequential over k).
- torch fp32: the reference backend in fp32 on the CPU (MKL), the "torch fp32 err" of benchmarks/attention.py.
First table: the scores' error alone. Second, over the rows that hold no grid decision within fp32 rounding
of a discontinuity (kinterval.ops.flips, as the benchmark's error columns): max |out - out64| (the
benchmark's "err vs fp64") and the relative Frobenius error, each also as a ratio to torch fp32's (worst of
2 seeds), and the rows off by more than 1e-4 (both seeds: a flip outside that set, which fp32 would not
make); B = 1, causal, q, k, v ~ N(0, 1).
"""

import sys

import torch

from kinterval.ops import OperatorSpec, kinterval_attention
from kinterval.ops.api import valid_mask
from kinterval.ops.flips import flip_rows
from kinterval.ops.reference import reference_probs

torch.set_num_threads(2)
T = int(sys.argv[1]) if len(sys.argv) > 1 else 512
H = int(sys.argv[2]) if len(sys.argv) > 2 else 4
ACC = sys.argv[3] if len(sys.argv) > 3 else "rn"
KEY_BLOCK = 64


def fp32(x):
    return x.float().double()


def acc32(x):
    """The tensor core's accumulator after a k-step: fp32, to nearest or toward zero (module doc)."""
    return fp32(x) if ACC == "rn" else round_bits(x, 24, "trunc")


def round_bits(x, sig, mode="rne"):
    """x (float64 holding fp32 values) to ``sig`` significant bits: nearest-even, nearest-away or toward 0."""
    m, e = torch.frexp(x)
    y = torch.ldexp(m, torch.full_like(e, sig))
    if mode == "rne":
        y = torch.round(y)
    elif mode == "rna":
        y = torch.sign(y) * torch.floor(y.abs() + 0.5)
    else:
        y = torch.trunc(y)
    return torch.ldexp(y, e - sig)


def parts(x, mode):
    if mode.startswith("tf32x3"):
        big = round_bits(x, 11, "rna")
        small = x - big  # exact in fp32
        return [big, round_bits(small, 11, "rne" if mode == "tf32x3-rn" else "trunc")]
    n = 2 if mode == "bf16x3" else 3
    out = []
    for _ in range(n):
        p = round_bits(x, 8, "rne")
        out.append(p)
        x = x - p  # exact
    return out


ORDER = {  # (lhs part, rhs part), first to last; the last product is hi.hi
    "tf32x3": [(1, 0), (0, 1), (0, 0)],
    "tf32x3-rn": [(1, 0), (0, 1), (0, 0)],
    "bf16x3": [(1, 0), (0, 1), (0, 0)],
    "bf16x6": [(1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)],
}


def mma(a, b, mode):
    """One tl.dot(a, b) from a zero accumulator, as F32DotTC rewrites it (module doc)."""
    if mode == "ieee":
        acc = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64)
        for k in range(a.shape[-1]):
            acc = fp32(acc + a[..., k : k + 1] * b[..., k : k + 1, :])
        return acc
    step = 8 if mode.startswith("tf32") else 16
    pa, pb = parts(a, mode), parts(b, mode)
    acc = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64)
    for i, j in ORDER[mode]:
        for k in range(0, a.shape[-1], step):
            acc = acc32(acc + pa[i][..., k : k + step] @ pb[j][..., k : k + step, :])
    return acc


def scores(q, k, mode):
    return torch.cat([mma(q, k[..., j : j + KEY_BLOCK, :].transpose(-1, -2), mode)
                      for j in range(0, k.shape[-2], KEY_BLOCK)], -1)  # fmt: skip


def attention(q, k, v, spec, valid, scale, mode):
    s = scores(q, k, mode)
    P = reference_probs((s * scale).float(), valid, spec).double()
    out = torch.zeros_like(q)
    for j in range(0, k.shape[-2], KEY_BLOCK):
        out = fp32(out + mma(P[..., j : j + KEY_BLOCK], v[..., j : j + KEY_BLOCK, :], mode))
    return out


def errs(x, ref, flips):
    """(max abs error over the rows that are not flip-prone, relative Frobenius error over those rows, rows
    off by more than 1e-4 outside the flip-prone set: a key moved across a grid boundary or Nearest midpoint
    where fp32 would not move it)."""
    d = (x - ref)[~flips]
    return d.abs().max().item(), (d.norm() / ref[~flips].norm()).item(), int((d.abs().amax(-1) > 1e-4).sum())


MODES = ["ieee", "tf32x3", "tf32x3-rn", "bf16x3", "bf16x6"]


def score_table():
    """Errors of S = Q K^T alone (what moves keys across grid boundaries): max and rms |S - S64|."""
    print("| D | torch fp32 | " + " | ".join(MODES) + " |")
    print("|---" * (2 + len(MODES)) + "|")
    for D in (64, 128):
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(1, H, T, D, generator=g) for _ in range(2))
        s64 = q.double() @ k.double().transpose(-1, -2)
        res = {"torch fp32": (q @ k.transpose(-1, -2)).double()}
        res.update({m: scores(q.double(), k.double(), m) for m in MODES})
        e = {m: ((x - s64).abs().max().item(), (x - s64).pow(2).mean().sqrt().item()) for m, x in res.items()}
        t = e["torch fp32"]
        print(f"| {D} | " + " | ".join(f"{a:.2e} ({a / t[0]:.1f}x) / {b:.2e} ({b / t[1]:.1f}x)"
                                       for a, b in e.values()) + " |", flush=True)  # fmt: skip


def main():
    print(f"T = {T}, H = {H}, causal, accumulator {ACC}\n")
    print("Scores S = Q K^T: max / rms |S - S64| (x torch fp32)\n")
    score_table()
    print("\nOutput, rows that are not flip-prone (kinterval.ops.flips): max abs err (x torch fp32) / rel "
          "Frobenius err (x torch fp32) / rows off by > 1e-4\n")  # fmt: skip
    print("| operator | D | torch fp32 | " + " | ".join(MODES) + " |")
    print("|---" * (3 + len(MODES)) + "|")
    for name in ["softmax", "lerp-k4", "fwm-prob-k4", "minmax-weight-k4"]:
        spec = OperatorSpec.parse(name)
        for D in (64, 128):
            worst = {}
            for seed in (0, 1):
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(1, H, T, D, generator=g) for _ in range(3))
                scale = D**-0.5
                valid = valid_mask((1, H, T, T), "cpu", causal=True, mask=None)
                ref = kinterval_attention(*(x.double() for x in (q, k, v)), spec, causal=True,
                                          backend="reference")  # fmt: skip
                flips = flip_rows(spec, q, k, scale, valid)
                out32 = kinterval_attention(q, k, v, spec, causal=True, backend="reference")
                row = {"torch fp32": errs(out32.double(), ref, flips)}
                q64, k64, v64 = (x.double() for x in (q, k, v))
                for mode in MODES:
                    row[mode] = errs(attention(q64, k64, v64, spec, valid, scale, mode), ref, flips)
                for key, val in row.items():
                    old = worst.get(key, (0, 0, 0))
                    worst[key] = (max(old[0], val[0]), max(old[1], val[1]), old[2] + val[2])
            t = worst["torch fp32"]
            cells = [f"{t[0]:.2e} / {t[1]:.2e} / {t[2]}"]
            cells += [f"{w[0]:.2e} ({w[0] / t[0]:.1f}x) / {w[1]:.2e} ({w[1] / t[1]:.1f}x) / {w[2]}"
                      for w in (worst[m] for m in MODES)]  # fmt: skip
            print(f"| {name} | {D} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
