"""``kinterval suite list|show|run|run-one|gate|merge``."""

from __future__ import annotations

import shlex


def _list(args) -> int:
    from kinterval.suite.definition import load_suite, shipped_suites

    for name in shipped_suites():
        s = load_suite(name)
        print(
            f"{name:14s} {len(s.runs):4d} runs {s.n_jobs:5d} eval jobs  protocol {s.protocol:10s} {s.title}"
        )
    return 0


def _show(args) -> int:
    from kinterval.suite.definition import load_suite, select

    s = load_suite(args.name)
    runs = select(s.runs, args.only)
    if not runs:  # as `suite run --only` refuses it
        raise ValueError(f"--only {args.only} matches no run of suite {s.name}")
    print(f"suite {s.name}: {s.title} ({len(runs)} runs, protocol {s.protocol}, corpus {s.corpus or '-'})")
    for r in runs:
        print(f"  {r.run_id:60s} {r.group:20s} seed {r.seed:5d}  {r.checkpoints} ckpts  {r.protocol}")
    return 0


def _run(args) -> int:
    from kinterval.suite.manifest import STOPPED
    from kinterval.suite.runner import run_suite

    if args.slurm_time is not None and args.slurm_time < 1:  # before the manifest and data are written
        raise ValueError(f"--slurm-time must be a number of minutes >= 1, got {args.slurm_time}")
    if not args.slurm and (
        given := [f for f in ("slurm_time", "slurm_partition") if getattr(args, f) is not None]
    ):
        raise ValueError(f"--{given[0].replace('_', '-')} is for --slurm (the runs start here without it)")
    slurm_args = {"partition": args.slurm_partition, "time": args.slurm_time}
    res = run_suite(
        args.name,
        args.out,
        data=args.data,
        only=args.only,
        gpus=args.gpus,
        per_gpu=args.per_gpu,
        slurm=args.slurm,
        slurm_args=slurm_args,
        device=args.device,
        threads=args.threads,
        skip_gated=args.skip_gated,
    )
    if args.slurm:  # submitted is not done: the gate says when the jobs have finished
        print(
            f"{len(res)} runs submitted to Slurm, 0 finished yet; afterwards: kinterval suite gate {args.out}"
        )
        return 0
    stopped = sorted(k for k, v in res.items() if v == STOPPED)
    bad = sorted(k for k, v in res.items() if v not in ("completed", STOPPED))
    line = f"{len(res) - len(bad) - len(stopped)} of {len(res)} runs ok"
    if stopped:  # an outcome the gate signs off and the report lists, not a failure: not trained again
        line += f"; stopped by a non-finite loss (evaluated as far as they got): {stopped}"
    print(line + (f"; failed: {bad}" if bad else ""))
    if not res:  # --skip-gated: every selected run is signed off there, nothing ran here
        print(f"nothing ran in {args.out}: the runs are signed off in {args.skip_gated}; gate it there")
        return 0
    out = shlex.quote(str(args.out))  # a command to paste: a folder with a space stays one argument
    if args.only or args.skip_gated:  # a part of the suite: a plain gate counts the rest as errors
        print(f"next: kinterval suite gate {out} --partial (without --partial once every run has run)")
    else:
        print(f"next: kinterval suite gate {out}")
    return 1 if bad else 0


def _run_one(args) -> int:
    import sys

    from kinterval.atomic import SYSTEM_ERRNOS, system_error_message
    from kinterval.suite.manifest import STOPPED
    from kinterval.suite.runner import EXIT_FILE_SYSTEM, run_one
    from kinterval.train.trainer import EXIT_NONFINITE

    try:
        status = run_one(args.out, args.run_id, device=args.device, threads=args.threads)
    except OSError as err:  # a full disk: its own exit status, so that --gpus starts no more runs
        if err.errno not in SYSTEM_ERRNOS:
            raise
        print(f"kinterval suite: error: {system_error_message(err)}", file=sys.stderr)
        return EXIT_FILE_SYSTEM
    # a stopped run exits as `kinterval train` does for it (docs/training.md), so that --gpus tells it apart
    return {"completed": 0, STOPPED: EXIT_NONFINITE}.get(status, 1)


def _gate(args) -> int:
    from pathlib import Path

    from kinterval.suite.gate import RECORD, gate
    from kinterval.suite.manifest import MANIFEST
    from kinterval.suite.merge import replaced_folder

    if args.max_errors < 0:
        raise ValueError(f"--max-errors must be >= 0, got {args.max_errors}")
    if not (Path(args.dir) / MANIFEST).is_file():  # one that is there but unreadable is a gate error
        if not Path(args.dir).exists() and replaced_folder(args.dir).is_dir():
            raise FileNotFoundError(
                f"{args.dir}: not there; an interrupted `kinterval suite merge` left it as "
                f"{replaced_folder(args.dir)}: run that merge again (it puts the folder back, then merges)"
            )
        raise FileNotFoundError(f"{args.dir}: no {MANIFEST} there, not a suite or results folder")
    rep = gate(
        args.dir, results_only=args.results_only, write_record=not args.no_record, partial=args.partial
    )
    for e in rep.errors[: args.max_errors]:
        print(f"ERROR {e}")
    if len(rep.errors) > args.max_errors:
        print(f"... and {len(rep.errors) - args.max_errors} more errors")
    if rep.stopped:
        runs = " ".join(f"{rid} (step {n})" for rid, n in rep.stopped.items())
        print(f"stopped by a non-finite loss, gated up to their last checkpoint ({len(rep.stopped)}): {runs}")
    if rep.not_run:
        print(f"not run ({len(rep.not_run)}): {' '.join(rep.not_run)}")
    mode = " (results only)" if rep.results_only else ""
    print(f"integrity gate{mode}, suite {rep.suite}: {rep.summary()}")
    if rep.record is not None:
        print(f"wrote {rep.record} (what `kinterval suite gate --results-only` checks a copy against)")
    if rep.hint:
        print(rep.hint)
    if rep.record_error is not None:  # the verdict is printed; the missing record is the error line
        print(f"not recorded: {RECORD} could not be written (--no-record gates a folder without writing it)")
        raise rep.record_error
    return 0 if rep.ok else 1


def _merge(args) -> int:
    from kinterval.suite.merge import merge

    res = merge(args.src, args.dst)
    print(f"merged {len(res.added)} runs into {res.dst}: {' '.join(res.added) or '-'}")
    if res.already:
        print(f"already there, same bytes ({len(res.already)}): {' '.join(res.already)}")
    if res.not_run:
        print(f"{res.dst} still lacks {len(res.not_run)} runs of the suite: {' '.join(res.not_run)}")
    print(f"next: kinterval report {res.dst}")
    return 0


def register(subparsers) -> None:
    from kinterval.suite.definition import shipped_suites  # the package's suite files, not a stale list

    p = subparsers.add_parser(
        "suite", help="the paper's suites: list, run (train + evaluate), integrity gate"
    )
    sub = p.add_subparsers(dest="suite_command", metavar="ACTION")
    sub.required = True
    q = sub.add_parser("list", help="shipped suites")
    q.set_defaults(func=_list)
    q = sub.add_parser("show", help="the runs of a suite")
    q.add_argument("name", help=f"shipped suite name ({', '.join(shipped_suites())}) or a .toml path")
    q.add_argument("--only", nargs="+", default=None, help="run id / group / operator patterns (* wildcards)")
    q.set_defaults(func=_show)
    q = sub.add_parser(
        "run", help="train and evaluate a suite into --out (skips finished work, resumes runs)"
    )
    q.add_argument("name", help="shipped suite name or a .toml path")
    q.add_argument("--out", required=True, help="suite folder (manifest.json, runs/, data/)")
    q.add_argument(
        "--data",
        default=None,
        help="prepared data folder (`kinterval data prepare`); required unless the suite prepares its own",
    )
    q.add_argument("--only", nargs="+", default=None, help="run id / group / operator patterns (* wildcards)")
    q.add_argument("--gpus", type=int, default=0, help="run N runs in parallel, one per GPU")
    q.add_argument(
        "--per-gpu", type=int, default=1, help="with --gpus: up to M runs at once on each GPU (small models)"
    )
    q.add_argument("--slurm", action="store_true", help="submit one Slurm job per run (needs submitit)")
    q.add_argument("--slurm-partition", default=None, help="Slurm partition (default: the cluster's)")
    q.add_argument("--slurm-time", type=int, default=None, help="job time limit in minutes")
    q.add_argument(
        "--device", default=None, help="override the protocol's device (cpu, cuda); also with --gpus, --slurm"
    )
    q.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (e.g. 1 for the ci suite); per run"
    )
    q.add_argument(
        "--skip-gated",
        default=None,
        metavar="RESULTS_DIR",
        help="skip the runs this results folder of the same suite signs off (a suite run in sittings, "
        "merged with `suite merge`); refused unless it was run by this checkout's operator code",
    )
    q.set_defaults(func=_run)
    q = sub.add_parser(
        "run-one", help="train + evaluate one run of an initialised suite folder (used by --gpus)"
    )
    q.add_argument("run_id", help="a run id of the suite folder's manifest (`kinterval suite show`)")
    q.add_argument("--out", required=True, help="the suite folder `kinterval suite run` initialised")
    q.add_argument("--device", default=None, help="override the protocol's device (cpu, cuda)")
    q.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    q.set_defaults(func=_run_one)
    q = sub.add_parser(
        "gate",
        help="integrity gate: every run complete, evaluated, on protocol, same code, every byte hashed",
    )
    q.add_argument("dir", help="suite folder")
    q.add_argument(
        "--results-only",
        action="store_true",
        help="a copy without checkpoints and data: check it against the gate.json the full gate wrote",
    )
    q.add_argument("--no-record", action="store_true", help="do not write gate.json after a clean full gate")
    q.add_argument(
        "--partial",
        action="store_true",
        help="a suite cut short: gate the completed runs, list the others as not run (gate.json says so)",
    )
    q.add_argument("--max-errors", type=int, default=50, help="errors to print (default 50)")
    q.set_defaults(func=_gate)
    q = sub.add_parser(
        "merge",
        help="gather the gated runs of a suite folder (e.g. one sitting, gated with --partial) into a "
        "results folder without checkpoints",
    )
    q.add_argument("src", help="suite folder with gate.json (full or partial gate), or a results folder")
    q.add_argument("dst", help="results folder of the same suite and operator code (made when absent)")
    q.set_defaults(func=_merge)
