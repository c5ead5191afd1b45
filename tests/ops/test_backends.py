"""One dispatcher: every operator of every shipped suite resolves to a backend that supports it."""

from __future__ import annotations

import re

import pytest
import torch

from kinterval.ops import OperatorSpec, attention_probs, kinterval_attention, resolve_backend
from kinterval.ops.backends import CLOSED_FORM, REFERENCE, REGISTRY, TRITON
from kinterval.ops.triton import triton_supports
from kinterval.suite.definition import load_suite, shipped_suites
from triton_gate import skip_without_kernels


def suite_operators() -> list[OperatorSpec]:
    ops = {r.operator for name in shipped_suites() for r in load_suite(name).runs if r.operator != "sdpa"}
    return [OperatorSpec.from_full_name(op) for op in sorted(ops)]


def test_without_triton_auto_never_picks_it_and_an_explicit_choice_says_so(monkeypatch):
    from kinterval.ops import backends

    monkeypatch.setattr(backends, "triton_problem", lambda: "triton is not installed")
    for spec in suite_operators():
        assert resolve_backend(spec, "cuda", torch.bfloat16) == "closed_form"
    why = r"'triton' cannot run .*: triton is not installed; backend 'closed_form' can"
    with pytest.raises(ValueError, match=why):
        resolve_backend("lerp-k4", "cuda", torch.bfloat16, backend="triton")


@pytest.mark.usefixtures("triton_installed")
def test_every_suite_operator_resolves_to_a_supporting_backend():
    specs = suite_operators()
    historical = [s for s in specs if s.arithmetic == "historical"]
    assert len(specs) > 40 and historical  # suites A-D and the supplementary group are all there
    for spec in specs:
        for dtype in (torch.float32, torch.bfloat16, None):
            b = resolve_backend(spec, "cuda", dtype)
            assert REGISTRY[b].supports(spec, "cuda", dtype), (spec.full_name, dtype, b)
            # the fastest: triton exactly when the kernels implement the operator
            assert (b == "triton") == triton_supports(spec), (spec.full_name, b)
        assert resolve_backend(spec, "cpu", torch.float32) == "closed_form"


@pytest.mark.usefixtures("triton_installed")
def test_triton_answer_follows_triton_supports(monkeypatch):
    spec = OperatorSpec.parse("minmax-weight-k4", arithmetic="historical")
    import kinterval.ops.triton as kt

    monkeypatch.setattr(kt, "triton_supports", lambda s: True)  # the kernels learn historical arithmetic
    assert resolve_backend(spec, "cuda", torch.float32) == "triton"
    monkeypatch.setattr(kt, "triton_supports", lambda s: False)
    assert resolve_backend(OperatorSpec.parse("lerp-k4"), "cuda", torch.float32) == "closed_form"


@pytest.mark.usefixtures("triton_installed")
def test_float64_on_cuda_never_picks_triton():
    for spec in suite_operators():
        assert resolve_backend(spec, "cuda", torch.float64) == "closed_form"
    assert not TRITON.supports(OperatorSpec.parse("softmax"), "cuda", torch.float64)
    assert TRITON.supports(OperatorSpec.parse("softmax"), "cuda", torch.bfloat16)


def test_closed_form_and_reference_support_everything():
    for spec in suite_operators() + [OperatorSpec.parse(b) for b in ("bf16-exp", "fp8-exp")]:
        for dev in ("cpu", "cuda"):
            assert CLOSED_FORM.supports(spec, dev, torch.float64) and REFERENCE.supports(spec, dev)


@pytest.mark.usefixtures("triton_installed")
def test_unsupported_explicit_choice_names_spec_backend_and_alternative(monkeypatch):
    spec = OperatorSpec.parse("fwm-prob-k4", arithmetic="historical")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the kernels implement every operator, but not on a CPU
    name = re.escape(spec.full_name)
    with pytest.raises(ValueError, match=rf"'triton' cannot run operator {name} on cpu.*'closed_form' can"):
        resolve_backend(spec, "cpu", torch.float32, backend="triton")
    with pytest.raises(ValueError, match=r"'triton' cannot run operator lerp-k4 on cuda, torch.float64"):
        resolve_backend("lerp-k4", "cuda", torch.float64, backend="triton")
    with pytest.raises(ValueError, match="never forms the probabilities"):
        resolve_backend("lerp-k4", "cuda", torch.float32, backend="triton", probs=True)
    with pytest.raises(ValueError, match="unknown backend 'flash'"):
        resolve_backend("lerp-k4", "cuda", backend="flash")
    assert resolve_backend("lerp-k4", "cuda", torch.float32, backend="reference") == "reference"
    assert resolve_backend("lerp-k4", "cuda", torch.float32, probs=True) == "closed_form"


@pytest.mark.usefixtures("triton_installed")
def test_triton_off_cuda_only_in_the_interpreter(monkeypatch):
    spec = OperatorSpec.parse("lerp-k4")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="need a CUDA device"):
        resolve_backend(spec, "cpu", torch.float32, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend(spec, "cpu", torch.float32, backend="triton") == "triton"
    assert resolve_backend(spec, "cpu", torch.float32) == "closed_form"  # auto never picks the interpreter
    with pytest.raises(ValueError, match="need a CUDA device"):  # the interpreter runs CPU tensors only
        resolve_backend(spec, "meta", torch.float32, backend="triton")


def test_attention_api_checks_an_explicit_backend():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="cannot run operator lerp-k4"):
        kinterval_attention(q.double(), q.double(), q.double(), "lerp-k4", backend="triton")


def test_an_unknown_device_name_is_a_value_error():
    """torch.device("gpu0") raised torch's RuntimeError."""
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_backend("lerp-k4", "gpu0")


def test_second_derivatives_through_closed_form_raise():
    """closed_form's gradient is computed outside autograd: differentiated again (create_graph=True) it gave a
    quietly wrong second derivative (d|dq|^2/dk of lerp-k4: 20.4 against the reference's 202). Now the first
    derivative is unchanged and a second one raises; the reference differentiates to any order."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, 9, 16, generator=g, dtype=torch.float64) for _ in range(4))
    firsts = {}
    for backend in ("reference", "closed_form"):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        out = kinterval_attention(qq, kk, vv, "lerp-k4", causal=True, backend=backend)
        (gq,) = torch.autograd.grad((out * do).sum(), qq, create_graph=True)
        firsts[backend] = gq.detach()
        if backend == "reference":
            torch.autograd.grad((gq**2).sum(), kk)  # fine
            continue
        for wrt in (kk, qq, vv):
            with pytest.raises(RuntimeError, match="closed_form.*first order only"):
                torch.autograd.grad((gq**2).sum(), wrt, retain_graph=True)
    torch.testing.assert_close(firsts["closed_form"], firsts["reference"], rtol=1e-10, atol=1e-12)
    s = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)  # the probability entry point
    P = attention_probs(s, "fwm-prob-k4", backend="closed_form")
    (gs,) = torch.autograd.grad((P * torch.arange(5.0, dtype=torch.float64)).sum(), s, create_graph=True)
    with pytest.raises(RuntimeError, match="first order only"):
        torch.autograd.grad(gs.square().sum(), s)


def test_a_dtype_that_is_not_a_torch_dtype_is_a_value_error():
    """dtype="float64" was compared with torch.float64, never matched, and triton was accepted for it."""
    with pytest.raises(ValueError, match="dtype must be a torch.dtype or None, got 'float64'"):
        resolve_backend("lerp-k4", "cpu", "float64")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn])
def test_a_dtype_no_operator_takes_is_a_value_error(dtype):
    """resolve_backend answered "closed_form" for int64, bool and complex inputs, which every operator
    refuses (kinterval_attention: scores must be a floating tensor)."""
    with pytest.raises(ValueError, match=f"dtype must be float64, float32, bfloat16 or float16 .*{dtype}"):
        resolve_backend("lerp-k4", "cpu", dtype)
    assert resolve_backend("lerp-k4", "cpu", torch.bfloat16) == "closed_form"


def test_a_backend_that_is_not_a_string_is_a_value_error():
    """backend=["auto"] raised TypeError: unhashable type: 'list'."""
    with pytest.raises(ValueError, match=r"backend must be a string, one of \('auto', .*got \['auto'\]"):
        resolve_backend("lerp-k4", "cpu", backend=["auto"])


def test_auto_sends_a_value_head_dim_of_its_own_to_the_kernels(monkeypatch):
    """v with its own head dimension Dv != D (SDPA allows it): "auto" on CUDA takes the fused kernels, which
    pad the narrower head dim with zero columns (they once needed Dv = D, and "auto" took closed_form, which
    materializes P). Here on CPU tensors the kernels run in Triton's interpreter (tests/conftest.py)."""
    import kinterval.ops.api as api
    import kinterval.ops.triton as tri

    skip_without_kernels()
    assert resolve_backend("fwm-prob-k4", "cuda", torch.float32) == "triton"
    real, real_kernels = api.resolve_backend, tri.triton_attention
    monkeypatch.setattr(
        api, "resolve_backend", lambda spec, device, dtype, **kw: real(spec, "cuda", dtype, **kw)
    )
    calls = []
    monkeypatch.setattr(tri, "triton_attention", lambda *a, **kw: calls.append(1) or real_kernels(*a, **kw))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    for Dv in (3, 12):
        v = torch.randn(1, 2, 5, Dv, generator=g)
        for spec in ("fwm-prob-k4", "softmax"):
            got = kinterval_attention(q, k, v, spec, causal=True, precision="ieee")
            want = kinterval_attention(q, k, v, spec, causal=True, backend="closed_form")
            assert got.shape == (1, 2, 5, Dv) and got.is_contiguous()
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert len(calls) == 4


def test_the_operators_run_outside_autocast(monkeypatch):
    """App. A: the operator runs in a disabled-autocast region. Called inside autocast (and its backward
    too), every entry point hands the backends autocast off: on CUDA, autocast runs ``exp`` in float32,
    which would take BF16-exp's bfloat16 rounding away."""
    import kinterval.ops.closed_form as closed_form
    import kinterval.ops.reference as reference

    seen = []

    def spy(module, name):
        real = getattr(module, name)

        def recording(*args):
            seen.append((name, torch.is_autocast_enabled("cpu")))
            return real(*args)

        monkeypatch.setattr(module, name, recording)

    spy(reference, "reference_probs")
    spy(closed_form, "reference_probs")  # the closed form's forward
    spy(closed_form, "closed_form_grad")
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for backend in ("reference", "closed_form"):
            scores = q @ k.transpose(-2, -1)
            attention_probs(scores, "bf16-exp", causal=True, backend=backend).sum().backward()
            kinterval_attention(q, k, v, "minmax-weight-k4", causal=True, backend=backend).sum().backward()
    assert {name for name, _ in seen} == {"reference_probs", "closed_form_grad"}
    assert not any(on for _, on in seen), seen


@pytest.mark.parametrize(
    "version, problem",
    [
        ("3.2.0", "triton 3.2.0 is older than 3.6, the oldest the fused kernels run on"),
        ("3.5.1", "triton 3.5.1 is older than 3.6"),
        ("3.6.0", None),
        ("3.7.0rc1", None),
        ("3.10.0+git1a2b", None),
    ],
)
def test_a_triton_older_than_the_kernels_need_is_named_and_auto_passes_over_it(monkeypatch, version, problem):
    """torch 2.6 to 2.9 bring Triton 3.2 to 3.5, older than the kernels are tested with (under 3.2 they cannot
    even be defined without a GPU: its autotuner asks for a driver). The dispatcher reads the installed
    version without importing triton: "auto" then takes closed_form, and an explicit "triton" says why not."""
    from kinterval.ops import backends

    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(backends.importlib.metadata, "version", lambda name: version)
    got = backends.triton_problem.__wrapped__()
    if problem is None:
        assert got is None
        return
    assert got.startswith(problem)
    monkeypatch.setattr(backends, "triton_problem", lambda: got)
    assert resolve_backend("lerp-k4", "cuda", torch.bfloat16) == "closed_form"
    with pytest.raises(ValueError, match=rf"'triton' cannot run .*: triton {re.escape(version)} is older"):
        resolve_backend("lerp-k4", "cuda", torch.bfloat16, backend="triton")
