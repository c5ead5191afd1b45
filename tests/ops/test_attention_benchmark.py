"""benchmarks/attention.py end to end in its --smoke mode (Triton's CPU interpreter without a GPU): the
FlexAttention anchor rows and "x flex", the split-dot modes, the forward-error columns. No timing is
checked."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

from triton_gate import skip_without_kernels

skip_without_kernels(module=True)

ROOT = Path(__file__).resolve().parents[2]
NEW_COLUMNS = ("x flex", "err vs fp64", "torch fp32 err", "torch same-precision err")
PROVENANCE = ("# kinterval triton attention benchmark", "# command ")  # the header lines


@pytest.fixture
def bench():
    """The benchmark script as a module (its main() takes argv)."""
    spec = importlib.util.spec_from_file_location("attention_benchmark", ROOT / "benchmarks" / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SDPA_NOTE = "SDPA f+b, x SDPA: '-' without CUDA (SDPA flash is a CUDA kernel)"


def run(bench, capsys, tmp_path, *args):
    """main(--smoke ...) -> (rows of the printed table as dicts, the '# ' note lines, the CSV rows)."""
    out_csv = tmp_path / "bench.csv"
    assert bench.main(["--smoke", "--csv", str(out_csv), *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith("|") and not line.startswith("|-")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in table[1:]]
    notes = [line[2:] for line in lines if line.startswith("# ") and not line.startswith(PROVENANCE)]
    # why SDPA's columns show "-": said once where SDPA flash cannot run (checked here for every run)
    sdpa = [n for n in notes if n.startswith("SDPA f+b")]
    if not torch.cuda.is_available():
        assert sdpa == [SDPA_NOTE]
    else:
        assert sdpa == (["SDPA f+b, x SDPA: '-' (--no-sdpa)"] if "--no-sdpa" in args else [])
    notes = [n for n in notes if n not in sdpa]
    with open(out_csv, newline="") as f:  # the CSV's '# ' lines: versions and commit
        return rows, notes, list(csv.DictReader(line for line in f if not line.startswith("# ")))


@pytest.mark.parametrize("mode", ["tf32x3", "bf16x6"])
def test_flex_row_and_split_dot_row_or_their_reasons(bench, capsys, tmp_path, mode):
    """Per (mode, T, D) a flex-softmax row, then the kernels. Where FlexAttention cannot run (torch 2.13 has
    no FlexAttention backward on CPU), its row shows "-" and one printed line says why; where it runs, the
    values are filled in. The split-dot kernels always run (their dots are the kernels' own code)."""
    rows, notes, _ = run(bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", mode)
    assert set(NEW_COLUMNS) <= set(rows[0])
    assert [(r["operator"], r["dtype"]) for r in rows] == [("flex-softmax", mode), ("softmax", mode)]
    flex, kernel = rows
    flex_notes = [n for n in notes if n.startswith("flex-softmax rows: flex_attention failed (")]
    if flex["f+b ms"] == "-":
        assert len(flex_notes) == 1 and kernel["x flex"] == "-"
    else:
        assert not flex_notes and flex["x flex"] == "1" and kernel["x flex"] != "-"
    assert kernel["f+b ms"] != "-"  # near-fp32: the bound, twice torch's own fp32 error vs float64
    assert 0 < float(kernel["err vs fp64"]) <= 2 * float(kernel["torch fp32 err"]) < 1e-5


def test_flex_ratio_and_error_columns(bench, capsys, tmp_path, monkeypatch):
    """With a FlexAttention stand-in that runs on CPU (eager SDPA), the flex row is timed like the others,
    "x flex" is the kernel's fwd+bwd time over the flex row's, and every row has its forward errors."""
    import torch.nn.functional as F

    def sdpa(q, k, v, block_mask=None, enable_gqa=False):  # flex_attention's signature
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)

    monkeypatch.setattr(bench, "_flex", lambda causal, T, device: (sdpa, None))
    rows, notes, data = run(bench, capsys, tmp_path, "--ops", "softmax,lerp-k4", "--dtypes", "tf32")
    assert len(notes) == 1 and notes[0].startswith("error columns: ")  # lerp-k4's flip-prone rows
    assert [r["operator"] for r in data] == ["flex-softmax", "softmax", "lerp-k4"]
    flex_fb = float(data[0]["f+b ms"])
    for r in data[1:]:
        assert float(r["x flex"]) == pytest.approx(float(r["f+b ms"]) / flex_fb, rel=1e-9)
    for r in data:  # fp32 in the interpreter: errors of fp32 rounding, torch's at most a few times smaller
        err, err_torch = float(r["err vs fp64"]), float(r["torch fp32 err"])
        assert 0 < err_torch < 1e-5 and 0 < err < 4 * err_torch, r["operator"]
    # softmax's torch error is SDPA math; lerp-k4's is its own fp32 reference: different numbers
    assert data[1]["torch fp32 err"] == data[0]["torch fp32 err"] != data[2]["torch fp32 err"]


def test_grouped_query_rows(bench, capsys, tmp_path, monkeypatch):
    """--gqa 2: the kernels get k, v with H / 2 heads, as they are; the flex stand-in and every reference get
    the same k, v with enable_gqa; the error columns compare them all at fp32 rounding. A --gqa that does not
    divide H is refused before anything runs."""
    import torch.nn.functional as F

    seen = []

    def sdpa(q, k, v, block_mask=None, enable_gqa=False):
        seen.append((q.shape[1], k.shape[1], enable_gqa))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)

    monkeypatch.setattr(bench, "_flex", lambda causal, T, device: (sdpa, None))
    rows, _, data = run(bench, capsys, tmp_path, "--ops", "softmax,minmax-weight-k4", "--dtypes", "ieee",
                        "--gqa", "2")  # fmt: skip
    assert [(r["operator"], r["H"], r["H kv"]) for r in data] == [
        ("flex-softmax", "4", "2"), ("softmax", "4", "2"), ("minmax-weight-k4", "4", "2")
    ]  # fmt: skip
    assert set(seen) == {(4, 2, True)}
    for r in data:
        err, err_torch = float(r["err vs fp64"]), float(r["torch fp32 err"])
        assert 0 < err_torch < 1e-5 and 0 < err < 4 * err_torch, r["operator"]
    with pytest.raises(SystemExit, match="--gqa 3 must divide H = 2"):
        bench._check_gqa(3, 64, [32], 64, 6)
    with pytest.raises(SystemExit, match="--gqa 3 must divide --err-heads 8"):
        bench._check_gqa(3, 96, [32], 64, 8)
    with pytest.raises(SystemExit, match="--gqa must be >= 1"):
        bench.main(["--smoke", "--gqa", "0"])


def test_smoke_runs_the_documented_gqa(bench, capsys, tmp_path):
    """docs/performance.md's `--gqa 4` under --smoke: the smoke shape has two k/v heads whatever G (it had two
    q heads, and refused every G above 2)."""
    rows, _, _ = run(
        bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", "bf16", "--gqa", "4", "--no-flex"
    )
    assert [(r["H"], r["H kv"]) for r in rows] == [("8", "2")]
    assert float(rows[0]["err vs fp64"]) < 0.02


def _spies(monkeypatch):
    """Spies on the kernel and the reference entry points the benchmark imports in main(): each call's
    softcap and sinks (None if not given), the kernel's in ``calls["kernel"]``, the reference's in
    ``calls["ref"]``, and each call's score bias (the kernel's ``bias``, the reference's float ``attn_mask``)
    in ``calls["kernel bias"]`` / ``calls["ref bias"]``; and a causal FlexAttention stand-in (eager, CPU) that
    applies a ``score_mod`` it is given (with flex_attention's index arguments), recorded in
    ``calls["flex"]``."""
    import torch.nn.functional as F

    import kinterval.ops
    import kinterval.ops.triton

    calls = {"kernel": [], "ref": [], "flex": [], "kernel bias": [], "ref bias": []}

    def spy(name, real):
        def call(*args, **kw):
            calls[name].append((kw.get("softcap"), kw.get("sinks")))
            calls[f"{name} bias"].append(kw.get("bias", kw.get("attn_mask")))
            return real(*args, **kw)

        return call

    monkeypatch.setattr(
        kinterval.ops.triton, "triton_attention", spy("kernel", kinterval.ops.triton.triton_attention)
    )
    monkeypatch.setattr(kinterval.ops, "kinterval_attention", spy("ref", kinterval.ops.kinterval_attention))

    def flex(q, k, v, block_mask=None, enable_gqa=False, score_mod=None):
        calls["flex"].append(score_mod)
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        H, T = q.shape[1], q.shape[-2]
        if score_mod is not None:  # flex_attention's (b, h, q_idx, kv_idx), broadcast over the scores
            idx = torch.arange(T)
            s = score_mod(s, None, torch.arange(H)[:, None, None], idx[:, None], idx[None, :])
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return F.softmax(s, -1) @ v

    return calls, flex


def test_softcap_reaches_kernel_reference_flex_and_error_columns(bench, capsys, tmp_path, monkeypatch):
    """--softcap 5: every kernel call (timed and at the error shape) and every reference call (eager
    timing, float64, torch fp32) gets softcap 5, the flex stand-in gets a score_mod; the errors against the
    softcapped float64 reference are fp32 rounding, for the flex row too. Teeth: a kernel that drops the
    softcap is far off that reference."""
    calls, flex = _spies(monkeypatch)
    monkeypatch.setattr(bench, "_flex", lambda causal, T, device: (flex, None))
    rows, notes, data = run(bench, capsys, tmp_path, "--ops", "softmax,fwm-prob-k4", "--dtypes", "tf32",
                            "--softcap", "5")  # fmt: skip
    assert [r["operator"] for r in data] == ["flex-softmax", "softmax", "fwm-prob-k4"]
    for r in data:
        assert float(r["f+b ms"]) > 0 and float(r["fwd ms"]) > 0, r["operator"]
        err, err_torch = float(r["err vs fp64"]), float(r["torch fp32 err"])
        assert 0 < err_torch < 1e-5 and 0 < err < 4 * err_torch, r["operator"]
    assert all(float(r["x ref eager"]) > 0 for r in data[1:])
    assert any(n.startswith("softcap 5: scores 5 tanh(scale q.k / 5)") for n in notes)
    assert len(calls["kernel"]) >= 2 * 3 and set(calls["kernel"]) == {(5.0, None)}  # fwd, f+b, err; 2 ops
    assert len(calls["ref"]) >= 4 and set(calls["ref"]) == {(5.0, None)}
    assert calls["flex"] and all(m is not None for m in calls["flex"])
    # teeth: the kernel without the softcap, against the same softcapped float64 reference
    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.triton import triton_attention

    errors = bench._Errors(True, "cpu", 64, 2, kinterval_attention, [], softcap=5.0)
    spec = OperatorSpec.from_full_name("softmax")
    plain = errors._err(
        "plain", spec, torch.float32, 32, lambda q, k, v: triton_attention(q, k, v, spec, causal=True)
    )
    assert plain > 1e-3


def test_sinks_reach_kernel_reference_and_error_columns_not_flex(bench, capsys, tmp_path, monkeypatch):
    """--sinks: every kernel and reference call gets linspace(-2, 2, H) (H = 2 in the smoke run) as sinks,
    the timed ones with requires_grad (f+b computes their gradient); the flex stand-in stays plain softmax
    and its error column is against plain float64 softmax; the kernels' errors are against the float64
    reference with the same sinks. Teeth: a kernel without the sinks is far off that reference."""
    calls, flex = _spies(monkeypatch)
    monkeypatch.setattr(bench, "_flex", lambda causal, T, device: (flex, None))
    rows, notes, data = run(bench, capsys, tmp_path, "--ops", "softmax,minmax-weight-k4", "--dtypes", "tf32",
                            "--sinks")  # fmt: skip
    assert [r["operator"] for r in data] == ["flex-softmax", "softmax", "minmax-weight-k4"]
    for r in data:
        assert float(r["f+b ms"]) > 0, r["operator"]
        err, err_torch = float(r["err vs fp64"]), float(r["torch fp32 err"])
        assert 0 < err_torch < 1e-5 and 0 < err < 4 * err_torch, r["operator"]
    assert any(n.startswith("sinks: torch.linspace(-2, 2, H)") for n in notes)
    assert calls["flex"] and all(m is None for m in calls["flex"])
    linspace = torch.tensor([-2.0, 2.0], dtype=torch.float64)
    for name in ("kernel", "ref"):
        assert calls[name] and all(c is None for c, _ in calls[name])
        with_sinks = [s for _, s in calls[name] if s is not None]
        assert with_sinks and all(torch.equal(s.detach().double(), linspace) for s in with_sinks)
    assert all(s is not None for _, s in calls["kernel"])
    # the reference calls without sinks: the float64 softmax of the flex row's three error columns
    assert len(calls["ref"]) - len([s for _, s in calls["ref"] if s is not None]) == 3
    timed = [s for _, s in calls["kernel"] if s.requires_grad]
    assert timed and all(s.grad is not None and s.grad.shape == (2,) for s in timed)
    # teeth: the kernel without the sinks, against the float64 reference with them
    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.triton import triton_attention

    errors = bench._Errors(True, "cpu", 64, 2, kinterval_attention, [], sinks=True)
    spec = OperatorSpec.from_full_name("softmax")
    plain = errors._err(
        "plain", spec, torch.float32, 32, lambda q, k, v: triton_attention(q, k, v, spec, causal=True)
    )
    assert plain > 1e-3


@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_bias_reaches_kernel_reference_flex_and_error_columns(bench, capsys, tmp_path, monkeypatch, kind):
    """--bias alibi|t5: every kernel call gets the fp32 bias (alibi: slope 2^(-8 (h+1) / H) times the key
    index, (1, H, 1, T); t5: (1, H, T, T), requires_grad in the timed rows, so f+b computes its gradient),
    every reference call the same values as its float attn_mask (float64 for the float64 reference), the
    flex stand-in a score_mod; the errors against the biased float64 reference are fp32 rounding, for the
    flex row too. Teeth: a kernel without the bias is far off that reference."""
    calls, flex = _spies(monkeypatch)
    monkeypatch.setattr(bench, "_flex", lambda causal, T, device: (flex, None))
    rows, notes, data = run(bench, capsys, tmp_path, "--ops", "softmax,minmax-weight-k4", "--dtypes", "tf32",
                            "--bias", kind)  # fmt: skip
    assert [r["operator"] for r in data] == ["flex-softmax", "softmax", "minmax-weight-k4"]
    for r in data:
        assert float(r["f+b ms"]) > 0, r["operator"]
        err, err_torch = float(r["err vs fp64"]), float(r["torch fp32 err"])
        assert 0 < err_torch < 1e-5 and 0 < err < 4 * err_torch, r["operator"]
    assert any(n.startswith(f"bias {kind}: ") for n in notes)
    expected = bench._bias(kind, 2, 64, "cpu").detach()  # H = 2, T = 64: the smoke shape and the error shape
    if kind == "alibi":
        assert expected.shape == (1, 2, 1, 64)
        assert torch.equal(expected[0, :, 0, 3], torch.tensor([3 / 16, 3 / 256]))
    assert calls["flex"] and all(m is not None for m in calls["flex"])
    for name in ("kernel", "ref"):
        biases = calls[f"{name} bias"]
        assert biases and all(b is not None and torch.equal(b.detach().float(), expected) for b in biases)
    assert {b.dtype for b in calls["kernel bias"]} == {torch.float32}
    assert torch.float64 in {b.dtype for b in calls["ref bias"]}
    timed = [b for b in calls["kernel bias"] if b.requires_grad]
    if kind == "t5":
        assert timed and all(b.grad is not None and b.grad.shape == (1, 2, 64, 64) for b in timed)
    else:
        assert not timed
    # teeth: the kernel without the bias, against the float64 reference with it
    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.triton import triton_attention

    errors = bench._Errors(True, "cpu", 64, 2, kinterval_attention, [], bias=kind)
    spec = OperatorSpec.from_full_name("minmax-weight-k4")
    plain = errors._err(
        "plain", spec, torch.float32, 32, lambda q, k, v: triton_attention(q, k, v, spec, causal=True)
    )
    assert plain > 1e-3


def test_alibi_bias_is_a_row_shift_of_alibis_relative_form(bench):
    """The alibi bias slope * j differs from ALiBi's -slope * (i - j) by slope * i, a constant of row i:
    every operator of the family gives the same output under either (float64 reference, causal)."""
    from kinterval.ops import kinterval_attention

    H, T, D = 2, 12, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    bias = bench._bias("alibi", H, T, "cpu").double()
    i = torch.arange(T, dtype=torch.float64)
    slopes = bias[0, :, 0, 1]  # slope * 1
    relative = -slopes[:, None, None] * (i[:, None] - i[None, :])  # (H, T, T)
    for name in ("softmax", "minmax-weight-k4", "fwm-prob-k4", "lerp-k4"):
        a, b = (kinterval_attention(q, k, v, name, causal=True, attn_mask=m, backend="reference")
                for m in (bias, relative[None]))  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def test_sinks_flip_rows_count_the_sink_as_a_key(bench):
    """With sinks, the flip-prone rows are found with the sink as one more key of every row (after the
    softcap). MinMax K = 4, one head, causal, q = 4 e_0 at D = 16 (scale 1/4): s_ij = k_j0. k_0 = (0, 8):
    row 1 holds its extrema only; a sink of 4 is the row's grid boundary x = 2 (M = 8, m = 0): row 1 is
    flip-prone with the sink, not without it; with softcap 30 the boundary moves (4 is then no boundary of
    30 tanh(s / 30) at 8 and 0) but the sink, added after the softcap, stays at 4, the boundary of the
    softcapped row only if M' = 30 tanh(8 / 30) = 7.82... x = 4 / (M' / 4) = 2.05: not within rounding."""
    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.api import valid_mask

    D, T = 16, 2
    q = torch.zeros(1, 1, T, D)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, T, D)
    k[0, 0, :, 0] = torch.tensor([0.0, 8.0])
    spec = OperatorSpec.parse("minmax-weight-k4")
    valid = valid_mask((1, 1, T, T), "cpu", causal=True, mask=None)
    for sinks, softcap, flips in ((False, None, [False, False]), (True, None, [False, True]),
                                  (True, 30.0, [False, False])):  # fmt: skip
        errors = bench._Errors(True, "cpu", T, 1, kinterval_attention, [], sinks=sinks, softcap=softcap)
        errors.mods = lambda q_, sinks=sinks, softcap=softcap: {
            **({"sinks": torch.tensor([4.0])} if sinks else {}), **({"softcap": softcap} if softcap else {})
        }  # fmt: skip
        assert errors._flips(spec, q, k, D, valid)[0, 0].tolist() == flips, (sinks, softcap)


def test_bias_flip_rows_see_the_biased_scores(bench):
    """With a bias, the flip-prone rows are found on the biased scores. MinMax K = 4, causal, q = 4 e_0 at
    D = 16 (scale 1/4): s_ij = k_j0, k_0 = (0, 8, 3.5): row 2 holds 0, 8 and 3.5 (x = 1.75 on the grid of
    h = 2, no decision near a discontinuity); a bias (0, 0, 0.5) moves key 2 to 4 (x = 2, the boundary of
    the sinks test above): row 2 is flip-prone then only."""
    from kinterval.ops import OperatorSpec, kinterval_attention
    from kinterval.ops.api import valid_mask

    D, T = 16, 3
    q = torch.zeros(1, 1, T, D)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, T, D)
    k[0, 0, :, 0] = torch.tensor([0.0, 8.0, 3.5])
    spec = OperatorSpec.parse("minmax-weight-k4")
    valid = valid_mask((1, 1, T, T), "cpu", causal=True, mask=None)
    errors = bench._Errors(True, "cpu", T, 1, kinterval_attention, [])
    assert errors._flips(spec, q, k, D, valid)[0, 0].tolist() == [False, False, False]
    errors.bias = torch.tensor([0.0, 0.0, 0.5]).view(1, 1, 1, T)
    assert errors._flips(spec, q, k, D, valid)[0, 0].tolist() == [False, False, True]


def test_no_flex_removes_flex_rows_and_values(bench, capsys, tmp_path):
    rows, notes, _ = run(bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", "bf16", "--no-flex")
    assert [r["operator"] for r in rows] == ["softmax"]
    assert rows[0]["x flex"] == "-" and rows[0]["f+b ms"] != "-"
    assert not any("flex" in n for n in notes)
    # bf16 inputs: the bf16 output's rounding, far above torch's fp32 error
    assert float(rows[0]["err vs fp64"]) > 100 * float(rows[0]["torch fp32 err"])


def test_refuses_without_gpu_unless_smoke(bench):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark would run in full")
    assert bench.main(["--ops", "softmax"]) == 2


def test_error_columns_leave_out_flip_prone_rows(bench):
    """A K-interval row whose grid decision lies within fp32 rounding of a discontinuity may legitimately
    differ from float64 by a whole interval: the error columns leave it out, say how many rows they left
    out, and count every other row. One head, causal, q = 4 e_0 and scale 1/4: s_ij = k_j0. MinMax K = 4:
    row 1 sees scores (0, 8), its extrema only; row 2 sees (0, 8, 4), and 4 is the grid boundary x = 2."""
    from kinterval.ops import OperatorSpec, kinterval_attention

    D, T = 16, 3
    q = torch.zeros(1, 1, T, D)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, T, D)
    k[0, 0, :, 0] = torch.tensor([0.0, 8.0, 4.0])
    v = torch.randn(1, 1, T, D, generator=torch.Generator().manual_seed(0))
    spec = OperatorSpec.parse("minmax-weight-k4")
    ref = kinterval_attention(q.double(), k.double(), v.double(), spec, causal=True, backend="reference")
    notes: list[str] = []
    errors = bench._Errors(True, "cpu", T, 1, kinterval_attention, notes)
    errors._inputs = lambda D_, dtype: [q, k, v]

    def off_by(row, amount, base=ref):
        out = base.clone()
        out[0, 0, row] += amount
        return lambda *qkv: out

    assert errors._err("flip", spec, torch.float32, D, off_by(2, 0.25)) == 0.0  # row 2 is left out
    err = errors._err("other", spec, torch.float32, D, off_by(1, 0.25))
    assert err == pytest.approx(0.25)  # row 1 counts
    softmax = OperatorSpec.parse("softmax")  # no grid decisions: every row counts, and not in the share
    ref_softmax = kinterval_attention(q.double(), k.double(), v.double(), softmax, causal=True)
    err = errors._err("softmax", softmax, torch.float32, D, off_by(2, 0.5, ref_softmax))
    assert err == pytest.approx(0.5)
    errors.note_left_out()
    assert notes == [
        "error columns: rows left out (K-interval operators 33.3-33.3%), a decision within fp32 rounding of "
        "a discontinuity (kinterval.ops.flips)"
    ]
    notes.clear()  # the baselines flip far more rows: their share is given on its own
    errors.left_out = {("bf16-exp", 64, "x"): 0.4, ("lerp-k4", 64, "x"): 0.01, ("fp8-exp", 64, "x"): 0.09}
    errors.note_left_out()
    assert "(K-interval operators 1.0-1.0%, bf16-exp 40.0-40.0%, fp8-exp 9.0-9.0%)" in notes[0]


def test_error_columns_find_flips_at_the_benchmarks_scale_and_note_the_share_range(bench):
    """FWM's grid, unlike MinMax's, is not scale-free (tau is fixed): the error columns look for flip-prone
    rows at the benchmark's scale D^-1/2. One head, causal, T = 3, q = 4 e_0 at D = 16 (scale 1/4): s_ij =
    k_j0. fwm-weight-k4 (tau = 6, h = 1.5), k_0 = (0, 3, -20): rows 1 and 2 have M = 3 and key 0 at z = -3,
    the boundary x = 2 (-20 is past the tail cut); at scale 1 key 0 would sit at z = -12, past the cut, and no
    row would be left out. The note gives the range of the shares over every (operator, D): minmax-weight-k4
    leaves out none of the rows at D = 32 (k_0 = (0, 8, 4.3): x = 2.15) and 1 in 3 at D = 16 (k_0 = (0, 8, 4):
    x = 2); fwm-weight-k4 2 in 3."""
    from kinterval.ops import OperatorSpec, kinterval_attention

    T = 3

    def inputs(D, key0):
        q = torch.zeros(1, 1, T, D)
        q[..., 0] = 4.0
        k = torch.zeros(1, 1, T, D)
        k[0, 0, :, 0] = torch.tensor(key0)
        v = torch.randn(1, 1, T, D, generator=torch.Generator().manual_seed(0))
        return [q, k, v]

    def off_by(spec, qkv, row, amount):
        ref = kinterval_attention(*(x.double() for x in qkv), spec, causal=True, backend="reference")
        ref[0, 0, row] += amount
        return lambda *args: ref

    notes: list[str] = []
    errors = bench._Errors(True, "cpu", T, 1, kinterval_attention, notes)
    minmax, fwm = OperatorSpec.parse("minmax-weight-k4"), OperatorSpec.parse("fwm-weight-k4")
    for spec, D, key0, flip in ((minmax, 32, [0.0, 8.0, 4.3], False), (minmax, 16, [0.0, 8.0, 4.0], True)):
        qkv = inputs(D, key0)
        errors._inputs = lambda D_, dtype, qkv=qkv: qkv
        # row 1 (the extremes alone) always counts; row 2 is left out at D = 16 only
        assert errors._err(("r1", D), spec, torch.float32, D, off_by(spec, qkv, 1, 0.25)) == pytest.approx(
            0.25
        )
        err = errors._err(("r2", D), spec, torch.float32, D, off_by(spec, qkv, 2, 0.5))
        assert err == (0.0 if flip else pytest.approx(0.5))
    qkv = inputs(16, [0.0, 3.0, -20.0])
    errors._inputs = lambda D_, dtype: qkv
    assert errors._err("fwm", fwm, torch.float32, 16, off_by(fwm, qkv, 1, 0.25)) == 0.0  # rows 1, 2 left out
    assert errors._err("fwm0", fwm, torch.float32, 16, off_by(fwm, qkv, 0, 0.25)) == pytest.approx(0.25)
    errors.note_left_out()
    assert notes == [
        "error columns: rows left out (K-interval operators 0.0-66.7%), a decision within fp32 rounding of a "
        "discontinuity (kinterval.ops.flips)"
    ]


# ------------------------------------------------------------------------------------- audit 2026-11-27
@pytest.mark.parametrize("name", ["bf16-exp", "fp8-exp"])
def test_torch_fp32_err_of_a_rounded_exp_baseline_is_fp32_rounding(bench, name):
    """ "torch fp32 err" is torch's own fp32 evaluation of the row's operator against its float64 reference.
    The rounded-exp baselines are not K-interval operators, and were sent to SDPA's softmax: the column then
    held the distance between softmax and the baseline (bf16-exp 2.6e-3, fp8-exp 3.5e-2), not a rounding
    error (~3e-7)."""
    from kinterval.ops import OperatorSpec, kinterval_attention

    errors = bench._Errors(True, "cpu", 64, 2, kinterval_attention, [])
    assert errors.torch_fp32(OperatorSpec.from_full_name(name), 32) < 1e-5


def _fake_timer(samples_ms):
    """A stand-in for the GPU timer hook (``_cuda_times(fn, n)``): runs nothing, returns n samples cycling
    through ``samples_ms``; records each n asked for."""
    asked = []

    def cuda_times(fn, n):
        asked.append(n)
        return [samples_ms[i % len(samples_ms)] for i in range(n)]

    return cuda_times, asked


def test_a_slow_call_gets_at_least_min_samples(bench, monkeypatch):
    """Triton's do_bench repeats max(1, rep / estimate) times: a 60 ms call was timed ONCE and reported as a
    median. The GPU bench takes at least --min-samples (10) timed calls whatever their length."""
    timer, asked = _fake_timer([60.0, 61.0, 59.0])
    monkeypatch.setattr(bench, "_cuda_times", timer)
    calls = []
    samples = bench._make_bench(True, bench.parse_args([]))(lambda: calls.append(1))
    assert len(samples) >= 10 and asked[-1] == len(samples)
    assert calls == [1]  # one untimed first call (compilation, autotuning) through the real function
    fast, _ = _fake_timer([0.5])
    monkeypatch.setattr(bench, "_cuda_times", fast)
    assert len(bench._make_bench(True, bench.parse_args([]))(lambda: None)) == 200  # rep 100 ms / 0.5 ms


def test_table_and_csv_give_spread_and_samples(bench, capsys, tmp_path, monkeypatch):
    """Each timed value comes with its interquartile range and its number of samples: "f+b IQR ms" and "n"
    in the table, q25 / q75 / n of every timing in the CSV. The GPU timer is a stand-in here."""
    import numpy as np

    cycle = [60.0, 62.0, 58.0, 61.0]
    timer, _ = _fake_timer(cycle)
    monkeypatch.setattr(bench, "_cuda_times", timer)
    real = bench._make_bench
    monkeypatch.setattr(bench, "_make_bench", lambda on_gpu, args: real(True, args))
    rows, _, data = run(bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", "tf32", "--no-flex")
    r = data[0]
    n = int(r["f+b n"])
    q25, q50, q75 = np.percentile([cycle[i % 4] for i in range(n)], [25, 50, 75])
    assert n >= 10 and rows[0]["n"] == str(n)
    assert rows[0]["f+b IQR ms"] == f"{bench._cell(q25)}–{bench._cell(q75)}"
    assert float(r["f+b ms"]) == pytest.approx(q50)
    assert float(r["f+b q25 ms"]) == pytest.approx(q25) and float(r["f+b q75 ms"]) == pytest.approx(q75)
    for timing in ("fwd", "ref eager"):
        assert int(r[f"{timing} n"]) >= 10 and float(r[f"{timing} q25 ms"]) <= float(r[f"{timing} ms"])
    assert float(r["x ref eager"]) == pytest.approx(1.0)


def test_tiles_are_those_of_the_timed_shape(bench, capsys, tmp_path, monkeypatch):
    """The tiles column reads the autotuner's last choice; it was read after the error columns had launched
    the kernel at the error shape. Here the error shape has 3 heads, the timed one 2."""
    import kinterval.ops.triton as kt

    shapes = []
    real_attention = kt.triton_attention

    def recording(q, *args, **kwargs):
        shapes.append(tuple(q.shape))
        return real_attention(q, *args, **kwargs)

    monkeypatch.setattr(kt, "triton_attention", recording)
    monkeypatch.setattr(bench, "_tiles", lambda: f"H={shapes[-1][1]}")
    monkeypatch.setattr(
        bench._Errors,
        "_inputs",
        lambda self, D, dtype: [torch.randn(1, 3, self.T, D).to(self.device, dtype) for _ in range(3)],
    )
    rows, _, _ = run(bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", "tf32", "--no-flex")
    assert rows[0]["H"] == "2" and rows[0]["tiles"] == "H=2"


def test_tiles_name_only_the_kernels_the_row_launched(bench, capsys, tmp_path):
    """--bwd split,fused: a fused-bwd row launches no dQ or dK/dV kernel and a split row no fused one, so
    their cells are "-", not the tile another row (another operator) left in the autotuner."""
    rows, _, _ = run(bench, capsys, tmp_path, "--ops", "softmax", "--dtypes", "bf16", "--bwd", "split,fused",
                     "--no-flex", "--err-t", "0")  # fmt: skip
    tiles = {r["operator"]: dict(t.split(" ") for t in r["tiles"].split(", ")) for r in rows}
    assert tiles["softmax"]["fused"] == "-" and tiles["softmax"]["dq"] != "-", tiles
    fused = tiles["softmax (fused bwd)"]
    assert fused["dq"] == fused["dkdv"] == "-" and fused["fused"] != "-" and fused["fwd"] != "-", tiles


def test_torch_same_precision_err(bench):
    """PyTorch's own error at the row's precision: SDPA flash on bf16 inputs for softmax, the reference on
    bf16-rounded inputs for the other operators; TF32 matmuls for tf32 (on a CPU there is no TF32: fp32's);
    fp32's for ieee and the split dots, which aim at fp32."""
    from kinterval.ops import OperatorSpec, kinterval_attention

    errors = bench._Errors(True, "cpu", 64, 2, kinterval_attention, [])
    for name in ("softmax", "lerp-k4", "bf16-exp"):
        spec = OperatorSpec.from_full_name(name)
        fp32 = errors.torch_fp32(spec, 32)
        bf16 = errors.torch_same(spec, "bf16", 32)
        assert 100 * fp32 < bf16 < 2e-2, name  # the bf16 output's rounding
        for mode in ("ieee", "tf32x3", "bf16x6"):
            assert errors.torch_same(spec, mode, 32) == fp32
        if not torch.cuda.is_available():
            assert errors.torch_same(spec, "tf32", 32) == pytest.approx(fp32, rel=0.5)


def test_the_table_has_the_same_precision_column(bench, capsys, tmp_path):
    """bf16 kernel rows are judged against PyTorch's own bf16 error: same order of magnitude, not 100x."""
    rows, _, data = run(bench, capsys, tmp_path, "--ops", "softmax,lerp-k4", "--dtypes", "bf16", "--no-flex")
    for r in data:
        err, same = float(r["err vs fp64"]), float(r["torch same-precision err"])
        assert 0 < same and err < 10 * same, r["operator"]


def test_outputs_start_with_versions_and_commit(bench, capsys, tmp_path):
    """Table (stdout) and CSV begin with '# ' lines: what measured them (benchmarks/provenance.py, tested in
    tests/test_benchmarks_scripts.py) and the command line, so that a table found later can be traced."""
    out_csv = tmp_path / "bench.csv"
    argv = ["--smoke", "--ops", "softmax", "--no-flex", "--err-t", "0", "--csv", str(out_csv)]
    assert bench.main(argv) == 0
    import provenance  # benchmarks/ is on sys.path once the script has written its header

    what = provenance.provenance(torch.device("cpu"), cpu="CPU (Triton interpreter: timings meaningless)")
    for text in (capsys.readouterr().out, out_csv.read_text()):
        first, second = text.splitlines()[:2]
        assert first == f"# kinterval triton attention benchmark; {what}", first
        assert second.startswith("# command benchmarks/attention.py --smoke"), second
