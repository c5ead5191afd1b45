"""Public entry points: ``attention_probs`` and ``kinterval_attention``.

Input checking and the dtype policy live here; the maths lives in ``reference`` (autograd of the direct
formulas), ``closed_form`` (the paper's explicit backward) and ``triton`` (fused GPU kernels).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

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


def check_causal(causal) -> None:
    """``causal`` must be a bool: any other value (e.g. the string "no", which is truthy) is a ValueError."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")


def valid_mask(scores_shape: torch.Size, device, *, causal: bool, mask: Tensor | None) -> Tensor:
    """Boolean mask, True where the query may attend, broadcast to ``scores_shape`` (..., Tq, Tk).

    ``causal`` aligns the last query with the last key: key j is visible to query i iff j <= i + Tk - Tq.
    """
    check_causal(causal)
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
        try:
            shape = torch.broadcast_shapes(mask.shape, scores_shape)
        except RuntimeError:
            shape = None
        if shape != torch.Size(scores_shape):  # also a mask of higher rank than the scores
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {tuple(scores_shape)}")
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
) -> Tensor:
    """Attention probabilities P of ``spec`` over the last dimension of ``scores`` (..., Tq, Tk).

    float64 is computed in float64; float32, bf16 and fp16 in float32 (the result is float32). Keys with score
    is ``-inf`` count as masked. NaN or ``+inf`` scores on keys that are not masked raise ``ValueError``
    (masked keys are never read, as in :func:`kinterval_attention`).
    """
    spec = as_spec(spec)
    check_scores(scores)
    s = scores.to(working_dtype(scores.dtype))
    valid = attended_keys(s, causal=causal, mask=mask)
    if span_overflows(s.detach(), valid, spec).any():
        remedy = "pass float64 scores" if s.dtype != torch.float64 else "scale the scores down"
        raise ValueError(
            f"a row's scores span more than {s.dtype} holds (max - min overflows) on keys that are not "
            f"masked; {spec.full_name} cannot place them on its grid: {remedy}"
        )
    return _probs(s, valid, spec, backend)


def attended_keys(s: Tensor, *, causal: bool, mask: Tensor | None) -> Tensor:
    """The keys each row attends: the mask's, minus keys whose score is ``-inf``; a NaN or ``+inf`` score on
    a key that is not masked raises ``ValueError``."""
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    if ((torch.isnan(s) | torch.isposinf(s)) & valid).any():
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
) -> Tensor:
    """Attention ``P(q k^T * scale) v`` with the probabilities of ``spec``; mirrors SDPA's signature.

    q is (B, H, Tq, D); k is (B, H, Tk, D) and v (B, H, Tk, Dv): Dv may differ from D, as in SDPA (the triton
    kernels need Dv = D; "auto" then takes closed_form). ``mask`` is boolean, True where the query may attend,
    broadcastable to (B, H, Tq, Tk). The default scale is 1/sqrt(D). The operator maths runs in float32
    (float64 for float64 inputs); the output has q's dtype. The reference and closed_form backends also form
    q k^T and P v in float32; the triton backend multiplies bf16/fp16 inputs as they are (16-bit dots with
    fp32 accumulation, P rounded to the input dtype before P v, as flash attention does).
    ``backend``: "reference", "closed_form", "triton" or "auto"
    (:func:`~kinterval.ops.backends.resolve_backend`: the fastest backend that supports the spec on q's device
    and dtype; an explicit backend that cannot run it raises ``ValueError``). ``precision`` ("tf32",
    "tf32x3", "bf16x6" or "ieee") selects the fp32 dot precision of the triton backend (None: the enclosing
    :func:`dot_precision`, else torch's TF32 setting: ``tf32_enabled``); the others follow
    ``torch.backends`` settings. A query row with a non-finite score (NaN or ±inf, from non-finite q or k) on
    a key it may attend is NaN in the output, never a quiet zero row; ``scale`` must be finite.
    """
    spec = as_spec(spec)
    check_causal(causal)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {PRECISIONS}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (B, H, T, D), got {getattr(x, 'shape', type(x))}")
        working_dtype(x.dtype, name)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree in (B, H, Tk), got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in B, H and D")
    if q.shape[-1] == 0:
        raise ValueError(f"q, k, v need a head dimension D >= 1, got q {tuple(q.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")

    differs = v.shape[-1] != q.shape[-1]  # Dv != D: not in the fused kernels
    backend = resolve_backend(spec, q.device, q.dtype, backend=backend, value_dim_differs=differs)
    if backend == "triton":
        from kinterval.ops.triton import triton_attention

        if precision is None:
            precision = _DOT_PRECISION.get()
        return triton_attention(q, k, v, spec, causal=causal, mask=mask, scale=scale, precision=precision)

    wd = working_dtype(q.dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):  # the operator runs outside autocast
        scores = torch.matmul(q.to(wd), k.to(wd).transpose(-2, -1)) * scale
        valid = valid_mask(scores.shape, scores.device, causal=causal, mask=mask)
        P = _probs(scores, valid, spec, backend)
        out = torch.matmul(P, v.to(wd))
        # A row with a non-finite score (from non-finite q or k), or whose scores span more than the working
        # dtype holds (MinMax, resolved), is NaN, never a quiet zero row; no host sync.
        bad = (~torch.isfinite(scores) & valid).any(-1, keepdim=True)
        bad = bad | span_overflows(scores.detach(), valid, spec)
        out = out.masked_fill(bad, float("nan"))
    return out.to(q.dtype)
