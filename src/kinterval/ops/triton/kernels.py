"""Triton kernels: a two-pass forward, a dQ kernel and a dK/dV kernel (FlashAttention-2-style recomputation).

Notation follows ``closed_form.py`` and §3 / App. B of the paper. Per query row i and key j:
s_ij = scale * q_i . k_j, M_i / m_i = row max / min over valid keys, z = s - M, grid (h, r, t_raw, t, E_r =
e^{b_r}, E_r1 = e^{b_{r+1}}), w^L = (1 - t) E_r + t E_r1, w^N = e^{b_l} (l = r + [t >= 1/2]),
Delta = (E_r1 - E_r) / h. t is differentiated as t_raw: the clamp on t only catches rounding (reference.py).

The paper's formulas are one ``@triton.jit`` helper each, named as in ``kinterval.ops.formulas``:
``grid``, ``lerp_weight``, ``nearest_weight``, ``weight_ste`` (eq. 3), ``prob_ste`` (eq. 4),
``calibration_grad`` (eq. 1), ``score_grad`` (eq. 2); the launcher computes the operator's constexpr
switches once (``kernel_flags``).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

import triton
import triton.language as tl

from kinterval.ops.triton import KERNEL_BASELINES

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
EPS_DEGENERATE = tl.constexpr(1e-12)  # App. A: a MinMax row with M - m <= eps is degenerate
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): e^x = 2^(x log2 e)
# Softmax's exponent fma(q.k, scale log2(e), -off) with off = M log2(e) rounded weighs the row max
# 2^delta, |delta| <= 1.5 ulp(off): a common factor normalization removes while it stays small. Past
# |off| = 2^26 (|M| > 4.65e7) it may reach 2^+-12 and beyond (2^-512 at |M| = 1e10: every weight 0), so
# such a row is NaN (_fwd_kernel's row check). Below it, W and O lose at most 12 bits of range.
SOFTMAX_OFFSET_LIMIT = tl.constexpr(2.0**26)

CALIB_CODES = {None: 0, "minmax": 1, "fwm": 2, "resolved": 3}
EXP_CODES = {name: code for code, name in enumerate(KERNEL_BASELINES)}  # the exp baselines (App. D.5)


# KINTERVAL_TRITON_AUTOTUNE=0 skips autotuning: each kernel runs its first (default) candidate below.
AUTOTUNE = os.environ.get("KINTERVAL_TRITON_AUTOTUNE", "1") != "0"

# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first of each list is the default. A warpgroup (4 warps) owns
# 64 rows of a tensor-core tile: 8 warps on 64 rows (or 4 on 32) hold every score twice, and the SASS loop
# then has ~2x the instructions per score (benchmarks/kernel_resources.py, bf16 D = 64, minmax-weight-k4:
# dQ 64x32/8 warps 107 against 128x32/8 warps 53; dK/dV 137 against 64x32/4 warps 70). So the defaults keep
# 64 rows per warpgroup; ptxas shows no spills for them at D = 64 and <= 132 B at D = 128 (TF32 dQ).
# dK/dV's dV += P^T dO and dK += dS^T q take the key block (BLOCK_N) as their rows: with 32 keys they run on
# mma.sync (HMMA, with LDSM transposes), with 64 on wgmma like the other two dots (but 32 x 64 / 4 warps stays
# on mma.sync, and 64 x 64 / 8 / 2 issues more per score: softmax 25.5). Its last two candidates issue 10-35%
# fewer instructions per score (bf16 D = 64, 128 x 64 / 8 warps / 1 stage:
# softmax 16.4 -> 12.1, minmax-weight-k4 35.6 -> 29.2; TF32 D = 64: 37.6 -> 24.3, 59.0 -> 42.0) with no
# spills at D <= 128 (TF32 D = 128: 320 KB of shared memory, more than an H100 has: skipped). Their speed is
# unmeasured, so neither is the default: autotuning decides. dQ's 128 x 64 / 8 / 1 (all its dots are wgmma
# anyway) halves its per-tile overhead: softmax 10.0 -> 7.2 (bf16 D = 64), 20.1 -> 17.2 (TF32); the
# K-interval loops gain 1-10% and MinMax's spills 24-540 B there.
CANDIDATES = {
    "fwd": [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (64, 32, 4, 2), (128, 64, 4, 3)],
    "dq": [(128, 32, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (32, 32, 4, 2), (128, 64, 8, 1)],
    "dkdv": [
        (64, 32, 4, 2),
        (32, 64, 4, 2),
        (64, 32, 8, 2),
        (64, 64, 8, 2),
        (32, 32, 4, 2),
        (128, 64, 8, 1),
        (64, 64, 4, 1),
    ],
}
# fp32 inputs with full-precision dots ("ieee") run Triton's FMA dot, not the tensor cores, and on the tiles
# above ptxas collapses to 32 registers and spills 10-60 KB per thread (minmax-prob-k4, D = 64, forward
# 128x64/8 warps: 34 KB). These tiles keep <= 8 scores per thread in one stage; at D = 64 their defaults do
# not spill, at D = 128 (32x16 tiles, below) the forward and dQ do not and dK/dV spills 16 B.
CANDIDATES_FMA = {
    "fwd": [(64, 32, 8, 1), (32, 32, 8, 1), (64, 16, 8, 1), (32, 16, 8, 1)],
    "dq": [(64, 16, 8, 1), (32, 32, 8, 1), (32, 16, 8, 1)],
    "dkdv": [(16, 64, 8, 1), (32, 16, 8, 1), (16, 32, 4, 1)],
}
# fp32 inputs with split-TF32 dots ("tf32x3", three tensor-core products per dot) hold about twice the
# registers of TF32: on the tiles above the fwm-prob-k4 forward spills 0.4 KB (D = 64, 128x64/8 warps) and
# dK/dV 0.4-1 KB. ptxas (sm_90a, D = 64, the core operators): these defaults spill at most 8 B (MinMax's dQ).
# At D = 128 the defaults spill too (forward up to 1 KB, dQ 0.4-0.8 KB, dK/dV 1.5-1.7 KB), and the 128-row dQ
# and the 128x64 forward need more shared memory than an H100 has (autotuning skips them; the defaults fit).
# Not timed: autotuning picks among them. The bf16x6 dots (three bf16 parts per operand, six products) use
# the same list: their defaults spill at most 4 B at D = 64, and at D = 128 the forward spills less than
# tf32x3's (fwm-prob-k4 0.8 KB against 1.0 KB).
CANDIDATES_TF32X3 = {
    "fwd": [(128, 32, 8, 2), (64, 32, 4, 2), (64, 32, 4, 1), (128, 64, 8, 2)],
    "dq": [(64, 16, 4, 2), (128, 32, 8, 2), (64, 32, 4, 2), (32, 32, 4, 2)],
    "dkdv": [(16, 64, 4, 2), (32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2)],
}
# The fused backward (one dK/dV program per key block that also adds its dQ share atomically) loops as dK/dV
# does and holds a dQ tile more. ptxas (sm_90a, minmax-weight-k4 / fwm-prob-k4, causal) on dK/dV's default
# 64x32/4 warps: bf16 D = 64 spills 48 / 0 B, D = 128 392 / 60 B, TF32 D = 128 0.9 / 0.5 KB; 16x64/4 and
# 64x16/4 spill 0-84 B in bf16 at D <= 128. Not timed yet (KINTERVAL_TRITON_BWD=fused is opt-in); the fp32
# "ieee" and split-TF32 lists start from dK/dV's.
# 128 x 64 / 8 / 1 as in dK/dV (wgmma for every dot): bf16 D = 64 spills nothing for softmax and fwm-prob-k4,
# 240-300 B for MinMax and LERP, which hold more tiles.
CANDIDATES["fused"] = [
    (64, 32, 4, 2),
    (16, 64, 4, 2),
    (64, 16, 4, 2),
    (128, 32, 8, 2),
    (32, 32, 4, 2),
    (128, 64, 8, 1),
]
for _tiles in (CANDIDATES_FMA, CANDIDATES_TF32X3):
    _tiles["fused"] = list(_tiles["dkdv"])
TILE_LISTS = {"mma": CANDIDATES, "fma": CANDIDATES_FMA, "tf32x3": CANDIDATES_TF32X3}
SPLIT_DOTS = ("tf32x3", "bf16x6")  # fp32 dots split into tensor-core products (the "tf32x3" tile list)


def tile_list(dtype, precision: str | None) -> str:
    """Which candidate list a launch uses: "fma" for fp32 "ieee" dots, "tf32x3" for the split dots (tf32x3,
    bf16x6), else "mma"."""
    if str(dtype) != "torch.float32":
        return "mma"
    return "fma" if precision == "ieee" else "tf32x3" if precision in SPLIT_DOTS else "mma"


def candidate_configs(kind: str, fma: bool = False, tiles: str | None = None) -> list[triton.Config]:
    """The autotune candidates of one kernel ("fwd", "dq", "dkdv" or "fused") from list ``tiles`` ("mma",
    "fma" or "tf32x3"; ``fma=True`` is "fma", the default "mma")."""
    tiles = tiles or ("fma" if fma else "mma")
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
        for bm, bn, w, st in TILE_LISTS[tiles][kind]
    ]


def _configs(kind: str) -> list[triton.Config]:
    """The autotune space of one kernel, every list once per tile (one small config in the interpreter: no
    benchmarking)."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    space = {}
    for tiles in TILE_LISTS:
        for c in candidate_configs(kind, tiles=tiles):
            space.setdefault(_tile(c), c)
    return list(space.values())


def _tile(c: triton.Config) -> tuple[int, int, int, int]:
    return c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages


def _area(c: triton.Config) -> int:
    return c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]


def _prune(configs, named_args, kind="fwd", **kwargs):
    """Keep the list that fits the dot precision (``tile_list``: CANDIDATES_FMA for fp32 "ieee",
    CANDIDATES_TF32X3 for split TF32, else CANDIDATES), in its order, drop tiles too large for the head dim
    (register pressure); keep at least one. Without autotuning (KINTERVAL_TRITON_AUTOTUNE=0) keep the first
    that also fits the device's shared memory: the default for this precision and head dim (autotuning skips
    a candidate that does not fit by itself)."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    tiles = tile_list(getattr(named_args.get("Q"), "dtype", None), kwargs.get("PREC", named_args.get("PREC")))
    fma = tiles == "fma"
    by_tile = {_tile(c): c for c in configs}
    kept = [by_tile[t] for t in TILE_LISTS[tiles][kind] if t in by_tile] or configs
    limit = (512 if block_d > 64 else 1 << 30) if fma else (64 * 32 if block_d > 128 else 1 << 30)
    kept = [c for c in kept if _area(c) <= limit] or [min(kept, key=_area)]
    if AUTOTUNE:
        return kept
    # e.g. D = 256, TF32: the 64 x 32 dQ tile needs 256 KB of shared memory, an H100 has 227 KB
    fits = (c for c in kept if _fits_shared_memory(kind, c, named_args, kwargs))
    return [next(fits, min(kept, key=_area))]


def _fits_shared_memory(kind, config, named_args, kwargs) -> bool:
    """Whether ``config`` of kernel ``kind`` fits the shared memory of the device of Q: compiles it (Triton
    caches the binary for the launch that follows). True off CUDA (the interpreter has no such limit)."""
    q = named_args.get("Q")
    if INTERPRET or getattr(getattr(q, "device", None), "type", None) != "cuda":
        return True
    fn = KERNELS[kind].fn
    # the autotuner hands the pruner its launch keywords too (grid, warmup): compile-only here
    constexprs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    compiled = fn.warmup(*named_args.values(), grid=(1,), **constexprs, **config.all_kwargs())
    if hasattr(compiled, "result"):  # asynchronous compilation mode
        compiled = compiled.result()
    if compiled is None:
        return True
    return compiled.metadata.shared <= _max_shared_mem()


def _max_shared_mem() -> int:
    driver = triton.runtime.driver.active
    return driver.utils.get_device_properties(driver.get_current_device())["max_shared_mem"]


def _pruner(kind: str) -> dict:
    return {"early_config_prune": functools.partial(_prune, kind=kind)}


def _timer(kernel_call, quantiles):
    """The autotuner's timer: the driver's benchmarker (Triton's default), and without autotuning no launch
    at all. Triton 3.6 times a new key's candidates whenever a kernel has several configs, even the single
    one ``_prune`` keeps when KINTERVAL_TRITON_AUTOTUNE=0: ~0.1 s of launches per kernel and shape."""
    if not AUTOTUNE:
        return [0.0] * len(quantiles)
    return triton.runtime.driver.active.get_benchmarker()(kernel_call, quantiles=quantiles)


def _patch_interpreter_index() -> None:
    """Interpreter shim: scalars are 1-element arrays there, and numpy >= 2.3 refuses ``int()`` on them, which
    breaks tensor loop bounds (``range(0, hi)``); read the single element instead. No effect on GPU."""
    try:
        import numpy as np
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover
        return
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_kinterval_shim", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._kinterval_shim = True
    interp._patch_lang_tensor = patched


def _patch_interpreter_fma() -> None:
    """Interpreter shim: its ``tl.fma`` is ``x * y + z`` in fp32, two roundings; the GPU's FFMA rounds once.
    The grid position (``_grid_position``) needs the single rounding (its residual fma is exact only then),
    so the interpreter's fp32 fma is computed exactly: the product in fp64 (exact), the sum with its TwoSum
    error, rounded once to fp32 (a sum that lands on an fp32 midpoint is moved one fp64 ulp toward its
    error first, so that the second rounding cannot break the tie the wrong way). No effect on GPU."""
    try:
        import numpy as np
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover
        return
    builder = getattr(interp, "InterpreterBuilder", None)
    original = getattr(builder, "create_fma", None)
    if original is None or getattr(original, "_kinterval_shim", False):
        return

    def create_fma(self, x, y, z):
        xd, yd, zd = (np.asarray(a.data) for a in (x, y, z))
        if not (xd.dtype == yd.dtype == zd.dtype == np.float32):
            return original(self, x, y, z)
        with np.errstate(all="ignore"):
            p = xd.astype(np.float64) * yd.astype(np.float64)  # exact: 24 + 24 significant bits
            c = zd.astype(np.float64)
            s = p + c
            bb = s - p
            err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err = p + c exactly
            r = s.astype(np.float32)
            r64 = r.astype(np.float64)
            toward = np.where(s > r64, np.float32(np.inf), np.float32(-np.inf))
            mid = (r64 + np.nextafter(r, toward).astype(np.float64)) / 2  # the fp32 midpoint beside s
            tie = (s == mid) & (err != 0) & np.isfinite(err)
            s = np.where(tie, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
            out = s.astype(np.float32)
        return interp.TensorHandle(out, z.dtype.scalar)

    create_fma._kinterval_shim = True
    builder.create_fma = create_fma


def _patch_interpreter_minmax() -> None:
    """Interpreter shim: ``tl.minimum``/``tl.maximum`` (``propagate_nan=NONE``) lower to the GPU's IEEE minNum
    and maxNum (PTX ``min.f32``/``max.f32``), which return the operand that is not NaN; the interpreter used
    ``np.minimum``/``np.maximum``, which return the NaN, so a NaN that the GPU drops reached the CPU tests'
    outputs. ``np.fmin``/``np.fmax`` have the GPU's semantics. No effect on GPU."""
    try:
        import numpy as np
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover
        return
    builder = getattr(interp, "InterpreterBuilder", None)
    if builder is None or getattr(getattr(builder, "create_minnumf", None), "_kinterval_shim", False):
        return

    def create_minnumf(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmin)

    def create_maxnumf(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmax)

    create_minnumf._kinterval_shim = create_maxnumf._kinterval_shim = True
    builder.create_minnumf, builder.create_maxnumf = create_minnumf, create_maxnumf


def _patch_interpreter_speed() -> None:
    """Interpreter shim for speed only: the same values, a third less time. Triton 3.6's interpreter patches
    ``triton.language`` (every builtin of tl, tl.tensor and tl.math, or of tl.core, whichever of the two
    modules the function's globals name, found with ``inspect.getmembers``) at each launch, and again at each
    call of a ``@triton.jit`` helper inside it; here a helper's call inside a launch skips the patch when the
    modules its globals name are patched already (the kernel's ``tl``; the first helper of Triton's own
    ``standard.py`` patches ``tl.core``). ``_get_np_dtype`` builds a 19-entry dict at each of its calls; here
    it is looked up once per type. And a ``tl.reduce`` with a combine function of its own runs it in Python
    once per element: the row maxima's ``_max_nan`` is ``np.max`` here (NaN if any operand is NaN, as the
    interpreter's ``tl.maximum(..., propagate_nan=ALL)``, ``np.maximum``). Then ``_lazy_tuple_types`` and
    ``_shared_block_types``: Triton's type bookkeeping, built once or when read. No effect on GPU."""
    try:
        import numpy as np
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover
        return
    executor = getattr(interp, "GridExecutor", None)
    patch_lang, np_dtype = getattr(interp, "_patch_lang", None), getattr(interp, "_get_np_dtype", None)
    if None in (executor, patch_lang, np_dtype) or getattr(patch_lang, "_kinterval_shim", False):
        return
    state = threading.local()  # per thread: the modules the launch under way has patched (None: no launch)

    def langs(fn) -> frozenset:  # what _patch_lang patches for fn: tl and/or tl.core, named in its globals
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def patched_lang(fn):
        done, needs = getattr(state, "patched", None), langs(fn)
        if done is not None and needs <= done:  # inside a launch that patched these modules already
            return interp._LangPatchScope()
        scope = patch_lang(fn)
        if done is not None:
            state.patched = done | needs
        return scope

    launch = executor.__call__

    def patched_launch(self, *args, **kwargs):
        outer, state.patched = getattr(state, "patched", None), frozenset()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.patched = outer

    dtypes = {}

    def get_np_dtype(tt_dtype):
        try:
            return dtypes[tt_dtype]
        except KeyError:
            dtypes[tt_dtype] = found = np_dtype(tt_dtype)
            return found
        except TypeError:  # pragma: no cover - an unhashable type
            return np_dtype(tt_dtype)

    reduce_ops = interp.ReduceOps
    apply_impl = reduce_ops.apply_impl

    def patched_apply_impl(self, input):
        if self.combine_fn is _max_nan and len(input) == 1:
            return self.min_max(input[0], val_reduce_op=np.max)
        return apply_impl(self, input)

    patched_lang._kinterval_shim = True
    interp._patch_lang, interp._get_np_dtype = patched_lang, get_np_dtype
    reduce_ops.apply_impl = patched_apply_impl
    executor.__call__ = functools.wraps(launch)(patched_launch)
    _lazy_tuple_types()
    _shared_block_types(interp.InterpreterBuilder)


def _lazy_tuple_types() -> None:
    """``tl.tuple`` (which ``triton.language`` builds for every tensor's shape, every block type's shape and
    every normalized tuple: ~12 per interpreted operation) derives its type from its values at construction,
    and the type's name, a string of every member type, with it; the interpreter reads few of them. Here the
    type is derived at its first read, from the same values (only ``_setitem`` changes them, and it sets the
    type anew)."""
    tup, derive = getattr(tl.core, "tuple", None), getattr(tl.core, "_type_for_tuple_values", None)
    if (
        tup is None
        or derive is None
        or list(inspect.signature(tup.__init__).parameters) != ["self", "args", "type"]
    ):
        return  # another Triton's tuple: left as it is
    init = tup.__init__

    def lazy_init(self, args, type=None):
        if type is not None:
            return init(self, args, type)
        self.values = [i for i in args]

    def get_type(self):
        found = self.__dict__.get("_kinterval_type")
        if found is None:
            found = self.__dict__["_kinterval_type"] = derive(self.values)
        return found

    def set_type(self, value):
        self.__dict__["_kinterval_type"] = value

    tup.__init__, tup.type = lazy_init, property(get_type, set_type)


def _shared_block_types(builder) -> None:
    """One ``tl.block_type`` per (element type, shape), not a new one (shape checks, name string) for every
    interpreted operation's result: block types are never changed after construction, and compare by value."""
    if not hasattr(builder, "get_block_ty") or not hasattr(tl.block_type, "with_element_ty"):
        return  # another Triton's interpreter: left as it is
    made = {}

    def block_type(dtype, shape):
        key = (dtype, tuple(shape))
        try:
            return made[key]
        except KeyError:
            made[key] = found = tl.block_type(dtype, shape)
            return found
        except TypeError:  # an unhashable element type (pointers)
            return tl.block_type(dtype, shape)

    def get_block_ty(self, dtype, shape):
        return block_type(dtype, shape)

    def with_element_ty(self, scalar_ty):
        return block_type(scalar_ty, self.shape)

    builder.get_block_ty, tl.block_type.with_element_ty = get_block_ty, with_element_ty


if INTERPRET:
    _patch_interpreter_index()
    _patch_interpreter_fma()
    _patch_interpreter_minmax()
    _patch_interpreter_speed()


# Interior tiles (in bounds, left of the causal diagonal, no user mask) can run an unmasked copy of each loop
# body, for 16-bit inputs up to a head dim read at import: KINTERVAL_TRITON_SPLIT_MAX_D (forward) and
# KINTERVAL_TRITON_SPLIT_BWD_MAX_D (dQ and dK/dV), both 64 by default; 0 never splits. Results are
# bit-identical either way; only speed differs. Measured on an H100 (bf16, D = 64, T = 1024 and 4096, two
# runs each, docs/performance.md): the split forward is faster (fwm-prob-k4 1.09 -> 0.84 ms), the split
# backward 2-9% slower. The backward default stays 64, the setting the GPU tests passed with, until a GPU run
# tests and times BWD = 0. Above D = 64 the second copy raises ptxas's spills (bf16 D = 128: dQ 200 -> 420 B).
def _env_max_d(name: str, default: str) -> int:
    value = os.environ.get(name, default)
    if not value.isdigit():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


SPLIT_MAX_D = {
    "fwd": _env_max_d("KINTERVAL_TRITON_SPLIT_MAX_D", "64"),
    "bwd": _env_max_d("KINTERVAL_TRITON_SPLIT_BWD_MAX_D", "64"),
}


def split_loops(kind: str, element_size: int, block_d: int, has_mask: bool) -> bool:
    """Whether kernel ``kind`` (fwd, dq, dkdv, fused) runs interior tiles through the unmasked copy of its
    loop body (see above); the launcher passes it as the constexpr SPLIT, so that it is part of every compile
    and autotune key."""
    limit = SPLIT_MAX_D["fwd" if kind == "fwd" else "bwd"]
    return (not has_mask) and block_d <= limit and element_size <= 2


# The operator's constexpr switches, computed once by the launcher from the spec (kernel_flags):
#   CALIB            0 an exp baseline, 1 MinMax, 2 FWM, 3 resolved (the grid of §3 / App. A);
#   SOFTMAX          softmax (no grid; one online pass in the forward);
#   HARD             the forward weight is Nearest (Weight-STE, Prob-STE), else LERP (or exp);
#   JACOBIAN_AT_PL   Prob-STE: the backward's normalization Jacobian is at (P^L, W^L), not at the forward P;
#   HISTORICAL       the STE operators' historical arithmetic (App. C.2), else strict;
#   KEEP_MAX_TERM    range_grad keeps the max channel of eq. (2) (full, max_only);
#   KEEP_MIN_TERM    MinMax and range_grad keeps the min channel (full, min_only);
#   SUM_GM           the dQ kernel sums G_M = sum_j gamma_j dw_j/dM of eq. (1) (MinMax, a channel kept);
#   PROJECT_P1       the P1 control: dS projected onto the zero-sum subspace of the valid keys (App. B);
#   EXP              the reduced-precision exp baselines (App. D.5): 1 BF16-exp, 2 FP8-exp, else 0;
#   FORWARD_PINS     the forward's pass 2 pins the arg keys (grid): it forms w^L (LERP, Prob-STE's W^L,
#                    historical arithmetic); strict Weight-STE weighs by w^N alone, the baselines by no grid.
OP_FLAGS = ("CALIB", "SOFTMAX", "HARD", "JACOBIAN_AT_PL", "HISTORICAL", "EXP", "FORWARD_PINS")  # the OP tuple
GRAD_FLAGS = ("KEEP_MAX_TERM", "KEEP_MIN_TERM", "SUM_GM", "PROJECT_P1")  # the kernels' GRAD tuple
FLAG_NAMES = OP_FLAGS + GRAD_FLAGS


def kernel_flags(
    calibration: str | None,
    surrogate: str | None,
    range_grad: str,
    historical: bool,
    baseline: str = "softmax",
) -> dict:
    """The constexpr switches above for one operator (``calibration`` None: the exp ``baseline``, one of
    EXP_CODES; ``surrogate`` None: LERP or a baseline). The exp baselines keep the max on the tape (App. D.5):
    softmax's max channel is 0 in exact arithmetic and left out; BF16-exp's and FP8-exp's is not."""
    softmax = calibration is None and baseline == "softmax"
    minmax = calibration == "minmax"
    keep_max = not softmax and range_grad in ("full", "max_only")
    keep_min = minmax and range_grad in ("full", "min_only")
    return dict(
        CALIB=CALIB_CODES[calibration],
        SOFTMAX=softmax,
        HARD=surrogate is not None,
        JACOBIAN_AT_PL=surrogate == "prob",
        HISTORICAL=surrogate is not None and historical,
        KEEP_MAX_TERM=keep_max,
        KEEP_MIN_TERM=keep_min,
        SUM_GM=minmax and (keep_max or keep_min),
        PROJECT_P1=range_grad == "p1",
        EXP=EXP_CODES[baseline] if calibration is None else 0,
        FORWARD_PINS=calibration is not None and not (surrogate == "weight" and not historical),
    )


def group_flags(flags: dict) -> dict:
    """``kernel_flags`` as the kernels take them: the constexpr tuples OP and GRAD (named above)."""
    return dict(OP=tuple(flags[n] for n in OP_FLAGS), GRAD=tuple(flags[n] for n in GRAD_FLAGS))


# Autotuning key: the shape (H, Tq, Tk, D, G), the switches, and (added by the autotuner) the dtypes of the
# tensor arguments Q and Mask (Q is a top-level argument for that: tensors inside tuples add no dtype).
_KEY = ["shape", "BLOCK_D", "OP", "GRAD", "MASKING", "PREC", "SPLIT"]


# ---------------------------------------------------------------------------------------- tile helpers
# Grouped arguments of the kernels and helpers below (tuples, unpacked by name at the top of each function).
# The entry points (built by autograd.forward_launch / backward_launches):
#   Q                                   top-level: the autotuner keys on the dtypes of top-level tensors
#   ins     = (Kp, V, Mask[, DO][, Sinks], Bias)   inputs (DO in the backward; Sinks in the forward and dQ)
#   stats   = the per-row buffers a backward kernel reads; outs = the buffers a kernel writes (the dQ
#             kernel's last, DBias, dL/ds of every score when the bias needs a gradient)
#   strides = (q, k, v, mask, bias strides), each (batch, head, row, dim)
#   shape   = (H, Tq, Tk, D, G); consts = (scale, K, tau, cap): cap the softcap c (1 without one)
#             G: q heads per k/v head (grouped-query attention; 1 without it): q head h reads k/v head h // G
# The helpers:
#   OP      = (CALIB, SOFTMAX, HARD, JACOBIAN_AT_PL, HISTORICAL, EXP) operator switches (constexpr)
#   GRAD    = (KEEP_MAX_TERM, KEEP_MIN_TERM, SUM_GM, PROJECT_P1)      range_grad switches (constexpr)
#   MASKING = (IS_CAUSAL, HAS_MASK, HAS_SINKS, SOFTCAP, BIAS)         (constexpr): the keys a row sees, and
#             HAS_SINKS: one attention sink per q head (Sinks, fp32 (H,)), a key Tk without a value;
#             SOFTCAP: the scores are softcapped, s = c tanh(scale q.k / c) (Gemma 2);
#             BIAS: an additive score bias (ALiBi, T5), s = c tanh(scale q.k / c) + bias: 0 none, 1 a bias,
#             2 a bias whose gradient dL/ds the dQ kernel writes (DBias)
#   scales  = (scale, cap)                                            the scores' scale and softcap c
#   mask    = (mask_base, stride_mm, stride_mn, bias_base, stride_bm, stride_bn[, dbias_base])
#             user mask and score bias of this (batch, head) (stride 0 on broadcast dims); the dQ kernel's
#             also the row-major (Tq, Tk) slice of DBias
#   keys    = (k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd)
#   bounds  = (offs_m, offs_d, dmask, Tq, Tk)                         the query block and the head dim
#   row     = (h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2)  per-row grid constants (row_constants)
_INTERP = tl.constexpr(INTERPRET)


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """tl.dot with fp32 accumulation; the interpreter mis-multiplies bf16, so it gets fp32 copies there. The
    split dots are the kernels' own (``_dot_tf32x3``, ``_dot_bf16x6``), in the interpreter too."""
    if PREC == "tf32x3":
        return _dot_tf32x3(a, b)
    elif PREC == "bf16x6":
        return _dot_bf16x6(a, b)
    elif _INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


# The split dots (fp32 inputs, near-fp32 products on the tensor cores). Triton's own input_precision="tf32x3"
# and "bf16x6" (3.6 to 3.9, their TTGIR) compute the same parts and products in the same order, then zero
# the NaNs of the sum of the small products before the largest product is added (so that an infinite operand
# gives inf rather than the NaN of inf - inf in its small part): a compare and a select per output element of
# every dot, which the kernels pay per score in QK^T and D / BLOCK_N times per score in each P V-like dot (and
# ptxas expands the PTX cvt.rna.tf32.f32 of the TF32 split with a compare of its own per element). Without
# them the results are Triton's bit for bit wherever the inputs are finite; an infinite or NaN operand makes
# its products NaN (a valid key's infinite v: O is NaN, not inf). The kernels make a row with a non-finite
# score NaN anyway.


@triton.jit
def _tf32_split(x):
    """x = hi + lo: hi is x rounded to TF32 (10 fraction bits, to nearest with ties away from zero: PTX's
    cvt.rna.tf32.f32 for every x but NaN), lo = x - hi, exact. On the bits: add half a TF32 ulp to the
    magnitude and clear the 13 low bits (a carry into the exponent is the rounding up to the next binade)."""
    bits = x.to(tl.int32, bitcast=True)
    hi = ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _dot_tf32x3(a, b):
    """a b in split TF32: a_lo b_hi + a_hi b_lo + a_hi b_hi, three TF32 products accumulated in fp32 in that
    order (``_tf32_split``; a_lo b_lo, under 2^-22 |a| |b|, is left out, and the tensor cores read a_lo and
    b_lo truncated to TF32)."""
    a_hi, a_lo = _tf32_split(a)
    b_hi, b_lo = _tf32_split(b)
    d = tl.dot(a_lo, b_hi, input_precision="tf32")
    d = tl.dot(a_hi, b_lo, d, input_precision="tf32")
    return tl.dot(a_hi, b_hi, d, input_precision="tf32")


@triton.jit
def _bf16_split3(x):
    """x = hi + mid + lo, exactly for |x| above 2^-110 (24 significant bits in 8 + 8 + 8; smaller x loses
    lo's bits to bf16's subnormals): each part the bf16 rounding (to nearest even) of what the parts before
    it leave; the residuals are exact in fp32."""
    hi = _cast(x, tl.bfloat16)
    r = x - hi.to(tl.float32)
    mid = _cast(r, tl.bfloat16)
    lo = _cast(r - mid.to(tl.float32), tl.bfloat16)
    return hi, mid, lo


@triton.jit
def _bf16_dot(a, b, d):
    """d + a b for bf16 parts (fp32 copies in the interpreter, which mis-multiplies bf16; their products are
    exact in fp32)."""
    if _INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), d, input_precision="ieee")
    else:
        return tl.dot(a, b, d)


@triton.jit
def _dot_bf16x6(a, b):
    """a b from three bf16 parts per operand (``_bf16_split3``): the six largest of the nine products,
    mid mid + lo hi + hi lo + mid hi + hi mid + hi hi, accumulated in fp32 in that order (Triton's for
    input_precision="bf16x6"; the three left out are under 2^-24 |a| |b|)."""
    a_hi, a_mid, a_lo = _bf16_split3(a)
    b_hi, b_mid, b_lo = _bf16_split3(b)
    d = _bf16_dot(a_mid, b_mid, None)
    d = _bf16_dot(a_lo, b_hi, d)
    d = _bf16_dot(a_hi, b_lo, d)
    d = _bf16_dot(a_mid, b_hi, d)
    d = _bf16_dot(a_hi, b_mid, d)
    return _bf16_dot(a_hi, b_hi, d)


@triton.jit
def _cast(x, dtype: tl.constexpr):
    """fp32 -> dot/store dtype, round-to-nearest-even (the GPU's cast; the interpreter's bf16 cast truncates,
    so there the rounding is done on the bits first and the cast is exact)."""
    if dtype == tl.float32:
        return x
    elif _INTERP and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def _round_bf16(x):
    """fp32 rounded to the nearest bfloat16 (ties to even), as fp32."""
    return _cast(x, tl.bfloat16).to(tl.float32)


@triton.jit
def _round_e4m3(x):
    """x in [0, 1] rounded to the nearest FP8 E4M3 value (ties to even), as torch.float8_e4m3fn does, in
    integer and fp32 arithmetic (the same on every GPU and in the interpreter). Normal range (x >= 2^-6):
    3 stored mantissa bits; below it the subnormal step 2^-9, by adding and removing 2^14 (whose ulp it
    is)."""
    bits = x.to(tl.uint32, bitcast=True)
    normal = (((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) << 20).to(tl.float32, bitcast=True)
    return tl.where(x < 0.015625, (x + 16384.0) - 16384.0, normal)


@triton.jit
def exp_baseline(z, EXP: tl.constexpr):
    """The reduced-precision exponential baselines (App. D.5) at z = s - M <= 0: (w, dw/dz) with w the
    forward weight. BF16-exp: w = bf16(e^{bf16(z)}), the exp of the bf16-rounded z with a bf16 result;
    dw/dz = w, the factor of autograd through the casts (``score_grad`` rounds it as bf16 arithmetic
    does). FP8-exp: w = E4M3(e^z), the rounded fp32 exponential, and dw/dz = e^z, the fp32 exponential's
    derivative of its identity surrogate w^fp8 + (w^exp - sg(w^exp))."""
    if EXP == 1:
        w = _round_bf16(tl.exp(_round_bf16(z)))
        return w, w
    else:
        e = tl.exp(z)
        return _round_e4m3(e), e


@triton.jit
def _tanh(x):
    """tanh in fp32 to a few ulp (one formula for the GPU and the interpreter, which has no libdevice tanh):
    below |x| = 1/4 its odd series to x^9 (truncation < 1e-8 relative), above 1 - 2/(e^{2|x|} + 1) with x's
    sign (exactly +-1 once e^{2|x|} overflows); NaN stays NaN."""
    a = tl.abs(x)
    x2 = x * x
    small = x + x * x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 + x2 * (62.0 / 2835))))
    big = 1.0 - 2.0 / (tl.exp2(a * (2.0 * LOG2E)) + 1.0)
    return tl.where(a < 0.25, small, tl.where(x < 0, -big, big))


@triton.jit
def _softcapped(qk, scales):
    """(s, th): the softcapped score s = c tanh(scale q.k / c) of the products ``qk`` and th = s / c, whose
    1 - th^2 is ds/d(scale q.k), the chain factor the backward's dots take."""
    scale, cap = scales
    th = _tanh(qk * (scale / cap))
    return th * cap, th


@triton.jit
def _biased(qk, bias, scales, SOFTCAP: tl.constexpr):
    """(s, th, f) with a score bias: s = c tanh(scale q.k / c) + bias (the softcap first, then the bias, as
    transformers' eager attention orders them; without SOFTCAP s = scale q.k + bias), th = tanh(scale q.k / c)
    of the capped part (``_softcapped``; s itself without SOFTCAP, unused) and f = s where scale q.k, the bias
    and s are finite, NaN elsewhere (fma(x, 0, y) is NaN for x or y not finite): a row max of f over valid
    keys is NaN exactly on the rows ``kinterval_attention`` returns as NaN (``_valid_flagged``)."""
    scale, cap = scales
    if SOFTCAP:
        s, th = _softcapped(qk, scales)
        s = s + bias
        f = tl.fma(qk * scale, 0.0, tl.fma(s, 0.0, s))
    else:
        s = qk * scale + bias
        th = s
        f = tl.fma(s, 0.0, s)
    return s, th, f


@triton.jit
def _bias_tile(offs_m, offs_n, Tq, Tk, mask):
    """The score bias of the tile (``mask`` = (.., .., .., bias_base, stride_bm, stride_bn)) in fp32, 0 out
    of bounds (rows past Tq too: interior tiles hold such rows, and the bias has none)."""
    inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
    ptrs = mask[3] + offs_m[:, None] * mask[4] + offs_n[None, :] * mask[5]
    return tl.load(ptrs, mask=inb, other=0.0).to(tl.float32)


@triton.jit
def _bias_at(bias_base, offs_m, key, sbm, sbn, rmask, Tk):
    """The score bias of each row at its key ``key`` (an arg key), fp32; 0 for a row past Tq or a key out
    of [0, Tk) (the sink, Tk; no arg key, -1)."""
    ok = rmask & (key >= 0) & (key < Tk)
    return tl.load(bias_base + offs_m * sbm + key * sbn, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _scores(q, kT, scales, M, PREC: tl.constexpr, SOFTMAX: tl.constexpr, SOFTCAP: tl.constexpr, bias=None,
            off=None):  # fmt: skip
    """(s, th): the score tile s = scale q k^T, softcapped with SOFTCAP (th = s / c, ``_softcapped``; else th
    is not formed), plus the score ``bias`` tile when given (``_biased``). Softmax needs only e^{s - M}: for
    it the tile is the exponent (s - M) log2(e) instead, one FMA per score, so that ``tl.exp2`` of it is the
    weight (FlashAttention's exp2 form; the row max then weighs 2^{rounding} rather than exactly 1, which
    normalization absorbs while |M log2(e)| < SOFTMAX_OFFSET_LIMIT: _fwd_kernel makes a row past it NaN).
    ``off``: the rows' exponent offset in place of M log2(e) (``softmax_log2_normalizer``: exp2 of the tile
    is then P itself)."""
    scale, cap = scales
    qk = _dot(q, kT, PREC)
    th = qk  # unused without SOFTCAP
    if SOFTMAX and off is None:
        off = M * LOG2E
    if bias is not None:
        s, th, _ = _biased(qk, bias, scales, SOFTCAP)
        if SOFTMAX:
            s = tl.fma(s, LOG2E, -off[:, None])
    elif SOFTCAP:
        s, th = _softcapped(qk, scales)
        if SOFTMAX:
            s = tl.fma(s, LOG2E, -off[:, None])
    elif SOFTMAX:
        s = tl.fma(qk, scale * LOG2E, -off[:, None])
    else:
        s = qk * scale
    return s, th


@triton.jit
def _chain(ds, th, SOFTCAP: tl.constexpr):
    """dL/d(scale q.k) from dL/ds: the softcap's chain factor 1 - th^2 (eq. 2's dS times tanh's derivative),
    what the dots into dQ and dK take; the row sums (S1 and G_M of eq. 2) stay in s."""
    if SOFTCAP:
        return ds * (1.0 - th * th)
    else:
        return ds


@triton.jit
def _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING: tl.constexpr, FULL: tl.constexpr):
    """Keys query i may attend: in bounds, causal (last query on last key), user mask (stride 0 ok).
    FULL: an interior tile the caller knows to be entirely valid; a constant tile folds the selects on it."""
    IS_CAUSAL: tl.constexpr = MASKING[0]
    HAS_MASK: tl.constexpr = MASKING[1]
    if FULL:
        return tl.full([offs_m.shape[0], offs_n.shape[0]], 1, tl.int1)
    inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
    valid = inb
    if IS_CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + (Tk - Tq))
    if HAS_MASK:
        mask_base, stride_mm, stride_mn = mask[0], mask[1], mask[2]
        mvals = tl.load(
            mask_base + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn, mask=inb, other=0
        )
        valid = valid & (mvals != 0)
    return valid


@triton.jit
def _full_key_end(pid_m, Tq, Tk, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """End of the leading key tiles that every row of query block pid_m may attend entirely: in bounds and,
    causal, at or left of the diagonal of the block's first row. 0 with a user mask (no tile is known valid).
    Rows past Tq in the last block are treated as valid there: nothing of theirs is stored."""
    if HAS_MASK:
        return 0
    end = Tk
    if IS_CAUSAL:
        end = tl.maximum(tl.minimum(Tk, pid_m * BLOCK_M + Tk - Tq + 1), 0)
    return (end // BLOCK_N) * BLOCK_N


@triton.jit
def _full_query_range(pid_n, lo, Tq, Tk, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """[full_lo, full_hi): the query blocks (aligned with lo) that are in bounds and see every key of key
    block pid_n; empty (lo, lo) with a user mask or for the last, partial key block. dK/dV sums over rows, so
    rows past Tq must stay masked there."""
    if HAS_MASK:
        return lo, lo
    key_end = (pid_n + 1) * BLOCK_N
    full_lo = lo
    if IS_CAUSAL:  # first row that sees the block's last key: i >= key_end - 1 - (Tk - Tq)
        first = tl.maximum(key_end - 1 - (Tk - Tq), 0)
        full_lo = tl.maximum(lo, ((first + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
    full_hi = tl.maximum((Tq // BLOCK_M) * BLOCK_M, full_lo)
    ok = key_end <= Tk
    return tl.where(ok, full_lo, lo), tl.where(ok, full_hi, lo)


# ------------------------------------------------------------------------------ the paper, one helper each
@triton.jit
def is_degenerate(M, m):
    """App. A: a MinMax row whose span M - m is at most eps weighs every valid key 1 and has no gradient."""
    return M - m <= EPS_DEGENERATE


@triton.jit
def inv_w(W):
    """1/W of each row, 0 on an empty row (W = 0)."""
    return tl.where(W > 0, 1.0 / W, 0.0)


@triton.jit
def inv_w_at(Wa, degen):
    """1/W^at of each row for gamma (App. B), 0 on empty and degenerate rows (no gradient)."""
    return tl.where((Wa > 0) & (~degen), 1.0 / Wa, 0.0)


@triton.jit
def row_constants(M, m, kf, tau, CALIB: tl.constexpr):
    """Per-row grid constants (§3, App. A) as the tuple ``row``: width h, 1/h, origin b_0, e^{-h}, Delta's
    factor (1 - e^{-h})/h (0 on a degenerate row: no gradient), the degenerate flag, K, 1/K, tau and
    h log2(e)."""
    # h and 1/h are correctly rounded (div_rn; the plain ``/`` is an approximate division on the GPU): h is
    # then the reference's fp32 h (for FWM/resolved, when float32 holds tau: docs/kernels.md, row constants),
    # and 1/h = RN(1/h) is what the grid position's correction step needs
    if CALIB == 1:  # MinMax: h = (M - m)/K, b_0 = m - M; degenerate rows get the safe width 1
        span = M - m
        degen = is_degenerate(M, m)
        h = tl.where(degen, 1.0, _grid_position(span, kf, tl.math.div_rn(1.0, kf)))
        inv_h = tl.math.div_rn(tl.full(h.shape, 1.0, tl.float32), h)
        b0 = m - M
    else:  # FWM / resolved: h = tau/K, b_0 = -tau (one h per launch: the divisions are scalar)
        degen = M != M  # all False
        step = tl.math.div_rn(tau, kf)
        h = tl.zeros_like(M) + step
        inv_h = tl.zeros_like(M) + tl.math.div_rn(1.0, step)
        b0 = tl.zeros_like(M) - tau
    emh = tl.exp(-h)  # e^{-h} <= 1 never overflows (e^h does once h > 88.7: a MinMax span over 88.7 K)
    # Delta = e^{b_{r+1}} (1 - e^{-h})/h. The difference 1 - e^{-h} loses the digits of h (large K), so below
    # h = 1/4 the factor is its series sum_n (-h)^n/(n+1)!, n <= 6 (truncation < 2e-9; as the reference's
    # expm1). Once per row.
    x = -h
    series = 1.0 + x * (0.5 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120 + x * (1 / 720 + x * (1 / 5040))))))
    dfac = tl.where(degen, 0.0, tl.where(h < 0.25, series, (1.0 - emh) * inv_h))
    # A degenerate MinMax row weighs every valid key 1 (App. A): with e^{-h} = 1 and h log2(e) = 0 its grid
    # points are all e^0 = 1, so w^L = (1 - t) + t and w^N are exactly 1 and no per-score select is needed
    # (``_place``). Per row; Delta is 0 there by dfac above.
    h_log2 = h * LOG2E
    if CALIB == 1:
        emh = tl.where(degen, 1.0, emh)
        h_log2 = tl.where(degen, 0.0, h_log2)
    return h, inv_h, b0, emh, dfac, degen, kf, 1.0 / kf, tau, h_log2


# The split backward's per-row constants, (B H Tq, ROW_CONSTS) fp32, row-major: the dQ kernel writes them
# once per row (``save_row_constants``) and the dK/dV kernel reads them (``load_row_constants``) on each of
# its query tiles, instead of recomputing them there for every key block (MinMax: two correctly rounded
# divisions, an exponential, the series of Delta's factor; every operator: the reciprocals of W and W^at).
# Per row: h, 1/h, e^{-h}, h log2(e), Delta's factor / W^at, 1/W, 1/W^at and in slot 7, for softmax,
# M log2(e) + log2 W (``softmax_log2_normalizer``: dK/dV's LSE) or, for MinMax in the fused backward,
# Delta's factor itself (``_row_constants_kernel``).
ROW_CONSTS = tl.constexpr(8)


@triton.jit
def softmax_log2_normalizer(M, W):
    """M log2(e) + log2 W per row, the exponent offset at which exp2((s - M) log2(e) - log2 W) is softmax's
    P (FlashAttention's log-sum-exp in base 2); +inf on an empty row (W = 0), whose P is then 0."""
    return tl.where(W > 0, M * LOG2E + tl.log2(W), float("inf"))


@triton.jit
def save_row_constants(RowC, row_i, rmask, row, Wf, inv_Wa, M, LSE: tl.constexpr):
    """Store one query block's row constants (``row_constants``) and 1/W, 1/W^at (0 on empty rows; 1/W^at
    also 0 on degenerate MinMax rows, as the dQ kernel's gamma takes it); with LSE (softmax) also its
    ``softmax_log2_normalizer``."""
    h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2 = row
    base = RowC + row_i * ROW_CONSTS
    tl.store(base, h, mask=rmask)
    tl.store(base + 1, inv_h, mask=rmask)
    tl.store(base + 2, emh, mask=rmask)
    tl.store(base + 3, h_log2, mask=rmask)
    tl.store(base + 4, dfac * inv_Wa, mask=rmask)  # Delta / W^at = E_r1 (dfac / W^at): dK/dV's FOLD
    tl.store(base + 5, inv_w(Wf), mask=rmask)
    tl.store(base + 6, inv_Wa, mask=rmask)
    if LSE:
        tl.store(base + 7, softmax_log2_normalizer(M, Wf), mask=rmask)


@triton.jit
def load_row_constants(RowC, row_i, rmask, M, m, kf, tau, CALIB: tl.constexpr, FOLD: tl.constexpr):
    """The row constants ``save_row_constants`` stored, as ``row`` (FOLD: with Delta's factor over W^at in
    place of dfac), and the rows' 1/W and (not FOLD, else 0) 1/W^at. FWM and resolved have one h per
    launch: their constants are computed as ``row_constants`` does, cheaper than loaded; only Delta's factor
    over W^at is per row. MinMax without FOLD (the fused backward's G_M sum) reads dfac from slot 7, which
    ``_row_constants_kernel`` fills for it."""
    base = RowC + row_i * ROW_CONSTS
    if FOLD:
        dfac_at = tl.load(base + 4, mask=rmask, other=0.0)
    inv_Wf = tl.load(base + 5, mask=rmask, other=0.0)
    inv_Wa = tl.zeros_like(M)
    if not FOLD:
        inv_Wa = tl.load(base + 6, mask=rmask, other=0.0)
    if CALIB == 1:  # rows past Tq get a degenerate row's constants, as row_constants gives M = m = 0
        h = tl.load(base, mask=rmask, other=1.0)
        inv_h = tl.load(base + 1, mask=rmask, other=1.0)
        emh = tl.load(base + 2, mask=rmask, other=1.0)
        h_log2 = tl.load(base + 3, mask=rmask, other=0.0)
        if FOLD:
            dfac = dfac_at
        else:
            dfac = tl.load(base + 7, mask=rmask, other=0.0)
        row = (h, inv_h, m - M, emh, dfac, is_degenerate(M, m), kf, 1.0 / kf, tau, h_log2)
    else:
        h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2 = row_constants(M, m, kf, tau, CALIB)
        if FOLD:
            dfac = dfac_at
        row = (h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2)
    return row, inv_Wf, inv_Wa


@triton.jit
def _row_constants_kernel(
    Mrow, mrow, Wfwd, Wat, RowC, n_rows, kf, tau, OP: tl.constexpr, BLOCK: tl.constexpr
):
    """The row constants of ``save_row_constants`` for BLOCK of the B H Tq rows, before the fused backward,
    which has no dQ pass to store them (the split backward's dQ kernel stores them as it runs). Softmax's
    normalizer is stored in every mode: one log2 per row, read only where dK/dV's LSE takes it."""
    row_i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64, as the other kernels
    rmask = row_i < n_rows
    M = tl.load(Mrow + row_i, mask=rmask, other=0.0)
    m = tl.load(mrow + row_i, mask=rmask, other=0.0)
    Wf = tl.load(Wfwd + row_i, mask=rmask, other=0.0)
    Wa = tl.load(Wat + row_i, mask=rmask, other=0.0)
    row = row_constants(M, m, kf, tau, OP[0])
    save_row_constants(RowC, row_i, rmask, row, Wf, inv_w_at(Wa, row[5]), M, OP[1])
    if OP[0] == 1:  # MinMax's dfac itself: the fused step sums G_M without FOLD (load_row_constants)
        tl.store(RowC + row_i * ROW_CONSTS + 7, row[4], mask=rmask)


@triton.jit
def lerp_weight(t, E_r, E_r1):
    """LERP reconstruction (§3): w^L = (1 - t) e^{b_r} + t e^{b_{r+1}}."""
    return (1.0 - t) * E_r + t * E_r1


@triton.jit
def nearest_weight(t, E_r, E_r1):
    """Nearest reconstruction (§3): w^N = e^{b_l}, l = r + [t >= 1/2] (a midpoint rounds up)."""
    return tl.where(t >= 0.5, E_r1, E_r)


@triton.jit
def _grid_position(d, h, inv_h):
    """x = RN(d / h), the correctly rounded quotient, as the reference divides (a product with the rounded
    1/h misses it by an ulp: a key exactly on a grid boundary or a Nearest midpoint then lands on the wrong
    side when 1/h rounds down, e.g. MinMax span 41 at K = 4 or 16). One Markstein correction step: with
    inv_h = RN(1/h), x0 = RN(d inv_h) is within an ulp of d/h, the residual d - x0 h is exact in one fma,
    and RN(x0 + residual inv_h) is RN(d/h) (Markstein's theorem). Two FMAs per score more than d * inv_h."""
    x0 = d * inv_h
    e = tl.fma(x0, -h, d)  # the row's -h, not -x0: LLVM would form -x0 as a second product per score
    return tl.fma(e, inv_h, x0)


@triton.jit
def grid(s, valid, is_max, is_min, M, row, CALIB: tl.constexpr, FINITE_MASKED: tl.constexpr = False,
         DELTA_EXP: tl.constexpr = False):  # fmt: skip
    """Reconstruction terms of one (BLOCK_M, BLOCK_N) score tile (§3, App. A; reference.grid).

    The stored arg-max key (is_max) sits exactly at x = K (r = K-1, t_raw = 1) and, for MinMax, the stored
    arg-min key (is_min) at x = 0 (r = 0, t_raw = 0): their exact-arithmetic values, independent of the
    rounding of a recomputed score. t_raw = x - r is exact given x; the reference's (z~ - b_r)/h differs from
    it by rounding only. Masked keys go through the same arithmetic and are dropped by ``_place`` on
    ``valid``: no per-score select here. A user-masked key's score may be anything (inf or NaN where its k
    is not finite). FINITE_MASKED (the backward kernels that sum G_M of eq. (2)): MinMax pins a masked key's
    x to 0, so that its dw/dM, which a zero gamma multiplies in that row sum, is finite (0 * inf is NaN).
    Degenerate MinMax rows keep every valid key; their Delta is 0 (dfac) and their grid points are all 1
    (``row_constants``), so every weight is 1. is_max and is_min None: no pins, for callers that read only r
    and [t >= 1/2] of the arg keys (w^N, the STE's P^N, Delta): two compares and selects per score fewer.
    Unpinned, an arg key whose z is off by a rounding delta (pass 2's z = s - M is one FMA of the product;
    the backward recomputes s in another tiling) has x off by delta/h: the arg-max key stays at r = K - 1
    with t >= 1/2 and the MinMax arg-min at r = 0 with t < 1/2 while |delta| < h/2, i.e. in every row whose
    span is more than K ulps of its scores. Past that (spans of a few ulps, h <= 2 |delta|) the grid index
    moves by at most |delta|/h + 1, so the weight and Delta by a factor within e^{+-3 delta}: the order of
    the score's own rounding, which moves every other key of such a row alike. w^L and x, continuous in z,
    keep the pins: unpinned, the arg-max key's w^L, the row's largest weight and exactly 1 in the reference's
    own arithmetic, would be off by delta Delta (an ulp of M in the exponent). DELTA_EXP (FWM and resolved,
    whose dfac > 0): Delta as one exponential with log2(dfac) in its exponent, exp2(r h log2(e) + ((1 - K) h
    log2(e) + log2 dfac)), two instructions per score fewer where Delta is all a loop needs of the grid (the
    dQ kernel's self term). The row's exponent is rounded once more, which moves Delta by about 2^-24
    |exponent| ln 2 (3e-7 at tau = 6, K = 4): the kernels take it where the dots round to 8 or 10 bits
    (bf16/fp16, TF32).
    Returns (w^L, w^N, Delta on valid keys, r, x, t, E_r, E_r1): x the grid position (pinned if given).
    Every calibration keeps exactly the valid keys (FWM's zero tail comes from r = -inf, not a mask).
    """
    h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2 = row
    z = s - M[:, None]
    # grid position x = (z~ - b_0)/h, correctly rounded as the reference's division (_grid_position);
    # r = floor(x) clamped to the calibration's range, t_raw = x - r (exact)
    if CALIB == 1:  # MinMax: b_0 = m - M, r in [0, K-1]
        x = _grid_position(z - b0[:, None], h[:, None], inv_h[:, None])
        if FINITE_MASKED:  # free on interior tiles (valid is constant there)
            x = tl.where(is_min | ~valid, 0.0, x)
        elif is_min is not None:
            x = tl.where(is_min, 0.0, x)
    else:  # FWM, resolved: b_0 = -tau; resolved's negative indices continue the grid below -tau
        # FWM's z~ = clip(z, -tau, 0) and zero tail z < -tau: the upper clip is left to the clamps of r and t
        # below (z > 0 gives r = K-1, t = 1, as z~ = 0 does: a valid key has z <= 0 in the forward, and the
        # backward's recomputed score may exceed M by rounding); the lower clip and the tail are one select
        # on r below: such a key, and one whose z is NaN, gets r = -inf, so that E_r = E_r1 = 0 and with
        # them w^L, w^N and Delta, with no select of their own (t = 1 there).
        x = _grid_position(z + tau, h[:, None], inv_h[:, None])
    if is_max is not None:
        x = tl.where(is_max, kf, x)  # after the arg-min pin: a key both (degenerate row) counts as the max
    r = tl.floor(x)
    if CALIB == 2:  # x >= 0 exactly when z >= -tau (the quotient keeps the sign of z + tau); NaN: the tail
        r = tl.where(x >= 0.0, r, float("-inf"))
    if CALIB == 1:  # x < 0 only on a masked key (its score can lie anywhere): clamp to keep it finite
        r = tl.maximum(r, 0.0)
    if CALIB == 3:
        # A valid key whose z = s - M overflowed to -inf (a span beyond fp32) has x = NaN, and the row must be
        # NaN, as the reference's is. The plain clamps are IEEE minNum/maxNum on the GPU, which drop a NaN
        # operand (r = K - 1, t = 0: a finite, wrong weight); these keep it. Masked keys are placed by where.
        r = tl.minimum(r, kf - 1.0, propagate_nan=tl.PropagateNan.ALL)
        t = tl.maximum(x - r, 0.0, propagate_nan=tl.PropagateNan.ALL)
        t = tl.minimum(t, 1.0, propagate_nan=tl.PropagateNan.ALL)
    else:
        r = tl.minimum(r, kf - 1.0)
        t_raw = x - r
        if CALIB == 2:  # t_raw >= 0 (r <= x), +inf on the tail (NaN if x is: minNum then gives 1)
            t = tl.minimum(t_raw, 1.0)
        else:
            t = tl.minimum(tl.maximum(t_raw, 0.0), 1.0)
    # Grid points counted from the top: every calibration has b_K = b_0 + K h = 0 (App. A), so b_{r+1} =
    # (r + 1 - K) h, exactly 0 on the top interval, and e^{b_r} = e^{b_{r+1}} e^{-h}: one exponential per
    # score, no overflow for any width (e^{b_r} e^h is 0 * inf = NaN once h > 88.7). exp2 with log2(e)
    # folded into the row's h saves the multiply that tl.exp adds.
    E_r1 = tl.exp2((r + (1.0 - kf)) * h_log2[:, None])
    E_r = E_r1 * emh[:, None]
    wL = lerp_weight(t, E_r, E_r1)
    wN = nearest_weight(t, E_r, E_r1)
    if DELTA_EXP:
        tl.static_assert(CALIB != 1, "a degenerate MinMax row's dfac is 0: no log2")
        d_exp = (1.0 - kf) * h_log2 + tl.log2(dfac)  # per row (FWM, resolved: one per launch)
        cDelta = tl.where(valid, tl.exp2(tl.fma(r, h_log2[:, None], d_exp[:, None])), 0.0)
    else:
        cDelta = tl.where(valid, E_r1 * dfac[:, None], 0.0)  # Delta = (E_r1 - E_r)/h on valid keys
    return wL, wN, cDelta, r, x, t, E_r, E_r1


@triton.jit
def _place(w, valid):
    """The weight on valid keys, 0 elsewhere (a degenerate MinMax row's weights are already 1: ``grid``)."""
    return tl.where(valid, w, 0.0)


@triton.jit
def weight_ste(wL, wN, HISTORICAL: tl.constexpr):
    """Weight-STE forward weight, eq. (3) (eq:wste): w = w^L + sg(w^N - w^L). Strict arithmetic returns w^N
    bit for bit; historical arithmetic (App. C.2) evaluates w^H = w^L + (w^N - w^L) in fp32, as the reference
    does. Its backward (the normalization Jacobian at this forward point) is in the dQ and dK/dV kernels."""
    if HISTORICAL:
        return wL + (wN - wL)
    else:
        return wN


@triton.jit
def prob_ste(wLp, wHp, WL, WH):
    """Prob-STE forward probability, eq. (4) (eq:pste), in historical arithmetic (App. C.2):
    P = P^L + sg(P^H - P^L) with P^L = w^L/W^L and P^H = w^H/W^H (w^H of ``weight_ste``), in the reference's
    order: correctly rounded divisions (``/`` is an approximate division on the GPU, and a product would be
    fused into the subtraction), then the subtraction and the addition. Empty rows: 0. (Strict arithmetic
    returns P^N, which the kernels normalize after the P V dot.)"""
    PL = tl.math.div_rn(wLp, tl.where(WL > 0, WL, 1.0)[:, None])
    PH = tl.math.div_rn(wHp, tl.where(WH > 0, WH, 1.0)[:, None])
    return PL + (PH - PL)


@triton.jit
def _forward_weight(wL, wN, valid, OP: tl.constexpr):
    """The weight the forward normalizes, placed: w^L (LERP) or the STE weight of ``weight_ste``."""
    HARD: tl.constexpr = OP[2]
    HISTORICAL: tl.constexpr = OP[4]
    if HARD:
        w = weight_ste(wL, wN, HISTORICAL)
    else:
        w = wL
    return _place(w, valid)


@triton.jit
def calibration_grad(r, x, t, E_r, E_r1, cD, row, SHORT: tl.constexpr):
    """eq. (1) (eq:calgrad), MinMax: dw^L/dM = -w^L - Delta rho + X with rho = (r + t_raw)/K, i.e. -Y - Delta
    rho with Y = w^L - X = (1-t) E_r (1 - r/K) + t E_r1 (1 - (r+1)/K), a sum of non-negative terms that does
    not cancel in fp32. dw^L/dm = -Delta - dw^L/dM follows per row (G_m = -S1 - G_M). r + t_raw is x bit for
    bit (``grid``: t_raw = x - r is exact, and so is the sum back), so rho = x/K. cD is Delta on valid keys.
    SHORT: with E_r = E_r1 e^{-h} and Delta = E_r1 dfac, E_r1 factors out,
        dw^L/dM = -E_r1 [(1-t) e^{-h} u + t (u - 1/K) + (dfac/K) x],  u = 1 - r/K,
    three non-negative terms in seven operations per score instead of twelve ((1-t) e^{-h} is one fma).
    Regrouping the first two as u ((1-t) e^{-h} + t) - t/K saves one more but cancels where e^{-h} and
    Delta rho are small (wide rows). The dQ kernel takes SHORT up to D = 64: at D = 128 its schedule made
    ptxas spill (dQ, measured by benchmarks/kernel_resources.py: bf16 0 -> 20 B, TF32 128 -> 188 B)."""
    h, inv_h, b0, emh, dfac, degen, kf, inv_k, tau, h_log2 = row
    if SHORT:
        u = 1.0 - r * inv_k
        y = (emh[:, None] - t * emh[:, None]) * u + t * (u - inv_k)  # Y / E_r1
        return -(E_r1 * ((dfac * inv_k)[:, None] * x + y))
    else:
        Y = (1.0 - t) * E_r * (1.0 - r * inv_k) + t * E_r1 * (1.0 - (r + 1.0) * inv_k)
        return -Y - cD * (x * inv_k)


@triton.jit
def _gamma(g, Dd, inv_W):
    """gamma_j = dL/dw_j = (g_j - <g>_P)/W, the normalization Jacobian (App. B) at the Jacobian point: the
    forward's (P, W) for LERP and Weight-STE (gamma^W of eq. 3), (P^L, W^L) for Prob-STE (gamma^P of eq. 4).
    ``Dd`` is the row's <g>_P = dO . O^at, ``inv_W`` its 1/W."""
    return (g - Dd[:, None]) * inv_W[:, None]


@triton.jit
def score_grad(gamma, cD, is_max, GM, is_min, Gm, KEEP_MAX_TERM: tl.constexpr, KEEP_MIN_TERM: tl.constexpr,
               EXP: tl.constexpr = 0):  # fmt: skip
    """eq. (2) (eq:full) on one tile: dL/ds_i = gamma_i Delta_i + [i = argmax] G_M + [i = argmin] G_m, with
    the row sums G_M = sum_j gamma_j dw_j/dM and G_m = sum_j gamma_j dw_j/dm of eq. (1) (FWM, resolved:
    dw/dM = -Delta, no m term). range_grad drops a channel (KEEP_*_TERM False). cD is Delta on valid keys (0
    elsewhere), w for softmax (dS = P (g - D)), dw/dz of ``exp_baseline`` for the exp baselines, whose
    dw/dM = -dw/dz (z = s - M): G_M = -S1. BF16-exp (EXP 1) rounds as autograd through its casts does:
    gamma to bf16, then the bf16 product gamma w (exact in fp32, rounded once)."""
    if EXP == 1:
        ds = _round_bf16(_round_bf16(gamma) * cD)
    else:
        ds = gamma * cD
    if KEEP_MAX_TERM:
        ds += tl.where(is_max, GM[:, None], 0.0)
    if KEEP_MIN_TERM:
        ds += tl.where(is_min, Gm[:, None], 0.0)
    return ds


# hard_jacobian (eq. 5, eq:hardjac) has no kernel helper: no operator back-propagates it (App. B).


# --------------------------------------------------------------------------------------------- forward
@triton.jit
def _arg_keys(start_n, amax, amin, FULL: tl.constexpr, BLOCK_N: tl.constexpr):
    """is_max, is_min of the key tile at start_n: the row's arg-max / arg-min key. On interior tiles (FULL)
    compared as tile offsets (the row's index minus start_n, once per row) with the lane's constant offset:
    compared as key indices, LLVM widens the loop counter in start_n + lane to 64 bits and every score pays
    two ISETP. Masked tiles need the key indices for their masks anyway, and keep them."""
    if FULL:
        lane = tl.arange(0, BLOCK_N)[None, :]
        return lane == (amax - start_n)[:, None], lane == (amin - start_n)[:, None]
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)[None, :]
        return offs_n == amax[:, None], offs_n == amin[:, None]


@triton.jit
def _max_nan(a, b):
    """max that returns NaN if either operand is NaN (tl.maximum's default returns the other operand)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _valid_flagged(s, valid):
    """The scores of valid keys, -inf elsewhere, with every non-finite valid score made NaN: fma(s, 0, s) is
    s for a finite s and NaN for +-inf (inf * 0). A row max with ``_max_nan`` is then NaN exactly on the rows
    that ``kinterval_attention`` returns as NaN (non-finite q or k), for one FMA per score and no pass over
    q and k."""
    return tl.where(valid, tl.fma(s, 0.0, s), float("-inf"))


@triton.jit
def _extrema_step(q, start_n, keys, bounds, mask, rows, scales, CALIB: tl.constexpr, MASKING: tl.constexpr,
                  PREC: tl.constexpr, FULL: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Pass 1 over one key tile, rows = (M, m, amax, amin): running row max M (NaN once a valid score is not
    finite: ``_valid_flagged``) and min m, first index among ties (scores only)."""
    M, m, amax, amin = rows
    k_base, v_base, skn, skd, svn, svd = keys
    offs_m, offs_d, dmask, Tq, Tk = bounds
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kmask = dmask[:, None] if FULL else (offs_n[None, :] < Tk) & dmask[:, None]
    kT = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=kmask, other=0.0)
    scale, cap = scales
    qk = _dot(q, kT, PREC)
    valid = _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING, FULL)
    if MASKING[4]:  # a score bias: flagged after the sum (a non-finite bias entry on a valid key too)
        s, _, f = _biased(qk, _bias_tile(offs_m, offs_n, Tq, Tk, mask), scales, MASKING[3])
        s_hi = tl.where(valid, f, float("-inf"))
    elif MASKING[3]:  # softcap: a non-finite scale q.k is flagged before the softcap would bound it
        s = _softcapped(qk, scales)[0]
        s_hi = tl.where(valid, tl.fma(qk * scale, 0.0, s), float("-inf"))
    else:
        s = qk * scale
        s_hi = _valid_flagged(s, valid)
    bmax = tl.reduce(s_hi, 1, _max_nan)
    # the first tied key; interior tiles select its offset in the tile (32-bit, see _arg_keys)
    base = start_n if FULL else 0
    lane = offs_n[None, :] - base
    imax = tl.min(tl.where(s_hi == bmax[:, None], lane, 2147483647), 1) + base
    upd = bmax > M  # strict: the first index among ties wins
    amax = tl.where(upd, imax, amax)
    M = _max_nan(M, bmax)  # where(upd, bmax, M), and NaN stays NaN
    if CALIB == 1:
        s_lo = tl.where(valid, s, float("inf"))
        bmin = tl.min(s_lo, 1)
        imin = tl.min(tl.where(s_lo == bmin[:, None], lane, 2147483647), 1) + base
        upd_lo = bmin < m
        amin = tl.where(upd_lo, imin, amin)
        m = tl.where(upd_lo, bmin, m)
    return M, m, amax, amin


# An attention sink (gpt-oss; ``api.with_sinks``) is one more key per row: key index Tk, the q head's learned
# score, no value. The kernels take it once per row, after the loops over the real keys: into the row extrema
# (after every key, so that a key tied with it keeps the arg-max / arg-min, the first index among ties), the
# weight sums W and W^L, and the dQ kernel's row sums S1 and G_M (eq. 2), which also give its own gradient
# dL/ds_sink per row. A -inf sink is none; a NaN or +inf one makes its rows NaN (``_valid_flagged``).
@triton.jit
def _sink_scores(Sinks, hd, BLOCK_M: tl.constexpr):
    """The sink of q head hd as a (BLOCK_M, 1) score column, and whether it takes part (it is not -inf)."""
    s = tl.zeros([BLOCK_M, 1], tl.float32) + tl.load(Sinks + hd)
    return s, s != float("-inf")


@triton.jit
def _sink_extrema(s, ok, rows, Tk, CALIB: tl.constexpr):
    """Pass 1's rows = (M, m, amax, amin) with the sink (key Tk) after every real key."""
    M, m, amax, amin = rows
    s_hi = tl.reduce(_valid_flagged(s, ok), 1, _max_nan)  # -inf when it takes no part, NaN if not finite
    amax = tl.where(s_hi > M, Tk, amax)  # strict: a tied key keeps the arg-max
    M = _max_nan(M, s_hi)
    if CALIB == 1:
        s_lo = tl.min(tl.where(ok, s, float("inf")), 1)
        upd_lo = s_lo < m
        amin = tl.where(upd_lo, Tk, amin)
        m = tl.where(upd_lo, s_lo, m)
    return M, m, amax, amin


@triton.jit
def _sink_weights(s, ok, M, amax, amin, row, Tk, W, WL, OP: tl.constexpr, SUM_L: tl.constexpr):
    """Pass 2's W (and W^L with SUM_L) plus the sink's weight, the forward's as for a real key. The sink has
    no value: nothing joins O, and historical Prob-STE's pass 3 (P V) skips it."""
    CALIB: tl.constexpr = OP[0]
    EXP: tl.constexpr = OP[5]
    s = tl.where(ok, s, M[:, None])  # a sink that takes no part: any finite score, its weight is dropped
    if EXP:
        w = tl.where(ok, exp_baseline(s - M[:, None], EXP)[0], 0.0)
    else:
        is_max, is_min = None, None
        if OP[6]:  # FORWARD_PINS, as _weights_step
            is_max = (amax == Tk)[:, None]
            is_min = (amin == Tk)[:, None]
        wL, wN, cDelta, r, x, t, E_r, E_r1 = grid(s, ok, is_max, is_min, M, row, CALIB)
        w = _forward_weight(wL, wN, ok, OP)
        if SUM_L:
            WL += tl.sum(_place(wL, ok), 1)
    W += tl.sum(w, 1)
    return W, WL


@triton.jit
def _sink_softmax(s, ok, M, off, W, acc):
    """The online softmax (``_softmax_step``) after its last key tile, one step more for the sink: M, the row
    max of the scaled scores, and the sums W, O rescaled to the new offset; the sink adds its weight to W."""
    M = _max_nan(M, tl.reduce(_valid_flagged(s, ok), 1, _max_nan))
    off_new = M * LOG2E  # as the backward forms it from the saved M
    off_ref = tl.where(off_new > float("-inf"), off_new, 0.0)
    alpha = tl.exp2(off - off_ref)  # exactly 1 when the sink is below the max
    w = tl.where(ok, tl.exp2(tl.fma(s, LOG2E, -off_ref[:, None])), 0.0)
    return M, W * alpha + tl.sum(w, 1), acc * alpha[:, None]


@triton.jit
def _weights_step(q, start_n, keys, bounds, mask, rows, row, sums, scales, OP: tl.constexpr,
                  MASKING: tl.constexpr, PREC: tl.constexpr, STAGE: tl.constexpr, FULL: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """Pass 2 over one key tile, sums = (W, WL, acc, accL): weights at the final (M, m); W += sum w,
    O += w v (W^L, O^L for Prob-STE). Historical Prob-STE: pass 2 sums W = W^H, W^L and O^L only, and pass 3
    (W and WL final) adds P v with the P of ``prob_ste``. rows = (M, amax, amin); STAGE = (PASS3, SAVE):
    pass 3, and whether the backward will need O^L (an inference forward skips its dot)."""
    CALIB: tl.constexpr = OP[0]
    SOFTMAX: tl.constexpr = OP[1]
    JACOBIAN_AT_PL: tl.constexpr = OP[3]
    HISTORICAL: tl.constexpr = OP[4]
    EXP: tl.constexpr = OP[5]
    PASS3: tl.constexpr = STAGE[0]
    SAVE: tl.constexpr = STAGE[1]
    # W^L: the backward's Jacobian point (SAVE) or historical P^L; an inference Prob-STE forward in strict
    # arithmetic is the Weight-STE forward, P^N
    SUM_L: tl.constexpr = JACOBIAN_AT_PL and (SAVE or HISTORICAL)
    k_base, v_base, skn, skd, svn, svd = keys
    offs_m, offs_d, dmask, Tq, Tk = bounds
    M, amax, amin = rows
    W, WL, acc, accL = sums
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kmask = dmask[:, None] if FULL else (offs_n[None, :] < Tk) & dmask[:, None]
    vmask = dmask[None, :] if FULL else (offs_n[:, None] < Tk) & dmask[None, :]
    kT = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=kmask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=vmask, other=0.0)
    bias = None
    if MASKING[4]:
        bias = _bias_tile(offs_m, offs_n, Tq, Tk, mask)
    s = _scores(q, kT, scales, M, PREC, SOFTMAX, MASKING[3], bias)[0]  # softmax: (s - M) log2(e)
    valid = _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING, FULL)
    if SOFTMAX:
        w = tl.where(valid, tl.exp2(s), 0.0)  # e^{s - M}
    elif EXP:
        w = tl.where(valid, exp_baseline(s - M[:, None], EXP)[0], 0.0)
    else:
        # strict Weight-STE weighs by w^N alone: no pins (grid), and without SAVE pass 1 then tracks no arg
        # keys. Prob-STE keeps them at inference too, whose O is then bit for bit its training forward's
        # (which pins for W^L); LERP and historical arithmetic for w^L
        FORWARD_PINS: tl.constexpr = OP[6]
        is_max, is_min = None, None
        if FORWARD_PINS:
            is_max, is_min = _arg_keys(start_n, amax, amin, FULL, BLOCK_N)
        wL, wN, cDelta, r, x, t, E_r, E_r1 = grid(s, valid, is_max, is_min, M, row, CALIB)
        # LERP: w^L; STE operators: the hard forward w^N (strict) or w^H (historical)
        w = _forward_weight(wL, wN, valid, OP)
        if SUM_L:  # Prob-STE also needs W^L and, for the backward, P^L V (eq. 4 backward point)
            wLp = _place(wL, valid)
            if PASS3:  # historical P = P^L + sg(P^H - P^L), per key
                w = prob_ste(wLp, w, WL, W)
            else:
                WL += tl.sum(wLp, 1)
                if SAVE:
                    accL += _dot(_cast(wLp, v.dtype), v, PREC)
    if PASS3:
        acc += _dot(_cast(w, v.dtype), v, PREC)
    else:
        W += tl.sum(w, 1)
        if not (JACOBIAN_AT_PL and HISTORICAL):
            acc += _dot(_cast(w, v.dtype), v, PREC)
    return W, WL, acc, accL


@triton.jit
def _weights_loop(q, tiles, keys, bounds, mask, rows, row, sums, scales, OP: tl.constexpr,
                  MASKING: tl.constexpr, PREC: tl.constexpr, STAGE: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """Pass 2 (or 3) over the key tiles [lo, hi): the unmasked interior tiles [lo, full_hi) first (SPLIT);
    tiles = (lo, full_hi, hi), STAGE = (PASS3, SAVE) as in ``_weights_step``."""
    lo, full_hi, hi = tiles
    if SPLIT:
        for start_n in range(lo, full_hi, BLOCK_N):
            sums = _weights_step(q, start_n, keys, bounds, mask, rows, row, sums, scales, OP, MASKING, PREC,
                                 STAGE, True, BLOCK_N)  # fmt: skip
    for start_n in range(full_hi, hi, BLOCK_N):
        sums = _weights_step(q, start_n, keys, bounds, mask, rows, row, sums, scales, OP, MASKING, PREC,
                             STAGE, False, BLOCK_N)  # fmt: skip
    return sums


@triton.jit
def _softmax_step(q, start_n, keys, bounds, mask, sums, scales, MASKING: tl.constexpr, PREC: tl.constexpr,
                  FULL: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Softmax in one pass over one key tile (FlashAttention's online softmax), sums = (Mq, off, W, acc): the
    running row max Mq of the raw products q k^T (NaN once a valid one is not finite), the exponent offset
    off = M log2(e) (rounded; -inf before the first valid key) of M = Mq scale, the row max of
    s = scale q k^T, W = sum 2^x and acc = sum 2^x v over the keys so far with x = s log2(e) - off, both
    rescaled by 2^{off_old - off} when M grows. The K-interval operators need the final (M, m) before any
    weight (pass 1); softmax does not, so it reads every key tile once. M equals the max of the scaled scores
    (scale > 0, rounding is monotone): the backward's M exactly, whose offset is the final off. Mq tells a row
    with valid keys from an empty one when M is -inf (every scaled score overflowed): see the row check after
    the loop.

    The rescale factor is the difference of the two rounded offsets, not (M_old - M) log2(e): every weight
    of the row then carries the same offset rounding (off - M log2(e), up to half an ulp of M log2(e)), a
    common factor that normalization removes. Rounded separately, the factors differed by that rounding
    (2^-7 in the exponent at |M| = 1e5: rows erred by up to 9e-3 against float64, torch.softmax by 2e-7).
    With a softcap (MASKING[3]) or a score bias (MASKING[4]) Mq is the row max of the scores s themselves
    (M = Mq)."""
    k_base, v_base, skn, skd, svn, svd = keys
    offs_m, offs_d, dmask, Tq, Tk = bounds
    Mq, off, W, acc = sums
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kmask = dmask[:, None] if FULL else (offs_n[None, :] < Tk) & dmask[:, None]
    vmask = dmask[None, :] if FULL else (offs_n[:, None] < Tk) & dmask[None, :]
    kT = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=kmask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=vmask, other=0.0)
    scale, cap = scales
    qk = _dot(q, kT, PREC)
    valid = _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING, FULL)
    if MASKING[4]:  # a score bias: the max of s itself, flagged as ``_biased`` does
        s, _, f = _biased(qk, _bias_tile(offs_m, offs_n, Tq, Tk, mask), scales, MASKING[3])
        Mq = _max_nan(Mq, tl.reduce(tl.where(valid, f, float("-inf")), 1, _max_nan))
        off_new = Mq * LOG2E
    elif MASKING[3]:  # softcap: the max of s itself; a non-finite scale q.k flagged before the softcap
        s = _softcapped(qk, scales)[0]
        Mq = _max_nan(Mq, tl.reduce(tl.where(valid, tl.fma(qk * scale, 0.0, s), float("-inf")), 1, _max_nan))
        off_new = Mq * LOG2E
    else:
        Mq = _max_nan(Mq, tl.reduce(_valid_flagged(qk, valid), 1, _max_nan))  # NaN: a non-finite score
        off_new = (Mq * scale) * LOG2E  # RN(M log2 e), as the backward's _scores forms it from the saved M
    off_ref = tl.where(off_new > float("-inf"), off_new, 0.0)  # no valid key yet: every weight is 0 anyway
    alpha = tl.exp2(off - off_ref)  # 1 if M did not grow, 0 from off_old = -inf
    if MASKING[3] or MASKING[4]:
        w = tl.where(valid, tl.exp2(tl.fma(s, LOG2E, -off_ref[:, None])), 0.0)  # as _scores
    else:
        w = tl.where(valid, tl.exp2(tl.fma(qk, scale * LOG2E, -off_ref[:, None])), 0.0)  # as _scores
    W = W * alpha + tl.sum(w, 1)
    acc = acc * alpha[:, None] + _dot(_cast(w, v.dtype), v, PREC)
    return Mq, off_new, W, acc


@triton.autotune(
    configs=_configs("fwd"), key=_KEY + ["SAVE"], prune_configs_by=_pruner("fwd"), do_bench=_timer
)
@triton.jit
def _fwd_kernel(Q, ins, outs, strides, shape, consts, OP: tl.constexpr, GRAD: tl.constexpr,
                MASKING: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, SAVE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Forward over one query block: pass 1 the row extrema, pass 2 the weights and P V (pass 3 for historical
    Prob-STE; softmax: one online pass, ``_softmax_step``). Stores O and, with SAVE (a backward follows),
    O^L for Prob-STE and the per-row statistics the backward needs. Without SAVE (inference) only O is
    stored and Prob-STE skips its P^L V dot."""
    Kp, V, Mask, Sinks, Bias = ins
    O, OL, Mrow, mrow, Wfwd, Wat, Amax, Amin = outs
    q_str, k_str, v_str, m_str, b_str = strides  # (batch, head, row, dim) strides of q, k, v, mask, bias
    sqb, sqh, sqm, sqd = q_str
    skb, skh, skn, skd = k_str
    svb, svh, svn, svd = v_str
    smb, smh, smm, smn = m_str
    sbb, sbh, sbm, sbn = b_str
    H, Tq, Tk, D, G = shape
    scale, kf, tau, cap = consts
    scales = (scale, cap)
    CALIB: tl.constexpr = OP[0]
    SOFTMAX: tl.constexpr = OP[1]
    JACOBIAN_AT_PL: tl.constexpr = OP[3]
    HISTORICAL: tl.constexpr = OP[4]
    IS_CAUSAL: tl.constexpr = MASKING[0]
    HAS_MASK: tl.constexpr = MASKING[1]
    HAS_SINKS: tl.constexpr = MASKING[2]
    SOFTCAP: tl.constexpr = MASKING[3]
    HAS_BIAS: tl.constexpr = MASKING[4] > 0
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    hd = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(
        Q + b * sqb + hd * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=(offs_m[:, None] < Tq) & dmask[None, :],
        other=0.0,
    )
    hk = hd // G  # its k/v head
    keys = (Kp + b * skb + hk * skh, V + b * svb + hk * svh, skn, skd, svn, svd)
    mask = (Mask + b * smb + hd * smh, smm, smn, Bias + b * sbb + hd * sbh, sbm, sbn)
    bounds = (offs_m, offs_d, dmask, Tq, Tk)
    hi = Tk
    if IS_CAUSAL:  # keys j <= i + Tk - Tq for the block's last row
        hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq)

    M = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m = tl.full([BLOCK_M], float("inf"), tl.float32)
    amax = tl.zeros([BLOCK_M], tl.int32)  # softmax's backward reads no arg-max: 0
    amin = tl.zeros([BLOCK_M], tl.int32)
    full_hi = 0
    if SPLIT:  # unmasked interior tiles first, then the rest
        full_hi = _full_key_end(pid_m, Tq, Tk, IS_CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N)
    HIST_PROB: tl.constexpr = JACOBIAN_AT_PL and HISTORICAL
    if SOFTMAX:  # one pass (_softmax_step): M, W = sum e^{s - M}, O = sum e^{s - M} v
        sums = (M, M, tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M, BLOCK_D], tl.float32))
        if SPLIT:
            for start_n in range(0, full_hi, BLOCK_N):
                sums = _softmax_step(
                    q, start_n, keys, bounds, mask, sums, scales, MASKING, PREC, True, BLOCK_N
                )
        for start_n in range(full_hi, hi, BLOCK_N):
            sums = _softmax_step(q, start_n, keys, bounds, mask, sums, scales, MASKING, PREC, False, BLOCK_N)
        Mq, off, W, acc = sums
        if SOFTCAP or HAS_BIAS:
            M = Mq  # the max of the softcapped or biased scores
        else:
            M = Mq * scale  # the loop's last M, bit for bit
        seen = Mq > float("-inf")  # a row with a valid key
        if HAS_SINKS:
            s_k, ok = _sink_scores(Sinks, hd, BLOCK_M)
            M, W, acc = _sink_softmax(s_k, ok, M, off, W, acc)
            seen = seen | (tl.sum(ok.to(tl.int32), 1) > 0)
        # The exponent (s - M) log2(e) is formed as fma(q.k, scale log2(e), -M log2(e)): a row whose scaled
        # max overflows (finite q.k, |M| = inf) or whose M log2(e) is past SOFTMAX_OFFSET_LIMIT would weigh
        # its keys by 2^delta with delta out of range (every key 0: a quiet zero row; or inf: NaN). It is
        # NaN, as a row with a non-finite score (the reference's NaN for an overflowed score; for a finite
        # M the reference is finite). One check per row.
        big = seen & ~(tl.abs(M * LOG2E) < SOFTMAX_OFFSET_LIMIT)
        M = tl.where(big, float("nan"), M)
        M = tl.where(M == float("-inf"), 0.0, M)  # fully masked row: M = 0 (reference.row_extrema)
        m = M
        WL = W
        accL = acc
    else:
        # Pass 1: row max M and row min m over valid keys.
        extrema = (M, m, amax, amin)
        if SPLIT:
            for start_n in range(0, full_hi, BLOCK_N):
                extrema = _extrema_step(q, start_n, keys, bounds, mask, extrema, scales, CALIB, MASKING, PREC,
                                        True, BLOCK_N)  # fmt: skip
        for start_n in range(full_hi, hi, BLOCK_N):
            extrema = _extrema_step(q, start_n, keys, bounds, mask, extrema, scales, CALIB, MASKING, PREC,
                                    False, BLOCK_N)  # fmt: skip
        if HAS_SINKS:
            s_k, ok = _sink_scores(Sinks, hd, BLOCK_M)
            extrema = _sink_extrema(s_k, ok, extrema, Tk, CALIB)
        M, m, amax, amin = extrema
        empty = M == float("-inf")
        M = tl.where(empty, 0.0, M)  # fully masked row: M = m = 0 (reference.row_extrema); NaN stays NaN
        m = tl.where(empty, 0.0, m)
        if CALIB != 1:
            m = M
            amin = amax

        # Pass 2: weights at the final (M, m); W = sum w, O = sum w v (and W^L, O^L for Prob-STE).
        row = row_constants(M, m, kf, tau, CALIB)
        rows = (M, amax, amin)
        sums = (
            tl.zeros([BLOCK_M], tl.float32),  # W
            tl.zeros([BLOCK_M], tl.float32),  # W^L
            tl.zeros([BLOCK_M, BLOCK_D], tl.float32),  # sum w v
            tl.zeros([BLOCK_M, BLOCK_D], tl.float32),  # sum w^L v
        )
        sums = _weights_loop(q, (0, full_hi, hi), keys, bounds, mask, rows, row, sums, scales, OP, MASKING,
                             PREC, (False, SAVE), SPLIT, BLOCK_N)  # fmt: skip
        if HAS_SINKS:
            SUM_L: tl.constexpr = JACOBIAN_AT_PL and (SAVE or HISTORICAL)  # as in _weights_step
            W, WL, acc, accL = sums
            W, WL = _sink_weights(s_k, ok, M, amax, amin, row, Tk, W, WL, OP, SUM_L)
            sums = (W, WL, acc, accL)
        if HIST_PROB:  # Pass 3 (historical Prob-STE): O = sum_j P_j v_j with W^H, W^L final
            sums = _weights_loop(q, (0, full_hi, hi), keys, bounds, mask, rows, row, sums, scales, OP,
                                 MASKING, PREC, (True, SAVE), SPLIT, BLOCK_N)  # fmt: skip
        W, WL, acc, accL = sums

    row_i = bh * Tq + offs_m
    rmask = offs_m < Tq
    if HIST_PROB:  # acc = P V already normalized
        o = acc
    else:
        o = acc * inv_w(W)[:, None]  # fully masked row: O = 0
    # A row with a NaN or infinite score on a valid key (from non-finite q or k; M is NaN) is NaN, never a
    # quiet row of whatever the clamps made of it (kinterval_attention's rule). Its gradient is not defined.
    bad = M != M
    o = tl.where(bad[:, None], float("nan"), o)
    o_ptrs = offs_m[:, None] * D + offs_d[None, :]
    omask = rmask[:, None] & dmask[None, :]
    tl.store(O + bh * Tq * D + o_ptrs, _cast(o, O.dtype.element_ty), mask=omask)
    if SAVE:
        tl.store(Mrow + row_i, M, mask=rmask)
        tl.store(mrow + row_i, m, mask=rmask)
        tl.store(Wfwd + row_i, W, mask=rmask)
        tl.store(Amax + row_i, amax, mask=rmask)
        tl.store(Amin + row_i, amin, mask=rmask)
        if JACOBIAN_AT_PL:
            oL = accL * inv_w(WL)[:, None]
            tl.store(OL + bh * Tq * D + o_ptrs, oL, mask=omask)
            tl.store(Wat + row_i, WL, mask=rmask)
        else:
            tl.store(Wat + row_i, W, mask=rmask)


# -------------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_coefs(s, valid, is_max, is_min, M, row, OP: tl.constexpr, SUM_GM: tl.constexpr, inv_Wf=None,
               DELTA_EXP: tl.constexpr = False):  # fmt: skip
    """Per-tile backward coefficients, formed before g = dO V^T so that few score-sized tiles stay live.

    Returns the forward weight w (w^N, or w^H in historical arithmetic, for the STE operators; for
    dV = P^T dO), the placed w^L (historical Prob-STE's P needs it), the self-term factor cD (Delta on valid
    keys: the self term of dL/ds, eq. 2; w for softmax: dS = P (g - D)) and
    dM = dw/dM (eq. 1, when SUM_GM: 1 ``calibration_grad`` in full, 2 its SHORT form). ``s`` is the tile of
    ``_scores``: for softmax (s - M) log2(e). The exp baselines: w of ``exp_baseline`` and cD its dw/dz.
    With the row's 1/W (``inv_Wf``) the strict STE operators return w^N/W, the forward's P^N, as w.
    """
    CALIB: tl.constexpr = OP[0]
    SOFTMAX: tl.constexpr = OP[1]
    JACOBIAN_AT_PL: tl.constexpr = OP[3]
    HISTORICAL: tl.constexpr = OP[4]
    EXP: tl.constexpr = OP[5]
    dM = 0.0  # dw/dM, eq. (1), only where the dQ kernel sums G_M (SUM_GM)
    if SOFTMAX:
        w = tl.where(valid, tl.exp2(s), 0.0)  # e^{s - M}: s is (s - M) log2(e) here (_scores)
        wLp = w
        cD = w
    elif EXP:
        w, cD = exp_baseline(s - M[:, None], EXP)
        w = tl.where(valid, w, 0.0)
        cD = tl.where(valid, cD, 0.0)
        wLp = w
    else:
        wL, wN, cD, r, x, t, E_r, E_r1 = grid(s, valid, is_max, is_min, M, row, CALIB, SUM_GM, DELTA_EXP)
        if inv_Wf is not None and OP[2] and not HISTORICAL:
            # P^N = w^N/W of strict Weight-STE, eq. (3), and Prob-STE, eq. (4): as E_r = E_r1 e^{-h},
            # P^N = E_r1 (1/W or e^{-h}/W), a select between two row constants; E_r, unused here, is not
            # formed: one product per score less. Placed before the product: a select last is sunk past
            # the bf16 cast of P (unpack, select, pack)
            w = _place(E_r1, valid) * tl.where(t >= 0.5, inv_Wf[:, None], (row[3] * inv_Wf)[:, None])
        else:
            w = _forward_weight(wL, wN, valid, OP)
        wLp = w
        if JACOBIAN_AT_PL and HISTORICAL:
            wLp = _place(wL, valid)
        if SUM_GM:
            dM = calibration_grad(r, x, t, E_r, E_r1, cD, row, SUM_GM == 2)
    return w, wLp, cD, dM


@triton.jit
def _dq_step(query, start_n, keys, bounds, mask, rows, row, state, scales, OP: tl.constexpr,
             GRAD: tl.constexpr, MASKING: tl.constexpr, PREC: tl.constexpr, TILE: tl.constexpr,
             BLOCK_N: tl.constexpr):  # fmt: skip
    """One key tile of the dQ loop, state = (dq, ksum, S1, GM, nv): the self term of eq. (2) into dq, its row
    sums S1 (and G_M, the P1 sums). query = (q, dO) of the query block; rows = (M, amax, amin, Dd, inv_Wa);
    TILE = (FULL, FOLD, DELTA_EXP): FOLD sums W^at gamma, and the kernel applies the row's 1/W^at after the
    loop; DELTA_EXP: grid's one-exponential Delta (FWM, resolved)."""
    FULL: tl.constexpr = TILE[0]
    q, do = query
    SUM_GM: tl.constexpr = GRAD[2]
    PROJECT_P1: tl.constexpr = GRAD[3]
    k_base, v_base, skn, skd, svn, svd = keys
    offs_m, offs_d, dmask, Tq, Tk = bounds
    M, amax, amin, Dd, inv_Wa = rows
    dq, ksum, S1, GM, nv = state
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kvmask = dmask[None, :] if FULL else (offs_n[:, None] < Tk) & dmask[None, :]
    k = tl.load(k_base + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kvmask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kvmask, other=0.0)
    SOFTCAP: tl.constexpr = MASKING[3]
    bias = None
    if MASKING[4]:
        bias = _bias_tile(offs_m, offs_n, Tq, Tk, mask)
    s, th = _scores(q, tl.trans(k), scales, M, PREC, OP[1], SOFTCAP, bias)
    valid = _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING, FULL)
    is_max, is_min = None, None
    if SUM_GM:  # dw/dM reads x and t; without it the loop needs r alone, which the pins do not move (grid)
        is_max, is_min = _arg_keys(start_n, amax, amin, FULL, BLOCK_N)
    GM_FORM: tl.constexpr = SUM_GM * (1 + (q.shape[1] <= 64))  # calibration_grad's SHORT form up to D = 64
    w, wLp, cD, dM = _bwd_coefs(s, valid, is_max, is_min, M, row, OP, GM_FORM, None, TILE[2])
    g = _dot(do, tl.trans(v), PREC)  # g_ij = dO_i . v_j = dL/dP_ij
    if TILE[1]:
        gamma = tl.where(valid, g - Dd[:, None], 0.0)  # W^at gamma
    else:
        gamma = tl.where(valid, _gamma(g, Dd, inv_Wa), 0.0)
    ds = score_grad(gamma, cD, is_max, GM, is_min, GM, False, False, OP[5])  # eq. (2) self term; rest after
    if MASKING[4] == 2:  # dL/dbias = dL/ds: the self term of eq. (2) per score (the kernel adds the rest)
        ds_b = ds
        if TILE[1]:
            ds_b = ds * inv_Wa[:, None]
        inb = (offs_m[:, None] < Tq) & (offs_n[None, :] < Tk)
        tl.store(mask[6] + offs_m.to(tl.int64)[:, None] * Tk + offs_n[None, :], ds_b, mask=inb)
    dq += _dot(_cast(_chain(ds, th, SOFTCAP), k.dtype), k, PREC)
    S1 += tl.sum(ds, 1)
    if SUM_GM:  # G_M = sum_j gamma_ij * dw/dM (eq. 1)
        GM += tl.sum(gamma * dM, 1)
    if PROJECT_P1:  # the valid keys' count and k sum (with a softcap, each k times its chain factor)
        nv += tl.sum(valid.to(tl.float32), 1)
        ksum += _dot(_cast(_chain(valid.to(tl.float32), th, SOFTCAP), k.dtype), k, PREC)
    return dq, ksum, S1, GM, nv


@triton.autotune(configs=_configs("dq"), key=_KEY, prune_configs_by=_pruner("dq"), do_bench=_timer)
@triton.jit
def _bwd_dq_kernel(Q, ins, stats, outs, strides, shape, consts, OP: tl.constexpr, GRAD: tl.constexpr,
                   MASKING: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """dQ over one query block, plus the per-row sums G_M, G_m of dw/dM (eq. 1), the P1 mean, with
    attention sinks the sink's dL/ds of each row (eq. 2) and, with MASKING[4] = 2, dL/ds of every score
    (DBias: the gradient of the score bias; P1's projection is left to autograd). It also stores each row's
    constants for the dK/dV kernel (RowC, ``save_row_constants``), which runs after it."""
    Kp, V, Mask, DO, Sinks, Bias = ins
    Mrow, mrow, Wfwd, Wat, Dlt, Amax, Amin = stats
    DQ, GMo, Gmo, MUo, DSo, DBias, RowC = outs
    q_str, k_str, v_str, m_str, b_str = strides  # (batch, head, row, dim) strides of q, k, v, mask, bias
    sqb, sqh, sqm, sqd = q_str
    skb, skh, skn, skd = k_str
    svb, svh, svn, svd = v_str
    smb, smh, smm, smn = m_str
    sbb, sbh, sbm, sbn = b_str
    H, Tq, Tk, D, G = shape
    scale, kf, tau, cap = consts
    scales = (scale, cap)
    CALIB: tl.constexpr = OP[0]
    KEEP_MAX_TERM: tl.constexpr = GRAD[0]
    KEEP_MIN_TERM: tl.constexpr = GRAD[1]
    SUM_GM: tl.constexpr = GRAD[2]
    PROJECT_P1: tl.constexpr = GRAD[3]
    IS_CAUSAL: tl.constexpr = MASKING[0]
    HAS_MASK: tl.constexpr = MASKING[1]
    HAS_SINKS: tl.constexpr = MASKING[2]
    SOFTCAP: tl.constexpr = MASKING[3]
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    hd = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    rmask = offs_m < Tq
    qmask = rmask[:, None] & dmask[None, :]
    q = tl.load(Q + b * sqb + hd * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=qmask, other=0.0)
    o_ptrs = bh * Tq * D + offs_m[:, None] * D + offs_d[None, :]
    do = tl.load(DO + o_ptrs, mask=qmask, other=0.0)
    query = (q, do)
    row_i = bh * Tq + offs_m
    M = tl.load(Mrow + row_i, mask=rmask, other=0.0)
    m = tl.load(mrow + row_i, mask=rmask, other=0.0)
    Wa = tl.load(Wat + row_i, mask=rmask, other=0.0)
    Dd = tl.load(Dlt + row_i, mask=rmask, other=0.0)
    hk = hd // G  # its k/v head
    k_base = Kp + b * skb + hk * skh
    keys = (k_base, V + b * svb + hk * svh, skn, skd, svn, svd)
    bias_base = Bias + b * sbb + hd * sbh
    mask = (Mask + b * smb + hd * smh, smm, smn, bias_base, sbm, sbn, DBias + bh * Tq * Tk)
    bounds = (offs_m, offs_d, dmask, Tq, Tk)
    row = row_constants(M, m, kf, tau, CALIB)
    inv_Wa = inv_w_at(Wa, row[5])
    # here rather than after the loop: there it cost ptxas more spills (TF32, D = 128)
    Wf = tl.load(Wfwd + row_i, mask=rmask, other=0.0)
    LOW: tl.constexpr = Q.dtype.element_ty.primitive_bitwidth < 32  # bf16 / fp16 inputs
    # P and Delta are rounded to 8 or 10 bits before their dots (bf16/fp16 inputs, TF32): the modes in which
    # softmax's dK/dV takes P in the exponent (_key_block_tile's LSE: the normalizer stored here) and FWM's
    # dQ takes Delta as one exponential (grid's DELTA_EXP)
    ROUNDED: tl.constexpr = LOW or PREC == "tf32"
    save_row_constants(RowC, row_i, rmask, row, Wf, inv_Wa, M, OP[1] and ROUNDED)
    amax = tl.load(Amax + row_i, mask=rmask, other=-1)
    amin = tl.load(Amin + row_i, mask=rmask, other=-1)
    rows = (M, amax, amin, Dd, inv_Wa)
    hi = Tk
    if IS_CAUSAL:
        hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq)
    # eq. (2)'s self term and the row sum of gamma dw/dM (eq. 1) are linear in gamma = (g - D)/W^at: FOLD
    # sums both with W^at gamma and scales the row sums and dq by 1/W^at once, one product per score less.
    # Not for BF16-exp (it rounds gamma itself to bf16: score_grad), nor for MinMax's G_M sum in fp32 at
    # D = 128, where ptxas spilled more (benchmarks/kernel_resources.py, TF32 D = 128).
    FOLD: tl.constexpr = OP[5] != 1 and (BLOCK_D <= 64 or not GRAD[2] or LOW)
    DELTA_EXP: tl.constexpr = OP[0] >= 2 and ROUNDED

    state = (
        tl.zeros([BLOCK_M, BLOCK_D], tl.float32),  # dq
        tl.zeros([BLOCK_M, BLOCK_D], tl.float32),  # P1: sum of k over valid keys
        tl.zeros([BLOCK_M], tl.float32),  # S1 = sum_j gamma Delta (row sum of the self term)
        tl.zeros([BLOCK_M], tl.float32),  # G_M = sum_j gamma dw/dM (MinMax)
        tl.zeros([BLOCK_M], tl.float32),  # number of valid keys (P1)
    )
    full_hi = 0
    if SPLIT:
        full_hi = _full_key_end(pid_m, Tq, Tk, IS_CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N)
        for start_n in range(0, full_hi, BLOCK_N):  # unmasked interior tiles, then the rest
            state = _dq_step(query, start_n, keys, bounds, mask, rows, row, state, scales, OP, GRAD, MASKING,
                             PREC, (True, FOLD, DELTA_EXP), BLOCK_N)  # fmt: skip
    for start_n in range(full_hi, hi, BLOCK_N):
        state = _dq_step(query, start_n, keys, bounds, mask, rows, row, state, scales, OP, GRAD, MASKING,
                         PREC, (False, FOLD, DELTA_EXP), BLOCK_N)  # fmt: skip
    dq, ksum, S1, GM, nv = state
    if FOLD:
        dq *= inv_Wa[:, None]
        S1 *= inv_Wa
        GM *= inv_Wa
    if HAS_SINKS:  # the sink's self term of eq. (2), and its gamma dw/dM (eq. 1) for G_M; g = dO . v_sink = 0
        s_k, ok = _sink_scores(Sinks, hd, BLOCK_M)
        s_k = tl.where(ok, s_k, M[:, None])  # a sink that takes no part: any finite score, dropped by ok
        if OP[1]:  # softmax: the exponent (s - M) log2(e), as _scores and _sink_softmax form it
            s_k = tl.fma(s_k, LOG2E, -(M * LOG2E)[:, None])
        is_max_k = (amax == Tk)[:, None]
        is_min_k = (amin == Tk)[:, None]
        _, _, cD_k, dM_k = _bwd_coefs(s_k, ok, is_max_k, is_min_k, M, row, OP, SUM_GM)
        gamma_k = tl.where(ok, _gamma(tl.zeros_like(s_k), Dd, inv_Wa), 0.0)
        ds_k = tl.sum(score_grad(gamma_k, cD_k, is_max_k, GM, is_min_k, GM, False, False, OP[5]), 1)
        S1 += ds_k
        if SUM_GM:
            GM += tl.sum(gamma_k * dM_k, 1)
        if PROJECT_P1:
            nv += tl.sum(ok.to(tl.float32), 1)

    # The calibration terms of eq. (2): G_M lands on the arg-max key, G_m on the arg-min key (rank-1 updates).
    # Softmax: G_M = -sum_j dS_ij = 0 in exact arithmetic (not applied; KEEP_MAX_TERM is False). BF16-exp
    # and FP8-exp: G_M = -S1 (z = s - M), not 0: their rounded weights are not a softmax.
    if CALIB == 1:
        Gm = -S1 - GM  # eq. (1): dw/dM + dw/dm = -Delta
    else:  # FWM / resolved: dw/dM = -Delta, no m term; the exp baselines: dw/dM = -dw/dz
        GM = -S1
        Gm = tl.zeros([BLOCK_M], tl.float32)
    GMe = tl.zeros([BLOCK_M], tl.float32)
    Gme = tl.zeros([BLOCK_M], tl.float32)
    # a row whose arg key is the sink (key Tk) has no k there: its term is the sink's (ds_k below)
    max_mask = qmask & (amax < Tk)[:, None] if HAS_SINKS else qmask
    min_mask = qmask & (amin < Tk)[:, None] if HAS_SINKS else qmask
    # the softcap's slope at the arg keys, th = M / c and m / c; a sink there is not capped and its |s| may
    # exceed c by any amount: (s / c)^2 would overflow to inf and inf * 0 (its zero k row) make dq NaN
    th_max = M / cap
    th_min = m / cap
    if SOFTCAP and MASKING[4]:  # the capped part of M and m: the score less the bias at the arg key
        th_max = (M - _bias_at(bias_base, offs_m, amax, sbm, sbn, rmask, Tk)) / cap
        th_min = (m - _bias_at(bias_base, offs_m, amin, sbm, sbn, rmask, Tk)) / cap
    if HAS_SINKS and SOFTCAP:
        th_max = tl.where(amax < Tk, th_max, 0.0)
        th_min = tl.where(amin < Tk, th_min, 0.0)
    if KEEP_MAX_TERM:
        GMe = GM
        k_max = tl.load(
            k_base + tl.maximum(amax, 0)[:, None] * skn + offs_d[None, :] * skd, mask=max_mask, other=0.0
        )
        dq += _chain(GMe, th_max, SOFTCAP)[:, None] * k_max.to(tl.float32)  # th at the arg-max: M / c
    if KEEP_MIN_TERM:
        Gme = Gm
        k_min = tl.load(
            k_base + tl.maximum(amin, 0)[:, None] * skn + offs_d[None, :] * skd, mask=min_mask, other=0.0
        )
        dq += _chain(Gme, th_min, SOFTCAP)[:, None] * k_min.to(tl.float32)
    mu = tl.zeros([BLOCK_M], tl.float32)
    if PROJECT_P1:  # P1: project dS onto the zero-sum subspace of the valid keys
        mu = S1 / tl.maximum(nv, 1.0)
        dq -= mu[:, None] * ksum
    dq = dq * scale
    tl.store(DQ + o_ptrs, _cast(dq, DQ.dtype.element_ty), mask=qmask)
    if MASKING[4] == 2 and (KEEP_MAX_TERM or KEEP_MIN_TERM):
        # dL/dbias at the arg keys: the calibration terms of eq. (2), G_M and G_m, on the self terms the
        # loop stored (the barrier makes those stores visible to every thread of the program)
        tl.debug_barrier()
        db_row = DBias + row_i * Tk
        at_max = rmask & (amax >= 0) & (amax < Tk)  # not the sink (key Tk)
        at_min = rmask & (amin >= 0) & (amin < Tk)
        both = amax == amin  # one key holds both (a single-key MinMax row): one update
        if KEEP_MAX_TERM:
            add = GMe
            if KEEP_MIN_TERM:
                add += tl.where(both, Gme, 0.0)
            tl.store(db_row + amax, tl.load(db_row + amax, mask=at_max, other=0.0) + add, mask=at_max)
        if KEEP_MIN_TERM:
            if KEEP_MAX_TERM:
                at_min = at_min & ~both
            tl.store(db_row + amin, tl.load(db_row + amin, mask=at_min, other=0.0) + Gme, mask=at_min)
    tl.store(GMo + row_i, GMe, mask=rmask)
    tl.store(Gmo + row_i, Gme, mask=rmask)
    tl.store(MUo + row_i, mu, mask=rmask)
    if HAS_SINKS:  # dL/ds_sink of each row, eq. (2): the self term and the calibration terms it holds
        if KEEP_MAX_TERM:
            ds_k += tl.where(amax == Tk, GMe, 0.0)
        if KEEP_MIN_TERM:
            ds_k += tl.where(amin == Tk, Gme, 0.0)
        if PROJECT_P1:
            ds_k = tl.where(tl.sum(ok.to(tl.int32), 1) > 0, ds_k - mu, 0.0)
        tl.store(DSo + row_i, ds_k, mask=rmask)


# ----------------------------------------------------------------------- dK/dV and the fused backward
@triton.jit
def _key_block_tile(kv, start_m, query, offs_n, dims, mask, stats, dv, scales, OP: tl.constexpr,
                    MASKING: tl.constexpr, PREC: tl.constexpr, FULL: tl.constexpr, COEF: tl.constexpr,
                    BLOCK_M: tl.constexpr):  # fmt: skip
    """What the dK/dV and the fused backward share on one query tile of a key block: the tile's q and dO, its
    row statistics and grid constants, the scores and their backward coefficients (``_bwd_coefs``; dw/dM of
    eq. (1) when SUM_GM), dV += P^T dO with the forward P (P^N for the strict STE operators; historical: the
    P of Weight-STE, eq. (3), or of Prob-STE, eq. (4)) and g = dO V^T. kv = (k, v) of the key block; query =
    (q_base, sqm, sqd, DO, bh, Tq, Tk, D, kf, tau); dims = (offs_d, dmask); stats starts with the per-row
    buffers (Mrow, mrow, Wfwd, Wat, Dlt, Amax, Amin) and has the row constants at stats[10]
    (``load_row_constants``; stored by the dQ kernel or, for the fused backward, ``_row_constants_kernel``).
    COEF = (SUM_GM, FOLD): FOLD returns cD / W^at, the self-term factor with the normalization's 1/W of gamma
    (App. B) folded in per row (not with SUM_GM: dw/dM takes Delta itself). Returns, besides the tiles, the
    rows' 1/W^at (0 on empty and degenerate rows, and with FOLD). th: the softcap's s / c (``_scores``;
    unused without one)."""
    k, v = kv
    SUM_GM: tl.constexpr = COEF[0]
    FOLD: tl.constexpr = COEF[1]
    CALIB: tl.constexpr = OP[0]
    SOFTMAX: tl.constexpr = OP[1]
    JACOBIAN_AT_PL: tl.constexpr = OP[3]
    HISTORICAL: tl.constexpr = OP[4]
    q_base, sqm, sqd, DO, bh, Tq, Tk, D, kf, tau = query
    offs_d, dmask = dims
    Mrow, mrow, Wfwd, Wat, Dlt = stats[0], stats[1], stats[2], stats[3], stats[4]
    Amax, Amin = stats[5], stats[6]
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rmask = offs_m < Tq
    qmask = dmask[None, :] if FULL else rmask[:, None] & dmask[None, :]
    q = tl.load(q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=qmask, other=0.0)
    do = tl.load(DO + bh * Tq * D + offs_m[:, None] * D + offs_d[None, :], mask=qmask, other=0.0)
    row_i = bh * Tq + offs_m
    M = tl.load(Mrow + row_i, mask=rmask, other=0.0)
    m = tl.load(mrow + row_i, mask=rmask, other=0.0)
    Dd = tl.load(Dlt + row_i, mask=rmask, other=0.0)
    amax = tl.load(Amax + row_i, mask=rmask, other=-1)
    amin = tl.load(Amin + row_i, mask=rmask, other=-1)
    PL_HISTORICAL: tl.constexpr = JACOBIAN_AT_PL and HISTORICAL  # prob_ste divides by W^L and W^H
    if PL_HISTORICAL:
        Wf = tl.load(Wfwd + row_i, mask=rmask, other=0.0)
        Wa = tl.load(Wat + row_i, mask=rmask, other=0.0)
    # FOLD's Delta/W^at = E_r1 (dfac/W^at), one product per score less, comes from the saved constants
    row, inv_Wf, inv_Wa = load_row_constants(stats[10], row_i, rmask, M, m, kf, tau, CALIB, FOLD)
    bias = None
    if MASKING[4]:
        bias = _bias_tile(offs_m, offs_n, Tq, Tk, mask)
    # Softmax with bf16/fp16 inputs or TF32 dots: P = exp2((s - M) log2(e) - log2 W), the normalizer in the
    # exponent (FlashAttention's log-sum-exp form), one product per score less than e^{s - M} / W. The
    # rounding of the row's offset u = M log2(e) + log2 W scales its P by up to 2^-24 |u| ln 2 (3e-6 at
    # u = 64), far below P's rounding to the dot's 8 (bf16) or 10 (TF32) bit mantissa; the near-fp32 modes
    # keep the product. (The dQ kernel's ROUNDED, which stores u for these modes.)
    LSE: tl.constexpr = SOFTMAX and (q_base.dtype.element_ty.primitive_bitwidth < 32 or PREC == "tf32")
    off = None
    if LSE:
        off = tl.load(stats[10] + row_i * ROW_CONSTS + 7, mask=rmask, other=float("inf"))
    s, th = _scores(q, tl.trans(k), scales, M, PREC, SOFTMAX, MASKING[3], bias, off)
    valid = _valid_tile(offs_m, offs_n, Tq, Tk, mask, MASKING, FULL)
    is_max = offs_n[None, :] == amax[:, None]
    is_min = offs_n[None, :] == amin[:, None]
    STRICT_STE: tl.constexpr = CALIB != 0 and OP[2] and not HISTORICAL  # _bwd_coefs returns P^N
    pin_max, pin_min = is_max, is_min
    if STRICT_STE and not SUM_GM:  # P^N and Delta need r and [t >= 1/2] alone: no pins (grid)
        pin_max, pin_min = None, None
    w, wLp, cD, dM = _bwd_coefs(
        s, valid, pin_max, pin_min, M, row, OP, SUM_GM, inv_Wf if STRICT_STE else None
    )
    if PL_HISTORICAL:
        p = prob_ste(wLp, w, Wa, Wf)
    elif STRICT_STE or LSE:
        p = w
    else:
        p = w * inv_Wf[:, None]
    if FOLD and SOFTMAX:  # W^at = W: dS = P (g - D), FlashAttention's form
        cD = p
    dv += _dot(tl.trans(_cast(p, do.dtype)), do, PREC)
    g = _dot(do, tl.trans(v), PREC)
    return q, row_i, rmask, row, inv_Wa, Dd, valid, is_max, is_min, cD, dM, g, dv, th


@triton.jit
def _dkdv_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP: tl.constexpr,
               GRAD: tl.constexpr, MASKING: tl.constexpr, PREC: tl.constexpr, TILE: tl.constexpr,
               BLOCK_M: tl.constexpr):  # fmt: skip
    """One query tile of the dK/dV loop, kv_sums = (dk, dv): dV += P^T dO, dK += dS^T q, dS = dL/ds eq. (2).
    Arguments as in ``_key_block_tile``; stats = the per-row buffers (Mrow, mrow, Wfwd, Wat, Dlt, Amax, Amin,
    GMo, Gmo, MUo, RowC): RowC the row constants of the dQ kernel (``load_row_constants``)."""
    FULL: tl.constexpr = TILE[0]  # an interior tile: every score valid
    ARG_AFTER: tl.constexpr = TILE[1]  # eq. (2)'s calibration terms after the loop (_bwd_key_block)
    KEEP_MAX_TERM: tl.constexpr = GRAD[0]
    KEEP_MIN_TERM: tl.constexpr = GRAD[1]
    PROJECT_P1: tl.constexpr = GRAD[3]
    GMo, Gmo, MUo = stats[7], stats[8], stats[9]
    dk, dv = kv_sums
    # The self term gamma Delta = (g - D) (Delta/W^at) with the row's 1/W^at folded into Delta's per-row
    # factor (grid operators) or, for softmax, into P: no gamma tile. The exp baselines keep gamma (BF16-exp
    # rounds it to bf16 before the product: score_grad).
    FOLD: tl.constexpr = OP[0] != 0 or OP[1]
    COEF: tl.constexpr = (False, FOLD)
    q, row_i, rmask, row, inv_Wa, Dd, valid, is_max, is_min, cD, dM, g, dv, th = _key_block_tile(
        kv, start_m, query, offs_n, dims, mask, stats, dv, scales, OP, MASKING, PREC, FULL, COEF, BLOCK_M
    )
    if FOLD:
        gamma = g - Dd[:, None]  # not masked: cD = 0 off the valid keys
    else:
        gamma = _gamma(g, Dd, inv_Wa)
    if ARG_AFTER:  # eq. (2)'s self term here; its calibration terms after the loop (_arg_key_terms)
        ds = score_grad(gamma, cD, is_max, Dd, is_min, Dd, False, False, OP[5])
    else:
        GMe = Dd  # not read unless KEEP_MAX_TERM
        Gme = Dd  # not read unless KEEP_MIN_TERM
        if KEEP_MAX_TERM:
            GMe = tl.load(GMo + row_i, mask=rmask, other=0.0)
        if KEEP_MIN_TERM:
            Gme = tl.load(Gmo + row_i, mask=rmask, other=0.0)
        ds = score_grad(gamma, cD, is_max, GMe, is_min, Gme, KEEP_MAX_TERM, KEEP_MIN_TERM, OP[5])  # eq. (2)
    if PROJECT_P1:  # P1 projection: dS_ij - mean over valid keys
        mu = tl.load(MUo + row_i, mask=rmask, other=0.0)
        ds = tl.where(valid, ds - mu[:, None], 0.0)
    dk += _dot(tl.trans(_cast(_chain(ds, th, MASKING[3]), q.dtype)), q, PREC)
    return dk, dv


@triton.jit
def _arg_key_terms(dk, n0, lo, query, offs_n, dims, mask, stats, cap, GRAD: tl.constexpr, PREC: tl.constexpr,
                   MASKING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The calibration terms of eq. (2) in dK of the key block n0 + offs_n:
    dk_j += sum_i ([Amax_i = j] G_M,i + [Amin_i = j] G_m,i) q_i,
    the rank-1 updates whose dQ side the dQ kernel applies (with a softcap, G times its chain factor at the
    arg key, 1 - (M/c)^2 or 1 - (m/c)^2, with a score bias M and m less the bias there). Out of the loop
    (there they cost a compare and a select per score and channel): one pass over the rows from lo, a range
    check per row, and a product only for the row tiles that have an arg key in this block. The same rows in
    the same order on every run: the split backward stays bitwise reproducible."""
    KEEP_MAX_TERM: tl.constexpr = GRAD[0]
    KEEP_MIN_TERM: tl.constexpr = GRAD[1]
    SOFTCAP: tl.constexpr = MASKING[3]
    q_base, sqm, sqd, DO, bh, Tq, Tk, D, kf, tau = query
    offs_d, dmask = dims
    Mrow, mrow, Amax, Amin, GMo, Gmo = stats[0], stats[1], stats[5], stats[6], stats[7], stats[8]
    for start_m in range(lo, Tq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rmask = offs_m < Tq
        row_i = bh * Tq + offs_m
        amax = tl.full([BLOCK_M], -1, tl.int32)  # -1: no arg key (a channel that is not kept, a row past Tq)
        amin = tl.full([BLOCK_M], -1, tl.int32)
        if KEEP_MAX_TERM:
            amax = tl.load(Amax + row_i, mask=rmask, other=-1)
        if KEEP_MIN_TERM:
            amin = tl.load(Amin + row_i, mask=rmask, other=-1)
        hit = ((amax >= n0) & (amax < n0 + BLOCK_N)) | ((amin >= n0) & (amin < n0 + BLOCK_N))
        if tl.max(hit.to(tl.int32), 0) > 0:
            G = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            if KEEP_MAX_TERM:
                GM = tl.load(GMo + row_i, mask=rmask, other=0.0)
                if SOFTCAP:
                    at = tl.load(Mrow + row_i, mask=rmask, other=0.0)
                    if MASKING[4]:
                        at -= _bias_at(mask[3], offs_m, amax, mask[4], mask[5], rmask, Tk)
                    GM = _chain(GM, at / cap, SOFTCAP)
                G += tl.where(offs_n[None, :] == amax[:, None], GM[:, None], 0.0)
            if KEEP_MIN_TERM:
                Gm = tl.load(Gmo + row_i, mask=rmask, other=0.0)
                if SOFTCAP:
                    at = tl.load(mrow + row_i, mask=rmask, other=0.0)
                    if MASKING[4]:
                        at -= _bias_at(mask[3], offs_m, amin, mask[4], mask[5], rmask, Tk)
                    Gm = _chain(Gm, at / cap, SOFTCAP)
                G += tl.where(offs_n[None, :] == amin[:, None], Gm[:, None], 0.0)
            qmask = rmask[:, None] & dmask[None, :]
            q = tl.load(q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=qmask, other=0.0)
            dk += _dot(tl.trans(_cast(G, q.dtype)), q, PREC)
    return dk


@triton.jit
def _fused_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP: tl.constexpr,
                GRAD: tl.constexpr, MASKING: tl.constexpr, PREC: tl.constexpr, TILE: tl.constexpr,
                BLOCK_M: tl.constexpr):  # fmt: skip
    """One query tile of the fused backward, kv_sums = (dk, dv): dV += P^T dO and dK += dS^T q with the self
    term dS = gamma Delta of eq. (2); the tile's dQ share dS k and its row sums S1 = sum_j dS_ij and
    G_M, the sum over j of gamma_ij times dw_j/dM (eq. 1), are added atomically to fp32 buffers. The
    calibration terms of eq. (2) need the complete row sums: ``autograd.fused_backward`` adds them after the
    kernel. Arguments as in ``_dkdv_step``; stats = (Mrow, mrow, Wfwd, Wat, Dlt, Amax, Amin, DQa, S1a,
    GMa, RowC): RowC the row constants of ``_row_constants_kernel``."""
    k, v = kv
    KEEP_MAX_TERM: tl.constexpr = GRAD[0]
    KEEP_MIN_TERM: tl.constexpr = GRAD[1]
    SUM_GM: tl.constexpr = GRAD[2]
    q_base, sqm, sqd, DO, bh, Tq, Tk, D, kf, tau = query
    offs_d, dmask = dims
    DQa, S1a, GMa = stats[7], stats[8], stats[9]
    dk, dv = kv_sums
    # FOLD as in _dkdv_step, but not with the G_M sum: dw/dM of eq. (1) takes Delta, not Delta/W^at
    FOLD: tl.constexpr = (OP[0] != 0 or OP[1]) and not SUM_GM
    COEF: tl.constexpr = (SUM_GM * (1 + (offs_d.shape[0] <= 64)), FOLD)  # SHORT form as in _dq_step
    q, row_i, rmask, row, inv_Wa, Dd, valid, is_max, is_min, cD, dM, g, dv, th = _key_block_tile(
        kv, start_m, query, offs_n, dims, mask, stats, dv, scales, OP, MASKING, PREC, TILE[0], COEF, BLOCK_M
    )
    # gamma is 0 off the valid keys even where g is not finite there (a masked key's v may be anything):
    # its dS enters the row's dQ
    if FOLD:
        gamma = tl.where(valid, g - Dd[:, None], 0.0)  # W^at gamma: cD carries the 1/W^at
    else:
        gamma = tl.where(valid, _gamma(g, Dd, inv_Wa), 0.0)
    ds = score_grad(gamma, cD, is_max, Dd, is_min, Dd, False, False, OP[5])  # eq. (2) self term
    ds_qk = _chain(ds, th, MASKING[3])  # dL/d(scale q.k) for the dots
    dk += _dot(tl.trans(_cast(ds_qk, q.dtype)), q, PREC)
    amask = rmask[:, None] & dmask[None, :]
    o_ptrs = bh * Tq * D + (start_m + tl.arange(0, BLOCK_M))[:, None] * D + offs_d[None, :]
    tl.atomic_add(DQa + o_ptrs, _dot(_cast(ds_qk, k.dtype), k, PREC), mask=amask, sem="relaxed")
    if KEEP_MAX_TERM or KEEP_MIN_TERM:
        tl.atomic_add(S1a + row_i, tl.sum(ds, 1), mask=rmask, sem="relaxed")
    if SUM_GM:
        tl.atomic_add(GMa + row_i, tl.sum(gamma * dM, 1), mask=rmask, sem="relaxed")
    return dk, dv


@triton.jit
def _key_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP: tl.constexpr,
              GRAD: tl.constexpr, MASKING: tl.constexpr, PREC: tl.constexpr, TILE: tl.constexpr,
              BLOCK_M: tl.constexpr):  # fmt: skip
    """One query tile of a key block, TILE = (FULL, ARG_AFTER, FUSED): ``_fused_step`` (FUSED) or
    ``_dkdv_step``."""
    if TILE[2]:
        kv_sums = _fused_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP, GRAD,
                              MASKING, PREC, TILE, BLOCK_M)  # fmt: skip
    else:
        kv_sums = _dkdv_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP, GRAD,
                             MASKING, PREC, TILE, BLOCK_M)  # fmt: skip
    return kv_sums


@triton.jit
def _bwd_key_block(Q, ins, stats, outs, strides, shape, consts, OP: tl.constexpr, GRAD: tl.constexpr,
                   MASKING: tl.constexpr, PREC: tl.constexpr, LOOP: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """dK, dV of one key block over its query blocks (masked, unmasked interior, masked: SPLIT): the body of
    ``_bwd_dkdv_kernel`` and, FUSED, of ``_bwd_fused_kernel``; LOOP = (SPLIT, FUSED). The split backward
    adds eq. (2)'s calibration terms on the arg-max/arg-min keys here (``_arg_key_terms``), the fused one
    after it."""
    Kp, V, Mask, DO, Bias = ins
    DK, DV = outs
    q_str, k_str, v_str, m_str, b_str = strides  # (batch, head, row, dim) strides of q, k, v, mask, bias
    sqb, sqh, sqm, sqd = q_str
    skb, skh, skn, skd = k_str
    svb, svh, svn, svd = v_str
    smb, smh, smm, smn = m_str
    sbb, sbh, sbm, sbn = b_str
    H, Tq, Tk, D, G = shape
    scale, kf, tau, cap = consts
    scales = (scale, cap)
    SPLIT: tl.constexpr = LOOP[0]
    FUSED: tl.constexpr = LOOP[1]
    IS_CAUSAL: tl.constexpr = MASKING[0]
    HAS_MASK: tl.constexpr = MASKING[1]
    # eq. (2)'s calibration terms (KEEP_MAX_TERM, KEEP_MIN_TERM) after the loop, not per score, where the
    # epilogue's query tile fits beside the accumulators: at D = 128 in fp32 it made ptxas spill 264-292 B
    ARG_AFTER: tl.constexpr = (GRAD[0] or GRAD[1]) and BLOCK_D <= 64 and not FUSED
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    hd = bh % H
    hk = hd // G  # this program's k/v head; dK, dV are stored per q head hd (the caller sums groups)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    kvmask = (offs_n[:, None] < Tk) & dmask[None, :]
    k = tl.load(
        Kp + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kvmask, other=0.0
    )
    v = tl.load(
        V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kvmask, other=0.0
    )
    kv = (k, v)
    query = (Q + b * sqb + hd * sqh, sqm, sqd, DO, bh, Tq, Tk, D, kf, tau)
    dims = (offs_d, dmask)
    mask = (Mask + b * smb + hd * smh, smm, smn, Bias + b * sbb + hd * sbh, sbm, sbn)
    lo = 0
    if IS_CAUSAL:  # first query that sees key pid_n * BLOCK_N: i >= j - (Tk - Tq)
        lo = tl.maximum(pid_n * BLOCK_N - (Tk - Tq), 0)
        lo = (lo // BLOCK_M) * BLOCK_M

    kv_sums = (tl.zeros([BLOCK_N, BLOCK_D], tl.float32), tl.zeros([BLOCK_N, BLOCK_D], tl.float32))
    full_hi = lo
    if SPLIT:
        full_lo, full_hi = _full_query_range(pid_n, lo, Tq, Tk, IS_CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N)
        for start_m in range(lo, full_lo, BLOCK_M):  # masked, unmasked interior, masked (last rows)
            kv_sums = _key_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP, GRAD,
                               MASKING, PREC, (False, ARG_AFTER, FUSED), BLOCK_M)  # fmt: skip
        for start_m in range(full_lo, full_hi, BLOCK_M):
            kv_sums = _key_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP, GRAD,
                                MASKING, PREC, (True, ARG_AFTER, FUSED), BLOCK_M)  # fmt: skip
    for start_m in range(full_hi, Tq, BLOCK_M):
        kv_sums = _key_step(kv, start_m, query, offs_n, dims, mask, stats, kv_sums, scales, OP, GRAD,
                            MASKING, PREC, (False, ARG_AFTER, FUSED), BLOCK_M)  # fmt: skip
    dk, dv = kv_sums
    if ARG_AFTER:
        dk = _arg_key_terms(dk, pid_n * BLOCK_N, lo, query, offs_n, dims, mask, stats, cap, GRAD, PREC,
                            MASKING, BLOCK_M, BLOCK_N)  # fmt: skip

    dk = dk * scale
    out = bh * Tk * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK + out, _cast(dk, DK.dtype.element_ty), mask=kvmask)
    tl.store(DV + out, _cast(dv, DV.dtype.element_ty), mask=kvmask)


@triton.autotune(configs=_configs("dkdv"), key=_KEY, prune_configs_by=_pruner("dkdv"), do_bench=_timer)
@triton.jit
def _bwd_dkdv_kernel(Q, ins, stats, outs, strides, shape, consts, OP: tl.constexpr, GRAD: tl.constexpr,
                     MASKING: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """dK, dV over one key block (loop over query blocks); calibration terms on the arg-max/arg-min keys."""
    _bwd_key_block(Q, ins, stats, outs, strides, shape, consts, OP, GRAD, MASKING, PREC, (SPLIT, False),
                   BLOCK_M, BLOCK_N, BLOCK_D)  # fmt: skip


def _zero_fused_accumulators(nargs, reset_only=False):
    """Autotuner pre-hook of the fused backward: zero its atomic accumulators (DQa, S1a, GMa of ``stats``)
    before each timed launch and before the real one. Triton's autotuner times a new key's candidates by
    running the kernel many times on the caller's buffers (even a single candidate, whenever the kernel has
    more than one config), so without this the first backward of each shape returned dQ and the row sums of
    the calibration terms of eq. (2) summed over hundreds of launches."""
    for acc in nargs["stats"][7:10]:
        acc.zero_()


@triton.autotune(
    configs=_configs("fused"),
    key=_KEY,
    prune_configs_by=_pruner("fused"),
    pre_hook=_zero_fused_accumulators,
    do_bench=_timer,
)
@triton.jit
def _bwd_fused_kernel(Q, ins, stats, outs, strides, shape, consts, OP: tl.constexpr, GRAD: tl.constexpr,
                      MASKING: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """The whole backward in one pass over the scores: dK, dV of one key block as ``_bwd_dkdv_kernel`` (loop
    over query blocks), and dQ's share of the block added atomically (``_fused_step``). Scores and grid are
    recomputed once instead of twice; the result is not bitwise reproducible (atomic summation order).
    outs = (DK, DV): DK holds dS^T q * scale without the calibration terms (fp32 when those follow)."""
    _bwd_key_block(Q, ins, stats, outs, strides, shape, consts, OP, GRAD, MASKING, PREC, (SPLIT, True),
                   BLOCK_M, BLOCK_N, BLOCK_D)  # fmt: skip


# The autotuned kernels by the names of CANDIDATES (benchmarks, tests and _fits_shared_memory use it).
KERNELS = {"fwd": _fwd_kernel, "dq": _bwd_dq_kernel, "dkdv": _bwd_dkdv_kernel, "fused": _bwd_fused_kernel}
