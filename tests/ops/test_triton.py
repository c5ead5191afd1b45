"""Fused Triton kernels vs the float64 reference (forward output, dq, dk, dv).

On a machine without CUDA the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set below
before triton is imported) on a small parametrization; with CUDA they run on the GPU, plus a larger ``gpu``
subset.

Error bound (FlashAttention convention): err(kernel vs ref64) <= 2 * err(torch at the kernel's precision vs
ref64) + atol, where "torch" is the reference backend at the kernel's input dtype (fp32 with the same TF32
setting on GPU; the interpreter computes every dot in fp32) and, for bf16/fp16, also a low-precision
baseline, whichever errs more. For softmax that baseline is PyTorch's native low-precision attention maths
(scores and P @ V in the low dtype, operator in fp32), as FlashAttention's own tests do, or the kernels' own
arithmetic below where that errs more. For the K-interval operators and the rounded-exp baselines it is the
kernels' own 16-bit arithmetic in PyTorch (``_lowp_kernel_arith``: 16-bit products accumulated in fp32, the
grid in fp32, P and dS rounded to 16 bits before their products, the backward's D_i = dO_i . O_i from the
kernels' O): scores rounded to 16 bits move keys across grid boundaries, and the native baseline then errs
by O(0.1-1), which bounds nothing. ref64 is the reference backend on float64 copies of the same inputs. The
bound holds for the relative Frobenius error (systematic errors) and for the max error (localized errors).

Flip-prone rows (kinterval.ops.flips). Unlike softmax, the operator is discontinuous in the scores: interval
boundaries (Delta jumps), the Nearest forward's midpoints, FWM's tail cut and near-ties of the row max/min
(which key receives the calibration gradient). A score within rounding of such a point lands on either side
depending on the order of the dot product's sums, so two correct fp32 evaluations disagree there by a whole
row of dq and dk: with a tensor-core summation order emulated on the CPU, one flip at (1, 4, 1000, 1000, 64)
makes dq's relative Frobenius error 30x torch's (test_flip_prone_rows_are_left_out). ``check`` therefore
finds, in float64, the rows holding a decision within 8 fp32 roundoffs (times the score's condition) of a
discontinuity, gives them a zero upstream gradient (they then add nothing to dq, dk, dv, in the kernel and in
every reference alike) and leaves them out of the forward comparison. All other rows keep the plain bound;
at most MAX_FLIP_ROWS of the rows may be left out (measured: 0-5% on the GPU shapes, 10% for resolved at
Tk = 777). For TF32 the inputs are rounded to TF32 first, so that the kernel's Q K^T and dO V^T products are
exact however the hardware rounds its operands; the remaining TF32 roundings (P, dS into the second dots)
are continuous. The rounded-exp baselines (BF16-exp, FP8-exp) flip where a value lies within rounding of a
midpoint of their format (kinterval.ops.flips); BF16-exp's backward rounds gamma, a difference, to bf16, so
up to MAX_FLIP_ROWS_BF16_EXP of its rows may be left out.

Every range_grad mode is tested on fresh random inputs: the reference differentiates the clamp on t as the
identity (docs/operators.md), so its gradient does not hinge on whether t_raw rounds to 1 +- 1ulp at the
arg-max key, and the fp32 and fp64 references agree to rounding. Dyadic inputs (q, k in 1/64 steps, exact
scores) are used only where exact ties are the point (the tie convention).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: run the kernels in the CPU interpreter

from triton_gate import skip_without_kernels  # noqa: E402

skip_without_kernels(module=True)

_kernels = sys.modules.get("kinterval.ops.triton.kernels")
if _kernels is not None and not HAS_CUDA and not _kernels.INTERPRET:  # pragma: no cover
    raise RuntimeError(  # tests/conftest.py sets TRITON_INTERPRET before collection; a skip would hide this
        "kinterval.ops.triton.kernels was imported without TRITON_INTERPRET=1 and no CUDA device is present"
    )

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from grid_flips import emulated_kernel, flip_rows, to_tf32  # noqa: E402

from kinterval.ops import OperatorSpec, formulas, kinterval_attention, reference  # noqa: E402
from kinterval.ops.api import valid_mask, with_sinks  # noqa: E402
from kinterval.ops.reference import reference_probs  # noqa: E402
from kinterval.ops.tf32 import tf32 as tf32_switch  # noqa: E402
from kinterval.ops.tf32 import tf32_enabled  # noqa: E402
from kinterval.ops.triton import autograd as tri_autograd  # noqa: E402
from kinterval.ops.triton import kernels as _kernels_module  # noqa: E402
from kinterval.ops.triton import triton_attention, triton_supports, unsupported_reason  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
CORE_OPS = [
    "softmax",
    "bf16-exp",
    "fp8-exp",
    "lerp-k4",
    "minmax-weight-k4",
    "minmax-prob-k4",
    "fwm-weight-k4",
    "fwm-prob-k4",
    "fwm-lerp-k4",
    "resolved-weight-k4",
    "resolved-prob-k4",
    "resolved-lerp-k4",
]
OTHER_K = ["lerp-k1", "minmax-weight-k16", "fwm-prob-k3", "resolved-lerp-k8"]
# the STE operators in the paper's historical arithmetic (App. C.2): w^H = w^L + sg(w^N - w^L) and
# P = P^L + sg(P^H - P^L)
HISTORICAL_OPS = [
    f"{calib}-{surrogate}-k4[arithmetic=historical]"
    for calib in ("minmax", "fwm", "resolved")
    for surrogate in ("weight", "prob")
]
RANGE_GRADS = ["detach", "max_only", "min_only", "p1"]
NAMES = ("out", "dq", "dk", "dv")
MAX_FLIP_ROWS = 0.2  # at most this fraction of rows may be left out as flip-prone (module doc)
# BF16-exp's backward rounds gamma = (g - <g>)/W, a difference, to 8 bits: at T = 37 about a fifth of its rows
# (up to 30% over 20 seeds) hold a key whose gamma is within fp32 rounding of a bf16 midpoint
MAX_FLIP_ROWS_BF16_EXP = 0.4


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    """Every kernel output starts as NaN (-1 for indices): a finite result proves each element was written."""
    monkeypatch.setattr(tri_autograd, "POISON_OUTPUTS", True)


# --------------------------------------------------------------------------------------------- helpers
def make_inputs(B, H, Tq, Tk, D, *, seed, dtype=torch.float32, dyadic=False):
    g = torch.Generator().manual_seed(seed)
    if dyadic:  # exact in fp32/fp64/tf32/bf16: multiples of 1/64 in [-2, 2], scores exact sums
        while True:
            q = torch.randint(-128, 129, (B, H, Tq, D), generator=g).double() / 64
            k = torch.randint(-128, 129, (B, H, Tk, D), generator=g).double() / 64
            if not _extremum_ties(q @ k.transpose(-2, -1)):
                break  # no accidental ties of a row max/min: the reference's tie split never enters
    else:  # scores span several grid intervals: s ~ 4 sd for q, k ~ 2 randn and scale 1/sqrt(D)
        q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64) * 2
        k = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64) * 2
    v = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    do = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, do)]


def _extremum_ties(s):
    """True if some causal row (last query on last key) or full row has a tied max or min."""
    Tq, Tk = s.shape[-2:]
    causal = torch.arange(Tk) <= torch.arange(Tq)[:, None] + (Tk - Tq)
    for valid in (causal, torch.ones_like(causal)):
        rows = valid.sum(-1) >= 2
        top = s.masked_fill(~valid, float("-inf")).topk(min(2, Tk), dim=-1).values
        bot = (-s).masked_fill(~valid, float("-inf")).topk(min(2, Tk), dim=-1).values
        if Tk >= 2 and (((top[..., 0] == top[..., 1]) | (bot[..., 0] == bot[..., 1])) & rows).any():
            return True
    return False


def _grads(fn, q, k, v, do, sinks=None, bias=None):
    """[out, dq, dk, dv] of ``fn(q, k, v)`` for upstream gradient ``do``; with ``sinks``, ``fn(q, k, v,
    sinks)`` and dsinks after dv; with ``bias``, ``fn(..., bias=bias)`` and, if the bias requires a gradient,
    dbias last."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, *([] if sinks is None else [sinks]))]
    kw = {} if bias is None else {"bias": bias.detach().clone().requires_grad_(bias.requires_grad)}
    out = fn(*leaves, **kw)
    leaves += [kw["bias"]] if bias is not None and bias.requires_grad else []
    grads = torch.autograd.grad(out, leaves, do.to(out.device))  # the kernels' output is on DEVICE
    return [out.detach(), *grads]


def _probs_with_sinks(s, valid, spec, sinks):
    """``reference_probs`` of the score rows with the attention sinks (H,) appended as a key
    (``api.with_sinks``), the sinks' column dropped."""
    if sinks is None:
        return reference_probs(s, valid, spec)
    s, valid = with_sinks(s, valid.expand(s.shape), sinks.to(s.dtype).view(1, -1, 1, 1))
    return reference_probs(s, valid, spec)[..., :-1]


def _lowp_torch(q, k, v, spec, causal, mask, scale, sinks=None, softcap=None, bias=None):
    """PyTorch's native low-precision attention: scores and P @ V in q's dtype, the operator in fp32 (the
    score bias added in fp32)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s.float() + bias.float()
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    P = _probs_with_sinks(s.float(), valid, spec, sinks)
    return torch.matmul(P.to(q.dtype), v)


class _RoundGrad(torch.autograd.Function):
    """Identity; the gradient that passes is rounded to ``dtype`` (the kernels round dS before its dots)."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype).to(g.dtype), None


@contextlib.contextmanager
def _normalizations():
    """Record (W, P, with a gradient) of every ``normalize(w)`` the reference calls: the row sums and
    probabilities of the forward weights and of the operator's Jacobian point."""
    calls, plain = [], formulas.normalize

    def normalize(w):
        P = plain(w)
        calls.append((w.sum(-1, keepdim=True), P, w.requires_grad))  # W carries w's gradient
        return P

    formulas.normalize, reference.normalize = normalize, normalize
    try:
        yield calls
    finally:
        formulas.normalize, reference.normalize = plain, plain


def _lowp_kernel_arith(q, k, v, spec, causal, mask, scale, sinks=None, softcap=None, bias=None):
    """The kernels' 16-bit arithmetic in PyTorch, the low-precision baseline of the K-interval operators:
    products of the 16-bit inputs accumulated in fp32 (the scores and g = dO vᵀ, as the tensor cores form
    them), the grid and the operator in fp32, the weights w rounded to q's dtype before the P V dot, which
    is then divided by W (historical Prob-STE: its P, formed per key), dS rounded before dSᵀ Q and dS K, the
    results rounded to q's dtype. Scores rounded to 16 bits (``_lowp_torch``) move keys across grid
    boundaries and midpoints: that baseline's error is O(0.1-1) and bounded nothing (a dq 30% off passed).

    The backward's row scalar D_i = dO_i . O^at_i comes from the kernels' O^at: the output (softmax, LERP,
    Weight-STE), or for Prob-STE O^L (w^L rounded before its dot, divided by W^L, kept in fp32). Autograd
    forms <g>_P at the exact Jacobian point instead, so D_i = <g>_P + e_i with e_i = dO_i . (O^at_i -
    P^at_i v), and the kernels' gamma = (g - D)/W is the reference's less e_i/W_i on every key. The term
    u_i (W_i / sg(W_i) - 1) added to the output, 0 in value, with u_i = -(O^at_i - P^at_i v), gives exactly
    that gradient: d(dO_i . u_i W_i / sg(W_i))/dw_ij = -e_i/W_i. It moves what is not rounded to 16 bits after
    gamma most: the gradients of a score bias and of the sinks (docs/kernels.md, Backward)."""
    dt = q.dtype
    Tk = v.shape[-2]
    s = _RoundGrad.apply(torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale, dt)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float()
    valid = valid_mask(s.shape, s.device, causal=causal, mask=mask)
    with _normalizations() as calls:
        P = _probs_with_sinks(s, valid, spec, None if sinks is None else sinks.float())
    ((W_at, P_at),) = [(W, P) for W, P, grad in calls if grad]  # the Jacobian point: one with a gradient
    P_at = P_at.detach()[..., :Tk]  # without the sinks' column
    prob_ste = tri_autograd.operator_constants(spec)[0]["JACOBIAN_AT_PL"]
    W_at = torch.where(W_at > 0, W_at, 1.0)  # with its gradient: the D term below

    def rounded(P, W):  # w = P W rounded to q's dtype, over W: what the kernels' P V dot multiplies by
        return (P * W).to(dt).float() / W

    if prob_ste and spec.arithmetic == "historical":
        P_fwd = P.detach().to(dt).float()  # its forward P, formed per key (App. C.2), rounded itself
    else:
        W_fwd = calls[-1][0] if prob_ste else W_at  # Prob-STE's forward normalizes w^N last (no gradient)
        P_fwd = rounded(P.detach(), torch.where(W_fwd > 0, W_fwd, 1.0).detach())
    P = P + (P_fwd - P).detach()  # rounded in the forward; dL/dP = dO vᵀ stays fp32
    out = torch.matmul(P, v.float())
    o_at = torch.matmul(rounded(P_at, W_at.detach()), v.float()) if prob_ste else out.detach().to(dt).float()
    out = out - (o_at - torch.matmul(P_at, v.float())) * (W_at / W_at.detach() - 1.0)
    return out.to(dt)


def _diff(x, ref, skip=None):
    """x - ref in float64 on the CPU; rows where ``skip`` is True count as exact."""
    x = x.double().cpu()
    if skip is not None and skip.any():
        x = torch.where(skip[..., None], ref, x)
    return x - ref


def _errs(x, ref, skip=None):
    """(max abs error, relative Frobenius error) of x against the float64 reference. A reference that is
    exactly 0 (the keys' gradient where every row has one key: P = 1 whatever the score) has no scale to be
    relative to: the Frobenius error is then absolute, as the max bound's scale max(1, max |ref|) is."""
    d = _diff(x, ref, skip)
    norm = ref.norm()
    return d.abs().max().item(), (d.norm() / (norm if norm > 0 else 1.0)).item()


def _where(x, ref, skip=None):
    """Failure context: the (b, h, row) of the largest error."""
    idx = torch.unravel_index(_diff(x, ref, skip).abs().argmax(), ref.shape)
    return f"largest at (b, h, row) = {tuple(int(i) for i in idx[:3])}"


# TF32 floor: two TF32 unit roundoffs (2^-11 each: P and dS enter the second dots rounded). cuBLAS runs the
# small "torch at TF32" baselines without TF32 (measured on an H100: 1.2e-7 at 2x23x23x16, against the
# kernel's 2.9e-4), so the torch term alone would hold a TF32 kernel to fp32's error.
TF32_ATOL = 2.0**-10


def check(
    spec, q, k, v, do, *, causal=False, mask=None, scale=None, precision=None, atol=None,
    kernel=triton_attention, exclude_flips=True, sinks=None, softcap=None, bias=None,
):  # fmt: skip
    """Run the kernel and the references; assert the bounds for out, dq, dk, dv; return the max-error table.

    ``atol`` is relative (to ||ref64|| for the Frobenius bound, to max(1, max |ref64|) for the max bound);
    default 2e-6 (fp32), TF32_ATOL (fp32 with TF32 dots) or 2e-3 (bf16/fp16). Rows with a grid decision
    within rounding of a discontinuity (kinterval.ops.flips.flip_rows, module doc) get a zero upstream
    gradient and are left out of the forward comparison, unless ``exclude_flips`` is False. k and v may have
    fewer heads than q (grouped-query attention): the kernel gets them as they are, the references repeat
    them (``enable_gqa``) and sum their gradients back. ``sinks`` (H,), in q's dtype: attention sinks, for
    the kernel and every reference alike; their gradient is checked as a fifth result. ``softcap``: the
    scores' softcap c, for all alike. ``bias``: an additive score bias (broadcastable to (B, H, Tq, Tk)), the
    kernel's ``bias=``, the references' float mask (-inf where ``mask``/``causal`` mask); its gradient, when
    it requires one, is checked as the last result."""
    spec = OperatorSpec.from_full_name(spec) if isinstance(spec, str) else spec
    # inputs on any device: the flip-prone rows are found on the CPU (flip_rows), and masked_fill below
    # needs ``do`` where they are; each run gets its own copy on DEVICE
    q, k, v, do = (x.cpu() for x in (q, k, v, do))
    mask = None if mask is None else mask.cpu()
    dtype = q.dtype
    scale_ = scale if scale is not None else q.shape[-1] ** -0.5
    tf32 = dtype == torch.float32 and tri_autograd.resolve_precision(dtype, precision) == "tf32"
    if tf32:  # TF32-representable inputs: QK^T and dO V^T products are exact in the kernel (grid_flips)
        q, k, v, do = (to_tf32(x) for x in (q, k, v, do))
    group = q.shape[1] // k.shape[1]  # q heads per k/v head

    def rep(x):  # k or v at q's head count, as the references see them
        return x.repeat_interleave(group, 1) if group > 1 else x

    valid = valid_mask((*q.shape[:-1], k.shape[-2]), "cpu", causal=causal, mask=mask)
    sinks = None if sinks is None else sinks.cpu()
    bias = None if bias is None else bias.detach().cpu().requires_grad_(bias.requires_grad)
    flips = flip_rows(spec, q, rep(k), scale_, valid, rep(v), do, softcap=softcap, sinks=sinks, bias=bias)
    if not exclude_flips:
        flips = valid[..., 0] & False
    most = MAX_FLIP_ROWS_BF16_EXP if spec.kind == "bf16-exp" else MAX_FLIP_ROWS
    assert flips.float().mean() <= most, f"{flips.float().mean():.1%} of the rows are flip-prone"
    do = do.masked_fill(flips[..., None], 0.0)
    dev = [x.to(DEVICE) for x in (q, k, v, do)]
    mask_d = None if mask is None else mask.to(DEVICE)
    sinks_d = None if sinks is None else sinks.to(DEVICE)
    bias_d = None if bias is None else bias.detach().to(DEVICE).requires_grad_(bias.requires_grad)
    gqa = group > 1
    kw = {} if softcap is None else {"softcap": softcap}  # only calls given a softcap (sinks) get the keyword

    def args(*s):  # the sinks, when the test gives them, as the last positional argument
        return dict(kw, sinks=s[0]) if s else kw

    def reference(a, b, c, *s, bias=None):
        if bias is None:
            masks = dict(mask=mask_d)
        else:  # the bias as a float mask, -inf where the boolean mask masks (the causal one stays causal)
            on = torch.ones((), dtype=torch.bool, device=DEVICE) if mask_d is None else mask_d
            masks = dict(attn_mask=torch.where(on, bias, float("-inf")))
        return kinterval_attention(
            a,
            b,
            c,
            spec,
            causal=causal,
            scale=scale,
            backend="reference",
            enable_gqa=gqa,
            **masks,
            **args(*s),
        )

    def run_kernel(a, b, c, *s, **bias):
        return kernel(
            a, b, c, spec, causal=causal, mask=mask_d, scale=scale, precision=precision, **args(*s), **bias
        )

    res = _grads(run_kernel, *dev, sinks=sinks_d, bias=bias_d)
    ref64 = _grads(  # float64 on the test's device (a GPU's fp64 units keep the large cases fast)
        reference,
        *[x.to(DEVICE, torch.float64) for x in (q, k, v, do)],
        sinks=None if sinks is None else sinks_d.double(),
        bias=None if bias is None else bias_d.double(),
    )
    ref64 = [x.cpu() for x in ref64]
    with tf32_switch(HAS_CUDA and tf32):
        ref_t = _grads(reference, *dev, sinks=sinks_d, bias=bias_d)
        lowp = []
        if dtype in (torch.bfloat16, torch.float16):  # module doc: the low-precision baselines
            fns = (_lowp_torch, _lowp_kernel_arith) if spec.kind == "softmax" else (_lowp_kernel_arith,)
            lowp = [
                _grads(
                    lambda a, b, c, *s, bias=None, fn=fn: fn(
                        a, rep(b), rep(c), spec, causal, mask_d, scale_, *s, softcap=softcap, bias=bias
                    ),
                    *dev,
                    sinks=sinks_d,
                    bias=bias_d,
                )
                for fn in fns
            ]

    names = (*NAMES, *(["dsinks"] if sinks is not None else []))
    names += ("dbias",) if bias is not None and bias.requires_grad else ()
    table = {}
    for i, name in enumerate(names):
        x = res[i]
        want = {"dsinks": getattr(sinks, "dtype", None), "dbias": getattr(bias_d, "dtype", None)}.get(
            name, dtype
        )
        assert x.dtype == want, f"{name} dtype {x.dtype} != {want}"
        assert torch.isfinite(x).all(), f"{name}: non-finite values (unwritten or NaN) in the kernel result"
        ref = ref64[i]
        skip = flips if name == "out" else None  # the gradients of flip-prone rows are zero by construction
        others = [ref_t[i]] + [x[i] for x in lowp]
        err, fro = _errs(x, ref, skip)
        err_t = max(_errs(y, ref, skip)[0] for y in others)
        fro_t = max(_errs(y, ref, skip)[1] for y in others)
        mag = max(1.0, ref.abs().max().item())
        tol = atol if atol is not None else (2e-3 if dtype != torch.float32 else TF32_ATOL if tf32 else 2e-6)
        table[name] = (err, err_t)
        # relative Frobenius error: what a systematic error moves
        context = f"{int(flips.sum())} of {flips.numel()} rows left out as flip-prone"
        assert fro <= 2 * fro_t + tol, (
            f"{spec.full_name} {name}: relative Frobenius err {fro:.3e} > 2 * torch {fro_t:.3e} + {tol:.1e}; "
            f"{_where(x, ref, skip)}; {context}"
        )
        # max error: what a localized error moves
        bound = 2 * err_t + tol * mag
        assert err <= bound, (
            f"{spec.full_name} {name}: max err {err:.3e} > {bound:.3e} (torch {err_t:.3e}); "
            f"{_where(x, ref, skip)}; {context}"
        )
    return table, res, ref64


# ------------------------------------------------------------------------------------------- operators
@pytest.mark.parametrize("name", CORE_OPS + OTHER_K)
def test_operator_causal(name):
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=zlib.crc32(name.encode()) % 1000)
    check(name, q, k, v, do, causal=True)


@pytest.mark.parametrize("range_grad", RANGE_GRADS)
@pytest.mark.parametrize(
    "name", ["lerp-k4", "minmax-weight-k4", "minmax-prob-k4", "fwm-prob-k4", "resolved-weight-k4"]
)
def test_range_grad(name, range_grad):
    spec = OperatorSpec.parse(name, range_grad=range_grad)
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=7, dyadic=False)
    check(spec, q, k, v, do, causal=True)


@pytest.mark.parametrize("masking", ["causal", "mask"])
@pytest.mark.parametrize("name", HISTORICAL_OPS)
def test_historical_arithmetic(name, masking):
    """Historical Weight-/Prob-STE against the reference's historical arithmetic: out, dq, dk, dv, causal and
    with a general mask (a fully masked row, a single-key row). The Weight-STE backward takes the Jacobian at
    w^H (a kernel that takes it at w^L, Prob-STE's point, fails here by O(1))."""
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=zlib.crc32(name.encode()) % 1000)
    if masking == "causal":
        check(name, q, k, v, do, causal=True)
    else:
        mask = _general_mask(1, 2, 37, 37, seed=6)
        mask[0, 1, 3] = False  # a fully masked row
        _, res, _ = check(name, q, k, v, do, mask=mask)
        assert torch.equal(res[0][0, 1, 3].cpu(), torch.zeros(16))


@pytest.mark.parametrize("name", CORE_OPS + HISTORICAL_OPS[:2] + ["fwm-prob-k4[range_grad=p1]"])
def test_inference_forward_matches_the_training_forward(name):
    """Without a backward to follow (no_grad, or inputs that need no gradient) the forward stores O only:
    Prob-STE skips its P^L V dot, and strict Weight-STE and the exp baselines the arg keys of pass 1. O is
    bit for bit the O of the training forward, for every operator, with a general mask too (a fully masked
    row, single-key rows), and nothing but O is allocated at (B, H, T) size, but for LERP and historical
    Weight-STE, which launch their training forward."""
    q, k, v, _ = make_inputs(1, 2, 37, 37, 16, seed=zlib.crc32(name.encode()) % 1000)
    mask = _general_mask(1, 2, 37, 37, seed=6)
    mask[0, 1, 3] = False
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    for kw in (dict(causal=True), dict(mask=mask.to(DEVICE))):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        trained = triton_attention(*leaves, name, **kw).detach()
        with torch.no_grad():
            inferred = triton_attention(*leaves, name, **kw)
        assert torch.equal(inferred, trained), name
        assert torch.equal(triton_attention(q, k, v, name, **kw), trained), name  # no input needs a gradient
    spec = OperatorSpec.from_full_name(name)
    _, saved, consts = tri_autograd.forward_launch(q, k, v, None, spec, True, 0.25, "ieee", save=False)
    historical_weight = spec.surrogate == "weight" and spec.arithmetic == "historical"
    training = spec.is_kinterval and (spec.surrogate is None or historical_weight)
    assert consts["meta"]["SAVE"] is training
    oL, stats = saved.oL, (saved.M, saved.m, saved.W, saved.W_at, saved.amax, saved.amin)
    assert all(x.numel() == (q.numel() // q.shape[-1] if training else 1) for x in stats)
    assert oL.numel() == (1 if spec.surrogate == "prob" else q.numel())  # O^L is O itself but for Prob-STE


@pytest.mark.parametrize(
    "name",
    ["lerp-k4", "minmax-weight-k4", "minmax-prob-k4[range_grad=detach]", "fwm-prob-k4", "resolved-weight-k4"],
)
def test_backward_takes_a_rounded_row_max(name, monkeypatch):
    """The backward recomputes the scores in other tilings, and on the GPU pass 2 forms z = s - M as one FMA,
    so the arg keys' z are off 0 (and b_0) by a rounding. With the saved M moved by one ulp either way after
    the forward, dq, dk and dv stay within 2e-6 of the unmoved run; the strict FWM-like operators, whose
    backward reads only the interval and the Nearest choice of each key (no pins: docs/kernels.md, extremum
    keys) and whose h does not depend on M, give the same gradients bit for bit."""
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=zlib.crc32(name.encode()) % 1000)
    q, k, v, do = (x.to(DEVICE) for x in (q, k, v, do))
    original = tri_autograd.forward_launch

    def grads(direction):
        def nudged(*args, **kwargs):
            launch, saved, consts = original(*args, **kwargs)

            def run():
                launch()
                if direction:
                    saved.M.copy_(torch.nextafter(saved.M, torch.full_like(saved.M, direction * math.inf)))

            return run, saved, consts

        monkeypatch.setattr(tri_autograd, "forward_launch", nudged)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = triton_attention(*leaves, name, causal=True, precision="ieee")
        return torch.autograd.grad(out, leaves, do)

    exact = grads(0)
    bitwise = name in ("fwm-prob-k4", "resolved-weight-k4")
    for direction in (1, -1):
        for g, g0, what in zip(grads(direction), exact, ("dq", "dk", "dv")):
            assert torch.isfinite(g).all(), (name, what, direction)
            if bitwise:
                assert torch.equal(g, g0), (name, what, direction)
            else:
                assert ((g - g0).norm() / g0.norm()).item() < 2e-6, (name, what, direction)


def _one_query(scores, D):
    """One query whose scores (scale 1) are exactly ``scores`` (q one-hot, the scores in k), random v, dO = 1:
    then dv_j = P_j in every column."""
    q = torch.zeros(1, 1, 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, len(scores), D)
    k[0, 0, :, 0] = scores
    v = torch.randn(1, 1, len(scores), D, generator=torch.Generator().manual_seed(0))
    return q, k, v, torch.ones(1, 1, 1, D)


@pytest.mark.parametrize("surrogate", ["weight", "prob"])
@pytest.mark.parametrize("calibration", ["minmax", "fwm"])
def test_historical_forward_rounds_like_the_reference(calibration, surrogate):
    """The historical forward is evaluated in fp32 as the reference evaluates it, not as P^N: with wide
    intervals (h = 20) a key at t = 1/4 has w^N = e^{b_r} below half an ulp of w^L, so w^L + (w^N - w^L) is
    exactly 0 (and so is P^L + (P^H - P^L)), while P^N > 0. One query, so dv_j = P_j dO: the kernel's dv is 0
    on those keys, as the fp32 reference's, where the strict operator's is not."""
    D = 16
    scores = torch.tensor([0.0, 80.0, 65.0, 45.0, 30.0, 72.0])  # MinMax K = 4: h = 20
    small = [2, 3]  # x = 3.25 and 2.25: t = 1/4, w^N / w^L < 2^-26; key 4 (x = 1.5) keeps w^N = w^L-ish
    q, k, v, do = _one_query(scores, D)
    extra = "[tau=80,arithmetic={}]" if calibration == "fwm" else "[arithmetic={}]"  # FWM: h = 80/4
    name = f"{calibration}-{surrogate}-k4" + extra

    def dv(fn, arithmetic):
        return _grads(lambda a, b, c: fn(a, b, c, name.format(arithmetic), scale=1.0), q, k, v, do)[3]

    def ref(a, b, c, spec, scale):
        return kinterval_attention(a, b, c, spec, scale=scale, backend="reference")

    def tri(a, b, c, spec, scale):
        return triton_attention(a.to(DEVICE), b.to(DEVICE), c.to(DEVICE), spec, scale=scale)

    assert (dv(ref, "strict")[0, 0, small] != 0).all()  # P^N > 0 there
    assert (dv(tri, "strict")[0, 0, small].cpu() != 0).all()
    assert (dv(ref, "historical")[0, 0, small] == 0).all()  # the reference's historical P is exactly 0
    assert (dv(tri, "historical")[0, 0, small].cpu() == 0).all()
    others = [j for j in range(len(scores)) if j not in small]
    torch.testing.assert_close(dv(tri, "historical")[0, 0, others].cpu(), dv(ref, "historical")[0, 0, others])


@pytest.mark.parametrize("name", ["minmax-weight-k4", "fwm-prob-k4", "minmax-weight-k4[range_grad=min_only]"])
def test_every_row_with_its_arg_keys_in_one_key_block(name):
    """An attention sink: key 0 is every row's arg-max and key 1 every row's arg-min, so one key block takes
    the calibration terms of eq. (2) of every row (after the dK/dV loop, one product per row tile) and the
    other blocks none; causal and a general mask, both with every row seeing keys 0 and 1."""
    B, H, T, D = 1, 2, 48, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=21)
    q = q.abs() + 0.1  # positive queries: a large positive key 0 is every row's max, its negative the min
    k[:, :, 0] = 3.0
    k[:, :, 1] = -3.0
    s = q @ k.transpose(-2, -1)
    assert (s[..., 2:, 2:].tril().argmax(-1) != 0).any()  # teeth: without the sink the arg keys would spread
    mask = torch.rand(B, H, T, T, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[..., :2] = True
    for causal, m in ((True, None), (False, mask)):
        check(  # inputs on DEVICE: check takes them on any device
            name,
            *(x.to(DEVICE) for x in (q, k, v, do)),
            causal=causal,
            mask=None if m is None else m.to(DEVICE),
        )


@pytest.mark.parametrize("bwd", ["split", "fused"])
@pytest.mark.parametrize("calibration", ["minmax", "fwm"])
def test_historical_prob_ste_dv_is_eq4_in_fp32(calibration, bwd, monkeypatch):
    """Historical Prob-STE's dV uses the forward P of eq. (4) as fp32 evaluates it, P^L + (P^H - P^L), not
    P^H = w^H / W^H, which differs from it by rounding only. h = 7 (MinMax on [0, 28] at K = 4; FWM with
    tau = 28), one key at x = 3.25 (t = 1/4): P^L ~ 0.200 and P^L - P^H ~ 0.199, both in [2^-3, 2^-2), so the
    subtraction and the addition land on multiples of u = ulp(P^L) = 2^-26, while P^H ~ 9e-4 is a float on a
    256 times finer grid and no multiple of u. One query and dO = 1 make dv_j = P_j exactly."""
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    D, u = 16, 2.0**-26
    scores = torch.tensor([0.0, 28.0, 22.75])  # the min key, the max key, the key at x = 3.25
    q, k, v, do = _one_query(scores, D)
    name = f"{calibration}-prob-k4[arithmetic=historical" + (",tau=28]" if calibration == "fwm" else "]")
    # the row in float64: w^L = 3/4 e^{b_3} + 1/4 e^{b_4}, w^N = e^{b_3} (weights relative to e^M)
    e = torch.tensor([-28.0, 0.0, -7.0], dtype=torch.float64).exp()
    wL = torch.stack([e[0], e[1], 0.75 * e[2] + 0.25])
    PL, PH = wL / wL.sum(), e / e.sum()
    assert 2**-3 <= PL[2] - PH[2] < PL[2] < 2**-2
    assert 0.05 < (PH[2] / u) % 1 < 0.95  # teeth: P^H alone is not on the grid of u

    def tri(a, b, c):
        return triton_attention(*(x.to(DEVICE) for x in (a, b, c)), name, scale=1.0, precision="ieee")

    def ref(a, b, c):
        return kinterval_attention(a, b, c, name, scale=1.0, backend="reference")

    dv = _grads(tri, q, k, v, do)[3][0, 0, 2].double().cpu()
    dv_ref = _grads(ref, q, k, v, do)[3][0, 0, 2, 0].double()
    assert torch.equal(dv, dv[:1].expand(D))  # dO = 1: every column is P_j
    assert (dv / u == (dv / u).round()).all(), dv[0].item() / u
    assert abs(dv[0] - PH[2]) <= 2 * u  # Prob-STE's forward value P^H, to the rounding of P^L + (P^H - P^L)
    assert abs(dv[0] - dv_ref) <= u  # the fp32 reference's


@pytest.mark.parametrize("span_log2", [9, 14, 30])
@pytest.mark.parametrize(
    "name",
    ["minmax-weight-k4", "minmax-prob-k4[arithmetic=historical]", "lerp-k4", "fwm-prob-k4[tau=800]"],
)
def test_wide_rows(name, span_log2):
    """Rows whose interval width h exceeds 88.7 (a MinMax span over 355 at K = 4; FWM with tau = 800): e^h
    overflows fp32, so the kernel must not form e^{b_{r+1}} as e^{b_r} e^h (0 * inf = NaN). Exact scores
    (q one-hot, the scores in k) at grid positions x away from every boundary; out and all gradients against
    the float64 reference."""
    D = 16
    x = torch.tensor([0.0, 4.0, 3.25, 3.75, 2.5, 1.25, 3.875, 0.75])  # grid positions (K = 4)
    span = 2.0**span_log2
    q = torch.zeros(1, 2, 3, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, len(x), D)
    k[..., 0] = x * span / 4  # MinMax: m = 0, M = span, h = span / 4
    k[0, 1, :, 1] = 1.0  # a second head: scores shifted by q_1 = 0 (no change), keys not all equal
    q[0, 0, 1, 0] = 0.5  # a row with half the span
    g = torch.Generator().manual_seed(3)
    v = torch.randn(1, 2, len(x), D, generator=g)
    do = torch.randn(1, 2, 3, D, generator=g)
    res = _grads(
        lambda a, b, c: triton_attention(a.to(DEVICE), b.to(DEVICE), c.to(DEVICE), name, scale=1.0),
        q,
        k,
        v,
        do,
    )
    ref = _grads(
        lambda a, b, c: kinterval_attention(a, b, c, name, scale=1.0, backend="reference"),
        *(t.double() for t in (q, k, v, do)),
    )
    for got, want, what in zip(res, ref, NAMES):
        got = got.cpu().double()
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * max(1.0, want.abs().max().item()))


@triton.jit
def _grid_position_kernel(D, H, X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    d = tl.load(D + offs, mask=offs < n, other=1.0)
    h = tl.load(H + offs, mask=offs < n, other=1.0)
    x = _kernels_module._grid_position(d, h, tl.math.div_rn(tl.full(h.shape, 1.0, tl.float32), h))
    tl.store(X + offs, x, mask=offs < n)


def test_grid_position_is_the_correctly_rounded_quotient():
    """The kernels' grid position x = d/h (one Markstein correction of d * RN(1/h)) is the correctly rounded
    fp32 quotient, as the reference's division, bit for bit: on random d, h over 40 binades and on every
    grid point and midpoint (r + 0, 1/4, 1/2) * h of MinMax spans 1..399 and 1/8..25 at K = 3, 4, 16 (the
    audit's dyadic cases). The product d * RN(1/h) alone misses on ~a quarter of them. In the interpreter
    this needs its fma rounded once (kernels._patch_interpreter_fma), as the GPU's."""
    g = torch.Generator().manual_seed(0)
    n = 1 << 15
    h_rand = (torch.rand(n, generator=g) + 1) * 2.0 ** torch.randint(-20, 20, (n,), generator=g).float()
    d_rand = torch.rand(n, generator=g) * 2.0 ** torch.randint(-20, 21, (n,), generator=g).float()
    spans = torch.cat([torch.arange(1.0, 400.0), torch.arange(1.0, 200.0) / 8])
    d_grid, h_grid = [], []
    for K in (3, 4, 16):
        h = spans / K  # fp32 division, as the reference's h = (M - m)/K
        for off in (0.0, 0.25, 0.5):
            d = ((torch.arange(K)[:, None] + off) * h.double()).float()
            d_grid.append(d.flatten())
            h_grid.append(h.expand(K, -1).flatten())
    d = torch.cat([d_rand, *d_grid]).to(DEVICE)
    h = torch.cat([h_rand, *h_grid]).to(DEVICE)
    x = torch.empty_like(d)
    _grid_position_kernel[(triton.cdiv(d.numel(), 1 << 14),)](d, h, x, d.numel(), BLOCK=1 << 14)
    want = d / h
    assert torch.equal(x, want), f"{int((x != want).sum())} of {d.numel()} quotients differ"
    naive = d * (1.0 / h)
    assert (naive != want).float().mean() > 0.1  # the test has teeth: the plain product misses often


# Table S1 rows whose grid width h has an inexact 1/h that rounds down (MinMax span 41: h = 10.25 at K = 4,
# 2.5625 at K = 16; and span 41/4): keys exactly on grid boundaries b_r (r is a floor) and on Nearest
# midpoints (t = 1/2 rounds up). Scores are exact (q = e_0, scale 1), so the fp32 and fp64 references agree.
INEXACT_RECIPROCAL_ROWS = {  # (K, scores): the row max, the row min, two midpoints, two boundaries
    "K4 span 41": (4, [0.0, 41.0, 35.875, 5.125, 20.5, 10.25]),  # mid r = 3, 0; b_2, b_1
    "K4 span 41/4": (4, [0.0, 10.25, 8.96875, 1.28125, 5.125, 2.5625]),
    "K16 span 41": (16, [0.0, 41.0, 39.71875, 37.15625, 38.4375, 35.875]),  # mid r = 15, 14; b_15, b_14
    "K16 span 41/4": (16, [0.0, 10.25, 9.9296875, 9.2890625, 9.609375, 8.96875]),
}


@pytest.mark.parametrize(
    "name",
    ["lerp-k4", "minmax-weight-k4", "minmax-prob-k4", "fwm-weight-k4[tau=41]", "lerp-k16",
     "minmax-weight-k16", "minmax-prob-k16[arithmetic=historical]"],
)  # fmt: skip
def test_grid_decisions_with_an_inexact_reciprocal_width(name):
    """The kernel multiplied by a rounded 1/h where the reference divides by h: with 1/h rounded down, a key
    exactly on a Nearest midpoint got t = 0.4999998 and rounded down (minmax-weight-k4: P 0.9999 on the max
    key against 0.5 / 0.5), a key exactly on b_r got r - 1 (lerp-k16: dk off by 0.04). Now the grid position
    is the correctly rounded quotient. Two heads (K = 4 rows, K = 16 rows), two query rows each seeing its
    own six keys; out (= P, v one-hot), dq, dk, dv against the float64 reference."""
    D, T = 16, 6
    rows = list(INEXACT_RECIPROCAL_ROWS.values())
    q = torch.zeros(1, 2, 2, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, 2 * T, D)
    mask = torch.zeros(1, 2, 2, 2 * T, dtype=torch.bool)
    for i, (_, scores) in enumerate(rows):
        h, r = divmod(i, 2)
        k[0, h, r * T : (r + 1) * T, 0] = torch.tensor(scores)
        mask[0, h, r, r * T : (r + 1) * T] = True
    v = torch.eye(T, D).repeat(1, 2, 1)[None].expand(1, 2, 2 * T, D).contiguous()  # out_i[:T] = P_i
    do = torch.randn(1, 2, 2, D, generator=torch.Generator().manual_seed(0))
    kw = dict(mask=mask, scale=1.0)
    dev = [x.to(DEVICE) for x in (q, k, v, do)]
    res = _grads(lambda a, b, c: triton_attention(a, b, c, name, precision="ieee", **kw), *dev)
    ref = _grads(
        lambda a, b, c: kinterval_attention(a, b, c, name, backend="reference", **kw),
        *(x.double() for x in (q, k, v, do)),
    )
    for got, want, what in zip(res, ref, NAMES):
        got = got.cpu().double()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m, w=what: f"{name} {w}: {m}")


@pytest.mark.parametrize(
    "name", ["fwm-lerp-k5[tau=0.3]", "fwm-weight-k10[tau=0.15]", "resolved-prob-k9[tau=0.35]"]
)  # fmt: skip
def test_a_tau_that_float32_does_not_hold(name):
    """docs/kernels.md, pass 2: the kernels' step is fl32(fl32(tau)/K), the reference's fl32(tau/K) as the
    reference's; for these tau and K the two differ by an ulp (asserted), and every row that is not
    flip-prone keeps the fp32 bound. The other tests use tau that float32 holds."""
    spec = OperatorSpec.from_full_name(name)
    assert (torch.tensor(spec.tau) / spec.K).item() != torch.tensor(spec.tau / spec.K).item()
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(4))
    check(spec, q * 0.3, k, v, do, causal=True)


@pytest.mark.parametrize("name", ["minmax-weight-k3", "minmax-prob-k3", "minmax-weight-k6"])
def test_nearest_midpoint_with_a_rounded_grid_point_is_a_flip(name):
    """docs/kernels.md, Conventions: the kernel's midpoint test is t = x - r with x the correctly rounded
    (z~ - b_0)/h; the reference's is t = (z~ - b_r)/h with b_r = b_0 + r h rounded. Row 0, -1, -2, -3, -4
    (span 4, h = 4/3 at K = 3 and 2/3 at K = 6, neither exact): keys -2 (K = 3) and -1, -3 (K = 6) sit
    exactly on a Nearest midpoint. The kernel rounds them up, as Table S1 does for t = 1/2; the fp32
    reference gets t = 0.49999988 from the rounded b_r and rounds them down. The docs claimed both decide a
    key exactly on a midpoint alike; they do only where b_r is exact. flip_rows flags the row, so the
    kernel tests leave it out."""
    K = int(name.rsplit("k", 1)[1])
    scores = torch.tensor([0.0, -1.0, -2.0, -3.0, -4.0])
    T = D = len(scores)
    q = torch.zeros(1, 1, 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, T, D)
    k[0, 0, :, 0] = scores
    v = torch.eye(T, D)[None, None]  # out = P
    P_tri = triton_attention(*(x.to(DEVICE) for x in (q, k, v)), name, scale=1.0, precision="ieee")
    P_ref = kinterval_attention(q, k, v, name, scale=1.0, backend="reference")
    w_tri, w_ref = (P[0, 0, 0].cpu().double() / P[0, 0, 0, 0].item() for P in (P_tri, P_ref))
    h = 4.0 / K
    on_midpoint = ((scores + 4.0) / h - 0.5).remainder(1.0).abs() < 1e-6  # exact in float64
    up = torch.exp(-4.0 + ((scores + 4.0) / h + 0.5).double() * h)  # Table S1: t = 1/2 rounds up
    down = torch.exp(-4.0 + ((scores + 4.0) / h - 0.5).double() * h)
    assert on_midpoint.any()
    torch.testing.assert_close(w_tri[on_midpoint], up[on_midpoint], rtol=1e-5, atol=0)
    torch.testing.assert_close(w_ref[on_midpoint], down[on_midpoint], rtol=1e-5, atol=0)
    torch.testing.assert_close(w_tri[~on_midpoint], w_ref[~on_midpoint], rtol=1e-6, atol=0)
    spec = OperatorSpec.parse(name)
    assert flip_rows(spec, q, k, 1.0, torch.ones(1, 1, 1, T, dtype=torch.bool)).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("step", [0.5, 3.0, 10.0])
def test_softmax_one_pass_rescales(step, causal):
    """Softmax's forward reads each key tile once and rescales W and O by e^{M_old - M} whenever the row max
    grows (FlashAttention's online softmax). Scores x_j = +-step * j (q one-hot, the scores in k): rows whose
    max grows on every key tile (by 16 step, past fp32's exp range at step 10: the earlier sums then scale
    to 0), rows whose max is the first key, and a flat row; out and all gradients against float64."""
    T, D = 40, 16
    k = torch.zeros(1, 2, T, D)
    k[..., 0] = torch.arange(T) * step
    k[0, 1, :, 1] = torch.linspace(-1, 1, T)  # second head: the same rows, slightly tilted
    q = torch.zeros(1, 2, 3, D)
    q[..., 0, 0], q[..., 1, 0], q[..., 2, 1] = 1.0, -1.0, 1.0  # growing max, max first, nearly flat
    g = torch.Generator().manual_seed(8)
    v, do = torch.randn(1, 2, T, D, generator=g), torch.randn(1, 2, 3, D, generator=g)
    check("softmax", q, k, v, do, causal=causal, scale=1.0)


# --------------------------------------------------------------------------------------- shapes, masks
def _general_mask(B, H, Tq, Tk, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, H, Tq, Tk, generator=g) > 0.4
    mask[0, 1, 3] = False  # a fully masked row
    mask[-1, 0, 5] = False  # a row with a single valid key
    mask[-1, 0, 5, 7] = True
    return mask


CASES = {
    # name: (op, B, H, Tq, Tk, D, causal, mask kind, dyadic)
    "tq_ne_tk_causal_keypad": ("minmax-prob-k4", 2, 2, 20, 45, 16, True, "keypad", False),
    "general_mask_minmax": ("minmax-weight-k4", 2, 2, 20, 45, 32, False, "general", False),
    "general_mask_fwm_p1": ("fwm-prob-k4[range_grad=p1]", 2, 2, 20, 45, 16, False, "general", False),
    "general_mask_lerp_detach": ("lerp-k4[range_grad=detach]", 2, 2, 20, 33, 16, False, "general", False),
    "general_mask_softmax": ("softmax", 2, 2, 20, 45, 32, False, "general", False),
    "general_mask_bf16_exp": ("bf16-exp", 2, 2, 20, 45, 16, False, "general", False),
    "tq_ne_tk_causal_keypad_fp8_exp": ("fp8-exp", 2, 2, 20, 45, 16, True, "keypad", False),
    "mask_2d_resolved": ("resolved-prob-k4", 1, 2, 30, 30, 16, True, "2d", False),
    "head_dim_24": ("lerp-k4", 1, 2, 33, 33, 24, True, None, False),
    "tq_1": ("minmax-weight-k4", 1, 2, 1, 40, 16, True, None, False),
    # Tk - Tq = 1: the last row of a 16-row query block sees one key of the next key tile, alone
    "causal_last_key_alone": ("lerp-k4", 1, 2, 16, 17, 16, True, None, False),
    # one key: P = 1 in every row and O = v. The gradients of q and k are 0 in the reference; in the kernel
    # too, as FWM's arg-max term (G_M = -S1) cancels the self term exactly. (Without that term, as in
    # softmax, dS = g - D is a rounding of g: docs/kernels.md, Backward; a zero reference has no scale.)
    "tk_1": ("fwm-lerp-k4", 2, 2, 20, 1, 16, False, None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shapes_and_masks(case):
    op, B, H, Tq, Tk, D, causal, kind, dyadic = CASES[case]
    q, k, v, do = make_inputs(B, H, Tq, Tk, D, seed=11, dyadic=dyadic)
    mask = None
    if kind == "keypad":
        mask = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        mask[0, ..., 30:] = False
        mask[1, ..., ::3] = False
    elif kind == "general":
        mask = _general_mask(B, H, Tq, Tk, seed=3)
    elif kind == "2d":
        mask = torch.rand(Tq, Tk, generator=torch.Generator().manual_seed(5)) > 0.3
    table, res, _ = check(op, q, k, v, do, causal=causal, mask=mask, scale=0.25 if dyadic else None)
    if kind == "general":  # the fully masked row: O = 0 and zero gradient (never NaN)
        assert torch.equal(res[0][0, 1, 3].cpu(), torch.zeros(D))
        assert torch.equal(res[1][0, 1, 3].cpu(), torch.zeros(D))


@pytest.mark.parametrize("masking", ["causal", "mask"])
@pytest.mark.parametrize(
    "name",
    [
        "softmax",
        "bf16-exp",
        "minmax-weight-k4",
        "fwm-prob-k4",
        "resolved-lerp-k4",
        "fwm-prob-k4[arithmetic=historical]",
    ],
)
@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_non_finite_scores_give_nan_rows(name, masking, train):
    """A row with a NaN or infinite score on a valid key is NaN, as kinterval_attention's reference rule; the
    clamps of FWM would otherwise make it finite, and an all -inf row would pass for an empty one. Every
    other row is bit-identical to a run on the same finite inputs. Non-finite scores on masked keys are
    ignored."""
    B, H, T, D = 1, 2, 21, 16
    q, k, v, _ = make_inputs(B, H, T, T, D, seed=6)
    k[0, 0, :, 0] = -k[0, 0, :, 0].abs() - 0.5
    q[0, 0, 12] = 0.0
    clean_q, clean_k = q.clone(), k.clone()
    q[0, 0, 5, 3] = float("nan")  # every score of row 5 is NaN
    q[0, 0, 12, 0] = float("inf")  # row 12: -inf on every key (no +inf, no NaN)
    k[0, 1, 7] = float("inf")  # head 1: +inf, -inf or NaN on key 7 for every row that sees it
    causal = masking == "causal"
    mask = None
    if not causal:
        mask = torch.rand(B, H, T, T, generator=torch.Generator().manual_seed(1)) < 0.7
        mask[0, 1, :, 7] = False  # key 7 of head 1 masked everywhere: its inf is ignored
        mask[0, 1, 9, 7] = True  # except in row 9
    spec = OperatorSpec.from_full_name(name)
    s = (q.double() @ k.double().transpose(-2, -1)) / D**0.5
    bad = (~torch.isfinite(s) & valid_mask(s.shape, "cpu", causal=causal, mask=mask)).any(-1)
    assert bad[0, 0, 5] and bad[0, 0, 12] and bad[0, 1].sum() >= 1 and (~bad).sum() >= 10

    def run(q, k):
        dev = [x.to(DEVICE).requires_grad_(train) for x in (q, k, v)]
        m = None if mask is None else mask.to(DEVICE)
        out = triton_attention(*dev, spec, causal=causal, mask=m)
        if train:
            out.backward(torch.ones_like(out))  # runs; the gradient of a NaN row is not defined
        return out.detach().cpu()

    out, ref = run(q, k), run(clean_q, clean_k)
    assert torch.equal(out.isnan().all(-1), bad) and torch.equal(out.isnan().any(-1), bad)
    assert torch.equal(out[~bad], ref[~bad])


def test_softmax_accuracy_at_large_scores():
    """Scores of magnitude 1e5 (exact in fp32: k is the identity and the scale a power of two). The online
    softmax rescaled its sums by 2^{(M_old - M) log2 e} while each weight carried its own rounded offset
    RN(M log2 e); the two differ by up to half an ulp of M log2 e (2^-7 at 1e5), and the forward erred by
    1e-3 (relative Frobenius; torch.softmax in fp32: 6e-8). The rescale factor is now the difference of the
    rounded offsets, and ``check``'s bound (twice torch's own fp32 error, + 2e-6) holds for out, dq, dk, dv.
    On a GPU the 64-key forward tile holds the whole row: no rescale, nothing to catch there."""
    Tq, T = 16, 32  # two key tiles in the interpreter
    g = torch.Generator().manual_seed(3)
    sign = torch.where(torch.rand(Tq, 1, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    s = (1e5 * sign - 8 * torch.rand(Tq, T, generator=g, dtype=torch.float64)).float()
    q = (8 * s).view(1, 1, Tq, T)  # scale 1/8: scale * q k^T is s exactly
    k = torch.eye(T).view(1, 1, T, T)
    v = torch.randn(1, 1, T, T, generator=g)
    do = torch.randn(1, 1, Tq, T, generator=g)
    check("softmax", q, k, v, do, scale=0.125)


def test_softmax_rows_whose_max_overflows_are_nan():
    """Softmax forms its exponent as fma(q.k, scale log2(e), -M log2(e)) and flagged non-finite q.k only: with
    finite q and k, a scaled max of +inf (row 0), a finite max whose M log2(e) overflows (row 1, 3e38) or
    valid scores that all overflow to -inf (row 2) weighed every key 0 and gave a quiet zero row. Now such a
    row is NaN (the reference: NaN for rows 0 and 2, the softmax row for row 1; docs/kernels.md). A normal
    row and a fully masked one are unchanged."""
    D = 16
    q, k = torch.zeros(1, 1, 5, D), torch.zeros(1, 1, 5, D)
    k[0, 0, :, 0] = torch.tensor([1e19, 2.0, -1.0, 0.0, 0.0])
    k[0, 0, 3, 1], k[0, 0, 4, 2] = 3e37, -1e19
    q[0, 0, 0, 0], q[0, 0, 1, 1], q[0, 0, 2, 2], q[0, 0, 3, 0] = 1e19, 1.0, 1e19, 1e-18
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    mask[0, 0, 2, :4] = False  # row 2 sees key 4 only: -1e38 * 10 = -inf
    mask[0, 0, 4] = False
    v = torch.randn(1, 1, 5, D, generator=torch.Generator().manual_seed(0))
    kw = dict(mask=mask, scale=10.0)
    out = triton_attention(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), "softmax", **{**kw, "mask": mask.to(DEVICE)}
    )
    ref = kinterval_attention(q, k, v, "softmax", backend="reference", **kw)
    out = out.cpu()
    assert out[0, 0, :3].isnan().all()
    assert ref[0, 0, [0, 2]].isnan().all() and torch.isfinite(ref[0, 0, 1]).all()  # row 1: the deviation
    torch.testing.assert_close(out[0, 0, 3], ref[0, 0, 3], rtol=1e-5, atol=1e-6)
    assert torch.equal(out[0, 0, 4], torch.zeros(D))


def test_softmax_rows_with_a_huge_finite_max_are_the_reference_or_nan():
    """The exponent fma(q.k, scale log2(e), -off) weighs the row max 2^delta with delta the rounding of
    off = M log2(e), up to 1.5 ulp(off): at |M| = 1e10 that is 2^-512 or 2^512, and rows came out as quiet
    zeros (or NaN) where the reference has the softmax row. Scaled maxima from 10 to 1e37, positive and
    negative: a row whose |M log2(e)| is below 2^26 (|M| < 4.65e7) equals the reference, one above it is
    NaN, never a quiet wrong row; its gradient is not defined (docs/kernels.md)."""
    D, n = 16, 8
    mags = [10.0**e for e in range(1, 38)]
    rows = [sign * x for x in mags for sign in (1.0, -1.0)]
    g = torch.Generator().manual_seed(5)
    q = torch.zeros(1, 1, len(rows), D)
    q[0, 0, :, 0] = torch.tensor(rows)
    k = torch.zeros(1, 1, n, D)
    k[0, 0, :, 0] = 1.0 - torch.rand(n, generator=g) * 1e-6  # scores within ~6 ulp of the row max
    k[0, 0, 0, 0] = 1.0
    v = torch.randn(1, 1, n, D, generator=g)
    out = triton_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), "softmax", scale=1.0).cpu()
    ref = kinterval_attention(q, k, v, "softmax", scale=1.0, backend="reference")
    r, kj = torch.tensor(rows), k[0, 0, :, 0]
    M = torch.where(r > 0, r * kj.max(), r * kj.min())  # the row max of the scores r k_j
    over = M.abs() * math.log2(math.e) >= 2.0**26
    assert over.any() and (~over).any()
    assert out[0, 0, over].isnan().all()
    torch.testing.assert_close(out[0, 0, ~over], ref[0, 0, ~over], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, bwd",
    [("minmax-weight-k4", "split"), ("minmax-weight-k4", "fused"), ("fwm-prob-k4", "split")],
)
def test_non_finite_values_on_masked_keys(name, bwd, monkeypatch):
    """A masked key contributes what it does in the reference. Head 0: k holds +inf, -inf and NaN on keys
    masked for every row (their scores are not finite); head 1: v holds NaN on a masked key; head 2: q holds
    inf on a fully masked row. MinMax summed gamma * dw/dM over every key, 0 * NaN on the masked ones, and put
    NaN into dk at each row's arg-max and arg-min key (head 0) and into the empty row's dq (head 2). The
    reference's own NaN stay, from 0 * inf in its products: dq where a masked k is not finite, O where a
    masked v is (every row of head 1: its gradients are those of NaN rows, not compared), dk where a masked
    row's q is. The triton results have the same NaN and the same finite values."""
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    B, H, T, D = 1, 3, 16, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=4)
    mask = torch.rand(B, H, T, T, generator=torch.Generator().manual_seed(2)) < 0.8
    mask[..., [3, 9, 13]] = False
    mask[0, 2, 5] = False  # head 2, row 5: fully masked
    k[0, 0, 3], k[0, 0, 9], k[0, 0, 13] = float("inf"), float("-inf"), float("nan")
    v[0, 1, 9] = float("nan")
    q[0, 2, 5] = float("inf")

    def run(backend):
        x = [t.clone().to(DEVICE).requires_grad_(True) for t in (q, k, v)]
        out = kinterval_attention(*x, name, mask=mask.to(DEVICE), backend=backend)
        out.backward(do.to(DEVICE))
        return [t.detach().cpu() for t in (out, *(y.grad for y in x))]

    got, ref = run("triton"), run("reference")
    got[2][0, 1], ref[2][0, 1] = 0.0, 0.0  # dk of head 1: the gradient of NaN rows
    for what, x, y in zip(("out", "dq", "dk", "dv"), got, ref):
        close = torch.isclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True)
        assert close.all(), (
            f"{what}: {(~close).sum()} elements differ, e.g. at {(~close).nonzero()[0].tolist()}"
        )
    # the cases that were NaN: dk of head 0, dq of head 2
    assert torch.isfinite(ref[2][0, 0]).all() and torch.isfinite(ref[1][0, 2]).all()
    assert ref[1][0, 0].isnan().all() and ref[0][0, 1].isnan().all() and torch.isfinite(ref[3]).all()


def test_non_contiguous_inputs():
    q, k, v, do = make_inputs(1, 2, 29, 29, 16, seed=2)
    # (B, T, H, D) storage viewed as (B, H, T, D)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not q.is_contiguous()
    check("fwm-weight-k4", q, k, v, do, causal=True)


class _StridedGrad(torch.autograd.Function):
    """Identity whose backward hands on the gradient in (B, T, H, D) storage, a non-contiguous (B, H, T, D)
    view, as a transposing layer after attention does."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(1, 2).contiguous().transpose(1, 2)


def test_non_contiguous_upstream_gradient():
    """The kernels read dO with contiguous (B, H, T, D) offsets: a strided dO must reach them as such."""
    q, k, v, do = make_inputs(1, 2, 29, 29, 16, seed=2)

    def strided(a, b, c, spec, **kw):
        return _StridedGrad.apply(triton_attention(a, b, c, spec, **kw))

    check("minmax-prob-k4", q, k, v, do, causal=True, kernel=strided)


def test_only_v_needs_a_gradient():
    """With q and k constant and v a leaf, the training forward runs and dv = P^T dO is the reference's; an
    inference forward there would have left the output without a gradient."""
    q, k, v, do = make_inputs(1, 2, 19, 19, 16, seed=5)
    spec = "minmax-weight-k4"
    vv = v.to(DEVICE).requires_grad_()
    out = triton_attention(q.to(DEVICE), k.to(DEVICE), vv, spec, causal=True)
    assert out.requires_grad
    (dv,) = torch.autograd.grad(out, vv, do.to(DEVICE))

    def ref_dv(dtype):
        v_ = v.to(dtype).requires_grad_()
        o = kinterval_attention(q.to(dtype), k.to(dtype), v_, spec, causal=True, backend="reference")
        return torch.autograd.grad(o, v_, do.to(dtype))[0]

    ref64, ref32 = ref_dv(torch.float64), ref_dv(torch.float32)
    err, err_t = _errs(dv, ref64)[0], _errs(ref32, ref64)[0]
    assert err <= 2 * err_t + 2e-6 * max(1.0, ref64.abs().max().item()), (err, err_t)


@pytest.fixture
def fused_bwd(monkeypatch):
    """KINTERVAL_TRITON_BWD=fused, and the number of fused backward launches (so that a silent fallback to
    the split backward fails the test)."""
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", "fused")
    calls = []
    real = tri_autograd.fused_backward

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(tri_autograd, "fused_backward", spy)
    return calls


FUSED_CASES = [(name, "causal") for name in CORE_OPS] + [
    ("minmax-prob-k4[arithmetic=historical]", "mask"),
    ("fwm-weight-k4[arithmetic=historical]", "mask"),
    ("minmax-weight-k4[range_grad=max_only]", "causal"),
    ("lerp-k4[range_grad=min_only]", "mask"),
    ("minmax-prob-k4[range_grad=detach]", "causal"),
    ("resolved-prob-k4", "mask"),
]


@pytest.mark.parametrize(("name", "masking"), FUSED_CASES)
def test_fused_backward(name, masking, fused_bwd):
    """The one-kernel backward (dQ added atomically, the calibration terms of eq. (2) after the kernel)
    against the float64 reference, at the split kernels' bound; with a general mask, a fully masked row gets
    zero gradients."""
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=zlib.crc32(name.encode()) % 1000)
    mask = None
    if masking == "mask":
        mask = _general_mask(1, 2, 37, 37, seed=6)
        mask[0, 1, 3] = False
    _, res, _ = check(name, q, k, v, do, causal=masking == "causal", mask=mask)
    assert fused_bwd, "the fused backward did not run"
    if mask is not None:
        assert torch.equal(res[1][0, 1, 3].cpu(), torch.zeros(16))


GQA_CASES = [
    # (operator, backward, dtype, masking)
    ("softmax", "split", torch.float32, "causal"),
    ("lerp-k4", "split", torch.float32, "mask"),
    ("minmax-weight-k4", "split", torch.float32, "causal"),
    ("minmax-weight-k4", "fused", torch.float32, "mask"),
    ("fwm-prob-k4", "split", torch.float32, "mask"),
    ("fwm-prob-k4", "fused", torch.float32, "causal"),
    ("minmax-prob-k4[arithmetic=historical]", "split", torch.float32, "causal"),
    ("resolved-weight-k4[range_grad=min_only]", "fused", torch.float32, "mask"),
    ("lerp-k4[range_grad=p1]", "split", torch.float32, "causal"),
    ("minmax-weight-k4", "split", torch.bfloat16, "causal"),
    ("fwm-prob-k4", "fused", torch.bfloat16, "mask"),
]


@pytest.mark.parametrize(("name", "bwd", "dtype", "masking"), GQA_CASES)
def test_grouped_query_heads_read_in_place(name, bwd, dtype, masking, monkeypatch):
    """Grouped-query attention (6 q heads on 2 k/v heads, (B, T, H, D) layout as transformers hands it over):
    the float64 reference's bound; the kernels keep k and v as given (no repeated copy saved for the
    backward); out (also of the inference forward) and dq equal those of explicitly repeated k/v bit for
    bit, and in fp32 dk and dv equal the repeated run's gradients summed over each group."""
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    B, H, H_kv, T, D = 1, 6, 2, 21, 16  # two 16 x 16 tiles a side, the second partial
    q, k, v, do = make_inputs(B, H, T, T, D, seed=zlib.crc32(name.encode()) % 1000, dtype=dtype)
    k, v = k[:, :H_kv], v[:, :H_kv]
    mask = None
    if masking == "mask":  # per head, so that each q head of a group sees its own keys
        mask = _general_mask(B, H, T, T, seed=4)
        mask[0, 4, 3] = False  # a fully masked row
    kw = dict(causal=masking == "causal", mask=None if mask is None else mask.to(DEVICE), precision="ieee")
    check(name, q, k, v, do, **kw)

    q, k, v = (x.to(DEVICE).transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = triton_attention(*leaves, name, **kw)
    assert out.grad_fn.saved_tensors[1].data_ptr() == leaves[1].data_ptr(), "k was copied"
    folds, fold = [], tri_autograd.fold_groups  # each group's G per-q-head gradients are summed in fp32
    monkeypatch.setattr(tri_autograd, "fold_groups", lambda g, like: folds.append(g.dtype) or fold(g, like))
    got = [out.detach(), *torch.autograd.grad(out, leaves, do.to(DEVICE))]
    monkeypatch.setattr(tri_autograd, "fold_groups", fold)
    assert folds == [torch.float32, torch.float32]

    rep = [x.repeat_interleave(H // H_kv, 1) for x in (k, v)]
    want = _grads(lambda a, b, c: triton_attention(a, b, c, name, **kw), q, *rep, do)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with torch.no_grad():
        assert torch.equal(triton_attention(q, k, v, name, **kw), got[0])
    for x, w in zip(got[2:], want[2:], strict=True):
        assert x.shape == (B, H_kv, T, D) and x.dtype == dtype
        folded = w.float().unflatten(1, (H_kv, -1)).sum(2)
        if dtype == torch.float32:
            torch.testing.assert_close(x, folded, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "Dv", "dtype", "gqa"),
    [
        ("minmax-weight-k4", 8, torch.float32, False),
        ("fwm-prob-k4", 24, torch.float32, True),
        ("softmax", 40, torch.bfloat16, False),
        ("lerp-k4", 12, torch.bfloat16, True),
    ],
)
def test_a_value_head_dim_of_its_own(name, Dv, dtype, gqa):
    """v with its own head dim Dv (SDPA allows it; transformers' MLA models pass D = 192, Dv = 128): the
    narrower side is padded with zero columns, which moves no score: the float64 reference's bound on out,
    dq, dk and dv, which come back with their own shapes (also under grouped-query attention)."""
    B, H, T, D = 1, 4, 37, 16
    q, k, _, _ = make_inputs(B, H, T, T, D, seed=zlib.crc32(name.encode()) % 1000, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    v, do = (torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    if gqa:
        k, v = k[:, :2], v[:, :2]
    _, res, _ = check(name, q, k, v, do, causal=True, precision="ieee")
    assert [tuple(x.shape) for x in res] == [tuple(q.shape[:3]) + (Dv,), q.shape, k.shape, v.shape]
    assert res[0].is_contiguous()


def test_grouped_query_head_counts_must_divide():
    q, k, v, _ = make_inputs(1, 4, 8, 8, 16, seed=0)
    with pytest.raises(ValueError, match="q has 4 heads and k, v have 3: grouped-query attention needs"):
        triton_attention(q.to(DEVICE), k[:, :3].to(DEVICE), v[:, :3].to(DEVICE), "lerp-k4")
    with pytest.raises(ValueError, match="do not agree"):
        triton_attention(q.to(DEVICE), k[:, :2].to(DEVICE), v[:, :1].to(DEVICE), "lerp-k4")


@pytest.mark.parametrize("name", ["minmax-prob-k4", "softmax"])
def test_fused_backward_low_precision(name, fused_bwd):
    """bf16 inputs through the fused backward: dK is summed in fp32 until the calibration terms are added
    after the kernel, then rounded once (the bf16 bound of test_low_precision); softmax's P in the exponent
    (the row's log2 normalizer from the row-constants launch)."""
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=13, dtype=torch.bfloat16)
    check(name, q, k, v, do, causal=True)
    assert fused_bwd, "the fused backward did not run"


def test_fused_backward_survives_autotuning(fused_bwd, monkeypatch):
    """Triton's autotuner times a new shape's candidates by running the kernel on the caller's buffers (even a
    single pruned candidate, whenever the kernel has several configs). The fused backward adds dQ and the
    row sums of the calibration terms of eq. (2) atomically, so its pre-hook must zero them before each timed
    launch and before the real one. Here the autotuner runs (two configs, a new cache) with a stand-in timer
    that launches three times: without the hook dQ came out several times too large (on an H200, about 1500
    times)."""
    kern = _kernels_module._bwd_fused_kernel
    launches = []

    def timer(kernel_call, quantiles):
        for _ in range(3):
            kernel_call()
            launches.append(1)
        return [1.0, 1.0, 1.0]

    def cached(kernel_call, quantiles):
        raise AssertionError("the benchmarker cached before the test ran, not the stand-in")

    monkeypatch.setattr(kern, "configs", kern.configs * 2)
    monkeypatch.setattr(kern, "cache", {})
    # Autotuner.do_bench is a functools.cached_property: once a kernel has been timed (on a GPU, by every
    # fused backward before this test) it holds the real benchmarker and _do_bench is no longer read. Seed
    # that state (``cached``), then replace the cached value itself; monkeypatch removes both afterwards.
    monkeypatch.setitem(kern.__dict__, "do_bench", cached)
    monkeypatch.setitem(kern.__dict__, "do_bench", timer)
    q, k, v, do = make_inputs(1, 2, 21, 21, 16, seed=5)
    check("minmax-prob-k4", q, k, v, do, causal=True)
    assert fused_bwd, "the fused backward did not run"
    assert launches, "the autotuner did not time the kernel"


def test_no_timed_launches_without_autotuning(monkeypatch):
    """KINTERVAL_TRITON_AUTOTUNE=0 keeps one candidate, but Triton's autotuner still timed it (~0.1 s of
    launches per kernel and new shape) whenever the kernel has several configs. Its timer (``_timer``) now
    launches nothing then: each kernel of a forward and backward runs once, the real launch."""
    runs = []
    monkeypatch.setattr(_kernels_module, "AUTOTUNE", False)
    for kern in (
        _kernels_module._fwd_kernel,
        _kernels_module._bwd_dq_kernel,
        _kernels_module._bwd_dkdv_kernel,
    ):
        monkeypatch.setattr(kern, "configs", kern.configs * 2)  # as on a GPU: several configs
        monkeypatch.setattr(kern, "cache", {})
        monkeypatch.delitem(kern.__dict__, "do_bench", raising=False)  # the cached_property reads _do_bench
        run = kern.fn.run

        def counted(*args, _run=run, _name=kern.base_fn.__name__, **kwargs):
            runs.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(kern.fn, "run", counted)
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", "split")
    q, k, v, do = (x.to(DEVICE) for x in make_inputs(1, 1, 19, 19, 16, seed=3))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = kinterval_attention(q, k, v, "fwm-prob-k4", causal=True, backend="triton")
    out.backward(do)
    assert sorted(runs) == ["_bwd_dkdv_kernel", "_bwd_dq_kernel", "_fwd_kernel"], runs


def test_fused_backward_falls_back_where_it_cannot_run(fused_bwd, monkeypatch):
    """P1 (its projection needs the complete row sums inside dK) and deterministic algorithms run the split
    backward; an unknown KINTERVAL_TRITON_BWD raises."""
    q, k, v, do = make_inputs(1, 1, 19, 19, 16, seed=3)
    check("lerp-k4[range_grad=p1]", q, k, v, do, causal=True)
    assert not fused_bwd
    flags = tri_autograd.operator_constants(OperatorSpec.parse("fwm-prob-k4"))[0]
    assert tri_autograd.backward_mode(flags) == "fused"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert tri_autograd.backward_mode(flags) == "split"
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", "atomic")
    with pytest.raises(ValueError, match="KINTERVAL_TRITON_BWD"):
        tri_autograd.backward_mode(flags)


@pytest.mark.parametrize("bwd", ["split", "fused"])
@pytest.mark.parametrize("name", ["minmax-weight-k4", "minmax-prob-k4", "lerp-k4"])
def test_degenerate_and_empty_rows(name, bwd, monkeypatch):
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", bwd)
    B, H, T, D = 1, 2, 21, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=4)
    q[0, 0, 9] = 0.0  # all scores equal: degenerate MinMax row (M - m = 0)
    mask = torch.ones(B, H, T, T, dtype=torch.bool)
    mask[0, 1, 4] = False  # fully masked row
    mask[0, 1, 6] = False
    mask[0, 1, 6, 2] = True  # single valid key
    table, res, ref = check(name, q, k, v, do, mask=mask)
    for row in ((0, 0, 9), (0, 1, 6), (0, 1, 4)):  # zero score gradient on degenerate / empty rows
        assert res[1][row].abs().max().item() == 0.0
    assert torch.equal(res[0][0, 1, 4].cpu(), torch.zeros(D))


@pytest.mark.parametrize("bwd", ["split", "fused"])
@pytest.mark.parametrize("span", ["7 * 2^-45", "eps"])
def test_degenerate_row_with_a_nonzero_span(span, bwd, request):
    """App. A: a MinMax row with 0 < M - m <= eps = 1e-12 is degenerate (weight 1 on every valid key, no score
    gradient), as one with M = m: M - m = 7 * 2^-45 (exact scores 2^-22 + j 2^-45), and M - m = fp32(1e-12)
    exactly (scores 0 and fp32(1e-12)), the boundary. The arg-max and arg-min are different keys, so a
    calibration term that is not zeroed would not cancel on one key. Through both backwards: in the fused one
    a gamma (``_fused_step``) that is not zeroed puts G_M on the arg-max key and G_m = -S1 - G_M on the
    arg-min key, since dw/dM (eq. 1) is not 0 off the arg-max key."""
    T, D = 8, 16
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 1, 1, D)
    k = torch.randn(1, 1, T, D, generator=g)
    if span == "eps":
        q[..., 0], scale = 1.0, 1.0
        k[..., 0] = torch.tensor([0.0, 1e-12]).repeat(T // 2)
    else:
        q[..., 0], scale = 2.0**-20, 0.25
        k[..., 0] = 1 + torch.arange(T) * 2.0**-23
    v, do = torch.randn(1, 1, T, D, generator=g), torch.randn(1, 1, 1, D, generator=g)
    calls = request.getfixturevalue("fused_bwd") if bwd == "fused" else None  # its launches
    out, dq, dk, dv = _grads(
        lambda a, b, c: triton_attention(a, b, c, "minmax-weight-k4", scale=scale, precision="ieee"),
        *(x.to(DEVICE) for x in (q, k, v, do)),
    )
    assert calls is None or calls, "the fused backward did not run"
    assert dq.abs().max().item() == 0.0 and dk.abs().max().item() == 0.0
    torch.testing.assert_close(out.cpu(), v.mean(2, keepdim=True))  # weight 1 on each key: the mean of v
    torch.testing.assert_close(dv.cpu(), do.expand(1, 1, T, D) / T)


@pytest.mark.parametrize("name", ["minmax-weight-k4", "fwm-prob-k4", "fp8-exp"])
def test_tie_convention(name):
    """Documented deviation: on exact ties of the row max/min the kernel gives the calibration gradient to the
    first tied key, the reference splits it evenly. out, dq, dv and the tied keys' summed dk agree."""
    B, H, T, D = 1, 1, 24, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=9, dyadic=True)
    k[0, 0, 17] = k[0, 0, 5]  # identical keys: exact score ties in every row
    spec = OperatorSpec.parse(name)
    dev = [x.to(DEVICE) for x in (q, k, v, do)]
    res = _grads(lambda a, b, c: triton_attention(a, b, c, spec, scale=0.25), *dev)
    ref = _grads(
        lambda a, b, c: kinterval_attention(a, b, c, spec, scale=0.25, backend="reference"),
        *[x.double() for x in (q, k, v, do)],
    )
    res = [x.double().cpu() for x in res]
    for i in (0, 1, 3):
        torch.testing.assert_close(res[i], ref[i], atol=2e-5, rtol=1e-5)
    others = [j for j in range(T) if j not in (5, 17)]
    torch.testing.assert_close(res[2][..., others, :], ref[2][..., others, :], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(
        res[2][..., 5, :] + res[2][..., 17, :], ref[2][..., 5, :] + ref[2][..., 17, :], atol=2e-5, rtol=1e-5
    )
    s = (q.double() @ k.double().transpose(-2, -1)) * 0.25
    tied_max = (s.argmax(-1) == 5) | (s.argmax(-1) == 17)
    if tied_max.any():  # the kernel's first-index convention differs from the even split
        assert (res[2][..., 5, :] - ref[2][..., 5, :]).abs().max() > 1e-6
    # the first tied key: the stored arg-max of each row whose max is the tied pair is key 5, never 17
    launch, saved, _ = tri_autograd.forward_launch(*dev[:3], None, spec, False, 0.25, "ieee")
    launch()
    amax, amin = saved.amax.cpu(), saved.amin.cpu()
    assert tied_max.any() and (amax[tied_max] == 5).all()
    tied_min = (s.argmin(-1) == 5) | (s.argmin(-1) == 17)
    if spec.calibration == "minmax":
        assert tied_min.any() and (amin[tied_min] == 5).all()


# ----------------------------------------------------------------------------------- dtypes, precision
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_low_precision_baseline_forms_d_from_the_rounded_output(dtype):
    """``_lowp_kernel_arith`` models the kernels' D_i = dO_i . O_i with O rounded to 16 bits: its score-bias
    gradient (dL/ds itself) is (g - D)/W Delta for LERP without the range terms, with g = dO v^T in fp32 and
    D from the rounded output, and it differs from the exact-D value (<g>_P) by more than rounding."""
    from kinterval.ops.formulas import lerp_slope, lerp_weight, row_extrema

    spec = OperatorSpec.from_full_name("lerp-k4[range_grad=detach]")
    q, k, v, do = make_inputs(1, 2, 9, 13, 16, seed=5, dtype=dtype)
    bias = (torch.randn(1, 2, 9, 13, generator=torch.Generator().manual_seed(6)) * 0.5).requires_grad_()
    out = _lowp_kernel_arith(q, k, v, spec, False, None, 0.25, bias=bias)
    (got,) = torch.autograd.grad(out, bias, do)

    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * 0.25 + bias.detach()
    valid = torch.ones_like(s, dtype=torch.bool)
    ext = row_extrema(s, valid)
    gr = formulas.grid(s, valid, spec, ext.M, ext.m)
    wL = reference.place(lerp_weight(gr), gr)
    W = wL.sum(-1, keepdim=True)
    P = wL.to(dtype).float() / W  # the weights rounded before the P V dot, normalized after it
    o = torch.matmul(P, v.float()).to(dtype)
    g = torch.matmul(do.float(), v.float().transpose(-2, -1))
    D = (do.float() * o.float()).sum(-1, keepdim=True)
    want = (g - D) / W * lerp_slope(gr)
    exact_d = (g - (wL / W * g).sum(-1, keepdim=True)) / W * lerp_slope(gr)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got - exact_d).abs().max() > 100 * (got - want).abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "name",
    [
        "softmax",
        "bf16-exp",
        "fp8-exp",
        "minmax-prob-k4",
        "fwm-weight-k4",
        "minmax-prob-k4[arithmetic=historical]",
    ],
)
def test_low_precision(name, dtype):
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=13, dtype=dtype)
    check(name, q, k, v, do, causal=True)


def test_low_precision_bound_catches_a_wrong_gradient():
    """The bf16 bound of the K-interval operators was built from PyTorch's native bf16 attention, whose
    rounded scores flip grid intervals: a kernel whose dq was 30% too large passed test_low_precision
    (fwm-weight-k4). Against the kernels' own arithmetic (``_lowp_kernel_arith``) it fails."""

    def dq_times_1_3(a, b, c, spec, **kw):
        a2 = a * 1.0
        a2.register_hook(lambda g: g * 1.3)
        return triton_attention(a2, b, c, spec, **kw)

    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=13, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="fwm-weight-k4 dq"):
        check("fwm-weight-k4", q, k, v, do, causal=True, kernel=dq_times_1_3)


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3", "bf16x6"])
@pytest.mark.parametrize("name", ["lerp-k4", "softmax", "fwm-prob-k4"])
def test_precision_modes(name, precision):
    """The split dots (tf32x3, bf16x6) are held to the fp32 bound: 2x the error of the fp32 reference against
    float64. At TF32 softmax's dK/dV takes P in the exponent (the row's log2 normalizer) and FWM's dQ takes
    Delta as one exponential (grid's DELTA_EXP); the other modes keep the products."""
    q, k, v, do = make_inputs(1, 2, 23, 23, 16, seed=17)
    check(name, q, k, v, do, causal=True, precision=precision)


@pytest.mark.skipif(
    HAS_CUDA, reason="interpreter check of the two loop bodies; GPU: test_gpu_large runs both"
)
@pytest.mark.parametrize("name", ["minmax-prob-k4", "lerp-k4[range_grad=p1]", "softmax"])
def test_unsplit_loops_match(name, monkeypatch):
    """16-bit inputs with D <= SPLIT_MAX_D run interior tiles through an unmasked copy of the loop body (by
    default the forward only); force it on in all three kernels, then off: the results must be
    bit-identical."""
    from kinterval.ops.triton import kernels as K

    q, k, v, do = make_inputs(2, 1, 37, 45, 16, seed=23, dtype=torch.bfloat16)
    mask = torch.ones(2, 1, 1, 45, dtype=torch.bool)
    mask[1, ..., 40:] = False
    monkeypatch.setattr(K, "SPLIT_MAX_D", {"fwd": 64, "bwd": 0})  # each pass reads its own limit
    assert K.split_loops("fwd", 2, 16, False) and not K.split_loops("dq", 2, 16, False)
    assert not K.split_loops("dkdv", 2, 16, False)
    monkeypatch.setattr(K, "SPLIT_MAX_D", {"fwd": 0, "bwd": 64})
    assert not K.split_loops("fwd", 2, 16, False) and K.split_loops("dkdv", 2, 16, False)
    monkeypatch.setattr(K, "SPLIT_MAX_D", {"fwd": 64, "bwd": 64})
    assert K.split_loops("dq", 2, 16, False) and not K.split_loops("fwd", 2, 16, True)  # causal runs split
    assert not K.split_loops("fwd", 4, 16, False) and not K.split_loops("dq", 2, 128, False)  # fp32, D > 64
    split = _grads(lambda a, b, c: triton_attention(a, b, c, name, causal=True), q, k, v, do)
    split_m = _grads(lambda a, b, c: triton_attention(a, b, c, name, mask=mask), q, k, v, do)
    monkeypatch.setattr(K, "SPLIT_MAX_D", {"fwd": 0, "bwd": 0})
    whole = _grads(lambda a, b, c: triton_attention(a, b, c, name, causal=True), q, k, v, do)
    whole_m = _grads(lambda a, b, c: triton_attention(a, b, c, name, mask=mask), q, k, v, do)
    for a, b in zip(split + split_m, whole + whole_m):
        assert torch.equal(a, b)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter's speed shims (kernels._patch_interpreter_speed)")
def test_interpreter_tuples_and_block_types_keep_their_values():
    """The speed shims derive a ``tl.tuple``'s type at its first read and share one ``tl.block_type`` per
    element type and shape: the types are those Triton would build, also after ``_setitem``."""
    derive = tl.core._type_for_tuple_values
    t = tl.core.tuple([1, 2.0, tl.float32])
    assert t.type == derive([1, 2.0, tl.float32]) and str(t.type) == str(derive([1, 2.0, tl.float32]))
    t._setitem(0, tl.int8)
    assert t.type == derive([tl.int8, 2.0, tl.float32]) and t.type != derive([1, 2.0, tl.float32])
    assert tl.core.tuple([3], derive([4])).type == derive([4])  # a given type is kept
    a = tl.block_type(tl.float32, [16, 32]).with_element_ty(tl.int32)
    b = tl.block_type(tl.float16, [16, 32]).with_element_ty(tl.int32)
    assert (
        a is b
        and a == tl.block_type(tl.int32, [16, 32])
        and a.numel == 512
        and a.name == tl.block_type(tl.int32, [16, 32]).name
    )
    c = a.with_element_ty(tl.int16)
    assert c != a and list(c.shape) == [16, 32] and c.element_ty == tl.int16
    p = a.with_element_ty(tl.pointer_type(tl.float32))  # unhashable: built anew
    assert p == tl.block_type(tl.pointer_type(tl.float32), [16, 32])


def test_autotune_space_and_pruning(monkeypatch):
    """Pure Python: the candidate lists, the choice of list by dot precision (fp32 "ieee" runs the FMA list),
    the head-dim pruning and KINTERVAL_TRITON_AUTOTUNE=0 (first fit, shared memory included)."""
    from kinterval.ops.triton import kernels as K

    def area(c):
        return c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]

    fp32, bf16 = torch.empty(0), torch.empty(0, dtype=torch.bfloat16)
    for kind in ("fwd", "dq", "dkdv", "fused"):
        mma, fma = K.candidate_configs(kind), K.candidate_configs(kind, fma=True)
        space = mma + fma
        assert len(mma) >= 3 and len(fma) >= 3 and len({K._tile(c) for c in space}) == len(space)
        monkeypatch.setattr(K, "AUTOTUNE", True)
        for q, prec, want in ((bf16, "ieee", mma), (fp32, "tf32", mma), (fp32, "ieee", fma)):
            assert K._prune(space, {"Q": q}, kind=kind, PREC=prec, BLOCK_D=64) == want
        assert K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=128) == mma
        wide = K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=256)
        assert wide and all(area(c) <= 64 * 32 for c in wide)
        fma128 = K._prune(space, {"Q": fp32}, kind=kind, PREC="ieee", BLOCK_D=128)
        assert fma128 and all(area(c) <= 512 for c in fma128)
        # split TF32 has its own list (it shares tiles with the others: kept once, in its own order)
        x3 = K.candidate_configs(kind, tiles="tf32x3")
        space3 = list({K._tile(c): c for c in mma + fma + x3}.values())
        assert len(space3) < len(mma + fma + x3)
        got = K._prune(space3, {"Q": fp32}, kind=kind, PREC="tf32x3", BLOCK_D=64)
        assert [K._tile(c) for c in got] == [K._tile(c) for c in x3]
        got = K._prune(space3, {"Q": bf16}, kind=kind, PREC="tf32x3", BLOCK_D=64)
        assert [K._tile(c) for c in got] == [K._tile(c) for c in mma]
        got = K._prune(space3, {"Q": fp32}, kind=kind, PREC="bf16x6", BLOCK_D=64)  # the other split dots
        assert [K._tile(c) for c in got] == [K._tile(c) for c in x3]
        monkeypatch.setattr(K, "AUTOTUNE", False)
        assert K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=64) == mma[:1]
        assert K._prune(space, {"Q": fp32}, kind=kind, PREC="ieee", BLOCK_D=64) == fma[:1]
        assert K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=256) == wide[:1]
        assert K._prune(space, {"Q": fp32}, kind=kind, PREC="ieee", BLOCK_D=128) == fma128[:1]
        # without autotuning the default must also fit the shared memory (on CUDA: compiled and measured)
        with monkeypatch.context() as mp:
            mp.setattr(K, "_fits_shared_memory", lambda kind_, c, *a, first=mma[0]: c is not first)
            assert K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=64) == mma[1:2]
            mp.setattr(K, "_fits_shared_memory", lambda *a: False)  # none fits: the smallest tile
            assert K._prune(space, {"Q": bf16}, kind=kind, PREC="ieee", BLOCK_D=64) == [min(mma, key=area)]


def test_shared_memory_check_through_the_autotuner(monkeypatch):
    """The shared-memory check as the autotuner calls it: Triton's Autotuner hands the pruner its launch
    keywords (grid, warmup) beside the constexprs, and the check must compile with the constexprs only.
    The compiler is faked (Triton's own ``warmup`` signature); the device limit is patched."""
    from types import SimpleNamespace

    from kinterval.ops.triton import kernels as K

    seen = []

    class FakeJIT:
        def warmup(self, *args, grid, **kwargs):  # triton.runtime.jit.KernelInterface.warmup
            seen.append((args, grid, kwargs))
            return SimpleNamespace(
                metadata=SimpleNamespace(shared=64 * 1024 if kwargs["BLOCK_M"] > 64 else 0)
            )

    q = SimpleNamespace(device=SimpleNamespace(type="cuda"), dtype=torch.bfloat16)
    tuner = K.KERNELS["dq"]
    space = K.candidate_configs("dq")
    monkeypatch.setattr(K, "INTERPRET", False)
    monkeypatch.setattr(K, "AUTOTUNE", False)
    monkeypatch.setattr(K, "_max_shared_mem", lambda: 32 * 1024)
    monkeypatch.setattr(tuner, "fn", FakeJIT())
    monkeypatch.setattr(tuner, "configs", space)
    monkeypatch.setattr(tuner, "nargs", {"Q": q, "K": "k"}, raising=False)
    (chosen,) = tuner.prune_configs({"grid": (7, 1), "warmup": False, "PREC": "ieee", "BLOCK_D": 64})
    assert chosen.kwargs["BLOCK_M"] <= 64 and seen
    args, grid, kwargs = seen[0]
    assert args == (q, "k") and grid == (1,) and "warmup" not in kwargs and kwargs["PREC"] == "ieee"


def _tuning_key(launch):
    """The autotuner's cache key of a launch, as triton.runtime.autotuner.Autotuner.run forms it: the values
    of its ``key`` arguments, then the dtype of every top-level argument that has one."""
    named = {**dict(zip(launch.kernel.arg_names, launch.args)), **launch.meta}
    key = [named[k] for k in launch.kernel.keys if k in named]
    return tuple(key + [str(a.dtype) for a in named.values() if hasattr(a, "dtype")])


def test_autotuning_key_separates_dtypes_and_operators():
    """Grouped kernel arguments must not merge autotuning entries: bf16 and fp32 "ieee" share PREC, so only
    Q's dtype (a top-level argument; tensors inside tuples add none) keeps the FMA tiles of fp32 from being
    reused for bf16; operators and shapes must differ too. Launches are built on meta tensors."""

    def key(dtype, name="minmax-weight-k4", T=64, precision="ieee", kind=0):
        # D = 128: bf16 and fp32 launches agree in SPLIT and PREC there, so only Q's dtype separates them
        q, k, v = (torch.empty(2, 4, T, 128, dtype=dtype, device="meta") for _ in range(3))
        spec = OperatorSpec.from_full_name(name)
        fwd, saved, consts = tri_autograd.forward_launch(q, k, v, None, spec, True, 0.1, precision)
        launches = (fwd, *tri_autograd.backward_launches(torch.empty_like(q), saved, consts)[:2])
        return _tuning_key(launches[kind])

    for kind in range(3):
        base = key(torch.float32, kind=kind)
        assert key(torch.float32, kind=kind) == base
        bf16 = key(torch.bfloat16, kind=kind)
        assert bf16 != base and [x for x in bf16 if x != "torch.uint8"][-1] == "torch.bfloat16"
        assert key(torch.float32, "fwm-prob-k4", kind=kind) != base
        assert key(torch.float32, T=128, kind=kind) != base
        assert key(torch.float32, precision="tf32", kind=kind) != base


def test_kernel_functions_take_grouped_arguments():
    """Every @triton.jit function of kernels.py takes at most 15 parameters: values travel in named tuples
    (strides, shape, row constants, ...), so that no call site passes dozens of positional scalars."""
    import ast

    from kinterval.ops.triton import kernels as K

    tree = ast.parse(open(K.__file__).read())
    jitted = [
        f for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in f.decorator_list)
    ]  # fmt: skip
    assert {"_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel", "grid", "score_grad"} <= {
        f.name for f in jitted
    }
    too_long = {f.name: len(f.args.args) for f in jitted if len(f.args.args) > 15}
    assert not too_long


def test_resolve_precision(monkeypatch):
    assert tri_autograd.resolve_precision(torch.float32, "ieee") == "ieee"
    assert tri_autograd.resolve_precision(torch.float32, "tf32") == "tf32"
    assert tri_autograd.resolve_precision(torch.float32, "tf32x3") == "tf32x3"
    assert tri_autograd.resolve_precision(torch.bfloat16, "tf32x3") == "ieee"
    assert tri_autograd.resolve_precision(torch.bfloat16, "bf16x6") == "ieee"
    # the split dots are the kernels' own code: on a GPU as in the interpreter, whatever Triton's own
    # input precisions are
    monkeypatch.setattr(tri_autograd, "INTERPRET", False)
    for precision in ("tf32x3", "bf16x6"):
        assert tri_autograd.resolve_precision(torch.float32, precision) == precision
    monkeypatch.undo()
    expected = "tf32" if tf32_enabled() else "ieee"
    assert tri_autograd.resolve_precision(torch.float32, None) == expected
    assert tri_autograd.resolve_precision(torch.bfloat16, "tf32") == "ieee"
    with pytest.raises(ValueError, match="precision"):
        tri_autograd.resolve_precision(torch.float32, "fp64")


# -------------------------------------------------------------------------------------- support matrix
def test_supports_matrix():
    for name in CORE_OPS + OTHER_K:
        baseline = not OperatorSpec.parse(name).is_kinterval
        for rg in ["full"] if baseline else ["full", *RANGE_GRADS]:
            spec = OperatorSpec.parse(name) if baseline else OperatorSpec.parse(name, range_grad=rg)
            assert triton_supports(spec), spec.full_name
    for name in HISTORICAL_OPS:  # every range_grad in historical arithmetic too
        for rg in ["full", *RANGE_GRADS]:
            spec = OperatorSpec.parse(name.split("[")[0], range_grad=rg, arithmetic="historical")
            assert triton_supports(spec) and unsupported_reason(spec) is None, spec.full_name
    for name in ("softmax", "bf16-exp", "fp8-exp"):  # every baseline (App. D.5)
        assert triton_supports(OperatorSpec.parse(name)), name
    assert unsupported_reason("bf16-exp") == "spec must be an OperatorSpec, got str"
    assert not triton_supports("bf16-exp")


def test_input_errors():
    q, k, v, _ = make_inputs(1, 1, 20, 16, 16, seed=0)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    with pytest.raises(ValueError, match="causal"):
        triton_attention(q, k, v, "lerp-k4", causal=True)  # Tq > Tk
    with pytest.raises(ValueError, match="dtype|float"):
        triton_attention(q.double(), k.double(), v.double(), "lerp-k4")
    with pytest.raises(ValueError, match="boolean"):
        triton_attention(q, k, v, "lerp-k4", mask=torch.ones(20, 16, device=DEVICE))
    with pytest.raises(ValueError, match="broadcast"):
        triton_attention(q, k, v, "lerp-k4", mask=torch.ones(3, 20, 16, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="scale must be a positive"):  # the kernels scale the max of q k^T
        triton_attention(k, k, v, "softmax", scale=-1.0)
    with pytest.raises(ValueError, match="scale must be a positive"):  # 0: every score 0, a uniform average
        triton_attention(k, k, v, "softmax", scale=0.0)
    with pytest.raises(ValueError, match="causal must be True or False"):  # "no" ran as causal
        triton_attention(k, k, v, "lerp-k4", causal="no")
    for scale in (None, 1.0):  # D = 0 without a scale was a ZeroDivisionError
        with pytest.raises(ValueError, match="head dimension"):
            triton_attention(q[..., :0], k[..., :0], v[..., :0], "lerp-k4", scale=scale)


def test_second_derivatives_raise():
    """The kernels' gradients are first order: differentiating them again (create_graph=True) raised
    "element 0 of tensors does not require grad" (or, with v requiring grad, could come out quietly wrong).
    Now the first derivative is the usual one and a second one raises a named error."""
    q, k, v, do = (x.to(DEVICE) for x in make_inputs(1, 1, 9, 9, 16, seed=0))
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    out = triton_attention(qq, kk, vv, "lerp-k4", causal=True, precision="ieee")
    (gq,) = torch.autograd.grad((out * do).sum(), qq, create_graph=True)
    plain = _grads(
        lambda a, b, c: triton_attention(a, b, c, "lerp-k4", causal=True, precision="ieee"), q, k, v, do
    )
    assert torch.equal(gq.detach(), plain[1])
    for wrt in (kk, vv):
        with pytest.raises(RuntimeError, match="triton.*first order only"):
            torch.autograd.grad((gq**2).sum(), wrt, retain_graph=True)


@pytest.mark.parametrize("empty", ["Tk", "Tq", "BH"])
def test_empty_attention_is_the_references(empty):
    """No key, no query or no head: the kernels launched nothing and raised "empty attention", where the
    reference (and docs/operators.md) gives zeros for Tk = 0 and empty tensors otherwise. Now the same
    result and the same gradients (zeros or empty), with and without a backward."""
    B, H, Tq, Tk = {"Tk": (1, 2, 5, 0), "Tq": (1, 2, 0, 5), "BH": (0, 2, 5, 5)}[empty]
    g = torch.Generator().manual_seed(0)
    q, do = torch.randn(B, H, Tq, 16, generator=g), torch.randn(B, H, Tq, 16, generator=g)
    k, v = torch.randn(B, H, Tk, 16, generator=g), torch.randn(B, H, Tk, 16, generator=g)
    q, k, v, do = (x.to(DEVICE) for x in (q, k, v, do))  # triton_attention refuses CPU tensors on a GPU
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=DEVICE)
    for kw in (dict(causal=Tq <= Tk), dict(mask=mask), dict(causal=Tq <= Tk, kv_heads=1)):
        kv_heads = kw.pop("kv_heads", H)  # 1: grouped-query attention, both k/v heads' first
        kv = (k[:, :kv_heads], v[:, :kv_heads])
        got = _grads(lambda a, b, c, kw=kw: triton_attention(a, b, c, "minmax-prob-k4", **kw), q, *kv, do)
        want = _grads(
            lambda a, b, c, kw=kw, gqa=kv_heads < H: kinterval_attention(
                a, b, c, "minmax-prob-k4", backend="reference", enable_gqa=gqa, **kw
            ),
            q, *kv, do,
        )  # fmt: skip
        for x, y in zip(got, want):
            assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        with torch.no_grad():
            assert torch.equal(triton_attention(q, *kv, "lerp-k4", **kw), want[0])
    with pytest.raises(ValueError, match="broadcast"):
        triton_attention(q, k, v, "lerp-k4", mask=torch.ones(3, Tq, Tk + 1, dtype=torch.bool))


def test_an_expanded_mask_reaches_the_kernel_unmaterialised():
    """An expanded (stride-0) boolean mask was turned into a full uint8 copy (``.to(uint8)`` of a non-dense
    tensor): a (B, 1, 1, Tk) key-padding mask expanded to (B, H, Tq, Tk) cost B·H·Tq·Tk bytes. Now the kernel
    gets a uint8 view of the same bytes, stride 0 on the broadcast dims. A mask whose (batch, head) slice
    reaches element offset 2^31 (the kernels' 32-bit mask offsets overflowed) is refused."""
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(2, 4, 30, 40, 16, seed=0))
    pad = torch.rand(2, 1, 1, 40, generator=torch.Generator().manual_seed(1)).to(DEVICE) > 0.3
    spec = OperatorSpec.parse("lerp-k4")
    for mask in (pad.expand(2, 4, 30, 40), pad):
        launch, _, _ = tri_autograd.forward_launch(q, k, v, mask, spec, False, 0.25, "ieee")
        mask_t, mask_strides = launch.args[1][2], launch.args[3][3]
        assert mask_t.dtype == torch.uint8 and mask_strides == (40, 0, 0, 1)
        assert mask_t.data_ptr() == pad.data_ptr() and torch.equal(mask_t.bool(), mask.expand(2, 4, 30, 40))
    for n, fits in ((46340, True), (46341, False)):  # (n - 1) * n + n - 1 = n^2 - 1 against 2^31
        q = torch.empty(1, 1, n, 16, device="meta")
        mask = torch.empty(n, n, dtype=torch.bool, device="meta")
        if fits:
            tri_autograd.forward_launch(q, q, q, mask, spec, False, 0.25, "ieee")
        else:
            with pytest.raises(ValueError, match="2\\^31"):
                tri_autograd.forward_launch(q, q, q, mask, spec, False, 0.25, "ieee")
    keypad = torch.empty(1, 1, 1, 46341, dtype=torch.bool, device="meta")  # stride 0 along the queries
    tri_autograd.forward_launch(q, q, q, keypad, spec, False, 0.25, "ieee")
    # the largest offset exactly 2^31 (one past int32): Tq = 3, Tk = (2^31 + 1) / 3, 2 Tk + Tk - 1 = 2^31
    q, k = torch.empty(1, 1, 3, 16, device="meta"), torch.empty(1, 1, 715827883, 16, device="meta")
    with pytest.raises(ValueError, match="2\\^31"):
        tri_autograd.forward_launch(q, k, k, torch.empty(3, 715827883, dtype=torch.bool, device="meta"), spec,
                                    False, 0.25, "ieee")  # fmt: skip
    k = k[:, :, :-1]  # 2^31 - 3
    tri_autograd.forward_launch(q, k, k, torch.empty(3, 715827882, dtype=torch.bool, device="meta"), spec,
                                False, 0.25, "ieee")  # fmt: skip


def test_api_backend_triton():
    q, k, v, do = make_inputs(1, 2, 19, 19, 16, seed=21)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    out = kinterval_attention(q, k, v, "fwm-prob-k4", causal=True, backend="triton")
    ref = kinterval_attention(
        q.double(), k.double(), v.double(), "fwm-prob-k4", causal=True, backend="reference"
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ flip-prone rows (doc)
def test_flip_prone_rows_are_left_out(monkeypatch):
    """A second correct fp32 evaluation (grid_flips.emulated_kernel: tensor-core summation order) flips one
    interval boundary at this shape: dq's relative Frobenius error is ~30x torch's, so the plain bound fails.
    With the flip-prone rows left out, the bound holds."""
    # on the CPU on any machine: the flip was measured with the CPU's summation orders (the emulation's and
    # the fp32 reference's); cuBLAS sums in another order, and whether this key then flips is not known
    monkeypatch.setitem(globals(), "DEVICE", "cpu")
    q, k, v, do = make_inputs(1, 4, 1000, 1000, 64, seed=1064)
    kw = dict(causal=True, atol=1e-5, kernel=emulated_kernel)
    with pytest.raises(AssertionError, match="resolved-weight-k4 dq: relative Frobenius"):
        check("resolved-weight-k4", q, k, v, do, exclude_flips=False, **kw)
    check("resolved-weight-k4", q, k, v, do, **kw)


# -------------------------------------------------------------------------------------------- GPU only
GPU_SHAPES = [(2, 4, 128, 128, 64), (1, 4, 1000, 1000, 64), (1, 2, 300, 777, 128), (1, 2, 257, 257, 256)]
# BF16-exp is checked at the small shapes above (they run on the GPU too): at these, most of its rows hold a
# key within fp32 rounding of a bf16 midpoint (flips.flip_rows with the backward's gamma: 40-90% of the rows,
# measured at each shape), too many to leave out
LARGE_CORE_OPS = [name for name in CORE_OPS if name != "bf16-exp"]
GPU_NAMES = [
    *LARGE_CORE_OPS,
    *HISTORICAL_OPS,
    "lerp-k4[range_grad=p1]",
    "minmax-weight-k4[range_grad=max_only]",
]


def _use_tiles(monkeypatch, configs):
    """Each kernel runs the one config ``configs[kind]`` (no autotuning: a single config is launched as is);
    ``monkeypatch`` restores the autotune lists and caches after the test."""
    for kind, kern in _kernels_module.KERNELS.items():
        monkeypatch.setattr(kern, "configs", [configs[kind]])
        monkeypatch.setattr(kern, "cache", {})


@pytest.mark.gpu
@pytest.mark.skipif(
    not HAS_CUDA,
    reason="needs a CUDA device: every candidate at D = 64 and 128, with shared-memory limits "
    "(the interpreter runs each distinct tile shape: test_interpreter_production_tile_shapes)",
)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("mode", ["fp32-ieee", "fp32-tf32", "fp32-tf32x3", "fp32-bf16x6", "bf16"])
def test_gpu_every_autotune_candidate(mode, D, monkeypatch):
    """Each tile config of each kernel is run, the other two kernels on their defaults (the GPU tests
    otherwise run the default config only when KINTERVAL_TRITON_AUTOTUNE=0, and autotuning runs whichever
    candidate is fastest). A candidate that needs more shared memory than the device has is skipped, as the
    autotuner skips it (at D = 128, TF32: the 128 x 64 x 3-stage forward, 256 KB, and the 128 x 64 dK/dV and
    fused tiles, 320 and 352 KB; dQ's 128 x 64 needs 224 KB, within 3 KB of an H100's limit); a default never
    is."""
    from triton.runtime.errors import OutOfResources

    from kinterval.ops.triton import kernels as K

    kernels = K.KERNELS
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    precision = None if mode == "bf16" else mode.split("-")[1]
    lists = {kind: K.candidate_configs(kind, tiles=K.tile_list(dtype, precision)) for kind in kernels}
    atol = {"fp32-tf32": TF32_ATOL, "bf16": 2e-3}.get(mode, 1e-5)  # ieee and the split dots: fp32's
    B, H, T = 2, 2, 200  # not a multiple of any block size
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[1, ..., 150:] = False  # key padding
    skipped = []
    for kind in kernels:
        for i, cfg in enumerate(lists[kind]):
            _use_tiles(monkeypatch, {other: cfg if other == kind else lists[other][0] for other in kernels})
            q, k, v, do = make_inputs(B, H, T, T, D, seed=100 + i, dtype=dtype)
            try:
                check("minmax-prob-k4", q, k, v, do, causal=True, mask=mask, precision=precision, atol=atol)
                check("fwm-weight-k4", q, k, v, do, causal=True, precision=precision, atol=atol)
            except OutOfResources:
                assert i > 0, f"the default {kind} tile {cfg} does not fit the device at D = {D}"
                skipped.append((kind, str(cfg)))
    assert len(skipped) <= 4, f"too many candidates do not fit: {skipped}"


# Every (BLOCK_M, BLOCK_N) of the candidate lists, once: the interpreter otherwise runs one 16 x 16 tile
# (kernels._configs), while every production default is rectangular
PRODUCTION_TILES = sorted(
    {
        (bm, bn)
        for lists in _kernels_module.TILE_LISTS.values()
        for tiles in lists.values()
        for bm, bn, *_ in tiles
    }
)


@pytest.mark.skipif(HAS_CUDA, reason="interpreter check; GPU: test_gpu_every_autotune_candidate")
@pytest.mark.parametrize("case", ["bf16-causal", "fp32-causal-keypad", "bf16-fused"])
@pytest.mark.parametrize("tile", PRODUCTION_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_interpreter_production_tile_shapes(tile, case, monkeypatch, request):
    """All kernels on one production (BLOCK_M, BLOCK_N) against the float64 reference (``check``'s bound),
    causal with Tq != Tk. The interpreter otherwise runs only its 16 x 16 tile (kernels._configs), on which
    code that confuses BLOCK_M and BLOCK_N passes. "bf16-causal" (no mask, D <= 64) runs the split loops,
    whose unmasked interior tiles are key tiles of BLOCK_N in the forward and dQ (_full_key_end) and query
    blocks of BLOCK_M in dK/dV (_full_query_range); "bf16-fused" the same with the fused backward;
    "fp32-causal-keypad" (FMA dots, a key-padding mask) the masked loops only. Tq = BLOCK_M + 11 (a full
    query block and a partial one; at 128 rows one full block) and Tk - Tq = BLOCK_N + 9: every kernel has
    interior tiles and masked ones."""
    bm, bn = tile
    cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=4, num_stages=1)
    _use_tiles(monkeypatch, dict.fromkeys(_kernels_module.KERNELS, cfg))
    Tq = min(bm + 11, 128)
    Tk = Tq + bn + 9
    dtype = torch.float32 if case.startswith("fp32") else torch.bfloat16
    q, k, v, do = make_inputs(1, 1, Tq, Tk, 16, seed=bm * 1000 + bn, dtype=dtype)
    mask = precision = None
    if case == "fp32-causal-keypad":
        mask = torch.ones(1, 1, 1, Tk, dtype=torch.bool)
        mask[..., Tk - 20 :] = False  # key padding: the last 20 keys (only the last rows reach them)
        mask[..., 3::7] = False
        precision = "ieee"  # fp32 FMA dots (the "fma" tile list on a GPU)
    fused = request.getfixturevalue("fused_bwd") if case == "bf16-fused" else None
    check("minmax-prob-k4", q, k, v, do, causal=True, mask=mask, precision=precision)
    assert fused is None or fused, "the fused backward did not run"


@pytest.mark.skipif(HAS_CUDA, reason="interpreter check; GPU: test_gpu_every_autotune_candidate")
@pytest.mark.parametrize(
    ("name", "dtype", "bwd"),
    [
        ("minmax-weight-k4", "fp32", "split"),
        ("minmax-weight-k4", "fp32", "fused"),
        ("fwm-prob-k4[range_grad=max_only]", "fp32", "split"),
        ("minmax-prob-k4", "bf16", "split"),
    ],
)
def test_interpreter_wide_heads(name, dtype, bwd, request):
    """Head dims beyond 64 against the float64 reference. Every other interpreter test runs D <= 32, so the
    kernels' D > 64 branches ran only on a GPU: dQ's unfolded form for MinMax's G_M in fp32 (FOLD) and
    dK/dV's per-score calibration terms of eq. (2) (ARG_AFTER is for BLOCK_D <= 64). D = 96 pads to
    BLOCK_D = 128, so the dims past D are masked too."""
    fused = request.getfixturevalue("fused_bwd") if bwd == "fused" else None
    fp32 = dtype == "fp32"
    q, k, v, do = make_inputs(1, 1, 21, 37, 96, seed=96, dtype=torch.float32 if fp32 else torch.bfloat16)
    mask = torch.ones(1, 1, 1, 37, dtype=torch.bool)
    mask[..., 5::6] = False
    check(name, q, k, v, do, causal=True, mask=mask, precision="ieee" if fp32 else None)
    assert fused is None or fused, "the fused backward did not run"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (the CPU interpreter runs the small subset)")
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["fp32-ieee", "fp32-tf32", "bf16"])
@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_large(name, mode, shape):
    B, H, Tq, Tk, D = shape
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    precision = None if mode == "bf16" else mode.split("-")[1]
    q, k, v, do = make_inputs(B, H, Tq, Tk, D, seed=Tq + D, dtype=dtype)
    atol = {"fp32-ieee": 1e-5, "fp32-tf32": TF32_ATOL, "bf16": 2e-3}[mode]  # GPU exp is not torch's expf
    check(name, q, k, v, do, causal=True, precision=precision, atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (the split dots are tensor-core modes)")
@pytest.mark.parametrize("shape", GPU_SHAPES[1:3], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("precision", ["tf32x3", "bf16x6"])
@pytest.mark.parametrize("name", LARGE_CORE_OPS)
def test_gpu_large_split_dots(name, precision, shape):
    """The split dots (precision="tf32x3": split TF32; "bf16x6": three bf16 parts) at the fp32 bound: twice
    the error of the fp32 reference against float64 (plus the fp32 floor), the bound an evaluation mode
    must meet."""
    B, H, Tq, Tk, D = shape
    q, k, v, do = make_inputs(B, H, Tq, Tk, D, seed=Tq + D)
    check(name, q, k, v, do, causal=True, precision=precision, atol=1e-5)


@triton.jit
def _split_kernel(X, HI, MID, LO, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=1.0)
    hi, lo = _kernels_module._tf32_split(x)
    tl.store(HI + offs, hi, mask=offs < n)
    tl.store(LO + offs, lo, mask=offs < n)
    b_hi, b_mid, b_lo = _kernels_module._bf16_split3(x)
    tl.store(HI + n + offs, b_hi.to(tl.float32), mask=offs < n)
    tl.store(MID + offs, b_mid.to(tl.float32), mask=offs < n)
    tl.store(LO + n + offs, b_lo.to(tl.float32), mask=offs < n)


def _split_inputs():
    """fp32 normals over 60 binades, both signs, and the rounding cases of the TF32 split: values exactly
    halfway between two TF32 numbers (ties), just below and above them, and values that round up into the
    next binade."""
    g = torch.Generator().manual_seed(0)
    n = 1 << 13
    x = (torch.rand(n, generator=g) + 1) * 2.0 ** torch.randint(-30, 30, (n,), generator=g).float()
    x = x * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    base = x[:512].view(torch.int32) & ~0x1FFF  # TF32 numbers
    edges = [base | 0x1000, (base | 0x1000) - 1, (base | 0x1000) + 1, base | 0x1FFF]
    near_two = torch.tensor([2 - 2.0**-23, 2 - 2.0**-12, -(2 - 2.0**-23)]).view(torch.int32)
    return torch.cat([x, *(e.view(torch.float32) for e in edges), near_two.view(torch.float32)])


def test_split_dot_parts_are_exact():
    """The split dots' parts (kernels._tf32_split, _bf16_split3), against float64 arithmetic: the TF32 high
    part is x rounded to 10 fraction bits to nearest, ties away from zero (PTX's cvt.rna.tf32.f32, which
    Triton's own tf32x3 uses), and the low part is the exact rest; the bf16 parts are bf16 numbers, the first
    x rounded to bf16 (to nearest even), each next one the rounding of the rest, and the three sum to x
    exactly."""
    x = _split_inputs().to(DEVICE)
    n = x.numel()
    hi, mid, lo = (torch.full((2 * n,), float("nan"), device=DEVICE) for _ in range(3))
    _split_kernel[(triton.cdiv(n, 1 << 12),)](x, hi, mid, lo, n, BLOCK=1 << 12)
    x64 = x.double().cpu()
    t_hi, t_lo = hi[:n].double().cpu(), lo[:n].double().cpu()
    m, e = torch.frexp(x64)  # |x| = |m| 2^e, |m| in [1/2, 1): a TF32 ulp is 2^(e - 11)
    ulp = torch.ldexp(torch.ones_like(x64), e - 11)
    want = torch.sign(x64) * torch.floor(x64.abs() / ulp + 0.5) * ulp
    assert torch.equal(t_hi, want), f"{int((t_hi != want).sum())} of {n} TF32 high parts differ"
    assert torch.equal(t_hi + t_lo, x64)
    assert (hi[:n].cpu().view(torch.int32) & 0x1FFF == 0).all()
    b_hi, b_mid, b_lo = hi[n:].cpu(), mid[:n].cpu(), lo[n:].cpu()
    for part in (b_hi, b_mid, b_lo):
        assert torch.equal(part.to(torch.bfloat16).float(), part)
    assert torch.equal(b_hi, x.cpu().to(torch.bfloat16).float())
    assert torch.equal(b_mid, (x64 - b_hi.double()).float().to(torch.bfloat16).float())
    assert torch.equal(b_hi.double() + b_mid.double() + b_lo.double(), x64)


@pytest.mark.parametrize("bwd", ["split", "fused"])
@pytest.mark.parametrize("precision", ["tf32x3", "bf16x6"])
@pytest.mark.parametrize("name", ["softmax", "lerp-k4", "minmax-weight-k4", "fwm-prob-k4"])
def test_interpreter_split_dots(name, precision, bwd, request):
    """The split dots are the kernels' own code (kernels._dot_tf32x3, _dot_bf16x6), so the interpreter runs
    them too: every dot of the forward and of both backward kernels (or the fused one) at the fp32 bound
    against float64. The interpreter multiplies the parts in fp32 without truncating the TF32 low parts, so
    this checks the parts and the products the dots keep (one left out is a 2^-9 or 2^-12 error), not the
    tensor cores' rounding (test_gpu_large_split_dots)."""
    fused = request.getfixturevalue("fused_bwd") if bwd == "fused" else None
    q, k, v, do = make_inputs(1, 2, 23, 37, 16, seed=11)
    check(name, q, k, v, do, causal=True, precision=precision)
    assert fused is None or fused, "the fused backward did not run"


def evaluation_errors(precision, D, T=1024, H=8, kernel=triton_attention):
    """{operator: (kernel error, torch fp32 error)} of the forward at ``precision``: max |out - out64| over
    the rows that are not flip-prone (kinterval.ops.flips), B = 1, causal, TF32 off (the benchmark's error
    columns at its default error shape)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, H, T, D, generator=g) for _ in range(3))
    valid = valid_mask((1, H, T, T), "cpu", causal=True, mask=None)
    dev = [x.to(DEVICE) for x in (q, k, v)]
    out = {}
    for name in CORE_OPS:
        spec = OperatorSpec.from_full_name(name)
        keep = ~flip_rows(spec, q, k, D**-0.5, valid)
        with torch.no_grad():
            ref = kinterval_attention(*(x.double() for x in dev), spec, causal=True, backend="reference")
            with tf32_switch(False):
                got = kernel(*dev, spec, causal=True, precision=precision)
                torch32 = kinterval_attention(*dev, spec, causal=True, backend="reference")
        out[name] = tuple((x.double() - ref).abs().amax(-1).cpu()[keep].max().item() for x in (got, torch32))
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (the tensor cores' rounding is the question)")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("precision", ["ieee", "bf16x6"])
def test_gpu_evaluation_precision_within_twice_torch_fp32(precision, D):
    """The bound an evaluation mode must meet, with no floor: the forward's error against float64 at most
    twice that of torch's fp32 attention (cuBLAS, TF32 off) on the rows that are not flip-prone. "ieee" is
    the default; bf16x6 is the candidate to replace it (docs/kernels.md, precision modes)."""
    errors = evaluation_errors(precision, D)
    worse = {n: e for n, e in errors.items() if e[0] > 2 * e[1]}
    assert not worse, f"{precision}, D = {D}: (kernel, torch fp32) errors over 2x: {worse}"


def test_evaluation_errors_measure_the_kernel():
    """evaluation_errors (the GPU test above) on a small shape in the interpreter: the kernel's error is
    measured and small, and a kernel whose output is off by 1e-3 is seen."""
    errors = evaluation_errors("ieee", 16, T=40, H=2)
    assert set(errors) == set(CORE_OPS)
    assert all(0 < e[0] < 1e-5 and 0 < e[1] < 1e-5 for e in errors.values()), errors

    def off(*args, **kw):
        return triton_attention(*args, **kw) + 1e-3

    errors = evaluation_errors("ieee", 16, T=40, H=2, kernel=off)
    assert all(e[0] > 9e-4 > 1e-5 > e[1] for e in errors.values()), errors


@pytest.mark.parametrize("name", ["lerp-k16777216", "fwm-prob-k65536", "minmax-weight-k4096"])
def test_large_k_gradients_keep_fp32_accuracy(name):
    """Delta = (e^{b_{r+1}} - e^{b_r})/h lost the digits of h = span/K in every backend (fp32 gradients
    against float64: 0.56 off at K = 2^24, 7e-4 at fwm-prob-k65536, 2e-4 at minmax-weight-k4096; kernel: the
    same from 1 - e^{-h}). Now each backend's fp32 gradients stay near softmax's error (~1e-6 here)."""
    q, k, v, do = make_inputs(1, 2, 24, 24, 16, seed=5)
    exact = _grads(  # float64, the reference (it compared with the fp32 gradients of the default backend)
        lambda a, b, c: kinterval_attention(a, b, c, name, causal=True, backend="reference"),
        *[x.double().cpu() for x in (q, k, v, do)],
    )
    assert exact[1].dtype == torch.float64
    for backend in ("reference", "closed_form", "triton"):
        kw = dict(causal=True, backend=backend, precision="ieee")
        got = _grads(
            lambda a, b, c, kw=kw: kinterval_attention(a, b, c, name, **kw),
            *[x.float().to(DEVICE) for x in (q, k, v, do)],
        )
        for g, e in zip(got[1:], exact[1:]):
            err = ((g.double().cpu() - e).abs().max() / e.abs().max()).item()
            assert err < 2e-5, (backend, err)


# ---------------------------------------------------------------------------------------- attention sinks
def _sinks_for(q, k, scale, valid, dtype):
    """One attention sink per q head (4 heads), one case of the kernels each: head 0 above every valid score
    (the arg-max of every row), head 1 inside the rows' range, head 2 below every valid score (MinMax's
    arg-min of every row), head 3 -inf (no sink); rounded to ``dtype``."""
    s = (q.double() @ k.double().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-2, -1)) * scale
    hi = s.masked_fill(~valid, float("-inf")).amax((0, 2, 3))
    lo = s.masked_fill(~valid, float("inf")).amin((0, 2, 3))
    sinks = torch.stack([hi[0] + 0.5, 0.3 * hi[1] + 0.7 * lo[1], lo[2] - 0.5, torch.tensor(float("-inf"))])
    return sinks.to(dtype)


SINK_CASES = [
    # (operator, dtype, masking)
    ("softmax", torch.float32, "causal"),
    ("softmax", torch.float32, "mask"),
    ("bf16-exp", torch.float32, "mask"),
    ("fp8-exp", torch.float32, "causal"),
    ("lerp-k4", torch.float32, "causal"),
    ("minmax-weight-k4", torch.float32, "mask"),
    ("minmax-prob-k4", torch.float32, "causal"),
    ("fwm-weight-k4", torch.float32, "causal"),
    ("fwm-prob-k4", torch.float32, "mask"),
    ("resolved-prob-k4", torch.float32, "causal"),
    ("minmax-prob-k4[arithmetic=historical]", torch.float32, "mask"),
    ("fwm-prob-k4[arithmetic=historical]", torch.float32, "causal"),
    ("minmax-weight-k4[range_grad=max_only]", torch.float32, "causal"),
    ("lerp-k4[range_grad=min_only]", torch.float32, "mask"),
    ("lerp-k16[range_grad=detach]", torch.float32, "causal"),
    ("fwm-prob-k4[range_grad=p1]", torch.float32, "mask"),
    ("softmax", torch.bfloat16, "causal"),
    ("minmax-weight-k4", torch.bfloat16, "causal"),
    ("fwm-prob-k4", torch.bfloat16, "mask"),
]


@pytest.mark.parametrize(("name", "dtype", "masking"), SINK_CASES)
def test_attention_sinks(name, dtype, masking):
    """Attention sinks (one key per q head without a value, key Tk) against the float64 reference with the
    sinks appended to every row (``api.with_sinks``), at the bound of every other case, the sinks' gradient
    included. The heads cover a sink that is every row's arg-max, one inside the rows, one below every
    score (MinMax's arg-min) and none (-inf); with a general mask a fully masked row holds only its sink:
    O = 0 and no gradient to q."""
    B, H, T, D = 1, 4, 37, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=zlib.crc32(name.encode()) % 1000, dtype=dtype)
    mask = _general_mask(B, H, T, T, seed=8) if masking == "mask" else None
    if mask is not None:
        mask[0, 1, 3] = False  # a row of head 1 (its sink inside the range) with no key but the sink
    valid = valid_mask((B, H, T, T), "cpu", causal=masking == "causal", mask=mask)
    sinks = _sinks_for(q, k, D**-0.5, valid, dtype)
    table, res, ref = check(name, q, k, v, do, causal=masking == "causal", mask=mask, sinks=sinks)
    assert res[4].shape == (H,) and res[4][3] == 0  # no sink, no gradient
    assert ref[4][0].abs() > 1e-3  # a gradient worth checking (FWM's tail cut may zero the low sinks')
    if mask is not None:
        assert torch.equal(res[0][0, 1, 3].cpu(), torch.zeros(D, dtype=dtype))
        assert torch.equal(res[1][0, 1, 3].cpu(), torch.zeros(D, dtype=dtype))


@pytest.mark.parametrize("name", ["softmax", "minmax-weight-k4", "fwm-prob-k4[arithmetic=historical]"])
def test_sinks_in_inference_the_fused_fallback_and_grouped_heads(name, monkeypatch):
    """With sinks, the inference forward returns the training forward's output bit for bit;
    KINTERVAL_TRITON_BWD=fused keeps the split backward (the sinks' gradient is a row sum of the dQ kernel),
    with its bits; grouped-query attention (4 q heads on 2 k/v heads) meets the reference's bound; sinks that
    are all -inf give the results of no sinks bit for bit."""
    B, H, T, D = 1, 4, 37, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=21)
    valid = valid_mask((B, H, T, T), "cpu", causal=True, mask=None)
    sinks = _sinks_for(q, k, D**-0.5, valid, torch.float32)
    dev = [x.to(DEVICE) for x in (q, k, v, do)]
    kw = dict(causal=True, precision="ieee")
    run = _grads(
        lambda a, b, c, s: triton_attention(a, b, c, name, sinks=s, **kw), *dev, sinks=sinks.to(DEVICE)
    )
    with torch.no_grad():
        assert torch.equal(triton_attention(*dev[:3], name, sinks=sinks.to(DEVICE), **kw), run[0])
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", "fused")
    fused = _grads(
        lambda a, b, c, s: triton_attention(a, b, c, name, sinks=s, **kw), *dev, sinks=sinks.to(DEVICE)
    )
    assert all(torch.equal(x, y) for x, y in zip(run, fused, strict=True))
    monkeypatch.delenv("KINTERVAL_TRITON_BWD")
    check(name, q, k[:, :2], v[:, :2], do, causal=True, sinks=sinks)
    none = torch.full((H,), float("-inf"), device=DEVICE)
    with_none = _grads(lambda a, b, c, s: triton_attention(a, b, c, name, sinks=s, **kw), *dev, sinks=none)
    without = _grads(lambda a, b, c: triton_attention(a, b, c, name, **kw), *dev)
    assert all(torch.equal(x, y) for x, y in zip(with_none[:4], without, strict=True))
    assert torch.equal(with_none[4], torch.zeros(H, device=DEVICE))


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("name", ["softmax", "minmax-weight-k4", "fwm-prob-k4"])
def test_non_finite_sinks_give_nan_rows(name, train):
    """A NaN or +inf sink makes every row of its head NaN (as the reference's row), never a quiet row; the
    other heads keep their finite results. With no key at all (Tk = 0) a row holds only its sink: O = 0,
    NaN under a NaN sink."""
    B, H, T, D = 1, 3, 21, 16
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(B, H, T, T, D, seed=2))
    for bad in (float("nan"), float("inf")):
        sinks = torch.tensor([0.5, bad, -1.0], device=DEVICE, requires_grad=train)
        with torch.set_grad_enabled(train):
            leaves = [x.detach().requires_grad_(train) for x in (q, k, v)]
            out = triton_attention(*leaves, name, causal=True, sinks=sinks, precision="ieee")
        assert out[:, 1].isnan().all() and out[:, [0, 2]].isfinite().all(), bad
    sinks = torch.tensor([0.5, float("nan"), 1.0], device=DEVICE, requires_grad=True)
    empty = triton_attention(q, k[:, :, :0], v[:, :, :0], name, sinks=sinks)
    assert empty[:, [0, 2]].eq(0).all() and empty[:, 1].isnan().all()
    (grad,) = torch.autograd.grad(empty[:, [0, 2]].sum(), sinks)  # only the sinks need a gradient: zeros
    assert torch.equal(grad, torch.zeros_like(grad))


def test_sink_arguments_are_checked():
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(1, 2, 8, 8, 16, seed=1))
    for bad, match in (
        (torch.zeros(3), r"sinks must have shape \(2,\)"),
        (torch.zeros(1, 2), r"sinks must have shape \(2,\)"),
        (torch.zeros(2, dtype=torch.long), "sinks must be a floating tensor"),
        ([0.0, 0.0], "sinks must be a floating tensor"),
        (torch.zeros(2, device="meta"), "sinks must be on q's device"),
    ):
        with pytest.raises(ValueError, match=match):
            triton_attention(q, k, v, "fwm-prob-k4", sinks=bad)


@pytest.mark.parametrize("name", ["minmax-weight-k4", "fwm-prob-k4"])
def test_a_key_tied_with_the_sink_keeps_the_arg_max(name):
    """The sink is key Tk, after every real key: a real key whose score equals the sink exactly is the row's
    arg-max (the first index among ties), and eq. (2)'s calibration term G_M lands on it, not on the sink.
    Exact scores (dyadic inputs); the reference gets the sink lowered by 1e-9, which breaks the tie the same
    way, in float64."""
    B, H, T, D = 1, 2, 24, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=3, dyadic=True)
    s = (q.double() @ k.double().transpose(-2, -1)) * 0.25
    sinks = torch.stack([s[0, 0, -1].max(), torch.tensor(-0.75, dtype=torch.float64)])  # row T-1 of head 0
    got = _grads(
        lambda a, b, c, z: triton_attention(
            a, b, c, name, causal=True, scale=0.25, sinks=z, precision="ieee"
        ),
        *[x.to(DEVICE) for x in (q, k, v, do)],
        sinks=sinks.float().to(DEVICE),
    )
    want = _grads(
        lambda a, b, c, z: kinterval_attention(
            a, b, c, name, causal=True, scale=0.25, sinks=z, backend="reference"
        ),
        *[x.double() for x in (q, k, v, do)],
        sinks=sinks - torch.tensor([1e-9, 0.0], dtype=torch.float64),
    )
    for x, w, what in zip(got, want, ("out", "dq", "dk", "dv", "dsinks"), strict=True):
        err = (x.double().cpu() - w).abs().max().item()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), (what, err)


# ------------------------------------------------------------------------------------------------- softcap
SOFTCAP_CASES = [
    # (operator, dtype, masking, softcap c); the scores' sd is about 4
    ("softmax", torch.float32, "causal", 3.0),
    ("softmax", torch.float32, "mask", 20.0),
    ("bf16-exp", torch.float32, "causal", 3.0),
    ("fp8-exp", torch.float32, "mask", 3.0),
    ("lerp-k4", torch.float32, "mask", 3.0),
    ("minmax-weight-k4", torch.float32, "causal", 3.0),
    ("minmax-prob-k4", torch.float32, "mask", 8.0),
    ("fwm-weight-k4", torch.float32, "causal", 8.0),
    ("fwm-prob-k4", torch.float32, "causal", 3.0),
    ("resolved-lerp-k4", torch.float32, "mask", 3.0),
    ("minmax-weight-k4[arithmetic=historical]", torch.float32, "causal", 3.0),
    ("fwm-prob-k4[arithmetic=historical]", torch.float32, "mask", 3.0),
    ("minmax-prob-k4[range_grad=min_only]", torch.float32, "causal", 3.0),
    ("lerp-k16[range_grad=max_only]", torch.float32, "mask", 3.0),
    ("fwm-prob-k4[range_grad=p1]", torch.float32, "causal", 3.0),
    ("softmax", torch.bfloat16, "causal", 3.0),
    ("minmax-weight-k4", torch.bfloat16, "mask", 3.0),
    ("fwm-prob-k4", torch.bfloat16, "causal", 8.0),
]


@pytest.mark.parametrize(("name", "dtype", "masking", "cap"), SOFTCAP_CASES)
def test_softcap(name, dtype, masking, cap):
    """A softcap (Gemma 2: s = c tanh(scale q k^T / c)) against the float64 reference with the same softcap
    (``api.modified_scores``), at the bound of every other case: the forward, the chain factor 1 - (s/c)^2
    of the dots into dQ and dK, and the calibration terms of eq. (2) on the arg keys, whose factor is taken
    at M and m. With a general mask a fully masked row stays a zero row."""
    B, H, T, D = 1, 2, 37, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=zlib.crc32(name.encode()) % 1000 + int(cap), dtype=dtype)
    mask = _general_mask(B, H, T, T, seed=9) if masking == "mask" else None
    if mask is not None:
        mask[0, 1, 3] = False
    _, res, _ = check(name, q, k, v, do, causal=masking == "causal", mask=mask, softcap=cap)
    if mask is not None:
        assert torch.equal(res[0][0, 1, 3].cpu(), torch.zeros(D, dtype=dtype))


@pytest.mark.parametrize(("name", "masking"), [("minmax-weight-k4", "causal"), ("fwm-prob-k4", "mask")])
def test_softcap_fused_backward(name, masking, fused_bwd):
    """The one-kernel backward with a softcap: the chain factor in its dots and, after the kernel, at the arg
    keys of the calibration terms (``autograd.fused_backward``)."""
    q, k, v, do = make_inputs(1, 2, 37, 37, 16, seed=13)
    mask = _general_mask(1, 2, 37, 37, seed=6) if masking == "mask" else None
    check(name, q, k, v, do, causal=masking == "causal", mask=mask, softcap=3.0)
    assert fused_bwd, "the fused backward did not run"


@pytest.mark.parametrize("name", ["softmax", "minmax-prob-k4", "resolved-weight-k4[arithmetic=historical]"])
def test_softcap_with_sinks_grouped_heads_and_inference(name):
    """A softcap with attention sinks (not capped: they join the row after the softcap, as in
    ``kinterval_attention``) on grouped-query heads, against the reference; the inference forward gives the
    training forward's output bit for bit. A row with an infinite q k^T on a key it attends is NaN though the
    softcap would bound that score, in both forwards."""
    B, H, T, D = 1, 4, 29, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=17)
    valid = valid_mask((B, H, T, T), "cpu", causal=True, mask=None)
    sinks = _sinks_for(q, k, D**-0.5, valid, torch.float32).clamp_max(1.5)  # inside the capped range
    check(name, q, k[:, :2], v[:, :2], do, causal=True, sinks=sinks, softcap=3.0)
    qd, kd, vd = (x.to(DEVICE) for x in (q, k, v))
    kw = dict(causal=True, softcap=3.0, sinks=sinks.to(DEVICE), precision="ieee")
    train = triton_attention(*(x.detach().requires_grad_() for x in (qd, kd, vd)), name, **kw)
    with torch.no_grad():
        assert torch.equal(triton_attention(qd, kd, vd, name, **kw), train.detach())
        qi = qd.clone()
        qi[0, 1, 5, 0] = float("inf")
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                out = triton_attention(qi.requires_grad_(grad), kd, vd, name, **kw)
            assert (
                out[0, 1, 5].isnan().all() and out[0, 1, :5].isfinite().all() and out[0, 0].isfinite().all()
            )


def test_softcap_arguments_are_checked():
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(1, 2, 8, 8, 16, seed=1))
    for bad in (0, -1.0, float("inf"), float("nan"), True, "3"):
        with pytest.raises(ValueError, match="softcap must be a positive finite number"):
            triton_attention(q, k, v, "fwm-prob-k4", softcap=bad)


# ------------------------------------------------------------------------------------------------- bias
def _bias_for(shape, seed, dtype=torch.float32, grad=True):
    """An additive score bias of ``shape`` (about the scores' sd of 4), in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).requires_grad_(grad)


BIAS_CASES = [
    # (operator, dtype, masking, bias shape (B = 2 for "B1TT"), bias requires grad)
    ("softmax", torch.float32, "causal", "1HTT", True),
    ("softmax", torch.float32, "mask", "TT", False),
    ("bf16-exp", torch.float32, "mask", "B1TT", True),
    ("fp8-exp", torch.float32, "causal", "1HTT", True),
    ("lerp-k4", torch.float32, "causal", "TT", True),
    ("minmax-weight-k4", torch.float32, "mask", "1HTT", True),
    ("minmax-weight-k4", torch.float32, "causal", "TT", False),
    ("minmax-prob-k4", torch.float32, "causal", "B1TT", True),
    ("fwm-lerp-k4", torch.float32, "mask", "TT", True),
    ("fwm-weight-k4", torch.float32, "causal", "1HTT", True),
    ("fwm-prob-k4", torch.float32, "mask", "TT", True),
    ("resolved-lerp-k4", torch.float32, "mask", "1HTT", True),
    ("resolved-weight-k4", torch.float32, "causal", "TT", True),
    ("resolved-prob-k4", torch.float32, "causal", "B1TT", True),
    ("minmax-prob-k4[arithmetic=historical]", torch.float32, "mask", "1HTT", True),
    ("fwm-weight-k4[arithmetic=historical]", torch.float32, "causal", "TT", True),
    ("minmax-weight-k4[range_grad=max_only]", torch.float32, "causal", "1HTT", True),
    ("lerp-k4[range_grad=min_only]", torch.float32, "mask", "TT", True),
    ("lerp-k16[range_grad=detach]", torch.float32, "causal", "1HTT", True),
    ("fwm-prob-k4[range_grad=p1]", torch.float32, "mask", "1HTT", True),
    ("minmax-weight-k4[range_grad=p1]", torch.float32, "causal", "TT", True),
    ("softmax", torch.bfloat16, "causal", "1HTT", True),
    ("minmax-weight-k4", torch.bfloat16, "mask", "TT", True),
    ("fwm-prob-k4", torch.bfloat16, "causal", "B1TT", False),
]


@pytest.mark.parametrize(("name", "dtype", "masking", "shape", "grad"), BIAS_CASES)
def test_score_bias(name, dtype, masking, shape, grad):
    """An additive score bias (ALiBi, T5), s = scale q k^T + bias, broadcast from (1, H, T, T), (B, 1, T, T)
    or (T, T), against the float64 reference with the bias as a float mask, at the bound of every other
    case, and its gradient dL/dbias = dL/ds (eq. 2, the calibration terms on the arg keys included) summed
    over the broadcast dims. With a general mask the bias under masked keys is ignored, and a fully masked
    row stays a zero row."""
    B, H, T, D = (2 if shape == "B1TT" else 1), 2, 29, 16
    seed = zlib.crc32(f"{name}{shape}".encode()) % 1000
    q, k, v, do = make_inputs(B, H, T, T, D, seed=seed, dtype=dtype)
    dims = {"1HTT": (1, H, T, T), "B1TT": (B, 1, T, T), "TT": (T, T)}[shape]
    bias = _bias_for(dims, seed + 1, grad=grad)
    mask = _general_mask(B, H, T, T, seed=10) if masking == "mask" else None
    table, res, ref = check(name, q, k, v, do, causal=masking == "causal", mask=mask, bias=bias)
    assert ("dbias" in table) == grad
    if grad:
        assert res[4].shape == bias.shape and res[4].dtype == bias.dtype
        assert ref[4].abs().max() > 1e-2  # a gradient worth checking
    if mask is not None:
        assert torch.equal(res[0][0, 1, 3].cpu(), torch.zeros(D, dtype=dtype))


@pytest.mark.parametrize("name", ["softmax", "minmax-prob-k4", "fwm-weight-k4[arithmetic=historical]"])
def test_bias_with_softcap_sinks_grouped_heads_and_inference(name, monkeypatch):
    """A bias with a softcap (the bias added after it: the calibration terms on the arg keys take tanh's
    slope at M and m less the bias there) and attention sinks on grouped-query heads, against the reference;
    the inference forward gives the training forward's output bit for bit, and KINTERVAL_TRITON_BWD=fused
    keeps the split backward (the bias's gradient comes from the dQ kernel), with its bits."""
    B, H, T, D = 1, 4, 23, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=31)
    valid = valid_mask((B, H, T, T), "cpu", causal=True, mask=None)
    sinks = _sinks_for(q, k, D**-0.5, valid, torch.float32).clamp_max(1.5)
    bias = _bias_for((1, H, T, T), 32) * 0.5
    check(name, q, k[:, :2], v[:, :2], do, causal=True, sinks=sinks, softcap=3.0, bias=bias)
    dev = [x.to(DEVICE) for x in (q, k[:, :2], v[:, :2], do)]
    kw = dict(causal=True, softcap=3.0, sinks=sinks.to(DEVICE), precision="ieee")
    split = _grads(
        lambda a, b, c, **z: triton_attention(a, b, c, name, **kw, **z), *dev, bias=bias.to(DEVICE)
    )
    with torch.no_grad():
        assert torch.equal(triton_attention(*dev[:3], name, bias=bias.to(DEVICE), **kw), split[0])
    monkeypatch.setenv("KINTERVAL_TRITON_BWD", "fused")
    fused = _grads(
        lambda a, b, c, **z: triton_attention(a, b, c, name, **kw, **z), *dev, bias=bias.to(DEVICE)
    )
    assert all(torch.equal(x, y) for x, y in zip(split, fused, strict=True))


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize(
    ("name", "cap"), [("softmax", None), ("minmax-weight-k4", None), ("fwm-prob-k4", 3.0)]
)
def test_non_finite_bias_gives_nan_rows(name, cap, train):
    """A NaN, +inf or -inf bias entry on a key the row attends makes that row NaN (as the reference's row,
    with or without a softcap), never a quiet row; one on a key the row does not attend (causal) changes
    nothing; the other rows keep their finite results."""
    B, H, T, D = 1, 2, 21, 16
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(B, H, T, T, D, seed=4))
    bias = _bias_for((1, H, T, T), 5, grad=False).to(DEVICE)
    kw = dict(causal=True, precision="ieee", **({} if cap is None else {"softcap": cap}))
    clean = triton_attention(q, k, v, name, bias=bias, **kw)
    bad = bias.clone()
    bad[0, 0, 4, 2], bad[0, 1, 7, 7], bad[0, 1, 9, 0] = float("nan"), float("inf"), float("-inf")
    bad[0, 0, 3, 10] = float("nan")  # key 10 is after query 3: masked
    with torch.set_grad_enabled(train):
        leaves = [x.detach().requires_grad_(train) for x in (q, k, v, bad)]
        out = triton_attention(*leaves[:3], name, bias=leaves[3], **kw)
    rows = torch.zeros(B, H, T, dtype=torch.bool, device=DEVICE)
    rows[0, 0, 4] = rows[0, 1, 7] = rows[0, 1, 9] = True
    assert out[rows].isnan().all() and torch.equal(out[~rows], clean[~rows])


def test_bias_arguments_are_checked():
    q, k, v, _ = (x.to(DEVICE) for x in make_inputs(1, 2, 8, 8, 16, seed=1))
    for bad, match in (
        (torch.zeros(3, 8), r"bias of shape \(3, 8\) does not broadcast to \(1, 2, 8, 8\)"),
        (torch.zeros(1, 1, 1, 8, 8), "does not broadcast"),
        (torch.zeros(8, 8, dtype=torch.long), "bias must be a floating tensor"),
        ([0.0] * 8, "bias must be a floating tensor"),
        (torch.zeros(8, 8, device="meta"), "bias must be on q's device"),
    ):
        with pytest.raises(ValueError, match=match):
            triton_attention(q, k, v, "fwm-prob-k4", bias=bad)


@pytest.mark.parametrize("name", ["softmax", "minmax-weight-k4"])
def test_kinterval_attention_runs_a_float_mask_with_bias_on_triton(name, monkeypatch):
    """``kinterval_attention(attn_mask=float mask, backend="triton")``: the mask's -inf entries mask their
    key, every other entry is the bias (with its gradient through the mask, 0 under -inf), against the float64
    reference. A call without a bias hands ``triton_attention`` no bias keyword."""
    import kinterval.ops.triton as tri

    B, H, T, D = 1, 2, 19, 16
    q, k, v, do = make_inputs(B, H, T, T, D, seed=12)
    fm = _bias_for((1, H, T, T), 13, grad=False)
    fm[0, 0, 5, :5] = float("-inf")  # row 5 of head 0 attends keys 5.. only
    fm[0, 1, :, 3] = float("-inf")  # key 3 of head 1 is masked in every row
    seen = []
    original = tri.triton_attention
    monkeypatch.setattr(
        tri, "triton_attention", lambda *a, **kw: seen.append(sorted(kw)) or original(*a, **kw)
    )

    def run(backend, dt):
        def fn(a, b, c, bias):
            return kinterval_attention(a, b, c, name, attn_mask=bias, backend=backend, precision="ieee")

        return _grads(fn, *[x.to(DEVICE, dt) for x in (q, k, v, do)], sinks=fm.to(DEVICE, dt))

    got, want = run("triton", torch.float32), [x.cpu() for x in run("reference", torch.float64)]
    for x, w, what in zip(got, want, ("out", "dq", "dk", "dv", "dmask"), strict=True):
        err = (x.double().cpu() - w).abs().max().item()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), (what, err)
    dmask = got[4].cpu()
    assert torch.equal(dmask[0, 0, 5, :5], torch.zeros(5)) and torch.equal(dmask[0, 1, :, 3], torch.zeros(T))
    assert seen and all("bias" in kw for kw in seen)
    seen.clear()
    kinterval_attention(*(x.to(DEVICE) for x in (q, k, v)), name, causal=True, backend="triton")
    assert seen == [["causal", "mask", "precision", "scale"]]
