"""Validation NLL per block (paper §4): non-overlapping T-token blocks, batch 1, TF32 off."""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from kinterval.data.loader import get_block, n_blocks
from kinterval.model.numerics import autocast, eval_precision


@torch.no_grad()
def evaluate_nll(
    model: torch.nn.Module,
    tokens: np.ndarray,
    T: int,
    *,
    max_blocks: int | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Mean next-token NLL (nats) of every block ``k``: x = tokens[kT:kT+T], y = tokens[kT+1:kT+T+1].

    Runs the model in eval mode on its own device with the model's numerics (autocast as in training,
    TF32 set to ``numerics.tf32_eval``); returns a float64 array of length ``n_blocks(len(tokens), T)``.
    """
    numerics = model.config.numerics
    device = next(model.parameters()).device
    n = n_blocks(len(tokens), T) if max_blocks is None else min(max_blocks, n_blocks(len(tokens), T))
    out = np.empty(n, dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with eval_precision(numerics):
            for k in tqdm(range(n), desc="eval", disable=not progress, leave=False):
                x, y = get_block(tokens, k, T)
                with autocast(numerics, device):
                    _, loss = model(x[None].to(device), y[None].to(device))
                out[k] = loss.item()
    finally:
        model.train(was_training)
    return out
