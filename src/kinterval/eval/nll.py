"""Per-document NLL (C4-style document-cluster evaluation) from the per-token NLL of
``kinterval.train.evaluate.token_nll`` over the paper's non-overlapping blocks."""

from __future__ import annotations

import numpy as np


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
