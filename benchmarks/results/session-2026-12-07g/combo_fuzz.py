"""Random combinations of the kernels' options in Triton's interpreter, each held to the bound of the kernel
tests (tests/ops/test_triton.py ``check``): operator (core, other K, historical, a range_grad), dtype and
fp32 dot precision, batch, grouped heads, Tq, Tk, D, a value head dim of its own, masking, sinks, softcap and
a score bias with or without its gradient.

    python benchmarks/results/session-2026-12-07g/combo_fuzz.py SEED N     # N cases from SEED
    KINTERVAL_TRITON_BWD=fused python .../combo_fuzz.py SEED N              # the one-kernel backward
    python .../combo_fuzz.py SEED N --tiles   # each kernel on a random production (BLOCK_M, BLOCK_N), and
                                              # Tq, Tk drawn up to BLOCK_M + 20 and Tq + BLOCK_N + 20
    python .../combo_fuzz.py SEED N --wide    # D from 48, 64, 72, 96, 128 (the kernels' D > 64 branches)
    python .../combo_fuzz.py SEED N --variety # K from 1 to 1024, tau from 0.5 to 100, dyadic inputs (exact
                                              # scores, no tied extrema), rows of equal or tiny or wide spans

One line a case ("ok" or "FAIL" with check's message), then the number of failures. CPU only."""

import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
TESTS = Path(__file__).resolve().parents[3] / "tests"
sys.path[:0] = [str(TESTS / "ops"), str(TESTS)]

import pytest  # noqa: E402
import test_triton as tt  # noqa: E402
import torch  # noqa: E402

from kinterval.ops.triton import autograd as tri_autograd  # noqa: E402

tri_autograd.POISON_OUTPUTS = True  # every output starts as NaN: a finite result proves it was written
OPS = tt.CORE_OPS + tt.OTHER_K + tt.HISTORICAL_OPS


def case(seed0: int, i: int, tiles: bool = False, wide: bool = False, variety: bool = False):
    rnd = random.Random(seed0 * 1000 + i)
    configs = None
    if tiles:  # the interpreter otherwise runs one 16 x 16 tile; every production default is rectangular
        configs = {}
        for kind in tt._kernels_module.KERNELS:
            bm, bn = rnd.choice(tt.PRODUCTION_TILES)
            configs[kind] = tt.triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=4, num_stages=1)
    op = rnd.choice(OPS)
    if variety and "-k" in op:  # another K, and for FWM and resolved another tau
        base, _, extra = op.partition("[")
        base = base.rsplit("-k", 1)[0] + f"-k{rnd.choice([1, 2, 3, 5, 7, 32, 64, 256, 1024])}"
        overrides = [extra.rstrip("]")] if extra else []
        if base.startswith(("fwm", "resolved")) and rnd.random() < 0.7:
            overrides.append(f"tau={rnd.choice([0.5, 2.0, 6.0, 20.0, 100.0])}")
        op = base + (f"[{','.join(overrides)}]" if overrides else "")
    if rnd.random() < 0.3 and "-k" in op and "[" not in op and "exp" not in op:
        op += f"[range_grad={rnd.choice(tt.RANGE_GRADS)}]"
    dtype = rnd.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    precision = rnd.choice([None, "ieee", "tf32x3", "bf16x6"]) if dtype == torch.float32 else None
    Hk = rnd.choice([1, 2])
    H = Hk * rnd.choice([1, 1, 2, 3])
    Tk, Tq = rnd.randint(1, 45), rnd.randint(1, 45)
    if tiles:
        bm = max(c.kwargs["BLOCK_M"] for c in configs.values())
        bn = max(c.kwargs["BLOCK_N"] for c in configs.values())
        Tq = rnd.randint(1, bm + 20)
        Tk = rnd.randint(1, Tq + bn + 20)
    masking = rnd.choice(["causal", "mask", "none"])
    if masking == "causal" and Tq > Tk:
        Tq = Tk
    D = rnd.choice([48, 64, 72, 96, 128] if wide else [8, 16, 24, 32, 40])
    Dv = rnd.choice([D, D, 8, 16])
    sinks = rnd.random() < 0.3
    softcap = rnd.choice([None, None, 5.0, 30.0])
    bias = rnd.choice([0, 0, 1, 2])
    B = rnd.choice([1, 2])
    tiles_desc = (
        ""
        if configs is None
        else " "
        + ",".join(f"{kind} {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}" for kind, c in configs.items())
    )
    desc = (
        f"#{i} {op} {dtype} prec={precision} B{B} H{H}/{Hk} Tq{Tq} Tk{Tk} D{D} Dv{Dv} {masking} "
        f"sinks={sinks} softcap={softcap} bias={bias}{tiles_desc}"
    )
    dyadic = variety and rnd.random() < 0.3
    q, k, v, do = tt.make_inputs(B, H, Tq, Tk, D, seed=seed0 * 1000 + i, dtype=dtype, dyadic=dyadic)
    if variety and not dyadic:  # equal scores (degenerate MinMax rows), a tiny span, or a wide one
        factor = rnd.choice([1.0, 1.0, 0.0, 1e-4, 30.0])
        q = q * factor
        desc += f" q*{factor:g}"
    desc += " dyadic" if dyadic else ""
    k = k[:, :Hk].contiguous()
    g = torch.Generator().manual_seed(i)
    v = torch.randn(B, Hk, Tk, Dv, generator=g).to(dtype)
    do = torch.randn(B, H, Tq, Dv, generator=g).to(dtype)
    mask = torch.rand(B, 1, Tq, Tk, generator=g) < 0.7 if masking == "mask" else None
    kw = dict(causal=masking == "causal", mask=mask, precision=precision)
    if sinks:
        kw["sinks"] = torch.linspace(-2, 2, H).to(dtype)
    if softcap:
        kw["softcap"] = softcap
    if bias:
        kw["bias"] = (torch.randn(1, H, Tq, Tk, generator=g) * 0.5).requires_grad_(bias == 2)
    return desc, op, (q, k, v, do), kw, configs


def main() -> int:
    seed0, n = int(sys.argv[1]), int(sys.argv[2])
    tiles, wide, variety = ("--" + f in sys.argv[3:] for f in ("tiles", "wide", "variety"))
    fails = 0
    for i in range(n):
        desc, op, tensors, kw, configs = case(seed0, i, tiles, wide, variety)
        t0 = time.time()
        try:
            with pytest.MonkeyPatch.context() as mp:
                if configs is not None:
                    tt._use_tiles(mp, configs)
                tt.check(op, *tensors, **kw)
            print("ok  ", desc, f"{time.time() - t0:.0f}s", flush=True)
        except Exception as e:
            fails += 1
            print("FAIL", desc, type(e).__name__, str(e)[:600], flush=True)
    print("fails", fails)
    return 0


if __name__ == "__main__":
    sys.exit(main())
