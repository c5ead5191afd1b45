# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of the report's figures, tab:hardware / tab:dstack, the MiniLM report, the command
line's entry point (exit statuses, error lines, empty paths, warnings), number lists and atomic writes / hashes.

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files with ``-x -q`` and records killed (a test failed), survived, or timeout (``$MUT_TIMEOUT`` seconds,
90 by default; counted as killed); the file is restored byte for byte, also on an exception or a timeout.
Run from the repository root (or a copy of it) with its ``src`` first on PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-rest-2026-12-04/mut_rest.py [NAME ...]

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
TIMEOUT = float(os.environ.get("MUT_TIMEOUT", "90"))

FG, HW, ML = (
    "src/kinterval/report/figures.py",
    "src/kinterval/report/analysis/hardware.py",
    "src/kinterval/integrations/minilm_report.py",
)
CL, AL, AT = "src/kinterval/cli.py", "src/kinterval/arglists.py", "src/kinterval/atomic.py"
DC, DT = "src/kinterval/demo.py", "src/kinterval/train/demo.py"

T_FG = ["tests/report/test_figures.py"]
T_KF = T_FG + ["tests/report/test_kfigures.py"]
T_HW = ["tests/report/test_hardware_table.py"]
T_ML = ["tests/integrations/test_minilm_report_cli.py", "tests/integrations/test_hf.py", "-k", "minilm"]
T_AT = ["tests/test_io_failures.py", "tests/test_atomic_target.py", "tests/test_atomic_writes.py"]
T_CL = (
    ["tests/test_cli_walk.py", "tests/data/test_data_cli.py"]
    + T_AT
    + ["tests/suite/test_suite_commands.py::test_output_into_a_closed_pipe_stops_quietly"]
)
T_AL = ["tests/test_cli_walk.py"]
# the demo's tests but its 30 s end-to-end run (round 2); $MUT_E2E=1 adds it (the rerun of the survivors)
T_DM = [
    "tests/train/test_demo_benchmark.py",
    "tests/train/test_train_commands.py",
    "-k",
    "demo" if os.environ.get("MUT_E2E") == "1" else "demo and not end_to_end",
]

# fmt: off
MUTANTS = [
    # ------------------------------------------------------------ report/figures.py
    ("fg-geometry-span-key", FG, '("span", "row span M − m (score units, log)", True)', '("h", "row span M − m (score units, log)", True)', T_FG),
    ("fg-geometry-tv-log", FG, '("tv", "TV(native, softmax)", False)', '("tv", "TV(native, softmax)", True)', T_FG),
    ("fg-panel-letters-shifted", FG, 'zip(panels, "abcdefgh")', 'zip(panels, "bcdefgh")', T_KF),
    ("fg-save-never-closed", FG, "    finally:\n        plt.close(fig)\n", "    finally:\n        pass\n", T_FG),
    ("fg-save-names-the-folder", FG, "with atomic.naming(path):", "with atomic.naming(path.parent):", T_FG),
    ("fg-colours-first-seen-order", FG, "names = sorted(set(labels))", "names = list(dict.fromkeys(labels))", T_FG),
    ("fg-symlog-flipped", FG, "if max((abs(v) for v in values), default=0.0) > linthresh:", "if max((abs(v) for v in values), default=0.0) < linthresh:", T_FG),
    ("fg-symlog-decades-only", FG, "SymmetricalLogLocator(linthresh=linthresh, base=10, subs=(1.0, 2.0, 5.0))", "SymmetricalLogLocator(linthresh=linthresh, base=10, subs=(1.0,))", T_FG),
    ("fg-tokens-xlabel", FG, 'ax.set_xlabel("training tokens")', 'ax.set_xlabel("training steps")', T_FG),
    ("fg-traj-band-from-mean", FG, "ax.fill_between(t, [p[2] for p in pts], [p[3] for p in pts]", "ax.fill_between(t, [p[1] for p in pts], [p[3] for p in pts]", T_FG),
    ("fg-traj-ylabel-default", FG, '    ylabel: str = "ΔNLL vs softmax (nats/token)",', '    ylabel: str = "NLL (nats/token)",', T_FG),
    ("fg-traj-colours-ignored", FG, "t, [p[1] for p in pts], marker=\"o\", ms=3, lw=1.2, label=op, color=(colours or {}).get(op)", "t, [p[1] for p in pts], marker=\"o\", ms=3, lw=1.2, label=op, color=None", T_FG),
    ("fg-geometry-nan-kept", FG, "if g.get(key) is not None and g.get(key) == g.get(key)]", "if g.get(key) is not None]", T_FG),
    ("fg-geometry-log-or", FG, "if log and any(line.get_ydata().min() > 0 for line in ax.get_lines()):", "if log or any(line.get_ydata().min() > 0 for line in ax.get_lines()):", T_FG),
    ("fg-geometry-legend-from-h", FG, "    handles, labels = axes[0].get_legend_handles_labels()\n    fig.legend(handles, labels, fontsize=7, loc=\"lower center\", frameon=False, ncol=ncol)", "    handles, labels = axes[1].get_legend_handles_labels()\n    fig.legend(handles, labels, fontsize=7, loc=\"lower center\", frameon=False, ncol=ncol)", T_FG),
    ("fg-endpoint-err-swapped", FG, 'err = [[r["delta"] - r["lo"] for r in rows], [r["hi"] - r["delta"] for r in rows]]', 'err = [[r["hi"] - r["delta"] for r in rows], [r["delta"] - r["lo"] for r in rows]]', T_FG),
    ("fg-endpoint-labels-reversed", FG, 'ax.set_yticks(y, [r["operator"] for r in rows], fontsize=8)', 'ax.set_yticks(y, [r["operator"] for r in reversed(rows)], fontsize=8)', T_FG),
    ("fg-widthgap-axes-swapped", FG, '((axes[0], 0, "native width h (log)"), (axes[1], 1, "row span M − m (log)"))', '((axes[0], 1, "native width h (log)"), (axes[1], 0, "row span M − m (log)"))', T_FG),
    ("fg-widthgap-zero-kept", FG, "if v[i] is not None and v[i] > 0]", "if v[i] is not None]", T_FG),
    ("fg-validation-control-solid", FG, "axes[0].plot(v.tokens, v.control_val_loss, ls=\"--\"", "axes[0].plot(v.tokens, v.control_val_loss, ls=\"-\"", T_FG),
    ("fg-validation-span-control-is-own", FG, "axes[1].plot(v.tokens, v.control_row_span,", "axes[1].plot(v.tokens, v.row_span,", T_FG),
    ("fg-validation-span-linear", FG, '        axes[1].set_yscale("log")', '        axes[1].set_yscale("linear")', T_FG),
    ("fg-validation-diffs-unscaled", FG, "        diffs += v.diff\n", "        diffs += []\n", T_FG),
    ("fg-interval-yerr-swapped", FG, "yerr=[[e.mean - e.lo], [e.hi - e.mean]],", "yerr=[[e.hi - e.mean], [e.mean - e.lo]],", T_FG),
    ("fg-seeds-sd-se-axes-swapped", FG, "xy = [(r.est.eval_se, r.est.sd) for r in conditions.values()", "xy = [(r.est.sd, r.est.eval_se) for r in conditions.values()", T_FG),
    ("fg-seeds-effect-line-lo", FG, "[by_K[K].est.mean for K in Ks],", "[by_K[K].est.lo for K in Ks],", T_FG),
    ("fg-factorial-offsets-swapped", FG, '(("MinMax", -0.04), ("FWM", 0.04))', '(("MinMax", 0.04), ("FWM", -0.04))', T_KF),
    ("fg-factorial-mm-p-as-weight", FG, '"mm_p": ("MinMax", 1, "#c44e52"),', '"mm_p": ("MinMax", 0, "#c44e52"),', T_KF),
    ("fg-factorial-lerp-lo", FG, 'ax.axhline(cells[K]["lerp"].est.mean, color="grey"', 'ax.axhline(cells[K]["lerp"].est.lo, color="grey"', T_KF),
    ("fg-factorial-families-never-not-run", FG, "    if not families:\n", "    if False:\n", T_KF),
    ("fg-factorial-surrogate-empty-drawn", FG, "    if not surrogate:\n", "    if surrogate is None:\n", T_KF),
    ("fg-factorial-xticks-swapped", FG, 'ax.set_xticks([0, 1], ["Weight-STE", "Prob-STE"])', 'ax.set_xticks([0, 1], ["Prob-STE", "Weight-STE"])', T_KF),
    ("fg-factorial-family-line-hi", FG, "[by_K[K].est.mean for K in ks], color=f\"C{j}\"", "[by_K[K].est.hi for K in ks], color=f\"C{j}\"", T_KF),
    ("fg-k-colour-sorted", FG, 'family_colour = {fam: f"C{j}" for j, fam in enumerate(final)}', 'family_colour = {fam: f"C{j}" for j, fam in enumerate(sorted(final))}', T_KF),
    ("fg-k-not-run-wrong-letter", FG, '_not_run(ax, not_run.get(letter, "no runs"))', '_not_run(ax, not_run.get("b", "no runs"))', T_KF),
    ("fg-k-c-symlog", FG, '        if letter == "b":\n', '        if True:\n', T_KF),
    ("fg-k-band-lo-mean", FG, "lo, hi = [r.est.lo for r in rows], [r.est.hi for r in rows]", "lo, hi = [r.est.mean for r in rows], [r.est.hi for r in rows]", T_KF),
    ("fg-k-joined-from-three", FG, "        if len(xs) > 1:\n", "        if len(xs) > 2:\n", T_KF),
    ("fg-k-x-checkpoint-index", FG, "t = [r.tokens for r in rows]", "t = list(range(len(rows)))", T_KF),
    # ------------------------------------------------------------ report/analysis/hardware.py
    ("hw-no-cuda-field", HW, 'STACK_FIELDS = ("device_name", "processes", "torch", "cuda", "python")', 'STACK_FIELDS = ("device_name", "processes", "torch", "python")', T_HW),
    ("hw-missing-field-none", HW, "return tuple(session.get(f, NOT_RECORDED) for f in STACK_FIELDS)", "return tuple(session.get(f) for f in STACK_FIELDS)", T_HW),
    ("hw-count-zero-ok", HW, "and value >= 1 else None", "and value >= 0 else None", T_HW),
    ("hw-number-zero-refused", HW, "and 0 <= value < float(\"inf\")", "and 0 < value < float(\"inf\")", T_HW),
    ("hw-zero-share-refused", HW, "if starts[0] == 0 and min(shares) >= 0:", "if starts[0] == 0 and min(shares) > 0:", T_HW),
    ("hw-first-start-unchecked", HW, "if starts[0] == 0 and min(shares) >= 0:", "if min(shares) >= 0:", T_HW),
    ("hw-fallback-last-count", HW, "first = counts[0] if counts else None", "first = counts[-1] if counts else None", T_HW),
    ("hw-fallback-world-first", HW, "return rec.train_s * (first or rec.world_size or 1)", "return rec.train_s * (rec.world_size or first or 1)", T_HW),
    ("hw-label-lexical", HW, 'label = "+".join(sorted(set(own), key=lambda s: int(s[1:]))) or NOT_RECORDED', 'label = "+".join(sorted(set(own))) or NOT_RECORDED', T_HW),
    ("hw-run-key-no-suite", HW, 'hw.run_stacks[f"{res.suite}/{rec.run_id}"] = label', "hw.run_stacks[rec.run_id] = label", T_HW),
    ("hw-groups-across-suites", HW, "row = groups.get((res.suite, rec.group))", "row = next((r for r in hw.rows if r.group == rec.group), None)", T_HW),
    ("hw-row-stack-count-1", HW, "row.stacks[label] = row.stacks.get(label, 0) + 1", "row.stacks[label] = 1", T_HW),
    ("hw-eval-devices-repeated", HW, "if d not in row.eval_devices:", "if True:", T_HW),
    ("hw-timed-runs-not-counted", HW, "row.timed_runs += 1", "row.timed_runs += 0", T_HW),
    ("hw-hours-in-minutes", HW, "process_seconds(rec) / 3600", "process_seconds(rec) / 60", T_HW),
    ("hw-family-count-1", HW, "counts[label] = counts.get(label, 0) + 1", "counts[label] = 1", T_HW),
    ("hw-family-is-operator", HW, "family = operator_family(rec.operator)", "family = rec.operator", T_HW),
    ("hw-devices-unsorted", HW, "row.eval_devices = sorted(d for d in row.eval_devices if d != NOT_RECORDED) + [", "row.eval_devices = list(d for d in row.eval_devices if d != NOT_RECORDED) + [", T_HW),
    ("hw-device-none", HW, "append(p.device_name or NOT_RECORDED)", "append(p.device_name)", T_HW),
    ("hw-columns-not-recorded-first", HW, "return [x for x in labels if x != NOT_RECORDED] + [x for x in labels if x == NOT_RECORDED]", "return labels", T_HW),
    ("hw-recorded-inverted", HW, "return any(label != NOT_RECORDED for label in self.run_stacks.values())", "return any(label == NOT_RECORDED for label in self.run_stacks.values())", T_HW),
    ("hw-family-order-alpha", HW, "key=lambda kv: operator_order(kv[0])", "key=lambda kv: kv[0]", T_HW),
    # ------------------------------------------------------------ integrations/minilm_report.py
    ("ml-pool-padding", ML, "(hidden * m).sum(1) / m.sum(1)", "hidden.mean(1)", T_ML),
    ("ml-normalise-batch", ML, "(hidden * m).sum(1) / m.sum(1), dim=-1)", "(hidden * m).sum(1) / m.sum(1), dim=0)", T_ML),
    ("ml-no-softmax-row", ML, 'ops = ["softmax"] + [f"{f}-k{k}" for f in families for k in ks]', 'ops = [f"{f}-k{k}" for f in families for k in ks]', T_ML),
    ("ml-mean-min-swapped", ML, '"mean_cos": cos.mean().item(), "min_cos": cos.min().item()', '"mean_cos": cos.min().item(), "min_cos": cos.mean().item()', T_ML),
    ("ml-max-tokens-min", ML, 'int(batch["attention_mask"].sum(1).max())', 'int(batch["attention_mask"].sum(1).min())', T_ML),
    ("ml-ref-not-softmax-switch", ML, "with hf.expect_kinterval(name):", "with torch.no_grad():", T_ML),
    ("ml-rows-sorted-alpha", ML, "families.sort(key=lambda f: FAMILIES.index(f) if f in FAMILIES else len(FAMILIES))", "families.sort()", T_ML),
    ("ml-cell-min-mean-swapped", ML, "f\"{c['mean_cos']:.4f} ({c['min_cos']:.3f})\"", "f\"{c['min_cos']:.4f} ({c['mean_cos']:.3f})\"", T_ML),
    ("ml-softmax-line-min-is-mean", ML, "min {soft['min_cos']:.7f}", "min {soft['mean_cos']:.7f}", T_ML),
    ("ml-ks-zero-ok", ML, "if not ks or min(ks) < 1:", "if not ks or min(ks) < 0:", T_ML),
    ("ml-ks-default-ignored", ML, "result = run(families, args.ks)", "result = run(families, KS)", T_ML),
    ("ml-importerror-traceback", ML, "except ImportError as err:  # a package", "except RuntimeError as err:  # a package", T_ML),
    ("ml-train-mode", ML, "attn_implementation=impl).eval()", "attn_implementation=impl)", T_ML),
    ("ml-model-subfolder", ML, 'return Path(spec.origin).parent / "model"', "return Path(spec.origin).parent", T_ML),
    ("ml-json-always", ML, "    if args.json:\n", "    if True:\n", T_ML),
    # ------------------------------------------------------------ cli.py
    ("cl-any-command-passes-through", CL, 'if getattr(args, "pass_through", False):', "if True:", T_CL),
    ("cl-unknown-args-ignored", CL, "    elif rest:\n", "    elif False:\n", T_CL),
    ("cl-empty-path-exit-1", CL, "an empty path; give a file or folder\",\n            file=sys.stderr,\n        )\n        return 2", "an empty path; give a file or folder\",\n            file=sys.stderr,\n        )\n        return 1", T_CL),
    ("cl-empty-path-list-missed", CL, 'if "" in (value if isinstance(value, list) else [value]):', 'if value == "":', T_CL),
    ("cl-empty-path-dest-named", CL, 'return "/".join(action.option_strings) or action.dest', "return action.dest", T_CL),
    ("cl-broken-pipe-exit-1", CL, "return 141  # 128 + SIGPIPE", "return 1", T_CL),
    ("cl-ctrl-c-exit-1", CL, "return 130  # 128 + SIGINT", "return 1", T_CL),
    ("cl-bug-as-input-error", CL, "        if not is_input_error(err):\n            raise", "        if False:\n            raise", T_CL),
    ("cl-any-oserror-one-line", CL, "        if err.errno not in SYSTEM_ERRNOS:\n            raise\n", "        pass\n", T_CL),
    ("cl-system-error-exit-2", CL, "print(f\"kinterval {args.command}: error: {system_error_message(err)}\", file=sys.stderr)\n        return 1", "print(f\"kinterval {args.command}: error: {system_error_message(err)}\", file=sys.stderr)\n        return 2", T_CL),
    ("cl-result-status-dropped", CL, "return int(result or 0)", "return 0", T_CL),
    ("cl-builtin-valueerror-input", CL, 'return linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip().startswith("raise")', "return True", T_CL),
    ("cl-other-package-input", CL, 'if module != "kinterval" and not module.startswith("kinterval."):', "if False:", T_CL),
    ("cl-multiline-kept", CL, 'text = " ".join(str(err).split("\\n"))', "text = str(err)", T_CL),
    ("cl-flag-rename-unknown", CL, "if name and name[1] in (flags or {}):", "if name and flags:", T_CL),
    ("cl-flag-first-spelling", CL, "a.dest: a.option_strings[-1] for a in chosen_parser(parser, args)._actions", "a.dest: a.option_strings[0] for a in chosen_parser(parser, args)._actions", T_CL),
    ("cl-warning-any-userwarning", CL, "if issubclass(category, UserWarning) and Path(filename).resolve().is_relative_to(PACKAGE):", "if issubclass(category, UserWarning):", T_CL),
    ("cl-path-json-missing", CL, '"out", "run", "data", "dir", "dirs", "runs", "json", "config",', '"out", "run", "data", "dir", "dirs", "runs", "config",', T_CL),
    # ------------------------------------------------------------ arglists.py
    ("al-blank-items-kept", AL, "items = [x for x in text.split(\",\") if x.strip()]", "items = [x for x in text.split(\",\") if x]", T_AL),
    ("al-lone-comma-refused", AL, 'if not items and "," not in text:', "if not items:", T_AL),
    ("al-empty-accepted", AL, 'if not items and "," not in text:', "if False:", T_AL),
    ("al-message-no-kind", AL, 'f"invalid {kind.__name__} value: {text!r}"', 'f"invalid value: {text!r}"', T_AL),
    ("al-extend-last-only", AL, "setattr(namespace, self.dest, [x for v in values for x in v])", "setattr(namespace, self.dest, values[-1])", T_AL),
    # ------------------------------------------------------------ atomic.py
    ("at-temp-not-hidden", AT, 'return path.with_name(f".{path.name}.tmp")', 'return path.with_name(f"{path.name}.tmp")', T_AT),
    ("at-no-fsync", AT, "                os.fsync(fh.fileno())\n", "", T_AT),
    ("at-no-flush", AT, "                fh.flush()\n", "", T_AT),
    ("at-temp-left-on-error", AT, "            tmp.unlink(missing_ok=True)\n", "            pass\n", T_AT),
    ("at-temp-left-on-ctrl-c", AT, "    except BaseException:\n", "    except Exception:\n", T_AT),
    ("at-temp-name-not-renamed", AT, "named not in (None, None if temp is None else str(temp)):", "named is not None:", T_AT),
    ("at-naming-keeps-nameless", AT, "raise OSError(err.errno, err.strerror or str(err), str(path)) from err", "raise", T_AT),
    ("at-target-parent-a-file", AT, "if not path.parent.is_dir():", "if not path.parent.exists():", T_AT),
    ("at-target-folder-ok", AT, "    if path.is_dir():\n        raise", "    if False:\n        raise", T_AT),
    ("at-json-compact", AT, "def write_json(path: str | Path, obj, *, indent: int | None = 1, default=None)", "def write_json(path: str | Path, obj, *, indent: int | None = None, default=None)", T_AT),
    ("at-text-latin1", AT, 'write_bytes(path, text.encode("utf-8"))', 'write_bytes(path, text.encode("latin-1", "replace"))', T_AT),
    ("at-sha-first-mib", AT, 'for chunk in iter(lambda: f.read(1 << 20), b""):', "for chunk in [f.read(1 << 20)]:", T_AT),
    ("at-sha-bytes-sha1", AT, "return hashlib.sha256(data).hexdigest()", "return hashlib.sha1(data).hexdigest()", T_AT),
    ("at-eacces-a-bug", AT, "errno.EROFS, errno.EACCES, errno.EPERM", "errno.EROFS, errno.EPERM", T_AT),
    # ------------------------------------------------------------ round 2: demo.py, train/demo.py
    ("dm-tokens-equal-warmup-ok", DT, "if tokens is not None and tokens <= warmup:", "if tokens is not None and tokens < warmup:", T_DM),
    ("dm-warmup-modes-swapped", DT, 'warmup = QUICK["warmup_tokens"] if quick else', 'warmup = QUICK["warmup_tokens"] if not quick else', T_DM),
    ("dm-seed-flag-unnamed", DT, 'check_seed(seed, f"{flag}seed")', 'check_seed(seed, "seed")', T_DM),
    ("dm-threads-not-restored", DT, "        torch.set_num_threads(old_threads)\n", "        pass\n", T_DM),
    ("dm-threads-negative-ok", DT, "or not isinstance(threads, int) or threads < 0):", "or not isinstance(threads, int)):", T_DM),
    ("dm-softmax-last", DT, 'operators.insert(0, "softmax")', 'operators.append("softmax")', T_DM),
    ("dm-twice-ok", DT, "twice = sorted({n for n in operators if operators.count(n) > 1})", "twice = []", T_DM),
    ("dm-corpus-reprepared", DT, 'if not (data / "meta.json").is_file():', "if True:", T_DM),
    ("dm-tokens-ignored", DT, '"schedule.tokens": tokens or sizes["tokens"],', '"schedule.tokens": sizes["tokens"],', T_DM),
    ("dm-quick-warmup-default", DT, 'base = base.override({"schedule.warmup_tokens": QUICK["warmup_tokens"], "checkpoint.count": 1})', 'base = base.override({"checkpoint.count": 1})', T_DM),
    ("dm-eval-on-train", DT, 'val = TokenShards(data, "val").tokens()', 'val = TokenShards(data, "train").tokens()', T_DM),
    ("dm-no-resume", DT, "result = train(cfg, run, resume=True)", "result = train(cfg, run, resume=False)", T_DM),
    ("dm-stopped-run-ok", DT, 'if result.status != "completed":', 'if result.status == "failed":', T_DM),
    ("dm-train-s-this-call", DT, "train_s = result.train_s if result.train_s is not None else time.perf_counter() - t0", "train_s = time.perf_counter() - t0", T_DM),
    ("dm-delta-sign", DT, 'd = r["per_block"] - ref', 'd = ref - r["per_block"]', T_DM),
    ("dm-se-ddof0", DT, "float(d.std(ddof=1) / np.sqrt(len(d)))", "float(d.std(ddof=0) / np.sqrt(len(d)))", T_DM),
    ("dc-no-operators-late", DC, "    if not ops:\n        raise ValueError(", "    if False:\n        raise ValueError(", T_DM),
    ("dc-progress-in-a-pipe", DC, "progress=not args.no_progress and sys.stderr.isatty(),", "progress=not args.no_progress,", T_DM),
    ("dc-separated-inverted", DC, '(" separated" if c["separated"] else "")', '(" separated" if not c["separated"] else "")', T_DM),
    ("dc-interval-4f", DC, 'interval = f"[{num(c[\'lo\'])}, {num(c[\'hi\'])}]"', 'interval = f"[{c[\'lo\']:+.4f}, {c[\'hi\']:+.4f}]"', T_DM),
    ("dc-seed-not-passed", DC, "        seed=args.seed,\n", "        seed=0,\n", T_DM),
    ("dc-block-of-legend", DC, 'block = report["rows"][0]["block"]', 'block = 16', T_DM),
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
