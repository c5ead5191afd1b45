"""Downstream accuracy minus softmax in percentage points: the condition x configuration table (tab:stagec),
the heat map (fig:heat) and the BLiMP / LAMBADA intervals (fig:downstream), from the rows that
``kinterval downstream-compare --json`` writes (one or more files, e.g. the BLiMP folder's and the other
tasks').

A configuration is a task on its primary metric (``acc_norm`` for HellaSwag, PIQA and ARC-Easy, ``acc``
otherwise; :func:`kinterval.eval.downstream_compare.primary_metric`); BLiMP is its macro row ``blimp``, its
paradigms and ``--task-difference`` rows are not configurations. A cell is the condition's mean paired
difference from softmax x 100 (pp), starred when its BH q (within the task x metric family of its
downstream-compare call) is below 0.05. Rows follow the training-domain ΔNLL when ``nll`` gives it (the
paper's order and row labels), else the order of the files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kinterval.eval.downstream_compare import BLIMP_PREFIX, primary_metric
from kinterval.report import figures as F
from kinterval.report.build import _building, _Index, _publish, strict_json
from kinterval.train.checkpoint import check_outside_runs

PP = 100.0  # accuracy fractions to percentage points
STAR_Q = 0.05
FOREST = ("blimp", "lambada")  # fig:downstream: (a) BLiMP macro accuracy, (b) LAMBADA (a task named lambada*)
REQUIRED = ("task", "metric", "condition", "baseline", "diff", "lo", "hi", "q")


def read_rows(files) -> list[dict]:
    """The rows of ``kinterval downstream-compare --json`` files, joined; an unreadable file, one that is not
    such a list, or a (task, metric, condition) given twice is a ValueError naming the file."""
    rows: list[dict] = []
    seen: dict[tuple, str] = {}
    for f in files:
        try:
            data = json.loads(Path(f).read_bytes())
        except OSError as e:
            raise ValueError(f"{f}: cannot read it ({e.strerror or e})") from None
        except ValueError as e:
            raise ValueError(f"{f}: not JSON ({e})") from None
        if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
            raise ValueError(
                f"{f}: not the rows of `kinterval downstream-compare --json` (a list of objects)"
            )
        for i, r in enumerate(data):
            missing = [k for k in REQUIRED if k not in r]
            if missing:
                raise ValueError(f"{f}: row {i} has no {', '.join(missing)} (not downstream-compare --json?)")
            for k in ("diff", "baseline", "q"):
                if not isinstance(r[k], (int, float)) or isinstance(r[k], bool) or not math.isfinite(r[k]):
                    raise ValueError(
                        f"{f}: row {i} ({r['task']} {r['metric']} {r['condition']}): {k} {r[k]!r}"
                    )
            key = (r["task"], r["metric"], r["condition"])
            if key in seen:
                raise ValueError(f"{f}: {' '.join(map(str, key))} is also in {seen[key]}: give each row once")
            seen[key] = str(f)
            rows.append(r)
    return rows


def nll_of(report_json) -> dict[str, float]:
    """Operator -> training-domain ΔNLL vs softmax from a ``kinterval report`` folder's ``report.json`` (its
    ``delta`` rows; an operator with rows at several budgets: the largest budget's). Rows of several models or
    data at that budget are ambiguous: a ValueError."""
    path = Path(report_json)
    path = path / "report.json" if path.is_dir() else path
    try:
        delta = json.loads(path.read_bytes())["delta"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a `kinterval report` report.json with delta rows ({e!r})") from None
    best: dict[str, list] = {}
    for r in delta:
        if not str(r.get("contrast", "")).endswith("\u2212 softmax"):
            continue
        op, tokens = r["key"]["operator"], r.get("tokens") or 0
        if op not in best or tokens > best[op][0]:
            best[op] = [tokens, [r]]
        elif tokens == best[op][0]:
            best[op][1].append(r)
    out = {}
    for op, (_, rs) in best.items():
        settings = sorted({f"{r['key'].get('model')}, {r['key'].get('data')}" for r in rs})
        if len(settings) > 1:
            raise ValueError(f"{path}: {op} has ΔNLL rows of several models or data ({'; '.join(settings)}) "
                             "at its largest budget: report one setting's suites")  # fmt: skip
        out[op] = rs[0]["est"]["mean"]
    return out


def _match(condition: str, nll: dict[str, float]) -> float | None:
    """The ΔNLL of a condition named as its operator (exactly, or ignoring case)."""
    if condition in nll:
        return nll[condition]
    low = {k.lower(): v for k, v in nll.items()}
    return low.get(condition.lower())


def grid(rows: list[dict], nll: dict[str, float] | None = None) -> dict:
    """The table's shape: ``conditions`` (ΔNLL order, largest first, where known, the rest after them in
    file order), ``tasks`` (configurations in file order), ``cells`` {(condition, task): row}, ``baseline``
    {task: softmax accuracy}, ``dnll`` {condition: ΔNLL or None}, ``skipped`` (tasks with no row on their
    primary metric, e.g. perplexity-only), ``groups`` {condition: group} when the rows carry pre-declared
    groups."""
    tasks, conditions, cells, baseline, skipped = [], [], {}, {}, []
    for r in rows:
        task = r["task"]
        if task.startswith(BLIMP_PREFIX) or "\u2212" in task:  # a BLiMP paradigm, or a task difference
            continue
        if r["metric"] != primary_metric(task):
            if task not in skipped:
                skipped.append(task)
            continue
        tasks += [task] if task not in tasks else []
        conditions += [r["condition"]] if r["condition"] not in conditions else []
        cells[(r["condition"], task)] = r
        baseline.setdefault(task, r["baseline"])
    skipped = [t for t in skipped if t not in tasks]
    dnll = {c: (_match(c, nll) if nll else None) for c in conditions}
    # tab:stagec: rows by ΔNLL, the largest gap first (stable: ties keep the files' order)
    known = sorted((c for c in conditions if dnll[c] is not None), key=lambda c: -dnll[c])
    conditions = known + [c for c in conditions if dnll[c] is None]
    groups = {c: r["group"] for (c, _), r in cells.items() if "group" in r}
    return {"conditions": conditions, "tasks": tasks, "cells": cells, "baseline": baseline, "dnll": dnll,
            "skipped": skipped, "groups": groups}  # fmt: skip


def cell_text(row: dict | None) -> str:
    """The pp difference with tab:stagec's mark: ``*`` BH q < 0.05, ``°`` 95% CI excludes 0 but q >= 0.05
    (downstream-compare's ``mark``)."""
    if row is None:
        return "–"
    mark = row.get("mark")
    if mark is None:  # rows without it: the star alone
        mark = "*" if row["q"] < STAR_Q else ""
    return f"{row['diff'] * PP:+.1f}{mark}"


def row_label(c: str, g: dict) -> str:
    d = g["dnll"][c]
    return c if d is None else f"{c} ({d:+.3f})"


def table_rows(g: dict) -> tuple[list[str], list[list[str]]]:
    """tab:stagec: a row per condition (ΔNLL beside it where known), a column per configuration; the first
    row is softmax's accuracy in %."""
    grouped = bool(g["groups"])  # the pre-declared groups (--group) as a first column
    headers = ["group"] * grouped + ["condition", "ΔNLL", *g["tasks"]]
    base = [f"{g['baseline'][t] * PP:.1f}" for t in g["tasks"]]
    rows = [[""] * grouped + ["softmax (accuracy, %)", "", *base]]
    for c in g["conditions"]:
        d = g["dnll"][c]
        cells = [cell_text(g["cells"].get((c, t))) for t in g["tasks"]]
        rows.append([g["groups"].get(c, "")] * grouped + [c, "" if d is None else f"{d:+.3f}", *cells])
    return headers, rows


def heat_panels(g: dict, chosen: list[str] | None = None) -> dict[str, list[str]]:
    """fig:heat's panels {label: conditions in the table's order}: one per pre-declared group (one panel
    without groups), or the ``chosen`` "LABEL=COND,COND,..." panels, which may leave conditions out and share
    them (the paper's: (a) the matched K=4 conditions, (b) the near-baseline group)."""
    if not chosen:
        order = list(dict.fromkeys(g["groups"].get(c, "") for c in g["conditions"]))
        return {grp: [c for c in g["conditions"] if g["groups"].get(c, "") == grp] for grp in order}
    panels = {}
    for text in chosen:
        label, sep, names = text.rpartition("=")  # condition names hold no "=" (downstream-compare NAME=DIR)
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        if not sep or not label.strip() or not wanted:
            raise ValueError(f"--heat-panel {text!r}: expected LABEL=CONDITION[,CONDITION...]")
        if label.strip() in panels:
            raise ValueError(f"--heat-panel {label.strip()!r} is given twice")
        unknown = [n for n in wanted if n not in g["conditions"]]
        if unknown:
            raise ValueError(
                f"--heat-panel {label.strip()!r}: {', '.join(unknown)} not among the compared conditions "
                f"({', '.join(g['conditions'])})"
            )
        panels[label.strip()] = [c for c in g["conditions"] if c in wanted]
    return panels


def heat_figure(g: dict, path: Path, title: str, panels: dict[str, list[str]] | None = None) -> Path:
    """fig:heat: pp differences, one panel per entry of ``panels`` (default :func:`heat_panels`), each on its
    own symmetric colour scale (to the next 1-2-5 value of its largest |pp|); marks as :func:`cell_text`."""
    panels = panels if panels is not None else heat_panels(g)
    order, panels = list(panels), list(panels.values())
    tasks = g["tasks"]
    heights = [len(p) + 1.5 for p in panels]
    fig, axes = F.plt.subplots(
        len(panels), 1, figsize=(1.3 * len(tasks) + 4, 0.42 * sum(heights) + 1),
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )  # fmt: skip
    for ax, grp, conds in zip(axes[:, 0], order, panels):
        pp = np.array([[g["cells"][(c, t)]["diff"] * PP if (c, t) in g["cells"] else np.nan for t in tasks]
                       for c in conds])  # fmt: skip
        top = np.nanmax(np.abs(pp)) if np.isfinite(pp).any() else 0.0
        scale = F._next_125(top) if top > 0 else 1.0
        im = ax.imshow(pp, cmap="RdBu", vmin=-scale, vmax=scale, aspect="auto")
        for i, c in enumerate(conds):
            for j, t in enumerate(tasks):
                ax.text(j, i, cell_text(g["cells"].get((c, t))), ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(conds)), [row_label(c, g) for c in conds], fontsize=7)
        ax.set_xticks(range(len(tasks)), [f"{t}\n{g['baseline'][t] * PP:.1f}%" for t in tasks], fontsize=7)
        ax.set_ylabel(grp, fontsize=8)
        fig.colorbar(im, ax=ax, label=f"pp (±{scale:g})", fraction=0.04)
    return F._save(fig, path, title, panels=axes[:, 0] if len(panels) > 1 else ())


def forest_tasks(g: dict) -> list[str]:
    """The configurations of fig:downstream present in ``g``: BLiMP's macro row, then LAMBADA's."""
    return [t for prefix in FOREST for t in g["tasks"] if t == prefix or t.startswith(prefix + "_")]


def downstream_figure(g: dict, path: Path, title: str) -> Path:
    """fig:downstream: per configuration of :func:`forest_tasks`, each condition's pp difference with its
    95% paired bootstrap CI, rows in ΔNLL order (top: the largest gap, as tab:stagec)."""
    tasks = forest_tasks(g)
    conds = g["conditions"]
    fig, axes = F.plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks) + 1.5, 0.32 * len(conds) + 1.6),
                               squeeze=False, sharey=True)  # fmt: skip
    for ax, t in zip(axes[0], tasks):
        for i, c in enumerate(conds):
            r = g["cells"].get((c, t))
            if r is None:
                continue
            x = r["diff"] * PP
            err = None
            if r["lo"] is not None and r["hi"] is not None:
                err = [[x - r["lo"] * PP], [r["hi"] * PP - x]]
            colour = "#c44e52" if r["q"] < STAR_Q else "#4c72b0"
            ax.errorbar([x], [i], xerr=err, fmt="o", ms=4, color=colour, capsize=2, lw=1)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel(f"{t} {primary_metric(t)}: condition − softmax (pp)")
        ax.grid(alpha=0.3, axis="x")
    axes[0, 0].set_yticks(range(len(conds)), [row_label(c, g) for c in conds], fontsize=7)
    axes[0, 0].invert_yaxis()
    marks = [F.plt.Line2D([], [], marker="o", ls="", ms=4, color=c, label=t)
             for c, t in (("#c44e52", f"BH q < {STAR_Q:g}"), ("#4c72b0", f"q ≥ {STAR_Q:g}"))]  # fmt: skip
    axes[0, -1].legend(handles=marks, fontsize=7, frameon=False, loc="lower right")
    return F._save(fig, path, title, panels=axes[0] if len(tasks) > 1 else ())


def downstream_report(files, out, nll_from=None, heat_panel: list[str] | None = None) -> Path:
    """``stagec.md``/``.tex``, ``heat.png``, ``downstream.png`` (when BLiMP or LAMBADA is among the
    configurations), ``report.json`` and ``index.md`` into ``out``, built and published as
    :func:`kinterval.report.build.build_report` does. ``nll_from``: a ``kinterval report`` folder (or its
    report.json) whose ΔNLL vs softmax orders and labels the conditions named as its operators.
    ``heat_panel``: fig:heat's panels as "LABEL=COND,COND,..." (:func:`heat_panels`)."""
    rows = read_rows(files)
    g = grid(rows, nll_of(nll_from) if nll_from else None)
    if not g["tasks"]:
        raise ValueError(
            "no configuration on its primary metric (acc_norm for hellaswag, piqa, arc_easy; acc otherwise) "
            f"in {', '.join(map(str, files))}"
        )
    panels = heat_panels(g, heat_panel)  # checked before anything is written
    check_outside_runs(out, "the report's files would mix with the run's")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with _building(out) as work:
        ix = _Index(work)
        ix.lines += [
            "# kinterval downstream report",
            "",
            f"From {', '.join(Path(f).name for f in files)} (`kinterval downstream-compare --json`). Cells: "
            "condition − softmax in percentage points on each task's primary metric (mean paired difference "
            f"per item); * BH q < {STAR_Q} within the task x metric family of its downstream-compare call, "
            "° the 95% paired bootstrap CI excludes 0 but q >= 0.05.",
            "",
        ]
        unlabelled = [c for c in g["conditions"] if g["dnll"][c] is None]
        if nll_from and unlabelled:
            ix.lines += [f"No ΔNLL in {nll_from} for: {', '.join(unlabelled)} (listed last).", ""]
        if g["skipped"]:
            ix.lines += [f"Not shown (no primary-metric row): {', '.join(g['skipped'])}.", ""]
        ix.table("stagec", *table_rows(g), "Downstream accuracy minus softmax, pp (tab:stagec)")
        heat_figure(g, work / "heat.png", "Downstream accuracy differences from softmax (pp)", panels)
        ix.figure("heat.png", "fig:heat")
        forest = forest_tasks(g)
        if forest:
            downstream_figure(g, work / "downstream.png", "Condition − softmax (pp), 95% paired bootstrap CI")
            ix.figure("downstream.png", "fig:downstream")
        else:
            ix.lines += [
                "fig:downstream not drawn: neither BLiMP (macro row `blimp`) nor a LAMBADA task.",
                "",
            ]
        data = {
            "files": [str(f) for f in files],
            "conditions": g["conditions"],
            "tasks": g["tasks"],
            "baseline": g["baseline"],
            "dnll": g["dnll"],
            "skipped": g["skipped"],
            "heat_panels": panels,
            "cells": [g["cells"][k] for k in g["cells"]],
        }
        (work / "report.json").write_text(strict_json(data) + "\n")
        ix.lines += ["All numbers: [report.json](report.json)", ""]
        (work / "index.md").write_text("\n".join(ix.lines))
        _publish(work, out, ("report.json", "index.md"))
    return out / "index.md"
