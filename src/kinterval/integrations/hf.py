"""Hugging Face ``transformers`` drop-in: K-interval attention as an ``attn_implementation``.

Registration goes through the public extension points only: ``transformers.AttentionInterface`` for the
attention function and ``transformers.masking_utils.AttentionMaskInterface`` for the mask (we reuse the sdpa
mask builder, so every model hands us a boolean mask, True = may attend, or ``None`` when sdpa would rely on
``is_causal``; a model that computes attention in its own code gets eager's float mask and a warning, see
``_mask``). Importing this module registers

* ``"kinterval"``: the operator chosen with :func:`set_operator` (default ``fwm-prob-k4``), or, per model,
  the config attribute ``kinterval_operator`` (saved with ``save_pretrained``; :func:`set_config_operator`
  sets it on a composite model's sub-configs too, which its attention modules read);
* ``"kinterval-<operator>"`` for the baselines and every family with K in :data:`AUTO_K`, e.g.
  ``"kinterval-fwm-prob-k4"``; any other operator (other K, overrides) via :func:`attn_implementation_name`.

>>> model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kinterval-fwm-prob-k4")

``output_attentions=True`` returns the operator's probabilities P of each layer (the explicit-P path below).
Dropout: with ``attention_dropout > 0`` in training mode, dropout is applied to the operator's probabilities
(as transformers' eager path does, and the returned P is then the dropped one that multiplies v); that path
computes P explicitly (``closed_form``/``reference`` backend, never the fused kernel, so an explicit
``backend="triton"`` raises there). The backend is chosen by :func:`kinterval.ops.resolve_backend`. Additive
score biases (T5's ``position_bias``, a float mask that carries a bias), ``softcap`` (Gemma 2) and attention
sinks (``s_aux``, gpt-oss) are applied as transformers' eager attention applies them, the operator running on
the modified score row (``kinterval_attention``), on every backend. Sparse key selections (``indices``) are
refused. Flash-style packed sequences (``cu_seq_lens_q`` / ``cu_seq_lens_k`` of one packed row) attend only
within their sequence, as flash attention does (sdpa and eager ignore these arguments).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections import Counter
from contextlib import contextmanager
from functools import lru_cache

import torch

from kinterval.ops import BACKENDS, OperatorSpec, attention_probs, kinterval_attention, resolve_backend
from kinterval.ops.api import (
    check_softcap,
    modified_scores,
    score_mods_in,
    split_mask,
    valid_mask,
    warn_mask_like_bias,
    working_dtype,
)
from kinterval.ops.autocast import autocast_dtype, matmul_outside_autocast, outside_autocast
from kinterval.ops.backends import version_tuple
from kinterval.ops.spec import BASELINES

# The oldest transformers the drop-in is tested with: before 5.20, T5 and UMT5 compute attention in their own
# code (they ignore attn_implementation and would run softmax), and 5.0 returns no output_attentions.
MIN_TRANSFORMERS = "5.20"

try:
    from transformers import AttentionInterface, PretrainedConfig
    from transformers import __version__ as _transformers_version
except ImportError as err:  # a missing transformers gets the hint; a broken one keeps its cause
    missing = isinstance(err, ModuleNotFoundError) and err.name == "transformers"
    raise ImportError(
        f"kinterval.integrations.hf needs transformers >= {MIN_TRANSFORMERS}: pip install 'kinterval[hf]'"
        + ("" if missing else f" (importing it failed: {err})")
    ) from (None if missing else err)

if version_tuple(_transformers_version) < version_tuple(MIN_TRANSFORMERS):
    raise ImportError(
        f"kinterval.integrations.hf needs transformers >= {MIN_TRANSFORMERS}, found {_transformers_version}: "
        "pip install -U 'kinterval[hf]'"
    )

try:  # transformers 5: the collector behind output_attentions=True (None when nothing is collected)
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover - older versions: attentions are not returned, as with sdpa
    _active_collector = None

try:  # transformers >= 4.53; older versions build a float mask themselves, which we also accept
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
except ImportError:  # pragma: no cover
    AttentionMaskInterface = eager_mask = sdpa_mask = None

__all__ = [
    "AUTO_K",
    "DEFAULT_OPERATOR",
    "PREFIX",
    "attn_implementation_name",
    "calls",
    "expect_kinterval",
    "get_operator",
    "register",
    "register_all",
    "registered_names",
    "set_config_operator",
    "set_operator",
]

PREFIX = "kinterval"
DEFAULT_OPERATOR = "fwm-prob-k4"
AUTO_K = (1, 2, 3, 4, 8, 16, 32, 64)
_FAMILIES = (
    "lerp", "fwm-lerp", "resolved-lerp",
    "minmax-weight", "fwm-weight", "resolved-weight",
    "minmax-prob", "fwm-prob", "resolved-prob",
)  # fmt: skip

# implementation name -> (spec, backend); the plain PREFIX entry is what set_operator changes.
_REGISTRY: dict[str, tuple[OperatorSpec, str]] = {}
# implementation name -> how many times transformers called it: the proof that kinterval actually ran
_CALLS: Counter[str] = Counter()


def calls(name: str | None = None) -> int:
    """How many attention calls went through ``name`` (all kinterval names when None) in this process."""
    return sum(_CALLS.values()) if name is None else _CALLS[name]


@contextmanager
def expect_kinterval(name: str | None = None):
    """Raise ``RuntimeError`` if the block ran no kinterval attention (through ``name``, when given).

    A model whose class cannot switch its attention implementation, or a transformers version that routes
    it elsewhere, would otherwise run softmax silently:

    >>> with expect_kinterval("kinterval-fwm-prob-k4"):
    ...     model(ids)
    """
    before = calls(name)
    yield
    if calls(name) == before:
        what = repr(name) if name else "any kinterval implementation"
        raise RuntimeError(
            f"the model never called {what}: its attention ran something else (a model class that ignores "
            "attn_implementation, or a transformers version too old for the kinterval drop-in)"
        )


@lru_cache(maxsize=256)
def _parse(name: str) -> OperatorSpec:
    return OperatorSpec.from_full_name(name)


# Arguments of transformers' attention interface that change what attention computes and that the
# operators do not take: indices / block_indices (sparse top-k key selection: DeepSeek V3.2 and others).
# Ignoring one would run another attention than the model's without a word.
UNSUPPORTED = ("indices", "block_indices")


def _attention(name: str, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    spec, backend = _REGISTRY[name]
    _CALLS[name] += 1
    if name == PREFIX and getattr(getattr(module, "config", None), "kinterval_operator", None):
        spec = _parse(module.config.kinterval_operator)
    if given := [k for k in UNSUPPORTED if kwargs.get(k) is not None]:
        raise ValueError(
            f"kinterval attention does not support {', '.join(given)} (sparse key selections are not "
            "defined for its operators)"
        )
    if kwargs.get("s_aux") is not None and kwargs.get("sinks") is not None:
        raise ValueError("pass the attention sinks as s_aux or as sinks, not both")
    sinks = kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")
    softcap, position_bias = kwargs.get("softcap"), kwargs.get("position_bias")
    if (dtype := autocast_dtype(query.device.type)) is not None:
        # As torch's sdpa under autocast (on its lower-precision list): every input but a float64 one goes to
        # the autocast dtype. RoPE multiplies 16-bit q, k by fp32 cos/sin, so q, k arrive fp32 and v bf16;
        # a KV cache whose empty start is fp32 promotes k, v to fp32 at its concatenation (transformers 5.20
        # builds one in training): all of them run in the autocast dtype, as sdpa runs them.
        query, key, value = (x if x.dtype == torch.float64 else x.to(dtype) for x in (query, key, value))
    if not query.dtype == key.dtype == value.dtype:  # outside autocast, or a float64 among them: promoted
        dtype = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    gqa = query.shape[1] != key.shape[1]  # grouped-query attention: fewer k/v heads
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    tq, causal, mask = query.shape[2], False, None
    if attention_mask is not None:  # boolean, or a float mask (0 / very negative; eager's may carry a bias)
        mask = attention_mask[:, :, :, : key.shape[2]]
    elif is_causal and tq > 1:
        # sdpa semantics for a skipped mask: causal, and an empty static cache is cut to the query length
        causal, key, value = True, key[:, :, :tq], value[:, :, :tq]
    if position_bias is not None:  # T5-style: added to the scores, as sdpa's float mask
        bias = position_bias[..., : key.shape[2]]
        if mask is None:
            mask = bias
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, bias, float("-inf"))
        else:
            mask = bias + mask
    if (packed := _packed_sequences(kwargs, query, key)) is not None:  # flash-style varlen packing
        if mask is None:
            mask = packed
        elif mask.dtype == torch.bool:
            mask = mask & packed
        else:
            mask = mask.masked_fill(~packed, float("-inf"))
    p = dropout if dropout > 0.0 and module.training else 0.0
    if p or _attentions_requested():
        if gqa:  # the explicit path forms P per q head from repeated k/v heads
            n_rep = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
        out, P = _explicit_attention(
            query, key, value, spec, causal, mask, scaling, p, backend, softcap, sinks
        )
        return out.transpose(1, 2).contiguous(), P
    out = kinterval_attention(
        query, key, value, spec, causal=causal, mask=mask, scale=scaling, backend=backend, enable_gqa=gqa,
        softcap=softcap, sinks=sinks,
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def _packed_sequences(kwargs, query, key) -> torch.Tensor | None:
    """The (1, 1, T, T) mask of flash-style packed sequences (``cu_seq_lens_q`` / ``cu_seq_lens_k``, the
    cumulative sequence lengths of one packed row, as a packing collator gives them): a token attends only
    keys of its own sequence. ``None`` when not given. sdpa and eager ignore these arguments (packed sequences
    would attend each other); flash attention honours them, and so does this."""
    cq, ck = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cq is None and ck is None:
        return None
    if cq is None or ck is None or not torch.equal(cq.cpu(), ck.cpu()):
        raise ValueError(
            "cu_seq_lens_q and cu_seq_lens_k must both be given and equal (packed prefill without a cache)"
        )
    T = query.shape[2]
    if query.shape[0] != 1 or key.shape[2] != T or cq.dim() != 1 or int(cq[-1]) > T or int(cq[0]) != 0:
        raise ValueError(
            f"cu_seq_lens {cq.tolist()} must describe one packed row of {T} tokens (batch 1, no cache), "
            f"got batch {query.shape[0]}, {T} queries and {key.shape[2]} keys"
        )
    pos = torch.arange(T, device=query.device)
    seq = torch.searchsorted(cq.to(query.device, torch.long), pos, right=True)  # sequence of each token
    return (seq[:, None] == seq[None, :]).view(1, 1, T, T)


def _attentions_requested() -> bool:
    """Whether the model call asked for ``output_attentions``: then, as transformers' eager path does, the
    operator's probabilities P are returned (sdpa and flash return none: ``outputs.attentions`` is empty)."""
    collector = _active_collector.get() if _active_collector is not None else None
    return bool(collector) and "attentions" in collector


def _explicit_attention(q, k, v, spec, causal, mask, scale, p, backend, softcap=None, sinks=None):
    """Explicit-P path: the operator's probabilities (returned, for ``output_attentions``), with dropout
    ``p`` on them before ``PV`` as in transformers' eager attention; softcap, the float mask's bias and the
    sinks as in :func:`kinterval_attention`."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    valid, bias = split_mask(mask, "attention mask")
    warn_mask_like_bias(bias, spec, "attention mask")
    softcap = check_softcap(softcap)
    with outside_autocast(q.device.type):
        wd = working_dtype(q.dtype)  # float32, float64 for a float64 model, as kinterval_attention
        qk = matmul_outside_autocast(q.to(wd), k.to(wd).transpose(-2, -1)) * scale
        # a row with a non-finite q k^T on a key it attends is NaN, as on the fused path
        attended = valid_mask(qk.shape, qk.device, causal=causal, mask=valid)
        scores, bad = modified_scores(qk, attended, softcap, bias)
        probs_backend = resolve_backend(
            spec,
            scores.device,
            scores.dtype,
            backend=backend,
            probs=True,
            score_mod=score_mods_in(bias, softcap, sinks),
        )
        sinks = None if sinks is None else sinks.view(1, -1, 1, 1)
        P = attention_probs(scores, spec, causal=causal, mask=valid, backend=probs_backend, sinks=sinks)
        P = P.masked_fill(bad, float("nan"))
        if p:  # the weights that multiply v are returned, dropout included, as eager returns them
            P = torch.nn.functional.dropout(P, p=p, training=True)
        out = matmul_outside_autocast(P, v.to(wd))
    return out.to(q.dtype), P


_OWN_ATTENTION: dict[type, bool] = {}  # _own_attention's answers: a dict look-up traces without a graph break


def _own_attention(config_class: type) -> bool:
    """Whether the transformers model of ``config_class`` computes attention in its own code instead of
    through ``AttentionInterface``: its modeling module does not read ``ALL_ATTENTION_FUNCTIONS`` (Bloom, MPT,
    XGLM, GPT-NeoX-Japanese, ...). Warns once per class. False where the module is not found (remote code)."""
    if config_class in _OWN_ATTENTION:
        return _OWN_ATTENTION[config_class]
    module = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        own = module != config_class.__module__ and not hasattr(
            sys.modules.get(module) or importlib.import_module(module), "ALL_ATTENTION_FUNCTIONS"
        )
    except Exception:  # noqa: BLE001 - a module that cannot be imported here: assume the interface
        own = False
    _OWN_ATTENTION[config_class] = own
    if own:
        warnings.warn(
            f"{config_class.__name__}: this model computes attention in its own code, not through "
            "transformers' AttentionInterface, so a kinterval attn_implementation does not run in it (its "
            "own softmax runs, with eager's mask); kinterval.integrations.hf.expect_kinterval detects this",
            stacklevel=3,
        )
    return own


def _mask(*args, config=None, **kwargs):
    """The mask builder of every kinterval name: sdpa's (boolean, True = may attend, or None where is_causal
    suffices: the fused causal path). A model that computes attention in its own code adds the mask it gets
    to its scores, and a boolean or absent mask would leave it unmasked, bidirectional and silently wrong:
    it gets eager's float mask (0 / dtype min), which it adds correctly."""
    if config is not None and _own_attention(type(config)):
        return eager_mask(*args, config=config, **kwargs)
    return sdpa_mask(*args, config=config, **kwargs)


def _install(name: str, spec: OperatorSpec, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if name not in _REGISTRY:
        AttentionInterface.register(name, lambda *a, **kw: _attention(name, *a, **kw))
        if AttentionMaskInterface is not None:
            AttentionMaskInterface.register(name, _mask)
    _REGISTRY[name] = (spec, backend)
    return name


def register(
    name: str | None = PREFIX,
    operator: str | OperatorSpec = DEFAULT_OPERATOR,
    backend: str = "auto",
    **overrides,
) -> str:
    """Register ``name`` as an ``attn_implementation`` computing ``operator`` and return the name.

    ``name=None`` gives the canonical ``"kinterval-<operator full name>"``. ``overrides`` (tau, range_grad,
    arithmetic) go to :meth:`OperatorSpec.parse`; ``backend`` to :func:`kinterval_attention`.
    """
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string or None, got {type(name).__name__}")
    if name and name not in _REGISTRY and (name == "eager" or name in AttentionInterface()):
        # registering over "sdpa" would silently run kinterval in every model that asks for sdpa
        raise ValueError(f"{name!r} is one of transformers' own attention implementations; pick another name")
    spec = OperatorSpec.parse(_parse(operator) if isinstance(operator, str) else operator, **overrides)
    canonical = f"{PREFIX}-{spec.full_name}" + ("" if backend == "auto" else f"@{backend}")
    if name and name.startswith(f"{PREFIX}-") and name != canonical:
        # "kinterval-fwm-prob-k4" bound to another operator, or to another backend, would silently run it in
        # every model that asks for the canonical name (attn_implementation_name reuses the registration)
        raise ValueError(
            f"{name!r} is the canonical name of another operator or backend; {spec.full_name} with backend "
            f"{backend!r} registers as {canonical!r}"
        )
    return _install(name or canonical, spec, backend)


def attn_implementation_name(operator: str | OperatorSpec, backend: str = "auto", **overrides) -> str:
    """The registered name for ``operator`` (registering it on first use), e.g. ``"kinterval-fwm-prob-k4"``.

    A non-default backend is part of the name: ``"kinterval-fwm-prob-k4@reference"``.
    """
    spec = OperatorSpec.parse(_parse(operator) if isinstance(operator, str) else operator, **overrides)
    name = f"{PREFIX}-{spec.full_name}" + ("" if backend == "auto" else f"@{backend}")
    return name if _REGISTRY.get(name) == (spec, backend) else _install(name, spec, backend)


def set_operator(operator: str | OperatorSpec, backend: str = "auto", **overrides) -> str:
    """Choose the operator behind the plain ``"kinterval"`` implementation (process-wide)."""
    return register(PREFIX, operator, backend, **overrides)


def set_config_operator(config: PretrainedConfig, operator: str | OperatorSpec) -> PretrainedConfig:
    """Set ``kinterval_operator`` (the operator of the plain ``"kinterval"`` name) on ``config`` and on every
    sub-config in it, and return ``config``.

    An attention module reads the config it holds: in a composite model (Llava, Gemma 3...) that is the
    text or vision sub-config, so an attribute set on the top-level config alone would be ignored.
    """
    if not isinstance(config, PretrainedConfig):
        raise ValueError(f"config must be a transformers PretrainedConfig, got {type(config).__name__}")
    if not isinstance(operator, (str, OperatorSpec)):
        raise ValueError(f"operator must be an operator name or OperatorSpec, got {type(operator).__name__}")
    name = (_parse(operator) if isinstance(operator, str) else operator).full_name  # the name is checked here
    todo, seen = [config], set()
    while todo:
        cfg = todo.pop()
        if id(cfg) in seen:
            continue
        seen.add(id(cfg))
        cfg.kinterval_operator = name
        # sub_configs names the nested configs (text_config, vision_config...); any other config-valued
        # attribute (get_text_config's sections among them) is walked as well
        subs = [getattr(cfg, key, None) for key in getattr(cfg, "sub_configs", {})] + list(vars(cfg).values())
        try:
            subs.append(cfg.get_text_config())
        except ValueError:  # several text configs: each is among the attributes above
            pass
        todo += [sub for sub in subs if isinstance(sub, PretrainedConfig)]
    return config


def get_operator(name: str = PREFIX) -> OperatorSpec:
    """The operator a registered implementation name computes."""
    if name not in _REGISTRY:
        raise ValueError(f"{name!r} is not a registered kinterval name; known: {registered_names()}")
    return _REGISTRY[name][0]


def register_all(ks: tuple[int, ...] = AUTO_K) -> list[str]:
    """Register ``"kinterval-<operator>"`` for the baselines and every family with K in ``ks``."""
    ops = list(BASELINES) + [f"{family}-k{k}" for family in _FAMILIES for k in ks]
    return [attn_implementation_name(op) for op in ops]


def registered_names() -> list[str]:
    """The ``attn_implementation`` names kinterval has registered with transformers, sorted: ``"kinterval"``,
    the ``"kinterval-<operator>"`` names registered on import and every name given to :func:`register`."""
    return sorted(_REGISTRY)


set_operator(DEFAULT_OPERATOR)
register_all()
