"""Mutation audit of src/kinterval/stats: apply each mutant alone, run the stats tests, restore the file.

Run from the repository root:
``PYTHONPATH=src python benchmarks/results/mutation-stats-2026-12-02f/run_mutants.py [ID ...]``.
A mutant is killed when the selected tests fail (any non-zero exit). Each mutant's text must occur once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

S = "src/kinterval/stats/"
CORE = "src/kinterval/report/analysis/core.py"
REPORT_TESTS = [
    "tests/report/test_analysis.py",
    "tests/report/test_endpoint.py",
    "tests/report/test_strict.py",
    "tests/report/test_claims.py",
    "tests/test_paper_constants.py",
]
B, C, R, Q, K = S + "bootstrap.py", S + "contrasts.py", S + "ranks.py", S + "seeds.py", S + "_checks.py"

MUTANTS = [
    # id, file, original text, mutated text, description
    ("B01", B, "return min(block, n // 2)", "return min(block, (n + 1) // 2)", "block_length rounds n/2 up"),
    ("B02", B, "[alpha / 2, 1 - alpha / 2]", "[alpha, 1 - alpha]", "one-sided quantiles (90% CI)"),
    (
        "B03",
        B,
        "lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])",
        "lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2], method='nearest')",
        "nearest-rank quantile",
    ),
    (
        "B04",
        B,
        "lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])",
        "hi, lo = 2 * estimate - np.quantile(reps, [alpha / 2, 1 - alpha / 2])",
        "basic (reflected) interval",
    ),
    (
        "B05",
        B,
        "np.count_nonzero(reps <= 0) + 1, np.count_nonzero(reps >= 0) + 1",
        "np.count_nonzero(reps <= 0), np.count_nonzero(reps >= 0)",
        "p without the observed +1",
    ),
    ("B06", B, "np.count_nonzero(reps <= 0) + 1", "np.count_nonzero(reps < 0) + 1", "p: strict < 0 tail"),
    ("B07", B, "p = 2 * min(", "p = min(", "one-sided p"),
    ("B08", B, ") / (n + 1)", ") / n", "p denominator n"),
    ("B09", B, "se=float(reps.std(ddof=1))", "se=float(reps.std(ddof=0))", "se ddof=0"),
    (
        "B10",
        B,
        "starts = rng.integers(0, n, size=(rows, n_blocks))",
        "starts = rng.integers(0, n - block + 1, size=(rows, n_blocks))",
        "non-circular moving blocks",
    ),
    (
        "B11",
        B,
        "wrapped = np.resize(x, n + block)",
        "wrapped = np.concatenate((x, np.zeros(block)))",
        "no circular wrap (zero pad)",
    ),
    ("B12", B, "tail = n - (n_blocks - 1) * block", "tail = block", "last block not truncated"),
    (
        "B13",
        B,
        "return np.concatenate(out) / n",
        "return np.concatenate(out) / (n_blocks * block)",
        "divide by resample length before truncation",
    ),
    ("B14", B, "if x[0] == x.min() == x.max():", "if False:", "no constant-series shortcut"),
    (
        "B15",
        B,
        "est, reps = _mean_and_reps(diffs, 1, n_resamples, seed)",
        "est, reps = _mean_and_reps(diffs, 2, n_resamples, seed)",
        "paired bootstrap with block 2",
    ),
    ("B16", B, "if block > x.size // 2:", "if block > x.size:", "block check allows one block"),
    ("B17", B, "if np.any(w < 0) or w.sum() <= 0:", "if w.sum() <= 0:", "negative cluster weights accepted"),
    ("B18", B, "if n_clusters < 2:", "if n_clusters < 1:", "one cluster accepted"),
    (
        "B19",
        B,
        "wv.sum() / ww.sum(), np.concatenate(reps)",
        "values.mean(), np.concatenate(reps)",
        "cluster estimate unweighted",
    ),
    (
        "B20",
        B,
        "draws = rng.integers(0, n_clusters, size=(rows, n_clusters))",
        "draws = rng.integers(0, n_clusters, size=(rows, n_clusters - 1))",
        "one cluster too few per resample",
    ),
    (
        "B21",
        B,
        "for start in range(0, n_resamples, step):",
        "for start in range(0, n_resamples - step, step):",
        "chunking drops the last chunk",
    ),
    (
        "B22",
        B,
        'diffs = finite_1d(diffs, "diffs", min_size=2)',
        'diffs = finite_1d(diffs, "diffs")',
        "paired bootstrap of one item",
    ),
    ("B23", B, 'x = finite_1d(x, "x", min_size=2)', 'x = finite_1d(x, "x")', "block bootstrap of one value"),
    (
        "B24",
        B,
        "    rng = make_rng(seed)  # a bad seed",
        "    rng = make_rng(0)  # a bad seed",
        "seed ignored",
    ),
    ("B25", B, "alpha = 1.0 - level", "alpha = 1.0 - 0.95", "level ignored"),
    ("Q01", Q, "mean, sd = d.mean(), d.std(ddof=1)", "mean, sd = d.mean(), d.std(ddof=0)", "seed SD ddof=0"),
    (
        "Q02",
        Q,
        "half = stats.t.ppf(0.5 + level / 2, df=n - 1)",
        "half = stats.norm.ppf(0.5 + level / 2)",
        "z instead of t",
    ),
    ("Q03", Q, "stats.t.ppf(0.5 + level / 2, df=n - 1)", "stats.t.ppf(0.5 + level / 2, df=n)", "df = n"),
    (
        "Q04",
        Q,
        "stats.t.ppf(0.5 + level / 2, df=n - 1)",
        "stats.t.ppf(level, df=n - 1)",
        "one-sided t quantile",
    ),
    ("Q05", Q, "sd / np.sqrt(n)", "sd / np.sqrt(n - 1)", "SE with sqrt(n-1)"),
    (
        "Q06",
        Q,
        "np.mean(np.abs(sums) >= observed - _tolerance(d))",
        "np.mean(np.abs(sums) > observed - _tolerance(d))",
        "exact p: strict >",
    ),
    (
        "Q07",
        Q,
        "np.mean(np.abs(sums) >= observed - _tolerance(d))",
        "np.mean(np.abs(sums) >= observed)",
        "exact p: no rounding tolerance",
    ),
    (
        "Q08",
        Q,
        "observed = abs(sums[-1])",
        "observed = abs(sums[0])",
        "observed from the all-minus assignment",
    ),
    ("Q09", Q, "observed = abs(sums[-1])", "observed = sums[-1]", "exact p: signed observed"),
    (
        "Q10",
        Q,
        "return 1e-12 * float(np.abs(d).sum())",
        "return 1e-6 * float(np.abs(d).sum())",
        "tolerance 1e-6 (ties real differences)",
    ),
    ("Q11", Q, "return (1 + hits) / (1 + n)", "return hits / n", "random p without +1"),
    (
        "Q12",
        Q,
        "observed = abs(d.sum()) - _tolerance(d)",
        "observed = d.sum() - _tolerance(d)",
        "random p: signed observed",
    ),
    (
        "Q13",
        Q,
        "for start in range(0, n, step):",
        "for start in range(0, n - step, step):",
        "random p drops the last chunk",
    ),
    ("Q14", Q, "size=(min(step, n - start), d.size)", "size=(step, d.size)", "random p: full last chunk"),
    (
        "Q15",
        Q,
        "np.minimum.accumulate(scaled[::-1])[::-1]",
        "np.minimum.accumulate(scaled)",
        "BH: cumulative min in the wrong direction",
    ),
    ("Q16", Q, "np.minimum.accumulate(scaled[::-1])[::-1]", "scaled", "BH: no monotone step-up"),
    (
        "Q17",
        Q,
        "q_sorted = np.minimum(1.0, np.minimum.accumulate",
        "q_sorted = (np.minimum.accumulate",
        "BH: no cap at 1",
    ),
    ("Q18", Q, "    q[order] = q_sorted", "    q = q_sorted", "BH: q returned in sorted order"),
    (
        "Q19",
        Q,
        "scaled = p[order] * m / np.arange(1, m + 1)",
        "scaled = p[order] * m / np.arange(m, 0, -1)",
        "BH: ranks reversed",
    ),
    ("Q20", Q, "if d.size > MAX_EXACT_N:", "if d.size > 2 * MAX_EXACT_N:", "exact limit dropped"),
    ("Q21", Q, "order = np.argsort(p)", "order = np.argsort(p, kind='stable')", "BH: stable sort"),
    (
        "C01",
        C,
        '"interaction": {"mm_w": 1.0, "mm_p": -1.0, "fwm_w": -1.0, "fwm_p": 1.0}',
        '"interaction": {"mm_w": -1.0, "mm_p": 1.0, "fwm_w": 1.0, "fwm_p": -1.0}',
        "interaction sign",
    ),
    (
        "C02",
        C,
        '"surrogate": {"mm_w": -0.5, "mm_p": 0.5, "fwm_w": -0.5, "fwm_p": 0.5}',
        '"surrogate": {"mm_w": -1.0, "mm_p": 1.0, "fwm_w": -1.0, "fwm_p": 1.0}',
        "main effect weights +-1",
    ),
    ("C03", C, "    if unknown:\n", "    if False:\n", "unknown conditions accepted"),
    ("C04", C, "if len(set(lengths.values())) != 1:", "if False:", "length check dropped"),
    (
        "C05",
        C,
        'out += check_real(a, f"weight of {cond!r}") * arrays[cond]',
        'out = check_real(a, f"weight of {cond!r}") * arrays[cond]',
        "contrast keeps the last term only",
    ),
    ("C06", C, "xc = x - x.mean()", "xc = x - x[0]", "K trend: x not centred"),
    ("C07", C, "x = np.log2(K)", "x = np.log(K)", "K trend: natural log"),
    ("C08", C, "if np.any(K <= 0):", "if np.any(K < 0):", "K = 0 accepted"),
    ("C09", C, "separated=lo > margin,", "separated=lo >= margin,", "separated at lo = margin"),
    (
        "C10",
        C,
        "within_margin=-margin < lo and hi < margin",
        "within_margin=-margin <= lo and hi <= margin",
        "within margin when touching",
    ),
    (
        "C11",
        C,
        "detectable=lo > 0.0 or hi < 0.0",
        "detectable=lo >= 0.0 or hi <= 0.0",
        "touching 0 detectable",
    ),
    ("C12", C, "if not margin > 0:", "if margin < 0:", "margin 0 accepted"),
    (
        "C13",
        C,
        "def label_single_seed(lo: float, hi: float, margin: float = 0.01)",
        "def label_single_seed(lo: float, hi: float, margin: float = 0.02)",
        "default margin",
    ),
    (
        "C14",
        C,
        'd = finite_2d(delta_nll, "delta_nll", min_rows=2, min_cols=2)',
        'd = finite_2d(delta_nll, "delta_nll", min_rows=1, min_cols=2)',
        "K trend of one seed",
    ),
    (
        "C15",
        C,
        "return KTrend(slopes=slopes, summary=seed_summary(slopes, level=level))",
        "return KTrend(slopes=slopes, summary=seed_summary(slopes))",
        "K trend ignores level",
    ),
    (
        "R01",
        R,
        "denom = m**2 * (n**3 - n) - m * ties",
        "denom = m**2 * (n**3 - n) - ties",
        "W tie term not x m",
    ),
    (
        "R02",
        R,
        "denom = m**2 * (n**3 - n) - m * ties",
        "denom = m**2 * (n**3 - n)",
        "W without tie correction",
    ),
    ("R03", R, "ranks = stats.rankdata(x, axis=1)", "ranks = stats.rankdata(x, axis=0)", "W ranks by column"),
    (
        "R04",
        R,
        "ranks = stats.rankdata(x, axis=1)",
        "ranks = stats.rankdata(x, axis=1, method='ordinal')",
        "W ordinal (not average) ranks",
    ),
    ("R05", R, "if denom <= 0:", "if denom < 0:", "W all-tied accepted"),
    (
        "R06",
        R,
        "p = stats.pearsonr(rx, ry, method=method).pvalue",
        "p = stats.pearsonr(x, y, method=method).pvalue",
        "Spearman p from raw values",
    ),
    (
        "R07",
        R,
        "return SpearmanResult(float(stats.spearmanr(x, y).statistic)",
        "return SpearmanResult(float(stats.pearsonr(x, y).statistic)",
        "rho is Pearson",
    ),
    ("R08", R, "if np.ptp(x) == 0 or np.ptp(y) == 0:", "if np.ptp(x) == 0:", "constant y accepted"),
    ("R09", R, "rng=make_rng(seed))", "rng=make_rng(0))", "Spearman seed ignored"),
    (
        "R10",
        R,
        "for i, j in combinations(range(x.shape[0]), 2)]",
        "for i, j in combinations(range(x.shape[0] - 1), 2)]",
        "pairwise Spearman misses the last seed",
    ),
    (
        "R11",
        R,
        "return stats.rankdata(x), stats.rankdata(y)",
        "return stats.rankdata(x), stats.rankdata(y, method='min')",
        "min ranks for ties in y",
    ),
    (
        "R12",
        R,
        "return SpearmanResult(float(stats.spearmanr(x, y).statistic), float(min(1.0, p)))",
        "return SpearmanResult(float(stats.spearmanr(x, y).statistic), float(p))",
        "Spearman p uncapped",
    ),
    (
        "K01",
        K,
        "if not np.all(np.isfinite(a)):\n"
        '        raise ValueError(f"{name} contains NaN or infinite values")\n'
        "    return a\n\n\ndef finite_2d",
        "return a\n\n\ndef finite_2d",
        "finite_1d accepts NaN",
    ),
    ("K02", K, "if not 0.0 < level < 1.0:", "if not 0.0 < level <= 1.0:", "level 1 accepted"),
    ("K03", K, "or not float(n).is_integer() or n < 1:", "or n < 1:", "fractional ints accepted"),
    (
        "K04",
        K,
        "if isinstance(x, (bool, np.bool_)) or not isinstance(x, Real)",
        "if not isinstance(x, Real)",
        "check_real accepts booleans",
    ),
    (
        "K05",
        K,
        "if seed is None:\n        return np.random.default_rng()",
        "if seed is None:\n        return np.random.default_rng(0)",
        "seed None is fixed",
    ),
    (
        "K06",
        K,
        "or not isinstance(seed, Integral) or seed < 0:",
        "or not isinstance(seed, Integral):",
        "negative seed left to numpy",
    ),
    (
        "K07",
        K,
        "if a.shape[0] < min_rows or a.shape[1] < min_cols:",
        "if a.shape[0] < min_rows:",
        "finite_2d ignores min_cols",
    ),
    (
        "K08",
        K,
        "if isinstance(n, (bool, np.bool_)) or not isinstance(n, Real)",
        "if not isinstance(n, Real)",
        "positive int accepts True",
    ),
    (
        "B26",
        B,
        "    for start in range(0, n_resamples, step):\n        yield min(step, n_resamples - start)",
        "    for _ in range(max(1, n_resamples // step)):\n        yield min(step, n_resamples)",
        "chunking drops the remainder chunk",
    ),
    (
        "Q22",
        Q,
        "for start in range(0, n, step):",
        "for start in range(0, max(1, n // step) * step, step):",
        "random p drops the remainder chunk",
    ),
    ("Q23", Q, "if d.size > MAX_EXACT_N:", "if d.size >= MAX_EXACT_N:", "exact p refuses n = 20"),
    (
        "B27",
        B,
        "if reps.min() < reps.max() else 0.0",
        "if reps.min() <= reps.max() else 0.0",
        "se of equal replicates from np.std",
    ),
    (
        "B28",
        B,
        "lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])",
        "lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2], method='hazen')",
        "Hazen quantile",
    ),
    (
        "R13",
        R,
        "s = np.sum((rank_sums - rank_sums.mean()) ** 2)",
        "s = np.sum((rank_sums - m * (n + 1) / 2) ** 2)",
        "W: mean rank sum from the formula",
    ),
    (
        "Q25",
        Q,
        "observed = abs(d.sum()) - _tolerance(d)",
        "observed = abs(d.sum())",
        "random p: no tolerance",
    ),
    (
        "R14",
        R,
        "stats.PermutationMethod(n_resamples=n_resamples,",
        "stats.PermutationMethod(n_resamples=20000,",
        "Spearman ignores n_resamples",
    ),
    (
        "Q26",
        Q,
        "half = stats.t.ppf(0.5 + level / 2, df=n - 1)",
        "half = stats.t.ppf(0.975, df=n - 1)",
        "seed summary ignores level",
    ),
    # The report's use of the statistics (estimate and BH families), against the report tests.
    (
        "P01",
        CORE,
        "block_bootstrap_ci(x, block=b, n_resamples=N_RESAMPLES)",
        "block_bootstrap_ci(x, block=1, n_resamples=N_RESAMPLES)",
        "report: iid instead of block bootstrap",
        REPORT_TESTS,
    ),
    (
        "P02",
        CORE,
        "bh_q([r.est.p for r in rs])",
        "sorted(bh_q([r.est.p for r in rs]))",
        "report: BH q attached to the wrong rows",
        REPORT_TESTS,
    ),
    ("P03", CORE, "N_RESAMPLES = 4000", "N_RESAMPLES = 2000", "report: 2000 resamples", REPORT_TESTS),
    (
        "P04",
        CORE,
        "p=b.p, block=block)",
        "p=None, block=block)",
        "report: single-seed p dropped from BH",
        REPORT_TESTS,
    ),
    (
        "P05",
        CORE,
        "ss = seed_summary(means)",
        "ss = seed_summary(np.concatenate(series))",
        "report: t interval over pooled blocks, not seed means",
        REPORT_TESTS,
    ),
    (
        "P06",
        CORE,
        "p = permutation_p_exact(means) if",
        "p = permutation_p_random(means) if",
        "report: random instead of exact sign-flip p",
        REPORT_TESTS,
    ),
    (
        "P07",
        "src/kinterval/report/analysis/ranks.py",
        "for r in rows] for s in seeds])",
        "for r in rows] for s in seeds]).T",
        "report: Kendall W with conditions as raters",
        ["tests/report/test_analysis.py"],
    ),
]

TESTS = ["tests/stats"]


def run(ids: set[str] | None) -> list[tuple[str, str, str, str]]:
    out = []
    for mid, path, old, new, desc, *sel in MUTANTS:
        tests = sel[0] if sel else TESTS
        if ids and mid not in ids:
            continue
        src = Path(path).read_text()
        if src.count(old) != 1:
            raise SystemExit(f"{mid}: text occurs {src.count(old)} times in {path}")
        Path(path).write_text(src.replace(old, new))
        try:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:xdist",
                    "-p",
                    "no:cacheprovider",
                    *tests,
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            failed = [ln.split(" - ")[0] for ln in r.stdout.splitlines() if ln.startswith("FAILED")]
            verdict = "killed" if r.returncode else "SURVIVED"
        finally:
            Path(path).write_text(src)
        out.append((mid, verdict, desc, failed[0] if failed else ""))
        print(f"{mid}\t{verdict}\t{desc}\t{failed[0] if failed else ''}", flush=True)
    return out


if __name__ == "__main__":
    run(set(sys.argv[1:]) or None)
