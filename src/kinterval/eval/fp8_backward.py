"""The native FP8 backward diagnostic (paper App. D.5): what PyTorch's own backward of the E4M3 cast does to
the first training update.

FP8-exp trains with the E4M3-rounded exponential in the forward and the fp32 exponential's derivative in the
backward (an identity surrogate for the rounding). Written as a plain cast ``exp(z).to(float8_e4m3fn)``,
autograd's backward of that cast casts the incoming gradient itself to E4M3: a gradient below 2^-10 becomes 0,
one above 448 saturates. On the configuration's initialization (its ``seed``) and the sequences of its first
training step, in training precision and unscaled, this module computes the gradient under both backward
designs and reports the L2 norm of the Q and K projection parameters' gradients (the paper: exactly 0 under
the native cast, 0.0485 under the fp32 backward, at 124M and seed 7).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

from kinterval.data.loader import SequenceSampler, TokenShards
from kinterval.eval.attention import attention_layers, patched_attention
from kinterval.model import GPT
from kinterval.model.numerics import autocast_applied, train_precision
from kinterval.ops.reference import normalize
from kinterval.train import distributed as D
from kinterval.train.config import TrainConfig
from kinterval.train.schedule import make_plan
from kinterval.train.trainer import accumulate_gradients, rank_offsets, seed_all

DESIGNS = ("fp32", "native")  # fp32: the exp derivative (training); native: autograd through the cast


def native_cast_probs(s: Tensor, valid: Tensor) -> Tensor:
    """FP8-exp probabilities whose backward is autograd's through ``.to(float8_e4m3fn)`` (the gradient of
    the weights cast to E4M3); the forward equals ``fp8-exp``'s. The row maximum stays on the tape."""
    M = torch.where(valid, s, torch.full_like(s, -math.inf)).amax(-1, keepdim=True)
    zero = torch.zeros_like(s)
    z = torch.where(valid, s - M, zero)
    w = torch.exp(z).to(torch.float8_e4m3fn).to(s.dtype)
    return normalize(torch.where(valid, w, zero))


def qk_gradient_norms(model: torch.nn.Module) -> dict:
    """L2 norms of the Q and K projection parameters' gradients (the q and k thirds of each layer's
    ``c_attn`` weight and bias), over all layers and per layer, and whether every gradient is finite."""
    per_layer = []
    for layer in attention_layers(model):
        C = layer.n_head * layer.head_dim
        Ck = layer.n_kv_head * layer.head_dim
        parts = {"q": slice(0, C), "k": slice(C, C + Ck)}
        row = {}
        for name, rows in parts.items():
            grads = [p.grad[rows] for p in (layer.c_attn.weight, layer.c_attn.bias) if p is not None]
            row[name] = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))
        per_layer.append(row)
    total = {n: math.sqrt(sum(r[n] ** 2 for r in per_layer)) for n in ("q", "k")}
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return {"q": total["q"], "k": total["k"], "qk": math.hypot(total["q"], total["k"]), "layers": per_layer,
            "finite": bool(finite)}  # fmt: skip


def fp8_backward_check(
    cfg: TrainConfig, micro_batches: int | None = None, device: str | torch.device | None = None
) -> dict:
    """The gradient of ``cfg``'s first training step at its initialization under both backward designs of
    FP8-exp (:data:`DESIGNS`), on ``device`` (None: the config's ``device``, as training takes it; "auto" is
    CUDA when available, where the training precision is bf16 autocast outside the fp32 attention).
    ``micro_batches`` keeps the step's first ones (None: all of them, as the paper's 128). Returns
    ``{"seed", "device", "device_type", "autocast", "attention_dtype", "tf32", "micro_batches", "sequences",
    "designs": {design: qk_gradient_norms}}`` (``tf32``: the config's ``numerics.tf32_train``).
    """
    cfg = cfg.override({"operator.name": "fp8-exp"}).validate()
    info = D.DistInfo(device=D.pick_device(cfg.device if device is None else device))
    shards = TokenShards(cfg.data.dir, "train", verify=cfg.data.verify)
    tokens = shards.tokens()
    model_cfg = cfg.model_config(shards.vocab_size)
    if model_cfg.attn_sinks:  # the instrumented attention has no sink column
        raise ValueError("fp8-backward: a model with attention sinks is not supported (model.attn_sinks)")
    plan = make_plan(cfg, 1)
    mb = cfg.schedule.micro_batch
    n_mb = cfg.schedule.accum if micro_batches is None else micro_batches
    if not 1 <= n_mb <= cfg.schedule.accum:
        raise ValueError(f"micro_batches must be in [1, {cfg.schedule.accum}] (the step's), got {n_mb}")
    offsets = rank_offsets(SequenceSampler(len(tokens), plan.block_size, cfg.seed), 0, plan.seqs_per_step, 0,
                           n_mb * mb)  # fmt: skip
    seed_all(cfg.seed)  # the initialization training makes from this seed
    model = GPT(model_cfg, "fp8-exp", "reference").to(info.device).train()
    num = model_cfg.numerics  # the training precision it runs in, recorded as the evaluations record theirs
    out = {"seed": cfg.seed, "device": str(info.device), "device_type": info.device.type,
           "autocast": autocast_applied(num, info.device), "attention_dtype": num.attention_dtype,
           "tf32": num.tf32_train, "micro_batches": n_mb, "sequences": len(offsets),
           "designs": {}}  # fmt: skip
    for design in DESIGNS:
        model.zero_grad(set_to_none=True)
        native = patched_attention(model, lambda idx, s, valid, q, k: native_cast_probs(s, valid))
        with train_precision(model_cfg.numerics), native if design == "native" else contextlib.nullcontext():
            accumulate_gradients(model, tokens, offsets, mb, plan.block_size, model_cfg.numerics, info.device,
                                 model_cfg.vocab_size)  # fmt: skip
        out["designs"][design] = qk_gradient_norms(model)
    return out
