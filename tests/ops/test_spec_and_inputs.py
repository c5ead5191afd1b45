"""Operator names, overrides, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention
from kinterval.ops.catalog import all_specs


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
    with pytest.raises(ValueError, match="unknown backend"):
        kinterval_attention(q, q, q, "softmax", backend="flash")


def test_neg_inf_scores_count_as_masked():
    s = torch.tensor([[1.0, float("-inf"), 0.0]])
    P = attention_probs(s, "fwm-weight-k4")
    assert P[0, 1] == 0 and abs(P.sum().item() - 1) < 1e-6
    P = attention_probs(torch.full((1, 3), float("-inf")), "lerp-k4")
    assert (P == 0).all()


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


def test_mask_of_higher_rank_than_scores_is_a_value_error():
    with pytest.raises(ValueError, match="does not broadcast"):
        attention_probs(torch.randn(2, 3), "lerp-k4", mask=torch.ones(1, 1, 2, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    "name, overrides", [("lerp-k100000000000000000000", {}), ("fwm-prob-k4", {"tau": 1e300})]
)
def test_huge_k_or_tau_is_rejected_with_the_bounds(name, overrides):
    with pytest.raises(ValueError, match=r"valid forms.*2\^24"):
        OperatorSpec.parse(name, **overrides)


@pytest.mark.parametrize("full", ["fwm-prob-k4[tau=abc]", "fwm-prob-k4[tau]"])
def test_full_name_with_a_non_numeric_tau_is_a_named_error(full):
    with pytest.raises(ValueError, match=r"tau must be a number.*valid forms"):
        OperatorSpec.from_full_name(full)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "1", True])
def test_attention_scale_must_be_a_finite_number(scale):
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="scale must be a finite number"):
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


@pytest.mark.parametrize("op", ["lerp-k4", "fwm-prob-k4"])
@pytest.mark.parametrize("masked", [False, True])
def test_non_finite_rows_of_the_fused_kernel_are_nan_too(op, masked):
    """The triton backend forms no score matrix: its NaN rows come from q and k (the interpreter on CPU)."""
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).tril() if masked else None
    clean = kinterval_attention(q, k, v, op, causal=not masked, mask=mask, backend="triton")
    q[0, 1, 2, 0] = float("nan")
    k[0, 0, 12, 3] = float("-inf")  # key 12: seen by queries 12..15 of head 0
    out = kinterval_attention(q, k, v, op, causal=not masked, mask=mask, backend="triton")
    bad = torch.zeros(1, 2, 16, dtype=torch.bool)
    bad[0, 1, 2] = True
    bad[0, 0, 12:] = True
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
