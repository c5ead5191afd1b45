"""The K-interval operator family: names, reference maths, closed-form backward, fused kernels, diagnostics.

``ops`` imports nothing from the rest of kinterval but the top-level ``graph_break`` helper.
"""

from kinterval.ops.api import attention_probs, dot_precision, kinterval_attention
from kinterval.ops.backends import BACKENDS, resolve_backend
from kinterval.ops.sdpa_mode import replace_sdpa
from kinterval.ops.spec import OperatorSpec

__all__ = [
    "BACKENDS",
    "OperatorSpec",
    "attention_probs",
    "dot_precision",
    "kinterval_attention",
    "replace_sdpa",
    "resolve_backend",
]
