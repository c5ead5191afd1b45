"""``replace_sdpa``: run any PyTorch model's ``F.scaled_dot_product_attention`` calls as an operator.

Models that call SDPA themselves (nanoGPT, timm, torchtitan, transformers' ``"sdpa"`` implementation) and
``nn.MultiheadAttention`` / ``nn.Transformer*`` layers (their ``need_weights=False`` path calls SDPA) need no
change: inside the ``with`` block every such call is :func:`~kinterval.ops.kinterval_attention` with the
operator, on the SDPA arguments it was given. It is a :class:`torch.overrides.TorchFunctionMode`, so it also
catches ``from torch.nn.functional import scaled_dot_product_attention`` imported before the block.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from kinterval.ops.api import kinterval_attention
from kinterval.ops.backends import BACKENDS
from kinterval.ops.spec import OperatorSpec, as_spec

_SDPA = torch._C._nn.scaled_dot_product_attention  # what the mode sees: _module_sdpa swaps F's name briefly
_MHA = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(_MHA)


class replace_sdpa(TorchFunctionMode):  # noqa: N801 - used as a context manager, named as one
    """Inside ``with replace_sdpa(spec):`` every ``F.scaled_dot_product_attention`` call runs
    ``kinterval_attention(q, k, v, spec, attn_mask=, dropout_p=, is_causal=, scale=, enable_gqa=,
    backend=)`` (SDPA's meaning for every argument; docs/operators.md). ``calls`` counts them: a model that
    computes attention another way (its own softmax) leaves it at 0, so check it.

    q, k, v of 3 dims (N, L, E) run as one head, and more than 4 dims flatten the leading ones into the
    batch, as SDPA accepts them. ``nn.MultiheadAttention`` is caught on its SDPA path: PyTorch's fused
    inference fast path (which bypasses SDPA) is switched off inside the block, and a call with
    ``need_weights=True`` (the default of ``nn.MultiheadAttention.forward``, which forms softmax weights
    itself) is a ``ValueError``: pass ``need_weights=False``, as ``nn.TransformerEncoderLayer`` and
    torchvision's ViT do. Under torch.compile that call runs eagerly (a graph break). In nested blocks the
    innermost operator wins.
    """

    def __init__(self, spec: OperatorSpec | str, backend: str = "auto"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.spec = as_spec(spec)
        self.backend = backend
        self.calls = 0
        self._fastpath: list[bool] = []

    def __enter__(self):
        self._fastpath.append(torch.backends.mha.get_fastpath_enabled())
        torch.backends.mha.set_fastpath_enabled(False)  # its fused kernel computes softmax, not via SDPA
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.backends.mha.set_fastpath_enabled(self._fastpath.pop())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.attention(*args, **kwargs)
        if func is _MHA:
            if _MHA_SIGNATURE.bind(*args, **kwargs).arguments.get("need_weights", True):
                raise ValueError(
                    f"nn.MultiheadAttention with need_weights=True computes softmax weights itself, so "
                    f"replace_sdpa cannot run {self.spec.full_name} in it: call it with need_weights=False"
                )
            if torch.compiler.is_compiling():
                # torch.compile would record the call as one opaque node, traced with whatever operator the
                # module global named then (or SDPA itself) and kept for later blocks: it runs eagerly instead
                return _run_eagerly(self.attention, func, args, kwargs)
            # The body runs with this mode popped (torch's rule for handlers): its SDPA call, a lookup of
            # the module global, is pointed at the operator for the duration of the call.
            with _module_sdpa(self.attention):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def attention(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """One SDPA call, as the operator (SDPA's signature)."""
        self.calls += 1
        kw = dict(dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor) or x.dim() < 3:
                raise ValueError(f"{name} must be a tensor of at least 3 dims, got {getattr(x, 'shape', x)}")
        n = 2 if query.dim() == 3 else 3  # the trailing dims that are not batch: (L, E) or (H, L, E)
        try:  # SDPA broadcasts the batch dims of q, k and v
            if not query.dim() == key.dim() == value.dim():
                raise RuntimeError
            lead = torch.broadcast_shapes(query.shape[:-n], key.shape[:-n], value.shape[:-n])
        except RuntimeError:
            raise ValueError(
                f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} need "
                "the same number of dims and batch dims that broadcast"
            ) from None
        query, key, value = (x.expand(*lead, *x.shape[-n:]) for x in (query, key, value))
        if query.dim() == 4:
            return kinterval_attention(
                query, key, value, self.spec, attn_mask=attn_mask, backend=self.backend, **kw
            )
        if query.dim() == 3:  # (N, L, E): one head
            if attn_mask is not None and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(-3)
            q, k, v = (x.unsqueeze(-3) for x in (query, key, value))
            out = kinterval_attention(q, k, v, self.spec, attn_mask=attn_mask, backend=self.backend, **kw)
            return out.squeeze(-3)
        lead = query.shape[:-3]  # (N, ..., H, L, E): the leading dims into the batch
        q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (query, key, value))
        if attn_mask is not None:
            attn_mask = attn_mask.expand(*lead, *q.shape[-3:-1], k.shape[-2]).reshape(
                -1, *q.shape[-3:-1], k.shape[-2]
            )
        out = kinterval_attention(q, k, v, self.spec, attn_mask=attn_mask, backend=self.backend, **kw)
        return out.reshape(*lead, *out.shape[-3:])


@contextlib.contextmanager
def _module_sdpa(fn) -> Iterator[None]:
    """torch.nn.functional's ``scaled_dot_product_attention`` names ``fn`` inside, unless an inner block's
    handler (running first, with its mode popped) already points it at its own operator: that one wins."""
    before = F.scaled_dot_product_attention
    if getattr(before, "__func__", None) is replace_sdpa.attention:
        yield
        return
    F.scaled_dot_product_attention = fn
    try:
        yield
    finally:
        F.scaled_dot_product_attention = before


@torch.compiler.disable
def _run_eagerly(fn, func, args, kwargs):
    """``func(*args, **kwargs)`` with SDPA as ``fn``, outside torch.compile's graph (a graph break)."""
    with _module_sdpa(fn):
        return func(*args, **kwargs)
