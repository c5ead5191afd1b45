"""Markdown and LaTeX renderings of the analysis rows (same content, two formats)."""

from __future__ import annotations

import math


def num(x, signed: bool = True, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def ci(lo, hi) -> str:
    return "-" if lo is None or not math.isfinite(lo) else f"[{num(lo)}, {num(hi)}]"


def render(headers: list[str], rows: list[list[str]], fmt: str = "md", caption: str = "") -> str:
    if fmt == "md":
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return (f"{caption}\n\n" if caption else "") + "\n".join(out) + "\n"
    esc = [[c.replace("_", "\\_").replace("%", "\\%") for c in r] for r in [headers, *rows]]
    body = " \\\\\n".join(" & ".join(r) for r in esc[1:])
    cap = f"% {caption}\n" if caption else ""
    return (
        f"{cap}\\begin{{tabular}}{{l{'r' * (len(headers) - 1)}}}\n\\toprule\n{' & '.join(esc[0])} \\\\\n"
        f"\\midrule\n{body} \\\\\n\\bottomrule\n\\end{{tabular}}\n"
    )


def delta_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    multi = any(len(r["seeds"]) > 1 for r in rows)
    headers = ["Condition", "Seeds", "NLL", "ΔNLL (nats/token)", "95% CI", "Interval"]
    if multi:
        headers += ["Seed SD", "perm. p", "BH q"]
    else:
        headers += ["Separated (lo > +0.01)"]
    out = []
    for r in rows:
        cells = [
            r["operator"],
            ",".join(map(str, r["seeds"])),
            num(r["nll"], False),
            num(r["delta"]),
            ci(r["lo"], r["hi"]),
            r["interval"],
        ]
        if multi:
            cells += [num(r.get("sd"), False), num(r.get("p"), False, 3), num(r.get("q"), False, 3)]
        else:
            cells += ["yes" if r.get("separated") else "no"]
        out.append(cells)
    return headers, out


def factorial_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    names = {
        "calibration": "calibration (FWM - MinMax)",
        "surrogate": "surrogate (Prob - Weight)",
        "interaction": "interaction (FWM_P - FWM_W) - (MM_P - MM_W)",
    }
    headers = ["K", "Effect", "Estimate (nats/token)", "95% CI", "Seeds"]
    return headers, [
        [str(r["K"]), names[r["effect"]], num(r["estimate"]), ci(r["lo"], r["hi"]), str(r["n_seeds"])]
        for r in rows
    ]


def trend_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["Family", "K values", "Seeds", "Slope (nats per doubling of K)", "95% CI"]
    return headers, [
        [r["family"], ",".join(map(str, r["K"])), str(r["n_seeds"]), num(r["slope"]), ci(r["lo"], r["hi"])]
        for r in rows
    ]


def cross_rows(rows: list[dict], suites: list[str]) -> tuple[list[str], list[list[str]]]:
    headers = ["Condition", *[f"{s}: ΔNLL [95% CI]" for s in suites]]
    out = []
    for r in rows:
        cells = [r["operator"]]
        for s in suites:
            v = r["by_suite"].get(s)
            cells.append("-" if v is None else f"{num(v[0])} {ci(v[1], v[2])}")
        out.append(cells)
    return headers, out
