"""kinterval.model: a GPT-2 style Transformer whose attention operator is a constructor argument."""

from kinterval.model.config import PRESETS, ModelConfig, NumericsConfig, count_params, preset
from kinterval.model.gpt import GPT, SDPA, CausalSelfAttention, operator_name, parse_operator, safe_operator
from kinterval.model.numerics import autocast, eval_precision, tf32, train_precision

__all__ = [
    "GPT",
    "PRESETS",
    "SDPA",
    "CausalSelfAttention",
    "ModelConfig",
    "NumericsConfig",
    "autocast",
    "count_params",
    "eval_precision",
    "operator_name",
    "parse_operator",
    "preset",
    "safe_operator",
    "tf32",
    "train_precision",
]
