"""tau screen: the floor and zero tails on planted rows, each condition through its own operator, statistics
(per-condition contrasts against softmax, stage-3 CIs), per-block arrays on disk."""

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from kinterval.eval.attention import patched_attention
from kinterval.eval.tau_screen import (
    PAPER_STAGES,
    Stage,
    StageResult,
    contrasts,
    fwm_spec,
    key,
    load_per_block,
    probs_fn,
    run_stage,
    save_per_block,
    stage3_table,
    swapped_nll,
)
from kinterval.model import GPT, preset
from kinterval.ops import OperatorSpec
from kinterval.ops.reference import reference_probs
from kinterval.stats import block_bootstrap_ci
from kinterval.train.evaluate import token_nll

# the tests share module-scoped state: one pytest-xdist worker runs them in order
pytestmark = pytest.mark.xdist_group("tau_screen")

# rows of fp32 scores (max key first, then keys 9 and 20 nats below it): the audit's row with M = -5.0287,
# where (M - tau) - M rounds to just below -tau, and a row with positive M
PLANTED_ROWS = torch.tensor(
    [[-5.0286688804626465, -14.0286688804626465, -25.0286688804626465], [1.0, -8.0, -19.0]]
)


def floor_reference(s: torch.Tensor, valid: torch.Tensor, K: int, tau: float, recon: str) -> torch.Tensor:
    """The floor tail written out in float64 (App. C.3, z <- max(z, -tau); App. A grid):
    z~ = clip(z, -tau, 0), h = tau/K, r = min(floor((z~ + tau)/h), K - 1), t = (z~ + tau)/h - r; LERP
    interpolates e^{-tau + r h} and e^{-tau + (r + 1) h}, Nearest takes e^{-tau + (r + [t >= 1/2]) h};
    every valid key is kept."""
    s = s.double()
    M = s.masked_fill(~valid, -math.inf).amax(-1, keepdim=True)
    x = ((s - M).clamp(-tau, 0) + tau) / (tau / K)
    r = x.floor().clamp(max=K - 1)
    t = x - r
    h = tau / K
    if recon == "lerp":
        w = (1 - t) * torch.exp(-tau + r * h) + t * torch.exp(-tau + (r + 1) * h)
    else:
        w = torch.exp(-tau + (r + (t >= 0.5)) * h)
    w = torch.where(valid, w, 0.0)
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("recon", ["nearest", "lerp"])
def test_floor_tail_keeps_every_tail_key_at_e_minus_tau(recon):
    """The floor tail used to raise scores to M - tau and let FWM recompute z = s - M: in fp32 that lands
    just below -tau on some rows (here M = -5.0287) and FWM's strict zero tail then gave the floored keys
    0."""
    valid = torch.ones_like(PLANTED_ROWS, dtype=torch.bool)
    e = math.exp(-6.0)
    P = probs_fn(fwm_spec(4, 6.0, recon), "floor")(0, PLANTED_ROWS, valid, None, None)
    want = torch.tensor([1.0, e, e], dtype=torch.float64) / (1 + 2 * e)
    torch.testing.assert_close(P.double(), want.expand_as(P), rtol=1e-6, atol=0)
    # row maxima of either sign, every offset below the window edge: no tail key ever drops to 0
    M = torch.linspace(-40, 40, 20001)[:, None]
    s = torch.cat([M, M - 6.0 - torch.rand(20001, 5) * 20, M - torch.rand(20001, 5) * 6], 1)
    valid = torch.ones_like(s, dtype=torch.bool)
    P = probs_fn(fwm_spec(4, 6.0, recon), "floor")(0, s, valid, None, None)
    torch.testing.assert_close(P.double(), floor_reference(s, valid, 4, 6.0, recon), rtol=1e-5, atol=0)
    assert (P[:, 1:6] / P[:, :1]).sub(e).abs().max() < 1e-6 * e


@pytest.mark.parametrize("recon", ["nearest", "lerp"])
def test_zero_tail_gives_the_tail_zero_and_is_the_fwm_operator(recon):
    valid = torch.ones_like(PLANTED_ROWS, dtype=torch.bool)
    spec = fwm_spec(4, 6.0, recon)
    P = probs_fn(spec, "zero")(0, PLANTED_ROWS, valid, None, None)
    assert P[:, 1:].eq(0).all() and P[:, 0].eq(1).all()
    s = torch.randn(64, 32) * 5
    valid = torch.rand(64, 32) < 0.7
    valid[:, 0] = True
    P = probs_fn(spec, "zero")(0, s, valid, None, None)
    assert torch.equal(P, reference_probs(s, valid, spec))
    assert (P == 0).sum() > (~valid).sum()  # the zero tail is hit on these rows
    floor = probs_fn(spec, "floor")(0, s, valid, None, None)
    assert ((floor > 0) == valid).all()


def test_fwm_spec_carries_tau_and_reconstruction():
    assert fwm_spec(4, 8.0).full_name == OperatorSpec.parse("fwm-weight-k4", tau=8.0).full_name
    assert fwm_spec(16, 5.0, "lerp").full_name == OperatorSpec.parse("fwm-lerp-k16", tau=5.0).full_name


@pytest.fixture(scope="module")
def sharp_model():
    """A random tiny softmax model whose scores span tens of nats, row maxima of both signs (at T = 64 some
    rows with a negative maximum have a tail: the old floor tail zeroed it, 1e-4 off in NLL)."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=64)
    model = GPT(cfg, "softmax", "closed_form").eval()
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(12)
            blk.attn.c_attn.bias.normal_(0, 3.0)
    tokens = np.random.default_rng(1).integers(0, 64, size=4 * 64 + 1).astype(np.uint16)
    return model, tokens


def nll_with(model, tokens, fn, blocks=4):
    with patched_attention(model, fn):
        return token_nll(model, tokens, model.config.block_size, max_blocks=blocks).mean(1)


def test_every_screen_condition_runs_its_own_operator(sharp_model):
    """Each condition's per-block NLL is the model's under that condition's probabilities (the floor tail as
    written out in float64; FWM and MinMax as operators), not softmax's; the NLL moves with tau."""
    model, tokens = sharp_model
    floor = run_stage(model, tokens, Stage("2a", "floor", (4,), (4.0, 8.0), 4))
    zero = run_stage(model, tokens, Stage("3", "zero", (4,), (4.0, 8.0), 4, minmax=True))

    def floor_fn(tau, recon="nearest"):
        return lambda i, s, v, q, k: floor_reference(s, v, 4, tau, recon).float()

    def op_fn(name, **kw):
        spec = OperatorSpec.parse(name, **kw)
        return lambda i, s, v, q, k: reference_probs(s, v, spec)

    for tau in (4.0, 8.0):
        want = nll_with(model, tokens, floor_fn(tau))
        np.testing.assert_allclose(floor.per_block[key(4, tau)], want, rtol=1e-6)
        want = nll_with(model, tokens, op_fn("fwm-weight-k4", tau=tau))
        np.testing.assert_allclose(zero.per_block[key(4, tau)], want, rtol=1e-6)
    mm = nll_with(model, tokens, op_fn("minmax-weight-k4"))
    soft = nll_with(model, tokens, op_fn("softmax"))
    np.testing.assert_allclose(floor.per_block["softmax"], soft, rtol=1e-6)
    np.testing.assert_allclose(zero.per_block[key(4, "minmax")], mm, rtol=1e-6)
    differ = lambda a, b: np.abs(a - b).max() > 1e-4  # noqa: E731  (a random model's NLL moves little)
    for res in (floor, zero):
        assert all(differ(nll, soft) for name, nll in res.per_block.items() if name != "softmax")
        assert differ(res.per_block[key(4, 4.0)], res.per_block[key(4, 8.0)])
    assert differ(floor.per_block[key(4, 4.0)], zero.per_block[key(4, 4.0)])
    lerp = swapped_nll(model, tokens, fwm_spec(4, 4.0, "lerp"), tail="floor", blocks=4)
    want = nll_with(model, tokens, floor_fn(4.0, "lerp"))
    np.testing.assert_allclose(lerp, want, rtol=1e-6)


PLANTED = {
    (4, 5.0): 0.05,
    (4, 6.0): 0.02,
    (8, 5.0): 0.01,
    (8, 6.0): -0.004,
    (4, "minmax"): 1.0,
    (8, "minmax"): 0.5,
}


def planted_stage(blocks=120, planted=None):
    """A stage-3 result whose conditions differ from softmax by ``planted`` (default PLANTED) per block (plus
    small noise)."""
    rng = np.random.default_rng(0)
    res = StageResult(Stage("3", "zero", (4, 8), (5.0, 6.0), None, minmax=True))
    soft = rng.normal(4.3, 0.2, blocks)  # block-to-block spread shared by every condition (paired away)
    res.per_block["softmax"] = soft
    for (K, tau), delta in (planted or PLANTED).items():
        res.per_block[key(K, tau)] = soft + delta + rng.normal(0, 0.002, blocks)
    res.nll.update({name: float(v.mean()) for name, v in res.per_block.items()})
    return res


def test_lerp_screen_uses_lerp_for_fwm_and_its_minmax_reference(sharp_model):
    """reconstruction="lerp": the FWM conditions are fwm-lerp and the MinMax reference is LERP (lerp-k4), not
    the Nearest operators."""
    model, tokens = sharp_model
    res = run_stage(model, tokens, Stage("3", "zero", (4,), (6.0,), 1, minmax=True), reconstruction="lerp")
    for name, op, kw in ((key(4, "minmax"), "lerp-k4", {}), (key(4, 6.0), "fwm-lerp-k4", {"tau": 6.0})):
        spec = OperatorSpec.parse(op, **kw)
        want = nll_with(model, tokens, lambda i, s, v, q, k, spec=spec: reference_probs(s, v, spec), blocks=1)
        np.testing.assert_allclose(res.per_block[name], want, rtol=1e-6)


def test_every_condition_gets_a_ci_against_softmax():
    rows = contrasts(planted_stage(), n_resamples=500)
    assert len(rows) == len(PLANTED)
    for r in rows:
        planted = PLANTED[(r["K"], r["tau"])]
        assert (
            r["lo"] < planted < r["hi"]
            and r["hi"] - r["lo"] < 0.005
            and (r["n_blocks"], r["block"]) == (120, 16)
        )
    res = planted_stage()
    res.per_block.pop("softmax")
    with pytest.raises(ValueError, match="no softmax reference"):
        contrasts(res)


def test_a_short_stage_gets_a_ci_of_half_its_length_blocks():
    """A stage of 10 blocks: block 5 (stats.block_length), not the whole series, whose every circular resample
    is a rotation with the same mean (the old CI had zero width)."""
    rows = contrasts(planted_stage(blocks=10), n_resamples=500)
    for r in rows:
        assert r["hi"] - r["lo"] > 1e-4 and r["lo"] < r["delta"] < r["hi"], r


def test_contrast_ci_uses_the_block_length_it_reports():
    """A 120-block stage: the CI is the circular block bootstrap with block 16 (stats.block_length), the
    length the row reports, not the iid bootstrap (block 1)."""
    res = planted_stage()
    for r in contrasts(res, n_resamples=300):
        d = res.per_block[r["condition"]] - res.per_block["softmax"]
        want = block_bootstrap_ci(d, block=16, n_resamples=300)
        iid = block_bootstrap_ci(d, block=1, n_resamples=300)
        assert r["block"] == 16 and (r["lo"], r["hi"]) == (want.lo, want.hi) != (iid.lo, iid.hi)


def test_stage3_table_gives_each_tau_minus_softmax():
    res = planted_stage()
    md, rows = stage3_table(res, n_resamples=500)
    assert res.global_tau() == 6.0 and [r["tau_star"] for r in rows] == [6.0, 6.0]
    for r in rows:
        assert set(r["tau_ci"]) == {5.0, 6.0}
        for tau, c in r["tau_ci"].items():
            assert c["lo"] < PLANTED[(r["K"], tau)] < c["hi"]
        assert r["minmax_ci"]["lo"] < PLANTED[(r["K"], "minmax")] < r["minmax_ci"]["hi"]
        assert (r["delta"], r["lo"], r["hi"]) == tuple(r["tau_ci"][6.0][k] for k in ("delta", "lo", "hi"))
    assert "tau=5 - softmax" in md and len(re.findall(r"\[[+-]", md)) == 2 * (1 + 3)  # tau*; MinMax, 2 taus
    tex, _ = stage3_table(res, n_resamples=500, fmt="tex")
    assert tex.count("\\begin{tabular}") == 2


def test_stage3_table_gives_a_difference_below_the_fourth_decimal_in_two_significant_digits():
    """stage3.md printed a K = 16 condition 3e-05 above softmax on every block as "+0.0000 [+0.0000, +0.0000]"
    (and "-0.0000" below it), as if it equalled softmax; the report's tables print +3.0e-05."""
    soft = np.random.default_rng(0).normal(4.3, 0.2, 40)
    res = StageResult(Stage("3", "zero", (16,), (5.0, 6.0), None, minmax=True))
    offsets = {key(16, 5.0): 3e-05, key(16, 6.0): -2e-05, key(16, "minmax"): 0.0123}
    res.per_block = {"softmax": soft, **{name: soft + d for name, d in offsets.items()}}
    res.nll = {name: float(v.mean()) for name, v in res.per_block.items()}
    md, _ = stage3_table(res, n_resamples=200)
    assert "-0.0000" not in md and "+0.0000" not in md
    assert "+3.0e-05 [+3.0e-05, +3.0e-05]" in md and "-2.0e-05 [-2.0e-05, -2.0e-05]" in md
    assert "+0.0123 [+0.0123, +0.0123]" in md


def test_per_block_arrays_round_trip(tmp_path):
    res = planted_stage(blocks=7)
    path = save_per_block(res, tmp_path / "stage3.npz")
    back = load_per_block(path)
    assert set(back) == set(res.per_block)
    for name, arr in res.per_block.items():
        np.testing.assert_array_equal(back[name], arr)


def test_best_tau_per_k_and_global_tau_over_every_k():
    """best_tau(K) is the tau of the lowest NLL at that K; tau* the lowest NLL averaged over all K (here the
    first K alone would pick 5, and the worst tau of each K is 7)."""
    res = StageResult(Stage("3", "zero", (4, 8), (5.0, 6.0, 7.0), None))
    nll = {(4, 5.0): 3.0, (4, 6.0): 3.2, (4, 7.0): 3.4, (8, 5.0): 3.9, (8, 6.0): 3.05, (8, 7.0): 3.95}
    res.nll.update({key(K, t): v for (K, t), v in nll.items()})
    # means over K: tau=5 3.45, tau=6 3.125, tau=7 3.675
    assert (res.best_tau(4), res.best_tau(8), res.global_tau()) == (5.0, 6.0, 6.0)
    # tau* can be no K's own best: K=4 picks 5, K=8 picks 7, the mean over K picks 6 (5.0, 1.0, 5.0)
    nll = {(4, 5.0): 0.0, (4, 6.0): 1.0, (4, 7.0): 10.0, (8, 5.0): 10.0, (8, 6.0): 1.0, (8, 7.0): 0.0}
    res.nll.update({key(K, t): v for (K, t), v in nll.items()})
    assert (res.best_tau(4), res.best_tau(8), res.global_tau()) == (5.0, 7.0, 6.0)


def test_paper_stages_are_app_c3s():
    """App. C.3: (1) floor, 32 blocks, K 4/16/32, tau 8..32; (2a) floor and (2b) zero, tau 4..12; (3) zero,
    every block, K 4/8/16/32, tau 5/6/7, with MinMax at the same K."""
    s = {st.name: st for st in PAPER_STAGES}
    assert list(s) == ["1", "2a", "2b", "3"]
    assert (s["1"].tail, s["1"].K, s["1"].taus, s["1"].blocks) == (
        "floor",
        (4, 16, 32),
        (8, 12, 16, 20, 24, 32),
        32,
    )
    for name, tail in (("2a", "floor"), ("2b", "zero")):
        assert (s[name].tail, s[name].K, s[name].taus) == (tail, (4, 16, 32), (4, 5, 6, 7, 8, 10, 12))
    assert (s["3"].tail, s["3"].K, s["3"].taus, s["3"].blocks, s["3"].minmax) == (
        "zero",
        (4, 8, 16, 32),
        (5, 6, 7),
        None,
        True,
    )


def test_screen_numerics_are_the_models_device_and_numerics(sharp_model):
    from kinterval.eval.evaluate import applied_numerics
    from kinterval.eval.tau_screen import screen_numerics

    model, _ = sharp_model
    want = applied_numerics(model.config.numerics, torch.device("cpu"))
    assert screen_numerics(model) == {"device": "cpu", **want}
    assert (want["device_type"], want["autocast"], want["attention_dtype"], want["tf32"]) == (
        "cpu",
        "none",
        "float32",
        False,
    )


def test_tau_screen_stage_records_carry_the_numerics(tmp_path, softmax_run):
    """stage*.json recorded the checkpoint, grid and NLLs but not the device or numerics the screen ran
    under (bf16 autocast outside attention on CUDA, none on the CPU); an evaluation summary records them."""
    import json

    from kinterval.cli import main
    from kinterval.data.prepare import prepare
    from kinterval.data.synthetic import VOCAB_SIZE
    from kinterval.eval.evaluate import applied_numerics

    prepare("synthetic", tmp_path / "data", tokens=8_000, seed=0, progress=False)
    cfg = softmax_run(VOCAB_SIZE)
    argv = ["tau-screen", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--out",
            str(tmp_path / "ts"), "--stages", "2b", "--K", "4", "--taus", "6", "--subset-blocks", "2",
            "--resamples", "20"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((tmp_path / "ts" / "stage2b.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    want = applied_numerics(cfg.numerics, device)
    assert {k: record[k] for k in ["device", *want]} == {"device": str(device), **want}


def _screen_run(tmp_path, softmax_run):
    """A prepared data folder and a one-checkpoint softmax run; the argv prefix of a tau screen of it."""
    from kinterval.data.prepare import prepare
    from kinterval.data.synthetic import VOCAB_SIZE

    prepare("synthetic", tmp_path / "data", tokens=8_000, seed=0, progress=False)
    softmax_run(VOCAB_SIZE)
    return ["tau-screen", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--out",
            str(tmp_path / "ts"), "--device", "cpu", "--K", "4", "--subset-blocks", "2", "--max-blocks", "2",
            "--resamples", "20"]  # fmt: skip


def test_a_stage_cut_short_leaves_no_record_of_another_grid(tmp_path, monkeypatch, softmax_run):
    """A rerun of a stage wrote stageN.npz first and stageN.json only after the bootstrap: cut short in
    between, the previous run's stageN.json (another tau grid) described the new arrays. The old record and
    tables now go first and the record, written last, holds the arrays' sha256."""
    import json

    from kinterval import atomic
    from kinterval.cli import main

    argv = _screen_run(tmp_path, softmax_run)
    out = tmp_path / "ts"
    assert main([*argv, "--stages", "1,3", "--taus", "8"]) == 0
    record = json.loads((out / "stage1.json").read_text())
    assert {p.name for p in out.iterdir()} == {f"stage{s}.{e}" for s in "13" for e in ("json", "npz")} | {
        "stage3.md",
        "stage3.tex",
    }

    def broken(*args, **kwargs):
        raise RuntimeError("bootstrap cut short")

    monkeypatch.setattr("kinterval.eval.tau_screen.contrasts", broken)
    for stage in ("1", "3"):
        with pytest.raises(RuntimeError, match="cut short"):
            main([*argv, "--stages", stage, "--taus", "12", "--force"])
        with np.load(out / f"stage{stage}.npz") as z:
            assert "K=4 tau=12" in z.files and "K=4 tau=8" not in z.files  # the new grid's arrays
        assert not (out / f"stage{stage}.json").exists()  # and no record of the old grid beside them
    assert not (out / "stage3.md").exists() and not (out / "stage3.tex").exists()
    assert sorted(p.name for p in out.iterdir()) == ["stage1.npz", "stage3.npz"]  # no temporary files
    assert record["per_block_sha256"] != atomic.sha256_file(out / "stage1.npz")  # the first run's record
    monkeypatch.undo()
    assert main([*argv, "--stages", "1", "--taus", "12"]) == 0
    record = json.loads((out / "stage1.json").read_text())
    assert record["per_block_sha256"] == atomic.sha256_file(out / "stage1.npz") and record["taus"] == [12.0]


def test_per_block_arrays_are_replaced_atomically(tmp_path, monkeypatch):
    """np.savez wrote straight to the final path: a write cut short left a torn archive in place of the
    previous stage's arrays. Now the old file stays until the new one is complete; no ``.npz`` is appended."""
    from kinterval.eval import tau_screen

    path = save_per_block(planted_stage(blocks=3), tmp_path / "stage1.npz")
    before = path.read_bytes()

    def torn(file, **arrays):  # a file name (the old call) or an open file: half an archive, then a failure
        if hasattr(file, "write"):
            file.write(b"PK\x03\x04 torn")
        else:
            Path(file).write_bytes(b"PK\x03\x04 torn")
        raise OSError("disk full")

    monkeypatch.setattr(tau_screen.np, "savez", torn)
    with pytest.raises(OSError, match="disk full"):
        save_per_block(planted_stage(blocks=5), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["stage1.npz"]
    monkeypatch.undo()
    assert save_per_block(planted_stage(blocks=5), tmp_path / "no_suffix").name == "no_suffix"
    assert load_per_block(tmp_path / "no_suffix")["softmax"].size == 5


@pytest.mark.parametrize("flag", ["--subset-blocks", "--max-blocks"])
def test_a_one_block_stage_is_refused_before_it_is_computed(tmp_path, capsys, monkeypatch, flag, softmax_run):
    """``--subset-blocks 1`` (``--max-blocks 1``) computed the whole stage and then failed in the block
    bootstrap ("a series of at least 2 values"), naming no flag. The flag is now checked up front."""
    from kinterval.cli import main
    from kinterval.eval import tau_screen

    argv = _screen_run(tmp_path, softmax_run)
    argv[argv.index(flag) + 1] = "1"
    monkeypatch.setattr(tau_screen, "run_stage", lambda *a, **k: pytest.fail("the stage ran"))
    assert main([*argv, "--stages", "1,3", "--taus", "8"]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "ts").exists()


def test_a_split_of_one_block_is_refused_before_a_stage_is_computed(
    tmp_path, capsys, monkeypatch, softmax_run
):
    from kinterval.cli import main
    from kinterval.data import loader
    from kinterval.eval import tau_screen

    argv = _screen_run(tmp_path, softmax_run)
    monkeypatch.setattr(loader.TokenShards, "tokens", lambda self: np.zeros(50, np.uint16))  # one block of 33
    argv[argv.index("--max-blocks") : argv.index("--max-blocks") + 2] = []
    monkeypatch.setattr(tau_screen, "run_stage", lambda *a, **k: pytest.fail("the stage ran"))
    assert main([*argv, "--stages", "3", "--taus", "8"]) == 2
    assert "fewer than 2 blocks" in capsys.readouterr().err and not (tmp_path / "ts").exists()


def test_a_stage_screened_with_other_options_is_not_replaced_silently(tmp_path, softmax_run, capsys):
    """A rerun with another tau grid (or reconstruction, checkpoint, data, blocks) replaced the stage's record
    and arrays without a word; it is refused, before the model loads, unless --force. The same options rerun
    as before, and a LERP screen goes to its own folder by default."""
    import json

    from kinterval.cli import main

    argv = _screen_run(tmp_path, softmax_run)
    out = tmp_path / "ts"
    assert main([*argv, "--stages", "1", "--taus", "8"]) == 0
    first = (out / "stage1.npz").read_bytes()
    assert main([*argv, "--stages", "1", "--taus", "8"]) == 0  # the same screen again
    capsys.readouterr()
    for flags, named in ((["--taus", "12"], "taus [8.0] -> [12.0]"),
                         (["--taus", "8", "--reconstruction", "lerp"], "reconstruction 'nearest' -> 'lerp'"),
                         (["--taus", "8", "--subset-blocks", "3"], "blocks 2 -> 3")):  # fmt: skip
        assert main([*argv, "--stages", "1", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(
            f"kinterval tau-screen: error: {out / 'stage1.json'} was screened with other options"
        )
        assert named in err and "pass --force to replace it" in err and "\n" not in err
        assert (out / "stage1.npz").read_bytes() == first  # nothing was replaced
    assert main([*argv, "--stages", "1", "--taus", "12", "--force"]) == 0
    record = json.loads((out / "stage1.json").read_text())
    assert record["taus"] == [12.0] and record["split"] == "val" and len(record["shards_sha256"]) >= 1

    run_default = [a for a in argv if a not in ("--out", str(out))]  # the run's own diagnostics folder
    assert main([*run_default, "--stages", "1", "--taus", "8"]) == 0
    assert main([*run_default, "--stages", "1", "--taus", "8", "--reconstruction", "lerp"]) == 0
    diag = tmp_path / "run" / "diagnostics"
    nearest = json.loads((diag / "tau_screen" / "stage1.json").read_text())
    lerp = json.loads((diag / "tau_screen__lerp" / "stage1.json").read_text())
    assert (nearest["reconstruction"], lerp["reconstruction"]) == ("nearest", "lerp")
    # --run given as the checkpoint folder: the run's diagnostics folder too, not one inside the checkpoint
    (ck,) = (tmp_path / "run" / "checkpoints").glob("step_*")
    shutil.rmtree(diag / "tau_screen")
    at_ck = [str(ck) if a == str(tmp_path / "run") else a for a in run_default]
    assert main([*at_ck, "--stages", "1", "--taus", "8"]) == 0
    assert (diag / "tau_screen" / "stage1.json").is_file() and not (ck / "diagnostics").exists()


def test_stage3_rows_give_tau_star_where_a_k_prefers_another_tau():
    """Each row's delta [CI] is tau* - softmax also at a K whose own best tau is another (K=4: best 5, tau*
    6 over K); the MinMax column is that K's MinMax NLL, the tau columns its NLLs, the bold cell its best."""
    planted = {(4, 5.0): 0.01, (4, 6.0): 0.02, (8, 5.0): 0.05, (8, 6.0): -0.004, (4, "minmax"): 1.0,
               (8, "minmax"): 0.5}  # fmt: skip
    res = planted_stage(planted=planted)
    assert (res.best_tau(4), res.best_tau(8), res.global_tau()) == (5.0, 6.0, 6.0)
    md, rows = stage3_table(res, n_resamples=300)
    for r in rows:
        K = r["K"]
        assert r["tau_star"] == 6.0 and r["best_tau"] == res.best_tau(K)
        assert r["delta"] == pytest.approx(planted[(K, 6.0)], abs=2e-3)
        assert r["lo"] < planted[(K, 6.0)] < r["hi"]
        assert r["minmax"] == res.nll[key(K, "minmax")]
        assert r["tau"] == {t: res.nll[key(K, t)] for t in (5.0, 6.0)}
    line = {int(x.split("|")[1]): x for x in md.splitlines() if re.match(r"\| \d+ \| \d", x)}
    for K, best in ((4, 5.0), (8, 6.0)):
        assert line[K].count("**") == 2 and f"**{res.nll[key(K, best)]:.4f}**" in line[K]
        assert f"| {res.nll[key(K, 'minmax')]:.4f} |" in line[K]


def test_a_stage_runs_each_k_tau_condition_its_minmax_and_the_softmax_reference(monkeypatch):
    """The conditions of a stage by the operator each swaps in: every K x tau FWM with the stage's tail,
    MinMax at each K (zero tail) and softmax, the reference of every contrast (a bf16-exp or other baseline
    in its place moves a random model's NLL by about 1e-6 only), each on the stage's blocks; a condition's
    NLL is the mean of its per-block NLL."""
    from kinterval.eval import tau_screen

    calls = []

    def fake_nll(model, tokens, spec, *, tail="zero", blocks=None):
        calls.append((spec.full_name, tail, blocks))
        return np.array([0.0, 0.0, 3.0 * len(calls)])  # its call number in the last block; median 0

    monkeypatch.setattr(tau_screen, "swapped_nll", fake_nll)
    for stage in (
        Stage("3", "zero", (4, 8), (5.0, 6.0), 3, minmax=True),
        Stage("2a", "floor", (4,), (7.0,), None),
    ):
        res = run_stage(None, None, stage)
        want = {
            key(K, t): (fwm_spec(K, t).full_name, stage.tail, stage.blocks)
            for K in stage.K
            for t in stage.taus
        }
        if stage.minmax:
            want.update({key(K, "minmax"): (f"minmax-weight-k{K}", "zero", stage.blocks) for K in stage.K})
        want["softmax"] = ("softmax", "zero", stage.blocks)
        assert {name: calls[int(v[-1]) // 3 - 1] for name, v in res.per_block.items()} == want
        assert res.nll == {name: float(v.mean()) for name, v in res.per_block.items()}
        calls.clear()


def test_taus_that_agree_to_six_digits_are_two_conditions():
    """The condition key was f"{tau:g}", so --taus 1,1.0000001 screened two taus and kept one result (the
    second overwrote the first under "K=4 tau=1")."""
    from kinterval.eval.tau_screen import key, tau_text

    assert key(4, 1.0) != key(4, 1.0000001)
    assert (tau_text(6.0), tau_text(2.5), tau_text(1.0000001), tau_text(1e-7)) == (
        "6",
        "2.5",
        "1.0000001",
        "1e-07",
    )


@pytest.mark.parametrize("flag,values", [("--taus", ["6", "6"]), ("--K", ["4", "4"])])
def test_a_k_or_tau_named_twice_is_refused_before_anything_runs(
    tmp_path, capsys, monkeypatch, flag, values, softmax_run
):
    """--taus 6,6 screened every condition twice and wrote a table of 5 heads over rows of 4 cells."""
    from kinterval.cli import main
    from kinterval.eval import tau_screen

    monkeypatch.setattr(tau_screen, "run_stage", lambda *a, **k: pytest.fail("the stage ran"))
    assert main([*_screen_run(tmp_path, softmax_run), "--stages", "3", flag, *values]) == 2
    assert f"{flag} names a value twice" in capsys.readouterr().err
    assert not (tmp_path / "ts").exists()


def test_the_tau_star_head_names_tau_star_to_the_digit():
    """The condition keys and tau heads tell 1 from 1.0000001 (tau_text); the tau* head must too."""
    soft = np.random.default_rng(1).normal(4.3, 0.2, 40)
    res = StageResult(Stage("3", "close", (4,), (1.0, 1.0000001), None, minmax=False))
    offsets = {key(4, 1.0): 0.01, key(4, 1.0000001): -0.01}  # the second is best: tau* = 1.0000001
    res.per_block = {"softmax": soft, **{name: soft + d for name, d in offsets.items()}}
    res.nll = {name: float(v.mean()) for name, v in res.per_block.items()}
    md, rows = stage3_table(res, n_resamples=100)
    assert rows[0]["tau_star"] == 1.0000001
    assert "tau*=1.0000001 - softmax" in md and "| tau=1 |" in md
