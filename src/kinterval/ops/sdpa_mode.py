"""``replace_sdpa``: run any PyTorch model's ``F.scaled_dot_product_attention`` calls as an operator.

Models that call SDPA themselves (nanoGPT, timm, torchtitan, transformers' ``"sdpa"`` implementation) and
``nn.MultiheadAttention`` / ``nn.Transformer*`` layers (their ``need_weights=False`` path calls SDPA) need no
change: inside the ``with`` block every such call is :func:`~kinterval.ops.kinterval_attention` with the
operator, on the SDPA arguments it was given. Two routes reach it:

* ``torch.nn.functional.scaled_dot_product_attention`` itself names the operator while the block is open
  (process-wide), so a call through the module runs it also where no torch-function mode is active: in
  the backward pass, where activation checkpointing recomputes the forward, and in other threads;
* the block is a :class:`torch.overrides.TorchFunctionMode`, which catches the calls that bypass the module
  attribute: an alias imported before the block (``from torch.nn.functional import
  scaled_dot_product_attention``), in the forward pass of this thread.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from kinterval.graph_break import outside_graph
from kinterval.ops.api import kinterval_attention
from kinterval.ops.backends import BACKENDS
from kinterval.ops.spec import OperatorSpec, as_spec

_SDPA = torch._C._nn.scaled_dot_product_attention  # what the mode sees (F's attribute is swapped in blocks)
_MHA = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(_MHA)

# Every open block of the process, in order of entry: (its token, the function F's attribute names for it).
# Blocks may close out of order (generators, coroutines, threads), so each exit removes its own entry and F's
# attribute names the latest block still open, or, once none is, what it named before the first one opened.
_LOCK = threading.Lock()
_OPEN: list[tuple[object, object]] = []
_BEFORE: list[tuple[bool, object]] = []  # the MHA fast-path flag and F's SDPA before the first open block


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
    innermost operator wins (and counts the call). The module docstring says which calls are caught where;
    ``replace_sdpa(spec)`` also decorates a function.
    """

    def __init__(self, spec: OperatorSpec | str, backend: str = "auto"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.spec = as_spec(spec)
        self.backend = backend
        self.calls = 0
        self._tokens: list[object] = []  # one per open entry of this object
        self._warned_alias = False

    def __enter__(self):
        def scaled_dot_product_attention(*args, **kwargs):  # a new function per entry: torch.compile
            return self.attention(*args, **kwargs)  # guards on it, so each block recompiles for its spec

        token = object()
        with _LOCK:
            if not _OPEN:
                _BEFORE.append((torch.backends.mha.get_fastpath_enabled(), F.scaled_dot_product_attention))
            _OPEN.append((token, scaled_dot_product_attention))
            torch.backends.mha.set_fastpath_enabled(False)  # its fused kernel computes softmax, not via SDPA
            F.scaled_dot_product_attention = scaled_dot_product_attention
        self._tokens.append(token)
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        token = self._tokens.pop()  # (entries of one object are interchangeable: any of its tokens will do)
        with _LOCK:
            _OPEN[:] = [entry for entry in _OPEN if entry[0] is not token]
            if _OPEN:
                F.scaled_dot_product_attention = _OPEN[-1][1]
            else:
                fastpath, sdpa = _BEFORE.pop()
                torch.backends.mha.set_fastpath_enabled(fastpath)
                F.scaled_dot_product_attention = sdpa

    def __call__(self, fn):
        """As a decorator: ``fn`` runs inside the block."""

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:  # a call that bypassed torch.nn.functional's attribute (an alias bound earlier)
            # under autograd: grad enabled, or inputs that require grad under no_grad (the forward of
            # reentrant checkpointing, which recomputes it in the backward, likely outside the block)
            tracked = torch.is_grad_enabled() or any(isinstance(a, Tensor) and a.requires_grad for a in args)
            if not self._warned_alias and tracked:
                self._warned_alias = True
                warnings.warn(
                    "replace_sdpa caught an SDPA call that does not go through "
                    "torch.nn.functional.scaled_dot_product_attention (an alias imported earlier): it runs "
                    f"{self.spec.full_name} in this forward pass, but a recomputation in the backward pass "
                    "(activation checkpointing) would run plain SDPA: call F.scaled_dot_product_attention",
                    stacklevel=2,
                )
            return self.attention(*args, **kwargs)
        if func is _MHA:
            if _MHA_SIGNATURE.bind(*args, **kwargs).arguments.get("need_weights", True):
                raise ValueError(
                    f"nn.MultiheadAttention with need_weights=True computes softmax weights itself, so "
                    f"replace_sdpa cannot run {self.spec.full_name} in it: call it with need_weights=False"
                )
            if torch.compiler.is_compiling():
                # torch.compile would record the call as one opaque node, traced with the operator the
                # module attribute named then and kept for later blocks: it runs eagerly instead. Its body
                # looks the attribute up: the innermost open block's operator.
                return _run_eagerly(func, args, kwargs)
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
        _count(self)
        kw = dict(dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor) or x.dim() < 3:
                raise ValueError(f"{name} must be a tensor of at least 3 dims, got {getattr(x, 'shape', x)}")
        n = 2 if query.dim() == 3 else 3  # the trailing dims that are not batch: (L, E) or (H, L, E)
        if n == 3 and not enable_gqa:  # SDPA broadcasts a head dim of 1 too (multi-query without enable_gqa)
            try:
                torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
                n = 2
            except RuntimeError:
                pass  # other head counts: kinterval_attention says what they need (enable_gqa)
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
            to = (*lead, *q.shape[-3:-1], k.shape[-2])
            try:
                attn_mask = attn_mask.expand(*to).reshape(-1, *q.shape[-3:-1], k.shape[-2])
            except RuntimeError:
                shape = tuple(attn_mask.shape)
                raise ValueError(f"mask of shape {shape} does not broadcast to {to}") from None
        out = kinterval_attention(q, k, v, self.spec, attn_mask=attn_mask, backend=self.backend, **kw)
        return out.reshape(*lead, *out.shape[-3:])


@outside_graph
def _run_eagerly(func, args, kwargs):
    """``func(*args, **kwargs)`` outside torch.compile's graph (a graph break)."""
    return func(*args, **kwargs)


@outside_graph
def _count(mode: replace_sdpa) -> None:
    """``mode.calls += 1`` outside torch.compile's graph (a graph break): traced, the count would be a
    guard, and every call of a compiled model would recompile it (eager past torch's recompile limit)."""
    mode.calls += 1
