"""``downstream_compare``: N conditions against one baseline, paired per item (App. C.3, layer 3).

Per task and metric, each condition's mean paired difference from the baseline with a paired bootstrap CI
(4000 resamples), a sign-flip permutation p (20,000 flips), BH q within the task x metric family over the
conditions, the App. C.3 labels, the BLiMP macro-average, task differences and the pre-declared condition
groups (App. E).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np

from kinterval import atomic
from kinterval.eval.downstream import (
    FewshotUnknownWarning,
    _count,
    _item,
    check_same_numerics,
    effective_fewshot,
    warn_unknown_numerics,
)
from kinterval.stats.format import num, prob

# ---------------------------------------------------------------------- paired comparison
MARGIN = 0.01  # nats: the pre-declared practical-equivalence margin, NLL-type metrics only (App. C.3)
NLL_METRICS = ("nll",)  # per-token NLL in nats; accuracy-type metrics get no margin status
BLIMP_PREFIX = (
    "blimp_"  # BLiMP paradigms are lm-eval tasks ``blimp_<paradigm>``; their macro row is ``blimp``
)
_SAMPLES = re.compile(r"samples_(?P<task>.+)_\d{4}-\d{2}-\d{2}T[0-9.\-]+\.jsonl")  # lm-eval --log_samples


def _task_files(folder: Path) -> dict[str, Path]:
    """task -> per-item file: ``<task>.jsonl`` (``kinterval downstream``) or lm-eval's
    ``samples_<task>_<date>.jsonl`` (``lm_eval --log_samples --output_path``)."""
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"downstream result folder {folder} {what}")
    files: dict[str, Path] = {}
    for path in sorted(folder.glob("*.jsonl")):
        m = _SAMPLES.fullmatch(path.name)
        task = m["task"] if m else path.stem
        if task in files:
            raise ValueError(
                f"task {task!r}: more than one result file in {folder} ({files[task].name}, {path.name})"
            )
        files[task] = path
    if not files:
        # lm_eval --output_path DIR writes into DIR/<model name>/: name the folder to pass
        inner = sorted(d for d in folder.iterdir() if d.is_dir() and any(d.glob("samples_*.jsonl")))
        hint = (
            f"; lm-eval wrote its files one level down: pass {', or '.join(map(str, inner))}" if inner else ""
        )
        raise ValueError(f"no per-item result files (*.jsonl) in {folder}{hint}")
    return files


def doc_order(doc_id) -> tuple:
    """Items in doc_id order, integer ids (lm-eval's) before string ones (hand-made files may mix them)."""
    return (isinstance(doc_id, str), doc_id)


def _per_item(folder) -> dict[str, dict]:
    """task -> {doc_id: (target, {metric: float})}: scalar metrics, plus the item total ``loglikelihood`` of
    rolling (perplexity) tasks. lm-eval's per-item ``perplexity`` (loglikelihood tasks, e.g. LAMBADA) is the
    target's log-likelihood (its aggregate is exp(-mean)) and is named ``loglikelihood``. A task logged under
    several lm-eval filters gets each metric per filter, ``metric,filter``; a (doc_id, filter) logged twice
    is an error. A folder whose ``results.json`` records ``files_sha256`` (``kinterval downstream``) must hold
    exactly those files, with those hashes; an unfinished one (results.json :data:`WRITING`) is refused."""
    tasks = {}
    recorded = (_results_record(folder) or {}).get("files_sha256")  # first: an unfinished folder is refused
    files = _task_files(Path(folder))
    for task, path in files.items():
        data = path.read_bytes()
        record = Path(folder) / "results.json"
        if isinstance(recorded, dict) and path.name not in recorded:
            raise ValueError(f"{path} is not one of the files {record} records (a file of another run?): "
                             "remove it, or rerun `kinterval downstream`")  # fmt: skip
        if isinstance(recorded, dict) and recorded[path.name] != atomic.sha256_bytes(data):
            raise ValueError(f"{path} is not the file {record} records (sha256 differs: a mixed or changed "
                             "output); rerun `kinterval downstream`")  # fmt: skip
        logged = {}  # (doc_id, filter) -> (target, metrics)
        for n, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as err:  # not JSON, or not UTF-8
                raise ValueError(f"{path}, line {n}: not a JSON record ({err})") from None
            if not isinstance(rec, dict) or "doc_id" not in rec:  # e.g. a probes samples.jsonl
                raise ValueError(f"{path}, line {n}: not a per-item result record (no doc_id)")
            doc = rec["doc_id"]
            if isinstance(doc, bool) or not isinstance(doc, (int, str)):
                raise ValueError(f"{path}, line {n}: doc_id must be an integer or a string, got {doc!r}")
            if "filtered_resps" in rec:  # an lm-eval logged sample
                rec = _item(rec)
            if not isinstance(rec.get("metrics"), dict):
                raise ValueError(f"{path}, line {n}: not a per-item result record (no metrics)")
            vals = {k: float(v) for k, v in rec["metrics"].items() if isinstance(v, (int, float))}
            if "perplexity" in vals:
                vals["loglikelihood"] = vals.pop("perplexity")
            if rec.get("loglikelihoods") and "is_greedy" not in rec:  # rolling (perplexity) tasks
                vals["loglikelihood"] = float(sum(rec["loglikelihoods"]))
            bad = sorted(m for m, v in vals.items() if not math.isfinite(v))
            if bad:  # a NaN would pass as a difference of its own (lm-eval scores a NaN model silently)
                raise ValueError(f"{folder}: task {task!r}, doc_id {rec['doc_id']}: {', '.join(bad)} is not "
                                 f"finite ({path.name}, line {n}); rescore a checkpoint that gives finite "
                                 "log-likelihoods")  # fmt: skip
            target = rec.get("target")
            key = (rec["doc_id"], rec.get("filter"))
            if key in logged:
                under = f" under filter {key[1]!r}" if key[1] is not None else ""
                raise ValueError(f"{path}, line {n}: doc_id {key[0]}{under} is logged twice")
            logged[key] = (None if target is None else str(target), vals)
        if not logged:
            raise ValueError(f"{path} holds no items (an empty result file)")
        several = len({f for _, f in logged}) > 1
        items = {}
        for (doc, f), (target, vals) in logged.items():
            old_target, merged = items.setdefault(doc, (target, {}))
            if old_target != target:
                raise ValueError(f"{path}: doc_id {doc} has targets {old_target!r} and {target!r}")
            merged.update({f"{m},{f}" if several else m: v for m, v in vals.items()})
        tasks[task] = items
    if isinstance(recorded, dict):
        missing = sorted(set(recorded) - {p.name for p in files.values()})
        if missing:
            raise ValueError(f"{folder}: {', '.join(missing)} recorded in results.json but missing")
    return tasks


def _fewshot(folder, rec: dict | None, tasks) -> dict[str, int | None]:
    """task -> the number of few-shot examples it was scored with, None where the folder does not say.

    ``kinterval downstream``'s results.json records it per task (``task_num_fewshot``); one written before
    records only the flag (``num_fewshot``: a number holds for every task, null is each task's default,
    unknown here). lm-eval's own ``--log_samples`` folder has it in its ``results_<date>.json``."""
    if rec is not None:
        per_task = rec.get("task_num_fewshot")
        if isinstance(per_task, dict):
            return {t: _count(per_task.get(t)) for t in tasks}
        return {t: _count(rec.get("num_fewshot")) for t in tasks}
    found = {t: set() for t in tasks}
    for path in sorted(Path(folder).glob("results_*.json")):
        try:
            res = json.loads(path.read_bytes())
        except ValueError as err:
            raise ValueError(f"{path}: not a JSON file ({err})") from None
        for t in tasks if isinstance(res, dict) else ():
            k = effective_fewshot(t, res)
            if k is not None:
                found[t].add(k)
    return {t: next(iter(k)) if len(k) == 1 else None for t, k in found.items()}  # two runs disagree: unknown


def check_same_fewshot(folders) -> None:
    """Refuse (``ValueError``) a task scored with different numbers of few-shot examples in two folders;
    warn (:class:`FewshotUnknownWarning`) for the tasks a folder does not record it for.

    ``folders``: ``(name, folder, record)`` triples (``record``: the folder's results.json or None)."""
    tasks = sorted(_task_files(Path(folders[0][1])))
    shots = {name: _fewshot(folder, rec, tasks) for name, folder, rec in folders}
    for t in tasks:
        known = {name: s[t] for name, s in shots.items() if s[t] is not None}
        if len(set(known.values())) > 1:
            shown = ", ".join(f"{name}: {k}" for name, k in known.items())
            raise ValueError(f"task {t!r} scored with different numbers of few-shot examples (--num-fewshot) "
                             f"cannot be paired ({shown})")  # fmt: skip
    unknown = {name: [t for t in tasks if s[t] is None] for name, s in shots.items()}
    shown = "; ".join(f"{name} ({'all tasks' if len(u) == len(tasks) else ', '.join(u)})"
                      for name, u in unknown.items() if u)  # fmt: skip
    if shown:
        warnings.warn(f"no recorded number of few-shot examples in {shown}: compared without checking that "
                      "each task was scored with the same", FewshotUnknownWarning, stacklevel=3)  # fmt: skip


def _results_record(folder) -> dict | None:
    """The folder's ``results.json`` (``kinterval downstream``), None without one (lm-eval's own output)."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_bytes())
    except ValueError as err:  # not JSON (e.g. torn), or not UTF-8
        raise ValueError(f"{path}: not a JSON file ({err})") from None
    if not isinstance(rec, dict):  # damaged: its files would be compared unchecked
        raise ValueError(f"{path}: not a results record (a JSON object), got {type(rec).__name__}")
    if rec.get("complete") is False:
        raise ValueError(f"{path}: {rec.get('note', 'an unfinished output')}; rerun it")
    return rec


def _check_same_items(base_name: str, base: dict, name: str, cond: dict) -> None:
    """Refuse conditions whose tasks, items (doc_id and target) or metrics differ from the baseline's."""
    if set(base) != set(cond):
        only = sorted(set(base) ^ set(cond))
        raise ValueError(f"task(s) {only} are in only one of {base_name!r} and {name!r}")
    for task in sorted(base):
        a, b = base[task], cond[task]
        if set(a) != set(b):
            n_only = len(set(a) ^ set(b))
            raise ValueError(f"task {task!r}: item sets differ between {base_name!r} ({len(a)} items) and "
                             f"{name!r} ({len(b)} items); {n_only} doc_id(s) in only one")  # fmt: skip
        for i in a:
            (ta, ma), (tb, mb) = a[i], b[i]
            if ta is not None and tb is not None and ta != tb:
                raise ValueError(
                    f"task {task!r}: item {i} has target {ta!r} in {base_name!r} but {tb!r} in {name!r}"
                )
            if set(ma) != set(mb):
                raise ValueError(f"task {task!r}: item {i} has metrics {sorted(ma)} in {base_name!r} but "
                                 f"{sorted(mb)} in {name!r}")  # fmt: skip


def _metrics(task: str, items: dict) -> list[str]:
    metric_sets = {frozenset(m) for _, m in items.values()}
    if len(metric_sets) != 1:
        raise ValueError(
            f"task {task!r}: items carry different metric sets {sorted(map(sorted, metric_sets))}"
        )
    return sorted(next(iter(metric_sets)))


def _paired(task, metric, name, base, cond, w, *, n_resamples, n_perm, seed) -> dict:
    """One condition - baseline row; ``w`` (item weights, or None) makes the mean a weighted (macro) mean."""
    from kinterval.stats import cluster_bootstrap_ci, paired_bootstrap_ci, permutation_p_random

    d = cond - base
    if w is None:
        mean = lambda x: float(x.mean())  # noqa: E731
    else:
        mean = lambda x: float(np.sum(w * x) / np.sum(w))  # noqa: E731
    row = {"task": task, "metric": metric, "condition": name, "n": len(d), "baseline": mean(base),
           "value": mean(cond), "diff": mean(d), "lo": None, "hi": None, "p": 1.0}  # fmt: skip
    if len(d) >= 2 and np.any(d != 0):
        if w is None:
            ci = paired_bootstrap_ci(d, n_resamples=n_resamples, seed=seed)
            p = permutation_p_random(d, n=n_perm, seed=seed)
        else:  # items resampled with their weights; sign flips of w_i d_i test the weighted mean
            ci = cluster_bootstrap_ci(d, np.arange(len(d)), w, n_resamples=n_resamples, seed=seed)
            p = permutation_p_random(w * d, n=n_perm, seed=seed)
        row.update(lo=ci.lo, hi=ci.hi, p=p)
    elif len(d) >= 2:
        row.update(lo=0.0, hi=0.0)
    return row


def _label(row: dict, *, margin: float, nll_metrics) -> dict:
    """The two independent labels of App. C.3 (detectability; margin status for NLL-type metrics only) and
    the mark of the paper's tables: ``*`` BH q < 0.05, ``°`` CI excludes zero but q >= 0.05."""
    from kinterval.stats import label_single_seed

    if row["lo"] is None or row["hi"] is None:  # one item: no CI
        return dict(row, detectable=None, margin_status=None, mark="")
    lab = label_single_seed(row["lo"], row["hi"], margin)
    status = lab.margin_status if row["metric"] in nll_metrics else None  # no margin for accuracy metrics
    mark = "*" if row["q"] < 0.05 else ("°" if lab.detectable else "")
    return dict(row, detectable=lab.detectable, margin_status=status, mark=mark)


DIFF_METRICS = ("acc", "acc_norm")  # the metrics of a task difference: acc, and acc_norm where both have it


def difference_name(a: str, b: str) -> str:
    """The derived task of ``--task-difference A,B``: ``A−B`` (a minus sign, U+2212)."""
    return f"{a}\u2212{b}"


def _task_difference(folders, a: str, b: str) -> tuple[list[dict], list[str]]:
    """``folders``: ``(name, per-item results)`` pairs; their ``{doc_id: (target, {metric: A - B})}``, in
    order, and the metrics.

    Every folder must hold tasks ``a`` and ``b`` with the same items (doc_id and target): the difference of
    one item is its score with ``a``'s prompt minus its score with ``b``'s (e.g. SciQ with and without the
    support passage), so an item of one task only has no difference and is refused, not dropped."""
    flag = f"--task-difference {a},{b}"
    for name, tasks in folders:
        for t in (a, b):
            if t not in tasks:
                raise ValueError(f"{flag}: {name} has no result file for task {t!r}")
        ia, ib = tasks[a], tasks[b]
        if set(ia) != set(ib):
            n_only = len(set(ia) ^ set(ib))
            raise ValueError(f"{flag}: the items of {a!r} ({len(ia)}) and {b!r} ({len(ib)}) differ in "
                             f"{name}; {n_only} doc_id(s) in only one")  # fmt: skip
        for i in ia:
            if ia[i][0] != ib[i][0]:
                raise ValueError(f"{flag}: item {i} has target {ia[i][0]!r} in {a!r} but {ib[i][0]!r} in "
                                 f"{b!r} ({name})")  # fmt: skip
    both = set.intersection(*(set(_metrics(t, tasks[t])) for _, tasks in folders for t in (a, b)))
    metrics = [m for m in DIFF_METRICS if m in both]
    if DIFF_METRICS[0] not in metrics:
        raise ValueError(f"{flag}: tasks {a!r} and {b!r} do not both have the metric {DIFF_METRICS[0]!r}")
    derived = [{i: (t, {m: tasks[a][i][1][m] - tasks[b][i][1][m] for m in metrics})
                for i, (t, _) in tasks[a].items()} for _, tasks in folders]  # fmt: skip
    return derived, metrics


def _check_differences(task_differences) -> list[tuple[str, str]]:
    """``task_differences`` as distinct ``(A, B)`` pairs of two different task names, else ``ValueError``."""
    pairs = []
    for pair in task_differences or ():
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2
        if not ok or not all(isinstance(t, str) and t.strip() and t == t.strip() for t in pair):
            raise ValueError(f"--task-difference must be two task names A,B, got {pair!r}")
        if pair[0] == pair[1]:
            raise ValueError(f"--task-difference {pair[0]},{pair[1]}: names one task twice")
        if tuple(pair) in pairs:
            raise ValueError(f"--task-difference {pair[0]},{pair[1]} is given twice")
        pairs.append(tuple(pair))
    return pairs


# The primary metric of each configuration of the paper's layer-3 table (tab:stagec): acc_norm for HellaSwag,
# PIQA and ARC-Easy; acc for the others (LAMBADA, SciQ with and without the passage, the BLiMP macro row).
PRIMARY_METRICS = {"hellaswag": "acc_norm", "piqa": "acc_norm", "arc_easy": "acc_norm"}
PRIMARY_DEFAULT = "acc"


def check_groups(groups, conditions) -> dict[str, str]:
    """``groups`` (group -> condition names, in the order of the pre-declaration) as condition -> group.

    Every group has a name and at least one condition, every named condition is one of ``conditions``, and
    every condition is in exactly one group: a count per group must not silently miss or double a condition.
    """
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"--group: give at least one group NAME=COND[,COND...], got {groups!r}")
    group_of: dict[str, str] = {}
    for name, members in groups.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"--group: a group needs a name, got {name!r}")
        if isinstance(members, str) or not members:
            raise ValueError(f"--group {name}: give the group's conditions as a list, got {members!r}")
        for c in members:
            if c not in conditions:
                raise ValueError(f"--group {name}: {c!r} is not a compared condition ({conditions})")
            if c in group_of:
                raise ValueError(f"--group {name}: {c!r} is already in group {group_of[c]!r}")
            group_of[c] = name
    missing = [c for c in conditions if c not in group_of]
    if missing:
        raise ValueError(f"--group: every condition needs a group; not in any: {missing}")
    return group_of


def primary_metric(task: str, primary=None) -> str:
    """The metric a configuration is counted by: ``primary[task]`` if given, else the paper's
    (:data:`PRIMARY_METRICS`, else ``acc``)."""
    return {**PRIMARY_METRICS, **(primary or {})}.get(task, PRIMARY_DEFAULT)


def group_summary(rows, primary=None) -> list[dict]:
    """Per pre-declared group, the counts the paper's predictions are judged by (§5 downstream, App. E
    "Pre-declared predictions, outcome"): over every condition x configuration of the group, on the
    configuration's primary metric (:func:`primary_metric`).

    ``rows``: :func:`downstream_compare` rows with ``group`` (rows of several calls may be joined, e.g. the
    BLiMP folder's and the other tasks'). A configuration is a task; BLiMP counts once, as its macro row
    ``blimp`` (its paradigms ``blimp_*`` are not counted), and ``--task-difference`` rows are not
    configurations. Returns ``[{group, conditions, tasks, comparisons, negative, positive, detectable,
    q05_negative, q05_positive, skipped_tasks}]`` in the groups' order: ``negative``/``positive`` count point
    estimates below/above 0, ``detectable`` CIs that exclude 0, ``q05_*`` BH q < 0.05 by the sign of the
    difference; ``skipped_tasks`` are tasks without their primary metric (e.g. a perplexity-only task).
    """
    if any("group" not in r for r in rows):
        raise ValueError("group_summary needs rows with a group (downstream_compare(..., groups=...))")
    out: dict[str, dict] = {}
    for r in rows:
        g = out.setdefault(r["group"], {"group": r["group"], "conditions": [], "tasks": [], "comparisons": 0,
                                        "negative": 0, "positive": 0, "detectable": 0, "q05_negative": 0,
                                        "q05_positive": 0, "skipped_tasks": []})  # fmt: skip
        task = r["task"]
        if task.startswith(BLIMP_PREFIX) or "\u2212" in task:  # a paradigm, or a task difference
            continue
        if r["condition"] not in g["conditions"]:
            g["conditions"].append(r["condition"])
        if task not in g["tasks"]:
            g["tasks"].append(task)
    for g in out.values():  # a task counts on its primary metric; one without it is named, not dropped
        have = {(r["task"], r["metric"]) for r in rows if r["group"] == g["group"]}
        g["skipped_tasks"] = [t for t in g["tasks"] if (t, primary_metric(t, primary)) not in have]
        g["tasks"] = [t for t in g["tasks"] if t not in g["skipped_tasks"]]
    for r in rows:
        g = out[r["group"]]
        if r["task"] not in g["tasks"] or r["metric"] != primary_metric(r["task"], primary):
            continue
        g["comparisons"] += 1
        g["negative"] += r["diff"] < 0
        g["positive"] += r["diff"] > 0
        g["detectable"] += bool(r["detectable"])
        if r["q"] < 0.05:
            g["q05_negative" if r["diff"] < 0 else "q05_positive"] += 1
    return list(out.values())


def format_group_summary(summary: list[dict]) -> str:
    head = (f"{'group':<20}{'conditions':>11}{'tasks':>6}{'compared':>9}{'diff<0':>7}{'diff>0':>7}"
            f"{'CI excl 0':>10}{'q<.05, <0':>10}{'q<.05, >0':>10}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for g in summary:
        lines.append(f"{g['group']:<20}{len(g['conditions']):>11}{len(g['tasks']):>6}{g['comparisons']:>9}"
                     f"{g['negative']:>7}{g['positive']:>7}{g['detectable']:>10}{g['q05_negative']:>10}"
                     f"{g['q05_positive']:>10}")  # fmt: skip
        if g["skipped_tasks"]:
            lines.append(f"  (not counted, no primary metric: {', '.join(g['skipped_tasks'])})")
    return "\n".join(lines)


def downstream_compare(
    baseline,
    conditions,
    *,
    margin=MARGIN,
    nll_metrics=NLL_METRICS,
    n_resamples=4000,
    n_perm=20000,
    seed=0,
    task_differences=(),
    groups=None,
) -> list[dict]:
    """N conditions against one baseline, paired per item (App. C.3, layer 3).

    ``baseline`` is a result folder; ``conditions`` a folder, a list of folders or a mapping name -> folder.
    Every condition must hold the baseline's tasks, items (doc_id, target) and metrics, else ``ValueError``
    naming the task. Rows ``{task, metric, condition, n, baseline, value, diff, lo, hi, p, q, family_size,
    detectable, margin_status, mark}``: ``diff`` is condition - baseline, with a paired bootstrap 95% CI
    (``n_resamples``) and a sign-flip permutation p (``n_perm`` random flips); ``q`` is BH within the family
    of one task x metric over the conditions (the paper's 14 comparisons per configuration x metric). The
    BLiMP paradigms (tasks ``blimp_*``) add the macro-average rows of task ``blimp`` (mean over paradigms,
    items resampled with weight 1/items-of-their-paradigm). ``margin_status`` (CI inside +-``margin`` nats)
    is given for ``nll_metrics`` only.

    ``task_differences``: ``(A, B)`` pairs of tasks scored on the same items (``sciq``, ``sciq_nosupport``).
    Each adds the rows of the derived task ``A−B`` (:func:`difference_name`; metric ``acc``, and ``acc_norm``
    where both tasks have it): per item the score with A minus the score with B, paired between condition
    and baseline as a task is, so ``diff`` = (cond_A - cond_B) - (base_A - base_B), BH within its own
    ``A−B`` x metric family. Every folder must hold A and B with the same items, else ``ValueError``.

    ``groups``: the pre-declared condition groups (App. E, "Pre-declared condition groups"), a mapping
    group name -> condition names that puts every condition in exactly one group (:func:`check_groups`).
    Each row then carries its ``group``, and within a family the rows follow the groups' order (BH q does
    not depend on it); :func:`group_summary` counts the outcomes per group.

    Folders whose ``results.json`` record different numerics (device type, autocast, attention dtype, TF32,
    eval dot precision) are refused (``ValueError``); a folder without them (no ``results.json``, or one
    written before they were recorded) is compared unchecked, with a :class:`NumericsUnknownWarning` when
    another folder records them (:func:`check_same_numerics`).
    """
    from kinterval.stats import bh_q

    if isinstance(conditions, (str, Path)):
        conditions = [conditions]
    if not isinstance(conditions, dict):
        conditions = {str(c): c for c in conditions}
    if not conditions:
        raise ValueError("downstream_compare needs at least one condition")
    pairs = _check_differences(task_differences)
    group_of = check_groups(groups, list(conditions)) if groups is not None else None
    base_name = str(baseline)
    base = _per_item(baseline)
    conds = {name: _per_item(folder) for name, folder in conditions.items()}
    derived = [(difference_name(a, b), *_task_difference([(base_name, base), *conds.items()], a, b))
               for a, b in pairs]  # fmt: skip
    clash = sorted({t for t, _, _ in derived} & set(base))
    if clash:
        raise ValueError(f"task {clash[0]!r} is both a result file and a --task-difference row")
    for name, cond in conds.items():
        _check_same_items(base_name, base, name, cond)
    records = [(base_name, _results_record(baseline))]
    records += [(name, _results_record(folder)) for name, folder in conditions.items()]
    unknown = check_same_numerics(records, "downstream results")
    # few-shot examples change every item's score: compared per task
    folders = [(base_name, baseline), *conditions.items()]
    check_same_fewshot([(name, folder, rec) for (name, folder), (_, rec) in zip(folders, records)])
    if len(unknown) < len(records):  # old folders among themselves: nothing to warn about
        warn_unknown_numerics(unknown, "scoring")

    kw = {"n_resamples": n_resamples, "n_perm": n_perm, "seed": seed}
    families = {}  # (task, metric) -> rows, one per condition

    def task_rows(task, metrics, base_items, cond_items):  # cond_items: one {doc_id: ...} per condition
        ids = sorted(base_items, key=doc_order)
        for m in metrics:
            xb = np.array([base_items[i][1][m] for i in ids])
            families[(task, m)] = [
                _paired(task, m, name, xb, np.array([c[i][1][m] for i in ids]), None, **kw)
                for name, c in zip(conds, cond_items)
            ]

    for task in sorted(base):
        task_rows(task, _metrics(task, base[task]), base[task], [c[task] for c in conds.values()])
    paradigms = [t for t in sorted(base) if t.startswith(BLIMP_PREFIX)]
    if paradigms:
        if "blimp" in base:
            raise ValueError("task 'blimp' is both a result file and the BLiMP macro-average row")
        for m in sorted(set.intersection(*(set(_metrics(t, base[t])) for t in paradigms))):
            keys = [(t, i) for t in paradigms for i in sorted(base[t], key=doc_order)]
            w = np.array([1.0 / len(base[t]) for t, _ in keys])  # each paradigm weighs 1
            xb = np.array([base[t][i][1][m] for t, i in keys])
            rows = []
            for name, c in conds.items():
                xc = np.array([c[t][i][1][m] for t, i in keys])
                rows.append(dict(_paired("blimp", m, name, xb, xc, w, **kw), paradigms=len(paradigms)))
            families[("blimp", m)] = rows
    for task, items, metrics in derived:  # per-item A - B, paired between condition and baseline as a task
        task_rows(task, metrics, items[0], items[1:])
    named = set(nll_metrics) - {m for _, m in families}
    if tuple(nll_metrics) != NLL_METRICS and named:  # a misspelt name would label nothing, silently
        have = sorted({m for _, m in families})
        raise ValueError(
            f"--nll-metrics {', '.join(sorted(named))}: no task has that metric (metrics: {have})"
        )
    out = []
    for rows in families.values():
        labelled = []
        for row, q in zip(rows, bh_q([r["p"] for r in rows])):
            row = dict(row, q=float(q), family_size=len(rows))
            labelled.append(_label(row, margin=margin, nll_metrics=nll_metrics))
        if group_of is not None:  # grouped: rows in the groups' order, stable within a group
            order = {g: i for i, g in enumerate(groups)}
            labelled = sorted((dict(r, group=group_of[r["condition"]]) for r in labelled),
                              key=lambda r: order[r["group"]])  # fmt: skip
        out += labelled
    return [{k: (float(v) if isinstance(v, np.floating) else v) for k, v in r.items()} for r in out]


def format_compare(rows: list[dict]) -> str:
    from kinterval.eval.probes import interval_text

    # text columns as wide as their longest entry plus a space (e.g. the metric "loglikelihood"); numeric ones
    # right-aligned after at least one space (a log-likelihood total is 9 characters or more)
    w = {k: max([width] + [len(str(r[k])) + 1 for r in rows]) for k, width in
         (("task", 24), ("metric", 12), ("condition", 20))}  # fmt: skip
    cells = [(f"{r['n']}", f"{r['baseline']:.4f}", f"{r['value']:.4f}", num(r["diff"]),
              interval_text(r["lo"], r["hi"], signed=True), prob(r["p"]), prob(r["q"]))
             for r in rows]  # fmt: skip
    names = ("n", "base", "cond", "diff", "95% CI", "p", "q")
    nw = [max([least, *(len(c[i]) + 1 for c in cells)]) for i, least in enumerate((6, 9, 9, 10, 22, 8, 8))]
    head = (f"{'task':<{w['task']}}{'metric':<{w['metric']}}{'condition':<{w['condition']}}"
            + "".join(f"{h:>{n}}" for h, n in zip(names, nw)) + "  margin")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r, c in zip(rows, cells):
        lines.append(f"{r['task']:<{w['task']}}{r['metric']:<{w['metric']}}{r['condition']:<{w['condition']}}"
                     + "".join(f"{x:>{n}}" for x, n in zip(c, nw))
                     + f"{r['mark']:<2}{r['margin_status'] or ''}")  # fmt: skip
    return "\n".join(lines)
