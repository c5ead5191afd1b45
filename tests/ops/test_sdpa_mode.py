"""replace_sdpa: a model's own F.scaled_dot_product_attention calls (and nn.MultiheadAttention's) run as the
operator inside the block, with SDPA's arguments; checked in float64 against kinterval_attention called
directly, and, with the softmax spec, against the model without the block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as imported_sdpa

from kinterval.ops import kinterval_attention, replace_sdpa


class TinyGPT(torch.nn.Module):
    """nanoGPT's attention: one c_attn, heads split, F.scaled_dot_product_attention(is_causal=True)."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_models_sdpa_calls_run_the_operator_and_only_inside_the_block():
    torch.manual_seed(0)
    model = TinyGPT().double()
    x = _x(2, 7, 16).requires_grad_()
    plain = model(x)
    with replace_sdpa("fwm-prob-k4") as mode:
        got = model(x)
    assert mode.calls == 1
    B, T, C = x.shape
    q, k, v = (t.view(B, T, 4, -1).transpose(1, 2) for t in model.c_attn(x).split(C, 2))
    y = kinterval_attention(q, k, v, "fwm-prob-k4", is_causal=True)
    want = model.c_proj(y.transpose(1, 2).reshape(B, T, C))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g1 = torch.autograd.grad(got.sum(), (x, *model.parameters()))
    g2 = torch.autograd.grad(want.sum(), (x, *model.parameters()))
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(got, plain, atol=1e-4)
    torch.testing.assert_close(model(x), plain, rtol=0, atol=0)  # SDPA again after the block


def test_every_sdpa_argument_keeps_its_meaning():
    """Positional and keyword calls, an alias imported before the block, masks (boolean, float bias),
    is_causal, scale, dropout, grouped-query heads; with softmax, SDPA's result to float64 rounding."""
    q, k, v = _x(2, 4, 5, 8), _x(2, 2, 7, 8, seed=1), _x(2, 2, 7, 8, seed=2)
    bias = _x(1, 4, 5, 7, seed=3)
    keep = _x(2, 1, 5, 7, seed=4) > -0.5
    calls = [
        ((q, k, v), dict(enable_gqa=True)),
        ((q, k, v, bias), dict(enable_gqa=True)),
        ((q, k, v), dict(attn_mask=keep, scale=0.3, enable_gqa=True)),
        ((q, k, v, None, 0.0, True), dict(enable_gqa=True)),  # SDPA's positional arguments
    ]
    for args, kw in calls:
        with replace_sdpa("softmax") as mode, torch.no_grad():
            got, alias = F.scaled_dot_product_attention(*args, **kw), imported_sdpa(*args, **kw)
        assert mode.calls == 2
        want = F.scaled_dot_product_attention(*args, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
        torch.testing.assert_close(alias, got, rtol=0, atol=0)
    torch.manual_seed(5)
    with replace_sdpa("lerp-k4"):
        dropped = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, enable_gqa=True)
    torch.manual_seed(5)
    torch.testing.assert_close(
        dropped, kinterval_attention(q, k, v, "lerp-k4", dropout_p=0.5, enable_gqa=True)
    )


@pytest.mark.parametrize("dims", [3, 5])
def test_three_and_five_dimensional_inputs(dims):
    """SDPA takes (N, L, E) and (N, ..., H, L, E): one head, and the leading dims as the batch."""
    shape = (4, 5, 8) if dims == 3 else (2, 3, 2, 5, 8)
    q, k, v = _x(*shape), _x(*shape, seed=1), _x(*shape, seed=2)
    mask = _x(*shape[:-2], 5, 5, seed=3) if dims == 3 else _x(5, 5, seed=3) > -1
    with replace_sdpa("softmax"):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=0, atol=1e-14
    )
    with replace_sdpa("minmax-weight-k4"):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    flat = (x.reshape(-1, 1 if dims == 3 else 2, 5, 8) for x in (q, k, v))
    fmask = mask.unsqueeze(1) if dims == 3 else mask
    want = kinterval_attention(*flat, "minmax-weight-k4", attn_mask=fmask).reshape(got.shape)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_multihead_attention_and_transformer_layers():
    """nn.TransformerEncoderLayer calls nn.MultiheadAttention with need_weights=False, whose body calls SDPA;
    its fused inference fast path (which bypasses SDPA) is off inside the block and restored after it.
    need_weights=True forms softmax weights itself: a ValueError, never a quiet softmax."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        16, 4, dim_feedforward=32, batch_first=True, dropout=0.0
    ).double()
    x = _x(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    for training in (True, False):
        layer.train(training)
        with torch.no_grad():
            plain = layer(x, src_key_padding_mask=pad)
            with replace_sdpa("softmax") as mode:
                got = layer(x, src_key_padding_mask=pad)
            assert mode.calls == 1
            torch.testing.assert_close(got[~pad], plain[~pad], rtol=0, atol=1e-14)
            with replace_sdpa("lerp-k4") as mode:
                assert not torch.allclose(layer(x, src_key_padding_mask=pad)[~pad], plain[~pad], atol=1e-4)
    assert torch.backends.mha.get_fastpath_enabled()
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with pytest.raises(ValueError, match="need_weights=True computes softmax weights itself"):
        with replace_sdpa("fwm-prob-k4"):
            mha(x, x, x)
    assert torch.backends.mha.get_fastpath_enabled()  # restored after the error too
    assert F.scaled_dot_product_attention is imported_sdpa


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend"):
        replace_sdpa("lerp-k4", backend="cuda")
    with pytest.raises(ValueError, match="unknown operator|not a known|unknown"):
        replace_sdpa("lerp-kx")
    with replace_sdpa("lerp-k4"), pytest.raises(ValueError, match="at least 3 dims"):
        F.scaled_dot_product_attention(torch.zeros(5, 8), torch.zeros(5, 8), torch.zeros(5, 8))


def _mha_pair(spec):
    """An nn.MultiheadAttention output inside ``replace_sdpa(spec)`` (need_weights=False), with the module."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).double().eval()
    x = _x(2, 6, 16)
    with torch.no_grad(), replace_sdpa(spec) as mode:
        out = mha(x, x, x, need_weights=False)[0]
    assert mode.calls == 1
    return mha, x, out


def test_nested_blocks_the_inner_spec_wins_also_in_multihead_attention():
    mha, x, want = _mha_pair("lerp-k4")
    q, k, v = _x(2, 4, 5, 8), _x(2, 4, 5, 8, seed=1), _x(2, 4, 5, 8, seed=2)
    with torch.no_grad(), replace_sdpa("softmax") as outer:
        with replace_sdpa("lerp-k4") as inner:
            got = mha(x, x, x, need_weights=False)[0]
            plain = F.scaled_dot_product_attention(q, k, v)
        after_inner = F.scaled_dot_product_attention(q, k, v)
    assert (inner.calls, outer.calls) == (2, 1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(plain, kinterval_attention(q, k, v, "lerp-k4"), rtol=0, atol=0)
    torch.testing.assert_close(after_inner, kinterval_attention(q, k, v, "softmax"), rtol=0, atol=0)
    assert F.scaled_dot_product_attention is imported_sdpa


def test_compiled_multihead_attention_runs_the_operator_inside_the_block_only():
    """torch.compile traces the block's MHA call: the operator inside, SDPA again after the block."""
    mha, x, want = _mha_pair("lerp-k4")
    with torch.no_grad():
        plain = mha(x, x, x, need_weights=False)[0]
        compiled = torch.compile(lambda x: mha(x, x, x, need_weights=False)[0], backend="aot_eager")
        with replace_sdpa("lerp-k4") as mode:
            got = compiled(x)
        assert mode.calls == 1
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(compiled(x), plain, rtol=0, atol=1e-14)  # compiled: float64 rounding
        for spec in ("softmax", "lerp-k4"):  # a later block's operator, not the one traced first
            with replace_sdpa(spec) as mode:
                got = compiled(x)
            assert mode.calls == 1
            torch.testing.assert_close(got, _mha_pair(spec)[2], rtol=0, atol=0)


def test_batch_dims_broadcast_as_in_sdpa():
    """SDPA broadcasts q's and k/v's batch dims (a k/v batch of 1 serves every query batch); a shape that
    does not broadcast is a ValueError naming the three shapes."""
    q, k, v = _x(2, 4, 5, 8), _x(1, 4, 7, 8, seed=1), _x(1, 4, 7, 8, seed=2)
    with replace_sdpa("softmax"):
        got = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-14)
    with replace_sdpa("lerp-k4"):
        got = F.scaled_dot_product_attention(q, k, v)
    want = kinterval_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), "lerp-k4")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with replace_sdpa("lerp-k4"), pytest.raises(ValueError, match="batch dims that broadcast"):
        F.scaled_dot_product_attention(q, _x(3, 4, 7, 8), _x(3, 4, 7, 8))
    with replace_sdpa("lerp-k4"), pytest.raises(ValueError, match="the same number of dims"):
        F.scaled_dot_product_attention(q, k[0], v[0])


def test_a_head_dim_of_one_broadcasts_as_in_sdpa():
    """SDPA broadcasts a head dim of 1 like a batch dim (multi-query written without enable_gqa): inside the
    block it was a ValueError whose hint (enable_gqa) could not work for 1 query head and 4 k/v heads. A bad
    mask on 5-d inputs was a RuntimeError from inside expand; now the ValueError of 4-d inputs."""
    for qs, ks in (
        ((2, 1, 5, 8), (2, 4, 6, 8)),
        ((1, 4, 5, 8), (2, 1, 6, 8)),
        ((2, 3, 1, 5, 8), (2, 3, 4, 6, 8)),
    ):
        q, k, v = _x(*qs), _x(*ks, seed=1), _x(*ks, seed=2)
        with replace_sdpa("softmax"):
            got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    with replace_sdpa("lerp-k4"), pytest.raises(ValueError, match="enable_gqa"):  # 4 q heads, 2 k/v heads
        F.scaled_dot_product_attention(_x(2, 4, 5, 8), _x(2, 2, 5, 8), _x(2, 2, 5, 8))
    q = _x(2, 3, 2, 4, 8)
    with (
        replace_sdpa("lerp-k4"),
        pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not broadcast"),
    ):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 5, dtype=torch.bool))


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_recomputes_with_the_operator(reentrant):
    """Checkpointing recomputes the forward in the backward pass, where torch-function modes are not active:
    it ran plain SDPA there (reentrant: silently mixed gradients; non-reentrant: a CheckpointError). The
    module attribute names the operator while the block is open, so the recomputation runs it too."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = TinyGPT().double()
    x = _x(2, 7, 16).requires_grad_()
    params = (x, *model.parameters())

    def grads(out):
        for p in params:
            p.grad = None
        out.pow(2).sum().backward()  # reentrant checkpointing takes .backward(), not autograd.grad
        return [p.grad.clone() for p in params]

    with replace_sdpa("fwm-prob-k4") as mode:
        want = grads(model(x))
        got = grads(checkpoint(model, x, use_reentrant=reentrant))
    assert mode.calls == 3  # the plain forward, the checkpointed one and its recomputation
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_alias_bound_before_the_block_runs_the_operator_and_warns_about_checkpointing():
    q = _x(1, 2, 5, 8).requires_grad_()
    with replace_sdpa("lerp-k4") as mode, pytest.warns(UserWarning, match="alias imported earlier"):
        got = imported_sdpa(q, q, q)
    assert mode.calls == 1
    torch.testing.assert_close(got, kinterval_attention(q, q, q, "lerp-k4"), rtol=0, atol=0)


def test_other_threads_and_decorator_use():
    """Calls through the module attribute from another thread (nn.DataParallel's replicas) run the operator
    while the block is open; replace_sdpa(spec) also decorates a function."""
    import threading

    q = _x(1, 2, 5, 8)
    out = {}
    with replace_sdpa("minmax-weight-k4") as mode:
        worker = threading.Thread(target=lambda: out.setdefault("y", F.scaled_dot_product_attention(q, q, q)))
        worker.start()
        worker.join()
    assert mode.calls == 1
    torch.testing.assert_close(out["y"], kinterval_attention(q, q, q, "minmax-weight-k4"), rtol=0, atol=0)

    mode = replace_sdpa("lerp-k4")

    @mode
    def attend(x):
        return F.scaled_dot_product_attention(x, x, x)

    torch.testing.assert_close(attend(q), kinterval_attention(q, q, q, "lerp-k4"), rtol=0, atol=0)
    assert mode.calls == 1 and F.scaled_dot_product_attention is imported_sdpa


def test_compiled_sdpa_calls_follow_each_block():
    """A function compiled once gives each block's operator, and SDPA after the blocks."""
    q, k, v = _x(2, 2, 5, 8), _x(2, 2, 5, 8, seed=1), _x(2, 2, 5, 8, seed=2)
    f = torch.compile(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), backend="aot_eager"
    )
    for spec in ("lerp-k4", "fwm-prob-k4", "lerp-k4"):
        with replace_sdpa(spec):
            got = f(q, k, v)
        want = kinterval_attention(q, k, v, spec, is_causal=True)  # the operators differ by ~1e-2
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)  # aot_eager's decompositions: rounding
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(f(q, k, v), want, rtol=0, atol=1e-15)


def test_blocks_that_close_out_of_order_restore_sdpa_and_the_fast_path():
    """A generator's block closed inside a later block, and blocks of two threads (or coroutines) that close
    in the order they opened: F's attribute names the operator of a block still open, and SDPA with the
    fast path as it was once every block is closed (each exit used to restore what its own entry saw)."""
    import threading

    q = _x(1, 2, 5, 8)

    def gen():
        with replace_sdpa("lerp-k4"):
            yield

    opened = gen()
    next(opened)
    with replace_sdpa("minmax-weight-k4"):
        next(opened, None)  # the generator's block closes first
        torch.testing.assert_close(
            F.scaled_dot_product_attention(q, q, q), kinterval_attention(q, q, q, "minmax-weight-k4")
        )
    assert F.scaled_dot_product_attention is imported_sdpa and torch.backends.mha.get_fastpath_enabled()

    first_open, second_open, first_closed = threading.Event(), threading.Event(), threading.Event()

    def first():
        with replace_sdpa("lerp-k4"):
            first_open.set()
            second_open.wait()
        first_closed.set()

    def second():
        first_open.wait()
        with replace_sdpa("minmax-weight-k4"):
            second_open.set()
            first_closed.wait()
            second.got = F.scaled_dot_product_attention(q, q, q)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(second.got, kinterval_attention(q, q, q, "minmax-weight-k4"), rtol=0, atol=0)
    assert F.scaled_dot_product_attention is imported_sdpa and torch.backends.mha.get_fastpath_enabled()


def test_compiled_calls_in_one_block_compile_once():
    """Known: torch.compile guards on the call count, so every call of a compiled model in one block
    recompiles, and past torch's recompile limit (8) the model runs eagerly."""
    from torch._dynamo.utils import counters

    q = _x(2, 2, 5, 8)
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), backend="eager")
    with replace_sdpa("lerp-k4") as mode:
        for _ in range(10):
            got = f(q)
    assert counters["stats"]["unique_graphs"] == 1
    assert mode.calls == 10
    torch.testing.assert_close(got, kinterval_attention(q, q, q, "lerp-k4", is_causal=True), rtol=0, atol=0)


def test_three_nested_blocks_the_innermost_open_one_wins():
    """With three blocks open, the innermost closing hands SDPA to the middle one, not to the outermost."""
    q = _x(1, 2, 5, 8)
    with replace_sdpa("softmax") as outer, replace_sdpa("lerp-k4") as middle:
        with replace_sdpa("minmax-weight-k4") as inner:
            F.scaled_dot_product_attention(q, q, q)
        got = F.scaled_dot_product_attention(q, q, q)
    assert (outer.calls, middle.calls, inner.calls) == (0, 1, 1)
    torch.testing.assert_close(got, kinterval_attention(q, q, q, "lerp-k4"), rtol=0, atol=0)
    assert F.scaled_dot_product_attention is imported_sdpa


def test_an_inference_layer_in_another_thread_runs_the_operator():
    """The torch-function mode is this thread's; in another thread (nn.DataParallel's replicas) an eval-mode
    nn.TransformerEncoderLayer under no_grad would take PyTorch's fused fast path, which computes softmax
    without calling SDPA: the block switches the fast path off, so the layer's SDPA call runs the operator
    there too, as in this thread."""
    import threading

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 6, 16)
    out = {}

    def other():
        with torch.no_grad():
            out["y"] = layer(x)

    with torch.no_grad(), replace_sdpa("lerp-k4") as mode:
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert mode.calls == 1
        want = layer(x)  # this thread: the mode catches the call
    assert mode.calls == 2
    torch.testing.assert_close(out["y"], want, rtol=0, atol=0)
    with torch.no_grad():
        assert not torch.allclose(layer(x), want, atol=1e-4)  # softmax: not the operator's result


def test_the_alias_warning_comes_once_and_only_where_a_backward_may_recompute():
    """The warning about an alias bound before the block (activation checkpointing would recompute plain
    SDPA) is given once per block object, and not under no_grad (no backward pass)."""
    import warnings

    q = _x(1, 2, 5, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with replace_sdpa("lerp-k4") as mode:
            with torch.no_grad():
                imported_sdpa(q, q, q)
            assert not seen
            for _ in range(3):
                imported_sdpa(q.requires_grad_(), q, q)
    assert mode.calls == 4
    assert [str(w.message).count("alias imported earlier") for w in seen] == [1]


def test_the_alias_warning_comes_under_reentrant_checkpointing():
    """Reentrant checkpointing runs its forward under no_grad on inputs that require grad and recomputes it
    in the backward, after the block: that recomputation is plain SDPA, so the alias call warns there too."""
    from torch.utils.checkpoint import checkpoint

    q = _x(1, 2, 5, 8).requires_grad_()
    with replace_sdpa("lerp-k2"), pytest.warns(UserWarning, match="alias imported earlier"):
        out = checkpoint(lambda a: imported_sdpa(a, a, a, is_causal=True), q, use_reentrant=True)
    out.sum().backward()
