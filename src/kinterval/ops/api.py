"""Public entry points: ``attention_probs`` and ``kinterval_attention``.

Input checking and the dtype policy live here; the maths lives in ``reference`` (autograd of the direct
formulas), ``closed_form`` (the paper's explicit backward) and ``triton`` (fused GPU kernels).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake  # no public name: torch.export and FakeTensorMode use it

from kinterval.ops.autocast import matmul_outside_autocast, outside_autocast
from kinterval.ops.backends import BACKENDS, resolve_backend
from kinterval.ops.spec import OperatorSpec, as_spec

PRECISIONS = ("tf32", "tf32x3", "bf16x6", "ieee")
_DOT_PRECISION: ContextVar[str | None] = ContextVar("kinterval_dot_precision", default=None)


@contextlib.contextmanager
def dot_precision(precision: str | None) -> Iterator[None]:
    """Inside the block, ``kinterval_attention(..., precision=None)`` uses ``precision`` ("tf32", "tf32x3",
    "bf16x6", "ieee"; None: follow torch's TF32 setting, ``kinterval.ops.tf32.tf32_enabled``) for the fp32
    dots of the triton backend. Evaluation enters it (``kinterval.model.numerics.eval_precision``) so that the
    model's attention needs no argument; an explicit ``precision`` still wins."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {PRECISIONS} or None")
    token = _DOT_PRECISION.set(precision)
    try:
        yield
    finally:
        _DOT_PRECISION.reset(token)


def working_dtype(dtype: torch.dtype, what: str = "scores") -> torch.dtype:
    """float64 stays float64; float32, bf16 and fp16 are computed in float32; any other dtype of the tensor
    named ``what`` is a ValueError."""
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.float32
    raise ValueError(f"{what} must be a floating tensor (float64/32, bfloat16, float16), got {dtype}")


def check_causal(causal, name: str = "causal") -> bool:
    """``causal`` as a Python bool; it must be a bool or a numpy bool: any other value (e.g. the string "no",
    which is truthy, or the int 1) is a ValueError naming the argument ``name``."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {causal!r}")
    return bool(causal)


def split_mask(mask: Tensor | None, what: str = "mask") -> tuple[Tensor | None, Tensor | None]:
    """(valid, bias) from SDPA's ``attn_mask``: a boolean mask is ``(mask, None)``; a float mask is added to
    the scores, as in SDPA: entries of ``-inf`` (or at most half the dtype's lowest value, e.g. ``finfo.min``)
    mask their key (``valid`` False), every other entry is an additive score bias (ALiBi, T5's position
    bias), 0 where masked. ``bias`` is None when the float mask only masks (every other entry is 0; checking
    that costs one host sync), unless the mask requires a gradient: a zero bias still has one (SDPA's), so
    it stays a bias. Any other dtype is a ValueError."""
    if mask is None or (isinstance(mask, Tensor) and mask.dtype == torch.bool):
        return mask, None
    if not isinstance(mask, Tensor) or not mask.dtype.is_floating_point:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{what} must be boolean or a float mask (0/-inf, or an additive bias), got {got}")
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    bias = torch.where(blocked, 0.0, mask)
    if mask.requires_grad and torch.is_grad_enabled():
        return ~blocked, bias  # a learned bias that is 0 now (e.g. zero-initialised) still gets its gradient
    if mask.device.type == "meta" or (not shapes_only(mask) and not torch.any(bias != 0)):
        bias = None  # (a fake mask keeps its bias: it has no values to look at, and adding 0 is exact)
    return ~blocked, bias


def shapes_only(t: Tensor) -> bool:
    """A tensor with no values to read: on the meta device, fake (``FakeTensorMode``, ``torch.export``), or
    being traced by ``torch.compile`` (which cannot trace ``is_fake``; asked first)."""
    return t.device.type == "meta" or torch.compiler.is_compiling() or is_fake(t)


MASK_LIKE_BIAS = -1e4  # a bias at or below this looks like a mask written as a large negative number


def warn_mask_like_bias(bias: Tensor | None, spec: OperatorSpec, what: str = "attn_mask") -> None:
    """Warn when a K-interval operator gets a bias entry at or below ``MASK_LIKE_BIAS`` (-1e4, -1e9, fp16's
    lowest -65504 in an fp32 mask): such entries are added to the scores, not masked, and the calibration sees
    them (MinMax's m then spans the whole row, and the keys above share the top buckets). Softmax and the
    exponential baselines give such keys ~0 weight, as SDPA does: no warning. One host sync."""
    if bias is None or not spec.is_kinterval or shapes_only(bias) or bias.numel() == 0:
        return
    low = bias.min()
    if low <= MASK_LIKE_BIAS:
        warnings.warn(
            f"{what} holds an additive bias as low as {low.item():.3g}: kinterval masks only entries of -inf "
            f"(or at most half the dtype's lowest value); every other entry is added to the scores, and "
            f"{spec.full_name}'s calibration sees it. To mask keys, use -inf, torch.finfo(dtype).min or a "
            "boolean mask",
            stacklevel=3,
        )


SOFTCAP_MIN = torch.finfo(torch.float32).tiny  # the smallest softcap c: 1/c is finite in float32


def check_softcap(softcap) -> float | None:
    """``softcap`` (Gemma 2's attention logit soft-capping, scores -> c tanh(s / c)) as a float, or None."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not 0 < softcap < math.inf:
        raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")
    if softcap < SOFTCAP_MIN:  # 1/c overflows float32 below it: NaN gradients in the kernels
        raise ValueError(
            f"softcap must be at least {SOFTCAP_MIN:.3g} (float32's smallest normal number; the kernels "
            f"divide by it), got {softcap!r}"
        )
    return float(softcap)


def modified_scores(
    qk: Tensor, valid: Tensor, softcap: float | None, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """(s, bad): the score row s = c tanh(qk / c) + bias (transformers' eager order; either may be None) from
    the scaled products ``qk``, and the (..., Tq, 1) rows with a non-finite ``qk`` on a key of ``valid``,
    which the caller makes NaN (checked before the softcap, which would bound an infinite score into a
    quiet finite row); no host sync."""
    bad = (~torch.isfinite(qk) & valid).any(-1, keepdim=True)
    s = qk if softcap is None else softcap * torch.tanh(qk / softcap)
    if bias is not None:
        s = s + bias.to(device=s.device, dtype=s.dtype)
    return s, bad


def score_mods_in(bias, softcap, sinks) -> tuple[str, ...]:
    """The names (``backends.SCORE_MODS``) of the score modifications a call has, for ``resolve_backend``."""
    return tuple(n for n, x in (("bias", bias), ("softcap", softcap), ("sinks", sinks)) if x is not None)


def with_sinks(s: Tensor, valid: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """The score rows with one more key, the attention sink (gpt-oss's learned per-head logit, which has no
    value): ``sinks`` broadcast to (..., Tq, 1) is appended to ``s`` (..., Tq, Tk) and attended unless it is
    ``-inf``. The operator then runs on the longer row, the sink takes part in its calibration like any key,
    and the caller drops the sink's column of P."""
    sink = sinks.to(s.dtype).expand(*s.shape[:-1], 1)
    return torch.cat([s, sink], -1), torch.cat([valid.expand(s.shape), ~torch.isneginf(sink)], -1)


def _check_mask_shape(mask: Tensor, scores_shape) -> None:
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != torch.Size(scores_shape):  # also a mask of higher rank than the scores
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {tuple(scores_shape)}")


def valid_mask(scores_shape: torch.Size, device, *, causal: bool, mask: Tensor | None) -> Tensor:
    """Boolean mask, True where the query may attend, broadcast to ``scores_shape`` (..., Tq, Tk).

    ``causal`` aligns the last query with the last key: key j is visible to query i iff j <= i + Tk - Tq.
    """
    causal = check_causal(causal)
    Tq, Tk = scores_shape[-2], scores_shape[-1]
    valid = torch.ones((), dtype=torch.bool, device=device)
    if causal:
        if Tq > Tk:
            raise ValueError(f"causal attention needs Tq <= Tk, got Tq={Tq}, Tk={Tk}")
        i = torch.arange(Tq, device=device).unsqueeze(-1)
        j = torch.arange(Tk, device=device)
        valid = j <= i + (Tk - Tq)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"mask must be a boolean tensor (True = may attend), got {got}")
        _check_mask_shape(mask, scores_shape)
        valid = valid & mask.to(device)
    return valid.expand(scores_shape)


def check_scores(scores: Tensor) -> None:
    if not isinstance(scores, Tensor):
        raise ValueError(f"scores must be a tensor, got {type(scores).__name__}")
    if scores.dim() < 2:
        raise ValueError(f"scores must have shape (..., Tq, Tk), got {tuple(scores.shape)}")
    working_dtype(scores.dtype)


def attention_probs(
    scores: Tensor,
    spec: OperatorSpec | str,
    *,
    causal: bool = False,
    mask: Tensor | None = None,
    backend: str = "reference",
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention probabilities P of ``spec`` over the last dimension of ``scores`` (..., Tq, Tk).

    float64 is computed in float64; float32, bf16 and fp16 in float32 (the result is float32). Keys with score
    is ``-inf`` count as masked. NaN or ``+inf`` scores on keys that are not masked raise ``ValueError``
    (masked keys are never read, as in :func:`kinterval_attention`). ``sinks`` are attention sinks
    (:func:`with_sinks`): one more key per row, without a value, whose column is dropped from the result (its
    rows then sum to 1 minus the sink's probability); of shape (H,), one per head (the dim before Tq, Tk),
    as :func:`kinterval_attention` takes them, or broadcastable to (..., Tq, 1). Like every entry point to
    the operators, it runs outside autocast (App. A).
    """
    with outside_autocast(scores.device.type):  # the operator runs outside autocast
        return _attention_probs(scores, as_spec(spec), causal, mask, backend, sinks)


def _attention_probs(scores, spec, causal, mask, backend, sinks) -> Tensor:
    check_scores(scores)
    s = scores.to(working_dtype(scores.dtype))
    valid = attended_keys(s, causal=causal, mask=mask)
    if sinks is not None:
        if not isinstance(sinks, Tensor) or not sinks.dtype.is_floating_point:
            raise ValueError(f"sinks must be a floating tensor, got {getattr(sinks, 'dtype', type(sinks))}")
        if sinks.dim() == 1 and s.dim() >= 3 and len(sinks) == s.shape[-3] > 1:
            sinks = sinks.view(-1, 1, 1)  # one per head
        try:
            fits = torch.broadcast_shapes(sinks.shape, (*s.shape[:-1], 1)) == (*s.shape[:-1], 1)
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"sinks of shape {tuple(sinks.shape)} do not broadcast to {(*s.shape[:-1], 1)}")
        s, valid = with_sinks(s, valid, sinks)
        if not s.is_meta and (torch.isnan(s[..., -1:]) | torch.isposinf(s[..., -1:])).any():
            raise ValueError("sinks contain NaN or +inf")
    if not s.is_meta and span_overflows(s.detach(), valid, spec).any():
        remedy = "pass float64 scores" if s.dtype != torch.float64 else "scale the scores down"
        raise ValueError(
            f"a row's scores span more than {s.dtype} holds (max - min overflows) on keys that are not "
            f"masked; {spec.full_name} cannot place them on its grid: {remedy}"
        )
    P = _probs(s, valid, spec, backend)
    return P if sinks is None else P[..., :-1]


def attended_keys(s: Tensor, *, causal: bool, mask: Tensor | None) -> Tensor:
    """The keys each row attends: the mask's, minus keys whose score is ``-inf``; a NaN or ``+inf`` score on
    a key that is not masked raises ``ValueError``."""
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    if not s.is_meta and ((torch.isnan(s) | torch.isposinf(s)) & valid).any():  # meta: shapes only
        raise ValueError("scores contain NaN or +inf on keys that are not masked")
    return valid & ~torch.isneginf(s)


def span_overflows(s: Tensor, valid: Tensor, spec: OperatorSpec) -> Tensor:
    """(..., 1) bool: rows whose valid finite scores span more than ``s.dtype`` holds (M - m overflows, e.g.
    3e38 and -3e38 in float32). MinMax divides that span and resolved forms s - M on every key: such a row
    would come out as zeros. Softmax, the baselines and FWM (which clips z) compute it: all False there."""
    if not spec.is_kinterval or spec.calibration == "fwm" or s.shape[-1] == 0:
        return torch.zeros((*s.shape[:-1], 1), dtype=torch.bool, device=s.device)
    finite = valid & torch.isfinite(s)
    M = s.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True)
    m = s.masked_fill(~finite, float("inf")).amin(-1, keepdim=True)
    return finite.any(-1, keepdim=True) & torch.isinf(M - m)


def _probs(s: Tensor, valid: Tensor, spec: OperatorSpec, backend: str) -> Tensor:
    if backend == "reference":
        from kinterval.ops.reference import reference_probs

        return reference_probs(s, valid, spec)
    if backend == "closed_form":
        from kinterval.ops.closed_form import closed_form_probs

        return closed_form_probs(s, valid, spec)
    raise ValueError(f"backend {backend!r} is not a probability backend; use 'reference' or 'closed_form'")


def kinterval_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: OperatorSpec | str,
    *,
    causal: bool = False,
    mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    precision: str | None = None,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention ``P(q k^T * scale) v`` with the probabilities of ``spec``; a drop-in for
    ``F.scaled_dot_product_attention(q, k, v, attn_mask=, dropout_p=, is_causal=, scale=, enable_gqa=)``,
    whose keyword names it also takes.

    q is (B, H, Tq, D); k is (B, H, Tk, D) and v (B, H, Tk, Dv): Dv may differ from D, as in SDPA (the triton
    kernels pad the narrower head dim with zero columns). ``enable_gqa=True`` (SDPA's grouped-query
    attention): k and v may have H_kv heads, H a multiple of H_kv, k/v head j serving q heads
    j*H/H_kv .. (j+1)*H/H_kv - 1 (as ``repeat_interleave``: the triton kernels read each k/v head in place
    for its q heads, the other backends repeat them; the gradients sum back onto the H_kv heads); without
    it, a head count that differs from q's is a ``ValueError``. ``mask`` (alias ``attn_mask``, SDPA's name;
    not both) is boolean, True where the query may attend, or a float mask added to the scores, as SDPA's:
    ``-inf`` (or ``finfo.min``) = masked, any other value an additive score bias (ALiBi, T5's position bias;
    checking a float mask costs one host sync); broadcastable to (B, H, Tq, Tk).
    ``causal=True`` aligns the last query with the last key (bottom-right, as FlashAttention);
    ``is_causal=True`` is SDPA's (top-left: query i sees keys j <= i); they agree when Tq = Tk; not both.
    Both may be combined with a mask. The default scale is 1/sqrt(D) (q's D, also when Dv differs).
    The operator runs on the score row s = c tanh(scale q k^T / c) + bias: ``softcap`` c > 0 (Gemma 2;
    None: none) and the float mask's bias, as transformers' eager attention orders them. ``sinks`` (H,) are
    attention sinks (gpt-oss): one learned logit per q head, appended to every row as a key without a value;
    the operator's calibration sees it like any key, and its probability is dropped (:func:`with_sinks`).
    The bias, the softcap and the sinks run on every backend, and the bias gets a gradient when the float
    mask requires one.
    ``dropout_p`` in [0, 1] is dropout on the probabilities P before P v, as SDPA (applied whenever it is
    nonzero: pass ``dropout_p=p if training else 0.0``); the backward sees the dropped P. It needs P
    explicitly: "auto" then takes closed_form, and backend="triton" raises ``ValueError``.
    Bools may be numpy bools and numbers numpy scalars. The operator maths runs in float32
    (float64 for float64 inputs); the output has q's dtype. The reference and closed_form backends also form
    q k^T and P v in float32; the triton backend multiplies bf16/fp16 inputs as they are (16-bit dots with
    fp32 accumulation, P rounded to the input dtype before P v, as flash attention does).
    ``backend``: "reference", "closed_form", "triton" or "auto"
    (:func:`~kinterval.ops.backends.resolve_backend`: the preferred backend that supports the spec on q's
    device and dtype; an explicit backend that cannot run it raises ``ValueError``). ``precision`` ("tf32",
    "tf32x3", "bf16x6" or "ieee") selects the fp32 dot precision of the triton backend (None: the enclosing
    :func:`dot_precision`, else torch's TF32 setting: ``tf32_enabled``); the others follow
    ``torch.backends`` settings. A query row with a non-finite score (NaN or ±inf, from non-finite q or k) on
    a key it may attend is NaN in the output, never a quiet zero row; ``scale`` must be finite. Meta (and
    fake) tensors propagate shapes through the reference and closed_form backends.
    """
    spec = as_spec(spec)
    causal = check_causal(causal)
    is_causal = check_causal(is_causal, "is_causal")
    enable_gqa = check_causal(enable_gqa, "enable_gqa")
    if causal and is_causal:
        raise ValueError("pass causal=True (bottom-right) or is_causal=True (SDPA's top-left), not both")
    if attn_mask is not None:
        if mask is not None:
            raise ValueError("pass mask or attn_mask (the same argument, SDPA's name), not both")
        mask = attn_mask
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {PRECISIONS}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0 <= dropout_p <= 1:
        raise ValueError(f"dropout_p must be a number in [0, 1], got {dropout_p!r}")
    dropout_p = float(dropout_p)
    if dropout_p and backend == "triton":
        raise ValueError(
            "dropout_p > 0 needs the probabilities P explicitly, which the fused triton kernels never form: "
            "use backend 'closed_form', 'reference' or 'auto', or dropout_p=0"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (B, H, T, D), got {getattr(x, 'shape', type(x))}")
        working_dtype(x.dtype, name)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree in (B, H, Tk), got {tuple(k.shape)} and {tuple(v.shape)}")
    H, H_kv = q.shape[1], k.shape[1]
    if H != H_kv and not enable_gqa:
        raise ValueError(
            f"q has {H} heads and k, v have {H_kv}: pass enable_gqa=True for grouped-query attention "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    if H != H_kv and (H_kv == 0 or H % H_kv):
        raise ValueError(f"enable_gqa needs q's head count {H} to be a multiple of k and v's {H_kv}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in B and D")
    if q.shape[-1] == 0:
        raise ValueError(f"q, k, v need a head dimension D >= 1, got q {tuple(q.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    scale = float(scale)
    if isinstance(mask, Tensor) and mask.is_meta and not q.is_meta:  # a meta mask has no values to copy
        what = "attn_mask" if attn_mask is not None else "mask"
        raise ValueError(f"{what} is on {mask.device} and q on {q.device}: give both on one device")
    mask, bias = split_mask(mask, "attn_mask" if attn_mask is not None else "mask")
    warn_mask_like_bias(bias, spec, "attn_mask" if attn_mask is not None else "mask")
    softcap = check_softcap(softcap)
    if sinks is not None:
        if not isinstance(sinks, Tensor) or not sinks.dtype.is_floating_point or sinks.shape != (H,):
            got = f"{sinks.dtype} {tuple(sinks.shape)}" if isinstance(sinks, Tensor) else type(sinks).__name__
            raise ValueError(
                f"sinks must be a floating tensor of shape ({H},), one logit per q head, got {got}"
            )
        working_dtype(sinks.dtype, "sinks")
    Tq, Tk = q.shape[2], k.shape[2]
    if is_causal and Tq == Tk:
        causal = True
    elif is_causal:  # SDPA's top-left alignment as an explicit mask
        if mask is not None:
            _check_mask_shape(mask, (*q.shape[:2], Tq, Tk))
        top_left = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
        mask = top_left if mask is None else mask.to(q.device) & top_left

    mods = score_mods_in(bias, softcap, sinks)
    backend = resolve_backend(spec, q.device, q.dtype, backend=backend, probs=dropout_p > 0, score_mod=mods)
    if backend == "triton":  # reads each k/v head in place for its q heads
        from kinterval.ops.triton import triton_attention

        if precision is None:
            precision = _DOT_PRECISION.get()
        return triton_attention(
            q,
            k,
            v,
            spec,
            causal=causal,
            mask=mask,
            scale=scale,
            precision=precision,
            **({} if sinks is None else {"sinks": sinks.to(q.device)}),
            **({} if softcap is None else {"softcap": softcap}),
            **({} if bias is None else {"bias": bias.to(q.device)}),
        )
    if H != H_kv:
        k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)

    wd = working_dtype(q.dtype)
    with outside_autocast(q.device.type):  # the operator runs outside autocast
        # matmuls whose backward runs outside autocast too: .backward() may be called inside autocast
        qk = matmul_outside_autocast(q.to(wd), k.to(wd).transpose(-2, -1)) * scale
        valid = valid_mask(qk.shape, qk.device, causal=causal, mask=mask)
        # a row with a non-finite q k^T (from non-finite q or k) on an attended key is NaN, never a quiet row
        scores, bad = modified_scores(qk, valid, softcap, bias)
        if sinks is not None:
            scores, valid = with_sinks(scores, valid, sinks.to(scores.device).view(1, H, 1, 1))
        P = _probs(scores, valid, spec, backend)
        if sinks is not None:
            P = P[..., :-1]
        if dropout_p:
            P = torch.nn.functional.dropout(P, p=dropout_p)
        out = matmul_outside_autocast(P, v.to(wd))
        # So is a row with a non-finite bias or sink, or whose scores span more than the working dtype holds
        # (MinMax, resolved).
        bad = bad | (~torch.isfinite(scores) & valid).any(-1, keepdim=True)
        bad = bad | span_overflows(scores.detach(), valid, spec)
        out = out.masked_fill(bad, float("nan"))
    return out.to(q.dtype)
