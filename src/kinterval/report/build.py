"""``build_report``: regenerate every table and figure of one or more suite folders from result files only,
and ``demo_report`` for ``kinterval demo``. Output: ``index.md`` linking Markdown + LaTeX tables, PNG figures
and ``report.json`` (all numbers).

A report is built in ``OUT/.report.building`` (a leftover of a build that was killed is removed first) and
only then published into ``OUT`` (:func:`_publish`): the previous report's ``index.md`` and ``report.json``
are removed first, its other files (those its ``index.md`` links) are removed unless the new report has them,
the new files are renamed into place and ``report.json`` and ``index.md`` come last. ``OUT`` may hold other
files (it may be any folder the user names): they are left alone. So a report that stopped at an error, or
was killed while it computed, leaves the previous report as it was; one killed while it is published (a few
renames) leaves no ``index.md``: never tables of one build under the ``index.md`` of another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from kinterval import atomic
from kinterval.data.loader import passes_text
from kinterval.report import analysis as A
from kinterval.report import claims as C
from kinterval.report import figures as F
from kinterval.report import tables as T
from kinterval.report.probes import probe_comparisons
from kinterval.report.results import Key, Point, load_many
from kinterval.train.checkpoint import check_outside_runs


class _Index:
    """The growing ``index.md`` and the output folder."""

    def __init__(self, out: Path):
        self.out = out
        self.lines: list[str] = []

    def table(self, name: str, headers, rows, caption: str) -> None:
        (self.out / f"{name}.md").write_text(T.render(headers, rows, "md", caption))
        (self.out / f"{name}.tex").write_text(T.render(headers, rows, "tex", caption))
        self.lines += [
            f"### {caption}",
            "",
            T.render(headers, rows, "md"),
            f"[Markdown]({name}.md) · [LaTeX]({name}.tex)",
            "",
        ]

    def figure(self, name: str, alt: str) -> None:
        self.lines += [f"![{alt}]({name})", ""]


BUILDING = ".report.building"  # inside OUT: the report while it is built
LOCK = ".report.lock"  # inside OUT: held while a report is built and published
# a file of the report that index.md links: [Markdown](x.md), ![alt](x.png), [report.json](report.json)
_LINK = re.compile(r"\]\(([^()/\\\s]+\.(?:md|tex|png|json))\)")


@contextlib.contextmanager
def _building(out: Path) -> Iterator[Path]:
    """The empty folder a report of ``out`` is built in (``out/.report.building``), removed afterwards. One
    build of ``out`` at a time (``out/.report.lock``): two would share that folder."""
    busy = f"{out} is being written by another report ({{who}}): wait for it, or give another --out"
    with atomic.exclusive(out / LOCK, busy, remove=True):
        work = out / BUILDING
        shutil.rmtree(work, ignore_errors=True)  # left by a build that was killed
        work.mkdir()
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _publish(work: Path, out: Path, last: tuple[str, ...]) -> None:
    """Move the report built in ``work`` into ``out`` (see the module docstring); ``last``: the files that
    mark a complete report, the last of them last (``index.md``)."""
    index = out / "index.md"
    try:
        old = set(_LINK.findall(index.read_text(errors="replace"))) if index.is_file() else set()
    except OSError:
        old = set()
    for name in reversed(last):  # index.md first: from here until the end there is no complete report
        (out / name).unlink(missing_ok=True)
    new = {p.name for p in work.iterdir()}
    for name in sorted(old - new - set(last)):  # the previous report's own files the new one lacks
        if (out / name).is_file():
            (out / name).unlink()
    for name in sorted(new - set(last)):
        os.replace(work / name, out / name)
    for name in last:
        if name in new:
            os.replace(work / name, out / name)
    work.rmdir()


def _traj_points(rows: list[A.Row]) -> list[tuple[int, float, float, float]]:
    return [(r.tokens, r.est.mean, r.est.lo, r.est.hi) for r in rows]


def _label(k: Key, many: bool, models: bool = False) -> str:
    """A figure's or report.json's name of a key: its condition (:func:`analysis.condition`), with its budget
    and data when ``many`` settings are shown, and its model when the report holds several (suites C, D)."""
    where = [T.tokens(k.budget), k.data.split(" ")[0], *([k.model] if models else [])]
    return f"{A.condition(k)} ({', '.join(where)})" if many else A.condition(k)


def _detach_series(det: list, models: bool) -> dict[str, list]:
    """detach.png's lines: label -> trajectory points of each modified backward − its full-gradient twin."""
    many = len({r.key.setting() for r in det}) > 1
    by_key: dict[Key, list[A.Row]] = {}
    for r in det:
        if r.contrast.endswith(f"− {A.full_twin(r.key.operator)}"):
            by_key.setdefault(r.key, []).append(r)
    return {_label(k, many, models): _traj_points(v) for k, v in by_key.items()}


def _mean_geometry(
    points, unpaired: dict[str, str], models: bool = False
) -> dict[str, list[tuple[int, dict]]]:
    """operator label -> [(tokens, layer-mean geometry averaged over seeds)] for primary evaluations; a
    supplementary modified-backward run's seed beside its same-seed full twin (fig:e1 b, d). A run without a
    probe at some of its line's checkpoints goes to ``unpaired`` (``analysis.note_partial_line``)."""
    acc: dict[Key, dict[int, list[Point]]] = {}
    for k, ps in A.geometry_groups(points).items():
        for p in ps:
            acc.setdefault(k, {}).setdefault(p.tokens, []).append(p)
    many = len({k.setting() for k in acc}) > 1
    out = {}
    for k, by_t in acc.items():
        A.note_partial_line(by_t, "the geometry trajectory", unpaired, "evaluation with a geometry probe")
        series = []
        for t in sorted(by_t):
            gs = [p.geometry for p in by_t[t]]
            keys = gs[0].keys()
            vals = {m: [g[m] for g in gs if g.get(m) is not None and math.isfinite(g[m])] for m in keys}
            series.append((t, {m: float(np.mean(v)) if v else float("nan") for m, v in vals.items()}))
        out[_label(k, many, models)] = series
    return out


CROSS_ORDER = ("B", "A", "C", "D")  # tab:cross's columns: 124M@250M, 124M@2.5B, 1B@100M, five seeds


def _cross_columns(settings: list[tuple], points) -> dict[str, tuple]:
    """Cross-setting column label -> setting: each setting named by the suites of its conditions (``C``,
    ``D + supplementary``) and its model, budget, data and tag (tab:cross, tab:crossfull); the paper's suites
    in its order (B, A, C, D), the others after them by name."""
    suites: dict[tuple, set[str]] = {}
    for p in points:
        if not p.is_reference:
            suites.setdefault(p.key.setting(), set()).add(p.suite)

    def rank(name: str) -> int:
        return min(
            (CROSS_ORDER.index(n) for n in name.split(" + ") if n in CROSS_ORDER), default=len(CROSS_ORDER)
        )

    named = sorted(
        ((" + ".join(sorted(suites.get(s, ()))), s) for s in settings), key=lambda x: (rank(x[0]), x)
    )
    return {T.cross_column(s, name): s for name, s in named}


def _seed_figures(
    rows: list[A.Row], fac: list[A.Row], ix: _Index, data: dict, colour_of=lambda k: None
) -> None:
    """fig:seeds and fig:2x2 (c, d) for the setting with the most seeds (suite D when given), fig:2x2 (a, b)
    for the one-seed setting with the most K carrying the four factorial cells, then the longest horizon
    (suite B when given; without one, the same setting as (c, d)): ``seeds.png`` and ``factorial2x2.png``;
    what they plot goes to report.json (``seeds_figure``, ``factorial_cells`` with ``panels``: the setting
    of each panel)."""
    multi = [r for r in rows if len(r.seeds) > 1]
    if multi:
        setting = max(
            {r.key.setting() for r in multi},
            key=lambda st: (max(len(r.seeds) for r in multi if r.key.setting() == st), str(st)),
        )
        n = max(len(r.seeds) for r in multi if r.key.setting() == setting)
        conds = {r.key.operator: r for r in multi if r.key.setting() == setting and len(r.seeds) == n}
        main = [
            r
            for r in fac
            if r.K
            and r.key.setting() == setting
            and r.contrast in ("calibration", "surrogate", "interaction")
            and len(r.seeds) > 1
        ]
        design = max({r.family for r in main}, key=lambda d: sum(r.family == d for r in main), default="")
        effects: dict[str, dict[int, A.Row]] = {}
        for r in main:
            if r.family == design:
                effects.setdefault(r.contrast, {})[r.K] = r
        F.seeds_figure(
            conds,
            effects,
            ix.out / "seeds.png",
            f"{n} seeds, {T.tokens(setting[0])}, {setting[1]}: endpoint ΔNLL per seed and factorial effects"
            + (f" ({design})" if design else ""),
        )
        ix.figure("seeds.png", "per-seed ΔNLL and factorial effects")
        data["seeds_figure"] = {
            "setting": setting,
            "conditions": {op: r.est for op, r in conds.items()},
            "effects": {e: {K: r.est for K, r in by_K.items()} for e, by_K in effects.items()},
            "design": design,
        }
    groups = A.factorial_cells(rows)
    if not groups:
        return

    def n_seeds(cells) -> int:
        return max(len(r.seeds) for cs in cells.values() for r in cs.values())

    # (c, d): the setting with the most seeds (suite D when given)
    (setting, arith), cells_cd = max(groups.items(), key=lambda kv: (n_seeds(kv[1]), len(kv[1]), str(kv[0])))
    n = n_seeds(cells_cd)
    # (a, b): a one-seed setting (block-bootstrap intervals), the one with the most K carrying the four cells,
    # then the longest horizon (suite B: K=4 and 16 at 250M); without one, the setting of (c, d)
    one = {k: v for k, v in groups.items() if n_seeds(v) == 1}
    ab = max(one, key=lambda k: (len(one[k]), k[0][0], str(k))) if one else (setting, arith)
    cells = groups[ab]
    n_ab = n_seeds(cells)
    families: dict[str, dict[int, A.Row]] = {}
    for r in rows:
        if (
            r.K
            and r.key.setting() == setting
            and r.key.seed is None  # a supplementary run's row of one seed is not the designed condition
            and len(r.seeds) == n
            and A.full_twin(r.key.operator) is None
        ):
            families.setdefault(r.family, {})[r.K] = r
    # every family, one measured at a single K as a point (mini's factorial cells at K = 4 beside LERP's line)
    families = {f: dict(sorted(v.items())) for f, v in sorted(families.items())}
    surrogate = A.surrogate_effects(fac, cells_cd)

    def where(st, ar, k) -> str:
        ivl = f"{k} seeds, t intervals" if k > 1 else "one seed, block-bootstrap intervals"
        return f"{T.tokens(st[0])}, {st[1]}, arithmetic={ar}, {ivl}"

    title = f"Calibration x surrogate, {where(setting, arith, n)}"
    if ab != (setting, arith):
        title = f"Calibration x surrogate: cells {where(*ab, n_ab)}; by K {where(setting, arith, n)}"
    # (c): a family in the colour of its K = 4 condition (else its first K) in the other figures
    family_colours = {
        f: colour_of(by_K.get(4, next(iter(by_K.values()))).key) for f, by_K in families.items()
    }
    F.factorial_figure(cells, families, ix.out / "factorial2x2.png", title, surrogate, family_colours)
    ix.figure("factorial2x2.png", "2x2 factorial cells, ΔNLL by K per family, surrogate effect by K")
    data["factorial_cells"] = {
        "setting": ab[0],
        "arithmetic": ab[1],
        "cells": {
            K: {c: {"operator": r.key.operator, "est": r.est} for c, r in cs.items()}
            for K, cs in cells.items()
        },
        "families": {f: {K: r.est for K, r in by_K.items()} for f, by_K in families.items()},
        "surrogate_effect": {
            cal: {K: {"seeds": r.seeds, "est": r.est} for K, r in by_K.items()}
            for cal, by_K in surrogate.items()
        },
        # the setting each panel plots: (a, b) the cells per K, (c) the families by K, (d) Prob − Weight by K
        "panels": {
            "ab": {"setting": ab[0], "arithmetic": ab[1], "seeds": n_ab, "K": sorted(cells)},
            "c": {"setting": setting, "seeds": n},
            "d": {"setting": setting, "arithmetic": arith, "seeds": n},
        },
    }


def _k_figure(primary, rows: list[A.Row], traj, ix: _Index, data: dict, colour_of=lambda k: None) -> None:
    """fig:k for the longest-horizon setting (:func:`analysis.k_panels`): ``kscaling.png``; what it plots goes
    to report.json (``k_figure``); a panel whose runs are absent is drawn "not run" and named in index.md.
    ``colour_of(key)``: a trajectory's colour in the other figures, which its line keeps here."""
    kp = A.k_panels(primary, rows, traj)
    if kp is None:
        return
    colours = {
        k.operator: colour_of(k) for k in traj if k.setting() == kp.setting and colour_of(k) is not None
    }
    where = f"{T.tokens(kp.setting[0])}, {kp.setting[1]}"
    F.k_figure(
        kp.final,
        kp.gap,
        kp.vs_lerp,
        kp.not_run,
        ix.out / "kscaling.png",
        f"K scaling, {where}: endpoint ΔNLL by K, K={kp.K} gap and Nearest − LERP along training",
        K=kp.K,
        colours=colours,
    )
    ix.figure(
        "kscaling.png", f"endpoint ΔNLL by K and family, K={kp.K} gap and Nearest − LERP along training"
    )
    for letter, why in kp.not_run.items():
        ix.lines += [f"kscaling.png ({letter}): not run ({why}).", ""]

    def along(series):
        return {
            op: [{"tokens": r.tokens, "seeds": r.seeds, "est": r.est} for r in rs]
            for op, rs in series.items()
        }

    data["k_figure"] = {
        "setting": kp.setting,
        "K": kp.K,
        "final": {
            f: {K: {"operator": r.key.operator, "est": r.est} for K, r in v.items()}
            for f, v in kp.final.items()
        },
        "gap": along(kp.gap),
        "nearest_minus_lerp": along(kp.vs_lerp),
        "not_run": kp.not_run,
    }


def _endpoint_passes(points) -> dict[str, float]:
    """``suite/run_id`` -> passes over its train split at the run's last evaluated checkpoint, for the runs
    whose evaluations record it (``train_passes``)."""
    last: dict[str, tuple[int, float]] = {}
    for p in points:
        name = f"{p.suite}/{p.run_id}"
        if p.passes is not None and p.tokens >= last.get(name, (-1, 0.0))[0]:
            last[name] = (p.tokens, p.passes)
    return {name: n for name, (_, n) in sorted(last.items())}


def _not_run(r) -> list[str]:
    """The manifest's runs a folder has no evaluation of (a suite run in sittings: `suite merge`)."""
    have = r.runs()
    return [row["run_id"] for row in r.manifest["runs"] if row["run_id"] not in have]


def _run_count(r) -> str:
    """'N runs' ('1 run'), or 'N of M runs; not run: ...' for a folder lacking some of its manifest's runs."""
    have, missing = len(r.runs()), _not_run(r)
    if missing:
        return f"{have} of {have + len(missing)} runs; not run: {', '.join(missing)}"
    return f"{have} run" if have == 1 else f"{have} runs"


def _is_run_folder(d: Path) -> bool:
    """Whether ``d`` is a folder of ``kinterval train`` (what ``--runs`` takes)."""
    return (d / "run_config.json").is_file() or (d / "status.json").is_file() or (d / "checkpoints").is_dir()


def check_not_run_folders(dirs: list[Path]) -> None:
    """``ValueError`` pointing to ``--runs`` for a folder without a suite manifest that is a training run
    folder or holds some: checked before ``--out``, whose complaint (a report inside a run) would mislead."""
    from kinterval.suite.manifest import MANIFEST

    for d in dirs:
        if (d / MANIFEST).is_file() or not d.is_dir():
            continue
        if _is_run_folder(d):
            raise ValueError(f"{d} is a training run folder, not a suite folder (no {MANIFEST}): report runs "
                             f"with `kinterval report --runs RUN [RUN ...]`")  # fmt: skip
        runs = sorted(str(p) for p in d.iterdir() if p.is_dir() and _is_run_folder(p))
        if runs:
            raise ValueError(f"{d} holds training run folders, not a suite (no {MANIFEST}): report them "
                             f"with `kinterval report --runs {' '.join(runs)}`")  # fmt: skip


def build_report(suite_dirs, out: str | Path, clean_blocks=()) -> Path:
    """Report of one or more suite folders into ``out``; returns the path of ``index.md``. ``clean_blocks``:
    block coverage files of ``kinterval data overlap --block-size T --json`` (the clean-blocks table).

    The folders' runs are pooled: each run is paired with its same-seed control from any of them. The report
    is built in ``out/.report.building`` and then published into ``out`` (module docstring): other files in
    ``out`` are kept, an error or a kill before the publication leaves the previous report as it was."""
    dirs = [Path(d) for d in ([suite_dirs] if isinstance(suite_dirs, (str, Path)) else suite_dirs)]
    out = Path(out)
    check_not_run_folders(dirs)
    check_outside_runs(out, "the report's files would mix with the run's (its gate would count them)")
    results = load_many(dirs)
    coverages = [A.read_coverage(f) for f in clean_blocks]
    clean = A.clean_blocks([p for r in results for p in r.points], coverages)  # a file of no split: refused
    with _building(out) as work:
        _build(results, work, clean)
        _publish(work, out, ("report.json", "index.md"))
    return out / "index.md"


def _build(results, out: Path, clean=()) -> None:
    """Every table, figure, ``report.json`` and ``index.md`` of ``results`` into the folder ``out``."""
    points = [p for r in results for p in r.points]
    primary = [p for p in points if p.primary]
    models = len({p.model for p in points}) > 1  # suites of several models (C and D): name the model
    ix = _Index(out)
    ix.lines += [
        "# kinterval report",
        "",
        "Regenerated from result files only (manifests, per-block NLL arrays, geometry probes) of "
        + ", ".join(f"suite {r.suite} ({r.title}; {_run_count(r)})" for r in results)
        + ". ΔNLL = condition − same-seed control (softmax, or the full-gradient twin of a modified "
        "backward) at the same token budget, data and checkpoint, paired per validation block, in nats/token "
        "(positive: worse). One seed: circular block bootstrap over validation blocks (block 16, or half the "
        "blocks below 32: each row's `block` in report.json; 4000 resamples; evaluation sampling only). "
        "Several seeds: mean of the same-seed paired differences, seed SD, t interval, exact "
        "sign-permutation p, BH q over the conditions of one setting. Runs of different models are never "
        "paired. A supplementary run is one row per seed (block bootstrap), never pooled over seeds.",
        "",
    ]
    data: dict = {
        "folders": [
            {
                "suite": r.suite,
                "title": r.title,
                "runs": len(r.runs()),
                "not_run": _not_run(r),
                "code": r.manifest.get("code"),
            }
            for r in results
        ]
    }
    codes = [(f["suite"], (f["code"] or {}).get("ops_sha256")) for f in data["folders"]]
    if len({sha for _, sha in codes}) > 1:  # pairs and seed statistics across these folders mix operator code
        ix.lines += [
            "**The folders ran different operator code** (`ops_sha256`: "
            + ", ".join(f"{suite} `{str(sha)[:12]}`" for suite, sha in codes)
            + "): pairs and seed statistics across them compare runs of different kinterval versions.",
            "",
        ]

    passes = _endpoint_passes(primary)
    if passes:
        data["train_passes"] = passes
    repeated = {run: n for run, n in passes.items() if n > 1}
    # runs evaluated by an older kinterval record no passes: named, so that the list is not read as complete
    unrecorded = sorted({f"{p.suite}/{p.run_id}" for p in primary} - set(passes))
    if repeated:  # a multi-epoch regime: the held-out NLL also reflects what a run memorized of its data
        ix.lines += [
            "**Runs that saw their training data more than once** (passes over the train split at their last "
            "evaluated checkpoint): "
            + ", ".join(f"{run} {passes_text(n)}" for run, n in sorted(repeated.items()))
            + ". Every training sequence was seen again, so their validation NLL also reflects how much of "
            "the train split they memorized."
            + (f" Not recorded by the evaluations of {', '.join(unrecorded)}." if unrecorded else ""),
            "",
        ]

    left_out: dict[str, str] = {}  # runs left out of a row that is not built from a pairing: run -> reason
    pairing = A.softmax_pairs(primary)
    rows = A.delta_table(pairing)
    data["delta"] = rows
    refs = A.softmax_rows(primary, unpaired=left_out)
    # a one-seed row beside a softmax of several seeds is paired with its own seed's softmax, not the seed
    # mean: that softmax gets a row too, so that NLL - NLL reads as the row's ΔNLL
    ref_seeds = {ref.key.setting(): ref.seeds for ref in refs}
    own: dict[tuple, set[int]] = {}
    for r in rows:
        if len(r.seeds) == 1 and len(ref_seeds.get(r.key.setting(), ())) > 1:
            own.setdefault(r.key.setting(), set()).update(r.seeds)
    if rows:
        ix.table(
            "delta",
            *T.delta_rows(rows, refs + (A.softmax_rows(primary, own) if own else [])),
            "Endpoint ΔNLL vs same-seed softmax (softmax: its mean NLL and seed SD"
            + ("; a one-seed row is paired with the softmax row of its seed)" if own else ")"),
        )
    seed_refs = A.seed_references(pairing)
    at_seeds: dict[tuple, set[int]] = {}
    for r in [*seed_refs, *(r for r in rows if r.key.seed is not None)]:
        at_seeds.setdefault(r.key.setting(), set()).update(r.seeds)
    seed_soft = A.softmax_rows(primary, at_seeds)
    data["softmax"] = refs + seed_soft
    if seed_refs:
        data["seed_references"] = seed_refs
        ix.table(
            "seed_references",
            *T.delta_rows(seed_refs, seed_soft),
            "Same-seed references of the supplementary runs: ΔNLL vs softmax at one seed (block bootstrap)",
        )
    unevaluated = {k: v for r in results for k, v in r.stopped_unevaluated.items()}
    claims = C.paper_claims(primary, left_out, unevaluated)
    data["claims"] = [c.to_dict() for c in claims]
    ix.table("claims", *T.claim_rows(claims), "Paper claims")
    options = A.option_effects(primary, left_out)
    if options:
        data["option_effects"] = options
        ix.table(
            "options",
            *T.option_rows(options),
            "Attention options across models: each operator with the options − the same operator and seed "
            "without them (same protocol, data and evaluation blocks), and its penalty vs same-seed softmax "
            "with − without them (> 0: the options widen the gap)",
        )
    fac = A.factorial_effects(primary, left_out)
    if fac:
        data["factorial"] = fac
        ix.table("factorial", *T.factorial_rows(fac), "2x2 factorial effects by K")
    settings, cross = A.cross_setting(rows)
    if len(settings) > 1:  # tab:crossfull: condition − softmax, then the factorial contrasts, per suite
        cross.update(T.factorial_cross(fac, settings))
        columns = _cross_columns(settings, primary)
        data["cross_setting"] = {
            "columns": columns,
            "rows": {c: {n: by[s] for n, s in columns.items() if s in by} for c, by in cross.items()},
        }
        ix.table(
            "cross_setting",
            *T.cross_rows(list(columns.values()), cross, list(columns)),
            "ΔNLL vs softmax and the 2x2 factorial contrasts across settings (tab:cross, tab:crossfull)",
        )
    strict = A.strict_table(points)
    data["strict"] = strict
    ix.table(
        "strict",
        *T.strict_rows(strict),
        "Strict-forward replication of the factorial cells at one seed (tab:strict): Δ per validation block "
        "at the strict runs' endpoint, block-bootstrap CI; evaluator: the evaluation folder (RUN/eval/TAG) "
        "every term was evaluated in, with its `__op-` override for the strict forward on frozen weights "
        "(and the device models its evaluations recorded)",
    )
    trends = A.k_trends(pairing)
    if trends:
        data["k_trends"] = trends
        ix.table("ktrend", *T.trend_rows(trends), "K-trend slopes of ΔNLL")
    traj = A.trajectories(pairing)
    geo = _mean_geometry(points, left_out, models)
    det, det_pairing = A.detach_pairs(primary)
    many = len({k.setting() for k in traj}) > 1
    series = {_label(k, many, models): _traj_points(v) for k, v in traj.items()}
    det_series = _detach_series(det, models)
    colours = F.colours([*series, *geo, *det_series])  # a condition's one colour in every figure

    def colour_of(k: Key):
        return colours.get(_label(k, many, models))

    _seed_figures(rows, fac, ix, data, colour_of)
    if traj:
        F.trajectory_figure(
            series, out / "trajectories.png", "ΔNLL vs same-seed softmax along training", colours=colours
        )
        ix.figure("trajectories.png", "ΔNLL trajectories")
        data["trajectories"] = {_label(k, True, models): v for k, v in traj.items()}
    within = A.within_run_spearman(traj, points)
    if within:
        data["within_run"] = within
        ix.table(
            "within_run",
            *T.within_run_rows(within),
            "Within-run Spearman of row span (layer mean) against ΔNLL vs same-seed softmax over each run's "
            "checkpoints with a geometry probe (App. D; descriptive)",
        )
    _k_figure(primary, rows, traj, ix, data, colour_of)
    if geo:
        F.geometry_figure(
            geo, out / "geometry.png", "Layer-mean geometry along training (mean over seeds)", colours
        )
        ix.figure("geometry.png", "geometry")
    logs = {(str(r.dir), run): rows_ for r in results for run, rows_ in r.logs.items()}  # Point.folder
    if det:
        data["detach"] = det
        ix.table("detach", *T.detach_rows(det), "Modified backward − same-seed full-gradient twin")
        F.trajectory_figure(
            det_series,
            out / "detach.png",
            "Modified − same-seed full-gradient twin along training",
            ylabel="ΔNLL vs full-gradient twin (nats/token)",
            symlog=True,
            colours=colours,
        )
        ix.figure("detach.png", "detach vs full")
        # fig:detach (c, d): every matched pair at its endpoint (a key's rows are in training-token order)
        ends = {r.key: r for r in det if r.contrast.endswith(f"− {A.full_twin(r.key.operator)}")}
        many = len({k.setting() for k in ends}) > 1
        F.endpoint_figure(
            [
                {"operator": _label(k, many, models), "delta": r.est.mean, "lo": r.est.lo, "hi": r.est.hi}
                for k, r in sorted(ends.items(), key=lambda kv: A.key_order(kv[0]))
            ],
            out / "detach_endpoints.png",
            "Modified backward − same-seed full-gradient twin at the endpoint",
            xlabel="ΔNLL vs full-gradient twin (nats/token), 95% CI",
        )
        ix.figure("detach_endpoints.png", "detach vs full at the endpoint")
    val, val_skipped = A.validation_pairs(det_pairing, logs, points)
    if val:
        many = len({v.key.setting() for v in val}) > 1
        series = {f"{_label(replace(v.key, seed=None), many, models)}, seed {v.seed}": v for v in val}
        data["validation"] = [dict(_json_default(v), diff=v.diff) for v in val]
        F.validation_figure(
            series,
            out / "validation.png",
            "Logged validation loss and row span along training",
            {label: colour_of(replace(v.key, seed=None)) for label, v in series.items()},
        )
        ix.figure("validation.png", "logged validation loss and row span, modified vs full")
    if val_skipped:
        data["validation_skipped"] = val_skipped
        ix.table(
            "validation_skipped",
            *T.skipped_rows(val_skipped),
            "Modified-backward pairs not in validation.png (no logged validation rows)",
        )
    tail = A.tail_decomposition(primary, left_out)
    if tail:
        data["tail_decomposition"] = tail
        ix.table(
            "taildecomp",
            *T.taildecomp_rows(tail),
            "Tail policy: MinMax, FWM and resolved − softmax, MinMax − resolved and resolved − FWM, same "
            "seed (°: |Δ| < 0.01 nats, below the single-seed margin; path ratio (MinMax − resolved) / "
            "(MinMax − FWM), descriptive)",
        )
    geo_end = A.final_geometry(points, left_out)
    if geo_end:
        data["geometry"] = {_label(k, True, models): g for k, g in geo_end.items()}
        data["geometry_trajectories"] = geo
        ix.table("geometry", *T.geometry_rows(geo_end), "Endpoint geometry (layer mean, mean over seeds)")
        gap = {
            _label(r.key, len(settings) > 1, models): (
                geo_end[r.key].get("h"),
                geo_end[r.key].get("span"),
                r.est.mean,
            )
            for rs in A.ranked_rows(rows).values()  # the rows of ranks.md's Spearman (fig:widthgap)
            for r in rs
            if r.key in geo_end
        }
        if gap:
            F.widthgap_figure(gap, out / "widthgap.png", "Endpoint ΔNLL vs native width h and row span")
            ix.figure("widthgap.png", "ΔNLL vs h and span")
    ranks = A.rank_statistics(rows, geo_end, left_out)
    if any(s.kendall_w is not None or s.spearman_h is not None for s in ranks):
        data["ranks"] = ranks
        ix.table("ranks", *T.rank_rows(ranks), "Rank statistics: ordering over seeds, ΔNLL vs geometry")
    held = A.heldout_table(points, left_out)
    if held:
        data["heldout"] = held
        ix.table("heldout", *T.heldout_rows(held), "Held-out and substitution evaluations: ΔNLL vs softmax")
        order = A.heldout_ordering(points, held, rows, left_out)
        data["heldout_ordering"] = order
        ix.table(
            "heldout_ordering",
            *T.heldout_ordering_rows(order),
            "Held-out ordering: Spearman of held-out with in-domain ΔNLL (conditions with both, of those "
            "held out) and split-half fluctuation (ΔNLL on first − second half of the units; descriptive)",
        )
    grad = A.gradient_decomposition(results)
    if grad:
        data["graddecomp"] = grad
        ix.table(
            "graddecomp",
            *T.graddecomp_rows(grad),
            "Fixed-upstream decomposition of the score gradient (layer means; norm ratios to g_full, "
            "relative errors of each modified backward) and zero-sum residual (`kinterval graddiag`)",
        )
    if clean:
        data["clean_blocks"] = clean
        ix.table(
            "clean_blocks",
            *T.clean_rows(clean),
            "Endpoint ΔNLL vs same-seed softmax on the validation blocks with no target inside an n-gram "
            "window that also stands in the training split (clean), and on the others (`kinterval data "
            "overlap`)",
        )
    probes = probe_comparisons(results, pairing)  # empty when no run has `kinterval probes` output
    if probes:
        data["probes"] = probes
        ix.table(
            "probes",
            *T.probe_rows(probes),
            "Synthetic probes vs same-seed softmax (tab:probeab, tab:probec; `kinterval probes` on each run, "
            "compared as `kinterval probes-compare` does): Δ = condition − softmax per sample, paired 95% "
            "bootstrap CI; probe C slopes per doubling of the copied length L. Every row and slope: "
            "report.json `probes`",
        )
    fit, fit_skipped = A.train_fit(pairing, logs)
    if fit:
        data["train_fit"] = fit
        ix.table(
            "fit",
            *T.fit_rows(fit),
            f"Training fit at the endpoint: training loss over the last {A.FIT_TAIL:.0%} of the tokens, "
            "condition − same-seed control on the same batches, beside the evaluation ΔNLL",
        )
    if fit_skipped:
        data["train_fit_skipped"] = fit_skipped
        ix.table(
            "fit_skipped",
            *T.skipped_rows(fit_skipped, "Run vs same-seed control"),
            "Pairs not in fit.md (too few training rows logged by both in the window)",
        )
    clips = A.clip_fractions(points, logs)
    if clips:
        data["clip_fractions"] = clips
        ix.table("clip", *T.clip_rows(clips), "Gradient clipping and gradient norms in training")
    stopped = A.stopped_runs(primary, unevaluated)
    if stopped:
        data["stopped"] = stopped
        ix.table(
            "stopped",
            *T.stopped_rows(stopped),
            "Runs stopped by a non-finite loss or gradient norm (evaluated up to their last checkpoint with "
            "a finite NLL, not trained again; left out of every row at a later endpoint)",
        )
    hw = A.hardware(results)
    data["hardware"] = {
        "stacks": hw.stacks,
        "rows": hw.rows,
        "runs": hw.run_stacks,
    }
    ix.table("hardware", *T.hardware_rows(hw), T.hardware_caption(hw))
    if hw.recorded:
        data["stack"] = {"columns": hw.columns(), "rows": hw.by_family}
        ix.table(
            "stack",
            *T.stack_rows(hw),
            "Operator family by training stack (tab:dstack): runs of each family per training stack (the "
            "stacks of the hardware table), with totals",
        )
    unpaired = {**pairing.unpaired, **det_pairing.unpaired, **left_out}
    if unpaired:
        data["unpaired"] = unpaired
        ix.table(
            "unpaired",
            *T.unpaired_rows(unpaired),
            "Runs with no valid control or no evaluation at their row's endpoint (left out of those rows)",
        )
    (out / "report.json").write_text(strict_json(data) + "\n")
    ix.lines += ["All numbers: [report.json](report.json)", ""]
    (out / "index.md").write_text("\n".join(ix.lines))


def strict_json(data) -> str:
    """``data`` as strict JSON (indent 1): a NaN or infinite number (softmax's h and TV, an undefined ratio)
    is written ``null``, which every JSON reader takes (``NaN`` is Python's extension)."""

    def finite(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, list):
            return [finite(v) for v in x]
        return x

    plain = json.loads(json.dumps(data, default=_json_default))  # dataclasses, numpy values -> JSON types
    return json.dumps(finite(plain), indent=1, allow_nan=False)


def _json_default(o):
    if isinstance(o, A.Estimate):  # with its labels (paper §4, App. C.3)
        labels = {"separated": o.separated, "detectable": o.excludes_zero, "within_margin": o.within_margin}
        return {**{f.name: getattr(o, f.name) for f in dataclasses.fields(o)}, **labels}
    if dataclasses.is_dataclass(o):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    return str(o)


def demo_report(
    per_block: Mapping[str, np.ndarray],
    out_dir: str | Path,
    *,
    trajectories: Mapping[str, list[tuple[int, float]]] | None = None,
    title: str = "kinterval demo",
    notes: Sequence[str] = (),
    seeds: Mapping[str, int] | int = 0,
    probes: Mapping[str, dict] | None = None,
) -> dict:
    """Endpoint ΔNLL vs softmax with block-bootstrap CIs for the demo.

    ``per_block``: operator name -> per-block validation NLL (same blocks for all, ``"softmax"`` included).
    ``trajectories`` (optional): operator -> [(training tokens, mean val NLL)], softmax included, same tokens.
    Writes ``delta.md``, ``delta.tex``, ``delta.png`` (and ``trajectories.png``) and ``index.md`` into
    ``out_dir``, built in ``out_dir/.report.building`` and published as :func:`build_report` does
    (``index.md`` last); returns ``{"rows": [{operator, nll, delta, lo, hi, separated}], "index": path}``.
    ``notes``: lines listed under the table in ``index.md``. ``seeds``: each operator's training seed (its
    "Seed ids" cell), or one for all. ``probes`` (optional): condition -> its probes vs the control's (as
    :func:`kinterval.report.probes.compare_pair` gives them): ``probes.md``, ``probes.tex``, a section of
    ``index.md`` and the returned ``probes``.
    """
    if "softmax" not in per_block:
        raise ValueError("per_block must include the softmax reference")
    out_dir = Path(out_dir)
    with _building(out_dir) as work:
        seed_of = seeds if isinstance(seeds, Mapping) else dict.fromkeys(per_block, seeds)
        rows = _demo(per_block, work, trajectories, title, notes, seed_of, probes)
        _publish(work, out_dir, ("index.md",))
    return {"rows": rows, "index": out_dir / "index.md", **({"probes": probes} if probes else {})}


def _demo(per_block, out: Path, trajectories, title: str, notes: Sequence[str], seeds, probes) -> list[dict]:
    """The demo report's files into the folder ``out``; its rows."""
    soft = np.asarray(per_block["softmax"], dtype=np.float64)
    rows, table = [], []
    for op, nll in per_block.items():
        if op == "softmax":
            continue
        nll = np.asarray(nll, dtype=np.float64)
        if nll.shape != soft.shape:
            raise ValueError(f"{op}: {nll.shape[0]} blocks, softmax has {soft.shape[0]}")
        seed = int(seeds.get(op, 0))
        est = A.estimate({seed: nll - soft}, f"{op} − softmax")
        row = A.Row(f"{op} − softmax", Key(op, 0, "", ""), (seed,), est, nll=float(nll.mean()))
        table.append(row)
        rows.append(
            {
                "operator": op,
                "seeds": [seed],
                "nll": row.nll,
                "delta": est.mean,
                "lo": est.lo,
                "hi": est.hi,
                "interval": est.interval,
                "block": est.block,
                "separated": est.separated,
            }
        )
    headers, cells = T.delta_rows(table)
    cap = f"{title}: ΔNLL vs softmax (softmax NLL {soft.mean():.4f} nats/token, {soft.size} blocks)"
    (out / "delta.md").write_text(T.render(headers, cells, "md", cap))
    (out / "delta.tex").write_text(T.render(headers, cells, "tex", cap))
    plot_rows = [
        dict(
            r,
            lo=r["lo"] if math.isfinite(r["lo"]) else r["delta"],
            hi=r["hi"] if math.isfinite(r["hi"]) else r["delta"],
        )
        for r in rows
    ]
    F.endpoint_figure(plot_rows, out / "delta.png", cap)
    index = [f"# {title}", "", T.render(headers, cells, "md", cap), "![ΔNLL](delta.png)", ""]
    if notes:
        index += ["Notes:", *(f"- {n}" for n in notes), ""]
    if trajectories and "softmax" in trajectories:
        base = dict(trajectories["softmax"])
        traj = {
            op: [(t, v - base[t], v - base[t], v - base[t]) for t, v in pts if t in base]
            for op, pts in trajectories.items()
            if op != "softmax"
        }
        F.trajectory_figure(traj, out / "trajectories.png", f"{title}: ΔNLL along training")
        index += ["![trajectories](trajectories.png)", ""]
    if probes:
        ix = _Index(out)
        ix.table(
            "probes",
            *T.probe_rows(probes),
            "Synthetic probes vs the control (tab:probeab, tab:probec; `kinterval probes` on each run, "
            "compared as `kinterval probes-compare` does): Δ = run − control per sample, paired 95% "
            "bootstrap CI; probe C slopes per doubling of the copied length L",
        )
        index += ix.lines
    (out / "index.md").write_text("\n".join(index))
    return rows
