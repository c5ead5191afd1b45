"""Operator names, overrides, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention
from kinterval.ops.catalog import all_specs
from triton_gate import needs_kernels


@pytest.mark.parametrize(
    "name, canonical, axes",
    [
        ("softmax", "softmax", ("softmax", None, None, None, None)),
        ("BF16-exp", "bf16-exp", ("bf16-exp", None, None, None, None)),
        ("lerp-k4", "lerp-k4", ("kinterval", "minmax", "lerp", None, 4)),
        ("minmax-lerp-k4", "lerp-k4", ("kinterval", "minmax", "lerp", None, 4)),
        ("fwm-lerp-k1", "fwm-lerp-k1", ("kinterval", "fwm", "lerp", None, 1)),
        ("resolved-lerp-k7", "resolved-lerp-k7", ("kinterval", "resolved", "lerp", None, 7)),
        ("minmax-weight-k16", "minmax-weight-k16", ("kinterval", "minmax", "nearest", "weight", 16)),
        ("fwm-prob-k4", "fwm-prob-k4", ("kinterval", "fwm", "nearest", "prob", 4)),
        (" Resolved-Prob-K64 ", "resolved-prob-k64", ("kinterval", "resolved", "nearest", "prob", 64)),
    ],
)
def test_parse_canonical_names(name, canonical, axes):
    spec = OperatorSpec.parse(name)
    assert str(spec) == canonical
    assert (spec.kind, spec.calibration, spec.reconstruction, spec.surrogate, spec.K) == axes
    assert OperatorSpec.parse(str(spec)) == spec


def test_overrides_and_full_name_round_trip():
    spec = OperatorSpec.parse("fwm-prob-k4", tau=5, range_grad="detach", arithmetic="historical")
    assert (spec.tau, spec.range_grad, spec.arithmetic) == (5.0, "detach", "historical")
    assert str(spec) == "fwm-prob-k4"
    assert spec.full_name == "fwm-prob-k4[tau=5,range_grad=detach,arithmetic=historical]"
    assert OperatorSpec.from_full_name(spec.full_name) == spec
    for s in all_specs(Ks=(1, 4)):
        assert OperatorSpec.from_full_name(s.full_name) == s
    # tau beyond :g's 6 digits still reads back exactly (6.000001 once printed as "tau=6", the default)
    for tau in (5.5, 1 / 3, 5.1234567, 6.000001, 0.1 + 0.2, 999.99999, 1e-5):
        spec = OperatorSpec.parse("resolved-weight-k4", tau=tau)
        assert OperatorSpec.from_full_name(spec.full_name).tau == tau, spec.full_name
    assert OperatorSpec.parse("fwm-lerp-k4", tau=6.25).full_name == "fwm-lerp-k4[tau=6.25]"
    # defaults passed explicitly are harmless
    assert OperatorSpec.parse("softmax", range_grad="full") == OperatorSpec.parse("softmax")
    assert OperatorSpec.parse("lerp-k4", tau=6.0) == OperatorSpec.parse("lerp-k4")


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("sofmax", {}),
        ("lerp-k0", {}),
        ("lerp-k-1", {}),
        ("minmax-weight-k", {}),
        ("fwm-nearest-k4", {}),
        ("minmax-weight-k4.5", {}),
        ("lerp-k4x", {}),
        ("fwm-lerp-k4.5", {}),
        ("lerp-k16777217", {}),  # 2^24 + 1: r is held in float32
        ("fwm-prob-k4", {"tau": True}),
        ("fwm-prob-k4", {"tau": 1000.5}),
        ("fwm-prob-k4", {"tau": 0}),
        ("fwm-prob-k4", {"tau": -1.0}),
        ("fwm-prob-k4", {"tau": float("nan")}),
        ("fwm-prob-k4", {"tau": "6"}),
        ("minmax-weight-k4", {"tau": 5.0}),
        ("softmax", {"range_grad": "detach"}),
        ("fp8-exp", {"range_grad": "p1"}),
        ("lerp-k4", {"range_grad": "sideways"}),
        ("lerp-k4", {"arithmetic": "historical"}),
        ("minmax-prob-k4", {"arithmetic": "approximate"}),
        ("minmax-prob-k4", {"temperature": 1.0}),
    ],
)
def test_bad_names_and_overrides_raise_with_valid_forms(name, overrides):
    with pytest.raises(ValueError, match="valid forms"):
        OperatorSpec.parse(name, **overrides)


def test_parse_takes_a_full_name_with_its_overrides():
    """parse("fwm-prob-k4[tau=5]") said "unknown operator name" while its own message lists the [...] form and
    attention_probs, from_full_name and the CLI take it; a keyword wins over the name's override."""
    assert OperatorSpec.parse("fwm-prob-k4[tau=5]") == OperatorSpec.parse("fwm-prob-k4", tau=5)
    assert OperatorSpec.parse("FWM-prob-k4[tau=5,range_grad=detach]", tau=3).full_name == (
        "fwm-prob-k4[tau=3,range_grad=detach]"
    )
    for bad in ("softmax[tau=5]", "lerp-k4[x=1]", "lerp-k4[", "lerp-k4[]"):
        with pytest.raises(ValueError, match="valid forms"):
            OperatorSpec.parse(bad)


def test_bad_inputs_raise_clear_errors():
    s = torch.randn(2, 4, 4)
    with pytest.raises(ValueError, match="floating"):
        attention_probs(torch.ones(4, 4, dtype=torch.long), "softmax")
    with pytest.raises(ValueError, match="shape"):
        attention_probs(torch.randn(4), "softmax")
    with pytest.raises(ValueError, match="boolean"):
        attention_probs(s, "softmax", mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="broadcast"):
        attention_probs(s, "softmax", mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="Tq <= Tk"):
        attention_probs(torch.randn(5, 4), "softmax", causal=True)
    with pytest.raises(ValueError, match="NaN"):
        attention_probs(torch.tensor([[0.0, float("nan")]]), "lerp-k4")
    with pytest.raises(ValueError, match=r"\+inf"):
        attention_probs(torch.tensor([[0.0, float("inf")]]), "lerp-k4")
    with pytest.raises(ValueError, match="unknown operator"):
        attention_probs(s, "quantized")
    with pytest.raises(ValueError, match="backend"):
        attention_probs(s, "softmax", backend="cuda")
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="4-d"):
        kinterval_attention(q[0], q[0], q[0], "softmax")
    with pytest.raises(ValueError, match="agree"):
        kinterval_attention(q, torch.randn(1, 2, 4, 6), torch.randn(1, 2, 4, 6), "softmax")
    with pytest.raises(ValueError, match="share a dtype"):
        kinterval_attention(q, q.double(), q, "softmax")
    with pytest.raises(ValueError, match="must be on one device, got meta, cpu, cpu"):
        kinterval_attention(q.to("meta"), q, q, "softmax")  # was accepted, returning a meta tensor
    with pytest.raises(ValueError, match="unknown backend"):
        kinterval_attention(q, q, q, "softmax", backend="flash")


def test_neg_inf_scores_count_as_masked():
    s = torch.tensor([[1.0, float("-inf"), 0.0]])
    P = attention_probs(s, "fwm-weight-k4")
    assert P[0, 1] == 0 and abs(P.sum().item() - 1) < 1e-6
    P = attention_probs(torch.full((1, 3), float("-inf")), "lerp-k4")
    assert (P == 0).all()


def test_neg_inf_scores_are_masked_in_forward_and_backward():
    """A -inf score is a masked key for every operator and backend: the same probabilities and gradient as
    the explicit mask, finite, zero at the -inf key (also when it would be the row minimum)."""
    ninf = float("-inf")
    s = torch.tensor([[1.0, ninf, 0.0, -2.0], [ninf] * 4, [3.0, ninf, ninf, ninf]], dtype=torch.float64)
    mask = ~torch.isneginf(s)
    finite = torch.where(mask, s, torch.zeros_like(s))
    up = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64).expand_as(s)
    for op in ("softmax", "fp8-exp", "lerp-k4", "minmax-weight-k4", "fwm-prob-k4", "resolved-weight-k4"):
        for backend in ("reference", "closed_form"):
            x, y = s.clone().requires_grad_(), finite.clone().requires_grad_()
            P = attention_probs(x, op, backend=backend)
            (P * up).sum().backward()
            P_mask = attention_probs(y, op, mask=mask, backend=backend)
            (P_mask * up).sum().backward()
            assert torch.equal(P, P_mask) and torch.isfinite(x.grad).all(), (op, backend)
            torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=0)
            assert (x.grad[~mask] == 0).all()


def test_resolved_takes_a_tau_override_and_k_tau_bounds_are_inclusive():
    """tau applies to resolved as to FWM (App. D.4: the tail-policy operator keeps FWM's step tau/K): it
    changes the grid and survives the full-name round trip; K = 2^24 and tau = 1000 are the largest
    accepted."""
    spec = OperatorSpec.parse("resolved-prob-k4", tau=5)
    assert spec.tau == 5.0 and spec.full_name == "resolved-prob-k4[tau=5]"
    assert OperatorSpec.from_full_name(spec.full_name) == spec
    # z = -2.5: a grid point of the tau = 5 grid (step 1.25); on the tau = 6 grid (step 1.5) t = 1/3 -> -3
    s = torch.tensor([[0.0, -2.5]], dtype=torch.float64)
    w5 = torch.exp(torch.tensor([0.0, -2.5], dtype=torch.float64))
    w6 = torch.exp(torch.tensor([0.0, -3.0], dtype=torch.float64))
    torch.testing.assert_close(attention_probs(s, spec)[0], w5 / w5.sum(), rtol=1e-15, atol=0)
    torch.testing.assert_close(attention_probs(s, "resolved-prob-k4")[0], w6 / w6.sum(), rtol=1e-15, atol=0)
    assert OperatorSpec.parse("lerp-k16777216").K == 2**24
    assert OperatorSpec.parse("fwm-prob-k4", tau=1000).tau == 1000.0


def test_dtype_policy():
    s = torch.randn(3, 5, 5)
    assert attention_probs(s.double(), "lerp-k4").dtype == torch.float64
    assert attention_probs(s, "lerp-k4").dtype == torch.float32
    for low in (torch.bfloat16, torch.float16):
        P = attention_probs(s.to(low), "fwm-prob-k4")
        assert P.dtype == torch.float32
        assert torch.equal(P, attention_probs(s.to(low).float(), "fwm-prob-k4"))


@pytest.mark.parametrize("dtype, span", [(torch.float32, 1e9), (torch.float64, 1e19)])
def test_huge_spans_with_k_not_a_power_of_two_stay_finite(dtype, span):
    """Rounding lifted the top MinMax grid point to b_K >> 0 and exp overflowed: NaN probabilities."""
    g = torch.Generator().manual_seed(0)
    s = (torch.randn(200, 6, generator=g, dtype=torch.float64) * span).to(dtype)
    for op in ("lerp-k3", "minmax-weight-k5", "minmax-prob-k7"):
        for backend in ("reference", "closed_form"):
            x = s.clone().requires_grad_()
            P = attention_probs(x, op, backend=backend)
            P.sum().backward()
            assert torch.isfinite(P).all() and torch.isfinite(x.grad).all(), (op, backend)
            torch.testing.assert_close(P.sum(-1), torch.ones(200, dtype=dtype))
            # the row max sits on the top grid point e^0 = 1: never a weight 0
            assert (P.gather(-1, s.argmax(-1, keepdim=True)) > 0).all(), (op, backend)


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_no_keys_gives_an_empty_result_and_no_head_dim_a_clear_error(backend):
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    empty = torch.randn(1, 2, 0, 8)
    out = kinterval_attention(q, empty, empty, "lerp-k4", backend=backend)
    assert out.shape == (1, 2, 3, 8) and (out == 0).all()  # as SDPA: no key, zero output
    out.sum().backward()
    assert (q.grad == 0).all()
    P = attention_probs(torch.randn(2, 3, 0), "minmax-prob-k4", backend=backend)
    assert P.shape == (2, 3, 0)
    q0 = torch.randn(1, 2, 3, 0)
    with pytest.raises(ValueError, match="head dimension"):
        kinterval_attention(q0, q0, q0, "lerp-k4", backend=backend)


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
@pytest.mark.parametrize("shape", [(1, 2, 0, 5), (1, 2, 3, 0), (0, 2, 3, 5)])
def test_an_empty_bias_that_requires_grad_gives_an_empty_result(backend, shape):
    """A float mask (a bias) with a zero-size dimension and requires_grad: the mask-like-bias check took the
    minimum of an empty tensor (a raw RuntimeError) for the K-interval operators."""
    B, H, Tq, Tk = shape
    q, k, v = torch.randn(B, H, Tq, 8), torch.randn(B, H, Tk, 8), torch.randn(B, H, Tk, 8)
    bias = torch.randn(shape, requires_grad=True)
    out = kinterval_attention(q, k, v, "lerp-k4", attn_mask=bias, backend=backend)
    assert out.shape == (B, H, Tq, 8) and (out == 0).all()


def test_mask_of_higher_rank_than_scores_is_a_value_error():
    with pytest.raises(ValueError, match="does not broadcast"):
        attention_probs(torch.randn(2, 3), "lerp-k4", mask=torch.ones(1, 1, 2, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    "name, overrides", [("lerp-k100000000000000000000", {}), ("fwm-prob-k4", {"tau": 1e300})]
)
def test_huge_k_or_tau_is_rejected_with_the_bounds(name, overrides):
    with pytest.raises(ValueError, match=r"valid forms.*2\^24"):
        OperatorSpec.parse(name, **overrides)


@pytest.mark.parametrize("full", ["fwm-prob-k4[tau=abc]", "fwm-prob-k4[tau]", "fwm-prob-k4[tau=5_0]"])
def test_full_name_with_a_non_numeric_tau_is_a_named_error(full):
    with pytest.raises(ValueError, match=r"tau must be a number.*valid forms"):
        OperatorSpec.from_full_name(full)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "1", True, 0.0, -0.125])
def test_attention_scale_must_be_a_positive_finite_number(scale):
    """The fused kernels scale the row max of q k^T, the max of the scaled scores only for scale > 0."""
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        kinterval_attention(q, q, q, "lerp-k4", scale=scale)


@pytest.mark.parametrize("op", ["softmax", "lerp-k4", "fwm-prob-k4", "minmax-weight-k4"])
@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_non_finite_scores_give_nan_rows_not_quiet_zeros(op, backend):
    """NaN or inf in q or k used to vanish into a zero output row; now those rows, and only those, are NaN."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 4, 8, generator=g) for _ in range(3))
    clean = kinterval_attention(q, k, v, op, causal=True, backend=backend)
    q[0, 1, 2, 0] = float("nan")  # one query row
    for head, sign in ((0, 1.0), (2, -1.0)):  # a +inf and a -inf score on the last key, which only the
        q[0, head, 3, 0] = sign * abs(q[0, head, 3, 0])  # last query may attend (causal)
        k[0, head, 3, 0] = float("inf")
    out = kinterval_attention(q, k, v, op, causal=True, backend=backend)
    bad = torch.zeros(1, 3, 4, dtype=torch.bool)
    bad[0, 1, 2] = bad[0, 0, 3] = bad[0, 2, 3] = True
    assert out[bad].isnan().all()
    torch.testing.assert_close(out[~bad], clean[~bad], rtol=0, atol=0)


@pytest.mark.parametrize(
    "fields, message",
    [({"kind": "bogus"}, "kind must be"),
     ({"calibration": "minmax", "reconstruction": "lerp", "K": -1}, "K must be"),
     ({"calibration": "minmax", "reconstruction": "lerp", "K": 4.0}, "K must be"),
     ({"calibration": "fwm", "reconstruction": "lerp", "K": 4, "tau": -2.0}, "tau must be"),
     ({"calibration": "fwm", "reconstruction": "nearest", "K": 4}, "surrogate must be"),
     ({"calibration": "max", "reconstruction": "lerp", "K": 4}, "calibration must be")],
)  # fmt: skip
def test_a_spec_built_directly_is_validated_like_a_parsed_one(fields, message):
    """OperatorSpec(...) skipped every check: K=-1 or kind='bogus' computed some attention, tau=-2 zeros."""
    with pytest.raises(ValueError, match=message):
        OperatorSpec(**{"kind": "kinterval", **fields})


@pytest.mark.parametrize(
    "fields",
    [{"kind": "softmax", "range_grad": "p1"},
     {"kind": "kinterval", "calibration": "minmax", "reconstruction": "lerp", "K": 4,
      "arithmetic": "historical"},
     {"kind": "kinterval", "calibration": "minmax", "reconstruction": "lerp", "K": 4, "tau": 5.0}],
)  # fmt: skip
def test_a_spec_built_directly_refuses_overrides_that_do_not_apply(fields):
    """Such a spec was accepted, and its full_name (which a checkpoint stores) then failed to parse back."""
    with pytest.raises(ValueError, match="applies only"):
        OperatorSpec(**fields)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_non_finite_scores_on_masked_keys_are_never_read(bad, backend):
    """attention_probs refused a NaN or +inf on a masked key (kinterval_attention ignores it); on a key
    that is not masked it is still an error."""
    s = torch.tensor([[0.0, 1.0, bad, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True]])
    finite = s.clone()
    finite[0, 2] = 123.0
    P = attention_probs(s, "lerp-k4", mask=mask, backend=backend)
    assert torch.equal(P, attention_probs(finite, "lerp-k4", mask=mask, backend=backend)) and P[0, 2] == 0
    with pytest.raises(ValueError, match="not masked"):
        attention_probs(s, "lerp-k4", backend=backend)


@pytest.mark.parametrize(
    "full",
    [
        "fwm-lerp-k4[tau=1e-45]",
        "resolved-prob-k3[tau=1e-40]",
        "fwm-weight-k16777216[tau=1e-24]",
        "resolved-weight-k1[tau=1e-37]",
        f"fwm-lerp-k4[tau={4 * 0.75 * 2.0**-100!r}]",  # just below the limit
    ],
)
def test_a_grid_step_below_two_to_the_minus_100_is_rejected(full):
    """tau/K below 2^-126 (a subnormal float32 step) gave NaN gradients (fwm-lerp-k4 with tau = 1e-45 in every
    backend); one just above it overflowed resolved's float32 grid index (z + tau) / h at z = -5 and gave
    those keys weight 0 (resolved-weight-k1, tau = 2^-126: [0.705, 0.260, 0.035, 0, 0] where softmax gives
    [0.702, 0.258, 0.035, 0.0047, 3.2e-5]). A step of 2^-100 is accepted: the index overflows only where
    e^z is 0."""
    with pytest.raises(ValueError, match=r"tau/K must be at least 2\^-100.*valid forms"):
        OperatorSpec.from_full_name(full)
    spec = OperatorSpec.parse("fwm-lerp-k4", tau=2.0**-98)
    s = torch.tensor([[0.0, -(2.0**-126), -1.0]], requires_grad=True)
    P = attention_probs(s, spec)
    (P * torch.tensor([1.0, -2.0, 3.0])).sum().backward()
    assert torch.isfinite(P).all() and torch.isfinite(s.grad).all()
    z = [0.0, -1.0, -3.0, -5.0, -10.0, -1e9]
    want = torch.softmax(torch.tensor(z, dtype=torch.float64), -1)
    for name in ("resolved-weight-k1", "resolved-prob-k1", "resolved-lerp-k1"):
        for backend in ("reference", "closed_form"):
            s = torch.tensor([z], requires_grad=True)
            P = attention_probs(s, OperatorSpec.parse(name, tau=2.0**-100), backend=backend)
            (P * torch.arange(6.0)).sum().backward()
            assert torch.allclose(P[0].double(), want, rtol=1e-6, atol=1e-12), (name, backend, P)
            assert torch.isfinite(s.grad).all()


def test_an_override_given_twice_is_an_error():
    """``lerp-k4[range_grad=detach,range_grad=full]`` silently ran the last value (full)."""
    with pytest.raises(ValueError, match="'range_grad' given twice.*valid forms"):
        OperatorSpec.from_full_name("lerp-k4[range_grad=detach,range_grad=full]")
    with pytest.raises(ValueError, match="'tau' given twice"):
        OperatorSpec.from_full_name("fwm-prob-k4[tau=5,tau=5]")


@pytest.mark.parametrize("causal", ["no", 0, 1, None, torch.tensor(True)])
def test_causal_must_be_a_bool(causal):
    """``causal="no"`` (a truthy string) ran causal attention; every entry point now wants True or False."""
    q = torch.randn(1, 1, 3, 4)
    for backend in ("reference", "closed_form"):
        with pytest.raises(ValueError, match="causal must be True or False"):
            kinterval_attention(q, q, q, "lerp-k4", causal=causal, backend=backend)
    with pytest.raises(ValueError, match="causal must be True or False"):
        attention_probs(torch.randn(3, 3), "softmax", causal=causal)


def test_catalog_enumerates_the_whole_family():
    """Table 1: every calibration x {LERP, Weight-STE, Prob-STE}, each once; all_specs adds the baselines,
    every range_grad and (surrogates only) both arithmetics. The sweeps and tests parametrize over
    FAMILY_FORMS, so a form missing there went untested without any test noticing."""
    from kinterval.ops.catalog import FAMILY_FORMS
    from kinterval.ops.spec import ARITHMETICS, BASELINES, CALIBRATIONS, RANGE_GRADS, SURROGATES

    axes = {
        (s.calibration, s.reconstruction, s.surrogate)
        for s in (OperatorSpec.parse(f.format(K=4)) for f in FAMILY_FORMS)
    }
    want = {(c, "lerp", None) for c in CALIBRATIONS} | {
        (c, "nearest", u) for c in CALIBRATIONS for u in SURROGATES
    }
    assert len(FAMILY_FORMS) == len(axes) == len(want) == 9 and axes == want
    names = [s.full_name for s in all_specs(Ks=(4, 16))]
    n_lerp, n_ste = len(CALIBRATIONS), len(CALIBRATIONS) * len(SURROGATES)
    per_k = len(RANGE_GRADS) * (n_lerp + n_ste * len(ARITHMETICS))
    assert len(names) == len(set(names)) == len(BASELINES) + 2 * per_k
    assert names[: len(BASELINES)] == list(BASELINES)


@pytest.mark.parametrize(
    "fields",
    [{"K": 4}, {"calibration": "fwm"}, {"reconstruction": "lerp"}, {"surrogate": "weight"}],
)
def test_a_baseline_built_directly_takes_no_design_axes(fields):
    """OperatorSpec(kind="softmax", K=4) was accepted: named "softmax", it was not equal to the spec its name
    parses to; calibration="fwm" raised a bare TypeError (tau / None)."""
    with pytest.raises(ValueError, match="softmax takes no calibration, reconstruction, surrogate or K"):
        OperatorSpec(kind="softmax", **fields)


@pytest.mark.parametrize("full", [None, 4, OperatorSpec.parse("lerp-k4")])
def test_from_full_name_of_a_non_string_is_a_value_error(full):
    """It raised AttributeError: 'NoneType' object has no attribute 'strip'."""
    with pytest.raises(ValueError, match="operator name must be a string"):
        OperatorSpec.from_full_name(full)


@pytest.mark.parametrize("name", ["lerp-k\uff14", "fwm-prob-k\u0664"])  # fullwidth 4, Arabic-Indic 4
def test_k_takes_ascii_digits_only(name):
    """Any Unicode digit matched ``\\d`` and int() read it: "lerp-k４" was silently lerp-k4."""
    with pytest.raises(ValueError, match="unknown operator name"):
        OperatorSpec.parse(name)


@pytest.mark.parametrize("op", ["lerp-k4", "minmax-prob-k4", "resolved-lerp-k4", "resolved-weight-k4"])
@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_a_row_whose_score_span_overflows_is_an_error_or_nan_not_zeros(op, backend):
    """Valid float32 scores 3e38 and -3e38: M - m overflows, and MinMax (h = inf) and resolved (s - M = -inf)
    gave an all-zero row where float64 puts P = 1 on the max key."""
    s = torch.tensor([[3e38, -3e38, 0.0], [1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="span more than torch.float32 holds"):
        attention_probs(s, op, backend=backend)
    P = attention_probs(s.double(), op, backend=backend)  # float64 holds the span
    torch.testing.assert_close(P[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    q = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2).expand(1, 1, 2, 2)
    k = s[0].view(1, 1, 3, 1) * torch.tensor([1.0, 0.0])
    out = kinterval_attention(q, k, torch.randn(1, 1, 3, 2), op, scale=1.0, backend=backend)
    assert out[0, 0].isnan().all()
    # the masked-off extreme key is never read; FWM and softmax handle the span
    assert torch.isfinite(attention_probs(s, op, mask=torch.tensor([False, True, True]))).all()
    for fine in ("softmax", "fwm-lerp-k4"):
        P = attention_probs(s, fine, backend=backend)
        torch.testing.assert_close(P[0], torch.tensor([1.0, 0.0, 0.0]))


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_a_float64_span_overflow_does_not_advise_float64(backend):
    """float64 scores 1.7e308 and -1.7e308: the error said "pass float64 scores" to a float64 caller."""
    s = torch.tensor([[1.7e308, -1.7e308, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="span more than torch.float64 holds") as err:
        attention_probs(s, "lerp-k4", backend=backend)
    assert "pass float64" not in str(err.value)
    assert "scale the scores down" in str(err.value)


@needs_kernels
@pytest.mark.parametrize("op", ["lerp-k4", "minmax-prob-k4", "resolved-lerp-k4", "resolved-weight-k4"])
def test_the_fused_kernel_gives_a_nan_row_where_the_score_span_overflows(op):
    """Resolved, fused: s - M = -inf on a valid key gave x = NaN, and the GPU's minNum/maxNum clamps dropped
    it (r = K - 1, t = 0): a finite, wrong row [0.82, 0.18, 0]. The interpreter runs the GPU's clamp semantics
    (kernels._patch_interpreter_minmax), so this runs the same on a CPU."""
    q = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2)
    k = torch.tensor([3e38, -3e38, 0.0]).view(1, 1, 3, 1) * torch.tensor([1.0, 0.0])
    out = kinterval_attention(q, k, torch.eye(3, 2).view(1, 1, 3, 2), op, scale=1.0, backend="triton")
    assert out.isnan().all()


def test_q_k_v_of_a_wrong_dtype_are_named():
    """An integer q raised "scores must be a floating tensor", naming no argument of kinterval_attention."""
    x = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"q must be a floating tensor \(float64/32.*got torch.int64"):
        kinterval_attention(x.long(), x, x, "lerp-k4")
    with pytest.raises(ValueError, match="v must be"):
        kinterval_attention(x, x, x.bool(), "lerp-k4")


def test_overrides_in_a_full_name_are_case_insensitive_as_the_name():
    """operators.md: names are case-insensitive; FWM-PROB-K4[TAU=5] said "unknown override(s) ['TAU']"."""
    want = OperatorSpec.parse("fwm-prob-k4", tau=5.0, range_grad="detach", arithmetic="historical")
    assert OperatorSpec.from_full_name("FWM-PROB-K4[TAU=5,Range_Grad=DETACH,ARITHMETIC=Historical]") == want


@pytest.mark.parametrize("full", ["lerp-k4[tau=0]", "lerp-k4[tau=nan]", "softmax[range_grad=bogus]"])
def test_an_override_that_does_not_apply_is_named_whatever_its_value(full):
    """lerp-k4[tau=0] said "tau must be a finite number in (0, 1000]", as if another tau would do."""
    with pytest.raises(ValueError, match="applies only to"):
        OperatorSpec.from_full_name(full)


@pytest.mark.parametrize("backend", ["reference", "closed_form"])
def test_causal_with_fewer_queries_than_keys_is_lower_right_as_documented(backend):
    """docs/operators.md: causal=True aligns the last query with the last key, as torch's causal_lower_right
    (SDPA's is_causal aligns the first query with the first key: top-left)."""
    from torch.nn.attention.bias import causal_lower_right

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, t, 8, dtype=torch.float64) for t in (3, 5, 5))
    out = kinterval_attention(q, k, v, OperatorSpec.parse("softmax"), causal=True, backend=backend)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5))
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, want, rtol=0, atol=1e-12) and not torch.allclose(out, top_left, atol=1e-3)


def test_word_overrides_are_case_insensitive_as_in_the_name():
    """``lerp-k4[range_grad=P1]`` parsed (names are case-insensitive) but ``parse("lerp-k4",
    range_grad="P1")``, the paper's spelling, was refused."""
    by_name = OperatorSpec.from_full_name("lerp-k4[range_grad=P1]")
    assert OperatorSpec.parse("lerp-k4", range_grad="P1") == by_name and by_name.range_grad == "p1"
    assert OperatorSpec.parse("minmax-weight-k4", arithmetic="Historical").arithmetic == "historical"
    with pytest.raises(ValueError, match="range_grad must be one of"):
        OperatorSpec.parse("lerp-k4", range_grad="P2")


@pytest.mark.parametrize(
    "full", ["minmax-prob-k4[]", "lerp-k4[range_grad=detach,]", "fwm-prob-k4[tau=5,,range_grad=detach]"]
)
def test_an_empty_override_in_brackets_is_an_error(full):
    """``minmax-prob-k4[]`` and a stray comma parsed as if the brackets were not there."""
    with pytest.raises(ValueError, match=r"empty override in \[\.\.\.\].*valid forms"):
        OperatorSpec.from_full_name(full)


def test_numpy_scalars_are_numbers_in_a_spec():
    """``tau=np.float32(5)`` (or an np.int64 ``K``) was "not a number"; numpy bools stay refused."""
    np = pytest.importorskip("numpy")
    want = OperatorSpec.parse("fwm-prob-k4", tau=5.0)
    for tau in (np.float32(5.0), np.float64(5.0), np.int64(5)):
        got = OperatorSpec.parse("fwm-prob-k4", tau=tau)
        assert got == want and type(got.tau) is float and got.full_name == "fwm-prob-k4[tau=5]"
    spec = OperatorSpec(kind="kinterval", calibration="fwm", reconstruction="lerp", K=np.int64(4))
    assert spec == OperatorSpec.parse("fwm-lerp-k4") and type(spec.K) is int
    with pytest.raises(ValueError, match="tau must be a number"):
        OperatorSpec.parse("fwm-prob-k4", tau=np.bool_(True))


def test_range_grad_takes_the_papers_five_modes_and_no_other_name():
    """full, detach, max_only, min_only and P1 (App. B) are the backward modes; any other name, however
    plausible, is an error (a sixth name would reach neither extremum term and act as detach in silence), and
    on a MinMax row the five give five different gradients (no two names collapse into one mode)."""
    from kinterval.ops.spec import RANGE_GRADS

    assert sorted(RANGE_GRADS) == sorted(("full", "detach", "max_only", "min_only", "p1"))
    for name in ("none", "max", "min", "detached", "projected", "p0", "both"):
        with pytest.raises(ValueError, match="valid forms"):
            OperatorSpec.parse("lerp-k4", range_grad=name)
    s = torch.tensor([[1.3, -2.0, 0.4, 3.1, -0.7]], dtype=torch.float64)
    up = torch.tensor([[0.5, -1.0, 2.0, 0.3, -0.4]], dtype=torch.float64)
    grads = []
    for mode in ("full", "detach", "max_only", "min_only", "P1"):
        x = s.clone().requires_grad_()
        (attention_probs(x, OperatorSpec.parse("lerp-k4", range_grad=mode)) * up).sum().backward()
        grads.append(x.grad)
    for i in range(5):
        for j in range(i):
            assert not torch.allclose(grads[i], grads[j], rtol=1e-6, atol=1e-9), (i, j)
