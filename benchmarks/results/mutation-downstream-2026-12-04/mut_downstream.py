# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of the downstream probes and their comparison, the lm-eval adapter, the sampler,
the training config's validation, the loose-runs report and the environment record.

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files (or test node ids) with ``-x -q`` and records killed (a test failed), survived, or timeout (the
per-mutant limit, ``$MUT_TIMEOUT`` seconds, 120 by default; counted as killed); the file is restored byte for
byte, also on an exception or a timeout. Run from the repository root (or a copy of it) with its ``src``
first on PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-downstream-2026-12-04/mut_downstream.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name, or
a path); mutants already there are skipped. ``$MUT_EXTRA``: more test files (space-separated) for every
mutant. Touch ``STOP`` beside the script to stop between mutants.
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
EXTRA = os.environ.get("MUT_EXTRA", "").split()  # more test files for every mutant
TIMEOUT = float(os.environ.get("MUT_TIMEOUT", "120"))

E = "src/kinterval/eval/"
DS, CMP, DC = E + "downstream.py", E + "downstream_compare.py", E + "downstream_commands.py"
AD, LC, SM = E + "lm_eval_adapter.py", E + "lm_eval_commands.py", E + "sample.py"
CF, RR, EN = (
    "src/kinterval/train/config.py",
    "src/kinterval/report/runs_report.py",
    "src/kinterval/environment.py",
)

T_CMP = ["tests/eval/test_downstream_compare.py"]
A = "tests/eval/test_lm_eval_adapter.py"
T_AD = [A]
T_DSA = T_CMP + [A + "::" + t for t in (
    "test_downstream_names_a_missing_include_path",
    "test_downstream_unknown_task_or_unreachable_hub_is_one_error_line",
    "test_downstream_finds_the_shipped_task_and_passes_its_seed",
)]  # fmt: skip
T_AD_LL = [A + "::" + t for t in (
    "test_continuation_longer_than_the_context_is_refused",
    "test_a_continuation_that_encodes_to_no_tokens_is_refused",
    "test_greedy_flag_needs_every_continuation_token_to_be_the_argmax",
    "test_batched_requests_of_different_lengths_score_as_single_ones",
    "test_multiple_choice_and_rolling_match_direct_nll",
    "test_rolling_loglikelihood_of_a_long_text_is_scored_in_disjoint_full_windows",  # added by this audit
)]  # fmt: skip
T_AD_GEN = [A + "::" + t for t in (
    "test_generation_keeps_the_last_block_size_tokens_of_a_long_context",
    "test_generation_stops_at_eot_a_multi_character_until_string_or_max_gen_toks",
    "test_generate_until_and_softmax_substitution",
)]  # fmt: skip
T_AD_ARGS = [A + "::" + t for t in (
    "test_model_args_are_checked_and_device_merged",
    "test_model_args_device_auto_is_resolved_as_load_run",
    "test_vocabulary_and_tokenizer_checked_before_scoring",
    "test_data_tokenized_with_another_bpe_file_named_gpt2_is_refused",
    "test_a_non_finite_loglikelihood_is_refused_naming_the_task_and_doc",
    "test_a_non_finite_loglikelihood_without_a_task_names_the_context",
)]  # fmt: skip
T_LC = ["tests/eval/test_lm_eval_commands.py"]
T_SM = ["tests/eval/test_sample.py"]
T_CF = ["tests/train/test_config_schedule.py"]
T_RR = ["tests/report/test_runs_report.py"]
T_EN = ["tests/train/test_environment_record.py"]

MUTANTS = [
    # ------------------------------------------------------------ downstream.py
    ("ds-item-greedy-bool-only", DS, 'r[1] in (True, "True")', "r[1] in (True,)", T_CMP),
    (
        "ds-numerics-unknown-all",
        DS,
        "if any(f not in rec for f in NUMERICS_FIELDS):",
        "if all(f not in rec for f in NUMERICS_FIELDS):",
        T_CMP,
    ),
    (
        "ds-batch-auto-zero",
        DS,
        'r"auto:[1-9][0-9]*"',
        'r"auto:[0-9]+"',
        T_CMP + [A + "::test_batch_size_must_be_positive"],
    ),
    (
        "ds-batch-zero",
        DS,
        "int(text) >= 1",
        "int(text) >= 0",
        T_CMP + [A + "::test_batch_size_must_be_positive"],
    ),
    ("ds-limit-zero", DS, "math.isfinite(limit) and limit > 0", "math.isfinite(limit) and limit >= 0", T_CMP),
    (
        "ds-limit-whole-from-3",
        DS,
        "(limit >= 1 and limit != int(limit))",
        "(limit >= 3 and limit != int(limit))",
        T_CMP,
    ),
    ("ds-fewshot-minus-one", DS, "or num_fewshot < 0):", "or num_fewshot < -1):", T_CMP),
    (
        "ds-fewshot-bool",
        DS,
        "if num_fewshot is not None and (isinstance(num_fewshot, bool) or not",
        "if num_fewshot is not None and (not",
        T_CMP,
    ),
    ("ds-fewshot-seed-fixed", DS, "fewshot_random_seed=seed)", "fewshot_random_seed=0)", T_DSA),
    (
        "ds-include-path-unchecked",
        DS,
        "if include_path is not None and not Path(include_path).is_dir():",
        "if False:",
        T_DSA,
    ),
    (
        "ds-hub-error-uncaught",
        DS,
        "except ConnectionError as err:",
        "except ZeroDivisionError as err:",
        T_DSA,
    ),
    ("ds-summary-native-key", DS, '"native_operator": native', '"native": native', T_DSA),
    ("ds-summary-task-fewshot-empty", DS, '"task_num_fewshot": shots', '"task_num_fewshot": {}', T_DSA),
    (
        "ds-items-unsorted",
        DS,
        'for s in sorted(samples, key=lambda s: s["doc_id"])',
        "for s in samples",
        T_DSA,
    ),
    ("ds-begin-old-tasks-kept", DS, 'names = old.get("files_sha256") or {', "names = {} or {", T_CMP),
    (
        "ds-begin-old-tasks-only-sha",
        DS,
        'f"{t}.jsonl": None for t in old.get("tasks") or [] if isinstance(t, str)',
        'f"{t}.jsonl": None for t in []',
        T_CMP,
    ),
    (
        "ds-begin-any-path",
        DS,
        'and name.endswith(".jsonl") and Path(name).name == name:',
        'and name.endswith(".jsonl"):',
        T_CMP,
    ),
    (
        "ds-fewshot-no-config-fallback",
        DS,
        "if k is None and isinstance(configs, dict)",
        "if False and isinstance(configs, dict)",
        T_CMP,
    ),
    (
        "ds-count-zero-unknown",
        DS,
        "and not isinstance(x, bool) and x >= 0 else None",
        "and not isinstance(x, bool) and x > 0 else None",
        T_CMP,
    ),
    # ------------------------------------------------------------ downstream_compare.py
    (
        "cmp-sha-unchecked",
        CMP,
        "if isinstance(recorded, dict) and recorded[path.name] != atomic.sha256_bytes(data):",
        "if False:",
        T_CMP,
    ),
    (
        "cmp-mc-summed",
        CMP,
        'if rec.get("loglikelihoods") and "is_greedy" not in rec:',
        'if rec.get("loglikelihoods"):',
        T_CMP,
    ),
    ("cmp-nonfinite-nan-only", CMP, "if not math.isfinite(v))", "if math.isnan(v))", T_CMP),
    (
        "cmp-filters-gt2",
        CMP,
        "several = len({f for _, f in logged}) > 1",
        "several = len({f for _, f in logged}) > 2",
        T_CMP,
    ),
    (
        "cmp-filter-target-unchecked",
        CMP,
        "            if old_target != target:\n",
        "            if False:\n",
        T_CMP,
    ),
    (
        "cmp-recorded-missing-unchecked",
        CMP,
        "missing = sorted(set(recorded) - {p.name for p in files.values()})",
        "missing = []",
        T_CMP,
    ),
    (
        "cmp-fewshot-per-task-ignored",
        CMP,
        "return {t: _count(per_task.get(t)) for t in tasks}",
        'return {t: _count(rec.get("num_fewshot")) for t in tasks}',
        T_CMP,
    ),
    (
        "cmp-fewshot-disagree-min",
        CMP,
        "next(iter(k)) if len(k) == 1 else None",
        "min(k) if k else None",
        T_CMP,
    ),
    (
        "cmp-fewshot-unknown-counted",
        CMP,
        "known = {name: s[t] for name, s in shots.items() if s[t] is not None}",
        "known = {name: s[t] for name, s in shots.items()}",
        T_CMP,
    ),
    (
        "cmp-items-target-unchecked",
        CMP,
        "if ta is not None and tb is not None and ta != tb:",
        "if False:",
        T_CMP,
    ),
    (
        "cmp-items-metrics-unchecked",
        CMP,
        "            if set(ma) != set(mb):\n",
        "            if False:\n",
        T_CMP,
    ),
    (
        "cmp-weighted-mean-over-n",
        CMP,
        "float(np.sum(w * x) / np.sum(w))",
        "float(np.sum(w * x) / len(x))",
        T_CMP,
    ),
    (
        "cmp-weighted-perm-unweighted",
        CMP,
        "p = permutation_p_random(w * d, n=n_perm, seed=seed)",
        "p = permutation_p_random(d, n=n_perm, seed=seed)",
        T_CMP,
    ),
    (
        "cmp-ci-one-item",
        CMP,
        "if len(d) >= 2 and np.any(d != 0):",
        "if len(d) >= 1 and np.any(d != 0):",
        T_CMP,
    ),
    ("cmp-zero-diff-no-ci", CMP, "row.update(lo=0.0, hi=0.0)", "pass", T_CMP),
    (
        "cmp-mark-degree-inverted",
        CMP,
        '("°" if lab.detectable else "")',
        '("°" if not lab.detectable else "")',
        T_CMP,
    ),
    (
        "cmp-taskdiff-target-unchecked",
        CMP,
        "            if ia[i][0] != ib[i][0]:\n",
        "            if False:\n",
        T_CMP,
    ),
    ("cmp-taskdiff-acc-optional", CMP, "if DIFF_METRICS[0] not in metrics:", "if not metrics:", T_CMP),
    ("cmp-taskdiff-twice", CMP, "if tuple(pair) in pairs:", "if False:", T_CMP),
    (
        "cmp-primary-paper-wins",
        CMP,
        "{**PRIMARY_METRICS, **(primary or {})}",
        "{**(primary or {}), **PRIMARY_METRICS}",
        T_CMP,
    ),
    (
        "cmp-group-blimp-counted",
        CMP,
        'if task.startswith(BLIMP_PREFIX) or "\\u2212" in task:',
        'if "\\u2212" in task:',
        T_CMP,
    ),
    (
        "cmp-group-q-sign",
        CMP,
        'g["q05_negative" if r["diff"] < 0 else "q05_positive"]',
        'g["q05_negative" if r["diff"] > 0 else "q05_positive"]',
        T_CMP,
    ),
    (
        "cmp-group-skipped-none",
        CMP,
        'g["skipped_tasks"] = [t for t in g["tasks"] if (t, primary_metric(t, primary)) not in have]',
        'g["skipped_tasks"] = []',
        T_CMP,
    ),
    (
        "cmp-group-detectable-nonzero",
        CMP,
        'g["detectable"] += bool(r["detectable"])',
        'g["detectable"] += r["diff"] != 0',
        T_CMP,
    ),
    (
        "cmp-groups-missing-ok",
        CMP,
        "missing = [c for c in conditions if c not in group_of]",
        "missing = []",
        T_CMP,
    ),
    (
        "cmp-blimp-item-pooled",
        CMP,
        "w = np.array([1.0 / len(base[t]) for t, _ in keys])",
        "w = np.ones(len(keys))",
        T_CMP,
    ),
    ("cmp-family-size-all", CMP, "family_size=len(rows)", "family_size=len(families)", T_CMP),
    (
        "cmp-group-order-by-name",
        CMP,
        'key=lambda r: order[r["group"]])',
        'key=lambda r: r["condition"])',
        T_CMP,
    ),
    ("cmp-warn-all-old", CMP, "if len(unknown) < len(records):", "if True:", T_CMP),
    # ------------------------------------------------------------ downstream_commands.py
    (
        "dc-condition-empty-name",
        DC,
        "(name, path) if sep and name and path else (arg, arg)",
        "(name, path) if sep else (arg, arg)",
        T_CMP,
    ),
    ("dc-groups-twice", DC, "if name.strip() in groups:", "if False:", T_CMP),
    ("dc-primary-empty", DC, "if not sep or not task or not metric:", "if not sep:", T_CMP),
    (
        "dc-counts-zero",
        DC,
        "or not isinstance(n, int) or n < 1:",
        "or not isinstance(n, int) or n < 0:",
        T_CMP,
    ),
    ("dc-json-target-unchecked", DC, "        atomic.check_target(args.json)\n", "        pass\n", T_CMP),
    (
        "dc-out-ignores-operator",
        DC,
        'str(Path(args.run) / "downstream" / (args.operator or "native"))',
        'str(Path(args.run) / "downstream" / "native")',
        T_CMP,
    ),
    (
        "dc-tasks-unstripped",
        DC,
        'tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]',
        'tasks = args.tasks.split(",")',
        T_CMP,
    ),
    # ------------------------------------------------------------ lm_eval_adapter.py
    (
        "ad-window-one-short",
        AD,
        "full = (ctx + cont)[-(self.max_length + 1) :]",
        "full = (ctx + cont)[-self.max_length :]",
        T_AD_LL,
    ),
    (
        "ad-positions-shifted",
        AD,
        "torch.arange(len(inp) - len(cont), len(inp), device",
        "torch.arange(len(inp) - len(cont) - 1, len(inp) - 1, device",
        T_AD_LL,
    ),
    ("ad-empty-cont-scored", AD, "                if not cont:", "                if False:", T_AD_LL),
    (
        "ad-rolling-context-2",
        AD,
        "max_seq_len=self.max_length, context_len=1,",
        "max_seq_len=self.max_length, context_len=2,",
        T_AD_LL,
    ),
    (
        "ad-gen-crop-first",
        AD,
        "(tokens + new)[-self.max_length :]",
        "(tokens + new)[: self.max_length]",
        T_AD_GEN,
    ),
    ("ad-gen-eot-ignored", AD, "                if nxt == EOT:\n", "                if False:\n", T_AD_GEN),
    ("ad-gen-until-kept", AD, "text = text.split(u)[0]", "text = text", T_AD_GEN),
    ("ad-args-lm-eval-wins", AD, "args.setdefault(key, value)", "args[key] = value", T_AD_ARGS),
    (
        "ad-meta-sha-required",
        AD,
        'tokenizer.get("sha256") not in (None, GPT2_BPE_SHA256)',
        'tokenizer.get("sha256") not in (GPT2_BPE_SHA256,)',
        T_AD_ARGS,
    ),
    (
        "ad-finite-inf-ok",
        AD,
        "    if math.isfinite(ll):\n        return",
        "    if not math.isnan(ll):\n        return",
        T_AD_ARGS,
    ),
    # ------------------------------------------------------------ lm_eval_commands.py
    ("lc-device-always-cpu", LC, '"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"', T_LC),
    (
        "lc-include-path-eq-form",
        LC,
        'a == "--include_path" or a.startswith("--include_path=")',
        'a == "--include_path"',
        T_LC,
    ),
    ("lc-model-short-flag", LC, 'a == "--model" or a.startswith(("--model=", "-M"))', 'a == "--model"', T_LC),
    (
        "lc-tasks-short-flags",
        LC,
        '{"--tasks", "-t", "--config", "-C", "--help", "-h"}',
        '{"--tasks", "--config", "--help"}',
        T_LC,
    ),
    ("lc-any-value-error-wrapped", LC, 'if not _raised_in(err, "lm_eval.config."):', "if False:", T_LC),
    (
        "lc-exit-message-zero",
        LC,
        "return exit_.code if isinstance(exit_.code, int) else 1",
        "return exit_.code if isinstance(exit_.code, int) else 0",
        T_LC,
    ),
    # ------------------------------------------------------------ sample.py
    ("sm-crop-first", SM, "idx[:, -model.config.block_size :]", "idx[:, : model.config.block_size]", T_SM),
    ("sm-topk-ties-dropped", SM, "logits < kth", "logits <= kth", T_SM),
    (
        "sm-topk-unguarded",
        SM,
        "if top_k is not None and top_k < logits.size(-1):",
        "if top_k is not None:",
        T_SM,
    ),
    ("sm-empty-prompt-no-eot", SM, "or [EOT]", "or []", T_SM),
    ("sm-prompt-id-vocab-ok", SM, "not 0 <= i < vocab", "not 0 <= i <= vocab", T_SM),
    ("sm-samples-zero", SM, "or samples < 1:", "or samples < 0:", T_SM),
    ("sm-eot-as-text", SM, 'allowed_special={"<|endoftext|>"}', "disallowed_special=()", T_SM),
    # ------------------------------------------------------------ train/config.py
    ("cf-warmup-equal-ok", CF, "if s.warmup_tokens >= s.tokens:", "if s.warmup_tokens > s.tokens:", T_CF),
    (
        "cf-beta1-closed",
        CF,
        '_num("optim.beta1", o.beta1, lo=0, hi=1, open_hi=True)',
        '_num("optim.beta1", o.beta1, lo=0, hi=1)',
        T_CF,
    ),
    (
        "cf-eps-closed",
        CF,
        '_num("optim.eps", o.eps, lo=0, open_lo=True)',
        '_num("optim.eps", o.eps, lo=0)',
        T_CF,
    ),
    ("cf-accum-zero", CF, '_int("schedule.accum", s.accum, 1)', '_int("schedule.accum", s.accum, 0)', T_CF),
    (
        "cf-eval-every-negative",
        CF,
        '_int("log.eval_every", self.log.eval_every, 0)',
        '_int("log.eval_every", self.log.eval_every, -5)',
        T_CF,
    ),
    (
        "cf-weight-decay-unbounded",
        CF,
        '_num("optim.weight_decay", o.weight_decay, lo=0)',
        '_num("optim.weight_decay", o.weight_decay)',
        T_CF,
    ),
    (
        "cf-grad-clip-unbounded",
        CF,
        '_num("optim.grad_clip", o.grad_clip, lo=0)',
        '_num("optim.grad_clip", o.grad_clip)',
        T_CF,
    ),
    (
        "cf-override-replaces-section",
        CF,
        'out.update(flatten(v, f"{prefix}{k}."))',
        'out[f"{prefix}{k}"] = v',
        T_CF,
    ),
    (
        "cf-override-unknown-leaf",
        CF,
        "            if [node, *path][-1] not in target:\n",
        "            if False:\n",
        T_CF,
    ),
    (
        "cf-toml-path-falls-back",
        CF,
        "if len(path.parts) != 1 or not named.is_file():",
        "if not named.is_file():",
        T_CF,
    ),
    (
        "cf-sdpa-sinks-ok",
        CF,
        "(model.attn_softcap is not None or model.attn_sinks)",
        "(model.attn_softcap is not None)",
        T_CF,
    ),
    ("cf-device-empty-index", CF, 'r"cuda:\\d+"', 'r"cuda:\\d*"', T_CF),
    (
        "cf-block-size-preset-only",
        CF,
        "return self.model.block_size or PRESETS[self.model.preset].block_size",
        "return PRESETS[self.model.preset].block_size",
        T_CF,
    ),
    # ------------------------------------------------------------ report/runs_report.py
    (
        "rr-tokens-per-step-off",
        RR,
        'int(summary.get("tokens", 0)) // step if',
        'int(summary.get("tokens", 0)) // (step + 1) if',
        T_RR,
    ),
    (
        "rr-traj-any-blocks",
        RR,
        'if s.get("request", {}).get("max_blocks") == summary["request"].get("max_blocks"):',
        "if True:",
        T_RR,
    ),
    ("rr-note-seed-dropped", RR, "    if e.seed != control.seed:\n", "    if False:\n", T_RR),
    (
        "rr-note-batch-dropped",
        RR,
        "if e.tokens_per_step and control.tokens_per_step and e.tokens_per_step != control.tokens_per_step:",
        "if False:",
        T_RR,
    ),
    (
        "rr-max-blocks-may-differ",
        RR,
        'MAY_DIFFER = ("operator", "doc_clusters")',
        'MAY_DIFFER = ("operator", "doc_clusters", "max_blocks")',
        T_RR,
    ),
    ("rr-traj-one-point", RR, "if len(e.trajectory) > 1}", "if len(e.trajectory) > 0}", T_RR),
    ("rr-control-own-name", RR, '("softmax" if e is control else e.operator)', "(e.operator)", T_RR),
    (
        "rr-data-note-unrecorded",
        RR,
        "if e.train_data and control.train_data and e.train_data != control.train_data:",
        "if e.train_data != control.train_data:",
        T_RR,
    ),
    # ------------------------------------------------------------ environment.py
    (
        "env-step-bool-ok",
        EN,
        "if not isinstance(step, int) or isinstance(step, bool):",
        "if not isinstance(step, int):",
        T_EN,
    ),
    ("env-processes-one", EN, '"processes": int(processes)', '"processes": 1', T_EN),
    (
        "env-blank-line-refused",
        EN,
        "        if not line.strip():\n            continue",
        "        if False:\n            continue",
        T_EN,
    ),
    # --- round 2 (run on the tests with the round-1 additions, and on the fixed product code)
    (
        "lc-exit-none-fails",
        LC,
        "    if code is None:\n        return 0",
        "    if code is None:\n        return 1",
        T_LC,
    ),
    ("lc-exit-message-unprinted", LC, "    print(code, file=sys.stderr)\n    return 1", "    return 1", T_LC),
    ("sm-seed-unchecked", SM, '    check_seed(seed, "seed")', "    pass", T_SM),
    (
        "cf-preset-type-unchecked",
        CF,
        "if not isinstance(self.model.preset, str) or self.model.preset not in PRESETS:",
        "if self.model.preset not in PRESETS:",
        T_CF,
    ),
    (
        "cf-override-none-set",
        CF,
        "            if value is None:\n                continue",
        "            if False:\n                continue",
        T_CF,
    ),
    ("cmp-group-q-le", CMP, '        if r["q"] < 0.05:\n', '        if r["q"] <= 0.05:\n', T_CMP),
    (
        "cmp-group-zero-negative",
        CMP,
        'g["negative"] += r["diff"] < 0',
        'g["negative"] += r["diff"] <= 0',
        T_CMP,
    ),
    (
        "cmp-groups-string-members",
        CMP,
        "if isinstance(members, str) or not members:",
        "if not members:",
        T_CMP,
    ),
    ("cmp-blimp-paradigms-items", CMP, "paradigms=len(paradigms)", "paradigms=len(keys)", T_CMP),
    (
        "cmp-results-record-any-json",
        CMP,
        "return rec if isinstance(rec, dict) else None",
        "return rec",
        T_CMP,
    ),
    (
        "ds-fewshot-nshot-ignored",
        DS,
        "k = _count(shots.get(task)) if isinstance(shots, dict) else None",
        "k = None",
        T_CMP,
    ),
    ("ds-seed-unchecked", DS, '    check_seed(seed, "--seed")\n', "    pass\n", T_CMP),
    (
        "ad-rolling-finite-unchecked",
        AD,
        "            check_finite(out[-1], req)",
        "            pass",
        T_AD_ARGS,
    ),
    ("ad-vocab-unchecked", AD, "    if vocab_size != GPT2_VOCAB:", "    if False:", T_AD_ARGS),
    ("rr-note-tokens-dropped", RR, "    if e.tokens != control.tokens:", "    if False:", T_RR),
    # on the fixed _results_record (cmp-results-record-any-json's line is gone)
    (
        "cmp-results-record-nonobject-ok",
        CMP,
        "    if not isinstance(rec, dict):  # damaged",
        "    if False:  # damaged",
        T_CMP,
    ),
]


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
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests, *EXTRA]
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
        if (names and m[0] not in names) or m[0] in done:
            continue
        if STOP.exists():
            break
        res = run(*m)
        print(json.dumps(res), flush=True)
        with OUT.open("a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
