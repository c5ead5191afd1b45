"""GPT-2 (nanoGPT style) whose attention probabilities come from a pluggable operator.

Learned positions, pre-LayerNorm blocks, GELU MLP, tied input/output embeddings; the attention options of
:class:`~kinterval.model.config.ModelConfig` (grouped-query heads, softcap, sinks, rotary positions) are off
by default. The only difference between a softmax run and a K-interval run is the ``operator`` given to
:class:`CausalSelfAttention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from kinterval.graph_break import outside_graph
from kinterval.model.config import ModelConfig
from kinterval.model.numerics import attention_inputs, autocast_off
from kinterval.ops import BACKENDS, OperatorSpec, kinterval_attention, resolve_backend

SDPA = "sdpa"  # PyTorch's fused softmax attention, the reference baseline for speed and correctness
ATTENTION_BACKENDS = BACKENDS  # "auto" = kinterval.ops.resolve_backend


def parse_operator(operator: str | OperatorSpec) -> OperatorSpec | str:
    """``"sdpa"`` or an :class:`OperatorSpec` (names accept ``OperatorSpec.full_name`` overrides)."""
    if isinstance(operator, OperatorSpec):
        return operator
    if isinstance(operator, str) and operator.strip().lower() == SDPA:
        return SDPA
    if not isinstance(operator, str):
        raise ValueError(f"operator must be a name or an OperatorSpec, got {type(operator).__name__}")
    return OperatorSpec.from_full_name(operator)


def operator_name(operator: str | OperatorSpec) -> str:
    op = parse_operator(operator)
    return op if op == SDPA else op.full_name


def safe_operator(operator: str | OperatorSpec) -> str:
    """The file-system-safe form of :func:`operator_name` (run ids, eval tags, probe folders), so that one
    operator however it is written has one folder: ``lerp-k32[range_grad=detach]`` ->
    ``lerp-k32.range_grad-detach``."""
    base, _, extra = operator_name(operator).partition("[")
    return ".".join([base, *[p.replace("=", "-") for p in extra.rstrip("]").split(",") if p]])


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (RoFormer; the half-split pairing of Llama and transformers): channel i and
    i + D/2 of position t turn by the angle t * theta^(-2i/D). Computed in fp32 at least (float64 stays)."""
    T, D = x.shape[-2], x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    inv_freq = theta ** -(torch.arange(0, D, 2, device=x.device, dtype=torch.float64) / D)
    angle = torch.outer(torch.arange(T, device=x.device, dtype=torch.float64), inv_freq)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@outside_graph
def _operator_attention(q, k, v, operator: OperatorSpec, backend: str, options: dict) -> torch.Tensor:
    """The K-interval operator, always eager: under :func:`compile_blocks` torch.compile stops here (a graph
    break), so that the operator's numerics are those of its backend, compiled model or not."""
    return kinterval_attention(q, k, v, operator, causal=True, backend=backend, **options)


class CausalSelfAttention(nn.Module):
    """Causal self-attention: ``c_attn`` projects to q (``n_head`` heads), then k and v (``n_kv_head`` heads
    each, grouped-query attention when fewer); ``sinks`` (n_head,) are the learned sink logits when
    ``config.attn_sinks`` is set (zero at init), ``softcap`` the score softcap (None: none)."""

    def __init__(self, config: ModelConfig, operator: str | OperatorSpec = "softmax", backend: str = "auto"):
        super().__init__()
        config.validate()  # built on its own too, not only through GPT: a bad rope_theta errs, not NaN
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim = config.n_embd // config.n_head
        kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.softcap = config.attn_softcap
        self.rope_theta = config.rope_theta
        self.sinks = nn.Parameter(torch.zeros(config.n_head)) if config.attn_sinks else None
        self.operator = parse_operator(operator)
        if self.operator == SDPA and (self.softcap is not None or self.sinks is not None):
            raise ValueError(
                "operator 'sdpa' (PyTorch's softmax attention) takes no attn_softcap or attn_sinks: use the "
                "operator 'softmax', which applies them"
            )
        self.attention_dtype = config.numerics.attention_dtype  # "float32" (paper §4) or "bfloat16"
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {ATTENTION_BACKENDS}")
        self.backend = backend

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, n_head, T, D), k and v (B, n_kv_head, T, D) of the input ``x`` (B, T, C); with
        ``rope_theta`` q and k are rotated (:func:`rotary`, fp32)."""
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split((C, kv_dim, kv_dim), dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2) for t in (k, v))
        if self.rope_theta is not None:
            q, k = rotary(q, self.rope_theta), rotary(k, self.rope_theta)
        return q, k, v

    def options(self) -> dict:
        """The keywords of :func:`kinterval_attention` for the options that are set (none for GPT-2)."""
        opts = {"enable_gqa": True} if self.n_kv_head != self.n_head else {}
        opts.update({k: v for k, v in (("softcap", self.softcap), ("sinks", self.sinks)) if v is not None})
        return opts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.heads(x)
        # Attention runs outside autocast on inputs of numerics.attention_dtype (model/numerics.py).
        with autocast_off(x.device.type):
            q, k, v = attention_inputs(self.attention_dtype, q, k, v, native=True)
            if self.operator == SDPA:  # with bf16 inputs: SDPA's flash kernel on a GPU
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **self.options())
            else:  # "auto": the fastest backend that supports the operator on this device and dtype
                options = self.options()
                # the score modifications by backends.SCORE_MODS name, passed only when there are some (a
                # GPT-2 layer calls the ops exactly as before the options existed)
                mods = tuple(n for n in ("softcap", "sinks") if n in options)
                backend = resolve_backend(
                    self.operator,
                    x.device,
                    q.dtype,
                    backend=self.backend,
                    **({"score_mod": mods} if mods else {}),
                )
                if q.dtype == torch.bfloat16 and backend != "triton":
                    # Only the fused kernel takes bf16 itself (fp32 maths inside, a bf16 output). The others
                    # compute in fp32 too but return their input's dtype: given the rounded values as fp32
                    # tensors, their output stays fp32 up to c_proj.
                    q, k, v = q.float(), k.float(), v.float()
                y = _operator_attention(q, k, v, self.operator, backend, options)
        return self.c_proj(y.to(x.dtype).transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, operator: str | OperatorSpec, backend: str):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, operator, backend)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``GPT(config, operator="fwm-prob-k4", backend="auto")``; ``forward(idx, targets=None)`` returns
    ``(logits, loss)`` with the loss the mean token cross-entropy (None without targets); ``last_only=True``
    returns the last position's logits alone (sampling). ``idx`` holds int64
    or int32 ids in ``[0, vocab_size)``, and so do ``targets`` (no ignore index; at least one token); an id
    outside is a ``ValueError`` (off CUDA, where the check costs no host sync in the training loop; on CUDA an
    id beyond the padded table is torch's device-side assert)."""

    def __init__(self, config: ModelConfig, operator: str | OperatorSpec = "softmax", backend: str = "auto"):
        super().__init__()
        config.validate()
        self.config = config
        self.operator = operator_name(operator)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                **(
                    {}
                    if config.rope_theta is not None
                    else {"wpe": nn.Embedding(config.block_size, config.n_embd)}
                ),
                h=nn.ModuleList([Block(config, operator, backend) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.activation_checkpointing = False  # True: each block recomputed in the backward (less memory)
        self.lm_head.weight = self.transformer.wte.weight  # tied embeddings
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _apply(self, fn, recurse=True):
        # to_empty (after building under torch.device("meta")) gives each module its own new parameter: the
        # two ends of the tied embedding would come back as two matrices, trained apart. Tied again here.
        tied = self.lm_head.weight is self.transformer.wte.weight
        out = super()._apply(fn, recurse)
        if tied and self.lm_head.weight is not self.transformer.wte.weight:
            self.lm_head.weight = self.transformer.wte.weight
        return out

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_backend(self, backend: str) -> None:
        """Switch the operator backend of every layer (no parameters change)."""
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {ATTENTION_BACKENDS}")
        for block in self.transformer.h:
            block.attn.backend = backend

    def num_params(self, include_positions: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weight counted once
        if include_positions or "wpe" not in self.transformer:  # rotary positions: no table
            return n
        return n - self.transformer.wpe.weight.numel()

    def _check_ids(self, what: str, ids: torch.Tensor) -> None:
        """Ids outside [0, vocab_size) are a ValueError; ids up to the padded table would embed (or be scored)
        silently. Off CUDA only: there the check would cost a host sync per training step."""
        if ids.device.type in ("cuda", "meta") or not ids.numel():  # meta: no values to check
            return
        lo, hi = ids.aminmax()
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(
                f"{what} must lie in [0, vocab_size={self.config.vocab_size}), got ids from {int(lo)} to "
                f"{int(hi)}"
            )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, last_only: bool = False):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            got = f"{tuple(idx.shape)} {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"idx must be a 2-d integer tensor of token ids (B, T), int64/int32, got {got}")
        self._check_ids("token ids", idx)
        if targets is not None:
            if last_only:
                raise ValueError("last_only gives the last position's logits: it takes no targets")
            if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
                got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
                raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {got}")
            if targets.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"targets must be int64/int32 token ids, got {targets.dtype}")
            if not targets.numel():  # the mean over no tokens is NaN
                raise ValueError(
                    f"targets of shape {tuple(targets.shape)} hold no token: the loss is undefined"
                )
            self._check_ids("targets", targets)  # no ignore index: every target is a token
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # learned positions (GPT-2); rotary ones turn q and k in each layer
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        for block in self.transformer.h:
            if self.activation_checkpointing and torch.is_grad_enabled():
                # keep only the block's input; its activations are recomputed in the backward (same values)
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.transformer.ln_f(x)
        if last_only:  # sampling: the next-token logits alone, (B, 1, vocab), not a (B, T, vocab) tensor
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if self.config.padded_vocab_size != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # the padding rows never get probability
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1).long())
        return logits, loss


def compile_blocks(model: GPT) -> None:
    """``torch.compile`` each transformer block in place (``nn.Module.compile``: parameter names and state
    dicts are unchanged, so checkpoints of compiled and eager runs are interchangeable). Inductor fuses the
    LayerNorms, the MLP's GELU and the residual adds; SDPA is traced, while a K-interval operator runs
    eagerly between two compiled graphs (:func:`_operator_attention`). Blocks, not the whole model, as
    torchtitan does: each block is also FSDP2's unit. Compilation happens at the first forward."""
    for block in model.transformer.h:
        block.compile()
