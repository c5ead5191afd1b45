"""``kinterval.ops.tf32`` (how the PyTorch >= 2.9 fp32_precision settings resolve, and what the context sets)
and the pass/fail rule of ``kinterval.ops.verify`` at its documented tolerances."""

import pytest
import torch

from kinterval.ops import verify
from kinterval.ops.spec import OperatorSpec
from kinterval.ops.tf32 import tf32, tf32_flags

b = torch.backends
new_api = pytest.mark.skipif(
    not hasattr(b.cuda.matmul, "fp32_precision"), reason="PyTorch without the fp32_precision settings"
)


@pytest.fixture
def settings():
    """Set fp32_precision settings in the order given (setting a parent also sets its children); all four
    are restored afterwards, parents first."""
    objs = {"top": b, "cudnn": b.cudnn, "matmul": b.cuda.matmul, "conv": b.cudnn.conv}
    old = {k: o.fp32_precision for k, o in objs.items()}

    def put(*pairs):
        for k, v in pairs:
            objs[k].fp32_precision = v

    yield put
    put(*old.items())
    assert {k: o.fp32_precision for k, o in objs.items()} == old


@new_api
def test_a_child_setting_wins_over_its_parent(settings):
    """The new API's settings are hierarchical: a matmul setting made after the top-level one is the one
    that applies (the parent's is only the default of a child left at "none")."""
    settings(("top", "ieee"), ("matmul", "tf32"))
    assert tf32_flags()[0] is True


@new_api
def test_tf32_off_is_off_whatever_the_parents_say(settings):
    """``tf32(False)``: fp32 matmuls and convolutions in IEEE precision inside the block, even when the
    top-level setting allows TF32; the settings come back on exit. The children are set to "none" (inherit):
    setting the top level leaves a child that an earlier test set explicitly as it was."""
    settings(("top", "tf32"), ("cudnn", "none"), ("matmul", "none"), ("conv", "none"))
    assert tf32_flags() == (True, True)
    with tf32(False):
        assert tf32_flags() == (False, False)
        assert (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision) == ("ieee", "ieee")
    assert tf32_flags() == (True, True)


def fake_run(g64_cf_factor, f32_cf_err, f32_ref_err=1e-3, seen=None):
    """A stand-in for ``verify._run`` whose closed-form gradient differs from the reference's by a chosen
    relative factor (float64) and whose float32 errors against the float64 truth (|g| = 1) are chosen."""

    def run(s, spec, up, backend, **kw):
        if seen is not None:
            seen.append((s.dtype, backend, sorted(kw)))
        P, g = torch.zeros(2).double(), torch.ones(2).double()
        if s.dtype == torch.float64:
            return P, g * (g64_cf_factor if backend == "closed_form" else 1.0)
        return P, g + (f32_cf_err if backend == "closed_form" else f32_ref_err)

    return run


@pytest.mark.parametrize(
    ("factor", "cf_err", "ok"),
    [
        (1 + 0.9e-9, 1e-3, True),
        (1 + 1.1e-9, 1e-3, False),  # f64: maximum relative gradient error at most 1e-9
        (1.0, 1.9e-3, True),
        (1.0, 2.1e-3, False),  # f32: error ratio against the reference's own float32 error below 2
    ],
)
def test_verify_passes_exactly_within_its_documented_tolerances(monkeypatch, factor, cf_err, ok):
    seen = []
    monkeypatch.setattr(verify, "_run", fake_run(factor, cf_err, seen=seen))
    r = verify.agreement(OperatorSpec.parse("lerp-k4"), T=5)
    assert r["ok"] is ok
    assert r["f32_err_ratio"] == pytest.approx(cf_err / 1e-3, rel=1e-3)
    runs = {(str(dt), be) for dt, be, _ in seen}
    assert runs == {
        (str(dt), be) for dt in (torch.float64, torch.float32) for be in ("reference", "closed_form")
    }


def test_verify_checks_both_k_values_and_both_masks_by_default(monkeypatch, capsys):
    """``python -m kinterval.ops.verify`` with no flags: K in {4, 16}, causal and random masks."""
    calls = []
    result = {
        "forward_identical": True,
        "forward_max_abs": 0.0,
        "grad_rel_err_f64": 0.0,
        "f32_err_ratio": 1.0,
    }

    def agreement(spec, **kw):
        calls.append((spec.full_name, kw["causal"]))
        return {**result, "ok": True}

    monkeypatch.setattr(verify, "agreement", agreement)
    assert verify.main([]) == 0
    names = {n for n, _ in calls}
    assert {"lerp-k4", "lerp-k16"} <= names and {c for _, c in calls} == {True, False}
    assert len(calls) == 2 * len(names)


def _precision_settings() -> list[tuple[object, str]]:
    """Every fp32 precision setting there is, parents before children (setting a parent sets its children):
    the new API's ``fp32_precision`` settings, or the legacy flags and the matmul precision."""
    if not hasattr(b.cuda.matmul, "fp32_precision"):
        return [("precision", torch.get_float32_matmul_precision()), ("cudnn", b.cudnn.allow_tf32)]
    objs = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.mkldnn]
    objs += [getattr(b.mkldnn, n) for n in ("matmul", "conv") if hasattr(b.mkldnn, n)]
    return [(o, o.fp32_precision) for o in objs if hasattr(o, "fp32_precision")]


def test_eval_precision_keeps_cpu_attention_in_fp32_under_medium_matmul_precision():
    """tf32(False) pinned only CUDA matmuls and cuDNN: after set_float32_matmul_precision("medium") oneDNN
    ran fp32 CPU matmuls in bf16 (on CPUs with bf16 units), so a CPU evaluation's fp32 attention was off by
    ~1e-2 from float64 while its summary said TF32 off. Every setting is the caller's again afterwards."""
    from kinterval.model import NumericsConfig, eval_precision
    from kinterval.ops import kinterval_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g, dtype=torch.float64) for _ in range(3))
    want = kinterval_attention(q, k, v, "lerp-k32", causal=True, backend="reference")
    saved = _precision_settings()
    try:
        torch.set_float32_matmul_precision("medium")
        before = _precision_settings()
        with eval_precision(NumericsConfig()):  # tf32_eval = False
            if hasattr(getattr(b.mkldnn, "matmul", None), "fp32_precision"):
                assert b.mkldnn.matmul.fp32_precision == "ieee"
            got = kinterval_attention(q.float(), k.float(), v.float(), "lerp-k32", causal=True)
        assert _precision_settings() == before
        with tf32(True):  # on: the CPU setting stays the caller's (TF32 is a CUDA setting)
            if hasattr(getattr(b.mkldnn, "matmul", None), "fp32_precision"):
                assert b.mkldnn.matmul.fp32_precision == "bf16"
        assert _precision_settings() == before
    finally:
        for obj, value in saved:
            if obj == "precision":
                torch.set_float32_matmul_precision(value)
            elif obj == "cudnn":
                b.cudnn.allow_tf32 = value
            else:
                obj.fp32_precision = value
    assert (got.double() - want).abs().max() < 1e-4


@new_api
@pytest.mark.parametrize("caller", ["highest", "medium"])
def test_the_generic_matmul_precision_getter_answers_inside_tf32(caller):
    """torch.get_float32_matmul_precision() (read by inductor's autotuning caches and FlexAttention's
    lowering) raised inside ``tf32(True)`` on PyTorch >= 2.9: the context set CUDA matmuls to "tf32" with
    the new API while the legacy precision it returns still said "highest". Inside the block it now answers
    "high" ("medium" where the caller's oneDNN matmuls are bf16), inside ``tf32(False)`` "highest", and
    every setting is the caller's again afterwards."""
    saved = _precision_settings()
    try:
        old = torch.get_float32_matmul_precision()
    except RuntimeError:  # an earlier test's new-API settings left the getter raising
        old = None
    try:
        torch.set_float32_matmul_precision(caller)
        before = _precision_settings()
        with tf32(True):
            assert torch.get_float32_matmul_precision() == ("medium" if caller == "medium" else "high")
            assert b.cuda.matmul.allow_tf32 is True and tf32_flags()[0] is True
        assert _precision_settings() == before and torch.get_float32_matmul_precision() == caller
        with tf32(False):
            assert torch.get_float32_matmul_precision() == "highest"
            assert b.cuda.matmul.allow_tf32 is False and tf32_flags() == (False, False)
        assert _precision_settings() == before and torch.get_float32_matmul_precision() == caller
    finally:
        if old is not None:
            torch.set_float32_matmul_precision(old)
        for obj, value in saved:
            obj.fp32_precision = value
