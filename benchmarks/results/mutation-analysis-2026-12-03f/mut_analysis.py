# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of ``src/kinterval/report/analysis/`` (options.py excluded: audited before).

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files with ``-x`` and records killed (a test failed) or survived; the file is restored byte for byte.
Run from the repository root with its ``src`` first on PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-analysis-2026-12-03f/mut_analysis.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name);
mutants already there are skipped. ``$MUT_EXTRA``: more test files (space-separated) for
every mutant. Touch ``STOP`` beside the script to stop between mutants.
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
EXTRA = os.environ.get("MUT_EXTRA", "").split()  # more test files for every mutant
A = "src/kinterval/report/analysis/"
R = "tests/report/"
T_CORE = [R + f for f in ("test_pairing.py", "test_endpoint.py", "test_analysis.py", "test_tables.py")]
T_FAC = [R + f for f in ("test_factorial_sourcing.py", "test_kfigures.py", "test_analysis.py",
                         "test_endpoint.py", "test_tables.py")]  # fmt: skip
T_DET = [R + f for f in ("test_pairing.py", "test_analysis.py", "test_endpoint.py", "test_tables.py")]
T_RANK = [R + f for f in ("test_analysis.py", "test_heldout_ordering.py", "test_tables.py")]
T_HELD = [
    R + f for f in ("test_heldout_ordering.py", "test_analysis.py", "test_endpoint.py", "test_tables.py")
]
T_CLEAN = [R + "test_clean_blocks.py"]
T_TAIL = [
    R + f for f in ("test_endpoint.py", "test_analysis.py", "test_tables.py", "test_suites_together.py")
]
T_STRICT = [R + "test_strict.py"]
T_REC = [R + f for f in ("test_analysis.py", "test_tables.py")]

C, F, D, K, H, CB, TD, S, RC = (A + x + ".py" for x in (
    "core", "factorial", "detach", "ranks", "heldout", "cleanblocks", "taildecomp", "strict", "records"))  # fmt: skip

MUTANTS = [
    (
        "core-d-sign",
        C,
        "return self.point.nll - self.control.nll",
        "return self.control.nll - self.point.nll",
        T_CORE,
    ),
    ("core-resamples-2000", C, "N_RESAMPLES = 4000", "N_RESAMPLES = 2000", T_CORE),
    (
        "core-block-plus1",
        C,
        "block_bootstrap_ci(x, block=b, n_resamples",
        "block_bootstrap_ci(x, block=b + 1, n_resamples",
        T_CORE,
    ),
    (
        "core-eval-se-max",
        C,
        "float(np.mean([b.se for b in boots]))",
        "float(np.max([b.se for b in boots]))",
        T_CORE,
    ),
    ("core-block-max", C, "else min(blocks)", "else max(blocks)", T_CORE),
    ("core-exact-p-lt", C, "if len(means) <= MAX_EXACT_N", "if len(means) < MAX_EXACT_N", T_CORE),
    (
        "core-control-tag-native-first",
        C,
        "[tag] if base == tag else [tag, base]",
        "[tag] if base == tag else [base, tag]",
        T_CORE,
    ),
    ("core-unpaired-although-paired", C, "if (suite, run, tag, ctrl) not in paired:", "if True:", T_CORE),
    ("core-final-first-step", C, "p.step > run(last[k]).step", "p.step < run(last[k]).step", T_CORE),
    (
        "core-endpoint-min",
        C,
        "end = max(run(x).tokens for x in items)",
        "end = min(run(x).tokens for x in items)",
        T_CORE,
    ),
    (
        "core-endpoint-takes-last",
        C,
        "hit = next((x for x in xs if run(x).tokens == end), None)",
        "hit = max(xs, key=lambda x: run(x).tokens)",
        T_CORE,
    ),
    (
        "core-nll-sd-ddof0",
        C,
        "float(np.std([x.point.mean for x in pairs], ddof=1))",
        "float(np.std([x.point.mean for x in pairs], ddof=0))",
        T_CORE,
    ),
    (
        "core-control-nll-is-point",
        C,
        "control_nll=float(np.mean([x.control.mean",
        "control_nll=float(np.mean([x.point.mean",
        T_CORE,
    ),
    ("core-bh-one-family", C, "fam[family(r)].append(r)", "fam[0].append(r)", T_CORE),
    (
        "core-bh-family-no-design",
        C,
        "family=lambda r: (r.key.setting(), r.design)",
        "family=lambda r: r.key.setting()",
        T_CORE,
    ),
    (
        "core-design-realized-seeds",
        C,
        "tuple(sorted({s for p in points for s in p.design_seeds}))",
        "tuple(sorted({p.seed for p in points}))",
        T_CORE,
    ),
    ("core-ref-sd-ddof0", C, "sd = float(np.std(nll, ddof=1))", "sd = float(np.std(nll, ddof=0))", T_CORE),
    (
        "core-ref-last-checkpoint",
        C,
        'ps = sorted(at_endpoint(ps, "the softmax reference", {}), key=',
        "ps = sorted(final(ps), key=",
        T_CORE,
    ),
    (
        "core-seedref-includes-per-seed",
        C,
        "if not p.per_seed and (p.key.setting(), p.seed) in wanted:",
        "if (p.key.setting(), p.seed) in wanted:",
        T_CORE,
    ),
    (
        "core-geometry-nonfinite",
        C,
        "if g.get(m) is not None and np.isfinite(g[m])",
        "if g.get(m) is not None",
        T_CORE,
    ),
    (
        "core-order-K-as-string",
        C,
        "return (bool(mods), rank, mods, K, name)",
        "return (bool(mods), rank, mods, name, K)",
        T_CORE,
    ),
    (
        "fac-simple-fwm-sign",
        F,
        '"Prob − Weight under FWM": {"fwm_p": 1.0, "fwm_w": -1.0}',
        '"Prob − Weight under FWM": {"fwm_p": -1.0, "fwm_w": 1.0}',
        T_FAC,
    ),
    (
        "fac-simple-prob-wrong-cell",
        F,
        '"FWM − MinMax under Prob-STE": {"fwm_p": 1.0, "mm_p": -1.0}',
        '"FWM − MinMax under Prob-STE": {"fwm_p": 1.0, "mm_w": -1.0}',
        T_FAC,
    ),
    ("fac-vs-lerp-sign", F, "s: cells[c][s].nll - ref[s].nll", "s: ref[s].nll - cells[c][s].nll", T_FAC),
    (
        "fac-lerp-last-checkpoint",
        F,
        "if tokens in by_tokens:\n                ref[s] = by_tokens[tokens]",
        "if by_tokens:\n                ref[s] = by_tokens[max(by_tokens)]",
        T_FAC,
    ),
    (
        "fac-pooled-drops-first-K",
        F,
        "np.mean([by_K[K][effect][s] for K in Ks], axis=0)",
        "np.mean([by_K[K][effect][s] for K in Ks[1:]], axis=0)",
        T_FAC,
    ),
    (
        "fac-Kx-sign",
        F,
        "diff = {s: by_K[K][effect][s] - by_K[Ks[0]][effect][s]",
        "diff = {s: by_K[Ks[0]][effect][s] - by_K[K][effect][s]",
        T_FAC,
    ),
    (
        "fac-Kx-interaction-kept",
        F,
        'if effect == "interaction":\n                continue',
        "if False:\n                continue",
        T_FAC,
    ),
    (
        "fac-common-any-blocks",
        F,
        "return [s for s in seeds if len({cells[c][s].nll.size for c in cs}) == 1]",
        "return seeds",
        T_FAC,
    ),
    (
        "fac-minmax-own-design",
        F,
        "if tau is None and tuple(where) in with_fwm:\n            continue",
        "if False:\n            continue",
        T_FAC,
    ),
    ("fac-slope-over-n", F, "c = xc / (xc @ xc)", "c = xc / len(Ks)", T_FAC),
    (
        "fac-slope-linear-K",
        F,
        "xc = np.log2(Ks) - np.log2(Ks).mean()",
        "xc = np.asarray(Ks, float) - np.mean(Ks)",
        T_FAC,
    ),
    (
        "fac-slope-narrowest-seed",
        F,
        "widest = max(sorted(all_seeds), key=",
        "widest = min(sorted(all_seeds), key=",
        T_FAC,
    ),
    (
        "fac-kpanels-most-rows-first",
        F,
        "key=lambda s: (s[0], sum(r.key.setting() == s for r in rows))",
        "key=lambda s: (sum(r.key.setting() == s for r in rows), s[0])",
        T_FAC,
    ),
    (
        "det-recovery-complement",
        D,
        "rec.append((det - own) / (det - full))",
        "rec.append((own - full) / (det - full))",
        T_DET,
    ),
    ("det-recovery-partial-seeds", D, "if len(rec) == len(last.seeds):", "if rec:", T_DET),
    (
        "det-vs-detach-self",
        D,
        'if _spec(op).range_grad in ("full", "detach")',
        'if _spec(op).range_grad in ("full",)',
        T_DET,
    ),
    (
        "rank-least-common-seedset",
        K,
        "seeds = max(sorted(set(sets)), key=sets.count)",
        "seeds = min(sorted(set(sets)), key=sets.count)",
        T_RANK,
    ),
    ("rank-ties-kept", K, "varied = scores[np.ptp(scores, axis=1) > 0]", "varied = scores", T_RANK),
    (
        "rank-assoc-nll",
        K,
        "(geometry[r.key][metric], r.est.mean)",
        "(geometry[r.key][metric], r.nll)",
        T_RANK,
    ),
    (
        "held-split-half-sign",
        H,
        "return float(d[:h].sum() / np.sum(w[:h]) - d[h:].sum() / np.sum(w[h:]))",
        "return float(d[h:].sum() / np.sum(w[h:]) - d[:h].sum() / np.sum(w[:h]))",
        T_HELD,
    ),
    (
        "held-split-half-unweighted",
        H,
        '(a["doc_nll"] - b["doc_nll"], a["doc_tokens"])',
        '(a["doc_nll"] - b["doc_nll"], np.ones(a["doc_tokens"].size))',
        T_HELD,
    ),
    (
        "held-cluster-sign",
        H,
        'd = a["doc_nll"] / a["doc_tokens"] - b["doc_nll"] / b["doc_tokens"]',
        'd = b["doc_nll"] / b["doc_tokens"] - a["doc_nll"] / a["doc_tokens"]',
        T_HELD,
    ),
    ("held-no-bh", H, "    apply_bh(rows)\n    return rows +", "    return rows +", T_HELD),
    (
        "held-subst-sign",
        H,
        "per_seed[p.seed], tokens = p.nll - native.nll, p.tokens",
        "per_seed[p.seed], tokens = native.nll - p.nll, p.tokens",
        T_HELD,
    ),
    (
        "held-maxabs-signed",
        H,
        "float(max(np.abs(d).max() for d in per_seed.values()))",
        "float(max(d.max() for d in per_seed.values()))",
        T_HELD,
    ),
    ("held-order-any-tokens", H, "if d is not None and d.tokens == r.tokens:", "if d is not None:", T_HELD),
    (
        "held-fluct-mean-signed",
        H,
        "float(np.mean([abs(v) for v in halves.values()]))",
        "float(np.mean([v for v in halves.values()]))",
        T_HELD,
    ),
    ("clean-covered-all", CB, '("covered", c > 0)', '("covered", c >= 0)', T_CLEAN),
    ("clean-last-blocks", CB, 'out += _rows(cov["n"], c[:size]', 'out += _rows(cov["n"], c[-size:]', T_CLEAN),
    (
        "clean-min-one-block",
        CB,
        "if mask is not None and mask.sum() < 2:",
        "if mask is not None and mask.sum() < 1:",
        T_CLEAN,
    ),
    (
        "tail-ratio-numerator",
        TD,
        "return float(mm.mean() - res.mean()) / gap",
        "return float(res.mean() - fwm.mean()) / gap",
        T_TAIL,
    ),
    (
        "tail-ratio-unshared-starts",
        TD,
        "den = circular_block_means(mm - fwm, block, N_RESAMPLES, np.random.default_rng(0))",
        "den = circular_block_means(mm - fwm, block, N_RESAMPLES, np.random.default_rng(1))",
        T_TAIL,
    ),
    (
        "tail-res-fwm-sign",
        TD,
        '("resolved − FWM", res.nll - fwm.nll)',
        '("resolved − FWM", fwm.nll - res.nll)',
        T_TAIL,
    ),
    ("tail-quantiles", TD, "[(1 - level) / 2, (1 + level) / 2]", "[(1 - level), level]", T_TAIL),
    (
        "strict-weight-sign",
        S,
        '[[(1.0, f"{c}_w", "strict", None), (-1.0, f"{c}_w", "historical", None)]',
        '[[(-1.0, f"{c}_w", "strict", None), (1.0, f"{c}_w", "historical", None)]',
        T_STRICT,
    ),
    (
        "strict-native-vs-strict-swapped",
        S,
        '    [(1.0, f"{c}_p", "historical", None), (-1.0, f"{c}_p", "historical", f"{c}_p")] for',
        '    [(1.0, f"{c}_p", "historical", f"{c}_p"), (-1.0, f"{c}_p", "historical", None)] for',
        T_STRICT,
    ),
    (
        "strict-endpoint-min",
        S,
        "end = max(p.tokens for p in own)",
        "end = min(p.tokens for p in own)",
        T_STRICT,
    ),
    (
        "strict-background-sign",
        S,
        'g4, name, tags, [(1.0, f"{c}_p", "historical", None), (-1.0, f"{c}_w", "historical", None)]',
        'g4, name, tags, [(-1.0, f"{c}_p", "historical", None), (1.0, f"{c}_w", "historical", None)]',
        T_STRICT,
    ),
    ("strict-secondary-includes-primary", S, "& native - {primary_tag})", "& native)", T_STRICT),
    (
        "rec-clip-first-frac",
        RC,
        'frac=float(rows[-1]["clipped_frac"])',
        'frac=float(rows[0]["clipped_frac"])',
        T_REC,
    ),
    ("rec-clip-tail-window", RC, "> (1 - CLIP_TAIL) * budget]", "> CLIP_TAIL * budget]", T_REC),
    (
        "rec-loss-rise-sign",
        RC,
        "rises = [b - a for a, b in zip(losses, losses[1:])]",
        "rises = [a - b for a, b in zip(losses, losses[1:])]",
        T_REC,
    ),
    # --- round 2 (run on the tests with the round-1 additions)
    ("fac-vs-lerp-any-seed", F, "for s in (full or cells.get(c, {}))", "for s in cells.get(c, {})", T_FAC),
    (
        "fac-vs-lerp-no-size-check",
        F,
        "if s in ref and ref[s].nll.size == cells[c][s].nll.size",
        "if s in ref",
        T_FAC,
    ),
    ("fac-surrogate-any-design", F, "and r.family == design\n", "and True\n", T_FAC),
    (
        "fac-kpanels-any-range-grad",
        F,
        'if s.K != K or s.reconstruction != "nearest" or s.range_grad != "full":',
        'if s.K != K or s.reconstruction != "nearest":',
        T_FAC,
    ),
    ("held-split-half-ceil", H, "h = d.size // 2", "h = (d.size + 1) // 2", T_HELD),
    ("held-docs-several-seeds", H, "if len(ps) == 1 and a and b:", "if a and b:", T_HELD),
    (
        "held-order-includes-subst",
        H,
        'if r.key in groups and r.contrast == f"{r.key.operator} − softmax":',
        "if r.key in groups:",
        T_HELD,
    ),
    (
        "held-subst-no-size-check",
        H,
        "if native is not None and native.nll.size == p.nll.size:",
        "if native is not None:",
        T_HELD,
    ),
    (
        "det-recovery-zero-gap",
        D,
        "if None not in (det, full, own) and det != full:",
        "if None not in (det, full, own):",
        T_DET,
    ),
    (
        "strict-any-forward",
        S,
        "if base(p.tag) == tag and _runs_through(p, fwd)), None)",
        "if base(p.tag) == tag), None)",
        T_STRICT,
    ),
    (
        "tail-prob-before-weight",
        TD,
        'return (setting, sur != "weight", K or 0, str(kv[0]))',
        'return (setting, sur == "weight", K or 0, str(kv[0]))',
        T_TAIL,
    ),
    ("clean-any-size", CB, "and p.nll.size <= c.size", "and True", T_CLEAN),
    (
        "rank-w-two-conditions",
        K,
        "if len(seeds) >= 2 and len(rows) >= 3:",
        "if len(seeds) >= 2 and len(rows) >= 2:",
        T_RANK,
    ),
    ("core-traj-unsorted", C, "for t in sorted(by_t)]", "for t in by_t]", T_CORE),
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
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        killed = r.returncode != 0
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED")]
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
