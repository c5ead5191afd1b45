"""Per-block (and per-document) NLL over a token split: paper §4 "Evaluation".

Block ``k`` is ``x = data[kT:kT+T]``, ``y = data[kT+1:kT+T+1]`` (non-overlapping), batch 1, the model's own
numerics (bf16 autocast outside attention on CUDA, fp32 attention) with TF32 off.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from kinterval.data.loader import get_block, n_blocks
from kinterval.model import autocast, eval_precision


@torch.no_grad()
def token_nll(
    model: torch.nn.Module,
    tokens: np.ndarray,
    T: int,
    *,
    max_blocks: int | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Per-token NLL (nats), float64 array of shape (n_blocks, T)."""
    numerics = model.config.numerics
    device = next(model.parameters()).device
    n = n_blocks(len(tokens), T)
    n = n if max_blocks is None else min(n, max_blocks)
    if n == 0:
        raise ValueError(f"the split holds no block of {T}+1 tokens ({len(tokens)} tokens)")
    out = np.empty((n, T), dtype=np.float64)
    model.eval()
    with eval_precision(numerics):
        for k in tqdm(range(n), desc="eval", disable=not progress, leave=False):
            x, y = get_block(tokens, k, T)
            with autocast(numerics, device):
                logits, _ = model(x[None].to(device))
            out[k] = F.cross_entropy(logits[0].float(), y.to(device), reduction="none").double().cpu().numpy()
    return out


def document_ids(tokens: np.ndarray, eot: int, n: int, T: int) -> np.ndarray:
    """Document index of every target ``y`` of the first ``n`` blocks (documents end with ``eot``).

    Target ``data[p]`` belongs to the document that contains it; an EOT belongs to the document it ends.
    """
    seg = np.asarray(tokens[: n * T + 1])
    before = np.concatenate(([0], np.cumsum(seg == eot)))  # EOTs strictly before position p
    return before[1 : n * T + 1].reshape(n, T)


def per_document(nll: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc ids, summed NLL, token counts) per document over the evaluated targets."""
    ids, inv = np.unique(doc.ravel(), return_inverse=True)
    return ids, np.bincount(inv, weights=nll.ravel()), np.bincount(inv).astype(np.float64)
