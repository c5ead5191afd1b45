"""Fused Triton kernels for the K-interval operator family (forward + FlashAttention-2-style backward).

Public names:

* :func:`triton_attention` -- ``P(q k^T * scale) v`` for one :class:`~kinterval.ops.spec.OperatorSpec`, an
  autograd function over fused kernels, same semantics as ``kinterval_attention(..., backend="reference")``
  (see ``docs/kernels.md`` for the algorithm and the documented deviations: ties, the softmax max term and
  the Nearest midpoint test, which rounds differently where the reference's grid point is rounded);
* :func:`triton_supports` -- whether a spec is handled by the kernels (pure Python, never imports triton), so
  that the ``auto`` backend can fall back to ``closed_form``.

Supported: every operator of the family: the baselines ``softmax``, ``bf16-exp`` and ``fp8-exp`` (App. D.5);
``{minmax,fwm,resolved}-lerp-k{K}``; ``{minmax,fwm,resolved}-{weight,prob}-k{K}`` in strict and historical
arithmetic (App. C.2); every ``range_grad`` (full, detach, max_only, min_only, p1). Attention sinks (one
score per q head, a key without a value) join every row, a softcap bends the scores, and an additive score
bias (ALiBi, T5's position bias) is added to them, with its gradient.
"""

from __future__ import annotations

from kinterval.ops.spec import OperatorSpec

__all__ = ["triton_attention", "triton_supports", "unsupported_reason"]

# The baselines the kernels implement, in the order of their EXP code (kernels.EXP_CODES: 0 softmax, ...)
KERNEL_BASELINES = ("softmax", "bf16-exp", "fp8-exp")


def unsupported_reason(spec: OperatorSpec) -> str | None:
    """None when the kernels implement ``spec``, else a sentence saying why not."""
    if not isinstance(spec, OperatorSpec):
        return f"spec must be an OperatorSpec, got {type(spec).__name__}"
    if not spec.is_kinterval:
        if spec.kind in KERNEL_BASELINES:
            return None
        return f"baseline {spec.kind!r} has no triton kernel"
    if spec.calibration not in ("minmax", "fwm", "resolved"):
        return f"calibration {spec.calibration!r} has no triton kernel"
    if spec.reconstruction == "nearest" and spec.surrogate not in ("weight", "prob"):
        return f"surrogate {spec.surrogate!r} has no triton kernel"
    if spec.range_grad not in ("full", "detach", "max_only", "min_only", "p1"):
        return f"range_grad {spec.range_grad!r} has no triton kernel"
    return None


def triton_supports(spec: OperatorSpec) -> bool:
    """True when :func:`triton_attention` implements ``spec`` (does not check that triton is importable)."""
    return unsupported_reason(spec) is None


def triton_attention(
    q, k, v, spec, *, causal=False, mask=None, scale=None, precision=None, sinks=None, softcap=None, bias=None
):
    """Fused attention with the probabilities of ``spec``.

    See :func:`kinterval.ops.triton.autograd.triton_attention` for the arguments and conventions.
    """
    from kinterval.ops.triton.autograd import triton_attention as _impl

    return _impl(
        q,
        k,
        v,
        spec,
        causal=causal,
        mask=mask,
        scale=scale,
        precision=precision,
        sinks=sinks,
        softcap=softcap,
        **({} if bias is None else {"bias": bias}),
    )
