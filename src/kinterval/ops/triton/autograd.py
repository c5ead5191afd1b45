"""Autograd wrapper over the fused kernels of ``kernels.py`` (launch code, input checks, precision policy)."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
from torch import Tensor

from kinterval.ops.api import PRECISIONS, check_causal, check_softcap
from kinterval.ops.first_order import first_order_only
from kinterval.ops.spec import OperatorSpec
from kinterval.ops.tf32 import tf32_enabled
from kinterval.ops.triton import unsupported_reason
from kinterval.ops.triton.kernels import (
    INTERPRET,
    ROW_CONSTS,
    _bwd_dkdv_kernel,
    _bwd_dq_kernel,
    _bwd_fused_kernel,
    _fwd_kernel,
    _row_constants_kernel,
    group_flags,
    kernel_flags,
    split_loops,
)

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Test hook: when True every buffer the kernels write is allocated pre-filled with NaN (-1 for indices), so a
# test proves that each element is written (torch.empty would hide an unwritten element behind stale memory).
POISON_OUTPUTS = False


def _alloc(shape, dtype, device) -> Tensor:
    if not POISON_OUTPUTS:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = float("nan") if dtype.is_floating_point else -1
    return torch.full(shape, fill, dtype=dtype, device=device)


def _on_device(x: Tensor):
    """Triton launches on the current CUDA device: make it x's (tensors on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def resolve_precision(dtype: torch.dtype, precision: str | None) -> str:
    """Dot precision for fp32 inputs: "tf32" (one TF32 tensor-core product), "tf32x3" (split TF32: three
    TF32 products carrying the low bits), "bf16x6" (each operand split into three bf16 parts, six bf16
    products; near-fp32 accuracy on the tensor cores like tf32x3, at the same tensor-core time) or "ieee"
    (fp32 FMA dots); default: "tf32" if TF32 is on for fp32 matmuls (``tf32_enabled``) else "ieee".
    bf16/fp16 inputs use their native tensor-core dots with fp32 accumulation (the flag is ignored). The
    split dots are the kernels' own (kernels._dot_tf32x3, _dot_bf16x6), built of TF32 and bf16 dots that
    every supported Triton compiles."""
    if precision not in (None, *PRECISIONS):
        raise ValueError(f"unknown precision {precision!r}; choose None or one of {PRECISIONS}")
    if dtype != torch.float32:
        return "ieee"
    if precision is None:
        return "tf32" if tf32_enabled() else "ieee"
    return precision


def operator_constants(spec: OperatorSpec) -> tuple[dict, float, float]:
    """The kernels' constexpr switches for ``spec`` (kernels.kernel_flags), and its K and tau."""
    reason = unsupported_reason(spec)
    if reason is not None:
        raise ValueError(f"triton backend: {reason} (operator {getattr(spec, 'full_name', spec)})")
    if not spec.is_kinterval:
        return kernel_flags(None, None, "full", False, baseline=spec.kind), 1.0, 1.0
    flags = kernel_flags(spec.calibration, spec.surrogate, spec.range_grad, spec.arithmetic == "historical")
    return flags, float(spec.K), float(spec.tau)


def _block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


def _mask_arg(mask: Tensor | None, shape: tuple[int, int, int, int], device) -> tuple[Tensor, tuple, bool]:
    """The mask as uint8, expanded (stride 0 on broadcast dims) to (B, H, Tq, Tk): a view of the boolean
    tensor (same bytes), never a copy, so an expanded mask stays expanded. A 1-element dummy when absent.

    The kernels address a mask element within one (batch, head) slice with 32-bit offsets
    (row * stride + key * stride); a mask whose slice reaches offset 2^31 is refused."""
    if mask is None:
        dummy = torch.ones(1, dtype=torch.uint8, device=device)
        return dummy, (0, 0, 0, 0), False
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a boolean tensor (True = may attend), got {got}")
    if mask.dim() > 4:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {shape}")
    m = mask[(None,) * (4 - mask.dim())].to(device=device).view(torch.uint8)
    try:
        m = m.expand(shape)
    except RuntimeError as err:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {shape}") from err
    _check_offsets(m, mask, "mask", "use causal=True or a broadcast mask (e.g. key padding (B, 1, 1, Tk))")
    return m, tuple(m.stride()), True


def _check_offsets(x: Tensor, given: Tensor, what: str, remedy: str) -> None:
    """Refuse an expanded (B, H, Tq, Tk) ``x`` whose largest element offset within one (batch, head) reaches
    2^31: the kernels address it with 32-bit offsets (row * stride + key * stride)."""
    Tq, Tk = x.shape[2], x.shape[3]
    last = (Tq - 1) * x.stride(2) + (Tk - 1) * x.stride(3)  # largest element offset in one (batch, head)
    if last >= 2**31:
        raise ValueError(
            f"{what} of shape {tuple(given.shape)} with strides {tuple(given.stride())}: its largest element "
            f"offset within one (batch, head), {last}, reaches 2^31, beyond the kernels' 32-bit {what} "
            f"offsets; {remedy} instead of a full (Tq, Tk) one"
        )


def _bias_arg(bias: Tensor | None, shape: tuple[int, int, int, int], device) -> tuple[Tensor, tuple]:
    """The score bias as the kernels read it: fp32, bf16 or fp16 (float64 rounded to fp32), expanded (stride
    0 on broadcast dims) to (B, H, Tq, Tk), detached; a 1-element dummy when absent."""
    if bias is None:
        return torch.zeros(1, dtype=torch.float32, device=device), (0, 0, 0, 0)
    b = bias.detach()
    if b.dtype not in SUPPORTED_DTYPES:
        b = b.float()
    b = b[(None,) * (4 - b.dim())].expand(shape)
    _check_offsets(b, bias, "bias", "use a broadcast bias (e.g. (1, H, Tq, Tk) or (Tq, Tk))")
    return b, tuple(b.stride())


@dataclass
class Launch:
    """One kernel launch, ``kernel[grid](*args, **meta)``, built apart from the launch itself so that
    ``benchmarks/kernel_resources.py`` compiles exactly what the autograd function launches (on meta
    tensors)."""

    kernel: object
    grid: object
    args: tuple
    meta: dict

    def __post_init__(self) -> None:
        # FMA contraction (a*b + c as one rounding) stated, not left to Triton's default: the kernels' tests
        # and instruction counts assume it, and Triton 3.9 warns that 3.10 turns its default off
        self.meta = {"enable_fp_fusion": True, **self.meta}

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)


class Saved(NamedTuple):
    """What the forward leaves for the backward, in ``save_for_backward`` order: the inputs (k and v with
    their own H_kv heads), the fp32 attention sinks and the expanded score bias (1-element placeholders
    without them), O, O^L (O itself
    unless Prob-STE), the row statistics M, m, W, W^at and the int32 arg-max / arg-min key of each row (Tk:
    the sink)."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor
    sinks: Tensor
    bias: Tensor
    o: Tensor
    oL: Tensor
    M: Tensor
    m: Tensor
    W: Tensor
    W_at: Tensor
    amax: Tensor
    amin: Tensor


def _sinks_arg(sinks: Tensor | None, device) -> tuple[Tensor, bool]:
    """The attention sinks as the kernels read them: fp32, contiguous, one per q head; a 1-element dummy
    when absent."""
    if sinks is None:
        return torch.zeros(1, dtype=torch.float32, device=device), False
    return sinks.detach().to(device=device, dtype=torch.float32).contiguous(), True


def forward_launch(
    q, k, v, mask, spec, causal, scale, precision, save=True, sinks=None, softcap=None, bias=None,
    bias_grad=False,
) -> tuple[Launch, Saved, dict]:  # fmt: skip
    """The forward launch, the tensors the backward needs and the launch's constants; outputs allocated.
    ``save=False`` (inference: no backward follows) stores O only: Prob-STE skips the P^L V dot of O^L
    (sm_90a, D = 64, strict arithmetic: 30 instead of 38 instructions per score at bf16, 184 instead of 262
    at fp32 "ieee"), and where pass 2 reads no arg keys (strict Weight-STE, the exp baselines) pass 1 skips
    them, which only the backward reads (bf16: minmax-weight-k4 6.4 instead of 11.1, fwm-weight-k4 5.1
    instead of 7.5). O^L and the per-row statistics get 1-element placeholders that the kernel never writes.
    LERP and historical Weight-STE, which have neither to skip, launch their training forward (without the
    statistics' stores alone ptxas scheduled one minmax-weight-k4 loop 15% longer). ``bias_grad``: the
    score bias needs a gradient (MASKING[4] = 2: the dQ kernel writes dL/ds)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    group = H // k.shape[1]  # q heads per k/v head (grouped-query attention; 1 without it)
    flags, kf, tau = operator_constants(spec)
    # LERP and historical Weight-STE: pass 2 reads the arg keys (grid's pins for w^L) and there is no O^L
    save = save or (flags["FORWARD_PINS"] and not flags["JACOBIAN_AT_PL"])
    mask_t, mstr, has_mask = _mask_arg(mask, (B, H, Tq, Tk), q.device)
    sinks_t, has_sinks = _sinks_arg(sinks, q.device)
    bias_t, bstr = _bias_arg(bias, (B, H, Tq, Tk), q.device)
    bias_mode = 0 if bias is None else 2 if bias_grad else 1
    dev, f32 = q.device, torch.float32
    o = _alloc((B, H, Tq, D), q.dtype, dev)
    rows = (B, H, Tq) if save else (1,)
    oL = _alloc((B, H, Tq, D) if save else (1,), f32, dev) if flags["JACOBIAN_AT_PL"] else o
    M, m, Wf, Wa = (_alloc(rows, f32, dev) for _ in range(4))
    amax, amin = (_alloc(rows, torch.int32, dev) for _ in range(2))
    meta = dict(
        **group_flags(flags),
        MASKING=(bool(causal), has_mask, has_sinks, softcap is not None, bias_mode),
        PREC=precision,
        SPLIT=split_loops("fwd", q.element_size(), _block_d(D), has_mask),
        SAVE=bool(save),
        BLOCK_D=_block_d(D),
    )

    def grid(meta_):
        return (triton.cdiv(Tq, meta_["BLOCK_M"]), B * H)

    # grouped as the kernels unpack them: inputs, outputs, strides (q, k, v, mask, bias), shape, scalars
    common = dict(
        strides=(q.stride(), k.stride(), v.stride(), mstr, bstr),
        shape=(H, Tq, Tk, D, group),
        consts=(scale, kf, tau, 1.0 if softcap is None else float(softcap)),
    )
    outs = (o, oL, M, m, Wf, Wa, amax, amin)
    args = (q, (k, v, mask_t, sinks_t, bias_t), outs, *common.values())
    saved = Saved(q, k, v, mask_t, sinks_t, bias_t, *outs)
    return Launch(_fwd_kernel, grid, args, meta), saved, dict(meta=meta, flags=flags, common=common)


def _per_q_head(x: Tensor, H: int, dtype: torch.dtype) -> Tensor:
    """A (B, H, Tk, D) buffer for the gradient of k or v (x, with H_kv heads), written per q head: fp32 under
    grouped-query attention (H_kv < H), whose G copies :func:`fold_groups` sums, else x's dtype."""
    B, H_kv, Tk, D = x.shape
    return _alloc((B, H, Tk, D), torch.float32 if H_kv < H else dtype, x.device)


def fold_groups(grad: Tensor, like: Tensor) -> Tensor:
    """The gradient of k or v (``like``, H_kv heads) from its per-q-head buffer (H heads): each k/v head's
    G = H / H_kv copies summed in fp32, rounded once to ``like``'s dtype (for H_kv = H the buffer itself)."""
    B, H_kv, Tk, D = like.shape
    if grad.shape[1] == H_kv:
        return grad.to(like.dtype)
    return grad.view(B, H_kv, -1, Tk, D).sum(2).to(like.dtype)


def backward_launches(do, saved: Saved, ctx) -> tuple[Launch, Launch, tuple]:
    """The dQ and dK/dV launches for upstream gradient ``do``, and their outputs (dq, dk, dv, ds_sink, ds,
    mu); dk and dv per q head (H heads: :func:`fold_groups` gives k's and v's); ds_sink (B, H, Tq) holds each
    row's dL/ds of its attention sink (a 1-element placeholder without sinks); ds (B, H, Tq, Tk), fp32, dL/ds
    of every score when the score bias needs a gradient (MASKING[4] = 2; else a 1-element placeholder),
    without the P1 control's projection, which :func:`bias_grad` applies with its row means mu (B, H, Tq)."""
    q, k, v, mask_t, sinks_t, bias_t, o, oL, M, m, Wf, Wa, amax, amin = saved
    meta = {n: x for n, x in ctx["meta"].items() if n != "SAVE"}  # the forward's only
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    # D_i = dO_i . O_i at the Jacobian point: O (softmax, LERP, Weight-STE: P = P^N), O^L (Prob-STE)
    o_at = oL if ctx["flags"]["JACOBIAN_AT_PL"] else o
    delta = (do.float() * o_at.float()).sum(-1)
    dev = q.device
    GM, Gm, mu = (_alloc((B, H, Tq), torch.float32, dev) for _ in range(3))
    rowc = _alloc((B * H * Tq, ROW_CONSTS.value), torch.float32, dev)  # the dQ kernel writes, dK/dV reads
    dq = _alloc((B, H, Tq, D), q.dtype, dev)
    dk, dv = _per_q_head(k, H, k.dtype), _per_q_head(v, H, v.dtype)
    ds_sink = _alloc((B, H, Tq) if meta["MASKING"][2] else (1,), torch.float32, dev)
    # zeros: the dQ kernel writes the keys of its causal range only
    ds = torch.zeros((B, H, Tq, Tk) if meta["MASKING"][4] == 2 else (1,), dtype=torch.float32, device=dev)
    size, has_mask = q.element_size(), meta["MASKING"][1]
    split = {kind: split_loops(kind, size, meta["BLOCK_D"], has_mask) for kind in ("dq", "dkdv")}

    def grid_q(meta_):
        return (triton.cdiv(Tq, meta_["BLOCK_M"]), B * H)

    def grid_k(meta_):
        return (triton.cdiv(Tk, meta_["BLOCK_N"]), B * H)

    ins = (k, v, mask_t, do)
    common = tuple(ctx["common"].values())
    dq_args = (
        q,
        (*ins, sinks_t, bias_t),
        (M, m, Wf, Wa, delta, amax, amin),
        (dq, GM, Gm, mu, ds_sink, ds, rowc),
        *common,
    )
    dkdv_args = (q, (*ins, bias_t), (M, m, Wf, Wa, delta, amax, amin, GM, Gm, mu, rowc), (dk, dv), *common)
    return (
        Launch(_bwd_dq_kernel, grid_q, dq_args, {**meta, "SPLIT": split["dq"]}),
        Launch(_bwd_dkdv_kernel, grid_k, dkdv_args, {**meta, "SPLIT": split["dkdv"]}),
        (dq, dk, dv, ds_sink, ds, mu),
    )


def bias_grad(ds: Tensor, mu: Tensor, saved: Saved, ctx, shape, dtype) -> Tensor:
    """The score bias's gradient dL/dbias = dL/ds from the dQ kernel's ``ds`` (B, H, Tq, Tk): the P1
    control's projection (its row mean ``mu`` off every valid key, App. B) applied here, then summed over
    the bias's broadcast dims (``sum_to_size``), in its dtype."""
    if ctx["flags"]["PROJECT_P1"]:
        B, H, Tq, Tk = ds.shape
        valid = saved.mask.bool() if ctx["meta"]["MASKING"][1] else torch.ones((), dtype=torch.bool)
        valid = valid.to(ds.device)
        if ctx["meta"]["MASKING"][0]:  # the last query on the last key
            valid = valid & torch.ones(Tq, Tk, dtype=torch.bool, device=ds.device).tril(Tk - Tq)
        ds = ds - mu[..., None] * valid
    return ds.sum_to_size(shape).to(dtype)


def backward_mode(flags: dict, has_sinks: bool = False, has_bias: bool = False) -> str:
    """The backward a launch runs: "split" (a dQ kernel, then a dK/dV kernel; bitwise reproducible) or
    "fused" (one kernel, dQ added atomically; ``fused_backward``). KINTERVAL_TRITON_BWD=fused opts in, read at
    each backward; the P1 control (its projection needs a second pass over the rows), attention sinks (their
    gradient is a row sum of the dQ kernel), a score bias (the dQ kernel writes its gradient) and
    ``torch.use_deterministic_algorithms(True)`` keep the split backward."""
    mode = os.environ.get("KINTERVAL_TRITON_BWD", "split")
    if mode not in ("split", "fused"):
        raise ValueError(f"KINTERVAL_TRITON_BWD must be 'split' or 'fused', got {mode!r}")
    keep = flags["PROJECT_P1"] or has_sinks or has_bias
    if mode == "fused" and (keep or torch.are_deterministic_algorithms_enabled()):
        return "split"
    return mode


ROW_CONSTS_BLOCK = 1024  # rows per program of the fused backward's row-constants launch


def fused_backward(do, saved: Saved, ctx) -> tuple[tuple[Launch, Launch], object]:
    """The fused backward's launches for upstream gradient ``do``: the per-row constants
    (``_row_constants_kernel``: there is no dQ kernel to store them), then the fused kernel; and
    ``finish()``, which adds the calibration
    terms of eq. (2) once the kernel's row sums are complete and returns (dq, dk, dv): G_M and G_m (FWM and
    resolved: G_M = -S1, no m term), the row sums of gamma_j times dw_j/dM (eq. 1), land on the row's
    arg-max / arg-min key, dq_i += G k_{argmax_i} and dk_{argmax_i} += G q_i, as the split kernels' rank-1
    terms."""
    q, k, v, mask_t, sinks_t, bias_t, o, oL, M, m, Wf, Wa, amax, amin = saved
    if ctx["meta"]["MASKING"][2] or ctx["meta"]["MASKING"][4]:
        raise ValueError(
            "the fused backward takes no attention sinks and no score bias (backward_mode keeps the split "
            "backward)"
        )
    meta = {n: x for n, x in ctx["meta"].items() if n != "SAVE"}
    flags = ctx["flags"]
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    o_at = oL if flags["JACOBIAN_AT_PL"] else o
    delta = (do.float() * o_at.float()).sum(-1)
    dev, f32 = q.device, torch.float32
    terms = flags["KEEP_MAX_TERM"] or flags["KEEP_MIN_TERM"]
    dq_acc = torch.zeros((B, H, Tq, D), dtype=f32, device=dev)  # atomic accumulators start at 0
    S1, GM = (torch.zeros((B, H, Tq), dtype=f32, device=dev) for _ in range(2))
    dk, dv = _per_q_head(k, H, f32 if terms else k.dtype), _per_q_head(v, H, v.dtype)  # per q head
    split = split_loops("fused", q.element_size(), meta["BLOCK_D"], meta["MASKING"][1])

    def grid(meta_):
        return (triton.cdiv(Tk, meta_["BLOCK_N"]), B * H)

    scale, kf, tau, cap = ctx["common"]["consts"]
    rowc = _alloc((B * H * Tq, ROW_CONSTS.value), f32, dev)
    rows = B * H * Tq
    prep = Launch(
        _row_constants_kernel,
        (triton.cdiv(rows, ROW_CONSTS_BLOCK),),
        (M, m, Wf, Wa, rowc, rows, kf, tau),
        {"OP": meta["OP"], "BLOCK": ROW_CONSTS_BLOCK},
    )
    stats = (M, m, Wf, Wa, delta, amax, amin, dq_acc, S1, GM, rowc)
    args = (q, (k, v, mask_t, do, bias_t), stats, (dk, dv), *ctx["common"].values())
    launch = Launch(_bwd_fused_kernel, grid, args, {**meta, "SPLIT": split})

    def finish():
        dq, dk_q = dq_acc, dk  # dk per q head
        if terms:
            if flags["CALIB"] == 1:  # MinMax: dw/dM + dw/dm = -Delta
                g_max, g_min = GM, -S1 - GM
            else:
                g_max, g_min = -S1, None
            H_kv = k.shape[1]
            for keep, G, idx, at_s in (("KEEP_MAX_TERM", g_max, amax, M), ("KEEP_MIN_TERM", g_min, amin, m)):
                if not flags[keep]:
                    continue
                if ctx["meta"]["MASKING"][
                    3
                ]:  # the softcap's chain factor 1 - th^2 at the arg key: th = s / c
                    G = G * (1.0 - (at_s / cap) ** 2)
                at = idx.long().clamp_min(0)[..., None].expand(B, H, Tq, D)
                # the rows of a group's q heads, side by side, gather from their k/v head (no repeated k)
                k_at = k.float().gather(2, at.reshape(B, H_kv, -1, D)).view(B, H, Tq, D)
                dq = dq + G[..., None] * k_at
                dk_q = dk_q.scatter_add(2, at, (G * scale)[..., None] * q.float())
        return (dq * scale).to(q.dtype), fold_groups(dk_q, k), fold_groups(dv, v)

    return (prep, launch), finish


class _TritonKIntervalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, sinks, spec, causal, scale, precision, softcap, bias):
        wants = bias is not None and bias.requires_grad
        launch, saved, consts = forward_launch(
            q, k, v, mask, spec, causal, scale, precision, sinks=sinks, softcap=softcap, bias=bias,
            bias_grad=wants,
        )  # fmt: skip
        with _on_device(q):
            launch()
        ctx.save_for_backward(*saved)
        ctx.consts = consts
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.bias_like = (bias.shape, bias.dtype) if wants else None
        ctx.has_bias = bias is not None
        return saved.o

    @staticmethod
    @first_order_only("backend 'triton'")  # a second derivative through the kernels raises (first_order.py)
    def backward(ctx, do):
        do, saved = do.contiguous(), Saved(*ctx.saved_tensors)
        has_sinks = ctx.sinks_dtype is not None
        dsinks = dbias = None
        with _on_device(do):
            if backward_mode(ctx.consts["flags"], has_sinks, ctx.has_bias) == "fused":
                launches, finish = fused_backward(do, saved, ctx.consts)
                for launch in launches:
                    launch()
                grads = finish()
            else:
                dq_launch, dkdv_launch, grads = backward_launches(do, saved, ctx.consts)
                dq_launch()
                dkdv_launch()
                dq, dk, dv, ds_sink, ds, mu = grads
                grads = (dq, fold_groups(dk, saved.k), fold_groups(dv, saved.v))
                if has_sinks and ctx.needs_input_grad[4]:  # a sink's gradient: its rows' dL/ds summed
                    dsinks = ds_sink.sum((0, 2)).to(ctx.sinks_dtype)
                if ctx.bias_like is not None and ctx.needs_input_grad[10]:  # dL/dbias = dL/ds
                    dbias = bias_grad(ds, mu, saved, ctx.consts, *ctx.bias_like)
        return (*grads, None, dsinks, None, None, None, None, None, dbias)


def triton_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: OperatorSpec | str,
    *,
    causal: bool = False,
    mask: Tensor | None = None,
    scale: float | None = None,
    precision: str | None = None,
    sinks: Tensor | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``P(q k^T * scale) v`` with the probabilities of ``spec``, fused forward and backward.

    q is (B, H, Tq, D), k (B, H_kv, Tk, D) and v (B, H_kv, Tk, Dv), all float32, bfloat16 or float16 on one
    device (CUDA, or CPU under ``TRITON_INTERPRET=1``). Dv may differ from D, as in SDPA: the narrower of
    (q, k) and v is then padded with zero columns (no score or output changes; the kernels' dot work is
    that of the wider head dim). H_kv < H is grouped-query attention (H a multiple of H_kv): k/v head j
    serves q heads j*G .. (j+1)*G - 1, G = H / H_kv, as ``repeat_interleave``, read in place (no copy); the
    gradients of k and v sum over each group in fp32. ``mask`` is boolean, True where the query may attend,
    broadcastable to (B, H, Tq, Tk) (e.g. a key-padding mask (B, 1, 1, Tk)); ``causal`` aligns the last query
    with the last key (needs Tq <= Tk). ``sinks`` (H,), floating: attention sinks (gpt-oss), one learned
    score per q head that joins every row of its head as a key without a value (``api.with_sinks``: its
    calibration counts it like any key, its probability is dropped; -inf: no sink; NaN or +inf: the head's
    rows are NaN); they get a gradient, the sum of their rows' dL/ds. ``softcap`` c > 0 (Gemma 2; None:
    none): the operator runs on s = c tanh(scale q k^T / c); a row with a non-finite scale q k^T on a key it
    attends is NaN all the same (checked before the softcap). ``bias``: an additive score bias (ALiBi, T5's
    position bias), floating, broadcastable to (B, H, Tq, Tk) with H q's head count: the operator runs on
    s = c tanh(scale q k^T / c) + bias (the softcap first, as transformers' eager attention); a non-finite
    entry on a key the row attends makes the row NaN; it gets a gradient, dL/ds, summed over its broadcast
    dims. The operator maths is float32;
    ``precision`` sets the fp32 dot precision ("tf32", "tf32x3", "bf16x6" or "ieee"; None follows torch's
    TF32 setting, ``tf32_enabled``). The output has q's dtype.

    Conventions (docs/kernels.md): the calibration terms of eq. (2) go to ONE arg-max / arg-min key per
    row, the first index among exact ties (the reference splits it evenly among ties); softmax drops the
    max-channel term -sum_j dS_ij, which is zero in exact arithmetic.
    """
    if isinstance(spec, str):
        spec = OperatorSpec.from_full_name(spec)
    check_causal(causal)
    reason = unsupported_reason(spec)
    if reason is not None:
        raise ValueError(f"triton backend: {reason} (operator {getattr(spec, 'full_name', spec)})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (B, H, T, D), got {getattr(x, 'shape', type(x))}")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"triton backend needs q, k, v in one of {SUPPORTED_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    H, H_kv = q.shape[1], k.shape[1]
    if k.shape[:-1] != v.shape[:-1] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not agree")
    if H != H_kv and (H_kv == 0 or H % H_kv):
        raise ValueError(
            f"q has {H} heads and k, v have {H_kv}: grouped-query attention needs q's head count to be a "
            "multiple of k and v's"
        )
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"triton backend needs CUDA tensors, got {q.device} (CPU runs need TRITON_INTERPRET=1 set "
            "before triton is imported)"
        )
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk, got Tq={Tq}, Tk={Tk}")
    if D == 0:
        raise ValueError(f"q, k, v need a head dimension D >= 1, got q {tuple(q.shape)}")
    softcap = check_softcap(softcap)
    if sinks is not None:
        if not isinstance(sinks, Tensor) or sinks.dtype not in (*SUPPORTED_DTYPES, torch.float64):
            got = sinks.dtype if isinstance(sinks, Tensor) else type(sinks).__name__
            raise ValueError(f"sinks must be a floating tensor, got {got}")
        if sinks.shape != (H,):
            raise ValueError(f"sinks must have shape ({H},), one per q head, got {tuple(sinks.shape)}")
        if sinks.device != q.device:
            raise ValueError(f"sinks must be on q's device {q.device}, got {sinks.device}")
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dtype not in (*SUPPORTED_DTYPES, torch.float64):
            got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must be a floating tensor, got {got}")
        try:
            fits = bias.dim() <= 4 and torch.broadcast_shapes(bias.shape, (B, H, Tq, Tk)) == (B, H, Tq, Tk)
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to {(B, H, Tq, Tk)}")
        if bias.device != q.device:
            raise ValueError(f"bias must be on q's device {q.device}, got {bias.device}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        # the kernels scale the row max of q k^T: the max of the scaled scores for scale > 0 only
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    prec = resolve_precision(q.dtype, precision)
    Dv = v.shape[-1]
    if Dv == D:
        return _attention(q, k, v, mask, sinks, softcap, bias, spec, bool(causal), float(scale), prec)
    # v's own head dim (SDPA allows it): the narrower of (q, k) and v is padded with zero columns to the wider
    # one, which changes no score and no output column; the extra output columns (zeros) are cut off
    width = max(D, Dv)
    if D < width:
        q, k = (torch.nn.functional.pad(x, (0, width - D)) for x in (q, k))
    else:
        v = torch.nn.functional.pad(v, (0, width - Dv))
    out = _attention(q, k, v, mask, sinks, softcap, bias, spec, bool(causal), float(scale), prec)
    return out[..., :Dv].contiguous()


def _attention(q, k, v, mask, sinks, softcap, bias, spec, causal: bool, scale: float, prec: str) -> Tensor:
    """``triton_attention`` on checked inputs with one head dim D (q, k and v)."""
    B, H, Tq, D = q.shape
    H_kv, Tk = k.shape[1], k.shape[2]
    if Tq == 0 or Tk == 0 or B * H == 0:
        # nothing to launch: the reference's result, with its gradients (no key: O = 0, as SDPA; no query or
        # no head: empty). Both products are empty or sum over nothing, so they are exact zeros.
        _mask_arg(mask, (B, H, Tq, Tk), q.device)  # the same mask errors as a launch
        if H != H_kv:
            k, v = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)
        out = torch.matmul(torch.matmul(q, k.transpose(-2, -1)), v)
        if sinks is not None:  # a row of only its sink, which has no value, is 0; NaN for a NaN or +inf sink
            bad = ~torch.isfinite(sinks) & ~torch.isneginf(sinks)
            # the sinks' gradient is 0, as the reference's (a finite product keeps the graph without a NaN)
            zero = torch.where(torch.isfinite(sinks), sinks, 0.0).view(1, H, 1, 1).to(out.dtype) * 0
            out = (out + zero).masked_fill(bad.view(1, H, 1, 1), float("nan"))
        if bias is not None:  # no score, no key: the bias's gradient is 0 (a finite zero keeps the graph)
            out = out + (torch.nan_to_num(bias.float(), 0.0, 0.0, 0.0) * 0).sum().to(out.dtype)
        return out
    inputs = tuple(x for x in (q, k, v, sinks, bias) if x is not None)
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in inputs)):
        # inference: no backward, so the forward skips what only the backward reads (O^L, row statistics)
        launch, saved, _ = forward_launch(
            q, k, v, mask, spec, causal, scale, prec, save=False, sinks=sinks, softcap=softcap, bias=bias
        )
        with _on_device(q):
            launch()
        return saved.o
    return _TritonKIntervalAttention.apply(q, k, v, mask, sinks, spec, causal, scale, prec, softcap, bias)
