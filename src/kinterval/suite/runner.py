"""``kinterval suite run``: train every run of a suite, evaluate every checkpoint, skip what is done.

Sequential in this process by default; ``gpus=N`` runs one run per GPU in child processes
(``CUDA_VISIBLE_DEVICES``); ``slurm=True`` submits one job per run through submitit. A run whose status is
``completed`` with all its checkpoints is not retrained; an interrupted run resumes from its last checkpoint;
evaluations and geometry probes already on disk for the same checkpoint are kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kinterval.suite.definition import Suite, load_suite, select
from kinterval.suite.manifest import MANIFEST, build_manifest, read_manifest, run_entry, write_manifest


def prepare_data(suite: Suite, out: Path, data: str | Path | None) -> Path:
    """``data`` if given, else the suite's own ``[data]`` source prepared once into ``OUT/data``."""
    if data is not None:
        return Path(data).resolve()
    if not suite.data.get("source"):
        raise ValueError(
            f"suite {suite.name} trains on {suite.corpus or 'a prepared corpus'}: pass --data DIR "
            "(a folder made by `kinterval data prepare`)"
        )
    target = (out / "data").resolve()
    if not (target / "meta.json").is_file():
        from kinterval.data.prepare import prepare

        prepare(
            suite.data["source"],
            target,
            tokens=suite.data.get("tokens"),
            seed=suite.data.get("seed", 0),
            progress=False,
        )
    return target


def init_suite(name: str | Path, out: str | Path, data: str | Path | None = None) -> dict:
    """Load the suite, prepare its data and write (or refresh) the manifest."""
    out = Path(out)
    suite = load_suite(name)
    previous = read_manifest(out) if (out / MANIFEST).is_file() else None
    if previous and previous["suite"] != suite.name:
        raise ValueError(f"{out} holds suite {previous['suite']}, not {suite.name}")
    data_dir = prepare_data(suite, out, data if data is not None else (previous or {}).get("data_dir"))
    manifest = build_manifest(suite, out, data_dir, previous=previous)
    write_manifest(out, manifest)
    return manifest


def run_complete(run_dir: Path, entry: dict) -> bool:
    import json

    status = run_dir / "status.json"
    if not status.is_file() or json.loads(status.read_text()).get("status") != "completed":
        return False
    return all(
        (run_dir / "checkpoints" / f"step_{s:06d}" / "state.json").is_file()
        for s in entry["checkpoint_steps"]
    )


def run_one(out: str | Path, run_id: str, *, device: str | None = None, log=print) -> str:
    """Train (or resume) one run of the manifest in ``out``, then evaluate and probe its checkpoints."""
    from kinterval.eval.diagnostics import diagnose_run
    from kinterval.eval.evaluate import evaluate_run
    from kinterval.train.config import TrainConfig
    from kinterval.train.loop import train

    out = Path(out)
    manifest = read_manifest(out)
    entry = run_entry(manifest, run_id)
    run_dir = out / entry["run_dir"]
    status = "cached"
    if not run_complete(run_dir, entry):
        cfg = TrainConfig.from_dict(entry["config"])
        cfg = cfg.override({"device": device, "log.progress": False})
        resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))
        t0 = time.perf_counter()
        result = train(cfg, run_dir, resume=resume)
        status = f"{'resumed' if resume else 'trained'} in {time.perf_counter() - t0:.1f}s ({result.status})"
        if result.status != "completed":
            log(f"{run_id}: {status}")
            return result.status
    ev = manifest["eval"]
    rows = evaluate_run(run_dir, split=ev["split"], doc_clusters=ev["doc_clusters"], device=device or "auto")
    new = sum(not r["skipped"] for r in rows)
    if ev.get("geometry"):
        diagnose_run(
            run_dir, "geometry", blocks=ev["geometry_blocks"], split=ev["split"], device=device or "auto"
        )
    log(
        f"{run_id}: {status}; {len(rows)} checkpoints evaluated ({new} new), "
        f"final NLL {rows[-1]['mean_nll']:.4f}"
    )
    return "completed"


def run_suite(
    name: str | Path,
    out: str | Path,
    *,
    data=None,
    only: list[str] | None = None,
    gpus: int = 0,
    slurm: bool = False,
    slurm_args: dict | None = None,
    device: str | None = None,
    threads: int | None = None,
    log=print,
) -> dict:
    """Run (or resume) a suite; returns ``{run_id: status}``. ``threads`` sets torch's CPU threads (1 is much
    faster for tiny models on a busy machine)."""
    out = Path(out)
    if threads:
        import torch

        torch.set_num_threads(threads)
    manifest = init_suite(name, out, data)
    ids = [r.run_id for r in select(load_suite(name).runs, only)]
    if not ids:
        raise ValueError(f"--only {only} matches no run of suite {manifest['suite']}")
    log(f"suite {manifest['suite']}: {len(ids)} of {manifest['n_runs']} runs -> {out}")
    if slurm:
        return _submit_slurm(out, ids, slurm_args or {}, log)
    if gpus and gpus > 0:
        return _run_gpus(out, ids, gpus, log)
    return {rid: run_one(out, rid, device=device, log=log) for rid in ids}


def _run_gpus(out: Path, ids: list[str], gpus: int, log) -> dict:
    """One child process per run, at most one per GPU at a time."""
    pending, running, done = list(ids), {}, {}
    while pending or running:
        free = [g for g in range(gpus) if g not in running.values()]
        while pending and free:
            rid, gpu = pending.pop(0), free.pop(0)
            (out / "logs").mkdir(parents=True, exist_ok=True)
            fh = open(out / "logs" / f"{rid}.log", "a")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
            cmd = [sys.executable, "-m", "kinterval", "suite", "run-one", "--out", str(out), rid]
            running[subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)] = gpu
            log(f"{rid}: started on GPU {gpu} (log {out / 'logs' / (rid + '.log')})")
        time.sleep(2)
        for proc in [p for p in running if p.poll() is not None]:
            rid = proc.args[-1]
            done[rid] = "completed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
            log(f"{rid}: {done[rid]}")
            del running[proc]
    return done


def _submit_slurm(out: Path, ids: list[str], slurm_args: dict, log) -> dict:
    try:
        import submitit
    except ImportError as err:
        raise ValueError("--slurm needs submitit: pip install 'kinterval[slurm]'") from err
    ex = submitit.AutoExecutor(folder=str(out / "slurm" / "%j"))
    ex.update_parameters(
        gpus_per_node=1,
        tasks_per_node=1,
        nodes=1,
        name="kinterval",
        **{k: v for k, v in slurm_args.items() if v is not None},
    )
    jobs = {}
    with ex.batch():
        pending = [(rid, ex.submit(run_one, str(out), rid)) for rid in ids]
    for rid, job in pending:
        jobs[rid] = f"submitted (slurm job {job.job_id})"
        log(f"{rid}: {jobs[rid]}")
    log(f"when the jobs finish: kinterval suite gate {out}")
    return jobs
