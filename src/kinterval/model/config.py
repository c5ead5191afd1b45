"""Model shape and numerics configuration, plus the named presets.

The vocabulary size comes from the training data's meta.json; a preset only fixes the Transformer shape.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

AUTOCAST_DTYPES = ("bfloat16", "float16", "none")
ATTENTION_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class NumericsConfig:
    """Precision policy (paper §4): bf16 autocast outside attention, fp32 attention, TF32 in training only.

    ``autocast_dtype`` applies on CUDA; on CPU autocast stays off unless ``autocast_on_cpu`` is set (bf16
    autocast on CPU is slow and changes the numerics the CPU tests pin down).

    ``attention_dtype`` is the dtype of the attention inputs q, k, v. "float32" (the paper's policy, the
    default of every shipped config): q k^T and P v on fp32 tensors. "bfloat16" (an option for speed, not
    the paper's numerics): q, k, v rounded to bf16, as SDPA's flash kernel sees them; the operator maths
    (extrema, grid, weights, normalization) stays fp32 and the output returns to the residual stream's dtype
    (:func:`kinterval.model.numerics.attention_inputs`).
    """

    autocast_dtype: str = "bfloat16"
    autocast_on_cpu: bool = False
    attention_dtype: str = "float32"  # q, k, v of the attention; the operator maths is fp32 either way
    tf32_train: bool = True
    tf32_eval: bool = False

    def validate(self) -> None:
        if self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(
                f"numerics.autocast_dtype must be one of {AUTOCAST_DTYPES}, got {self.autocast_dtype!r}"
            )
        if self.attention_dtype not in ATTENTION_DTYPES:
            raise ValueError(
                f"numerics.attention_dtype must be one of {ATTENTION_DTYPES}, got {self.attention_dtype!r}"
            )
        for name in ("autocast_on_cpu", "tf32_train", "tf32_eval"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"numerics.{name} must be true or false, got {getattr(self, name)!r}")


# The smallest attention softcap: float32's smallest normal number, as kinterval.ops.api.SOFTCAP_MIN (not
# imported from there: a suite sitting may run this model on an older checkout's operator code)
SOFTCAP_MIN = 2.0**-126

# The attention options beyond GPT-2 (ModelConfig fields; :attr:`ModelConfig.attention_options`)
ATTENTION_OPTIONS = ("n_kv_head", "attn_softcap", "attn_sinks", "rope_theta")


@dataclass(frozen=True)
class ModelConfig:
    """GPT-2 shape. ``vocab_multiple`` pads the embedding table (e.g. 50257 -> 50304 with 64) for speed only:
    the padded rows never receive probability because the logits are cut back to ``vocab_size``.

    Attention options beyond the paper's GPT-2, each off by default (no shipped config or preset sets
    them): ``n_kv_head`` key/value heads for grouped-query attention (None: ``n_head``; it must divide
    ``n_head``), ``attn_softcap`` c for the score row c tanh(s / c) (Gemma 2; None: none), ``attn_sinks``,
    one learned logit per head appended to every row as a key without a value (gpt-oss), and ``rope_theta``,
    the base of rotary position embeddings on q and k in place of the learned position table (None: the
    table, GPT-2's). The operator sees the modified row, calibration included
    (:func:`kinterval.ops.kinterval_attention`).
    """

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257
    vocab_multiple: int = 1
    bias: bool = True
    n_kv_head: int | None = None  # grouped-query attention; None: n_head
    attn_softcap: float | None = None  # score row c tanh(s / c); None: none
    attn_sinks: bool = False  # a learned sink logit per head
    rope_theta: float | None = None  # rotary position embeddings with this base; None: learned positions
    numerics: NumericsConfig = field(default_factory=NumericsConfig)

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def attention_options(self) -> dict:
        """The attention options beyond GPT-2 that are set, by field name ({} for GPT-2; ``n_kv_head`` equal
        to ``n_head`` is no option)."""
        on = {"n_kv_head": self.kv_heads != self.n_head, "attn_softcap": self.attn_softcap is not None,
              "attn_sinks": self.attn_sinks, "rope_theta": self.rope_theta is not None}  # fmt: skip
        return {name: getattr(self, name) for name in ATTENTION_OPTIONS if on[name]}

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_multiple
        return -(-self.vocab_size // m) * m

    def validate(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "vocab_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        for name in ("bias", "attn_sinks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        kv = self.n_kv_head
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.n_head % kv):
            raise ValueError(
                f"model.n_kv_head must be a positive integer that divides model.n_head ({self.n_head}), or "
                f"unset, got {kv!r}"
            )
        cap = self.attn_softcap
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf
        ):
            raise ValueError(f"model.attn_softcap must be a positive finite number, or unset, got {cap!r}")
        if cap is not None and cap < SOFTCAP_MIN:
            raise ValueError(
                f"model.attn_softcap must be at least {SOFTCAP_MIN:.3g} (the kernels divide by it), got {cap}"
            )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})"
            )
        theta = self.rope_theta
        if theta is not None and (
            isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 1 < theta < math.inf
        ):
            raise ValueError(f"model.rope_theta must be a finite number > 1, or unset, got {theta!r}")
        if theta is not None and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                "model.rope_theta needs an even head dimension, got n_embd / n_head = "
                f"{self.n_embd // self.n_head}"
            )
        self.numerics.validate()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["padded_vocab_size"] = self.padded_vocab_size
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = {k: v for k, v in d.items() if k != "padded_vocab_size"}
        d["numerics"] = NumericsConfig(**d.get("numerics", {}))
        return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    # Paper App. C.1: 124M = 12 layers, 12 heads, d=768; 1B = 32 layers, 24 heads, d=1536 (~983M parameters).
    "gpt2-124m": ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_multiple=64),
    "gpt2-1b": ModelConfig(n_layer=32, n_head=24, n_embd=1536, block_size=1024, vocab_multiple=64),
    # Development sizes.
    "small": ModelConfig(n_layer=6, n_head=6, n_embd=384, block_size=512),
    "tiny": ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=128),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A preset with field overrides (``None`` values are ignored), validated."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg


def count_params(cfg: ModelConfig, *, include_positions: bool = True) -> int:
    """Parameter count of :class:`kinterval.model.GPT` without building it (tied embeddings counted once).

    With ``include_positions=False`` this is nanoGPT's ``get_num_params()`` convention, which the paper's
    "124M" and "983M" follow.
    """
    d, L, b = cfg.n_embd, cfg.n_layer, int(cfg.bias)
    ln = 2 * d if cfg.bias else d
    qkv = d + 2 * d // cfg.n_head * cfg.kv_heads  # q, then k and v of the key/value heads
    per_block = (
        2 * ln  # ln_1, ln_2
        + d * qkv
        + b * qkv  # qkv
        + cfg.n_head * cfg.attn_sinks  # sink logits
        + d * d
        + b * d  # attention output projection
        + 4 * d * d
        + b * 4 * d  # MLP up
        + 4 * d * d
        + b * d  # MLP down
    )
    total = cfg.padded_vocab_size * d + L * per_block + ln
    if include_positions and cfg.rope_theta is None:  # rotary positions have no parameters
        total += cfg.block_size * d
    return total
