"""The operator family against the paper: closed form vs autograd, an independent transcription."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
import torch
from paper_formulas import row_probs_and_grad
from torch.autograd.gradcheck import GradcheckError

from kinterval.ops import OperatorSpec, attention_probs
from kinterval.ops.catalog import FAMILY_FORMS
from kinterval.ops.spec import BASELINES, RANGE_GRADS

KS = (1, 2, 4, 16, 64)
SCALES = (1.0, 6.0, 25.0, 100.0)


def run(s, spec, up, backend="reference", **kw):
    x = s.detach().clone().requires_grad_()
    P = attention_probs(x, spec, backend=backend, **kw)
    (P * up).sum().backward()
    return P.detach(), x.grad


def specs_for(form: str, K: int):
    for rg in RANGE_GRADS:
        for ar in ("strict",) if "lerp" in form else ("strict", "historical"):
            yield OperatorSpec.parse(form.format(K=K), range_grad=rg, arithmetic=ar)


@pytest.mark.parametrize("form", list(FAMILY_FORMS) + list(BASELINES))
def test_closed_form_matches_autograd_float64(form):
    """Every name x range_grad x K x score scale x {causal, mask}: identical forward, gradient <= 1e-9."""
    gen = torch.Generator().manual_seed(zlib.crc32(form.encode()))
    worst = 0.0
    for K, scale, causal in itertools.product(KS, SCALES, (True, False)):
        specs = [OperatorSpec.parse(form)] if form in BASELINES else list(specs_for(form, K))
        s = torch.randn(2, 2, 13, 13, generator=gen, dtype=torch.float64) * scale
        up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
        kw = {"causal": True} if causal else {"mask": torch.rand(2, 1, 13, 13, generator=gen) > 0.35}
        for spec in specs:
            P_ref, g_ref = run(s, spec, up, "reference", **kw)
            P_cf, g_cf = run(s, spec, up, "closed_form", **kw)
            assert torch.equal(P_ref, P_cf), spec.full_name
            err = ((g_cf - g_ref).abs().max() / g_ref.abs().max().clamp(min=1e-300)).item()
            assert err <= 1e-9, (spec.full_name, K, scale, causal, err)
            worst = max(worst, err)
    assert worst < 1e-9


class _ClampOpenBounds(torch.autograd.Function):
    """torch.clamp with torch 2.14's derivative: 0 at the bounds (torch 2.13 gave 1 there)."""

    @staticmethod
    def forward(ctx, x, lo=None, hi=None):
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return _TORCH_CLAMP(x, lo, hi)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        inside = torch.ones_like(x, dtype=torch.bool)
        if ctx.lo is not None:
            inside &= x > ctx.lo
        if ctx.hi is not None:
            inside &= x < ctx.hi
        return grad * inside, None, None


_TORCH_CLAMP = torch.Tensor.clamp


@pytest.mark.parametrize("name", ["fwm-weight-k4[range_grad=detach]", "fwm-lerp-k3", "fwm-prob-k4[tau=2]"])
def test_fwm_gradient_does_not_depend_on_the_clamp_derivative_at_its_bounds(monkeypatch, name):
    """FWM's clip z~ = clip(z, -tau, 0) has derivative 1 on every kept key, the arg-max key (z = 0) and a key
    exactly at -tau included. torch.clamp's derivative at its bounds changed in torch 2.14 (1 -> 0): the
    reference must give the same gradient under either, equal to the closed form's."""
    spec = OperatorSpec.from_full_name(name)
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(3, 9, generator=gen, dtype=torch.float64)
    s[:, 3] = s.amax(-1) - spec.tau  # a key exactly at z = -tau (M is the row max of the other keys)
    up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    P, g = run(s, spec, up, "reference")
    assert (g[:, 3] != 0).all()  # the key at -tau is kept and has a gradient

    def clamp(x, min=None, max=None):  # noqa: A002  (torch's keyword names)
        return _ClampOpenBounds.apply(x, min, max)

    monkeypatch.setattr(torch.Tensor, "clamp", clamp)
    P_open, g_open = run(s, spec, up, "reference")
    monkeypatch.undo()
    assert torch.equal(P, P_open) and torch.equal(g, g_open), (g - g_open).abs().max()
    _, g_cf = run(s, spec, up, "closed_form")
    torch.testing.assert_close(g_cf, g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FAMILY_FORMS)
@pytest.mark.parametrize("K", (1, 3, 4, 16))
def test_reference_matches_independent_paper_transcription(form, K):
    """Forward and eq. (2) dL/ds against a numpy transcription that shares no code with kinterval."""
    calib = "minmax" if form.startswith("lerp") else form.split("-")[0]
    surrogate = None if "lerp" in form else form.split("-")[1]
    rng = np.random.default_rng(K * 7 + len(form))
    for rg in RANGE_GRADS:
        spec = OperatorSpec.parse(form.format(K=K), range_grad=rg)
        s = rng.normal(size=(6, 11)) * rng.choice([2.0, 6.0, 20.0])
        valid = rng.random((6, 11)) > 0.3
        valid[0] = False  # fully masked row
        valid[1] = False
        valid[1, 4] = True  # single valid key
        g = rng.normal(size=(6, 11))
        P, grad = run(torch.tensor(s), spec, torch.tensor(g), mask=torch.tensor(valid))
        for i in range(6):
            P_np, grad_np = row_probs_and_grad(s[i], valid[i], g[i], calib, K, surrogate, rg)
            np.testing.assert_allclose(P[i].numpy(), P_np, rtol=1e-12, atol=1e-15)
            # atol: float64 rounding of gamma = (g - <g>)/W, which cancels when one key holds almost all mass
            np.testing.assert_allclose(grad[i].numpy(), grad_np, rtol=1e-9, atol=1e-13 * np.abs(g[i]).max())


@pytest.mark.parametrize("calib", ("fwm", "resolved"))
@pytest.mark.parametrize("tau", (2.5, 11.0))
def test_tau_override_against_paper_transcription(calib, tau):
    """A tau override moves FWM's window [-tau, 0], its step tau/K and its zero tail, and resolved's grid: the
    forward and eq. (2) dL/ds of both backends against the numpy transcription at that tau (the tests above
    use the default tau = 6 only, so an operator that ignored the override in the tail or the step passed)."""
    rng = np.random.default_rng(int(tau * 10))
    s = rng.normal(size=(5, 12)) * 4.0
    valid = rng.random((5, 12)) > 0.25
    valid[:, 0] = True
    g = rng.normal(size=(5, 12))
    for form in ("{c}-lerp-k4", "{c}-weight-k4", "{c}-prob-k3"):
        spec = OperatorSpec.parse(form.format(c=calib), tau=tau)
        for backend in ("reference", "closed_form"):
            P, grad = run(torch.tensor(s), spec, torch.tensor(g), backend, mask=torch.tensor(valid))
            for i in range(len(s)):
                P_np, grad_np = row_probs_and_grad(
                    s[i], valid[i], g[i], calib, spec.K, spec.surrogate, tau=tau
                )
                where = (spec.full_name, backend, i)
                np.testing.assert_allclose(P[i].numpy(), P_np, rtol=1e-12, atol=1e-15, err_msg=str(where))
                np.testing.assert_allclose(
                    grad[i].numpy(), grad_np, rtol=1e-9, atol=1e-13, err_msg=str(where)
                )
    # the override matters on these rows: keys in the window of one tau and the tail of the other
    z = s - np.where(valid, s, -np.inf).max(-1, keepdims=True)
    assert (valid & (z < -min(tau, 6.0)) & (z >= -max(tau, 6.0))).any()


@pytest.mark.parametrize(
    "name, scale, tol",
    [("lerp-k16777216", 4.0, 3e-5), ("fwm-prob-k65536", 4.0, 3e-5), ("minmax-weight-k4096", 4.0, 3e-5),
     ("lerp-k1", 3000.0, 3e-6), ("lerp-k2", 300.0, 3e-6), ("minmax-prob-k4", 3000.0, 3e-6)],
)  # fmt: skip
def test_float32_gradients_keep_float64_accuracy(name, scale, tol):
    """The CPU backends' float32 gradients against float64 on the same scores. Large K: Delta and LERP's
    t-derivative evaluated as (e^{b_{r+1}} - e^{b_r})/h lose the digits of h (0.47 off at K = 2^24, 8e-4 at
    fwm-prob-k65536, 2e-4 at minmax-weight-k4096; ~1e-5 as written). Small K and wide spans: eq. (1)'s
    dw/dM = -w + X written as it stands cancels (1e-5 to 2.5e-4 off in the closed form; ~3e-7 as a sum of
    non-negative terms). K a power of two: the grid points b_r are then exact in float32."""
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(2, 24, 24, generator=gen) * scale
    up = torch.randn(s.shape, generator=gen)
    modes = ("full",) if scale < 100 else ("full", "max_only", "min_only")
    for rg in modes:
        spec = OperatorSpec.parse(name, range_grad=rg)
        _, exact = run(s.double(), spec, up.double(), "reference", causal=True)
        for backend in ("reference", "closed_form"):
            _, got = run(s, spec, up, backend, causal=True)
            err = ((got.double() - exact).abs().max() / exact.abs().max()).item()
            assert err < tol, (spec.full_name, backend, err)


def test_tied_and_masked_extrema_against_paper_transcription():
    """Table S1 ties: the extremum terms of dL/ds, eq. (2), are split evenly among tied valid extrema, and a
    masked key that ties a valid extremum gets nothing. Both backends against the numpy transcription."""
    s = np.array(
        [
            [3.0, 3.0, 1.1, -2.0, 0.3, -2.0],  # tied maxima and tied minima
            [2.0, 2.0, 1.1, -1.0, -1.0, 0.3],  # masked keys 0 and 4 tie the valid max and min
            [0.7, 0.7, 0.7, -3.3, -3.3, -0.4],  # a three-way tie at the max
        ]
    )
    valid = np.ones_like(s, dtype=bool)
    valid[1, [0, 4]] = False
    g = np.array([[0.9, -0.4, 0.3, 1.2, -1.1, 0.5]] * 3) * np.array([[1.0], [-1.5], [0.7]])
    for form in FAMILY_FORMS:
        calib = "minmax" if form.startswith("lerp") else form.split("-")[0]
        surrogate = None if "lerp" in form else form.split("-")[1]
        spec = OperatorSpec.parse(form.format(K=4))
        for backend in ("reference", "closed_form"):
            _, grad = run(torch.tensor(s), spec, torch.tensor(g), backend, mask=torch.tensor(valid))
            for i in range(len(s)):
                _, grad_np = row_probs_and_grad(s[i], valid[i], g[i], calib, 4, surrogate)
                np.testing.assert_allclose(
                    grad[i].numpy(), grad_np, rtol=1e-9, atol=1e-14, err_msg=(form, backend, i)
                )
            assert (grad[1, [0, 4]] == 0).all(), (form, backend)


def test_reference_backend_is_autograd_not_the_closed_form(monkeypatch):
    """The tests hold closed_form against reference: reference must not route through the closed form."""
    from kinterval.ops import closed_form

    def boom(*args, **kwargs):
        raise AssertionError("closed form called")

    monkeypatch.setattr(closed_form, "closed_form_grad", boom)
    s = torch.randn(2, 5, 5, dtype=torch.float64)
    for name in ("lerp-k4", "minmax-weight-k4", "fwm-prob-k4", "softmax"):
        run(s, name, torch.ones_like(s), "reference", causal=True)
        with pytest.raises(AssertionError, match="closed form called"):
            run(s, name, torch.ones_like(s), "closed_form", causal=True)


@pytest.mark.parametrize("calib", ("minmax", "fwm", "resolved"))
def test_prob_ste_backward_is_the_lerp_jacobian(calib):
    """Prob-STE's backward is the Jacobian of normalize(w^L) (§3): same gradient as the LERP operator."""
    lerp = "lerp-k4" if calib == "minmax" else f"{calib}-lerp-k4"
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(3, 17, 17, generator=gen, dtype=torch.float64) * 8
    up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    for rg in RANGE_GRADS:
        _, g_prob = run(s, OperatorSpec.parse(f"{calib}-prob-k4", range_grad=rg), up, causal=True)
        _, g_lerp = run(s, OperatorSpec.parse(lerp, range_grad=rg), up, causal=True)
        torch.testing.assert_close(g_prob, g_lerp, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["lerp-k1", "lerp-k4", "fwm-lerp-k4", "resolved-lerp-k3"])
def test_gradcheck_lerp(name):
    """The LERP operators are differentiable: autograd equals finite differences (away from boundaries)."""
    gen = torch.Generator().manual_seed(5)
    s = (torch.randn(2, 6, 6, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    for rg in ("full", "detach"):
        spec = OperatorSpec.parse(name, range_grad=rg)
        if rg == "full":
            assert torch.autograd.gradcheck(lambda x, sp=spec: attention_probs(x, sp, causal=True), (s,))
        else:  # detach is not the derivative of the forward: gradcheck must fail
            with pytest.raises(GradcheckError):
                torch.autograd.gradcheck(lambda x, sp=spec: attention_probs(x, sp, causal=True), (s,))


def test_zero_sum_identity_full_and_not_detach():
    gen = torch.Generator().manual_seed(11)
    s = torch.randn(4, 32, 32, generator=gen, dtype=torch.float64) * 6
    up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    valid = torch.ones(32, 32, dtype=torch.bool).tril()
    for form in FAMILY_FORMS:
        for rg in RANGE_GRADS:
            spec = OperatorSpec.parse(form.format(K=4), range_grad=rg)
            _, g = run(s, spec, up, causal=True)
            rows = g[..., 1:, :]  # rows with at least two keys
            l1 = rows.abs().sum(-1)
            resid = torch.where(
                l1 > 0, rows.sum(-1).abs() / l1.clamp(min=1e-300), 0.0
            )  # FWM: a lone window key
            if rg in ("full", "p1"):
                assert resid.max() <= 1e-9, (spec.full_name, resid.max())
            elif rg == "detach":
                assert resid.median() > 1e-3, (spec.full_name, resid.median())
            assert torch.all(g[~valid.expand_as(g)] == 0)


def test_single_channel_modes_of_max_anchored_calibrations():
    """FWM and resolved have no m channel: max_only is full and min_only is detach (docs/operators.md)."""
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(3, 12, generator=gen, dtype=torch.float64) * 4
    up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    for form in FAMILY_FORMS:
        if form.startswith("minmax") or form.startswith("lerp"):
            continue
        g = {rg: run(s, OperatorSpec.parse(form.format(K=4), range_grad=rg), up)[1] for rg in RANGE_GRADS}
        assert torch.equal(g["max_only"], g["full"]) and torch.equal(g["min_only"], g["detach"]), form
        assert not torch.allclose(g["full"], g["detach"]), form  # the M channel carries a gradient


def test_strict_forward_bit_identical_to_direct_hard_forward():
    """Strict surrogates return w^N / sum w^N bit for bit; historical differs only by rounding."""
    gen = torch.Generator().manual_seed(2)
    for dtype, scale in itertools.product((torch.float32, torch.float64), (1.0, 6.0, 25.0, 100.0)):
        s = torch.randn(8, 40, generator=gen, dtype=dtype) * scale
        M, m = s.amax(-1, keepdim=True), s.amin(-1, keepdim=True)
        for K in (1, 3, 4, 5, 16):  # 3, 5: rounding can lift b_K = z_min + K h above 0
            # Direct MinMax hard forward written out from App. A.
            h = (M - m) / K
            z, zmin = s - M, m - M
            r = torch.floor((z - zmin) / h).clamp(0, K - 1)
            t = ((z - (zmin + r * h)) / h).clamp(0, 1)
            wN = torch.exp(zmin + (r + (t >= 0.5).to(dtype)) * h)
            direct_minmax = wN / wN.sum(-1, keepdim=True)
            # Direct FWM hard forward.
            hf = 6.0 / K
            zt = z.clamp(-6.0, 0)
            rf = torch.floor((zt + 6.0) / hf).clamp(0, K - 1)
            tf = ((zt - (-6.0 + rf * hf)) / hf).clamp(0, 1)
            wf = torch.where(z >= -6.0, torch.exp(-6.0 + (rf + (tf >= 0.5).to(dtype)) * hf), 0.0)
            direct_fwm = wf / wf.sum(-1, keepdim=True)
            for calib, direct in (("minmax", direct_minmax), ("fwm", direct_fwm)):
                for sur in ("weight", "prob"):
                    P = attention_probs(s, f"{calib}-{sur}-k{K}")
                    assert torch.equal(P, direct), (calib, sur, K, dtype, scale)
                    P_hist = attention_probs(
                        s, OperatorSpec.parse(f"{calib}-{sur}-k{K}", arithmetic="historical")
                    )
                    tol = 64 * torch.finfo(dtype).eps
                    assert (P_hist - direct).abs().max() <= tol


def test_baselines_as_in_appendix_d5():
    gen = torch.Generator().manual_seed(4)
    s = torch.randn(5, 24, generator=gen) * 6
    z = s - s.amax(-1, keepdim=True)
    soft = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
    torch.testing.assert_close(attention_probs(s, "softmax"), soft, rtol=0, atol=1e-7)
    w = torch.exp(z.to(torch.bfloat16)).float()
    assert torch.equal(attention_probs(s, "bf16-exp"), w / w.sum(-1, keepdim=True))
    w8 = torch.exp(z).to(torch.float8_e4m3fn).float()
    assert torch.equal(attention_probs(s, "fp8-exp"), w8 / w8.sum(-1, keepdim=True))
    # E4M3 underflows weights below 2^-10, i.e. z below about -6.93 (App. D.5)
    row = torch.tensor([[0.0, -6.8, -7.0, -20.0]])
    P8 = attention_probs(row, "fp8-exp")
    assert P8[0, 1] > 0 and P8[0, 2] == 0 and P8[0, 3] == 0
    # FP8's backward is the fp32 exp derivative with normalization at the rounded weights (max on the tape)
    x = s.clone().requires_grad_()
    up = torch.randn(s.shape, generator=gen)
    (attention_probs(x, "fp8-exp") * up).sum().backward()
    P = w8 / w8.sum(-1, keepdim=True)
    gamma = (up - (P * up).sum(-1, keepdim=True)) / w8.sum(-1, keepdim=True)
    dz = gamma * torch.exp(z)
    expected = dz - (s == s.amax(-1, keepdim=True)) * dz.sum(-1, keepdim=True)
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-7)
    assert (x.grad.sum(-1).abs() / x.grad.abs().sum(-1)).max() < 1e-5


def test_nearest_rounds_to_grid_center_midpoint_up():
    """Nearest picks the nearest grid point in z (not the nearest exponential value); t = 1/2 rounds up."""
    # MinMax K=2 on [-4, 0]: grid b = -4, -2, 0. z = -3 is the midpoint of [-4, -2] and rounds up to -2.
    s = torch.tensor([[0.0, -3.0, -4.0, -1.2]], dtype=torch.float64)
    P = attention_probs(s, "minmax-weight-k2")
    wN = torch.exp(torch.tensor([[0.0, -2.0, -4.0, -2.0]], dtype=torch.float64))
    torch.testing.assert_close(P, wN / wN.sum(), rtol=1e-15, atol=0)
    # FWM K=4, tau=6: h=1.5, grid -6, -4.5, -3, -1.5, 0; z=-6 is in the window (strict tail z < -tau)
    s = torch.tensor([[0.0, -6.0, -6.0000001, -0.75, -0.74]], dtype=torch.float64)
    P = attention_probs(s, "fwm-weight-k4")
    w = torch.exp(torch.tensor([[0.0, -6.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    w[0, 2] = 0.0
    w[0, 3] = 1.0  # z = -0.75 is the midpoint of [-1.5, 0]: rounds up to 0
    w[0, 4] = 1.0
    torch.testing.assert_close(P, w / w.sum(), rtol=1e-15, atol=0)
    # LERP K=1 interpolates between e^{z_min} and 1 (App. A)
    s = torch.tensor([[0.0, -1.0, -4.0]], dtype=torch.float64)
    t = torch.tensor([1.0, 0.75, 0.0], dtype=torch.float64)
    w = (1 - t) * torch.exp(torch.tensor(-4.0, dtype=torch.float64)) + t
    torch.testing.assert_close(attention_probs(s, "lerp-k1"), (w / w.sum())[None], rtol=1e-15, atol=0)


def test_resolved_continues_grid_below_window():
    """Resolved keeps FWM's step and origin but never truncates: in-window weights equal FWM's."""
    s = torch.tensor([[0.0, -1.0, -5.0, -7.0, -13.0, -30.0]], dtype=torch.float64)
    from kinterval.ops.api import valid_mask
    from kinterval.ops.formulas import grid, nearest_weight, row_extrema
    from kinterval.ops.reference import place

    valid = valid_mask(s.shape, s.device, causal=False, mask=None)
    ext = row_extrema(s, valid)
    g_fwm = grid(s, valid, OperatorSpec.parse("fwm-weight-k4"), ext.M, ext.m)
    fwm = place(nearest_weight(g_fwm), g_fwm)
    g_res = grid(s, valid, OperatorSpec.parse("resolved-weight-k4"), ext.M, ext.m)
    res = place(nearest_weight(g_res), g_res)
    assert torch.equal(res[0, :3], fwm[0, :3]) and (fwm[0, 3:] == 0).all()
    assert (res[0, 3:] > 0).all() and g_res.r[0, 4] < 0  # negative grid index below -tau
    P = attention_probs(s, "resolved-weight-k4")
    assert P[0, 3] > 0 and abs(P.sum().item() - 1) < 1e-15


def test_verify_command_runs_to_its_summary(capsys):
    """``python -m kinterval.ops.verify``: the table, then the count of checks and failures (it once
    crashed after the table, on an attribute of the table class it no longer used)."""
    from kinterval.ops import verify

    assert verify.main(["--K", "4", "--T", "9"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("closed_form vs reference")
    n = sum(1 for line in out if line.rstrip().endswith(" yes"))
    assert n > 100 and out[-1].startswith(f"{n} checks, 0 failed")


def test_verify_flags_each_kind_of_disagreement(monkeypatch):
    """``verify.agreement`` reports a gradient error, a forward mismatch and masked rows; ``main`` exits 1 on
    any failure (a checker that always says yes would pass the test above)."""
    from kinterval.ops import closed_form, verify

    spec = OperatorSpec.parse("minmax-weight-k4")
    assert verify.agreement(spec, T=5)["ok"]
    good_grad, good_probs = closed_form.closed_form_grad, closed_form.reference_probs
    monkeypatch.setattr(closed_form, "closed_form_grad", lambda *a: good_grad(*a) * (1 + 1e-6))
    r = verify.agreement(spec, T=5)
    assert not r["ok"] and 5e-7 < r["grad_rel_err_f64"] < 2e-6 and r["forward_identical"]
    monkeypatch.setattr(closed_form, "closed_form_grad", good_grad)
    monkeypatch.setattr(closed_form, "reference_probs", lambda *a: good_probs(*a) * (1 + 2**-40))
    r = verify.agreement(spec, T=5)
    assert not r["ok"] and not r["forward_identical"] and r["grad_rel_err_f64"] <= verify.TOL_F64
    monkeypatch.setattr(closed_form, "reference_probs", good_probs)
    seen = []
    real = verify.attention_probs
    monkeypatch.setattr(verify, "attention_probs", lambda *a, **kw: seen.append(sorted(kw)) or real(*a, **kw))
    verify.agreement(spec, T=5, causal=False)
    assert seen and all("mask" in kw and "causal" not in kw for kw in seen)
    monkeypatch.setattr(verify, "agreement", lambda spec, **kw: {**r, "ok": spec.name != "lerp-k4"})
    assert verify.main(["--K", "4", "--T", "5"]) == 1


@pytest.mark.parametrize("scale", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("range_grad", ["full", "max_only", "min_only"])
def test_the_reference_minmax_gradient_keeps_its_precision_at_wide_spans(scale, range_grad):
    """Autograd of b_r = b0 + r h summed O(1) paths of M and m that cancel into the nodes of the O(1/h) ones:
    the reference's MinMax–Weight gradient lost eps * h relative (1.4e-5 at scores of 1e12 in float64,
    `ops verify --scale 1e12` failed 12 checks; 1.6e-5 at 1e3 in float32). It now agrees with the closed
    form of eq. (1), calibration_grad, to rounding at every scale; its float32 error is the closed form's."""
    from kinterval.ops import verify

    spec = OperatorSpec.parse("minmax-weight-k4", range_grad=range_grad)
    res = verify.agreement(spec, T=9, scale=scale)
    assert res["forward_identical"] and res["grad_rel_err_f64"] < 1e-13 and res["ok"]
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(2, 3, 9, 9, generator=gen, dtype=torch.float64) * scale
    up = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    g = {}
    for backend, dtype in (("closed_form", torch.float64), ("reference", torch.float32),
                           ("closed_form", torch.float32)):  # fmt: skip
        x = s.to(dtype).detach().clone().requires_grad_()
        (attention_probs(x, spec, backend=backend, causal=True) * up.to(dtype)).sum().backward()
        g[backend, dtype] = x.grad.double()
    truth = g["closed_form", torch.float64]
    err = {
        b: ((g[b, torch.float32] - truth).abs().max() / truth.abs().max()).item()
        for b in ("reference", "closed_form")
    }
    assert err["reference"] < 1e-6 and err["reference"] < 4 * err["closed_form"] + 1e-7, err
