# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of the fused Triton kernels (``ops/triton/kernels.py``) and their autograd
wrapper (``ops/triton/autograd.py``), run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
tests/conftest.py and by the test modules).

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
tests with ``-x -q`` and records killed (a test failed), survived, or timeout (``$MUT_TIMEOUT`` seconds,
300 by default; counted as killed); the file is restored byte for byte, also on an exception or a timeout.
The test runs write no bytecode (a mutant of the same length written within the same second as the clean
file could otherwise leave a stale .pyc behind). tests/ops/test_kernel_compile.py (sm_90a compilation) is
never run: a behaviour mutant counts as killed only by a behavioural test. Run from the repository root (or
a copy of it) with its ``src`` first on PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-kernels-2026-12-04/mut_kernels.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name);
mutants already there are skipped. ``$MUT_WIDE=1`` runs every mutant on its wide test set (the survivors'
rerun); ``$MUT_TESTS``: pytest arguments that replace the table's (to check a new test on its
mutant). ``$MUT_CHECK=1`` only checks that each old string occurs once. Touch ``STOP`` beside the script to
stop between mutants.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
OUT = Path(__file__).parent / os.environ.get("MUT_OUT", "mutants.jsonl")
STOP = Path(__file__).with_name("STOP")
TIMEOUT = float(os.environ.get("MUT_TIMEOUT", "300"))
WIDE = os.environ.get("MUT_WIDE") == "1"
TESTS = os.environ.get("MUT_TESTS", "").split()  # pytest arguments instead of the table's (a new test)

KE, AG = "src/kinterval/ops/triton/kernels.py", "src/kinterval/ops/triton/autograd.py"
TT, TR = "tests/ops/test_triton.py", "tests/ops/test_triton_review_mods.py"
TB = "tests/ops/test_triton_boundaries.py"  # added by this audit (round 2 and the survivors' rerun)
# the wide set a survivor is rerun on (every interpreter test of the kernels; this audit's new tests first)
W_ALL = [TB, TT, TR, "tests/ops/test_edge_cases.py", "tests/ops/test_sdpa_dropin.py", "tests/ops/test_attention.py",
         "tests/ops/test_score_mods.py", "tests/ops/test_backends.py"]  # fmt: skip


def k(expr: str, *extra: str) -> list[str]:
    """test_triton.py's tests selected by ``expr`` (pytest -k), plus files ``extra``."""
    return [TT, *extra, "-k", expr]


OPS = "test_operator_causal or test_shapes_and_masks"
HIST = "test_historical"
DEG = "test_degenerate"
FUSED = "test_fused or test_grouped_query or test_softcap_fused"
SINKS = "sink"
BIAS = "bias"
SOFTCAP = "softcap"
LOWP = "test_low_precision or test_unsplit or test_interpreter_production or test_fused_backward_low"

# fmt: off
MUTANTS = [
    # ------------------------------------------------------------ kernels.py: masks, tiles, row extrema
    ("k-causal-lt", KE, "valid = valid & (offs_n[None, :] <= offs_m[:, None] + (Tk - Tq))", "valid = valid & (offs_n[None, :] < offs_m[:, None] + (Tk - Tq))", k(OPS)),
    ("k-fwd-causal-hi-short", KE, "hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq)\n\n    M = tl.full", "hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq - 1)\n\n    M = tl.full", k(OPS)),
    ("k-dq-causal-hi-short", KE, "hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq)\n    # eq. (2)'s self", "hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + Tk - Tq - 1)\n    # eq. (2)'s self", k(OPS)),
    ("k-dkdv-causal-lo-up", KE, "lo = (lo // BLOCK_M) * BLOCK_M", "lo = ((lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M", k(OPS)),
    ("k-mask-strides-swapped", KE, "mask_base + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn", "mask_base + offs_m[:, None] * stride_mn + offs_n[None, :] * stride_mm", k(OPS)),
    ("k-full-key-end-plus-one", KE, "end = tl.maximum(tl.minimum(Tk, pid_m * BLOCK_M + Tk - Tq + 1), 0)", "end = tl.maximum(tl.minimum(Tk, pid_m * BLOCK_M + Tk - Tq + 2), 0)", k(LOWP)),
    ("k-full-query-first-minus-one", KE, "first = tl.maximum(key_end - 1 - (Tk - Tq), 0)", "first = tl.maximum(key_end - 2 - (Tk - Tq), 0)", k(LOWP)),
    ("k-full-query-last-partial-block", KE, "full_hi = tl.maximum((Tq // BLOCK_M) * BLOCK_M, full_lo)", "full_hi = tl.maximum(((Tq + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, full_lo)", k(LOWP)),
    ("k-extrema-tie-last", KE, "upd = bmax > M  # strict", "upd = bmax >= M  # strict", k("test_tie or " + OPS)),
    ("k-extrema-min-update-flipped", KE, "upd_lo = bmin < m\n        amin = tl.where(upd_lo, imin, amin)", "upd_lo = bmin > m\n        amin = tl.where(upd_lo, imin, amin)", k(OPS)),
    ("k-sink-tie-ge", KE, "amax = tl.where(s_hi > M, Tk, amax)", "amax = tl.where(s_hi >= M, Tk, amax)", k(SINKS)),
    ("k-gqa-fwd-head-tiled", KE, "hk = hd // G  # its k/v head\n    keys = (", "hk = hd % (H // G)  # its k/v head\n    keys = (", k(FUSED)),
    ("k-gqa-dkdv-head-tiled", KE, "hk = hd // G  # this program's k/v head", "hk = hd % (H // G)  # this program's k/v head", k(FUSED)),
    # ------------------------------------------------------------ kernels.py: grid, weights (§3, App. A)
    ("k-nearest-midpoint-gt", KE, "return tl.where(t >= 0.5, E_r1, E_r)", "return tl.where(t > 0.5, E_r1, E_r)", k("test_nearest_midpoint or test_grid or " + OPS)),
    ("k-strict-PN-midpoint-gt", KE, "w = _place(E_r1, keep) * tl.where(t >= 0.5, inv_Wf[:, None]", "w = _place(E_r1, keep) * tl.where(t > 0.5, inv_Wf[:, None]", k("test_nearest_midpoint or test_grid or " + OPS)),
    ("k-grid-index-off-by-one", KE, "E_r1 = tl.exp2((r + (1.0 - kf)) * h_log2[:, None])", "E_r1 = tl.exp2((r + (2.0 - kf)) * h_log2[:, None])", k(OPS)),
    ("k-lerp-t-swapped", KE, "return (1.0 - t) * E_r + t * E_r1", "return t * E_r + (1.0 - t) * E_r1", k(OPS)),
    ("k-argmax-pin-dropped", KE, "x = tl.where(is_max, kf, x)  # after", "x = x  # after", k(OPS + " or test_range_grad or test_wide")),
    ("k-fwm-tail-kept", KE, "keep = valid & (z >= -tau)", "keep = valid", k(OPS)),
    ("k-fwm-tail-boundary-gt", KE, "keep = valid & (z >= -tau)", "keep = valid & (z > -tau)", k(OPS + " or test_grid or test_a_tau")),
    ("k-resolved-nan-clamp-dropped", KE, "r = tl.minimum(r, kf - 1.0, propagate_nan=tl.PropagateNan.ALL)", "r = tl.minimum(r, kf - 1.0)", k("non_finite or test_wide or " + OPS)),
    ("k-dfac-series-dropped", KE, "dfac = tl.where(degen, 0.0, tl.where(h < 0.25, series, (1.0 - emh) * inv_h))", "dfac = tl.where(degen, 0.0, (1.0 - emh) * inv_h)", k("test_large_k or " + OPS)),
    ("k-degen-eps-zero", KE, "degen = span <= EPS_DEGENERATE", "degen = span <= 0.0", k(DEG)),
    ("k-degen-emh-kept", KE, "emh = tl.where(degen, 1.0, emh)", "emh = emh", k(DEG)),
    ("k-degen-dq-gamma-kept", KE, "inv_Wa = tl.where((Wa > 0) & (~degen), 1.0 / Wa, 0.0)", "inv_Wa = tl.where(Wa > 0, 1.0 / Wa, 0.0)", k(DEG)),
    ("k-degen-fused-gamma-kept", KE, "inv_Wa = tl.where((Wa > 0) & (~row[5]), 1.0 / Wa, 0.0)", "inv_Wa = tl.where(Wa > 0, 1.0 / Wa, 0.0)", k(DEG + " or " + FUSED)),
    # ------------------------------------------------------------ kernels.py: softmax, forward sums
    ("k-softmax-alpha-inverted", KE, "alpha = tl.exp2(off - off_ref)  # 1 if M did not grow", "alpha = tl.exp2(off_ref - off)  # 1 if M did not grow", k("test_softmax or " + OPS)),
    ("k-softmax-acc-not-rescaled", KE, "acc = acc * alpha[:, None] + _dot(_cast(w, v.dtype), v, PREC)", "acc = acc + _dot(_cast(w, v.dtype), v, PREC)", k("test_softmax or " + OPS)),
    ("k-softmax-log2e-dropped-in-offset", KE, "off_new = (Mq * scale) * LOG2E  # RN", "off_new = Mq * scale  # RN", k("test_softmax or " + OPS)),
    ("k-sink-softmax-acc-not-rescaled", KE, "return M, W * alpha + tl.sum(w, 1), acc * alpha[:, None]", "return M, W * alpha + tl.sum(w, 1), acc", k(SINKS)),
    ("k-empty-row-div", KE, "o = acc * tl.where(W > 0, 1.0 / W, 0.0)[:, None]  # fully masked row: O = 0", "o = acc / W[:, None]  # fully masked row: O = 0", k(OPS)),
    ("k-nan-row-dropped", KE, "o = tl.where(bad[:, None], float(\"nan\"), o)", "o = o", k("non_finite")),
    ("k-weight-ste-historical-is-strict", KE, "        return wL + (wN - wL)\n", "        return wN\n", k(HIST)),
    ("k-prob-ste-historical-is-PH", KE, "return PL + (PH - PL)", "return PH", k(HIST)),
    ("k-pass3-WL-WH-swapped", KE, "w = prob_ste(wLp, w, WL, W)", "w = prob_ste(wLp, w, W, WL)", k(HIST)),
    ("k-pass2-acc-also-historical-prob", KE, "if not (JACOBIAN_AT_PL and HISTORICAL):\n            acc +=", "if True:\n            acc +=", k(HIST)),
    ("k-OL-from-forward-weight", KE, "accL += _dot(_cast(wLp, v.dtype), v, PREC)", "accL += _dot(_cast(w, v.dtype), v, PREC)", k(OPS)),
    ("k-Wat-is-W-for-prob", KE, "            tl.store(Wat + row_i, WL, mask=rmask)", "            tl.store(Wat + row_i, W, mask=rmask)", k(OPS)),
    ("k-sink-WL-dropped", KE, "            WL += tl.sum(_place(wL, keep), 1)\n    W += tl.sum(w, 1)", "            pass\n    W += tl.sum(w, 1)", k(SINKS)),
    ("k-softcap-bias-order", KE, "        s, th = _softcapped(qk, scales)\n        s = s + bias", "        s, th = _softcapped(qk + bias / scale, scales)", k(BIAS)),
    # ------------------------------------------------------------ kernels.py: backward (eq. 1, 2, 5 / App. B)
    ("k-eq1-short-sign", KE, "return -(E_r1 * ((dfac * inv_k)[:, None] * x + y))", "return -(E_r1 * ((dfac * inv_k)[:, None] * x - y))", k("test_range_grad or " + OPS)),
    ("k-eq1-short-u-off-by-one", KE, "u = 1.0 - r * inv_k", "u = 1.0 - (r + 1.0) * inv_k", k("test_range_grad or " + OPS)),
    ("k-eq1-long-sign", KE, "return -Y - cD * (x * inv_k)", "return -Y + cD * (x * inv_k)", k("test_range_grad or " + OPS)),
    ("k-eq1-Gm-sign", KE, "Gm = -S1 - GM  # eq. (1)", "Gm = S1 - GM  # eq. (1)", k("test_range_grad or " + OPS)),
    ("k-eq1-fwm-GM-sign", KE, "        GM = -S1\n        Gm = tl.zeros", "        GM = S1\n        Gm = tl.zeros", k("test_range_grad or " + OPS)),
    ("k-eq2-argmin-reads-argmax-key", KE, "k_base + tl.maximum(amin, 0)[:, None] * skn", "k_base + tl.maximum(amax, 0)[:, None] * skn", k("test_range_grad or " + OPS)),
    ("k-eq2-dk-argmin-at-argmax", KE, "G += tl.where(offs_n[None, :] == amin[:, None], Gm[:, None], 0.0)", "G += tl.where(offs_n[None, :] == amax[:, None], Gm[:, None], 0.0)", k("test_range_grad or " + OPS)),
    ("k-eq2-dk-hit-block-start", KE, "| ((amin >= n0) & (amin < n0 + BLOCK_N))", "| ((amin > n0) & (amin < n0 + BLOCK_N))", k("test_range_grad or test_every_row or " + OPS)),
    ("k-dq-fold-1-over-W-dropped", KE, "        dq *= inv_Wa[:, None]\n", "        pass\n", k(OPS)),
    ("k-dq-fold-GM-1-over-W-dropped", KE, "        GM *= inv_Wa\n", "        pass\n", k("test_range_grad or " + OPS)),
    ("k-dq-keep-select-dropped", KE, "gamma = tl.where(keep, g - Dd[:, None], 0.0)  # W^at gamma", "gamma = g - Dd[:, None]  # W^at gamma", k(OPS + " or test_non_finite or test_every_row")),
    ("k-dq-scale-dropped", KE, "    dq = dq * scale\n    tl.store(DQ", "    tl.store(DQ", k(OPS)),
    ("k-dkdv-scale-dropped", KE, "    dk = dk * scale\n    out = ", "    out = ", k(OPS)),
    ("k-p1-dk-mask-dropped", KE, "ds = tl.where(valid, ds - mu[:, None], 0.0)", "ds = ds - mu[:, None]", k("test_range_grad or " + OPS)),
    ("k-p1-mean-count", KE, "mu = S1 / tl.maximum(nv, 1.0)", "mu = S1 / (nv + 1.0)", k("test_range_grad or " + OPS)),
    ("k-dkdv-softcap-chain-dropped", KE, "dk += _dot(tl.trans(_cast(_chain(ds, th, MASKING[3]), q.dtype)), q, PREC)\n    return dk, dv\n\n\n@triton.jit\ndef _arg_key_terms", "dk += _dot(tl.trans(_cast(ds, q.dtype)), q, PREC)\n    return dk, dv\n\n\n@triton.jit\ndef _arg_key_terms", k(SOFTCAP)),
    ("k-dq-softcap-argmax-chain-dropped", KE, "dq += _chain(GMe, th_max, SOFTCAP)[:, None] * k_max.to(tl.float32)", "dq += GMe[:, None] * k_max.to(tl.float32)", k(SOFTCAP, TR)),
    ("k-dq-softcap-bias-not-subtracted", KE, "th_max = (M - _bias_at(bias_base, offs_m, amax, sbm, sbn, rmask, Tk)) / cap", "th_max = M / cap", k(SOFTCAP + " or " + BIAS)),
    ("k-dkdv-bias-dropped", KE, "    if MASKING[4]:\n        bias = _bias_tile(offs_m, offs_n, Tq, Tk, mask)\n    s, th = _scores(q, tl.trans(k), scales, M, PREC, SOFTMAX,", "    s, th = _scores(q, tl.trans(k), scales, M, PREC, SOFTMAX,", k(BIAS)),
    ("k-dbias-self-term-1-over-W-dropped", KE, "            ds_b = ds * inv_Wa[:, None]", "            ds_b = ds", k(BIAS)),
    ("k-dbias-one-key-both-terms", KE, "both = amax == amin", "both = amax != amax", k(BIAS)),
    ("k-dq-sink-self-term-dropped", KE, "        S1 += ds_k\n", "        S1 += 0.0\n", k(SINKS)),
    ("k-bf16exp-grad-unrounded", KE, "ds = _round_bf16(_round_bf16(gamma) * cD)", "ds = gamma * cD", k("bf16-exp or bf16_exp")),
    ("k-fp8exp-grad-of-rounded", KE, "        return _round_e4m3(e), e\n", "        return _round_e4m3(e), _round_e4m3(e)\n", k("fp8-exp or fp8_exp")),
    ("k-fused-keep-dropped", KE, "gamma = tl.where(keep, _gamma(g, Dd, inv_Wa), 0.0)\n    ds = score_grad(gamma, cD, is_max, Dd", "gamma = _gamma(g, Dd, inv_Wa)\n    ds = score_grad(gamma, cD, is_max, Dd", k(FUSED + " or test_non_finite_values")),
    ("k-fused-S1-of-gamma", KE, "tl.atomic_add(S1a + row_i, tl.sum(ds, 1), mask=rmask, sem=\"relaxed\")", "tl.atomic_add(S1a + row_i, tl.sum(gamma, 1), mask=rmask, sem=\"relaxed\")", k(FUSED)),
    # ------------------------------------------------------------ autograd.py
    ("a-delta-at-O-for-prob", AG, "o_at = oL if ctx[\"flags\"][\"JACOBIAN_AT_PL\"] else o\n    delta", "o_at = o\n    delta", k(OPS)),
    ("a-fused-delta-at-O-for-prob", AG, "o_at = oL if flags[\"JACOBIAN_AT_PL\"] else o", "o_at = o", k(FUSED)),
    ("a-fused-eq1-Gm-sign", AG, "g_max, g_min = GM, -S1 - GM", "g_max, g_min = GM, S1 - GM", k(FUSED)),
    ("a-fused-fwm-GM-sign", AG, "g_max, g_min = -S1, None", "g_max, g_min = S1, None", k(FUSED)),
    ("a-fused-softcap-chain-dropped", AG, "G = G * (1.0 - (at_s / cap) ** 2)", "G = G", k(FUSED)),
    ("a-fused-dk-scale-dropped", AG, "(G * scale)[..., None] * q.float()", "G[..., None] * q.float()", k(FUSED)),
    ("a-fused-gqa-gather-tiled", AG, "k_at = k.float().gather(2, at.reshape(B, H_kv, -1, D)).view(B, H, Tq, D)", "k_at = k.float().repeat(1, H // H_kv, 1, 1).gather(2, at)", k(FUSED)),
    ("a-fold-groups-tiled", AG, "return grad.view(B, H_kv, -1, Tk, D).sum(2).to(like.dtype)", "return grad.view(B, -1, H_kv, Tk, D).sum(1).to(like.dtype)", k(FUSED)),
    ("a-fused-takes-p1", AG, "keep = flags[\"PROJECT_P1\"] or has_sinks or has_bias", "keep = has_sinks or has_bias", k(FUSED + " or falls_back")),
    ("a-fused-ignores-deterministic", AG, "if mode == \"fused\" and (keep or torch.are_deterministic_algorithms_enabled()):", "if mode == \"fused\" and keep:", k(FUSED + " or falls_back")),
    ("a-fused-dk-in-input-dtype", AG, "dk, dv = _per_q_head(k, H, f32 if terms else k.dtype), _per_q_head(v, H, v.dtype)", "dk, dv = _per_q_head(k, H, k.dtype), _per_q_head(v, H, v.dtype)", k(FUSED)),
    ("a-save-only-for-training", AG, "save = save or not flags[\"JACOBIAN_AT_PL\"]", "save = save", k("test_inference")),
    ("a-bias-p1-causal-offset", AG, "valid = valid & torch.ones(Tq, Tk, dtype=torch.bool, device=ds.device).tril(Tk - Tq)", "valid = valid & torch.ones(Tq, Tk, dtype=torch.bool, device=ds.device).tril(0)", k(BIAS)),
    ("a-bias-p1-projection-dropped", AG, "ds = ds - mu[..., None] * valid", "ds = ds", k(BIAS)),
    ("a-dsinks-first-batch", AG, "dsinks = ds_sink.sum((0, 2)).to(ctx.sinks_dtype)", "dsinks = ds_sink[0].sum(1).to(ctx.sinks_dtype)", k(SINKS)),
    ("a-scale-of-v-head-dim", AG, "scale = 1.0 / math.sqrt(D)", "scale = 1.0 / math.sqrt(v.shape[-1])", k("head_dim")),
    ("a-gqa-dk-buffer-input-dtype", AG, "return _alloc((B, H, Tk, D), torch.float32 if H_kv < H else dtype, x.device)", "return _alloc((B, H, Tk, D), dtype, x.device)", k(FUSED)),
    # ------------------------------------------------------------ round 2: code compiled for D > 64 only (BLOCK_D = 128),
    # which round 1 could not reach (k-eq1-long-sign); run on the new test_triton_boundaries.py
    ("k2-d128-dk-channels-swapped", KE, "ds = score_grad(gamma, cD, is_max, GMe, is_min, Gme, KEEP_MAX_TERM, KEEP_MIN_TERM, OP[5])  # eq. (2)", "ds = score_grad(gamma, cD, is_max, Gme, is_min, GMe, KEEP_MAX_TERM, KEEP_MIN_TERM, OP[5])  # eq. (2)", [TB]),
    ("k2-d128-dk-Gm-loaded-from-GM", KE, "Gme = tl.load(Gmo + row_i, mask=rmask, other=0.0)", "Gme = tl.load(GMo + row_i, mask=rmask, other=0.0)", [TB]),
    ("k2-d128-dq-unfolded-1-over-W-dropped", KE, "    else:\n        gamma = tl.where(keep, _gamma(g, Dd, inv_Wa), 0.0)", "    else:\n        gamma = tl.where(keep, g - Dd[:, None], 0.0)", [TB]),
    ("k2-d128-eq1-long-Y-off-by-one", KE, "t * E_r1 * (1.0 - (r + 1.0) * inv_k)", "t * E_r1 * (1.0 - r * inv_k)", [TB]),
    ("k2-d128-eq1-long-rho", KE, "return -Y - cD * (x * inv_k)", "return -Y - cD * x", [TB]),
    # ------------------------------------------------------------ round 2: the launcher's constexpr switches
    ("k2-range-grad-min-only-keeps-max", KE, 'keep_max = not softmax and range_grad in ("full", "max_only")', 'keep_max = not softmax and range_grad in ("full", "min_only")', k("test_range_grad or " + OPS)),
    ("k2-range-grad-max-only-keeps-min", KE, 'keep_min = minmax and range_grad in ("full", "min_only")', 'keep_min = minmax and range_grad in ("full", "max_only")', k("test_range_grad or " + OPS)),
    ("k2-weight-ste-jacobian-at-PL", KE, 'JACOBIAN_AT_PL=surrogate == "prob"', "JACOBIAN_AT_PL=surrogate is not None", k(OPS)),
]
# fmt: on


def run(name, path, old, new, tests) -> dict:
    f = ROOT / path
    orig = f.read_bytes()
    text = orig.decode()
    n = text.count(old)
    if n != 1:
        return dict(name=name, file=path, status=f"bad: {n} matches")
    if os.environ.get("MUT_CHECK") == "1":
        return dict(name=name, file=path, status="ok")
    if WIDE:
        tests = W_ALL
    if TESTS:
        tests = TESTS
    t0 = time.time()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    try:
        f.write_text(text.replace(old, new, 1))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", *tests]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            return dict(
                name=name, file=path, status="timeout", by=[], rc=None, secs=round(time.time() - t0, 1)
            )
        killed = r.returncode != 0
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        tail = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else []
        return dict(name=name, file=path, status="killed" if killed else "survived", by=failed[:1],
                    rc=r.returncode, summary=tail, wide=WIDE, secs=round(time.time() - t0, 1))  # fmt: skip
    finally:
        f.write_bytes(orig)


def main(names: list[str]) -> None:
    done = set()
    if OUT.exists() and os.environ.get("MUT_CHECK") != "1":
        done = {json.loads(x)["name"] for x in OUT.read_text().splitlines() if x.strip()}
    for m in MUTANTS:
        if (names and m[0] not in names) or m[0] in done:
            continue
        if STOP.exists():
            break
        res = run(*m)
        print(json.dumps(res), flush=True)
        if os.environ.get("MUT_CHECK") != "1":
            with OUT.open("a") as fh:
                fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
