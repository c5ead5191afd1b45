"""The fused kernels on seeded random combinations of their options, each held to ``check``'s bound (the
float64 reference; see test_triton.py): the operator (core, other K, historical, a range_grad), the dtype and
fp32 dot precision, batch, grouped k/v heads, Tq, Tk, D, a value head dim of its own, causal or a random
mask or none, attention sinks, a softcap, a score bias with or without its gradient, and the one-kernel
backward. The other tests vary one or two options at a time; these reach their interactions. Tq and Tk
are 8 or more, and a random mask leaves every row 2 keys: where every row has one key, the reference's dq
and dk are exactly 0 and the kernels' a rounding of g − D, which no relative bound can hold
(docs/kernels.md, Backward).

On a machine without CUDA the kernels run in Triton's CPU interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1``); importing test_triton skips this module where the kernels cannot run."""

from __future__ import annotations

import random

import pytest
import torch
from test_triton import (
    CORE_OPS,
    HISTORICAL_OPS,
    OTHER_K,
    RANGE_GRADS,
    _poison,  # noqa: F401  (autouse: every kernel output starts as NaN)
    check,
    make_inputs,
)

OPS = CORE_OPS + OTHER_K + HISTORICAL_OPS


def draw(seed: int) -> tuple[str, dict, list, dict]:
    """One combination: (operator, shape and options, [q, k, v, do], check's keywords), from ``seed``."""
    rnd = random.Random(seed)
    op = rnd.choice(OPS)
    if rnd.random() < 0.3 and "-k" in op and "[" not in op and "exp" not in op:
        op += f"[range_grad={rnd.choice(RANGE_GRADS)}]"
    dtype = rnd.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    precision = rnd.choice([None, "ieee", "tf32x3", "bf16x6"]) if dtype == torch.float32 else None
    Hk = rnd.choice([1, 2])
    H = Hk * rnd.choice([1, 2, 3])
    Tq, Tk = rnd.randint(8, 45), rnd.randint(8, 45)
    masking = rnd.choice(["causal", "mask", "none"])
    if masking == "causal":
        Tq = min(Tq, Tk)
    D = rnd.choice([8, 16, 24, 40])
    Dv = rnd.choice([D, D, 16])
    B = rnd.choice([1, 2])
    shape = dict(B=B, H=H, Hk=Hk, Tq=Tq, Tk=Tk, D=D, Dv=Dv, dtype=dtype, masking=masking)
    q, k, v, do = make_inputs(B, H, Tq, Tk, D, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    k = k[:, :Hk].contiguous()
    v = torch.randn(B, Hk, Tk, Dv, generator=g).to(dtype)
    do = torch.randn(B, H, Tq, Dv, generator=g).to(dtype)
    kw = dict(causal=masking == "causal", precision=precision)
    if masking == "mask":
        kw["mask"] = torch.rand(B, 1, Tq, Tk, generator=g) < 0.7
        kw["mask"][..., :2] = True  # every row attends to 2 keys or more
    if rnd.random() < 0.3:
        kw["sinks"] = torch.linspace(-2, 2, H).to(dtype)
    if rnd.random() < 0.5:
        kw["softcap"] = rnd.choice([5.0, 30.0])
    bias = rnd.choice([0, 0, 1, 2])
    if bias:
        kw["bias"] = (torch.randn(1, H, Tq, Tk, generator=g) * 0.5).requires_grad_(bias == 2)
    shape["fused"] = rnd.random() < 0.3
    return op, shape, [q, k, v, do], kw


@pytest.mark.parametrize("seed", range(24))
def test_random_option_combinations(seed, monkeypatch):
    op, shape, tensors, kw = draw(seed)
    if shape["fused"]:  # the one-kernel backward (calls with sinks or a bias keep the split one)
        monkeypatch.setenv("KINTERVAL_TRITON_BWD", "fused")
    check(op, *tensors, **kw)
