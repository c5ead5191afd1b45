"""Mutation audit of kinterval/report/tables.py and build.py: one mutant at a time, the fast report tests.

Run from the repository root: ``python benchmarks/results/mutation-report-2026-12-04/mut_report.py [OUT.jsonl]
[ID ...]``. Each mutant replaces one exact snippet (it must occur once) in a copy of the file; the original is
copied back after each run. A mutant is killed when pytest fails (or times out), survived when it passes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
TAB = "src/kinterval/report/tables.py"
BLD = "src/kinterval/report/build.py"
R = "tests/report/"
T_TAB = [R + "test_tables.py"]
T_BLD = [R + "test_report.py"]

# (id, file, old, new, tests)
MUTANTS = [
    ("t01-ci-swap", TAB, 'f"[{num(lo)}, {num(hi)}]"', 'f"[{num(hi)}, {num(lo)}]"', T_TAB),
    ("t02-ci-negate", TAB, "lo is None or not math.isfinite(lo)", "lo is None or math.isfinite(lo)", T_TAB),
    ("t03-md-sep-short", TAB, '"---|" * len(headers)', '"---|" * (len(headers) - 1)', T_TAB),
    ("t04-md-drop-first-row", TAB, '" |" for r in rows]', '" |" for r in rows[1:]]', T_TAB),
    (
        "t05-tex-drop-caption",
        TAB,
        'f"% {latex(line)}\\n" for line in caption.splitlines()',
        '"" for line in caption.splitlines()',
        T_TAB,
    ),
    ("t06-tex-colspec", TAB, "{'r' * (len(headers) - 1)}", "{'r' * len(headers)}", T_TAB),
    ("t07-tokens-digits", TAB, 'f"{n / div:.4g}{unit}"', 'f"{n / div:.3g}{unit}"', T_TAB),
    ("t08-tokens-boundary", TAB, "if n >= div:", "if n > div:", T_TAB),
    ("t09-setting-cols-always-hidden", TAB, "if len(settings) <= 1:", "if len(settings) <= 2:", T_TAB),
    (
        "t10-setting-data-tag-swap",
        TAB,
        "[tokens(r.key.budget), r.key.data, r.key.tag]",
        "[tokens(r.key.budget), r.key.tag, r.key.data]",
        T_TAB,
    ),
    (
        "t11-separated-label",
        TAB,
        'SEPARATED = "Separated (lo > +0.01)"',
        'SEPARATED = "Separated (lo > 0)"',
        T_TAB,
    ),
    (
        "t12-seed-cols-all",
        TAB,
        "if any(r.est.n_seeds > 1 for r in rows):\n        heads",
        "if all(r.est.n_seeds > 1 for r in rows):\n        heads",
        T_TAB,
    ),
    (
        "t13-separated-col-all",
        TAB,
        "if any(r.est.n_seeds == 1 for r in rows) else",
        "if all(r.est.n_seeds == 1 for r in rows) else",
        T_TAB,
    ),
    (
        "t14-separated-uses-excludes-zero",
        TAB,
        '"yes" if e.separated else "no"',
        '"yes" if e.excludes_zero else "no"',
        T_TAB,
    ),
    (
        "t15-sd-evalse-swap",
        TAB,
        "num(e.sd, False), num(e.eval_se, False)",
        "num(e.eval_se, False), num(e.sd, False)",
        T_TAB,
    ),
    ("t16-p-q-swap", TAB, "prob(e.p), prob(r.q)", "prob(r.q), prob(e.p)", T_TAB),
    (
        "t17-softmax-row-after",
        TAB,
        "ordered += [*by_setting.pop(r.key.setting(), []), r]",
        "ordered += [r, *by_setting.pop(r.key.setting(), [])]",
        T_TAB,
    ),
    (
        "t18-drop-leftover-refs",
        TAB,
        "for r in ordered + [ref for rs in by_setting.values() for ref in rs]:",
        "for r in ordered:",
        T_TAB,
    ),
    (
        "t19-ref-nll-signed",
        TAB,
        "seeds(r), num(r.nll, False), *nll_sd, *blank]",
        "seeds(r), num(r.nll), *nll_sd, *blank]",
        T_TAB,
    ),
    (
        "t20-delta-sign",
        TAB,
        "est = [num(r.est.mean), *estimate_cells",
        "est = [num(-r.est.mean), *estimate_cells",
        T_TAB,
    ),
    ("t21-factorial-names", TAB, "FACTORIAL_NAMES.get(r.contrast, r.contrast)", "r.contrast", T_TAB),
    (
        "t22-factorial-seeds-family-swap",
        TAB,
        "            seeds(r),\n            r.family,",
        "            r.family,\n            seeds(r),",
        T_TAB,
    ),
    (
        "t23-trend-note-n-swap",
        TAB,
        "            r.note,\n            str(r.est.n_seeds),",
        "            str(r.est.n_seeds),\n            r.note,",
        T_TAB,
    ),
    ("t24-detach-recovery-digits", TAB, "num(r.recovery, False, 3)", "num(r.recovery, False, 2)", T_TAB),
    (
        "t25-detach-recovery-ci-swap",
        TAB,
        '+ (f" [{r.recovery_lo:.3f}, {r.recovery_hi:.3f}]" if',
        '+ (f" [{r.recovery_hi:.3f}, {r.recovery_lo:.3f}]" if',
        T_TAB,
    ),
    ("t26-margin-le", TAB, "abs(r.est.mean) < MARGIN", "abs(r.est.mean) <= MARGIN", T_TAB),
    ("t27-margin-signed", TAB, "abs(r.est.mean) < MARGIN", "r.est.mean < MARGIN", T_TAB),
    ("t28-ratio-every-row", TAB, " and (r.key, r.tokens) not in shown", "", T_TAB),
    ("t29-ratio-digits", TAB, 'ratio = f"{r.recovery:.3f}"', 'ratio = f"{r.recovery:.2f}"', T_TAB),
    (
        "t30-cross-column-order",
        TAB,
        "for x in (model, tokens(b), d, t) if x",
        "for x in (tokens(b), model, d, t) if x",
        T_TAB,
    ),
    (
        "t31-cross-missing-cell",
        TAB,
        'cells.append("-" if r is None else',
        'cells.append("" if r is None else',
        T_TAB,
    ),
    (
        "t32-cross-drop-column",
        TAB,
        "        for s in settings:\n            r = by.get(s)",
        "        for s in settings[:-1]:\n            r = by.get(s)",
        T_TAB,
    ),
    (
        "t33-option-penalty-swap",
        TAB,
        "[num(pen.control_nll), num(pen.nll)]",
        "[num(pen.nll), num(pen.control_nll)]",
        [R + "test_option_effects.py"],
    ),
    (
        "t34-option-nll-swap",
        TAB,
        "num(r.control_nll, False), num(r.nll, False)",
        "num(r.nll, False), num(r.control_nll, False)",
        [R + "test_option_effects.py"],
    ),
    (
        "t35-strict-not-run-label",
        TAB,
        'r.evaluator, "not run", "-", "-", r.why',
        'r.evaluator, "-", "-", "-", r.why',
        [R + "test_strict.py"],
    ),
    (
        "t36-strict-drop-not-run",
        TAB,
        'out.append([r.group, r.contrast, str(r.K), seed, r.evaluator, "not run", "-", "-", r.why])',
        "pass",
        [R + "test_strict.py"],
    ),
    (
        "t37-strict-seed-none",
        TAB,
        'seed = "-" if r.seed is None else str(r.seed)',
        "seed = str(r.seed)",
        [R + "test_strict.py"],
    ),
    (
        "t38-probe-drop-not-run",
        TAB,
        'out.append([name, "-", "-", "-", "-", "-", "-", "not run", "-", "-", c["not_run"]])',
        "pass",
        [R + "test_report_probes.py"],
    ),
    (
        "t39-probe-delta-unsigned",
        TAB,
        'cells += [num(r["delta"]), ivl]',
        'cells += [num(r["delta"], signed=False), ivl]',
        [R + "test_report_probes.py"],
    ),
    (
        "t40-probe-drop-probec",
        TAB,
        '"tab:probeab" if in_probeab(r) else "tab:probec" if r["probe"] == "C" else None',
        '"tab:probeab" if in_probeab(r) else None',
        [R + "test_report_probes.py"],
    ),
    (
        "t41-heldout-yn-swap",
        TAB,
        "            yn[r.est.excludes_zero],\n            yn[r.est.within_margin],",
        "            yn[r.est.within_margin],\n            yn[r.est.excludes_zero],",
        T_TAB,
    ),
    ("t42-heldout-maxabs-digits", TAB, 'f"{r.max_abs:.3g}"', 'f"{r.max_abs:.2g}"', T_TAB),
    (
        "t43-claim-yn-swap",
        TAB,
        "            yn[c.direction_agrees],\n            yn[c.detectable],",
        "            yn[c.detectable],\n            yn[c.direction_agrees],",
        T_TAB,
    ),
    ("t44-claim-runs-blank", TAB, 'c.setting or "-"', 'c.setting or ""', T_TAB),
    (
        "t45-stopped-tokens-swap",
        TAB,
        "f\"{s['tokens']} of {s['budget']}\"",
        "f\"{s['budget']} of {s['tokens']}\"",
        T_TAB,
    ),
    (
        "t46-hours-partial-note",
        TAB,
        "text if r.timed_runs == len(r.runs) else",
        "text if r.timed_runs >= 0 else",
        [R + "test_hardware_table.py"],
    ),
    ("t47-stack-total", TAB, "str(sum(totals))]]", "str(len(totals))]]", [R + "test_hardware_table.py"]),
    (
        "t48-stack-processes",
        TAB,
        "process{'es' if n != 1 else ''}",
        "process{'es' if n > 2 else ''}",
        T_TAB + [R + "test_hardware_table.py"],
    ),
    (
        "t49-heldout-order-sign",
        TAB,
        'f"{s.spearman[0]:+.3f} ({s.spearman[1]:.3g})"',
        'f"{s.spearman[0]:.3f} ({s.spearman[1]:.3g})"',
        T_TAB + [R + "test_heldout_ordering.py"],
    ),
    (
        "t50-rank-minmax-swap",
        TAB,
        'f"{min(s.pairwise_spearman):.3f}–{max(s.pairwise_spearman):.3f}"',
        'f"{max(s.pairwise_spearman):.3f}–{min(s.pairwise_spearman):.3f}"',
        T_TAB,
    ),
    (
        "t51-geometry-order",
        TAB,
        "for k, g in sorted(geo.items(), key=lambda kv: key_order(kv[0]))",
        "for k, g in geo.items()",
        T_TAB,
    ),
    ("t52-latex-degree", TAB, '"°": r"$^\\circ$",', '"°": "°",', T_TAB),
    (
        "t53-fit-gap-swap",
        TAB,
        "            num(r.gap),\n            num(r.control_gap),",
        "            num(r.control_gap),\n            num(r.gap),",
        T_TAB + [R + "test_train_fit.py"],
    ),
    (
        "b01-tex-file-is-md",
        BLD,
        'write_text(T.render(headers, rows, "tex", caption))',
        'write_text(T.render(headers, rows, "md", caption))',
        T_BLD,
    ),
    (
        "b02-run-count",
        BLD,
        "{have} of {have + len(missing)} runs",
        "{have} of {len(missing)} runs",
        T_BLD + [R + "test_claims.py"],
    ),
    (
        "b03-not-run-negate",
        BLD,
        'if row["run_id"] not in have]',
        'if row["run_id"] in have]',
        T_BLD + [R + "test_claims.py"],
    ),
    (
        "b04-passes-earliest",
        BLD,
        "p.tokens >= last.get(name, (-1, 0.0))[0]",
        "p.tokens <= last.get(name, (10**15, 0.0))[0]",
        T_BLD + [R + "test_claims.py"],
    ),
    (
        "b05-repeated-ge1",
        BLD,
        "repeated = {run: n for run, n in passes.items() if n > 1}",
        "repeated = {run: n for run, n in passes.items() if n >= 1}",
        T_BLD + [R + "test_claims.py"],
    ),
    (
        "b06-drop-unrecorded-note",
        BLD,
        '(f" Not recorded by the evaluations of {\', \'.join(unrecorded)}." if unrecorded else "")',
        '""',
        T_BLD + [R + "test_claims.py"],
    ),
    (
        "b07-code-warning",
        BLD,
        "if len({sha for _, sha in codes}) > 1:",
        "if len({sha for _, sha in codes}) > 2:",
        T_BLD + [R + "test_suites_together.py", R + "test_claims.py"],
    ),
    ("b08-delta-no-softmax-rows", BLD, "*T.delta_rows(rows, refs),", "*T.delta_rows(rows),", T_BLD),
    (
        "b09-seedref-no-softmax",
        BLD,
        "*T.delta_rows(seed_refs, seed_soft),",
        "*T.delta_rows(seed_refs),",
        T_BLD + [R + "test_suites_together.py"],
    ),
    (
        "b10-cross-needs-3",
        BLD,
        "    if len(settings) > 1:\n        columns",
        "    if len(settings) > 2:\n        columns",
        T_BLD,
    ),
    (
        "b11-cross-columns-unsorted",
        BLD,
        'named = sorted((" + ".join',
        'named = list((" + ".join',
        T_BLD + [R + "test_suites_together.py"],
    ),
    (
        "b12-ranks-all",
        BLD,
        "if any(s.kendall_w is not None or s.spearman_h is not None for s in ranks):",
        "if all(s.kendall_w is not None and s.spearman_h is not None for s in ranks):",
        T_BLD,
    ),
    (
        "b13-tail-caption",
        BLD,
        "seed (°: |Δ| < 0.01 nats",
        "seed (°: |Δ| ≤ 0.01 nats",
        T_BLD + [R + "test_suites_together.py", R + "test_reproduce.py"],
    ),
    (
        "b14-unpaired-drop-left-out",
        BLD,
        "{**pairing.unpaired, **det_pairing.unpaired, **left_out}",
        "{**pairing.unpaired, **det_pairing.unpaired}",
        T_BLD + [R + "test_claims.py", R + "test_endpoint.py"],
    ),
    (
        "b15-stack-negate",
        BLD,
        "    if hw.recorded:",
        "    if not hw.recorded:",
        T_BLD + [R + "test_hardware_table.py"],
    ),
    (
        "b16-demo-separated",
        BLD,
        '"separated": est.separated,',
        '"separated": est.excludes_zero,',
        [R + "test_endpoint.py", "tests/train/test_demo_benchmark.py", *T_BLD],
    ),
    ("b17-publish-keeps-stale", BLD, "for name in sorted(old - new - set(last)):", "for name in []:", T_BLD),
    (
        "b18-fit-skipped-header",
        BLD,
        '*T.skipped_rows(fit_skipped, "Run vs same-seed control"),',
        "*T.skipped_rows(fit_skipped),",
        T_BLD + [R + "test_train_fit.py"],
    ),
    (
        "b19-no-report-json-link",
        BLD,
        'ix.lines += ["All numbers: [report.json](report.json)", ""]',
        "pass",
        T_BLD,
    ),
    (
        "b20-label-no-setting",
        BLD,
        "return f\"{A.condition(k)} ({', '.join(where)})\" if many else A.condition(k)",
        "return A.condition(k)",
        T_BLD + [R + "test_figures.py"],
    ),
]


def run(mid, path, old, new, tests, timeout=180):
    src = ROOT / path
    orig = src.read_text()
    if orig.count(old) != 1:
        return {
            "id": mid,
            "file": path,
            "status": "invalid",
            "why": f"snippet occurs {orig.count(old)} times",
        }
    backup = src.with_suffix(".py.orig")
    shutil.copy2(src, backup)
    try:
        src.write_text(orig.replace(old, new))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            rc, tail = p.returncode, (p.stdout + p.stderr).strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", ["timeout"]
        status = "survived" if rc == 0 else "killed"
        failed = [ln.split(" ")[1] for ln in (p.stdout.splitlines() if rc not in (0, "timeout") else [])
                  if ln.startswith("FAILED ")][:3]  # fmt: skip
        return {"id": mid, "file": path, "old": old, "new": new, "tests": tests, "status": status, "rc": rc,
                "seconds": round(time.time() - t0, 1), "failed": failed, "summary": tail}  # fmt: skip
    finally:
        shutil.copy2(backup, src)
        backup.unlink()


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("results.jsonl")
    only = set(sys.argv[2:])
    with out.open("a") as f:
        for m in MUTANTS:
            if only and m[0] not in only:
                continue
            r = run(*m)
            print(r["id"], r["status"], r.get("seconds"), r.get("failed"), flush=True)
            f.write(json.dumps(r) + "\n")
            f.flush()
    subprocess.run(["git", "diff", "--quiet", "--", TAB, BLD], check=True)


if __name__ == "__main__":
    main()
