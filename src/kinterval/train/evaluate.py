"""Validation NLL (paper §4): non-overlapping T-token blocks, batch 1, the model's numerics with TF32 off.

Block ``k`` is ``x = tokens[kT:kT+T]``, ``y = tokens[kT+1:kT+T+1]``. This is the one evaluator: the demo uses
the block means, ``kinterval.eval`` the per-token values (document clusters, the τ screen).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from kinterval.data.loader import check_tokens, get_block, n_blocks
from kinterval.model.numerics import autocast, eval_precision

FLUSH = 256  # blocks whose per-token NLLs are copied to the host at once


def check_max_blocks(max_blocks) -> None:
    """``max_blocks`` of an evaluation: None (every block) or a positive integer."""
    if max_blocks is None:
        return
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 1:
        raise ValueError(f"max_blocks must be a positive integer (unset: every block), got {max_blocks!r}")


@torch.no_grad()
def token_nll(
    model: torch.nn.Module,
    tokens: np.ndarray,
    T: int,
    *,
    max_blocks: int | None = None,
    progress: bool = False,
    desc: str = "eval",
) -> np.ndarray:
    """Per-token next-token NLL (nats), float64 array of shape (n_blocks, T). ``desc``: the progress bar's
    label.

    Runs the model in eval mode on its own device with its numerics (autocast as in training, TF32 set to
    ``numerics.tf32_eval``) and restores the previous train/eval mode. ``tokens`` must be a 1-D integer
    array whose ids are below the model's vocabulary size (``ValueError`` otherwise).
    """
    check_max_blocks(max_blocks)
    check_tokens(tokens)
    numerics = model.config.numerics
    device = next(model.parameters()).device
    n = n_blocks(len(tokens), T) if max_blocks is None else min(max_blocks, n_blocks(len(tokens), T))
    if n == 0:
        raise ValueError(f"the split holds no block of {T}+1 tokens ({len(tokens)} tokens)")
    check_tokens(tokens, model.config.vocab_size, stop=n * T + 1)  # once, the ids the blocks read
    out = np.empty((n, T), dtype=np.float64)
    # the fp32 NLLs stay on the device and come back FLUSH blocks at a time: one host sync per FLUSH blocks,
    # not per block, so that the host queues the next blocks while the device runs (the same values)
    pending: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with eval_precision(numerics):
            for k in tqdm(range(n), desc=desc, unit="block", disable=not progress, leave=False):
                x, y = get_block(tokens, k, T)
                with autocast(numerics, device):
                    logits, _ = model(x[None].to(device))
                pending.append(F.cross_entropy(logits[0].float(), y.to(device), reduction="none"))
                if len(pending) == FLUSH or k == n - 1:
                    out[k + 1 - len(pending) : k + 1] = torch.stack(pending).double().cpu().numpy()
                    pending.clear()
    finally:
        model.train(was_training)
    return out


def evaluate_nll(model: torch.nn.Module, tokens: np.ndarray, T: int, **kw) -> np.ndarray:
    """Mean NLL of every block, float64 array of length ``n_blocks(len(tokens), T)``."""
    return token_nll(model, tokens, T, **kw).mean(axis=1)
