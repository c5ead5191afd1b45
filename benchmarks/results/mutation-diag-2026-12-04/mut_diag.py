# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of the per-checkpoint diagnostics cache (``eval/diagnostics.py``), the
``kinterval ops`` operator table and consistency diagnostics (``ops/diagnostics.py``, ``ops/commands.py``),
suite definition files (``suite/definition.py``), the run / checkpoint loader (``train/load.py``) and the
synthetic corpus (``data/synthetic.py``).

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files with ``-x -q -p no:xdist`` and records killed (a test failed), survived, or timeout
(``$MUT_TIMEOUT`` seconds, 120 by default; counted as killed); the file is restored byte for byte, also on
an exception or a timeout. Run from the repository root (or a copy of it) with its ``src`` first on
PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-diag-2026-12-04/mut_diag.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name, or
a path); mutants already there are skipped. ``$MUT_FILES``: comma-separated substrings; only mutants of a
file containing one run. Touch ``STOP`` beside the script to stop between mutants.
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
FILES = [s for s in os.environ.get("MUT_FILES", "").split(",") if s]
TIMEOUT = float(os.environ.get("MUT_TIMEOUT", "120"))

ED, OD, OC = (
    "src/kinterval/eval/diagnostics.py",
    "src/kinterval/ops/diagnostics.py",
    "src/kinterval/ops/commands.py",
)
SD, LD, SY = (
    "src/kinterval/suite/definition.py",
    "src/kinterval/train/load.py",
    "src/kinterval/data/synthetic.py",
)

T_ED = [
    "tests/eval/test_eval_run.py",
    "tests/eval/test_eval_commands.py",
    "tests/suite/test_suite_io_failures.py",
]
T_OC = ["tests/ops/test_ops_cli.py", "tests/ops/test_ops_commands.py", "tests/ops/test_consistency.py"]
T_OD = ["tests/ops/test_diagnostics.py", *T_OC, "tests/eval/test_eval_graddiag.py"]
T_SD = ["tests/suite/test_suite_definition.py", "tests/suite/test_suite_commands.py"]
T_LD = ["tests/train/test_load_run.py", "tests/eval/test_eval_checkpoints.py"]
T_SY = ["tests/data/test_data_synthetic.py"]

# fmt: off
MUTANTS = [
    # ------------------------------------------------------------ eval/diagnostics.py
    ("ed-kind-unchecked", ED, "    if kind not in KINDS:\n", "    if False:\n", T_ED),
    ("ed-blocks-bool", ED, "if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:", "if not isinstance(blocks, int) or blocks < 1:", T_ED),
    ("ed-blocks-zero", ED, "or blocks < 1:  # before the cache", "or blocks < 0:  # before the cache", T_ED),
    ("ed-as-same-folder", ED, "if spec:  # a probe under another", "if False:  # a probe under another", T_ED),
    ("ed-as-folder-name", ED, 'f"{kind}__as-{safe_operator(spec)}"', 'f"{kind}-as-{safe_operator(spec)}"', T_ED),
    ("ed-as-unsafe-name", ED, 'f"{kind}__as-{safe_operator(spec)}"', 'f"{kind}__as-{spec}"', T_ED),
    ("ed-default-dir-in-checkpoints", ED, "out_dir = diagnostics_dir(ckpt.parent.parent, kind)", "out_dir = diagnostics_dir(ckpt.parent, kind)", T_ED),
    ("ed-file-ckpt-folder-name", ED, 'path = out_dir / f"{checkpoint_name(ckpt)}.json"', 'path = out_dir / f"{ckpt.name}.json"', T_ED),
    ("ed-force-ignored", ED, "old = None if force else _stored(path)", "old = _stored(path)", T_ED),
    ("ed-hit-other-bytes", ED, 'if old.get("checkpoint_state_sha256") == sha and old.get("request") == req:', 'if old.get("request") == req:', T_ED),
    ("ed-hit-other-request", ED, 'if old.get("checkpoint_state_sha256") == sha and old.get("request") == req:', 'if old.get("checkpoint_state_sha256") == sha:', T_ED),
    ("ed-hit-or", ED, 'if old.get("checkpoint_state_sha256") == sha and old.get("request") == req:', 'if old.get("checkpoint_state_sha256") == sha or old.get("request") == req:', T_ED),
    ("ed-refuse-other-bytes", ED, 'if old.get("checkpoint_state_sha256") == sha and not replace_other:', "if not replace_other:", T_ED),
    ("ed-replace-other-ignored", ED, 'if old.get("checkpoint_state_sha256") == sha and not replace_other:', 'if old.get("checkpoint_state_sha256") == sha:', T_ED),
    ("ed-never-refuse", ED, '_refuse_other_request(path, kind, old.get("request"), req)', "pass", T_ED),
    ("ed-request-no-spec", ED, "req = request(stored, shards, spec, blocks, False, dev)", "req = request(stored, shards, None, blocks, False, dev)", T_ED),
    ("ed-request-blocks-8", ED, "req = request(stored, shards, spec, blocks, False, dev)", "req = request(stored, shards, spec, 8, False, dev)", T_ED),
    ("ed-vocab-unchecked", ED, "    shards.check_vocab(model.config.vocab_size)\n", "", T_ED),
    ("ed-spec-dropped", ED, "geometry_probe(model, tokens, blocks=blocks, spec=spec)", "geometry_probe(model, tokens, blocks=blocks)", T_ED),
    ("ed-tokens-is-step", ED, 'tokens=int(state.get("tokens", 0)),', 'tokens=int(state.get("step", 0)),', T_ED),
    ("ed-sha-field-name", ED, "checkpoint_state_sha256=sha,", "checkpoint_sha256=sha,", T_ED),
    ("ed-operator-trained-spec", ED, "operator_trained=model.operator,", "operator_trained=spec,", T_ED),
    ("ed-probe-arg-lost", ED, "probe_operator_arg=spec,", "probe_operator_arg=None,", T_ED),
    ("ed-split-as-given", ED, "split=shards.split,", "split=split,", T_ED),
    ("ed-device-as-given", ED, "device=str(dev),", "device=str(device),", T_ED),
    ("ed-train-code-lost", ED, 'train_code=state.get("code", {}),', "train_code={},", T_ED),
    ("ed-mkdir-no-parents", ED, "out_dir.mkdir(parents=True, exist_ok=True)", "out_dir.mkdir(exist_ok=True)", T_ED),
    ("ed-write-not-atomic", ED, "atomic.write_json(path, res)  #", "path.write_text(json.dumps(res))  #", T_ED),
    ("ed-hit-not-skipped", ED, "return dict(old, skipped=True, path=str(path))", "return dict(old, skipped=False, path=str(path))", T_ED),
    ("ed-stored-missing-raises", ED, "except (OSError, ValueError):  # missing", "except ValueError:  # missing", T_ED),
    ("ed-stored-not-object-ok", ED, "return old if isinstance(old, dict) else None", "return old", T_ED),
    ("ed-no-request-refused", ED, "    if not isinstance(old, dict):\n        return\n", '    if not isinstance(old, dict):\n        raise ValueError(f"{path}: no request")\n', T_ED),
    ("ed-blocks-not-compared", ED, 'if old.get("max_blocks") != req["max_blocks"]:', "if False:", T_ED),
    ("ed-plural-flipped", ED, '("" if n == 1 else "s")', '("s" if n == 1 else "")', T_ED),
    ("ed-split-and-data", ED, "    elif any(\n", "    if any(\n", T_ED),
    ("ed-data-by-size", ED, 'for k in ("shards_sha256", "n_tokens", "T")', 'for k in ("n_tokens", "T")', T_ED),
    ("ed-run-every-checkpoint", ED, "for c in select_checkpoints(run_dir, checkpoint)]", 'for c in select_checkpoints(run_dir, "all")]', T_ED),
    ("ed-dir-name", ED, 'return Path(run_dir) / "diagnostics" / kind', 'return Path(run_dir) / "diagnostic" / kind', T_ED),
    # ------------------------------------------------------------ ops/diagnostics.py
    ("od-upstream-last-dim", OD, "if upstream.shape != scores.shape:", "if upstream.shape[-1] != scores.shape[-1]:", T_OD),
    ("od-upstream-scores-type", OD, "if not isinstance(upstream, Tensor) or not isinstance(scores, Tensor):", "if not isinstance(upstream, Tensor):", T_OD),
    ("od-grad-backend-lost", OD, "P = attention_probs(s, as_spec(spec), causal=causal, mask=mask, backend=backend)", "P = attention_probs(s, as_spec(spec), causal=causal, mask=mask)", T_OD),
    ("od-a1-signed", OD, "return (P1 - P0).abs().max().item()", "return (P1 - P0).max().item()", T_OD),
    ("od-rho-signed", OD, "grad.sum(-1).abs() / denom", "grad.sum(-1) / denom", T_OD),
    ("od-rho-max-norm", OD, "denom = grad.abs().sum(-1)", "denom = grad.abs().amax(-1)", T_OD),
    ("od-rho-valid-ignored", OD, "        grad = torch.where(valid, grad, torch.zeros_like(grad))\n", "        pass\n", T_OD),
    ("od-rho-zero-row-nan", OD, "torch.where(denom == 0, 0.0,", "torch.where(denom < 0, 0.0,", T_OD),
    ("od-a3-unmasked", OD, "return DirectionalCheck(torch.where(valid, grad, 0.0).sum().item(), fd.item())", "return DirectionalCheck(grad.sum().item(), fd.item())", T_OD),
    ("od-a3-fd-half", OD, ") / (2 * eps)\n    return DirectionalCheck(torch.where", ") / eps\n    return DirectionalCheck(torch.where", T_OD),
    ("od-a4-one-sided", OD, "_loss(s + e, spec, upstream, causal=causal, mask=mask)", "_loss(s, spec, upstream, causal=causal, mask=mask)", T_OD),
    ("od-decomp-full-no-m", OD, '"g_full": t["self"] + t["M"] + t["m"]', '"g_full": t["self"] + t["M"]', T_OD),
    ("od-decomp-M-m-swapped", OD, '"g_M": t["M"], "g_m": t["m"]', '"g_M": t["m"], "g_m": t["M"]', T_OD),
    ("od-decomp-float32", OD, "s = scores if scores.dtype == torch.float64 else scores.float()", "s = scores.float()", T_OD),
    ("od-a4-extremum-key", OD, "(s < ext.M - 10 * eps) & (s > ext.m + 10 * eps)", "(s <= ext.M) & (s > ext.m + 10 * eps)", T_OD),
    ("od-a4-kink-upper", OD, "(g.t_raw > 0.01) & (g.t_raw < 0.99)", "(g.t_raw > 0.01)", T_OD),
    ("od-a4-dropped-keys", OD, "ok &= g.keep & (g.t_raw", "ok &= (g.t_raw", T_OD),
    ("od-a4-rows-all", OD, "return ok.any(-1), badness.argmin(-1)", "return ok.all(-1), badness.argmin(-1)", T_OD),
    ("od-a4-mean-denominator", OD, "/ ad.abs().max().clamp(min=1e-300)", "/ ad.abs().mean().clamp(min=1e-300)", T_OD),
    ("od-a4-keys-numel", OD, "int(rows.sum())", "int(rows.numel())", T_OD),
    ("od-T-2", OD, "or T < 3:  # A4 needs", "or T < 2:  # A4 needs", T_OD),
    ("od-scale-bool", OD, "if isinstance(scale, bool) or not isinstance(scale, (int, float))", "if not isinstance(scale, (int, float))", T_OD),
    ("od-scale-inf", OD, 'not 0 < scale < float("inf")', "not 0 < scale", T_OD),
    ("od-overflow-unchecked", OD, "if not s32.isfinite().all():", "if False:", T_OD),
    ("od-rho-row-0", OD, "rho = zero_sum_residual(grad, valid)[..., 1:]  # rows", "rho = zero_sum_residual(grad, valid)  # rows", T_OD),
    ("od-vs-full-signed", OD, '(grad - out["full"][1]).abs().max().item()', '(grad - out["full"][1]).max().item()', T_OD),
    ("od-tol-float32", OD, "tol = A1_ULPS * torch.finfo(torch.float64).eps", "tol = A1_ULPS * torch.finfo(torch.float32).eps", T_OD),
    ("od-Ks-and-operators", OD, "if operators is not None and Ks is not None:", "if False:", T_OD),
    ("od-Ks-empty", OD, "if not Ks or any(", "if any(", T_OD),
    ("od-Ks-bool", OD, "any(isinstance(K, bool) or not isinstance(K, int) or K < 1 for K in Ks)", "any(not isinstance(K, int) or K < 1 for K in Ks)", T_OD),
    ("od-range-grad-given", OD, 'if spec.range_grad != "full":', "if False:", T_OD),
    ("od-twice-thrice", OD, "names.count(n) > 1}", "names.count(n) > 2}", T_OD),
    ("od-top-smallest-K", OD, 'top = max(rs, key=lambda r: r["K"] or 0)', 'top = min(rs, key=lambda r: r["K"] or 0)', T_OD),
    ("od-median-min-is-max", OD, '"residual_median_min": min(', '"residual_median_min": max(', T_OD),
    ("od-a4-max-is-min", OD, '"interior_rel_err_max": max(a4) if a4 else None', '"interior_rel_err_max": min(a4) if a4 else None', T_OD),
    ("od-keys-first-K", OD, 'else sum(r["interior_keys"] for r in rs),', 'else rs[0]["interior_keys"],', T_OD),
    ("od-fwd-any", OD, '(all(r["forward_equals_detach"] for r in rs)', '(any(r["forward_equals_detach"] for r in rs)', T_OD),
    ("od-shift-min", OD, 'shift = max(r["shift_max_abs"] for r in rows)', 'shift = min(r["shift_max_abs"] for r in rows)', T_OD),
    ("od-operators-rows", OD, 'operators = len({r["operator"] for r in rows})', "operators = len(rows)", T_OD),
    ("od-softmax-no-a4", OD, 'differentiable = spec.kind == "softmax" or spec.reconstruction == "lerp"', 'differentiable = spec.reconstruction == "lerp"', T_OD),
    # ------------------------------------------------------------ ops/commands.py
    ("oc-T-1", OC, "if args.T is not None and args.T < 2:", "if args.T is not None and args.T < 1:", T_OC),
    ("oc-memory-per-T", OC, "need, avail = BYTES_PER_T2 * T * T,", "need, avail = BYTES_PER_T2 * T,", T_OC),
    ("oc-meminfo-kib", OC, "return int(line.split()[1]) * 1024", "return int(line.split()[1])", T_OC),
    ("oc-scale-nan", OC, "(not math.isfinite(args.scale) or args.scale <= 0)", "(args.scale <= 0)", T_OC),
    ("oc-scale-overflow-1sd", OC, "args.scale * 8 > torch.finfo", "args.scale > torch.finfo", T_OC),
    ("oc-verify-seed-ok", OC, '_given(args, "operators", "range_grad", "seed")', '_given(args, "operators", "range_grad")', T_OC),
    ("oc-table-K-ok", OC, "    if args.K is not None:\n        raise ValueError(\n", "    if False:\n        raise ValueError(\n", T_OC),
    ("oc-range-grad-case", OC, 'range_grad = (args.range_grad or "full").lower()', 'range_grad = args.range_grad or "full"', T_OC),
    ("oc-range-grad-conflict", OC, 'if spec.range_grad not in ("full", range_grad):', "if False:", T_OC),
    ("oc-range-grad-baselines", OC, 'if range_grad is None or range_grad == "full" or not spec.is_kinterval:', 'if range_grad is None or range_grad == "full":', T_OC),
    ("oc-json-checked-after", OC, "    if args.json is not None:  # before the tensors, not after\n        atomic.check_target(args.json)\n", "", T_OC),
    ("oc-tv-sum", OC, "tv = 0.5 * (P - P_soft).abs().sum(-1)[..., 1:]", "tv = (P - P_soft).abs().sum(-1)[..., 1:]", T_OC),
    ("oc-rho-row-0", OC, "rho = zero_sum_residual(score_gradient(s, spec, up, causal=True), valid)[..., 1:]", "rho = zero_sum_residual(score_gradient(s, spec, up, causal=True), valid)", T_OC),
    ("oc-rho-upstream-ones", OC, "score_gradient(s, spec, up, causal=True)", "score_gradient(s, spec, torch.ones_like(up), causal=True)", T_OC),
    ("oc-rho-unmasked", OC, "score_gradient(s, spec, up, causal=True), valid)", "score_gradient(s, spec, up, causal=True))", T_OC),
    ("oc-rho-non-causal", OC, "score_gradient(s, spec, up, causal=True)", "score_gradient(s, spec, up)", T_OC),
    ("oc-printed-mean", OC, 'f"{rho.median():.1e}", f"{rho.max():.1e}"', 'f"{rho.mean():.1e}", f"{rho.max():.1e}"', T_OC),
    ("oc-softmax-non-causal", OC, 'P_soft = attention_probs(s, "softmax", causal=True)', 'P_soft = attention_probs(s, "softmax")', T_OC),
    ("oc-cons-range-grad-ok", OC, 'if other := _given(args, "range_grad"):', "if other := []:", T_OC),
    ("oc-cons-T-2", OC, "if args.T is not None and args.T < 3:", "if args.T is not None and args.T < 2:", T_OC),
    ("oc-cons-K-and-ops", OC, "if args.K is not None and args.operators is not None:", "if False:", T_OC),
    ("oc-cons-K-0", OC, "any(K < 1 for K in args.K)", "any(K < 0 for K in args.K)", T_OC),
    ("oc-cons-T-default", OC, "T=args.T if args.T is not None else 64,", "T=args.T if args.T is not None else 32,", T_OC),
    ("oc-cons-seed-ignored", OC, 'seed=check_seed(args.seed if args.seed is not None else 0, "--seed")', 'seed=check_seed(0, "--seed")', T_OC),
    ("oc-verdict-always-pass", OC, 'verdict = "pass for all" if sm["shift_pass"] else "FAIL over"', 'verdict = "pass for all"', T_OC),
    ("oc-label-no-mode", OC, 'label = modes[mode], fam if len(modes) == 1 else f"{fam} {mode}"', "label = modes[mode], fam", T_OC),
    ("oc-median-no-range", OC, 'median = f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f} over K"', 'median = f"{lo:.3f}"', T_OC),
    ("oc-hard-inverted", OC, 'if modes["full"]["interior_keys"] is None]', 'if modes["full"]["interior_keys"] is not None]', T_OC),
    ("oc-no-keys-lost", OC, 'if modes["full"]["interior_keys"] == 0]', 'if modes["full"]["interior_keys"] == -1]', T_OC),
    ("oc-p1-always-yes", OC, 'same = "yes" if m["forward_equals_detach_all"] else "NO"', 'same = "yes"', T_OC),
    ("oc-rows-differs-bitwise", OC, 'False: "differs"}', 'False: "bitwise"}', T_OC),
    # ------------------------------------------------------------ suite/definition.py
    ("sd-seeds-empty", SD, "lambda v: isinstance(v, list) and v and all(map(is_seed, v)),", "lambda v: isinstance(v, list) and all(map(is_seed, v)),", T_SD),
    ("sd-posint-bool", SD, "_POS_INT = (lambda v: _is_int(v) and v >= 1,", "_POS_INT = (lambda v: isinstance(v, int) and v >= 1,", T_SD),
    ("sd-posint-zero", SD, "_POS_INT = (lambda v: _is_int(v) and v >= 1,", "_POS_INT = (lambda v: _is_int(v) and v >= 0,", T_SD),
    ("sd-posints-empty", SD, "lambda v: isinstance(v, list) and v and all(_is_int(x) and x >= 1 for x in v),", "lambda v: isinstance(v, list) and all(_is_int(x) and x >= 1 for x in v),", T_SD),
    ("sd-strs-any", SD, "all(isinstance(x, str) for x in v),", "any(isinstance(x, str) for x in v),", T_SD),
    ("sd-groups-not-tables", SD, "lambda v: isinstance(v, list) and v and all(isinstance(x, dict) for x in v),", "lambda v: isinstance(v, list) and v,", T_SD),
    ("sd-split-any-string", SD, "_SPLIT = (lambda v: v in SPLITS,", "_SPLIT = (lambda v: isinstance(v, str),", T_SD),
    ("sd-data-seed-posint", SD, '"seed": _SEED}', '"seed": _POS_INT}', T_SD),
    ("sd-geometry-blocks-zero", SD, '"geometry_blocks": _POS_INT}', '"geometry_blocks": _SEED}', T_SD),
    ("sd-checkpoints-optional", SD, '("name", "protocol", "seeds", "checkpoints", "group")', '("name", "protocol", "seeds", "group")', T_SD),
    ("sd-operators-optional", SD, 'GROUP_FIELDS, ("operators",))', "GROUP_FIELDS, ())", T_SD),
    ("sd-data-unchecked", SD, '    _check_fields(path, "[data]: ", d.get("data", {}), DATA_FIELDS)\n', "", T_SD),
    ("sd-eval-unchecked", SD, '    _check_fields(path, "[eval]: ", d.get("eval", {}), EVAL_FIELDS)\n', "", T_SD),
    ("sd-suite-overrides-unchecked", SD, '    _check_overrides(path, "[overrides]", d["protocol"], flatten(d.get("overrides", {})))\n', "", T_SD),
    ("sd-group-seeds-ignored", SD, 'seeds = g.get("seeds", d["seeds"])', 'seeds = d["seeds"]', T_SD),
    ("sd-suite-overrides-win", SD, 'overrides = {**flatten(d.get("overrides", {})), **flatten(g.get("overrides", {}))}', 'overrides = {**flatten(g.get("overrides", {})), **flatten(d.get("overrides", {}))}', T_SD),
    ("sd-group-overrides-only", SD, 'overrides = {**flatten(d.get("overrides", {})), **flatten(g.get("overrides", {}))}', 'overrides = flatten(g.get("overrides", {}))', T_SD),
    ("sd-group-checked-on-suite-protocol", SD, '_check_overrides(path, f"group {i}", g.get("protocol", d["protocol"]), overrides)', '_check_overrides(path, f"group {i}", d["protocol"], overrides)', T_SD),
    ("sd-group-arithmetic-ignored", SD, 'arithmetic = g.get("arithmetic", d.get("arithmetic"))', 'arithmetic = d.get("arithmetic")', T_SD),
    ("sd-K-placeholder-unchecked", SD, 'if "K" in g and "{K}" not in template:', "if False:", T_SD),
    ("sd-sdpa-unchecked", SD, "if op == SDPA:  # the one operator", "if False:  # the one operator", T_SD),
    ("sd-sdpa-operator-not-passed", SD, "overrides, operator=op)  # fmt: skip", "overrides)  # fmt: skip", T_SD),
    ("sd-run-id-unsafe", SD, 'run_id=f"{safe_name(op)}-s{seed}",', 'run_id=f"{op}-s{seed}",', T_SD),
    ("sd-group-name-lost", SD, 'group=g.get("name", f"group{i}"),', 'group=f"group{i}",', T_SD),
    ("sd-run-protocol-suite", SD, 'protocol=g.get("protocol", d["protocol"]),', 'protocol=d["protocol"],', T_SD),
    ("sd-run-checkpoints-suite", SD, 'checkpoints=int(g.get("checkpoints", d["checkpoints"])),', 'checkpoints=int(d["checkpoints"]),', T_SD),
    ("sd-duplicates-ok", SD, "    if dup:\n        variants", "    if False:\n        variants", T_SD),
    ("sd-variants-always", SD, ") > 1 for x in dup", ") > 0 for x in dup", T_SD),
    ("sd-title-default-empty", SD, 'title=d.get("title", d["name"]),', 'title=d.get("title", ""),', T_SD),
    ("sd-own-arithmetic-spacing", SD, r'given = re.search(r"[\[,]\s*arithmetic\s*=", name)', r'given = re.search(r"\[arithmetic=", name)', T_SD),
    ("sd-arithmetic-no-surrogate", SD, "if arithmetic and spec.surrogate is not None and not given:", "if arithmetic and not given:", T_SD),
    ("sd-placeholder-left", SD, '    if "{" in name:\n', "    if False:\n", T_SD),
    ("sd-run-fields-no-count", SD, 'RUN_FIELDS = {"name", "seed", "operator.name", "checkpoint.count", "data.dir"}', 'RUN_FIELDS = {"name", "seed", "operator.name", "data.dir"}', T_SD),
    ("sd-override-typeerror", SD, "except (ValueError, TypeError, FileNotFoundError) as err:", "except (ValueError, FileNotFoundError) as err:", T_SD),
    ("sd-unknown-suite-field-generic", SD, "    unknown = set(d) - SUITE_KEYS\n    if unknown:", "    unknown = set(d) - SUITE_KEYS\n    if False:", T_SD),
    ("sd-select-no-operator", SD, "p.fullmatch(r.run_id) or p.fullmatch(r.group) or p.fullmatch(r.operator)", "p.fullmatch(r.run_id) or p.fullmatch(r.group)", T_SD),
    ("sd-glob-question-literal", SD, '"." if c == "?" else', 're.escape(c) if c == "?" else', T_SD),
    ("sd-run-by-group", SD, "            if r.run_id == run_id:\n", "            if r.group == run_id:\n", T_SD),
    ("sd-n-jobs-runs", SD, "return sum(r.checkpoints for r in self.runs)", "return len(self.runs)", T_SD),
    ("sd-path-any-file", SD, 'if path.suffix == ".toml" and path.is_file():', "if path.is_file():", T_SD),
    ("sd-axes-tau-K", SD, '"tau": s.tau,', '"tau": s.K,', T_SD),
    # ------------------------------------------------------------ train/load.py
    ("ld-trained-op-base-name", LD, 'return op.get("full_name") or state["config"]["operator"]["name"]', 'return state["config"]["operator"]["name"]', T_LD),
    ("ld-ckpt-folder-none", LD, '        if checkpoint in (None, "latest"):\n            return path', '        if checkpoint == "latest":\n            return path', T_LD),
    ("ld-ckpt-folder-any-step", LD, "if int(checkpoint) == step:", "if True:", T_LD),
    ("ld-ckpt-folder-run-relative", LD, "for candidate in (Path(checkpoint), path.parent.parent / checkpoint):", "for candidate in (Path(checkpoint),):", T_LD),
    ("ld-ckpt-folder-any-dir", LD, "if candidate.is_dir() and candidate.samefile(path):", "if candidate.is_dir():", T_LD),
    ("ld-step-at-least", LD, "if checkpoint_step(p) == int(checkpoint)]", "if checkpoint_step(p) >= int(checkpoint)]", T_LD),
    ("ld-step-last", LD, "        return named[0]\n", "        return named[-1]\n", T_LD),
    ("ld-why-lost", LD, '(incomplete or damaged)" if folder.is_dir() else ""', '(incomplete or damaged)" if False else ""', T_LD),
    ("ld-two-folders-ok", LD, "if len(found) == 2 and not found[0].samefile(found[1]):", "if False:", T_LD),
    ("ld-same-folder-twice-refused", LD, "if len(found) == 2 and not found[0].samefile(found[1]):", "if len(found) == 2:", T_LD),
    ("ld-other-run-ok", LD, "if found[0].resolve().parent != checkpoint_dir(path).resolve():", "if False:", T_LD),
    ("ld-state-unverified", LD, "state = read_state(ckpt, verify=True)", "state = read_state(ckpt)", T_LD),
    ("ld-operator-ignored", LD, "op = parse_operator(operator if operator is not None else trained_operator(state))", "op = parse_operator(trained_operator(state))", T_LD),
    ("ld-typeerror-raw", LD, "except (KeyError, TypeError) as err:", "except KeyError as err:", T_LD),
    ("ld-backend-unchecked", LD, "resolve_backend(op, device, backend=backend)", "resolve_backend(op, device)", T_LD),
    ("ld-model-backend-auto", LD, "model = GPT(model_config, op, backend)", 'model = GPT(model_config, op, "auto")', T_LD),
    ("ld-train-mode", LD, "LoadedRun(model.to(device).eval(),", "LoadedRun(model.to(device),", T_LD),
    ("ld-mismatch-whole-error", LD, 'first = str(err).split("\\n\\t")[1] if "\\n\\t" in str(err) else str(err)', "first = str(err)", T_LD),
    ("ld-step-is-tokens", LD, 'return int(self.state["step"])', 'return int(self.state["tokens"])', T_LD),
    ("ld-load-not-strict", LD, "model.load_state_dict(weights)", "model.load_state_dict(weights, strict=False)", T_LD),
    ("ld-garbled-model-config", LD, "model_config = ModelConfig.from_dict(state[\"model_config\"])", "model_config = ModelConfig.from_dict(dict(state[\"model_config\"]))", T_LD),
    # ------------------------------------------------------------ data/synthetic.py
    ("sy-randint-never-hi", SY, "return lo + min(int(self.u() * (hi - lo + 1)), hi - lo)", "return lo + int(self.u() * (hi - lo))", T_SY),
    ("sy-distinct-dups", SY, "            if x not in out:\n", "            if True:\n", T_SY),
    ("sy-trigger-b-random", SY, "out += (self.trig_a[j], self.trig_b[j])", "out += (self.trig_a[j], self.trig_b[self.randint(0, 3)])", T_SY),
    ("sy-copy-short", SY, "COPY_AGAIN, *span, COPY_CLOSE]", "COPY_AGAIN, *span[1:], COPY_CLOSE]", T_SY),
    ("sy-span-length-1", SY, "range(self.randint(6, 16))]", "range(self.randint(1, 16))]", T_SY),
    ("sy-kv-wrong-value", SY, "out += [QUERY, keys[j], vals[j],", "out += [QUERY, keys[j], vals[(j + 1) % n],", T_SY),
    ("sy-kv-keys-repeat", SY, "keys = self.distinct(KEY0, N_KEYS, n)", "keys = [KEY0 + self.randint(0, N_KEYS - 1) for _ in range(n)]", T_SY),
    ("sy-kv-no-query", SY, "for _ in range(self.randint(2, n)):", "for _ in range(self.randint(0, n)):", T_SY),
    ("sy-depth-9", SY, "len(stack) < MAX_DEPTH)", "len(stack) <= MAX_DEPTH)", T_SY),
    ("sy-close-bottom", SY, "out.append(CLOSE0 + stack.pop())", "out.append(CLOSE0 + stack.pop(0))", T_SY),
    ("sy-tail-order", SY, "for kind in reversed(stack)]", "for kind in stack]", T_SY),
    ("sy-doc-short", SY, "target = self.randint(200, 499)", "target = self.randint(100, 499)", T_SY),
    ("sy-generate-uncut", SY, "return np.concatenate(parts)[:n_tokens] if parts", "return np.concatenate(parts) if parts", T_SY),
    ("sy-stream-seed-sum", SY, "np.random.default_rng([seed, stream])", "np.random.default_rng(seed + stream)", T_SY),
    ("sy-describe-close0-opener", SY, "elif OPEN0 <= t < CLOSE0:", "elif OPEN0 <= t <= CLOSE0:", T_SY),
    ("sy-describe-prefix-order", SY, '(("w", WORD0), ("t", TRIG0), ("v", VAL0), ("k", KEY0), ("?", 0))', '(("w", WORD0), ("v", VAL0), ("t", TRIG0), ("k", KEY0), ("?", 0))', T_SY),
    ("sy-zipf-uniform", SY, "** 1.1", "** 0.0", T_SY),
    ("sy-words-reach-eot", SY, "WORD0, N_WORDS = 180, EOT - 180", "WORD0, N_WORDS = 180, EOT - 179", T_SY),
]
# fmt: on


def run(name, path, old, new, tests) -> dict:
    f = ROOT / path
    orig = f.read_bytes()
    text = orig.decode()
    n = text.count(old)
    if n != 1:
        return dict(name=name, file=path, status=f"bad: {n} matches")
    t0 = time.time()
    try:
        f.write_text(text.replace(old, new, 1))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", *tests]
        cmd += ["-k", "not triton and not fused_kernel"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return dict(
                name=name, file=path, status="timeout", by=[], rc=None, secs=round(time.time() - t0, 1)
            )
        killed = r.returncode != 0
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return dict(name=name, file=path, status="killed" if killed else "survived", by=failed[:1],
                    rc=r.returncode, secs=round(time.time() - t0, 1))  # fmt: skip
    finally:
        f.write_bytes(orig)


def main(names: list[str]) -> None:
    done = set()
    if OUT.exists():
        done = {json.loads(x)["name"] for x in OUT.read_text().splitlines() if x.strip()}
    for m in MUTANTS:
        if (names and m[0] not in names) or m[0] in done or (FILES and not any(s in m[1] for s in FILES)):
            continue
        if STOP.exists():
            break
        res = run(*m)
        print(json.dumps(res), flush=True)
        with OUT.open("a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
