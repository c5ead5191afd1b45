"""``run_downstream``: lm-evaluation-harness on a checkpoint, per-item results stored (App. C.3, layer 3).

One JSONL per task (``doc_id``, metric values, per-choice log-likelihoods) and a ``results.json`` with the
numerics the outputs were scored with, so that runs can be compared item by item
(:mod:`kinterval.eval.downstream_compare`). Outputs scored with different numerics are never paired
(:func:`check_same_numerics`).
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
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        from kinterval.eval.lm_eval_adapter import KIntervalLM
    except ImportError as err:
        from kinterval.eval.lm_eval_commands import missing_lm_eval

        raise missing_lm_eval("downstream", err) from None

    from kinterval.eval.checkpoints import pick_device
    from kinterval.eval.evaluate import applied_numerics
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
               "backend": lm.operator_backend, "checkpoint_step": lm.state.get("step"),
               "tasks": sorted(res["samples"]), "limit": limit,
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
