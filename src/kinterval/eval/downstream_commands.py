"""CLI: ``kinterval downstream``, ``downstream-compare``, ``probes`` and ``probes-compare`` (App. C.3).

``downstream`` runs lm-evaluation-harness on a checkpoint and stores per-item results, one JSONL per
task (``doc_id``, metric values, per-choice log-likelihoods), so that runs can be compared item by item:
``downstream-compare BASE C1 C2 ...`` gives, per task and metric, each condition's mean paired difference
from the baseline with a paired bootstrap CI (4000 resamples), a sign-flip permutation p (20,000 flips), BH q
within the task x metric family over the conditions, the App. C.3 labels and the BLiMP macro-average.

Both commands refuse to pair outputs scored with different numerics (:func:`check_same_numerics`).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from numbers import Number
from pathlib import Path

import numpy as np

from kinterval import atomic


# ---------------------------------------------------------------------- downstream
def _item(sample: dict) -> dict:
    """The per-item record of one lm-eval logged sample."""
    rec = {"doc_id": sample["doc_id"], "target": sample.get("target")}
    if "filter" in sample:  # lm-eval logs one sample per (doc, filter)
        rec["filter"] = sample["filter"]
    rec["metrics"] = {m: sample[m] for m in sample.get("metrics", []) if m in sample}
    # lm-eval's own --log_samples files hold the responses as strings ("-1.5", "False"); simple_evaluate's
    # in-memory samples hold numbers and bools
    resps = sample.get("filtered_resps", [])
    if resps and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in resps):  # loglikelihood requests
        rec["loglikelihoods"] = [float(r[0]) for r in resps]
        rec["is_greedy"] = [r[1] in (True, "True") for r in resps]
    elif resps and all(_number(r) is not None for r in resps):  # loglikelihood_rolling
        rec["loglikelihoods"] = [_number(r) for r in resps]
    else:
        rec["responses"] = resps
    return rec


def _number(x) -> float | None:
    """A number, or the string of one; else None (a generated text)."""
    if isinstance(x, Number) and not isinstance(x, bool):
        return float(x)
    try:
        return float(x) if isinstance(x, str) else None
    except ValueError:
        return None


PAPER_SEED = 20260920  # App. C.3, layer 3: the seed of the lm-eval runs

# The numerics an output was scored with, as kinterval.eval.evaluate.applied_numerics names them (not imported
# here: it pulls in torch). "device" itself (cuda:0 vs cuda:1) is recorded but not compared.
NUMERICS_FIELDS = ("device_type", "autocast", "attention_dtype", "tf32", "eval_dot_precision")


class NumericsUnknownWarning(UserWarning):
    """An output compared without a check of its numerics: it was written before they were recorded."""


class FewshotUnknownWarning(UserWarning):
    """A task compared without a check of its number of few-shot examples: its folder does not record it."""


def check_same_numerics(records, what: str = "outputs") -> list[str]:
    """Refuse (``ValueError``) outputs scored with different numerics; return the names of those whose
    numerics are unknown.

    ``records``: ``(name, record)`` pairs, the record being an output's ``results.json`` or ``summary.json``,
    or None when it has none (an lm-eval ``--log_samples`` folder). A field the record lacks (one written
    before the numerics were recorded) is unknown and never conflicts: two old outputs stay comparable with
    each other, and an old one with a new one (the caller warns that it could not check). Two known values
    that differ in any of :data:`NUMERICS_FIELDS` (e.g. a CUDA output under bf16 autocast against a CPU one)
    are refused.
    """
    first = {}  # field -> (name, value) of the first output that records it
    unknown, diffs = [], {}
    for name, rec in records:
        rec = rec if isinstance(rec, dict) else {}
        if any(f not in rec for f in NUMERICS_FIELDS):
            unknown.append(name)
        for f in NUMERICS_FIELDS:
            if f not in rec:
                continue
            seen = first.setdefault(f, (name, rec[f]))
            if seen[1] != rec[f] and f not in diffs:
                diffs[f] = (seen, (name, rec[f]))
    if diffs:
        (a, _), (b, _) = next(iter(diffs.values()))
        shown = ", ".join(f"{f} {va!r} vs {vb!r}" for f, ((_, va), (_, vb)) in diffs.items())
        raise ValueError(f"{what} scored with different numerics cannot be paired: {shown} ({a} vs {b}); "
                         "score both on the same kind of device (--device)")  # fmt: skip
    return unknown


def warn_unknown_numerics(names, what: str = "output") -> None:
    for name in names:
        warnings.warn(f"{name}: no recorded numerics (device, autocast, TF32; written before they were "
                      f"recorded): compared without checking that its {what} used the same",
                      NumericsUnknownWarning, stacklevel=3)  # fmt: skip


def parse_batch_size(value) -> int:
    """lm-eval's batch size: a positive integer, or ``auto`` / ``auto:N`` (lm-eval's search for the largest
    batch that fits), which this model runs as batch size 1; ``None`` is 1."""
    text = "auto" if value is None else str(value).strip()
    if text == "auto" or re.fullmatch(r"auto:[1-9][0-9]*", text):
        return 1
    if re.fullmatch(r"[0-9]+", text) and int(text) >= 1:
        return int(text)
    raise ValueError(f"batch_size {value!r}: use a positive integer, auto or auto:N")


def check_downstream_args(tasks, limit, num_fewshot, seed, batch_size=1) -> None:
    """``ValueError`` naming the flag for arguments lm-eval would fail on with a traceback (no task, a limit
    of 0, -1 or nan) or take silently (a negative number of few-shot examples, a limit of 2.5 items)."""
    from kinterval.ops.seeds import check_seed

    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ValueError(f"--tasks must name at least one lm-eval task, got {tasks!r}")
    if limit is not None:  # lm-eval: a limit below 1 is a fraction of each task's items, else a count
        ok = isinstance(limit, Number) and not isinstance(limit, bool) and math.isfinite(limit) and limit > 0
        if not ok or (limit >= 1 and limit != int(limit)):
            raise ValueError(
                f"--limit must be a fraction in (0, 1) or a whole number of items, got {limit!r}"
            )
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int)
                                    or num_fewshot < 0):  # fmt: skip
        raise ValueError(f"--num-fewshot must be an integer >= 0, got {num_fewshot!r}")
    check_seed(seed, "--seed")
    try:
        parse_batch_size(batch_size)
    except ValueError:  # the command line's flag takes integers; lm-eval's "auto" strings come from Python
        what = "a positive integer" if isinstance(batch_size, int) else "a positive integer, auto or auto:N"
        raise ValueError(f"--batch-size must be {what}, got {batch_size!r}") from None


def run_downstream(run, tasks, *, out, limit=None, operator=None, include_path=None, checkpoint="latest",
                   device="auto", batch_size=1, num_fewshot=None, seed=PAPER_SEED) -> dict:  # fmt: skip
    """``lm_eval.simple_evaluate`` on a checkpoint; writes ``OUT/<task>.jsonl`` and ``OUT/results.json``.

    Tasks are lm-eval's, the YAMLs kinterval ships (``sciq_nosupport``) and those in ``include_path``.
    ``seed`` seeds lm-eval's python, numpy, torch and few-shot generators (the paper's by default).
    ``device`` "auto" is CUDA when available (the paper's numerics: bf16 autocast outside the fp32 attention),
    else the CPU; ``results.json`` records the device and the numerics applied there."""
    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    check_downstream_args(
        tasks, limit, num_fewshot, seed, batch_size
    )  # before lm-eval, which fails with a traceback
    limit = int(limit) if limit is not None and limit >= 1 else limit  # a count (the flag reads a float)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from kinterval.eval.checkpoints import pick_device
    from kinterval.eval.evaluate import applied_numerics
    from kinterval.eval.lm_eval_adapter import KIntervalLM
    from kinterval.eval.lm_eval_commands import TASKS_DIR, hub_error

    device = pick_device(device)  # an unknown device, or CUDA without a GPU, before lm-eval walks its tasks
    if include_path is not None and not Path(include_path).is_dir():  # lm-eval would only say "not found"
        raise FileNotFoundError(f"--include-path {include_path}: no such folder of task YAML files")
    tm = TaskManager(include_path=[str(TASKS_DIR), *([str(include_path)] if include_path else [])])
    unknown = [t for t in tasks if not tm.match_tasks([t]) and not Path(t).is_file()]  # a YAML path is fine
    if unknown:
        raise ValueError(f"lm-eval tasks not found: {', '.join(unknown)} (lm-eval's task names, or the names "
                         "of task YAMLs in --include-path DIR)")  # fmt: skip
    lm = KIntervalLM(run, checkpoint=checkpoint, operator=operator, device=device, batch_size=batch_size)
    try:
        res = simple_evaluate(model=lm, tasks=tasks, limit=limit, log_samples=True, task_manager=tm,
                              num_fewshot=num_fewshot, bootstrap_iters=0, random_seed=seed,
                              numpy_random_seed=seed, torch_random_seed=seed,
                              fewshot_random_seed=seed)  # fmt: skip
    except ConnectionError as err:  # a task's dataset on the Hub, without network
        raise ValueError(hub_error(err, "--include-path")) from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _begin_writing(out)
    files = {}
    for task, samples in res["samples"].items():
        lines = [
            json.dumps(_item(s), default=_jsonable) + "\n" for s in sorted(samples, key=lambda s: s["doc_id"])
        ]
        data = "".join(lines).encode()
        atomic.write_bytes(out / f"{task}.jsonl", data)
        files[f"{task}.jsonl"] = atomic.sha256_bytes(data)
    # the number of few-shot examples each task was scored with (lm-eval's "n-shot"): --num-fewshot, or the
    # task's default where it is not given (lm-eval keeps 0 for a task whose config fixes 0)
    shots = {t: effective_fewshot(t, res) for t in sorted(res["samples"])}
    native = lm.state["config"]["operator"]["name"]
    numerics = {"device": str(lm._device), **applied_numerics(lm.model.config.numerics, lm._device)}
    summary = {"run": str(run), "operator": lm.operator, "native_operator": native,
               "checkpoint_step": lm.state.get("step"), "tasks": sorted(res["samples"]), "limit": limit,
               "num_fewshot": num_fewshot, "task_num_fewshot": shots, "seed": seed, "batch_size": batch_size,
               **numerics, "results": res["results"], "files_sha256": files}  # fmt: skip
    atomic.write_json(out / "results.json", summary, default=_jsonable)  # last: the folder is complete
    return summary


# results.json while `kinterval downstream` writes a folder: a run cut short leaves it, and the folder is
# refused (deleting results.json instead would leave a folder read as lm-eval's own output, unchecked)
WRITING = {"complete": False, "note": "`kinterval downstream` was writing this folder and did not finish"}


def _begin_writing(out: Path) -> None:
    """Mark ``out`` as being written (results.json becomes :data:`WRITING`, atomically, before any per-item
    file is replaced) and remove the per-item files of the run that wrote it before (its results.json's
    ``files_sha256``, else its ``tasks``), so that no task of another run stays beside the new ones."""
    path = out / "results.json"
    try:
        old = json.loads(path.read_bytes()) if path.is_file() else {}
    except ValueError:  # torn or not JSON: nothing to learn from it
        old = {}
    old = old if isinstance(old, dict) else {}
    names = old.get("files_sha256") or {
        f"{t}.jsonl": None for t in old.get("tasks") or [] if isinstance(t, str)
    }
    atomic.write_json(path, WRITING)
    for name in names:
        if isinstance(name, str) and name.endswith(".jsonl") and Path(name).name == name:
            (out / name).unlink(missing_ok=True)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


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
        raise ValueError(f"downstream result folder {folder} does not exist")
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
        raise ValueError(f"no per-item result files (*.jsonl) in {folder}")
    return files


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


def _count(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def effective_fewshot(task: str, res: dict) -> int | None:
    """The number of few-shot examples ``task`` was scored with in an lm-eval result (``simple_evaluate``'s
    return or a ``results_<date>.json``): its ``n-shot``, else its config's ``num_fewshot``; else None."""
    shots, configs = res.get("n-shot"), res.get("configs")
    k = _count(shots.get(task)) if isinstance(shots, dict) else None
    if k is None and isinstance(configs, dict) and isinstance(configs.get(task), dict):
        k = _count(configs[task].get("num_fewshot"))
    return k


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
    if isinstance(rec, dict) and rec.get("complete") is False:
        raise ValueError(f"{path}: {rec.get('note', 'an unfinished output')}; rerun it")
    return rec if isinstance(rec, dict) else None


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
        ids = sorted(base_items)
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
            keys = [(t, i) for t in paradigms for i in sorted(base[t])]
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
    cells = [(f"{r['n']}", f"{r['baseline']:.4f}", f"{r['value']:.4f}", f"{r['diff']:+.4f}",
              interval_text(r["lo"], r["hi"], signed=True), f"{r['p']:.4f}", f"{r['q']:.4f}")
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


# ---------------------------------------------------------------------- CLI
def _downstream(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    out = args.out or str(Path(args.run) / "downstream" / (args.operator or "native"))
    summary = run_downstream(args.run, tasks, out=out, limit=args.limit, operator=args.operator,
                             include_path=args.include_path, checkpoint=args.checkpoint, device=args.device,
                             batch_size=args.batch_size, num_fewshot=args.num_fewshot,
                             seed=args.seed)  # fmt: skip
    for task, metrics in summary["results"].items():
        shown = {k: v for k, v in metrics.items() if isinstance(v, float)}
        print(task, json.dumps(shown))
    print(f"per-item results: {out}")
    return 0


def _condition(arg: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` (named by itself)."""
    name, sep, path = arg.partition("=")
    return (name, path) if sep and name and path else (arg, arg)


def _groups(values) -> dict[str, list[str]]:
    """``--group NAME=COND[,COND...]`` flags as an ordered mapping (checked by :func:`check_groups`)."""
    groups: dict[str, list[str]] = {}
    for v in values:
        name, sep, members = v.partition("=")
        names = [c.strip() for c in members.split(",") if c.strip()]
        if not sep or not name.strip() or not names:
            raise ValueError(f"--group must be NAME=COND[,COND...], got {v!r}")
        if name.strip() in groups:
            raise ValueError(f"--group {name.strip()} is given twice")
        groups[name.strip()] = names
    return groups


def _primary(values) -> dict[str, str]:
    """``--primary TASK=METRIC`` flags as a mapping."""
    out = {}
    for v in values or []:
        task, sep, metric = (x.strip() for x in v.partition("="))
        if not sep or not task or not metric:
            raise ValueError(f"--primary must be TASK=METRIC, got {v!r}")
        out[task] = metric
    return out


def _check_compare_args(args) -> None:
    """The seed, the resample and permutation counts and the ``--json`` target, before any table is printed
    (a directory failed after it)."""
    from kinterval.ops.seeds import check_seed

    check_seed(args.seed, "--seed")
    for flag in ("resamples", "permutations"):  # probes-compare has no --permutations
        n = getattr(args, flag, 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {n!r}")
    if args.json:
        path = Path(args.json)
        if path.is_dir():
            raise ValueError(f"--json {path}: is a directory; give a file name")
        if not path.parent.is_dir():
            raise ValueError(f"--json {path}: the folder {path.parent} does not exist")


def _compare(args) -> int:
    _check_compare_args(args)
    conditions = dict(_condition(c) for c in args.conditions)
    if len(conditions) != len(args.conditions):
        raise ValueError(f"condition names must be distinct: {args.conditions}")
    kw = {"n_resamples": args.resamples, "n_perm": args.permutations, "seed": args.seed}
    kw["task_differences"] = [tuple(t.strip() for t in v.split(",")) for v in args.task_difference or []]
    kw["groups"] = _groups(args.group) if args.group else None
    primary = _primary(args.primary)
    # (a NumericsUnknownWarning or FewshotUnknownWarning is a "kinterval downstream-compare: warning:" line)
    rows = downstream_compare(
        args.baseline, conditions, margin=args.margin, nll_metrics=args.nll_metrics, **kw
    )
    print(format_compare(rows))
    print("* BH q < 0.05 within task x metric over the conditions; ° CI excludes 0 but q >= 0.05")
    if kw["groups"]:
        print()
        print(format_group_summary(group_summary(rows, primary)))
        print("per group: condition x task comparisons on each task's primary metric (--primary)")
    if args.json:
        atomic.write_text(args.json, json.dumps(rows, indent=1, allow_nan=False) + "\n")
    return 0


def _probes(args) -> int:
    from kinterval.eval.probes import in_probeab, interval_text, run_probes

    out = args.out or str(Path(args.run) / "probes" / (args.operator or "native"))
    summary = run_probes(args.run, out=out, checkpoint=args.checkpoint, operator=args.operator,
                         families=args.families, copies=args.copies, device=args.device, seed=args.seed,
                         batch_size=args.batch_size)  # fmt: skip
    for r in summary["table"]:
        mark = "  tab:probeab" * in_probeab(r)
        print(f"{r['probe']} {r['metric']:<5} {r['param']!s:>4} {r['condition']:<18} {r['mean']:.4f} "
              f"{interval_text(r['lo'], r['hi'])} n={r['n']}{mark}")  # fmt: skip
    skipped = {k: v for k, v in summary["skipped"].items() if v}
    if skipped:
        print(f"skipped (do not fit block_size {summary['block_size']}): {skipped}")
    print(f"per-sample results: {out}/samples.jsonl; summary: {out}/summary.json")
    return 0


def _probes_compare(args) -> int:
    from kinterval.eval.probes import compare_probes, in_probeab, interval_text

    _check_compare_args(args)
    conditions = dict(_condition(c) for c in args.conditions)
    if len(conditions) != len(args.conditions):  # one would silently replace the other in --json
        raise ValueError(f"condition names must be distinct: {args.conditions}")
    out = {}
    for name, folder in conditions.items():
        res = compare_probes(folder, args.reference, n_resamples=args.resamples, seed=args.seed)
        out[name] = res
        print(f"{name} ({res['operator']}) - reference ({res['reference_operator']})")
        for r in res["deltas"]:
            mark = "  tab:probeab" * in_probeab(r)
            print(f"  {r['probe']} {r['metric']:<5} {r['param']!s:>4} {r['condition']:<18} {r['delta']:+.4f} "
                  f"{interval_text(r['lo'], r['hi'], signed=True)} n={r['n']}{mark}")  # fmt: skip
        for r in res["slopes"]:
            print(f"  {r['probe']} {r['metric']:<5} {r['condition']:<18} slope vs log2 {r['params']}: "
                  f"{r['slope']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}]")  # fmt: skip
    if args.json:
        atomic.write_text(args.json, json.dumps(out, indent=1) + "\n")
    return 0


def _common(p) -> None:
    p.add_argument("--run", required=True, help="training run folder (or a checkpoint folder)")
    p.add_argument("--checkpoint", default="latest", help="latest, a step number or a checkpoint path")
    p.add_argument("--operator", help="substitute this attention operator (e.g. softmax); default: the run's")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available: the paper's numerics), cpu, cuda or cuda:N")  # fmt: skip
    p.add_argument("--out", help="output folder (default RUN/<command>/<operator>)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "downstream", help="lm-evaluation-harness tasks on a checkpoint, per-item results"
    )
    _common(p)
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=float, help="items per task (int) or fraction")
    p.add_argument("--include-path", help="folder of extra task YAML files (besides sciq_nosupport, shipped)")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--seed",
        type=int,
        default=PAPER_SEED,
        help=f"lm-eval's random seeds (default {PAPER_SEED}, the paper's)",
    )
    p.set_defaults(func=_downstream)

    p = subparsers.add_parser(
        "downstream-compare", help="N conditions against one baseline, paired per item (BH per task x metric)"
    )
    p.add_argument("baseline", help="baseline result folder (e.g. softmax)")
    p.add_argument(
        "conditions", nargs="+", help="compared result folders, PATH or NAME=PATH; diff = cond - base"
    )
    p.add_argument("--margin", type=float, default=MARGIN, help="equivalence margin in nats (default 0.01)")
    p.add_argument("--nll-metrics", nargs="+", default=list(NLL_METRICS),
                   help="metrics in nats per token that get the margin label (default: nll)")  # fmt: skip
    p.add_argument("--resamples", type=int, default=4000, help="paired bootstrap resamples (default 4000)")
    p.add_argument("--permutations", type=int, default=20000, help="random sign flips (default 20000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task-difference", action="append", metavar="A,B",
                   help="add rows of the derived task A\u2212B: per item, task A's score minus task B's "
                   "on the same items (e.g. sciq,sciq_nosupport: the support-passage benefit); "
                   "repeatable")  # fmt: skip
    p.add_argument("--group", action="append", metavar="NAME=COND[,COND...]",
                   help="a pre-declared condition group (App. E); repeatable, in the declared order; every "
                   "condition in one group. Adds each row's group and a count per group")  # fmt: skip
    p.add_argument("--primary", action="append", metavar="TASK=METRIC",
                   help="the metric a task is counted by in the group counts (default: the paper's, "
                   "acc_norm for hellaswag, piqa, arc_easy; acc otherwise); repeatable")  # fmt: skip
    p.add_argument("--json", help="also write the rows as JSON here")
    p.set_defaults(func=_compare)

    p = subparsers.add_parser("probes", help="synthetic induction / retrieval / copy probes on a checkpoint")
    _common(p)
    p.add_argument(
        "--families",
        type=int,
        default=400,
        help="families of probes A and B (default 400: 2,000 induction, 2,400 retrieval samples)",
    )
    p.add_argument(
        "--copies",
        type=int,
        default=300,  # probes.COPIES (not imported: it pulls in torch)
        help="probe C samples per segment length L (default 300, the paper's: 900 in total)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="sequences per forward (default 1, as the paper scores; more is faster, not bit-identical)",
    )
    p.set_defaults(func=_probes)

    p = subparsers.add_parser(
        "probes-compare", help="probe results minus a reference (softmax) on the same samples, with slopes"
    )
    p.add_argument("reference", help="reference `kinterval probes` output folder (e.g. softmax)")
    p.add_argument("conditions", nargs="+", help="compared probe output folders, PATH or NAME=PATH")
    p.add_argument("--resamples", type=int, default=4000, help="bootstrap resamples (default 4000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write {condition: {operator, reference_operator, deltas, slopes}} here")
    p.set_defaults(func=_probes_compare)
