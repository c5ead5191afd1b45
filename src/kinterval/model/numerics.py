"""Precision policy: TF32 switches for training vs evaluation, the autocast region outside attention, and the
dtype of the attention inputs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from kinterval.model.config import ATTENTION_DTYPES, NumericsConfig
from kinterval.ops import dot_precision
from kinterval.ops.tf32 import tf32


def train_precision(numerics: NumericsConfig) -> contextlib.AbstractContextManager:
    return tf32(numerics.tf32_train)


# The fused kernel's fp32 dot precision in evaluation with TF32 off: "ieee" (fp32 on the CUDA cores, the
# paper's evaluation numerics), "tf32x3" (split TF32) or "bf16x6" (three bf16 parts per operand), both on
# the tensor cores with an error near fp32's. An
# environment variable, not a config field: it does not change what a run trains, and checkpoints and
# suite records compare configs field by field.
EVAL_DOT_PRECISION_ENV = "KINTERVAL_EVAL_DOT_PRECISION"
EVAL_DOT_PRECISIONS = ("ieee", "tf32x3", "bf16x6")


def eval_dot_precision() -> str:
    """The evaluation dot precision: ``$KINTERVAL_EVAL_DOT_PRECISION``, default "ieee"."""
    value = os.environ.get(EVAL_DOT_PRECISION_ENV, "ieee")
    if value not in EVAL_DOT_PRECISIONS:
        raise ValueError(f"{EVAL_DOT_PRECISION_ENV} must be one of {EVAL_DOT_PRECISIONS}, got {value!r}")
    return value


def eval_dot_setting(numerics: NumericsConfig) -> str | None:
    """The fused kernels' fp32 dot precision under :func:`eval_precision`: ``eval_dot_precision()`` with TF32
    off, None with it on (the kernels then follow torch's TF32 switch: "tf32")."""
    return None if numerics.tf32_eval else eval_dot_precision()


@contextlib.contextmanager
def eval_precision(numerics: NumericsConfig) -> Iterator[None]:
    """Evaluation numerics: TF32 per ``numerics.tf32_eval`` (off in the paper); with TF32 off, the fused
    kernel's fp32 dots at ``eval_dot_precision()``."""
    with tf32(numerics.tf32_eval), dot_precision(eval_dot_setting(numerics)):
        yield


def autocast_applied(numerics: NumericsConfig, device: torch.device | str) -> str:
    """The autocast dtype :func:`autocast` applies on ``device`` ("none": off; on CPU unless
    ``autocast_on_cpu``)."""
    device_type = torch.device(device).type
    enabled = numerics.autocast_dtype != "none" and (device_type == "cuda" or numerics.autocast_on_cpu)
    return numerics.autocast_dtype if enabled else "none"


def autocast(numerics: NumericsConfig, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The autocast region for everything outside attention (the operator disables autocast itself). "none"
    switches off a caller's own autocast too, so that the run's numerics hold whoever calls."""
    dtype, device_type = autocast_applied(numerics, device), torch.device(device).type
    if dtype == "none":
        return autocast_off(device_type)
    return torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a no-op on a device without autocast (meta: a model
    built under ``torch.device("meta")`` traces its shapes). The same as ``ops.autocast.outside_autocast``,
    written out here so that the model also runs beside the operator code a suite sitting pins."""
    if device_type not in ("cpu", "cuda") and not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def attention_inputs(attention_dtype: str, *xs: Tensor, native: bool = False) -> tuple[Tensor, ...]:
    """q, k, v as the attention receives them under ``numerics.attention_dtype``.

    "float32" (paper §4): widened to fp32 (bf16 projections under autocast are widened exactly; float64
    stays float64). "bfloat16": rounded to bf16. With ``native=True`` they stay bf16 tensors, for a kernel
    that takes bf16 natively (the triton kernels: bf16 dots with fp32 accumulation and fp32 operator maths;
    SDPA's flash kernel). With ``native=False`` the rounded values come back as fp32 tensors, for the
    reference and closed_form backends: only the inputs are rounded, the operator maths (extrema, grid,
    weights, normalization) must never run in bf16, so they get fp32 tensors whatever their own dtype rule.
    """
    if attention_dtype not in ATTENTION_DTYPES:
        raise ValueError(
            f"numerics.attention_dtype must be one of {ATTENTION_DTYPES}, got {attention_dtype!r}"
        )
    if attention_dtype == "float32":
        return tuple(x.to(torch.promote_types(x.dtype, torch.float32)) for x in xs)
    rounded = tuple(x.to(torch.bfloat16) for x in xs)
    return rounded if native else tuple(x.float() for x in rounded)
