"""``kinterval suite run``: train every run of a suite, evaluate every checkpoint, skip what is done.

Sequential in this process by default (a run that raises is recorded as failed and the next one runs);
``gpus=N`` runs one run per GPU in child processes (``CUDA_VISIBLE_DEVICES``), ``per_gpu=M`` up to M runs on
each GPU at once (a small model does not fill a large GPU); ``slurm=True`` submits one job per run to Slurm
through submitit. A run whose status is ``completed`` with all its checkpoints is not retrained, nor one the
trainer stopped with a non-finite loss (``nonfinite_loss``: its outcome, evaluated up to its last
checkpoint, or up to the first one whose NLL is not finite, recorded as ``nonfinite_eval_step`` in its
``status.json``); an interrupted run resumes from its last checkpoint; evaluations and geometry probes
already on disk for the same checkpoint are kept. A finished run that has lost a checkpoint is not trained
again (``missing_checkpoints``: that would overwrite its results), and a results folder without checkpoints
is refused as ``out``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from kinterval import atomic
from kinterval.atomic import SYSTEM_ERRNOS
from kinterval.environment import check_threads_bound
from kinterval.suite.definition import Suite, load_suite, select
from kinterval.suite.manifest import (
    MANIFEST,
    STOPPED,
    build_manifest,
    final_steps,
    read_manifest,
    resolve_data_dir,
    run_entry,
    stopped_step,
    write_manifest,
)
from kinterval.train.checkpoint import (
    CheckpointError,
    check_not_other_folder,
    check_outside_runs,
    latest_checkpoint,
    read_state,
)
from kinterval.train.config import DEVICES

_HOW = "make one with `kinterval data prepare --source bin:DIR|text:FILE|synthetic --out DIR`"


def check_data_given(suite: Suite, out: Path, data: str | Path | None) -> None:
    """``--data`` names a prepared data folder; a suite without a ``[data]`` source of its own needs one (or
    a manifest in ``out`` that names its data folder, on a resume). Checked before anything is written or
    downloaded."""
    if data is not None and not (Path(data) / "meta.json").is_file():
        where = Path(data).resolve()
        raise ValueError(f"--data {where} is not a prepared data folder (no meta.json); {_HOW}")
    if data is None and not suite.data.get("source") and not (Path(out) / MANIFEST).is_file():
        how = f"make it with `kinterval data prepare --source {suite.corpus_source} --out DIR`"
        raise ValueError(
            f"suite {suite.name} needs --data DIR, a prepared data folder; "
            + (f"its corpus is {suite.corpus}: {how}" if suite.corpus_source else _HOW)
        )


def corpus_note(suite: Suite, data: Path) -> str | None:
    """A warning when ``data`` was prepared from another source than the suite's corpus (suite D on a
    synthetic folder trained and reported as if on WikiText-103; only the run's ``train_data`` said not)."""
    if not suite.corpus_source:
        return None
    try:
        got = json.loads((data / "meta.json").read_text()).get("source")
    except (OSError, ValueError):
        return None  # an unreadable meta.json is refused with its own message when the data is opened
    if got == suite.corpus_source:
        return None
    return (
        f"suite {suite.name}'s corpus is {suite.corpus} (`kinterval data prepare --source "
        f"{suite.corpus_source}`); --data {data} was prepared from {got!r}: its results measure that corpus, "
        "not the paper's"
    )


def prepare_data(suite: Suite, out: Path, data: str | Path | None) -> Path:
    """``data`` if given, else the suite's own ``[data]`` source prepared once into ``OUT/data``."""
    check_data_given(suite, out, data)
    if data is not None:
        if note := corpus_note(suite, Path(data)):
            print(f"kinterval suite: warning: {note}", file=sys.stderr)
        return Path(data).resolve()
    if not suite.data.get("source"):  # a resume whose manifest names no data folder
        raise ValueError(f"suite {suite.name} needs --data DIR, a prepared data folder; {_HOW}")
    target = (out / "data").resolve()
    if not (target / "meta.json").is_file():
        from kinterval.data.prepare import prepare

        prepare(
            suite.data["source"],
            target,
            tokens=suite.data.get("tokens"),
            seed=suite.data.get("seed"),  # synthetic only (its default 0); refused with another source
            progress=False,
        )
    return target


def check_own_data(suite: Suite, data_dir: Path) -> None:
    """``OUT/data``, prepared from the suite's ``[data]`` in an earlier run, holds what that section says now:
    a suite file whose ``[data]`` was edited since (another source, token count or seed) trained on the old
    data and recorded the new settings in the manifest."""
    meta = json.loads((data_dir / "meta.json").read_text())
    source = suite.data["source"]
    want = {
        "source": source,
        "tokens": suite.data.get("tokens"),
        "seed": suite.data.get("seed", 0 if source == "synthetic" else None),  # data prepare's default
    }
    got = {
        "source": meta.get("source"),
        "tokens": (meta.get("params") or {}).get("tokens"),
        "seed": meta.get("seed"),
    }
    if diffs := [f"{k} {got[k]!r} (now {v!r})" for k, v in want.items() if got[k] != v]:
        raise ValueError(
            f"{data_dir} was prepared from another [data] section of suite {suite.name}: {', '.join(diffs)}; "
            "run the suite file as it is now into another --out; continue this folder with the file it began "
            f"with; or, if no run has trained on it yet, remove {data_dir} and run again"
        )


def init_suite(name: str | Path, out: str | Path, data: str | Path | None = None) -> dict:
    """Load the suite, prepare its data and write (or refresh) the manifest. On a resume without ``data`` the
    manifest's data folder is used (a relative one lies in ``out``, wherever ``out`` has been moved)."""
    out = Path(out)
    suite = load_suite(name)
    previous = read_manifest(out) if (out / MANIFEST).is_file() else None
    if previous and previous["suite"] != suite.name:
        raise ValueError(f"{out} holds suite {previous['suite']}, not {suite.name}")
    own = data is None and bool(suite.data.get("source"))  # the suite's own [data], prepared into OUT/data
    if data is None and (previous or {}).get("data_dir"):
        data = resolve_data_dir(out, previous["data_dir"])
        if own and Path(data).resolve() == (out / "data").resolve():
            data = None  # prepared again if it is gone; check_resume compares the shard hashes
        elif not (Path(data) / "meta.json").is_file():
            raise ValueError(
                f"{out}'s manifest names the data folder {data}, which is not a prepared data folder (no "
                "meta.json): pass --data DIR, the data the suite began with"
            )
    data_dir = prepare_data(suite, out, data)
    if own and data_dir == (out / "data").resolve():
        check_own_data(suite, data_dir)
    manifest = build_manifest(suite, out, data_dir, previous=previous)
    if previous:
        check_resume(out, previous, manifest, data_dir)
    write_manifest(out, manifest)
    return manifest


def _without_data_dir(m: dict) -> dict:
    """A manifest's rows and settings without the data folder's path (a moved folder is the same data)."""
    rows = [{**r, "config": {**r["config"], "data": {**r["config"]["data"], "dir": None}}} for r in m["runs"]]
    skip = ("data_dir", "suite_toml", "suite_sha256", "suite_file", "title")  # the file's text, not its rows
    return {**{k: v for k, v in m.items() if k not in skip}, "runs": rows}


def check_resume(out: Path, previous: dict, manifest: dict, data_dir: Path) -> None:
    """A suite folder continues only as it began: the same runs, settings and evaluation data. Otherwise the
    finished runs were reported cached and ok, their evaluations redone on the other data (the old ones
    overwritten) and the manifest replaced, and only a later gate said so."""
    from kinterval.data.loader import TokenShards
    from kinterval.suite.merge import manifest_differences

    check_code(out, previous)
    if diffs := manifest_differences(_without_data_dir(manifest), _without_data_dir(previous)):
        raise ValueError(
            f"{out} was run from another version of suite {manifest['suite']} ({', '.join(diffs)} differ): "
            "continue it with the suite file it began with, or run into another --out (to add conditions, "
            "put them in a suite file of their own, run it into its own --out and report both folders "
            "together)"
        )
    split = manifest["eval"]["split"]
    splits = TokenShards(data_dir, split).meta["splits"]

    def held(name: str) -> list | None:  # the shard hashes of a split of ``data_dir`` (None: no such split)
        return [x.get("sha256") for x in splits[name]["shards"]] if name in splits else None

    # Trained on it: the newest checkpoint of every run records the hashes of its training split.
    for r in manifest["runs"]:
        ck = latest_checkpoint(out / r["run_dir"])
        try:
            trained = (read_state(ck).get("identity") or {}).get("data.identity") if ck else None
        except (OSError, ValueError, CheckpointError):
            continue  # unreadable: the trainer refuses or replaces it
        if isinstance(trained, dict) and isinstance(trained.get("shards_sha256"), list):
            if trained["shards_sha256"] != held(str(trained.get("split"))):
                raise ValueError(
                    f"{out}: {r['run_id']} was trained on other {trained.get('split')} data than {data_dir} "
                    f"holds ({ck.relative_to(out)}); continue with the data folder the suite began with "
                    f"({previous.get('data_dir')}), or run into another --out"
                )
    # Evaluated on it: every evaluation records the hashes of the suite's split.
    evaluated, other = 0, []
    for r in manifest["runs"]:
        for js in sorted((out / r["eval_dir"]).glob("step_*.json")):
            try:
                req = json.loads(js.read_text()).get("request") or {}
            except (OSError, ValueError):
                continue  # unreadable: evaluated again (evaluate_run rewrites it)
            if req.get("shards_sha256") is not None:
                evaluated += 1
                if req["shards_sha256"] != held(split):
                    other.append(js.relative_to(out))
    if other and len(other) == evaluated:  # the data folder is the odd one out
        raise ValueError(
            f"{out}: {other[0]} evaluated other {split} data than {data_dir} holds; continue with the data "
            f"folder the suite began with ({previous.get('data_dir')}), or run into another --out"
        )
    if other:  # some evaluations are: made by hand on other data into the suite's folders
        raise ValueError(
            f"{out}: {len(other)} of {evaluated} evaluations record other {split} data than {data_dir} holds "
            f"(first: {other[0]}); delete them (with their .npz), and the suite run evaluates them again"
        )


def check_code(out: Path, manifest: dict) -> None:
    """Every checkpoint of a suite is trained and evaluated by the operator code it began with (the gate
    checks it): runs and evaluations of other code written into ``out`` would fail the gate afterwards."""
    from kinterval.train.checkpoint import ops_sha256

    code = manifest.get("code") or {}
    if code.get("ops_sha256") not in (None, ops_sha256()):
        raise ValueError(
            f"{out} was run by other operator code (ops_sha256 {str(code['ops_sha256'])[:12]}) than this "
            f"checkout's ({ops_sha256()[:12]}): continue it from the commit its manifest names "
            f"({code.get('git_commit')}), or run into another --out"
        )


def _device_id(gpu: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of the ``gpu``-th device this process sees: through the caller's own
    mask, so that ``CUDA_VISIBLE_DEVICES=4,5 ... --gpus 2`` runs on devices 4 and 5, not 0 and 1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[gpu].strip() if visible else str(gpu)


def read_status(run_dir: Path) -> dict | None:
    """The run's ``status.json`` object; None when it is missing or unreadable (not JSON, not an object)."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON (JSONDecodeError, UnicodeDecodeError)
        return None
    return status if isinstance(status, dict) else None


def _missing_checkpoints(run_dir: Path, steps: list[int]) -> list[int]:
    """The checkpoint steps of ``steps`` that the run folder lacks."""
    return [s for s in steps if not (run_dir / "checkpoints" / f"step_{s:06d}" / "state.json").is_file()]


def run_complete(run_dir: Path, entry: dict) -> bool:
    """Whether the run finished training (completed, or stopped by a non-finite loss:
    :func:`~kinterval.suite.manifest.final_steps`) with every checkpoint it keeps. An unreadable status.json
    (not JSON, not an object) is not finished: the run resumes, and training rewrites it."""
    final = final_steps(read_status(run_dir), entry["checkpoint_steps"])
    return final is not None and not _missing_checkpoints(run_dir, final)


def lost_checkpoints(run_dir: Path, entry: dict, eval_dir: Path) -> list[int]:
    """Checkpoint steps a run once had and has lost: every missing one that a finished run keeps
    (:func:`~kinterval.suite.manifest.final_steps`), and any missing one with an evaluation in ``eval_dir``.
    Training such a run again would overwrite its results (evaluations, metrics, status, probes), so
    :func:`run_one` does not."""
    final = final_steps(read_status(run_dir), entry["checkpoint_steps"])
    if final is not None:
        return _missing_checkpoints(run_dir, final)
    evaluated = {p.stem for p in eval_dir.glob("step_*.json")}
    missing = _missing_checkpoints(run_dir, entry["checkpoint_steps"])
    return [s for s in missing if f"step_{s:06d}" in evaluated]


def check_not_results_folder(out: Path) -> None:
    """``out`` must not be a results folder (evaluations without any checkpoint: one made by ``suite merge``
    or copied without its checkpoints), which ``suite run`` would train again over its results, nor a training
    run or checkpoint folder, or lie inside one, whose files the suite's would mix with."""
    check_outside_runs(out, "the suite's files would mix with the run's")
    check_not_other_folder(out, "the suite", own=MANIFEST)  # `--out DATA`: runs/ beside the shards
    runs = out / "runs"
    if not (out / MANIFEST).is_file() or any(runs.glob("*/checkpoints/step_*")):
        return
    if (out / "gate.json").is_file() or any(runs.glob("*/eval/*/step_*.json")):
        raise ValueError(
            f"{out} is a results folder (results without checkpoints): its runs would be trained again "
            f"over their results; run into a new --out, with --skip-gated {out} to run only what it lacks"
        )


def check_device_threads(device: str | None, threads: int | None) -> None:
    """``--device`` and ``--threads`` of ``suite run`` and ``suite run-one``."""
    if device is not None and device not in DEVICES:
        raise ValueError(f"--device must be one of {list(DEVICES)}, got {device!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"--threads must be an integer >= 1, got {threads!r}")
    if threads is not None:
        check_threads_bound(threads)


def _devices(runs, device: str | None) -> set[str]:
    """The devices the runs train on: ``device`` (``--device``) if given, else their protocols'."""
    from kinterval.train.config import TrainConfig

    if device:
        return {device}
    return {TrainConfig.from_toml(r.protocol).override(r.overrides).device for r in runs}


def check_device_available(runs, device: str | None) -> None:
    """The runs' device (``--device``, else their protocols') exists on this machine: ``cuda`` without CUDA
    is refused before any run starts, rather than failing every run in turn."""
    from kinterval.train.distributed import pick_device

    for name in sorted(_devices(runs, device) - {"auto"}):
        try:
            pick_device(name)
        except ValueError as err:
            what = f"--device {name}" if device else "the runs' protocol device"
            raise ValueError(
                f"{what}: {err}; pass --device cpu (or auto), or run on a machine with a GPU"
            ) from None


def check_auto_has_gpu(runs, device: str | None) -> None:
    """Runs whose protocol trains on ``device = "auto"`` (the GPU protocols: 124M, 1B, mini) on a machine
    without CUDA would train on the CPU, for days, unasked: refused unless ``--device cpu`` says so."""
    import torch

    if device is None and "auto" in _devices(runs, None) and not torch.cuda.is_available():
        raise ValueError(
            "no CUDA device here, and these runs' protocol trains on device 'auto' (a GPU protocol): they "
            "would train on the CPU; pass --device cpu to mean it, or run on a machine with a GPU"
        )


def check_gpus(gpus: int, runs, device: str | None) -> None:
    """``--gpus N`` needs N visible CUDA devices unless the runs train on the CPU (``--device cpu`` or a CPU
    protocol such as ``tiny-cpu``: then N child processes share the CPU). Without this a run meant for a GPU
    that a child cannot see (``CUDA_VISIBLE_DEVICES`` beyond the machine's) trained on the CPU, unnoticed."""
    devices = _devices(runs, device)
    if devices == {"cpu"}:
        return
    import torch

    found = torch.cuda.device_count()
    if found < gpus:
        fix = f"use --gpus {found} or fewer" if found else "drop --gpus"
        raise ValueError(
            f"--gpus {gpus}: {found} CUDA device(s) visible, and these runs train on device "
            f"{'/'.join(sorted(devices))}; {fix} (or pass --device cpu to share the CPU between the runs)"
        )


def run_one(
    out: str | Path, run_id: str, *, device: str | None = None, threads: int | None = None, log=print
) -> str:
    """Train (or resume) one run of the manifest in ``out``, then evaluate and probe its checkpoints.
    ``device`` overrides the protocol's; ``threads`` sets torch's CPU threads. The run's data folder is
    resolved against ``out`` (see :func:`resolve_data_dir`)."""
    from kinterval.eval.diagnostics import diagnose_run
    from kinterval.eval.evaluate import NonFiniteNLL, evaluate_run
    from kinterval.train.config import TrainConfig
    from kinterval.train.loop import train
    from kinterval.train.metrics import write_status

    check_device_threads(device, threads)
    if threads:
        import torch

        torch.set_num_threads(threads)
    out = Path(out)
    manifest = read_manifest(out)
    check_code(out, manifest)
    entry = run_entry(manifest, run_id)
    run_dir = out / entry["run_dir"]
    data = resolve_data_dir(out, entry["config"]["data"]["dir"])
    status = "cached"
    if lost := lost_checkpoints(run_dir, entry, out / entry["eval_dir"]):
        log(
            f"{run_id}: finished, but checkpoints {lost} of the manifest are missing; not trained again "
            f"(that would overwrite its results): restore them into {run_dir / 'checkpoints'}, or delete "
            f"{run_dir} to train the run anew"
        )
        return "missing_checkpoints"
    if (n := stopped_step(read_status(run_dir))) is not None:
        status = f"stopped by a non-finite loss at step {n} (its status.json); not trained again"
        log(f"{run_id}: {status} (delete {run_dir} to train it anew)")
    elif not run_complete(run_dir, entry):
        cfg = TrainConfig.from_dict(entry["config"])
        cfg = cfg.override({"device": device, "log.progress": False, "data.dir": str(data)})
        resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))
        t0 = time.perf_counter()
        result = train(cfg, run_dir, resume=resume)
        status = f"{'resumed' if resume else 'trained'} in {time.perf_counter() - t0:.1f}s ({result.status})"
        if result.status not in ("completed", STOPPED):
            log(f"{run_id}: {status}")
            return result.status
        if not run_complete(run_dir, entry):  # e.g. a checkpoint of an interrupted run deleted since
            lost = _missing_checkpoints(run_dir, final_steps(read_status(run_dir), entry["checkpoint_steps"]))
            log(f"{run_id}: {status}, but checkpoints {lost} of the manifest are missing")
            return "missing_checkpoints"
    final = read_status(run_dir)
    outcome = "completed" if stopped_step(final) is None else STOPPED
    if outcome == STOPPED and not final_steps(
        final, entry["checkpoint_steps"]
    ):  # before its first checkpoint
        log(f"{run_id}: {status}; stopped before its first checkpoint: nothing to evaluate")
        return outcome
    ev = manifest["eval"]
    # evaluated where the run trains: a CPU protocol (the ci suite's) stays on the CPU on a GPU machine
    eval_device = device or entry["config"].get("device") or "auto"
    # data given, the evaluation folder too: the manifest's, not one tagged with the data folder's name
    ev_kw = dict(
        split=ev["split"],
        data=data,
        out_dir=out / entry["eval_dir"],
        doc_clusters=ev["doc_clusters"],
        device=eval_device,
    )
    # a stopped run: its checkpoints before the first one whose NLL is not finite (it holds the diverging
    # weights; the checkpoints before it keep their evaluations): recorded, so the gate and the report agree
    steps = final_steps(read_status(run_dir), entry["checkpoint_steps"]) if outcome == STOPPED else None
    try:
        rows = _per_step(evaluate_run, run_dir, steps, ev_kw)
    except NonFiniteNLL as err:
        if outcome != STOPPED:
            raise
        write_status(run_dir, **{**read_status(run_dir), "nonfinite_eval_step": err.step})
        steps = final_steps(read_status(run_dir), entry["checkpoint_steps"])
        log(f"{run_id}: its checkpoint at step {err.step} has a non-finite NLL; the run's outcome ends there")
        if not steps:
            log(f"{run_id}: {status}; no checkpoint before it: nothing to evaluate")
            return outcome
        rows = _per_step(evaluate_run, run_dir, steps, ev_kw)
    new = sum(not r["skipped"] for r in rows)
    if ev.get("geometry"):
        geo_kw = dict(blocks=ev["geometry_blocks"], split=ev["split"], data=data, device=eval_device)
        # replace_other: the suite's own probe, in its own run folder
        _per_step(partial(diagnose_run, kind="geometry"), run_dir, steps, {**geo_kw, "replace_other": True})
    last = "last" if outcome == STOPPED else "final"
    log(
        f"{run_id}: {status}; {len(rows)} checkpoints evaluated ({new} new), "
        f"{last} NLL {rows[-1]['mean_nll']:.4f}"
    )
    return outcome


def _per_step(fn, run_dir: Path, steps: list[int] | None, kw: dict) -> list[dict]:
    """``fn(run_dir, **kw)`` over every checkpoint (``steps`` None), or over the checkpoints of ``steps``."""
    if steps is None:
        return fn(run_dir, **kw)
    return [row for s in steps for row in fn(run_dir, checkpoint=s, **kw)]


def run_suite(
    name: str | Path,
    out: str | Path,
    *,
    data=None,
    only: list[str] | None = None,
    gpus: int = 0,
    per_gpu: int = 1,
    slurm: bool = False,
    slurm_args: dict | None = None,
    device: str | None = None,
    threads: int | None = None,
    skip_gated: str | Path | None = None,
    log=print,
) -> dict:
    """Run (or resume) a suite; returns ``{run_id: status}``. ``threads`` sets torch's CPU threads (1 is much
    faster for tiny models on a busy machine). ``skip_gated``: a results folder of the same suite (see
    :mod:`kinterval.suite.merge`) whose signed-off runs are not run again, for a suite run in sittings."""
    out = Path(out)
    # Checked before init_suite creates the folder.
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError(f"--gpus must be an integer >= 0, got {gpus!r}")
    if per_gpu < 1 or (per_gpu > 1 and not gpus):
        raise ValueError(f"--per-gpu must be >= 1 and needs --gpus N (got per_gpu={per_gpu}, gpus={gpus})")
    check_device_threads(device, threads)
    suite = load_suite(name)
    runs = select(suite.runs, only)
    ids = [r.run_id for r in runs]
    if not ids:
        raise ValueError(f"--only {only} matches no run of suite {suite.name}")
    if gpus and not slurm:
        check_gpus(gpus, runs, device)
    if not slurm:  # a Slurm job checks its own node's device
        check_device_available(runs, device)
    check_not_results_folder(out)
    executor = _slurm_executor(out) if slurm else None  # no submitit or no Slurm: refused here too
    done = signed_off(skip_gated, suite.name) if skip_gated is not None else None
    if threads:
        import torch

        torch.set_num_threads(threads)
    check_data_given(suite, out, data)  # a missing --data is named first
    if not slurm:  # before init_suite writes the manifest or prepares (downloads) the suite's data
        check_auto_has_gpu(runs, device)
    # One `suite run` of a folder at a time: a second one would find the first's runs in training (each run
    # refuses a second trainer) and evaluate its finished ones at the same time.
    busy = f"{out} is being run by {{who}}: one `kinterval suite run` of a suite folder at a time"
    with atomic.exclusive(out / SUITE_LOCK, busy, remove=True):
        manifest = init_suite(name, out, data)
        if done is not None:
            ids = skip_signed_off(manifest, ids, skip_gated, *done, log)
            if not ids:
                return {}
        log(f"suite {manifest['suite']}: {len(ids)} of {manifest['n_runs']} runs -> {out}")
        if slurm:
            return submit_slurm(out, ids, slurm_args or {}, log, executor, device=device, threads=threads)
        if gpus and gpus > 0:
            return _run_gpus(out, ids, gpus, log, per_gpu=per_gpu, device=device, threads=threads)
        return {rid: _run_isolated(out, rid, device, log) for rid in ids}


SUITE_LOCK = ".suite-run.lock"


def _run_isolated(out: Path, rid: str, device: str | None, log) -> str:
    """:func:`run_one` in this process, as a child would run it under ``--gpus``: a run that raises (out of
    memory, a kernel error) is a failed run with its traceback in ``logs/<run>.log``, and the suite goes on
    with the next run instead of leaving the rest of an unattended sitting unrun. Ctrl-C still stops all, and
    so does a file system that refuses a write (a full disk, a read-only folder: :data:`SYSTEM_ERRNOS`): each
    run left would train up to its first checkpoint and fail alike. What is finished is kept; the same
    command, once the disk has room, resumes the run from its last checkpoint."""
    import traceback

    try:
        return run_one(out, rid, device=device, log=log)
    except BrokenPipeError:  # the suite's own output closed (`| head`): not this run's failure
        raise
    except OSError as err:
        if err.errno not in SYSTEM_ERRNOS:
            return _failed(out, rid, err, traceback.format_exc(), log)
        log(
            f"{rid}: stopped by a file system error (below); the runs left would fail alike, so the suite "
            f"stops here. {FILE_SYSTEM_ADVICE}"
        )
        raise
    except Exception as err:
        return _failed(out, rid, err, traceback.format_exc(), log)


def _failed(out: Path, rid: str, err: Exception, trace: str, log) -> str:
    """Record a failed run: its traceback in ``logs/<run>.log`` (when that can be written) and the status."""
    status = f"failed ({type(err).__name__}: {err})"
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        with open(out / "logs" / f"{rid}.log", "a") as fh:
            fh.write(trace)
    except OSError as log_err:  # the run's failure is the news, not the log's
        log(f"{rid}: {status}; its traceback could not be written to {out / 'logs'} ({log_err})")
        return status
    log(f"{rid}: {status}; traceback in {out / 'logs' / (rid + '.log')}")
    return status


def signed_off(results: str | Path, suite: str) -> tuple[dict, list[str]]:
    """(manifest, signed-off runs) of the results folder ``results`` (``--skip-gated``): it must pass the
    results-only gate, be of ``suite`` and have been run by this checkout's operator code, or its runs and
    the ones about to run could not be merged (:mod:`kinterval.suite.merge`)."""
    from kinterval.suite.merge import check_results_folder
    from kinterval.train.checkpoint import ops_sha256

    results = Path(results)
    manifest, record = check_results_folder(results, "--skip-gated")
    if manifest["suite"] != suite:
        raise ValueError(f"--skip-gated {results} holds suite {manifest['suite']}, not {suite}")
    code = manifest.get("code") or {}
    if code.get("ops_sha256") != ops_sha256():
        raise ValueError(
            f"--skip-gated {results} was run by other operator code (ops_sha256 "
            f"{str(code.get('ops_sha256'))[:12]}) than this checkout's ({ops_sha256()[:12]}): the runs could "
            f"not be merged; run from the commit its manifest names ({code.get('git_commit')})"
        )
    return manifest, list(record["runs"])


def skip_signed_off(manifest: dict, ids: list[str], results, theirs: dict, done: list[str], log) -> list[str]:
    """``ids`` without the runs ``results`` signs off, once the new manifest agrees with that folder's."""
    from kinterval.suite.merge import manifest_differences

    diffs = manifest_differences(manifest, theirs)
    if diffs:
        raise ValueError(
            f"--skip-gated {results}: its manifest differs from this suite folder's in {', '.join(diffs)} "
            "(suite file, data folder or settings): the runs could not be merged"
        )
    skipped = [i for i in ids if i in done]
    if skipped:
        log(f"--skip-gated {results}: {len(skipped)} runs signed off there, not run again")
    left = [i for i in ids if i not in done]
    if not left:
        log(f"nothing to run: every selected run is signed off in {results}")
    return left


# `suite run-one`'s exit status for a run that a file system stopped (a full disk, a read-only folder;
# sysexits' EX_IOERR): under --gpus the suite then starts no more runs, as it does without --gpus
EXIT_FILE_SYSTEM = 74
FILE_SYSTEM_ADVICE = (
    "Free space (or make the folder writable) and run the same command again: finished runs are kept, "
    "a stopped one resumes from its last checkpoint"
)
NOT_STARTED = "not started (a file system error stopped the suite)"


def _run_gpus(
    out: Path, ids: list[str], gpus: int, log, per_gpu: int = 1, device: str | None = None, threads=None
) -> dict:
    """One child process per run (``suite run-one``, with ``device`` and ``threads`` when given), at most
    ``per_gpu`` of them on each GPU at a time."""
    options = [*(["--device", device] if device else []), *(["--threads", str(threads)] if threads else [])]
    pending, running, done = list(ids), {}, {}
    try:
        _schedule(out, pending, running, done, gpus, per_gpu, options, log)
    except BaseException:  # Ctrl-C, or a SIGINT sent to this process alone: the children stop too
        _stop_children(running, log)
        raise
    return done


def _schedule(out: Path, pending, running, done, gpus, per_gpu, options, log) -> None:
    """:func:`_run_gpus`' loop: start runs on free GPUs, collect finished ones, until none is left."""
    from kinterval.train.trainer import EXIT_NONFINITE  # run-one's exit status for a stopped run

    while pending or running:
        load = [list(running.values()).count(g) for g in range(gpus)]
        free = [g for slot in range(per_gpu) for g in range(gpus) if load[g] <= slot]  # least loaded first
        while pending and free:
            rid, gpu = pending.pop(0), free.pop(0)
            (out / "logs").mkdir(parents=True, exist_ok=True)
            fh = open(out / "logs" / f"{rid}.log", "a")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=_device_id(gpu))
            cmd = [sys.executable, "-m", "kinterval", "suite", "run-one", "--out", str(out), *options, rid]
            running[subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)] = gpu
            log(f"{rid}: started on GPU {gpu} (log {out / 'logs' / (rid + '.log')})")
        time.sleep(2)
        for proc in [p for p in running if p.poll() is not None]:
            rid = proc.args[-1]
            done[rid] = {0: "completed", EXIT_NONFINITE: STOPPED}.get(
                proc.returncode, f"failed (exit {proc.returncode})"
            )
            log(f"{rid}: {done[rid]}")
            del running[proc]
            if proc.returncode == EXIT_FILE_SYSTEM and pending:  # the runs left would fail alike
                log(
                    f"{rid}: stopped by a file system error (its log names the file); {len(pending)} runs "
                    f"not started, the {len(running)} running go on. {FILE_SYSTEM_ADVICE}"
                )
                done.update(dict.fromkeys(pending, NOT_STARTED))
                pending.clear()


def _stop_children(running: dict, log, grace: float = 120.0) -> None:
    """Stop the ``run-one`` children of an interrupted ``--gpus`` sitting. Ctrl-C in a terminal reaches them
    with this process (its process group); a SIGINT sent to this process alone (``kill -INT``, a scheduler)
    left them training with no parent, holding their GPUs and the folder, whose lock went with this
    process. A child still running after a moment gets SIGINT (it stops as on Ctrl-C: its checkpoints
    stay), then SIGKILL after ``grace`` seconds; either way its run resumes from its last checkpoint."""
    live = [p for p in running if p.poll() is None]
    deadline = time.monotonic() + 2.0  # the group's own Ctrl-C: a second SIGINT could cut its clean-up
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = [p for p in live if p.poll() is None]
    for proc in live:
        log(f"{proc.args[-1]}: interrupted (SIGINT)")
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"{proc.args[-1]}: still running {grace:.0f} s after SIGINT: killed")
            proc.kill()
            proc.wait()


def submit_slurm(
    out: Path, ids: list[str], slurm_args: dict, log, executor=None, device=None, threads=None
) -> dict:
    """Submit one Slurm job per run: ``{run_id: "submitted (slurm job N)"}``, not results (those come later).

    A GPU is requested only when the runs train on one (a CPU protocol such as ``tiny-cpu``, or
    ``device="cpu"``, asks for none). Each job runs :func:`run_one` with ``device`` and ``threads``.
    ``executor`` replaces submitit's ``SlurmExecutor`` (tests).
    """
    manifest = read_manifest(out)
    devices = (
        {device} if device else {run_entry(manifest, rid)["config"].get("device", "auto") for rid in ids}
    )
    params = dict(nodes=1, ntasks_per_node=1, job_name="kinterval")
    if devices != {"cpu"}:
        params["gpus_per_node"] = 1
    params.update({k: v for k, v in slurm_args.items() if v is not None})
    if executor is None:
        executor = _slurm_executor(out)
    executor.update_parameters(**params)
    jobs = {}
    with executor.batch():
        pending = [
            (rid, executor.submit(run_one, str(out), rid, device=device, threads=threads)) for rid in ids
        ]
    for rid, job in pending:
        jobs[rid] = f"submitted (slurm job {job.job_id})"
        log(f"{rid}: {jobs[rid]}")
    log(f"when the jobs finish: kinterval suite gate {out}")
    return jobs


def _slurm_executor(out: Path):
    """submitit's Slurm executor; an error, not a silent local run, when this machine has no Slurm."""
    import shutil

    try:
        import submitit
    except ImportError as err:
        raise ValueError("--slurm needs submitit: pip install 'kinterval[slurm]'") from err
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]  # submitit needs both
    if missing:
        raise ValueError(
            f"--slurm: no Slurm on this machine ({' and '.join(missing)} not found); run without --slurm to "
            "train here"
        )
    return submitit.SlurmExecutor(folder=str(out / "slurm" / "%j"))
