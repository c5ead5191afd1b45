"""One-string mutation audit of the score-modification, attention-option and evaluation-data code.

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files with ``-x`` and records whether a test failed (killed) or all passed (survived); the file is
restored byte for byte afterwards. Run from the repository root with the repository's ``src`` first on
PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-2026-12-03f/mut_audit.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name);
mutants already there are skipped (delete a line to rerun it). Touch ``STOP`` beside the script to stop
between mutants. The tests that run the triton kernels are left out (``NO_INTERPRETER``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
OUT = Path(__file__).with_name(os.environ.get("MUT_OUT", "mutants.jsonl"))
STOP = Path(__file__).with_name("STOP")

API = "src/kinterval/ops/api.py"
T_API = ["tests/ops/test_score_mods.py", "tests/ops/test_spec_and_inputs.py", "tests/ops/test_attention.py",
         "tests/ops/test_edge_cases.py", "tests/ops/test_sdpa_dropin.py"]  # fmt: skip
T_BACK = ["tests/ops/test_backends.py", "tests/ops/test_score_mods.py"]
T_FUNC = ["tests/ops/test_func_transforms.py"]
T_FLIP = ["tests/ops/test_flips.py"]
T_SDPA = ["tests/ops/test_sdpa_mode.py"]
T_MODEL = ["tests/model/test_attention_options.py", "tests/model/test_model.py", "tests/model/test_scores.py"]
T_HF = ["tests/integrations/test_hf.py"]
T_OPT = ["tests/report/test_option_effects.py"]
T_CKPT = ["tests/eval/test_eval_checkpoints.py", "tests/eval/test_eval_data_match.py"]

CFG = "src/kinterval/model/config.py"
GPT = "src/kinterval/model/gpt.py"
SCO = "src/kinterval/model/scores.py"
HF = "src/kinterval/integrations/hf.py"
OPTS = "src/kinterval/report/analysis/options.py"
TBL = "src/kinterval/report/tables.py"
ECK = "src/kinterval/eval/checkpoints.py"
TCK = "src/kinterval/train/checkpoint.py"
FLP = "src/kinterval/ops/flips.py"
BCK = "src/kinterval/ops/backends.py"
SDP = "src/kinterval/ops/sdpa_mode.py"
CLF = "src/kinterval/ops/closed_form.py"
REF = "src/kinterval/ops/reference.py"

# the tests that run the triton kernels (in Triton's slow CPU interpreter without a GPU) are left out
NO_INTERPRETER = "not triton and not fused_kernel and not the_kernels"

# (name, file, old, new, tests)
MUTANTS = [
    # --- ops/api.py
    (
        "api-split-blocked-isneginf",
        API,
        "blocked = mask <= torch.finfo(mask.dtype).min / 2",
        "blocked = torch.isneginf(mask)",
        T_API,
    ),
    ("api-split-no-grad-keep", API, "if mask.requires_grad and torch.is_grad_enabled():", "if False:", T_API),
    (
        "api-split-bias-always-none",
        API,
        'mask.device.type == "meta" or not torch.any(bias != 0)',
        "True",
        T_API,
    ),
    ("api-warn-boundary-strict", API, "if low <= MASK_LIKE_BIAS:", "if low < MASK_LIKE_BIAS:", T_API),
    (
        "api-warn-also-softmax",
        API,
        "if bias is None or not spec.is_kinterval or",
        "if bias is None or",
        T_API,
    ),
    ("api-warn-threshold-1e5", API, "MASK_LIKE_BIAS = -1e4", "MASK_LIKE_BIAS = -1e5", T_API),
    (
        "api-warn-dropped",
        API,
        'warn_mask_like_bias(bias, spec, "attn_mask" if attn_mask is not None else "mask")\n    softcap',
        "softcap",
        T_API,
    ),
    (
        "api-softcap-min-eps",
        API,
        "SOFTCAP_MIN = torch.finfo(torch.float32).tiny",
        "SOFTCAP_MIN = torch.finfo(torch.float32).eps",
        T_API,
    ),
    ("api-softcap-min-check-dropped", API, "if softcap < SOFTCAP_MIN:", "if False:", T_API),
    ("api-softcap-min-le", API, "if softcap < SOFTCAP_MIN:", "if softcap <= SOFTCAP_MIN:", T_API),
    (
        "api-softcap-bool-accepted",
        API,
        "if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real)",
        "if not isinstance(softcap, numbers.Real)",
        T_API,
    ),
    ("api-softcap-inf-accepted", API, "not 0 < softcap < math.inf", "not 0 < softcap", T_API),
    (
        "api-bad-ignores-valid",
        API,
        "bad = (~torch.isfinite(qk) & valid)",
        "bad = (~torch.isfinite(qk))",
        T_API,
    ),
    (
        "api-softcap-no-c-factor",
        API,
        "else softcap * torch.tanh(qk / softcap)",
        "else torch.tanh(qk / softcap)",
        T_API,
    ),
    (
        "api-bias-before-softcap",
        API,
        "    s = qk if softcap is None else",
        "    qk = qk if bias is None else qk + bias.to(device=qk.device, dtype=qk.dtype)\n"
        "    bias = None\n    s = qk if softcap is None else",
        T_API,
    ),
    (
        "api-sink-neginf-attended",
        API,
        "~torch.isneginf(sink)], -1)",
        "torch.ones_like(sink, dtype=torch.bool)], -1)",
        T_API,
    ),
    (
        "api-probs-drop-first-col",
        API,
        "return P if sinks is None else P[..., :-1]",
        "return P if sinks is None else P[..., 1:]",
        T_API,
    ),
    ("api-probs-sink-nan-check", API, 'raise ValueError("sinks contain NaN or +inf")', "pass", T_API),
    ("api-gqa-no-multiple-check", API, "(H_kv == 0 or H % H_kv)", "(H_kv == 0)", T_API),
    (
        "api-gqa-repeat-not-interleave",
        API,
        "k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)",
        "k, v = k.repeat(1, H // H_kv, 1, 1), v.repeat(1, H // H_kv, 1, 1)",
        T_API,
    ),
    ("api-gqa-no-flag-check", API, "if H != H_kv and not enable_gqa:", "if False:", T_API),
    ("api-sinks-shape-loose", API, "or sinks.shape != (H,):", "or sinks.dim() != 1:", T_API),
    (
        "api-nonfinite-mod-row-not-nan",
        API,
        "bad = bad | (~torch.isfinite(scores) & valid).any(-1, keepdim=True)",
        "pass",
        T_API,
    ),
    (
        "api-is-causal-triu",
        API,
        "dtype=torch.bool, device=q.device).tril()",
        "dtype=torch.bool, device=q.device).triu()",
        T_API,
    ),
    (
        "api-sinks-attach-head-dim",
        API,
        "sinks.to(scores.device).view(1, H, 1, 1)",
        "sinks.to(scores.device).view(1, 1, 1, H)[..., :1]",
        T_API,
    ),
    # --- ops/backends.py
    (
        "back-bool-inverted",
        BCK,
        "frozenset(SCORE_MODS if score_mod else ())",
        "frozenset(() if score_mod else SCORE_MODS)",
        T_BACK,
    ),
    ("back-unknown-accepted", BCK, "    if unknown:\n", "    if False:\n", T_BACK),
    ("back-missing-ignored", BCK, "if reason is None and missing:", "if False:", T_BACK),
    # --- closed_form / reference (func transforms)
    ("cf-jvp-returns", CLF, "raise NotImplementedError(FORWARD_MODE_MESSAGE)", "return tangents[0]", T_FUNC),
    ("ref-jvp-unprojected", REF, "return project_zero_sum(s_t, valid)", "return s_t", T_FUNC),
    ("ref-forward-view", REF, "return s.clone()", "return s.view_as(s)", T_FUNC),
    # --- ops/flips.py
    ("flip-softcap-slope-dropped", FLP, "rad = rad * (1 - (s / softcap) ** 2) + ", "rad = rad + ", T_FLIP),
    ("flip-softcap-tanh-round-dropped", FLP, "+ RADIUS * U32 * 4 * s.abs()", "", T_FLIP),
    ("flip-bias-round-dropped", FLP, "rad = rad + RADIUS * U32 * s.abs()", "pass", T_FLIP),
    (
        "flip-sink-neginf-taken",
        FLP,
        "taken = ~torch.isneginf(sink)",
        "taken = torch.ones_like(sink).bool()",
        T_FLIP,
    ),
    ("flip-softcap-not-applied", FLP, "s = softcap * torch.tanh(s / softcap)", "s = s", T_FLIP),
    # --- ops/sdpa_mode.py
    (
        "sdpa-fastpath-left-on",
        SDP,
        "torch.backends.mha.set_fastpath_enabled(False)",
        "torch.backends.mha.set_fastpath_enabled(True)",
        T_SDPA,
    ),
    (
        "sdpa-outer-block-wins",
        SDP,
        "F.scaled_dot_product_attention = _OPEN[-1][1]",
        "F.scaled_dot_product_attention = _OPEN[0][1]",
        T_SDPA,
    ),
    (
        "sdpa-need-weights-default-false",
        SDP,
        '.arguments.get("need_weights", True)',
        '.arguments.get("need_weights", False)',
        T_SDPA,
    ),
    (
        "sdpa-3d-mask-unsqueeze-front",
        SDP,
        "attn_mask = attn_mask.unsqueeze(-3)",
        "attn_mask = attn_mask.unsqueeze(0)",
        T_SDPA,
    ),
    ("sdpa-warn-every-time", SDP, "self._warned_alias = True\n", "pass\n", T_SDPA),
    # --- model/config.py
    ("cfg-softcap-min-subnormal", CFG, "SOFTCAP_MIN = 2.0**-126", "SOFTCAP_MIN = 2.0**-149", T_MODEL),
    ("cfg-kv-divides-dropped", CFG, "or kv < 1 or self.n_head % kv)", "or kv < 1)", T_MODEL),
    ("cfg-theta-gt-0", CFG, "not 1 < theta < math.inf", "not 0 < theta < math.inf", T_MODEL),
    (
        "cfg-theta-odd-dim-accepted",
        CFG,
        "if theta is not None and (self.n_embd // self.n_head) % 2:",
        "if False:",
        T_MODEL,
    ),
    (
        "cfg-options-kv-is-set",
        CFG,
        '"n_kv_head": self.kv_heads != self.n_head',
        '"n_kv_head": self.n_kv_head is not None',
        T_MODEL,
    ),
    ("cfg-count-no-sinks", CFG, "+ cfg.n_head * cfg.attn_sinks", "+ 0", T_MODEL),
    (
        "cfg-count-rope-has-table",
        CFG,
        "if include_positions and cfg.rope_theta is None:",
        "if include_positions:",
        T_MODEL,
    ),
    (
        "cfg-sinks-bool-unchecked",
        CFG,
        'for name in ("bias", "attn_sinks"):',
        'for name in ("bias",):',
        T_MODEL,
    ),
    (
        "cfg-softcap-min-le",
        CFG,
        "if cap is not None and cap < SOFTCAP_MIN:",
        "if cap is not None and cap <= SOFTCAP_MIN:",
        T_MODEL,
    ),
    # --- model/gpt.py
    ("gpt-rotary-sign", GPT, "x1 * cos - x2 * sin", "x1 * cos + x2 * sin", T_MODEL),
    ("gpt-rotary-freq-half", GPT, "dtype=torch.float64) / D)", "dtype=torch.float64) / (D // 2))", T_MODEL),
    (
        "gpt-rotary-no-fp32",
        GPT,
        "dtype = torch.promote_types(x.dtype, torch.float32)",
        "dtype = x.dtype",
        T_MODEL,
    ),
    (
        "gpt-sinks-init-ones",
        GPT,
        "nn.Parameter(torch.zeros(config.n_head))",
        "nn.Parameter(torch.ones(config.n_head))",
        T_MODEL,
    ),
    (
        "gpt-sdpa-softcap-accepted",
        GPT,
        "if self.operator == SDPA and (self.softcap is not None",
        "if False and (self.softcap is not None",
        T_MODEL,
    ),
    ("gpt-wpe-always-added", GPT, 'if "wpe" in self.transformer:  # learned', "if True:  # learned", T_MODEL),
    # --- model/scores.py
    ("scores-softcap-dropped", SCO, "s = module.softcap * torch.tanh(s / module.softcap)", "s = s", T_MODEL),
    (
        "scores-sink-invalid",
        SCO,
        "torch.ones_like(valid[..., :1])",
        "torch.zeros_like(valid[..., :1])",
        T_MODEL,
    ),
    (
        "scores-gqa-repeat",
        SCO,
        "(t.repeat_interleave(module.n_head // module.n_kv_head, dim=1) for t in (k, v))",
        "(t.repeat(1, module.n_head // module.n_kv_head, 1, 1) for t in (k, v))",
        T_MODEL,
    ),
    (
        "scores-sink-value-ones",
        SCO,
        "v.new_zeros(*v.shape[:-2], 1, v.shape[-1])",
        "v.new_ones(*v.shape[:-2], 1, v.shape[-1])",
        T_MODEL,
    ),
    # --- integrations/hf.py
    (
        "hf-bias-dropped-with-bool-mask",
        HF,
        'mask = torch.where(mask, bias, float("-inf"))',
        "mask = mask",
        T_HF,
    ),
    ("hf-bias-dropped-with-float-mask", HF, "mask = bias + mask", "mask = mask", T_HF),
    (
        "hf-both-sinks-accepted",
        HF,
        'raise ValueError("pass the attention sinks as s_aux or as sinks, not both")',
        "pass",
        T_HF,
    ),
    ("hf-sinks-kw-ignored", HF, 'else kwargs.get("sinks")', "else None", T_HF),
    ("hf-explicit-nan-row-dropped", HF, 'P = P.masked_fill(bad, float("nan"))', "pass", T_HF),
    (
        "hf-explicit-softcap-dropped",
        HF,
        "scores, bad = modified_scores(qk, attended, softcap, bias)",
        "scores, bad = modified_scores(qk, attended, None, bias)",
        T_HF,
    ),
    (
        "hf-explicit-gqa-repeat",
        HF,
        "key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)",
        "key, value = key.repeat(1, n_rep, 1, 1), value.repeat(1, n_rep, 1, 1)",
        T_HF,
    ),
    ("hf-explicit-warn-dropped", HF, 'warn_mask_like_bias(bias, spec, "attention mask")', "pass", T_HF),
    # --- report/analysis/options.py and tables.option_rows
    (
        "opt-penalty-sign",
        OPTS,
        "(x.point.nll - ref.point.nll) - (x.control.nll - ref.control.nll)",
        "(x.control.nll - ref.control.nll) - (x.point.nll - ref.point.nll)",
        T_OPT,
    ),
    ("opt-penalty-for-softmax-too", OPTS, "if key.operator not in REFERENCES:", "if True:", T_OPT),
    ("opt-twin-ignores-protocol", OPTS, "p.train_data, rest)", "p.train_data)", T_OPT),
    (
        "opt-twin-ignores-seed",
        OPTS,
        "return (p.operator, p.seed, p.budget,",
        "return (p.operator, p.budget,",
        T_OPT,
    ),
    (
        "opt-penalty-no-bh",
        OPTS,
        "apply_bh([e.penalty for e in out if e.penalty is not None], family)",
        "pass",
        T_OPT,
    ),
    (
        "opt-penalty-nll-swapped",
        OPTS,
        "nll=float(np.mean([x.point.mean - r.point.mean for x, r in used]))",
        "nll=float(np.mean([x.control.mean - r.control.mean for x, r in used]))",
        T_OPT,
    ),
    (
        "tbl-option-nll-swapped",
        TBL,
        "cells += [num(r.control_nll, False), num(r.nll, False), *est(r)]",
        "cells += [num(r.nll, False), num(r.control_nll, False), *est(r)]",
        T_OPT,
    ),
    (
        "tbl-option-penalty-swapped",
        TBL,
        "[num(pen.control_nll), num(pen.nll)] if pen",
        "[num(pen.nll), num(pen.control_nll)] if pen",
        T_OPT,
    ),
    ("tbl-option-q-dropped", TBL, "*([prob(r.q)] if q else [])]", "*(['-'] if q else [])]", T_OPT),
    # --- eval/checkpoints.py and train/checkpoint.py
    ("eck-ckpt-folder-all-dropped", ECK, 'or (Path(run_dir) / "state.json").is_file()', "", T_CKPT),
    ("eck-no-check-matches", ECK, "    shards.check_matches(state)\n", "", T_CKPT),
    (
        "eck-no-require-blocks",
        ECK,
        '    shards.require_blocks(int(state["model_config"]["block_size"]))\n',
        "",
        T_CKPT,
    ),
    (
        "tck-no-meta-check",
        TCK,
        "    if not meta.is_file():\n        raise CheckpointError(",
        "    if False:\n        raise CheckpointError(",
        T_CKPT,
    ),
    ("tck-no-split-check", TCK, "    if have is None:\n", "    if False:\n", T_CKPT),
    ("tck-no-hash-check", TCK, "and have != want:", "and False:", T_CKPT),
    # --- a second batch
    ("hf-gqa-flag-off", HF, "gqa = query.shape[1] != key.shape[1]", "gqa = False", T_HF),
    ("hf-explicit-softcap-unchecked", HF, "    softcap = check_softcap(softcap)\n", "", T_HF),
    (
        "hf-position-bias-unsliced",
        HF,
        "bias = position_bias[..., : key.shape[2]]",
        "bias = position_bias",
        T_HF,
    ),
    ("api-sinks-dtype-unchecked", API, '        working_dtype(sinks.dtype, "sinks")\n', "", T_API),
    (
        "api-probs-sinks-per-head-view-dropped",
        API,
        "sinks = sinks.view(-1, 1, 1)  # one per head",
        "pass",
        T_API,
    ),
    ("cfg-count-qkv-full", CFG, "qkv = d + 2 * d // cfg.n_head * cfg.kv_heads", "qkv = 3 * d", T_MODEL),
    (
        "gpt-gqa-flag-dropped",
        GPT,
        '{"enable_gqa": True} if self.n_kv_head != self.n_head else {}',
        "{}",
        T_MODEL,
    ),
    (
        "gpt-num-params-rope",
        GPT,
        'if include_positions or "wpe" not in self.transformer:',
        "if include_positions:",
        T_MODEL,
    ),
    ("opt-primary-dropped", OPTS, "if p.primary and p.options and", "if p.options and", T_OPT),
    (
        "eck-data-ignored",
        ECK,
        "TokenShards(data if data is not None else trained_data_dir(state, ckpt), split)",
        "TokenShards(trained_data_dir(state, ckpt), split)",
        T_CKPT,
    ),
    (
        "tck-relative-note-dropped",
        TCK,
        "    if not Path(folder).is_absolute():\n        where +=",
        "    if False:\n        where +=",
        T_CKPT,
    ),
]


def run(mutant) -> dict:
    name, path, old, new, tests = mutant
    f = ROOT / path
    orig = f.read_bytes()
    text = orig.decode()
    n = text.count(old)
    if n != 1:
        return {"name": name, "file": path, "status": f"bad-mutant ({n} matches)"}
    t0 = time.time()
    try:
        f.write_text(text.replace(old, new, 1))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-k",
            NO_INTERPRETER,
            *tests,
        ]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        status = "survived" if r.returncode == 0 else "killed"
        failed = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
        killer = failed[0].split(" - ")[0] if failed else ("" if r.returncode == 0 else r.stdout[-300:])
    finally:
        f.write_bytes(orig)
    assert f.read_bytes() == orig
    return {"name": name, "file": path, "status": status, "killer": killer, "s": round(time.time() - t0, 1)}


def main(argv) -> None:
    done = {json.loads(ln)["name"] for ln in OUT.read_text().splitlines()} if OUT.exists() else set()
    chosen = [m for m in MUTANTS if m[0] not in done and (not argv or m[0] in argv)]
    for m in chosen:
        if STOP.exists():  # touch it to stop between mutants
            break
        rec = run(m)
        print(json.dumps(rec), flush=True)
        with OUT.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
