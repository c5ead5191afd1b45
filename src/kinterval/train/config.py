"""Training configuration: nested dataclasses, loaded from TOML, overridden by CLI flags, validated up front.

A TOML file mirrors the sections below (``[model]``, ``[operator]``, ``[data]``, ``[optim]``, ``[schedule]``,
``[checkpoint]``, ``[numerics]``, ``[dist]``, ``[log]``) plus top-level ``seed``, ``device`` and ``name``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from importlib import resources
from pathlib import Path

from kinterval.model.config import PRESETS, ModelConfig, NumericsConfig, preset
from kinterval.model.gpt import ATTENTION_BACKENDS, SDPA, operator_name
from kinterval.ops.seeds import check_seed

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python 3.10
    import tomli as tomllib

DEVICES = ("auto", "cpu", "cuda")  # suite runs; a single run also takes "cuda:N"
STRATEGIES = ("ddp", "fsdp2")
DECAY_POLICIES = ("nanogpt", "matrices")


@dataclass
class ModelSection:
    preset: str = "tiny"
    n_layer: int | None = None  # None: the preset's value
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None  # the training sequence length T
    vocab_multiple: int | None = None
    bias: bool | None = None
    n_kv_head: int | None = None  # grouped-query attention (ModelConfig); None: the preset's (n_head)
    attn_softcap: float | None = None  # score softcap c; None: the preset's (none)
    attn_sinks: bool | None = None  # learned attention sinks; None: the preset's (off)
    rope_theta: float | None = None  # rotary positions with this base; None: the preset's (learned ones)


@dataclass
class OperatorSection:
    name: str = "softmax"  # an OperatorSpec full name, or "sdpa"
    backend: str = "auto"  # auto | reference | closed_form | triton


@dataclass
class DataSection:
    dir: str = ""  # prepared dataset folder (meta.json + shards)
    source: str = ""  # free-text note of the corpus, e.g. "FineWebEdu-3B"; the meta.json is authoritative
    verify: bool = False  # sha256-check every shard at start


@dataclass
class OptimSection:
    lr: float = 6e-4  # peak learning rate
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay: str = "nanogpt"  # nanogpt: every >=2-D parameter (incl. embeddings); matrices: excludes embeddings
    grad_clip: float = 1.0  # max global norm; 0 disables clipping (the norm is still logged)
    fused: bool | None = None  # None: fused AdamW on CUDA, plain on CPU


@dataclass
class ScheduleSection:
    tokens: int = 1_000_000  # training budget; steps = ceil(tokens / tokens_per_step)
    warmup_tokens: int = 0  # linear warmup length, then cosine decay
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of the peak
    micro_batch: int = 1  # sequences per forward pass; micro_batch x accum x world = sequences per step
    accum: int = 1  # micro-batches per optimizer step, per process


@dataclass
class CheckpointSection:
    count: int = 5  # evenly spaced checkpoints over the run (the last one is the final step)
    save_every: int = 0  # extra checkpoint every N steps (0: off)


@dataclass
class DistSection:
    strategy: str = "ddp"  # ddp | fsdp2 (only used under torchrun with more than one process)


@dataclass
class LogSection:
    every: int = 1  # steps between metrics.jsonl rows
    progress: bool = True  # tqdm bar (off anyway when stderr is not a TTY)
    tensorboard: bool = False
    eval_every: int = 0  # every N steps: validation loss and row span on the first eval_blocks (0: off)
    eval_blocks: int = 8  # validation blocks of that log (the geometry probe's 8)


@dataclass
class TrainConfig:
    name: str = ""
    seed: int = 0
    device: str = "auto"
    compile: bool = False  # torch.compile each block; the K-interval operator stays eager (model/gpt.py)
    activation_checkpointing: bool = False  # recompute each block in the backward: less memory, same result
    model: ModelSection = field(default_factory=ModelSection)
    operator: OperatorSection = field(default_factory=OperatorSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    dist: DistSection = field(default_factory=DistSection)
    log: LogSection = field(default_factory=LogSection)

    # ------------------------------------------------------------------ construction
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return _build(cls, d, "")

    @classmethod
    def from_toml(cls, path: str | Path) -> TrainConfig:
        path = Path(path)
        if not path.is_file():
            # a bare name ("124m-250m" or "124m-250m.toml") may be a shipped config; a path must exist, so
            # that a mistyped path to an edited copy never trains with the shipped settings of the same name
            named = resources.files("kinterval") / "configs" / f"{path.name.removesuffix('.toml')}.toml"
            if len(path.parts) != 1 or not named.is_file():
                raise FileNotFoundError(
                    f"config file not found: {path} (shipped configs: {shipped_configs()})"
                )
            path = Path(str(named))
        try:
            d = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: invalid TOML ({err})") from None
        return cls.from_dict(d)

    def override(self, dotted: dict) -> TrainConfig:
        """A copy with ``{"schedule.tokens": 1000, ...}`` applied (None values are skipped). A nested table
        (``{"schedule": {"tokens": 1000}}``, what TOML makes of an unquoted dotted key) sets its fields one by
        one: it never replaces a section, whose other fields would fall back to their defaults."""
        if not isinstance(dotted, dict):
            raise TypeError(f"override takes a dict of dotted fields, got {type(dotted).__name__}")
        d = self.to_dict()
        for key, value in flatten(dotted).items():
            if value is None:
                continue
            node, *path = key.split(".")
            target = d
            for part in [node, *path][:-1]:
                if part not in target or not isinstance(target[part], dict):
                    raise ValueError(f"unknown config field {key!r}")
                target = target[part]
            if [node, *path][-1] not in target:
                raise ValueError(f"unknown config field {key!r}")
            target[[node, *path][-1]] = value
        return TrainConfig.from_dict(d)

    # ------------------------------------------------------------------ derived values
    def model_config(self, vocab_size: int) -> ModelConfig:
        m = self.model
        return preset(
            m.preset,
            vocab_size=vocab_size,
            n_layer=m.n_layer,
            n_head=m.n_head,
            n_embd=m.n_embd,
            block_size=m.block_size,
            vocab_multiple=m.vocab_multiple,
            bias=m.bias,
            n_kv_head=m.n_kv_head,
            attn_softcap=m.attn_softcap,
            attn_sinks=m.attn_sinks,
            rope_theta=m.rope_theta,
            numerics=self.numerics,
        )

    @property
    def block_size(self) -> int:
        return self.model.block_size or PRESETS[self.model.preset].block_size

    def validate(self) -> TrainConfig:
        """Raise ValueError naming the first bad field; return self."""
        if not isinstance(self.model.preset, str) or self.model.preset not in PRESETS:  # a list: no TypeError
            raise ValueError(f"model.preset must be one of {sorted(PRESETS)}, got {self.model.preset!r}")
        model = self.model_config(vocab_size=1)  # shape checks
        if self.numerics.autocast_dtype == "float16":  # evaluation may use it; training may not
            raise ValueError(
                "numerics.autocast_dtype 'float16' cannot be used for training: without loss scaling "
                "(kinterval has none) small fp16 gradients underflow to zero; use 'bfloat16' (the paper's "
                "policy) or 'none'"
            )
        operator_name(self.operator.name)  # raises ValueError with the valid forms
        if self.operator.name == SDPA and (model.attn_softcap is not None or model.attn_sinks):
            raise ValueError(
                "operator.name 'sdpa' (PyTorch's softmax attention) takes no model.attn_softcap or "
                "model.attn_sinks: use the operator 'softmax', which applies them"
            )
        _choice("operator.backend", self.operator.backend, ATTENTION_BACKENDS)
        check_device(self.device)
        _choice("dist.strategy", self.dist.strategy, STRATEGIES)
        _choice("optim.decay", self.optim.decay, DECAY_POLICIES)
        check_seed(self.seed, "seed")  # [0, 2^32): torch, numpy's legacy RNG
        o, s = self.optim, self.schedule
        _num("optim.lr", o.lr, lo=0, open_lo=True)
        _num("optim.beta1", o.beta1, lo=0, hi=1, open_hi=True)
        _num("optim.beta2", o.beta2, lo=0, hi=1, open_hi=True)
        _num("optim.eps", o.eps, lo=0, open_lo=True)
        _num("optim.weight_decay", o.weight_decay, lo=0)
        _num("optim.grad_clip", o.grad_clip, lo=0)
        _int("schedule.tokens", s.tokens, 1)
        _int("schedule.warmup_tokens", s.warmup_tokens, 0)
        if s.warmup_tokens >= s.tokens:
            raise ValueError(
                f"schedule.warmup_tokens ({s.warmup_tokens}) must be < schedule.tokens ({s.tokens})"
            )
        _num("schedule.min_lr_ratio", s.min_lr_ratio, lo=0, hi=1)
        _int("schedule.micro_batch", s.micro_batch, 1)
        _int("schedule.accum", s.accum, 1)
        _int("checkpoint.count", self.checkpoint.count, 0)
        _int("checkpoint.save_every", self.checkpoint.save_every, 0)
        _int("log.every", self.log.every, 1)
        _int("log.eval_every", self.log.eval_every, 0)
        _int("log.eval_blocks", self.log.eval_blocks, 1)
        for name, value in (
            ("name", self.name),
            ("data.dir", self.data.dir),
            ("data.source", self.data.source),
        ):
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {value!r}")
        for name, value, optional in (
            ("compile", self.compile, False),
            ("activation_checkpointing", self.activation_checkpointing, False),
            ("data.verify", self.data.verify, False),
            ("log.progress", self.log.progress, False),
            ("log.tensorboard", self.log.tensorboard, False),
            ("optim.fused", self.optim.fused, True),
            ("model.bias", self.model.bias, True),
        ):
            if not isinstance(value, bool) and not (optional and value is None):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        if not self.data.dir:
            raise ValueError("data.dir is required (a folder made by `kinterval data prepare`)")
        return self


def shipped_configs() -> list[str]:
    root = resources.files("kinterval") / "configs"
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".toml"))


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ---------------------------------------------------------------------- helpers
def _build(cls, d: dict, prefix: str):
    if not isinstance(d, dict):
        raise ValueError(f"config section {prefix.rstrip('.') or '(top)'} must be a table, got {d!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"unknown config field(s) {[prefix + u for u in unknown]}; known: {sorted(known)}")
    kwargs = {}
    for name, value in d.items():
        default = known[name].default_factory() if callable(known[name].default_factory) else None
        if is_dataclass(default):
            kwargs[name] = _build(type(default), value, f"{prefix}{name}.")
        else:
            kwargs[name] = value
    return cls(**kwargs)


def check_device(name) -> None:
    """A run's ``device``: one of DEVICES or ``cuda:N`` (one GPU of several; under torchrun each rank takes
    ``cuda:LOCAL_RANK`` instead, so ``cuda`` is the name to give there)."""
    if not (name in DEVICES or (isinstance(name, str) and re.fullmatch(r"cuda:\d+", name))):
        raise ValueError(f"device must be one of {list(DEVICES)} or cuda:N, got {name!r}")


def _choice(name, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _int(name, value, lo) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def _num(name, value, lo=None, hi=None, open_lo=False, open_hi=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if lo is not None and (value < lo or (open_lo and value == lo)):
        raise ValueError(f"{name} must be {'>' if open_lo else '>='} {lo}, got {value!r}")
    if hi is not None and (value > hi or (open_hi and value == hi)):
        raise ValueError(f"{name} must be {'<' if open_hi else '<='} {hi}, got {value!r}")
