"""Independent recomputation of docs/results/mini/report (kinterval) from the committed per-block arrays.

numpy/scipy/json only; kinterval is not imported. Definitions: docs/statistics.md, docs/measurement.md §5,
paper §4 and App. C.3 (circular moving-block bootstrap, block 16, 4000 resamples, 95% percentile; factorial
main effects with ±1/2 weights, interaction with ±1 weights; separated = lo > +0.01;
detectable = CI excludes 0).

Usage: python recompute.py [MINI_DIR]   (default docs/results/mini, from the repository root).
Writes results.json beside it
and prints one line per checked number: table | row | column | committed | ours | match.
"""

import csv
import itertools
import json
import math
import os
import re
import sys

import numpy as np

MINI = sys.argv[1] if len(sys.argv) > 1 else "docs/results/mini"
REP = os.path.join(MINI, "report")
HERE = os.path.dirname(os.path.abspath(__file__))

B_OURS = 20000  # our resamples (more than the report's 4000 to keep our own MC error small)
B_REPORT = 4000  # the report's resamples (for the MC tolerance of its endpoints)
BLOCK = 16
LEVEL = 0.95
MARGIN = 0.01
RNG = np.random.default_rng(20240611)  # our own generator and seed, unrelated to the report's

RUNS = {
    "softmax": "softmax-s1337",
    "lerp-k32": "lerp-k32-s1337",
    "MM_W": "minmax-weight-k4.arithmetic-historical-s1337",
    "MM_P": "minmax-prob-k4.arithmetic-historical-s1337",
    "FWM_W": "fwm-weight-k4.arithmetic-historical-s1337",
    "FWM_P": "fwm-prob-k4.arithmetic-historical-s1337",
}
LABEL = {
    "lerp-k32": "lerp-k32",
    "MM_W": "minmax-weight-k4[arithmetic=historical]",
    "MM_P": "minmax-prob-k4[arithmetic=historical]",
    "FWM_W": "fwm-weight-k4[arithmetic=historical]",
    "FWM_P": "fwm-prob-k4[arithmetic=historical]",
}

ROWS = []  # (table, row, column, committed, ours, match, note)


def check(table, row, col, committed, ours, ok, note=""):
    ROWS.append((table, row, col, committed, ours, bool(ok), note))


# ---------------------------------------------------------------- loading
def endpoint_file(run):
    d = os.path.join(MINI, "runs", run, "eval", "val")
    steps = sorted(f for f in os.listdir(d) if f.endswith(".json"))
    best = max(steps, key=lambda f: json.load(open(os.path.join(d, f)))["tokens"])
    meta = json.load(open(os.path.join(d, best)))
    nll = np.load(os.path.join(d, best.replace(".json", ".npz")))["nll"].astype(np.float64)
    return meta, nll


META, NLL = {}, {}
for k, r in RUNS.items():
    META[k], NLL[k] = endpoint_file(r)
n = len(NLL["softmax"])
assert all(len(v) == n for v in NLL.values())
assert len({m["tokens"] for m in META.values()}) == 1
assert all(np.isfinite(v).all() for v in NLL.values())


# ---------------------------------------------------------------- bootstrap
def block_len(n, block=BLOCK):
    return block if n >= 2 * block else max(1, n // 2)


def cbb(x, B=B_OURS, block=None, rng=RNG):
    """Circular moving-block bootstrap of the mean: ceil(n/b) uniform starts in [0,n), wrap mod n,
    truncate to n."""
    x = np.asarray(x, float)
    n = len(x)
    b = block or block_len(n)
    nb = math.ceil(n / b)
    starts = rng.integers(0, n, size=(B, nb))
    idx = (starts[:, :, None] + np.arange(b)[None, None, :]) % n
    idx = idx.reshape(B, nb * b)[:, :n]
    means = x[idx].mean(axis=1)
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    se = means.std(ddof=1)
    # two-sided percentile p for mean = 0 (smallest alpha whose interval excludes 0), floor 2/(B+1)
    frac_le = (np.sum(means <= 0) + 1) / (B + 1)
    frac_ge = (np.sum(means >= 0) + 1) / (B + 1)
    p = min(1.0, 2 * min(frac_le, frac_ge))
    return dict(
        mean=float(x.mean()),
        lo=float(lo),
        hi=float(hi),
        se=float(se),
        p=float(p),
        n_cross0=int(min(np.sum(means <= 0), np.sum(means >= 0))),
        block=b,
        B=B,
    )


def mc_tol(se, B_rep=B_REPORT, B_ours=B_OURS, k=4.0):
    """Tolerance for a percentile endpoint: k × combined MC SE of the two 2.5%/97.5% quantile estimates.
    Under normality SE(q_0.025) ≈ se·sqrt(p(1−p)/B)/φ(z_0.025) = se·0.0427·sqrt(4000/B)."""
    phi = math.exp(-(1.959964**2) / 2) / math.sqrt(2 * math.pi)
    f = math.sqrt(0.025 * 0.975) / phi
    return k * se * f * math.sqrt(1 / B_rep + 1 / B_ours)


# ---------------------------------------------------------------- markdown helpers
def md_table(path):
    lines = [l for l in open(path, encoding="utf-8").read().splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    out = []
    for l in lines[2:]:
        cells = [c.strip() for c in l.strip("|").split("|")]
        out.append(dict(zip(head, cells)))
    return out


def num(s):
    return float(s.replace("−", "-").replace("+", ""))


def ci(s):
    m = re.match(r"\[(.*),(.*)\]", s.replace("−", "-"))
    return num(m.group(1)), num(m.group(2))


def fmt_signed(v, d=4):
    return f"{v:+.{d}f}"


REPORT = json.load(open(os.path.join(REP, "report.json")))


def check_est(table, row, est_ours, printed_mean, printed_ci, js=None, digits=4, signed=True):
    """Point estimate to printed digits (exact), CI endpoints within MC tolerance, JSON too."""
    mean = est_ours["mean"]
    pm = num(printed_mean)
    ok_mean = round(mean, digits) == round(pm, digits) or abs(mean - pm) <= 0.5 * 10**-digits + 1e-12
    check(table, row, "estimate", printed_mean, fmt_signed(mean, digits + 2), ok_mean)
    tol = mc_tol(est_ours["se"])
    lo_p, hi_p = ci(printed_ci)
    # printed endpoints are rounded to `digits`: add half a unit
    r = 0.5 * 10**-digits
    for name, ours, com in (("CI lo", est_ours["lo"], lo_p), ("CI hi", est_ours["hi"], hi_p)):
        check(
            table,
            row,
            name,
            f"{com:+.{digits}f}",
            f"{ours:+.{digits + 2}f}",
            abs(ours - com) <= tol + r,
            f"|d|={abs(ours - com):.5f} tol={tol + r:.5f}",
        )
    if js is not None:
        check(table, row, "json mean", f"{js['mean']:.12g}", f"{mean:.12g}", abs(js["mean"] - mean) < 1e-12)
        for name in ("lo", "hi"):
            d = abs(js[name] - est_ours[name])
            check(
                table,
                row,
                f"json {name}",
                f"{js[name]:+.6f}",
                f"{est_ours[name]:+.6f}",
                d <= tol,
                f"|d|={d:.5f} tol={tol:.5f} ({d / est_ours['se']:.2f} SE)",
            )
        d = abs(js["eval_se"] - est_ours["se"])
        check(
            table,
            row,
            "json eval_se",
            f"{js['eval_se']:.6f}",
            f"{est_ours['se']:.6f}",
            d <= 0.06 * est_ours["se"],
            "SE of a bootstrap SE ≈ 1/sqrt(2B) ≈ 1.1% at B=4000; tol 6%",
        )
        check(table, row, "json block", js["block"], est_ours["block"], js["block"] == est_ours["block"])
        floor = 2 / (B_REPORT + 1)
        # our resamples never cross 0 → the report's p should sit at its floor
        exp_p = floor if est_ours["n_cross0"] == 0 else None
        if exp_p is not None:
            check(
                table,
                row,
                "json p",
                f"{js['p']:.6g}",
                f"{exp_p:.6g} (floor; 0 of {B_OURS} cross 0)",
                abs(js["p"] - exp_p) < 1e-12,
            )
        sep = est_ours["lo"] > MARGIN
        det = est_ours["lo"] > 0 or est_ours["hi"] < 0
        wm = est_ours["lo"] > -MARGIN and est_ours["hi"] < MARGIN
        check(table, row, "json separated", js["separated"], sep, js["separated"] == sep)
        check(table, row, "json detectable", js["detectable"], det, js["detectable"] == det)
        check(table, row, "json within_margin", js["within_margin"], wm, js["within_margin"] == wm)
    return est_ours


def near(a, b, tol):
    return abs(a - b) <= tol


# ================================================================ delta.md
delta_md = {r["Condition"]: r for r in md_table(os.path.join(REP, "delta.md"))}
delta_js = {r["key"]["operator"]: r for r in REPORT["delta"]}
# softmax row
sm = delta_md["softmax"]
check(
    "delta",
    "softmax",
    "NLL",
    sm["NLL"],
    f"{NLL['softmax'].mean():.6f}",
    f"{NLL['softmax'].mean():.4f}" == sm["NLL"],
)
check(
    "delta",
    "softmax",
    "json nll",
    REPORT["softmax"][0]["nll"],
    NLL["softmax"].mean(),
    abs(REPORT["softmax"][0]["nll"] - NLL["softmax"].mean()) < 1e-12,
)
check(
    "delta",
    "softmax",
    "NLL vs eval summary mean_nll",
    META["softmax"]["mean_nll"],
    NLL["softmax"].mean(),
    abs(META["softmax"]["mean_nll"] - NLL["softmax"].mean()) < 1e-9,
)
DELTA = {}
for k, lab in LABEL.items():
    d = NLL[k] - NLL["softmax"]
    est = cbb(d)
    DELTA[k] = est
    row = delta_md[lab]
    js = delta_js[lab]
    check("delta", lab, "NLL", row["NLL"], f"{NLL[k].mean():.6f}", f"{NLL[k].mean():.4f}" == row["NLL"])
    check("delta", lab, "json nll", js["nll"], NLL[k].mean(), abs(js["nll"] - NLL[k].mean()) < 1e-12)
    check(
        "delta",
        lab,
        "json control_nll",
        js["control_nll"],
        NLL["softmax"].mean(),
        abs(js["control_nll"] - NLL["softmax"].mean()) < 1e-12,
    )
    check(
        "delta",
        lab,
        "NLL vs eval summary mean_nll",
        META[k]["mean_nll"],
        NLL[k].mean(),
        abs(META[k]["mean_nll"] - NLL[k].mean()) < 1e-9,
    )
    check_est("delta", lab, est, row["ΔNLL (nats/token)"], row["95% CI"], js["est"])
    sep = "yes" if est["lo"] > MARGIN else "no"
    check(
        "delta",
        lab,
        "Separated (lo > +0.01)",
        row["Separated (lo > +0.01)"],
        sep,
        sep == row["Separated (lo > +0.01)"],
    )
    check("delta", lab, "Interval", row["Interval"], "block bootstrap", row["Interval"] == "block bootstrap")
DELTA_ROWS = [(lab, DELTA[k]) for k, lab in LABEL.items()]

# BH q over the family (the 5 conditions of one budget/data/tag/design): from the report's own p's
# (all at floor)
ps = np.array([delta_js[lab]["est"]["p"] for lab in LABEL.values()])
order = np.argsort(ps)
m = len(ps)
q = np.empty(m)
prev = 1.0
for rank_i in range(m - 1, -1, -1):
    i = order[rank_i]
    prev = min(prev, ps[i] * m / (rank_i + 1))
    q[i] = prev
for lab, qq in zip(LABEL.values(), q):
    check(
        "delta",
        lab,
        "json q recomputed (BH of the report's p)",
        delta_js[lab]["q"],
        qq,
        abs(delta_js[lab]["q"] - qq) < 1e-12,
    )

# ================================================================ factorial.md
W, P, FW, FP = NLL["MM_W"], NLL["MM_P"], NLL["FWM_W"], NLL["FWM_P"]
FACT = {
    "calibration (FWM - MinMax)": ("calibration", 0.5 * (FW + FP) - 0.5 * (W + P)),
    "surrogate (Prob - Weight)": ("surrogate", 0.5 * (P + FP) - 0.5 * (W + FW)),
    "interaction (FWM_P - FWM_W) - (MM_P - MM_W)": ("interaction", (FP - FW) - (P - W)),
    "Prob − Weight under MinMax": (None, P - W),
    "Prob − Weight under FWM": (None, FP - FW),
    "FWM − MinMax under Weight-STE": (None, FW - W),
    "FWM − MinMax under Prob-STE": (None, FP - P),
}
fact_md = {r["Effect"]: r for r in md_table(os.path.join(REP, "factorial.md"))}
fact_js = REPORT["factorial"]
FEST = {}
for i, (eff, (jsname, x)) in enumerate(FACT.items()):
    row = fact_md[eff]
    est = cbb(x)
    FEST[eff] = est
    js = fact_js[i]
    check(
        "factorial",
        eff,
        "json contrast name (row order)",
        js["contrast"],
        jsname or eff,
        js["contrast"] == (jsname or eff),
    )
    check_est("factorial", eff, est, row["Estimate (nats/token)"], row["95% CI"], js["est"])
    sep = "yes" if est["lo"] > MARGIN else "no"
    check(
        "factorial",
        eff,
        "Separated (lo > +0.01)",
        row["Separated (lo > +0.01)"],
        sep,
        sep == row["Separated (lo > +0.01)"],
    )
    check("factorial", eff, "K", row["K"], 4, row["K"] == "4")
# identities: interaction = simple(FWM) − simple(MM); main effects = mean of simple effects
INTER = FEST["interaction (FWM_P - FWM_W) - (MM_P - MM_W)"]["mean"]
check(
    "factorial",
    "identity",
    "interaction = PW|FWM − PW|MM",
    "",
    f"{(FP - FW).mean() - (P - W).mean():+.6f} vs {INTER:+.6f}",
    abs((FP - FW).mean() - (P - W).mean() - INTER) < 1e-12,
)

# ================================================================ claims.md
claims_md = md_table(os.path.join(REP, "claims.md"))
claims_js = REPORT["claims"]
CLAIM_X = {
    1: ("> 0", NLL["MM_W"] - NLL["FWM_P"], "directional"),
    2: ("> 0", (FP - FW) - (P - W), "directional"),
    3: ("< 0", 0.5 * (FW + FP) - 0.5 * (W + P), "directional"),
    4: ("< 0", 0.5 * (P + FP) - 0.5 * (W + FW), "directional"),
    5: ("noise", NLL["lerp-k32"] - NLL["softmax"], "noise"),
}
for i, (row, js) in enumerate(zip(claims_md, claims_js)):
    name = row["Claim"]
    check("claims", name, "json claim = md claim", js["claim"], name, js["claim"] == name)
    if i not in CLAIM_X:
        ok = row["Ours (95% CI)"] == "not run" and row["Status"] == "not run" and js["status"] == "not run"
        check(
            "claims",
            name,
            "status",
            row["Status"],
            "not run (runs absent: lerp-k32 detach / lerp-k4,k16)",
            ok,
        )
        continue
    rule, x, kind = CLAIM_X[i]
    est = cbb(x)
    m_ = re.match(r"(\S+) (\[.*?\])", row["Ours (95% CI)"])
    check_est("claims", name, est, m_.group(1), m_.group(2), js["estimate"])
    det = est["lo"] > 0 or est["hi"] < 0
    if kind == "directional":
        agrees = est["mean"] > 0 if rule == "> 0" else est["mean"] < 0
        status = ("agrees" if agrees else "disagrees") + ("" if det else " (not detectable)")
    else:
        inside = est["lo"] > -MARGIN and est["hi"] < MARGIN  # single seed: CI inside ±0.01
        includes0 = est["lo"] <= 0 <= est["hi"]
        agrees = includes0 or inside
        status = "agrees" if agrees else "disagrees"

    def yn(b):
        return "yes" if b else "no"

    check("claims", name, "Status", row["Status"], status, row["Status"] == status)
    check(
        "claims",
        name,
        "Direction agrees",
        row["Direction agrees"],
        yn(agrees),
        row["Direction agrees"] == yn(agrees),
    )
    check(
        "claims",
        name,
        "Detectable (CI excludes 0)",
        row["Detectable (CI excludes 0)"],
        yn(det),
        row["Detectable (CI excludes 0)"] == yn(det),
    )
    check(
        "claims",
        name,
        "json direction_agrees",
        js["direction_agrees"],
        agrees,
        js["direction_agrees"] == agrees,
    )
    check("claims", name, "json detectable", js["detectable"], det, js["detectable"] == det)
    check("claims", name, "json separated (= detectable)", js["separated"], det, js["separated"] == det)
    check("claims", name, "json status", js["status"], status, js["status"] == status)
    check(
        "claims",
        name,
        "json tokens",
        js["tokens"],
        META["softmax"]["tokens"],
        js["tokens"] == META["softmax"]["tokens"],
    )
    check(
        "claims",
        name,
        "Runs: tokens",
        row["Runs"].split(" tokens")[0],
        META["softmax"]["tokens"],
        row["Runs"].startswith(f"{META['softmax']['tokens']} tokens"),
    )
# cross-table consistency: the claims equal the factorial/delta rows
check(
    "claims",
    "consistency",
    "claim 3/4/5 = factorial/delta rows",
    "",
    "",
    abs(claims_js[3]["estimate"]["mean"] - fact_js[0]["est"]["mean"]) < 1e-12
    and abs(claims_js[4]["estimate"]["mean"] - fact_js[1]["est"]["mean"]) < 1e-12
    and abs(claims_js[2]["estimate"]["mean"] - fact_js[2]["est"]["mean"]) < 1e-12
    and abs(claims_js[5]["estimate"]["mean"] - delta_js["lerp-k32"]["est"]["mean"]) < 1e-12,
)
check(
    "claims",
    "claim 1",
    "= ΔNLL(MM_W) − ΔNLL(FWM_P) from delta.md",
    "",
    f"{DELTA['MM_W']['mean'] - DELTA['FWM_P']['mean']:+.6f}",
    abs(claims_js[1]["estimate"]["mean"] - (DELTA["MM_W"]["mean"] - DELTA["FWM_P"]["mean"])) < 1e-12,
)

# ================================================================ geometry.md
geo_md = {r["Condition"]: r for r in md_table(os.path.join(REP, "geometry.md"))}
GEO = {}
for k, r in RUNS.items():
    g = json.load(open(os.path.join(MINI, "runs", r, "diagnostics", "geometry", "step_000763.json")))
    lab = LABEL.get(k, "softmax")
    layers = g["layers"]
    for key in ("span", "h", "tv", "top_bucket_mass", "eff_buckets", "entropy", "q_norm"):
        vals = [L.get(key) for L in layers]
        if any(v is None or not np.isfinite(v) for v in vals):
            ours = None  # softmax: no operator → h/tv/top_bucket_mass/eff_buckets are NaN in the probe file
            js = REPORT["geometry"][f"{lab} (50M, data:val)"].get(key)
            check("geometry", lab, f"json {key} absent", js, None, js is None)
        else:
            ours = float(np.mean(vals))
        GEO.setdefault(lab, {})[key] = ours
        com = geo_md[lab][key]
        if ours is None:
            check("geometry", lab, key, com, "-", com == "-")
        else:
            check("geometry", lab, key, com, f"{ours:.5f}", f"{ours:.3f}" == com)
            js = REPORT["geometry"][f"{lab} (50M, data:val)"].get(key)
            check("geometry", lab, f"json {key}", js, ours, js is not None and abs(js - ours) < 1e-9)


# ================================================================ ranks.md
def avg_rank(v):
    from scipy.stats import rankdata

    return rankdata(v)


def spearman_exact(x, y):
    rx, ry = avg_rank(x), avg_rank(y)
    rho = float(np.corrcoef(rx, ry)[0, 1])
    perms = [float(np.corrcoef(rx, ry[list(p)])[0, 1]) for p in itertools.permutations(range(len(x)))]
    perms = np.array(perms)
    eps = 1e-12
    p_ge = np.mean(perms >= rho - eps)
    p_le = np.mean(perms <= rho + eps)
    return rho, min(1.0, 2 * min(p_ge, p_le))


rk_md = md_table(os.path.join(REP, "ranks.md"))[0]
conds = list(LABEL.keys())
dn = [DELTA[k]["mean"] for k in conds]
for col, key in (("Spearman ΔNLL vs h (p)", "h"), ("Spearman ΔNLL vs span (p)", "span")):
    gv = [GEO[LABEL[k]][key] for k in conds]
    rho, p = spearman_exact(dn, gv)
    com = rk_md[col]
    m_ = re.match(r"(\S+) \((\S+)\)", com)
    ok = abs(num(m_.group(1)) - rho) < 5e-4 and abs(float(m_.group(2)) - p) < 1e-3
    check("ranks", "50M", col, com, f"{rho:+.3f} ({p:.4g})", ok)
check("ranks", "50M", "Conditions", rk_md["Conditions"], len(conds), rk_md["Conditions"] == str(len(conds)))
check("ranks", "50M", "Kendall's W", rk_md["Kendall's W"], "- (one seed)", rk_md["Kendall's W"] == "-")

# ================================================================ clip.md
clip_md = {r["Condition"]: r for r in md_table(os.path.join(REP, "clip.md"))}
TRAIN = {}
for k, r in RUNS.items():
    rows = [json.loads(l) for l in open(os.path.join(MINI, "runs", r, "metrics.jsonl"))]
    tr = [x for x in rows if "train_loss" in x and "event" not in x]
    TRAIN[k] = tr
    lab = LABEL.get(k, "softmax")
    row = clip_md[lab]
    clipped = np.array([x["clipped"] for x in tr], bool)
    tok = np.array([x["tokens"] for x in tr])
    frac = clipped.mean()
    tail = clipped[tok > 0.4 * tok[-1]].mean()
    loss = np.array([x["train_loss"] for x in tr])
    rise = np.max(np.diff(loss))
    gn = np.array([x["grad_norm"] for x in tr])
    check(
        "clip",
        lab,
        "Clipped fraction",
        row["Clipped fraction of steps (mean over seeds)"],
        f"{frac:.4f}",
        f"{frac:.3f}" == row["Clipped fraction of steps (mean over seeds)"],
    )
    check(
        "clip",
        lab,
        "Clipped fraction last 60%",
        row["Clipped fraction in the last 60% of tokens"],
        f"{tail:.4f}",
        f"{tail:.3f}" == row["Clipped fraction in the last 60% of tokens"],
        "window: tokens > 40% of final tokens (boundary choice irrelevant here: 0 clipped after step 60)",
    )
    check(
        "clip",
        lab,
        "Final pre-clip norm",
        row["Final pre-clip norm"],
        f"{gn[-1]:.4f}",
        f"{gn[-1]:.3g}" == row["Final pre-clip norm"],
    )
    check(
        "clip",
        lab,
        "Largest pre-clip norm",
        row["Largest pre-clip norm"],
        f"{gn.max():.4f}",
        f"{gn.max():.3g}" == row["Largest pre-clip norm"],
    )
    check(
        "clip",
        lab,
        "Largest loss rise",
        row["Largest loss rise between logs"],
        f"{rise:.4f}",
        f"{rise:.3f}" == row["Largest loss rise between logs"],
    )

# ================================================================ fit.md
fit_md = {r["Condition"]: r for r in md_table(os.path.join(REP, "fit.md"))}
fit_js = {r["key"]["operator"]: r for r in REPORT["train_fit"]}
sm_tr = {x["step"]: x for x in TRAIN["softmax"]}
total = TRAIN["softmax"][-1]["tokens"]
for k, lab in LABEL.items():
    row = fit_md[lab]
    tr = TRAIN[k]
    # last 10% of the tokens: rows with tokens > 0.9 * total (see NOTES for the boundary)
    sel = [x for x in tr if x["tokens"] > 0.9 * total and x["step"] in sm_tr]
    a = np.array([x["train_loss"] for x in sel])
    c = np.array([sm_tr[x["step"]]["train_loss"] for x in sel])
    d = a - c
    est = cbb(d)
    check("fit", lab, "Steps", row["Steps"], len(sel), row["Steps"] == str(len(sel)))
    check(
        "fit",
        lab,
        "Train loss (last 10%)",
        row["Train loss (last 10%)"],
        f"{a.mean():.6f}",
        f"{a.mean():.4f}" == row["Train loss (last 10%)"],
    )
    check_est("fit", lab, est, row["Δ train loss"], row["95% CI"], fit_js[lab]["d_train"])
    check(
        "fit",
        lab,
        "ΔNLL (evaluation)",
        row["ΔNLL (evaluation)"],
        f"{DELTA[k]['mean']:+.6f}",
        fmt_signed(DELTA[k]["mean"]) == row["ΔNLL (evaluation)"],
    )
    gap = NLL[k].mean() - a.mean()
    cgap = NLL["softmax"].mean() - c.mean()
    check(
        "fit",
        lab,
        "NLL − train loss",
        row["NLL − train loss"],
        f"{gap:+.6f}",
        fmt_signed(gap) == row["NLL − train loss"],
    )
    check(
        "fit",
        lab,
        "Control NLL − train loss",
        row["Control NLL − train loss"],
        f"{cgap:+.6f}",
        fmt_signed(cgap) == row["Control NLL − train loss"],
    )


# ========================================================= trajectories (report.json) and other JSON views
def all_steps(run):
    d = os.path.join(MINI, "runs", run, "eval", "val")
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".json"):
            m = json.load(open(os.path.join(d, f)))
            out[m["tokens"]] = np.load(os.path.join(d, f.replace(".json", ".npz")))["nll"].astype(float)
    return out


STEPS = {k: all_steps(r) for k, r in RUNS.items()}
for k, lab in LABEL.items():
    traj = REPORT["trajectories"][f"{lab} (50M, data:val)"]
    check("trajectories", lab, "checkpoints", len(traj), len(STEPS[k]), len(traj) == len(STEPS[k]))
    for t in traj:
        tok = t["tokens"]
        x = STEPS[k][tok] - STEPS["softmax"][tok]
        est = cbb(x, B=10000)
        js = t["est"]
        tol = mc_tol(est["se"], B_ours=10000)
        check(
            "trajectories",
            f"{lab} @ {tok}",
            "mean",
            f"{js['mean']:+.8f}",
            f"{est['mean']:+.8f}",
            abs(js["mean"] - est["mean"]) < 1e-12,
        )
        check(
            "trajectories",
            f"{lab} @ {tok}",
            "lo/hi",
            f"[{js['lo']:+.5f}, {js['hi']:+.5f}]",
            f"[{est['lo']:+.5f}, {est['hi']:+.5f}]",
            abs(js["lo"] - est["lo"]) <= tol and abs(js["hi"] - est["hi"]) <= tol,
            f"tol={tol:.5f}",
        )
        check(
            "trajectories",
            f"{lab} @ {tok}",
            "nll/control_nll",
            f"{t['nll']:.6f}/{t['control_nll']:.6f}",
            f"{STEPS[k][tok].mean():.6f}/{STEPS['softmax'][tok].mean():.6f}",
            abs(t["nll"] - STEPS[k][tok].mean()) < 1e-12
            and abs(t["control_nll"] - STEPS["softmax"][tok].mean()) < 1e-12,
        )
        wm = est["lo"] > -MARGIN and est["hi"] < MARGIN
        check(
            "trajectories",
            f"{lab} @ {tok}",
            "within_margin",
            js["within_margin"],
            wm,
            js["within_margin"] == wm,
        )

# factorial_cells / k_figure / surrogate_effect: the same numbers as delta/factorial
fc = REPORT["factorial_cells"]["cells"]["4"]
for cell, k in (("mm_w", "MM_W"), ("mm_p", "MM_P"), ("fwm_w", "FWM_W"), ("fwm_p", "FWM_P")):
    check(
        "factorial_cells",
        cell,
        "mean = delta mean",
        fc[cell]["est"]["mean"],
        DELTA[k]["mean"],
        abs(fc[cell]["est"]["mean"] - DELTA[k]["mean"]) < 1e-12,
    )
se = REPORT["factorial_cells"]["surrogate_effect"]
check(
    "factorial_cells",
    "surrogate_effect MinMax K4",
    "mean",
    se["MinMax"]["4"]["est"]["mean"],
    (P - W).mean(),
    abs(se["MinMax"]["4"]["est"]["mean"] - (P - W).mean()) < 1e-12,
)
check(
    "factorial_cells",
    "surrogate_effect FWM K4",
    "mean",
    se["FWM"]["4"]["est"]["mean"],
    (FP - FW).mean(),
    abs(se["FWM"]["4"]["est"]["mean"] - (FP - FW).mean()) < 1e-12,
)
kf = REPORT["k_figure"]["final"]
check(
    "k_figure",
    "lerp 32",
    "mean",
    kf["lerp"]["32"]["est"]["mean"],
    DELTA["lerp-k32"]["mean"],
    abs(kf["lerp"]["32"]["est"]["mean"] - DELTA["lerp-k32"]["mean"]) < 1e-12,
)

# geometry trajectories: layer means at every checkpoint
for k, r in RUNS.items():
    lab = LABEL.get(k, "softmax")
    gt = REPORT["geometry_trajectories"][lab]
    gdir = os.path.join(MINI, "runs", r, "diagnostics", "geometry")
    files = {
        json.load(open(os.path.join(gdir, f)))["tokens"]: json.load(open(os.path.join(gdir, f)))
        for f in os.listdir(gdir)
    }
    bad = 0
    for tok, vals in gt:
        layers = files[tok]["layers"]
        for key, v in vals.items():
            ours = float(np.mean([L[key] for L in layers]))
            bad += abs(ours - v) > 1e-9
    check(
        "geometry_trajectories",
        lab,
        f"{len(gt)} checkpoints × keys, layer mean",
        "",
        f"{bad} differ",
        bad == 0,
    )

# clip: Per seed / Seed ids columns
for k in RUNS:
    lab = LABEL.get(k, "softmax")
    row = clip_md[lab]
    clipped = np.array([x["clipped"] for x in TRAIN[k]], bool)
    check(
        "clip",
        lab,
        "Per seed",
        row["Per seed"],
        f"{clipped.mean():.3f}",
        row["Per seed"] == f"{clipped.mean():.3f}",
    )
    check("clip", lab, "Seed ids", row["Seed ids"], "1337", row["Seed ids"] == "1337")
    check(
        "clip",
        lab,
        "clipped_frac logged at last step = our fraction",
        TRAIN[k][-1]["clipped_frac"],
        clipped.mean(),
        abs(TRAIN[k][-1]["clipped_frac"] - clipped.mean()) < 1e-12,
    )

# index.md repeats the tables: identical rows?
idx = open(os.path.join(REP, "index.md"), encoding="utf-8").read()
for f in (
    "delta.md",
    "claims.md",
    "factorial.md",
    "ranks.md",
    "geometry.md",
    "clip.md",
    "fit.md",
    "strict.md",
):
    lines = [l for l in open(os.path.join(REP, f), encoding="utf-8").read().splitlines() if l.startswith("|")]
    missing = [l for l in lines if l not in idx]
    check(
        "index.md",
        f,
        "every table line of the file is in index.md",
        "",
        f"{len(missing)} missing",
        not missing,
    )


# LaTeX: every estimate/CI printed in the md appears in the .tex (numbers only)
def tex_numbers(path):
    t = open(path, encoding="utf-8").read().replace("$", "").replace("{-}", "-").replace("\\,", "")
    t = t.replace("\\textminus", "-").replace("−", "-")
    return set(re.findall(r"[+-]?\d+\.\d+", t))


for f, cols in (
    ("delta", ["ΔNLL (nats/token)", "95% CI", "NLL"]),
    ("factorial", ["Estimate (nats/token)", "95% CI"]),
    ("fit", ["Δ train loss", "95% CI"]),
):
    nums = {x.lstrip("+") for x in tex_numbers(os.path.join(REP, f + ".tex"))}
    miss = []
    for row in md_table(os.path.join(REP, f + ".md")):
        for c in cols:
            for v in re.findall(r"[+-]?\d+\.\d+", row.get(c, "").replace("−", "-")):
                if v.lstrip("+") not in nums and v.lstrip("+-") not in {y.lstrip("-") for y in nums}:
                    miss.append(v)
    check(
        "tex",
        f + ".tex",
        "md numbers present in tex",
        "",
        f"missing {miss}" if miss else "all present",
        not miss,
    )

# README narrative numbers (docs/results/README.md, mini section)
# clean blocks: ΔNLL on blocks whose coverage is 0
for nwin, claimed in (
    (32, {"lerp-k32": ("-0.0300", "-0.0349", "-0.0252"), "MM_W": ("+0.1369",), "FWM_P": ("+0.0214",)}),
    (13, {"lerp-k32": ("-0.0336",), "MM_W": ("+0.1424",), "FWM_P": ("+0.0214",)}),
):
    ov = json.load(open(os.path.join(MINI, "overlap", f"val_{nwin}.json")))
    cov = np.array(ov["block_coverage"], float)
    clean = cov == 0
    check(
        "README",
        f"clean blocks n={nwin}",
        "count",
        {32: "1,124 of 1,408", 13: "670"}[nwin],
        int(clean.sum()),
        int(clean.sum()) == {32: 1124, 13: 670}[nwin],
    )
    for k, vals in claimed.items():
        x = (NLL[k] - NLL["softmax"])[clean]
        mean = x.mean()
        ok = f"{mean:+.4f}" == vals[0]
        note = ""
        if len(vals) == 3:
            e = cbb(x)
            tol = mc_tol(e["se"])
            ok = (
                ok and abs(e["lo"] - num(vals[1])) <= tol + 5e-5 and abs(e["hi"] - num(vals[2])) <= tol + 5e-5
            )
            note = (
                f"ours CI [{e['lo']:+.4f}, {e['hi']:+.4f}] (block bootstrap over the clean blocks, in order, "
                f"tol {tol:.5f})"
            )
        check("README", f"clean blocks n={nwin}", k, " ".join(vals), f"{mean:+.5f}", ok, note)
# fit narrative
fr = {r["key"]["operator"]: r for r in REPORT["train_fit"]}
for lab, txt, val in (
    (
        "minmax-weight-k4[arithmetic=historical]",
        "+0.138",
        fr["minmax-weight-k4[arithmetic=historical]"]["d_train"]["mean"],
    ),
    (
        "fwm-prob-k4[arithmetic=historical]",
        "+0.030",
        fr["fwm-prob-k4[arithmetic=historical]"]["d_train"]["mean"],
    ),
    ("lerp-k32", "-0.0175", fr["lerp-k32"]["d_train"]["mean"]),
):
    d = len(txt.split(".")[1])
    check(
        "README",
        "training fit",
        lab,
        txt,
        f"{val:+.6f}",
        f"{val:+.{d}f}" == txt,
        "README rounds the table's +0.0305 again (double rounding)" if f"{val:+.{d}f}" != txt else "",
    )
# memorization narrative: val_loss − mean train loss of the 10 steps up to it, at step 200 and at the end
gaps200, gapsend = [], []
for r in RUNS.values():
    rows = [json.loads(l) for l in open(os.path.join(MINI, "runs", r, "metrics.jsonl"))]
    tl = {x["step"]: x["train_loss"] for x in rows if "train_loss" in x}
    vals = {x["step"]: x["val_loss"] for x in rows if x.get("event") == "validation"}
    for st, acc in ((200, gaps200), (max(vals), gapsend)):
        acc.append(vals[st] - np.mean([tl[s] for s in range(st - 9, st + 1)]))
check(
    "README",
    "memorization",
    "step 200 gap range",
    "+0.001 .. +0.024",
    f"{min(gaps200):+.4f} .. {max(gaps200):+.4f}",
    f"{min(gaps200):+.3f}" == "+0.001" and f"{max(gaps200):+.3f}" == "+0.024",
)
check(
    "README",
    "memorization",
    "end gap range",
    "+0.38 .. +0.46",
    f"{min(gapsend):+.4f} .. {max(gapsend):+.4f}",
    f"{min(gapsend):+.2f}" == "+0.38" and f"{max(gapsend):+.2f}" == "+0.46",
)
# passes
tr_tokens = 20286755
check(
    "README",
    "passes",
    "2.46",
    "2.46",
    f"{META['softmax']['tokens'] / tr_tokens:.4f}",
    f"{META['softmax']['tokens'] / tr_tokens:.2f}" == "2.46",
)
# the eval summary's own mean_ci95 (not used by the report): softmax mean NLL CI
e = cbb(NLL["softmax"])
mc = META["softmax"]["mean_ci95"]
tol = mc_tol(e["se"])
check(
    "eval summary",
    "softmax",
    "mean_ci95 (not used by the report)",
    f"[{mc[0]:.4f}, {mc[1]:.4f}]",
    f"[{e['lo']:.4f}, {e['hi']:.4f}]",
    abs(mc[0] - e["lo"]) <= tol and abs(mc[1] - e["hi"]) <= tol,
    f"tol {tol:.4f}",
)

# ========== strict.md: every row "not run" iff no strict-arithmetic factorial run

tsv = list(csv.DictReader(open(os.path.join(MINI, "manifest.tsv")), delimiter="\t"))
have = {r["run_id"] for r in tsv if os.path.isdir(os.path.join(MINI, r.get("run_dir") or "/nonexistent"))}
strict_fact = [
    r["run_id"]
    for r in tsv
    if r["group"] == "factorial" and r["arithmetic"] == "strict" and r["run_id"] in have
]
st = md_table(os.path.join(REP, "strict.md"))
check(
    "strict",
    f"{len(st)} rows",
    "Δ",
    "all 'not run'" if all(r["Δ"] == "not run" for r in st) else "some run",
    f"{len(strict_fact)} strict-arithmetic factorial runs present",
    all(r["Δ"] == "not run" for r in st) and not strict_fact,
)

# ================================================================ output
with open(os.path.join(HERE, "results.json"), "w") as f:
    json.dump(
        [dict(zip(("table", "row", "column", "committed", "ours", "match", "note"), r)) for r in ROWS],
        f,
        indent=1,
        default=str,
    )
bad = [r for r in ROWS if not r[5]]
for r in ROWS:
    print(" | ".join(str(c) for c in (r[0], r[1], r[2], r[3], r[4], "OK" if r[5] else "MISMATCH", r[6])))
print(f"\n{len(ROWS)} checks, {len(ROWS) - len(bad)} match, {len(bad)} mismatch")
for r in bad:
    print("MISMATCH:", r)
