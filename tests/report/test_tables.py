"""Table cells, one table function at a time: which number lands in which column, its format and sign, the
CI column, the setting columns, sorting and not-run rows (hand-written expected cells; no report build)."""

from __future__ import annotations

from types import SimpleNamespace

from kinterval.report import analysis as A
from kinterval.report import tables as T
from kinterval.report.analysis import GRAD_TERMS, ClipRow, Estimate, RankStats, ReferenceRow, Row
from kinterval.report.claims import Claim
from kinterval.report.results import Key

DATA = "owt:val (T=1024, 64 blocks)"
FIVE = (7, 42, 253, 1337, 2026)


def _five(mean, lo, hi, **kw):
    return Estimate(mean, lo, hi, "t (4 df)", 5, (mean,) * 5, **kw)


def _one(mean, lo, hi, **kw):
    return Estimate(mean, lo, hi, "block bootstrap", 1, (mean,), **kw)


def test_number_formats_and_both_renderings():
    assert (T.num(0.5), T.num(-0.25, False, 2), T.num(0.5, False), T.num(float("nan")), T.num(None)) == (
        "+0.5000",
        "-0.25",
        "0.5000",
        "-",
        "-",
    )
    assert T.ci(-0.1, 0.2) == "[-0.1000, +0.2000]" and T.ci(float("nan"), float("nan")) == "-"
    assert [T.tokens(n) for n in (100_007_936, 2_500, 1_500_000_000, 999)] == ["100M", "2.5k", "1.5B", "999"]
    md = T.render(["a", "b", "c"], [["1", "2", "3"]], "md", "Cap")
    assert md.splitlines() == ["Cap", "", "| a | b | c |", "|---|---|---|", "| 1 | 2 | 3 |"]
    tex = T.render(["Condition", "x_1", "5%"], [["a_b", "1", "2%"]], "tex", "Cap")
    assert tex.splitlines() == [
        "% Cap",
        "\\begin{tabular}{lrr}",
        "\\toprule",
        "Condition & x\\_1 & 5\\% \\\\",
        "\\midrule",
        "a\\_b & 1 & 2\\% \\\\",
        "\\bottomrule",
        "\\end{tabular}",
    ]


def test_delta_table_columns_one_and_several_seeds_and_settings():
    many = Row(
        "minmax-weight-k4 − softmax",
        Key("minmax-weight-k4", 100_007_936, DATA, "val"),
        FIVE,
        _five(0.2, 0.15, 0.25, eval_se=0.003, sd=0.04, p=0.0624),
        nll=5.2,
        q=0.125,
    )
    one = Row(
        "fwm-prob-k4 − softmax",
        Key("fwm-prob-k4", 100_007_936, DATA, "val"),
        (7,),
        _one(-0.02, -0.05, 0.01, eval_se=0.01, p=0.2),
        nll=5.0,
        q=0.3,
    )
    headers, cells = T.delta_rows([many, one])
    assert headers == ["Condition", "Seed ids", "NLL", "NLL seed SD", "ΔNLL (nats/token)", "95% CI",
                       "Interval", "Seed SD", "Eval SE", "p (perm.; boot. for one seed)", "BH q",
                       "Separated (lo > +0.01)"]  # fmt: skip
    assert cells == [
        ["minmax-weight-k4", "7,42,253,1337,2026", "5.2000", "-", "+0.2000", "[+0.1500, +0.2500]", "t (4 df)",
         "0.0400", "0.0030", "0.062", "0.125", "-"],
        ["fwm-prob-k4", "7", "5.0000", "-", "-0.0200", "[-0.0500, +0.0100]", "block bootstrap", "-", "0.0100",
         "0.200", "0.300", "no"],
    ]  # fmt: skip
    # several seeds everywhere: no single-seed label
    assert "Separated (lo > +0.01)" not in T.delta_rows([many])[0]
    # one seed everywhere: the paper's single-seed label instead of the seed columns
    sep = Row("lerp-k4 − softmax", Key("lerp-k4", 100_007_936, DATA, "val"), (7,), _one(0.3, 0.02, 0.5))
    assert T.delta_rows([one, sep]) == (
        ["Condition", "Seed ids", "NLL", "ΔNLL (nats/token)", "95% CI", "Interval", "Separated (lo > +0.01)"],
        [
            ["fwm-prob-k4", "7", "5.0000", "-0.0200", "[-0.0500, +0.0100]", "block bootstrap", "no"],
            ["lerp-k4", "7", "-", "+0.3000", "[+0.0200, +0.5000]", "block bootstrap", "yes"],
        ],
    )
    # two settings: budget, data and tag columns after the condition
    other = Row("lerp-k4 − softmax", Key("lerp-k4", 50_000_000, "c4:val (T=1024, 40 blocks)", "test"), (7,),
                _one(0.3, 0.02, 0.5))  # fmt: skip
    headers, cells = T.delta_rows([one, other])
    assert headers[:5] == ["Condition", "Budget", "Data", "Eval", "Seed ids"]
    assert [c[:5] for c in cells] == [
        ["fwm-prob-k4", "100M", DATA, "val", "7"],
        ["lerp-k4", "50M", "c4:val (T=1024, 40 blocks)", "test", "7"],
    ]


def test_factorial_trend_detach_and_cross_setting_cells():
    key = Key("x", 100_007_936, DATA, "val")
    fac = Row("calibration", None, FIVE, _five(-0.1, -0.2, 0.0, eval_se=0.002, sd=0.05, p=0.5), K=4,
              family="historical", q=0.7)  # fmt: skip
    pooled = Row("surrogate", None, FIVE, _five(0.03, 0.01, 0.05, eval_se=0.002, sd=0.02, p=0.06),
                 family="historical", q=0.1)  # fmt: skip
    headers, cells = T.factorial_rows([fac, pooled])
    assert headers[:3] == ["K", "Effect", "Estimate (nats/token)"] and headers[-2:] == ["Seed ids", "Cells"]
    assert cells == [
        ["4", "calibration (FWM − MinMax)", "-0.1000", "[-0.2000, +0.0000]", "t (4 df)", "0.0500", "0.0020",
         "0.500", "0.700", "7,42,253,1337,2026", "historical"],
        ["pooled", "surrogate (Prob − Weight)", "+0.0300", "[+0.0100, +0.0500]", "t (4 df)", "0.0200",
         "0.0020", "0.060", "0.100", "7,42,253,1337,2026", "historical"],
    ]  # fmt: skip
    trend = Row(
        "lerp slope",
        Key("lerp", 100_007_936, DATA, "val"),
        FIVE,
        _five(-0.01, -0.03, 0.005, sd=0.004),
        family="lerp",
        note="4,8,16",
    )
    assert T.trend_rows([trend])[1] == [
        ["lerp", "4,8,16", "5", "-0.0100", "[-0.0300, +0.0050]", "t (4 df)", "0.0040"]
    ]
    det = Row("lerp-k32[range_grad=max_only] − lerp-k32", key, (7, 42), _five(0.02, 0.01, 0.03),
              tokens=100_007_936, recovery=0.971, recovery_lo=0.95, recovery_hi=0.99)  # fmt: skip
    assert T.detach_rows([det])[1] == [
        ["lerp-k32[range_grad=max_only] − lerp-k32", "100M", "7,42", "+0.0200", "[+0.0100, +0.0300]",
         "t (4 df)", "0.971 [0.950, 0.990]"]
    ]  # fmt: skip
    s1, s2 = (100_007_936, "owt", "val", ""), (50_000_000, "c4", "test", "")
    headers, cells = T.cross_rows([s1, s2], {"lerp-k4": {s2: Row("c", key, (7,), _one(0.1, 0.05, 0.2))}})
    assert headers == ["Condition", "100M, owt, val: ΔNLL [95% CI]", "50M, c4, test: ΔNLL [95% CI]"]
    assert cells == [["lerp-k4", "-", "+0.1000 [+0.0500, +0.2000]"]]
    # suites C and D (tab:crossfull): one column per model, named by suite
    c, d = (100_007_936, "wt103", "val", "32L 24H d1536"), (100_007_936, "wt103", "val", "12L 12H d768")
    names = [T.cross_column(c, "C"), T.cross_column(d, "D")]
    assert T.cross_rows([c, d], {}, names)[0][1:] == [
        "C: 32L 24H d1536, 100M, wt103, val: ΔNLL [95% CI]",
        "D: 12L 12H d768, 100M, wt103, val: ΔNLL [95% CI]",
    ]


def test_heldout_claims_ranks_clip_geometry_graddecomp_and_left_out_cells():
    key = Key("minmax-weight-k4", 100_007_936, DATA, "test__ptb")
    held = Row("minmax-weight-k4 − softmax", key, FIVE, _five(0.05, 0.02, 0.08), q=0.01)
    assert T.heldout_rows([held])[1] == [
        ["minmax-weight-k4", "softmax", "test__ptb", DATA, "7,42,253,1337,2026", "+0.0500",
         "[+0.0200, +0.0800]", "t (4 df)", "0.010", "yes", "no", "-"]
    ]  # fmt: skip
    floor = Row("minmax-weight-k4 − softmax", key, (7,), _one(0.05, 0.04, 0.06, p=2 / 4001), q=0.0006)
    assert T.heldout_rows([floor])[1][0][8] == "<0.001"  # tab:nearci's "<0.001", never "0.000" or "0.001"
    est = _five(0.05, 0.02, 0.08, sd=0.01, eval_se=0.002, p=0.0625)
    five = Row("lerp-k4 − softmax", key, FIVE, est, q=4e-4)
    assert T.estimate_cells(five, T.estimate_headers([five]))[4:6] == ["0.062", "<0.001"]
    assert [T.prob(x) for x in (0.0004999, 0.001, 0.0625, None)] == ["<0.001", "0.001", "0.062", "-"]
    sub = Row(A.SUBSTITUTED, key, (7,), _one(3e-5, -6e-5, 1.2e-4), max_abs=8.42e-3)
    assert T.heldout_rows([sub])[1][0][-3:] == ["no", "yes", "0.00842"]
    # a forward audit in three significant digits, as tab:strictaudit prints it (3.04e-5 [-6.36e-5, 1.25e-4])
    audit = Row(A.AUDIT, key, (7,), _one(3.04e-5, -6.36e-5, 1.25e-4), max_abs=8.42e-3)
    assert T.heldout_rows([audit])[1][0][5:7] == ["+3.04e-05", "[-6.36e-05, +1.25e-04]"]
    claims = [
        Claim("FWM beats MinMax", "-0.1 (Tab. 2)", "calibration < 0", "-0.08 [-0.1, -0.06]", True, True,
              "100M owt val"),
        Claim("Prob beats Weight", "-0.02 (Tab. 2)", "surrogate < 0", "not run", None, None),
    ]  # fmt: skip
    assert T.claim_rows(claims)[1] == [
        ["FWM beats MinMax", "-0.1 (Tab. 2)", "-0.08 [-0.1, -0.06]", "agrees", "yes", "yes", "100M owt val",
         "calibration < 0"],
        ["Prob beats Weight", "-0.02 (Tab. 2)", "not run", "not run", "-", "-", "-", "surrogate < 0"],
    ]  # fmt: skip
    ranks = RankStats((100_007_936, "owt", "val"), (7, 42), ("a", "b", "c"), 0.9, (0.8, 0.95), (0.5, 0.04),
                      (-0.2, 0.6))  # fmt: skip
    assert T.rank_rows([ranks])[1] == [
        ["100M", "owt", "val", "7,42", "3", "0.900", "0.800–0.950", "+0.500 (0.04)", "-0.200 (0.6)"]
    ]
    one_seed = RankStats((50_003_968, "docs", "val"), (), ("a", "b", "c"), None, (), (0.9, 0.07), None)
    assert T.rank_rows([one_seed])[1] == [["50M", "docs", "val", "-", "3", "-", "-", "+0.900 (0.07)", "-"]]
    clip = ClipRow(key, (7, 42), 0.1, (0.05, 0.15), (0.98, None), (0.497, 2.4), (1.2e4, 3.0), (0.035, None))
    assert T.clip_rows([clip])[1] == [
        ["minmax-weight-k4", "100M", "7,42", "0.100", "0.050, 0.150", "0.980, -", "0.497, 2.4", "1.2e+04, 3",
         "0.035, -"]
    ]  # fmt: skip
    geo = {Key("b", 100_007_936, DATA, "val"): {"span": 20.0, "h": 5.0, "tv": 0.1},
           Key("a", 50_000_000, DATA, "val"): {"span": 8.0}}  # fmt: skip
    assert T.geometry_rows(geo) == (  # the paper's headers and order (its final-checkpoint geometry table)
        ["Condition", "Budget", "Span", "h", "‖q‖", "Entropy", "Top-level mass", "Eff. levels", "TV"],
        [["a", "50M", "8.000", "-", "-", "-", "-", "-", "-"],
         ["b", "100M", "20.000", "5.000", "-", "-", "-", "-", "0.100"]],
    )  # fmt: skip
    # a model with attention sinks: the sink's share under the operator and under softmax
    sinks = {Key("a", 50_000_000, DATA, "val"): {"span": 8.0, "sink_mass": 0.25, "sink_mass_softmax": 0.5}}
    assert T.geometry_rows(sinks)[0][-2:] == ["Sink mass", "Sink mass (softmax)"]
    assert T.geometry_rows(sinks)[1][0][-2:] == ["0.250", "0.500"]
    # suites C (1B) and D (124M) at one budget and corpus: the model tells their rows apart
    two = {Key("softmax", 100_007_936, DATA, "val", m): {"span": x} for m, x in (("12L", 9.0), ("32L", 7.0))}
    assert T.geometry_rows(two)[0][:3] == ["Condition", "Budget", "Model"]
    assert [r[:4] for r in T.geometry_rows(two)[1]] == [["softmax", "100M", "12L", "9.000"],
                                                        ["softmax", "100M", "32L", "7.000"]]  # fmt: skip
    c_and_d = [RankStats((100_007_936, DATA, "val", m), (), ("a", "b", "c"), None, (), (0.5, 0.1), None)
               for m in ("12L", "32L")]  # fmt: skip
    assert T.rank_rows(c_and_d)[0][3] == "Model" and [r[3] for r in T.rank_rows(c_and_d)[1]] == ["12L", "32L"]
    clips = [ClipRow(k, (7,), 0.1, (0.1,), (None,), (0.5,), (2.0,), (0.03,)) for k in two]
    assert T.clip_rows(clips)[0][:4] == ["Condition", "Budget", "Model", "Seed ids"]
    assert [r[:3] for r in T.clip_rows(clips)[1]] == [["softmax", "100M", "12L"], ["softmax", "100M", "32L"]]
    # fit.md and heldout_ordering.md: the model column in the header and in each row (a row without it would
    # shift every later cell under the wrong header)
    d = SimpleNamespace(mean=0.01, lo=0.0, hi=0.02, interval="t")
    fits = [SimpleNamespace(key=k, seeds=(7,), control="softmax", steps=9, train=3.0, d_train=d, d_eval=0.02,
                            gap=0.1, control_gap=0.1) for k in two]  # fmt: skip
    head, rows = T.fit_rows(fits)
    assert head[:4] == ["Condition", "Budget", "Model", "Seed ids"] and all(len(r) == len(head) for r in rows)
    assert [r[:4] for r in rows] == [["softmax", "100M", "12L", "7"], ["softmax", "100M", "32L", "7"]]
    held = [SimpleNamespace(setting=(100_007_936, DATA, "val", m), conditions=("a", "b"),
                            split_half={"a": 0.1}, spearman=None, unit="doc", fluctuation_max=0.1,
                            fluctuation_mean=0.1)
            for m in ("12L", "32L")]  # fmt: skip
    head, rows = T.heldout_ordering_rows(held)
    assert head[3] == "Model" and all(len(r) == len(head) for r in rows)
    assert [r[3:5] for r in rows] == [["12L", "2 of 1"], ["32L", "2 of 1"]]
    terms = {t: 0.25 for t in GRAD_TERMS}
    terms[GRAD_TERMS[0]] = 0.909
    gd = SimpleNamespace(operator="lerp-k32", seed=7, tokens=20_000_000, n_blocks=8, terms=terms,
                         zero_sum_residual=5.5e-9, rows_above_1e_3=0.0126)  # fmt: skip
    assert T.graddecomp_rows([gd])[1] == [
        ["lerp-k32", "7", "20M", "8", "0.909", *["0.25"] * (len(GRAD_TERMS) - 1), "5.5e-09", "0.013"]
    ]
    # left-out runs, sorted by name
    assert T.unpaired_rows({"b-s7": "no control", "a-s42": "stopped early"})[1] == [
        ["a-s42", "stopped early"],
        ["b-s7", "no control"],
    ]
    assert T.skipped_rows({"z": "1", "y": "2"})[1] == [["y", "2"], ["z", "1"]]


def test_delta_table_softmax_row_and_nll_seed_sd():
    """tab:seedend: the softmax control first (its mean NLL and seed SD), then each condition with its NLL
    seed SD; one seed (tab:endpoints): the softmax row with its NLL, no SD column."""
    soft = ReferenceRow(
        Key("softmax", 100_007_936, DATA, "val"), FIVE, 100_007_936, 4.1457, 0.0062, (4.1,) * 5
    )
    row = Row("lerp-k4 − softmax", Key("lerp-k4", 100_007_936, DATA, "val"), FIVE,
              _five(0.0985, 0.091, 0.106, sd=0.0062, eval_se=0.0019, p=0.06),
              nll=4.2441, nll_sd=0.008, q=0.06)  # fmt: skip
    headers, cells = T.delta_rows([row], [soft])
    assert headers[:5] == ["Condition", "Seed ids", "NLL", "NLL seed SD", "ΔNLL (nats/token)"]
    assert cells == [
        ["softmax", "7,42,253,1337,2026", "4.1457", "0.0062", "-", "-", "-", "-", "-", "-", "-"],
        ["lerp-k4", "7,42,253,1337,2026", "4.2441", "0.0080", "+0.0985", "[+0.0910, +0.1060]", "t (4 df)",
         "0.0062", "0.0019", "0.060", "0.060"],
    ]  # fmt: skip
    one = ReferenceRow(
        Key("softmax", 250_000_000, DATA, "val"), (1337,), 250_000_000, 3.8883, None, (3.8883,)
    )
    sep = Row("lerp-k4 − softmax", Key("lerp-k4", 250_000_000, DATA, "val"), (1337,), _one(0.05, 0.04, 0.06),
              nll=3.9401)  # fmt: skip
    assert T.delta_rows([sep], [one])[1] == [
        ["softmax", "1337", "3.8883", "-", "-", "-", "-"],
        ["lerp-k4", "1337", "3.9401", "+0.0500", "[+0.0400, +0.0600]", "block bootstrap", "yes"],
    ]


def test_single_seed_rows_keep_the_separated_label_beside_rows_of_several_seeds():
    """`report A B C D`: a one-seed row keeps "separated" (lo > +0.01) when another row has several seeds,
    in delta.md and factorial.md; rows of several seeds get "-"."""
    five = Row("calibration", None, FIVE, _five(-0.1, -0.2, 0.0, sd=0.05, p=0.5), K=4, family="d")
    one = Row("calibration", None, (1337,), _one(0.05, 0.02, 0.08), K=4, family="d")
    headers, cells = T.factorial_rows([five, one])
    col = headers.index("Separated (lo > +0.01)")
    assert [c[col] for c in cells] == ["-", "yes"]
    d5 = Row("lerp-k4 − softmax", Key("lerp-k4", 1, DATA, "val"), FIVE, _five(0.2, 0.15, 0.25, sd=0.04))
    d1 = Row("lerp-k4 − softmax", Key("lerp-k4", 2, DATA, "val"), (7,), _one(0.005, -0.01, 0.02))
    headers, cells = T.delta_rows([d5, d1])
    col = headers.index("Separated (lo > +0.01)")
    assert [c[col] for c in cells] == ["-", "no"]


def test_taildecomp_cells_name_delta_and_path_ratio_once_with_the_margin_mark():
    """tab:taildecomp: Δ (not "Modified − full"), ° where |Δ| < 0.01, the path ratio once per resolved run."""
    key = Key("resolved-weight-k4", 100_007_936, DATA, "val")
    ratio = dict(recovery=1.077, recovery_lo=1.061, recovery_hi=1.095)
    rows = [
        Row("MinMax − softmax (weight-STE, K4)", key, (1337,), _one(0.1979, 0.1926, 0.2031), 100_007_936),
        Row("MinMax − resolved (weight-STE, K4)", key, (1337,), _one(0.17, 0.16, 0.18), 100_007_936, **ratio),
        Row(
            "resolved − FWM (weight-STE, K4)",
            key,
            (1337,),
            _one(0.0007, -0.002, 0.0032),
            100_007_936,
            **ratio,
        ),
    ]
    headers, cells = T.taildecomp_rows(rows)
    assert headers == ["Contrast", "Tokens", "Seed ids", "Δ (nats/token)", "95% CI", "Interval",
                       "Path ratio [95% CI]"]  # fmt: skip
    assert [c[4] for c in cells] == ["[+0.1926, +0.2031]", "[+0.1600, +0.1800]", "[-0.0020, +0.0032] °"]
    assert [c[-1] for c in cells] == ["-", "1.077 [1.061, 1.095]", "-"]


def test_taildecomp_margin_mark_is_for_delta_strictly_below_the_margin():
    """The ° of tab:taildecomp marks |Δ| < 0.01 only: a Δ of exactly ±0.01 gets none, ±0.0099 gets it."""
    key = Key("resolved-weight-k4", 100_007_936, DATA, "val")
    means = (0.01, -0.01, 0.0099, -0.0099)
    rows = [Row("resolved − FWM (weight-STE, K4)", key, (1337,), _one(m, m - 0.001, m + 0.001), 100_007_936)
            for m in means]  # fmt: skip
    _, cells = T.taildecomp_rows(rows)
    assert [c[4].endswith(" °") for c in cells] == [False, False, True, True]


def test_ktrend_and_factorial_rows_name_the_seed_of_a_supplementary_row():
    """Supplementary per-seed rows (seeds 1338, 1339) are told apart by their seed: ktrend.md names it with
    the family (analysis.condition), factorial.md lists the seeds."""
    rows = [
        Row("slope vs log2 K", Key("minmax-weight", 1, DATA, "val", seed=s), (s,), _one(0.01, 0.0, 0.02),
            family="minmax-weight", note="2,4,8")
        for s in (1338, 1339)
    ]  # fmt: skip
    assert [c[0] for c in T.trend_rows(rows)[1]] == ["minmax-weight, seed 1338", "minmax-weight, seed 1339"]
    fac = [Row("calibration", None, (s,), _one(0.01, 0.0, 0.02), K=4, family="d") for s in (1338, 1339)]
    assert [c[-2] for c in T.factorial_rows(fac)[1]] == ["1338", "1339"]


def test_latex_tables_escape_tex_specials_and_spell_unicode_symbols():
    """The .tex tables held raw Unicode (−, ±, Δ, ≫, §, ×, °) and unescaped &, #, $, <, >: pdflatex without a
    Unicode setup stops at the first of them, and OT1 prints < and > as ¡ and ¿. Every cell, header and
    caption line now renders as ASCII LaTeX; the Markdown keeps the text as it is."""
    from kinterval.report.tables import render

    cell = "ΔNLL − 0.1 ± 0.2 ≫ §4, 3 × 2 °, a_b & 50% #1 $x {y} < z > ~^\\"
    tex = render(["Δ", "x"], [[cell, "–"]], "tex", caption="first − line\nsecond")
    assert tex.isascii(), tex
    row = tex.split("\\midrule\n")[1].split(" \\\\")[0]
    assert row == (
        r"$\Delta$NLL $-$ 0.1 $\pm$ 0.2 $\gg$ \S{}4, 3 $\times$ 2 $^\circ$, "
        r"a\_b \& 50\% \#1 \$x \{y\} $<$ z $>$ \textasciitilde{}\textasciicircum{}\textbackslash{} & --"
    )
    assert tex.startswith("% first $-$ line\n% second\n\\begin{tabular}{lr}\n")
    assert cell in render(["Δ", "x"], [[cell, "–"]], "md")


def test_a_tiny_nonzero_value_keeps_its_digits():
    """An interval excluding 0 printed as [-0.0000, -0.0000] read as one at 0."""
    assert [T.num(x) for x in (-2.1e-6, 0.0, 4.9e-5, 5e-5, None)] == ["-2.1e-06", "+0.0000", "+4.9e-05",
                                                                      "+0.0001", "-"]  # fmt: skip
    assert T.ci(-3e-6, -1e-6) == "[-3.0e-06, -1.0e-06]" and T.num(6.5e-6, signed=False) == "6.5e-06"


def test_token_counts_keep_four_significant_digits_and_a_round_budget_its_unit():
    """A budget of exactly 1M (1k, 1B) tokens is "1M", not "1e+03k"; four significant digits tell 2.621M and
    2.62M apart."""
    assert [T.tokens(n) for n in (1_000, 1_000_000, 1_000_000_000, 2_621_440, 12_345_678)] == [
        "1k",
        "1M",
        "1B",
        "2.621M",
        "12.35M",
    ]


def test_separated_is_the_lower_bound_above_the_margin_not_an_interval_that_excludes_zero():
    """ "Separated (lo > +0.01)": a CI above 0 but with lo <= +0.01, or wholly below 0, is "no"."""
    rows = [
        Row(f"{op} − softmax", Key(op, 100_007_936, DATA, "val"), (7,), _one(m, lo, hi))
        for op, m, lo, hi in (("a", 0.02, 0.005, 0.03), ("b", -0.04, -0.05, -0.02), ("c", 0.03, 0.0101, 0.05))
    ]
    headers, cells = T.delta_rows(rows)
    col = headers.index("Separated (lo > +0.01)")
    assert [c[col] for c in cells] == ["no", "no", "yes"]


def test_a_softmax_row_of_a_setting_without_conditions_is_kept_last():
    """The softmax NLL of a setting none of whose conditions has a row is still listed, after the others."""
    soft = [ReferenceRow(Key("softmax", b, DATA, "val"), (7,), b, nll, None, (nll,))
            for b, nll in ((100_007_936, 4.1), (50_003_968, 4.4))]  # fmt: skip
    row = Row("lerp-k4 − softmax", Key("lerp-k4", 100_007_936, DATA, "val"), (7,), _one(0.05, 0.04, 0.06),
              nll=4.15)  # fmt: skip
    assert [c[:4] for c in T.delta_rows([row], soft)[1]] == [
        ["softmax", "100M", DATA, "val"],
        ["lerp-k4", "100M", DATA, "val"],
        ["softmax", "50M", DATA, "val"],
    ]


def test_stopped_rows_name_where_the_loss_went_non_finite_and_the_last_evaluation():
    stopped = {
        "lerp-k4-s7": dict(operator="lerp-k4", seed=7, step=120, tokens=3_932_160, budget=100_007_936,
                           last_evaluated_tokens=2_000_000, last_mean_nll=5.12345),
        "fwm-k4-s42": dict(operator="fwm-k4", seed=42, step=3, tokens=98_304, budget=100_007_936,
                           last_evaluated_tokens=None, last_mean_nll=None),
    }  # fmt: skip
    assert T.stopped_rows(stopped)[1] == [
        ["lerp-k4-s7", "lerp-k4", "7", "120", "3932160 of 100007936", "2000000 tokens", "5.1235"],
        ["fwm-k4-s42", "fwm-k4", "42", "3", "98304 of 100007936", "-", "-"],
    ]


def test_claim_rows_keep_direction_and_detectability_apart():
    """A claim whose direction disagrees but whose CI excludes 0 (and the reverse) prints each in its own
    column."""
    claims = [
        Claim("A", "-0.1", "x < 0", "+0.05 [+0.02, +0.08]", False, True, "100M owt val"),
        Claim("B", "-0.1", "x < 0", "-0.01 [-0.03, +0.01]", True, False, "100M owt val"),
    ]
    assert [c[4:6] for c in T.claim_rows(claims)[1]] == [["no", "yes"], ["yes", "no"]]


def test_stack_text_names_the_number_of_processes():
    base = dict(device_name="NVIDIA H200", torch="2.5.1", cuda="12.4", python="3.11.7")
    assert [T.stack_text(dict(base, processes=n)) for n in (1, 2)] == [
        "NVIDIA H200 ×1 process, torch 2.5.1, CUDA 12.4, Python 3.11.7",
        "NVIDIA H200 ×2 processes, torch 2.5.1, CUDA 12.4, Python 3.11.7",
    ]
    assert T.stack_text(dict(base, processes=1, cuda=None)).endswith("no CUDA, Python 3.11.7")


def test_fit_rows_cells_in_their_columns():
    """fit.md: the condition's NLL − train loss and the control's each under its own header."""
    key = Key("lerp-k4", 100_007_936, DATA, "val")
    d = SimpleNamespace(mean=0.012, lo=0.004, hi=0.02, interval="block bootstrap")
    fit = SimpleNamespace(key=key, seeds=(7,), control="softmax", steps=96, train=3.21, d_train=d,
                          d_eval=0.03, gap=0.15, control_gap=0.11)  # fmt: skip
    head, rows = T.fit_rows([fit])
    assert dict(zip(head, rows[0]))["NLL − train loss"] == "+0.1500"
    assert rows == [["lerp-k4", "100M", "7", "softmax", "96", "3.2100", "+0.0120", "[+0.0040, +0.0200]",
                     "block bootstrap", "+0.0300", "+0.1500", "+0.1100"]]  # fmt: skip


def test_a_range_of_one_value_prints_it_once():
    """ranks.md printed one seed pair's Spearman as "-0.886–-0.886"."""
    from kinterval.report.tables import _range

    assert _range((-0.886,), "{:.3f}") == "-0.886" and _range((), "{:.3f}") == "-"
    assert _range((-0.8861, -0.8864, 0.5), "{:.3f}") == "-0.886–0.500"
