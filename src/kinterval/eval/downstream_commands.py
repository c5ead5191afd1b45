"""CLI: ``kinterval downstream``, ``downstream-compare``, ``probes`` and ``probes-compare`` (App. C.3).

The work is done in :mod:`kinterval.eval.downstream` (lm-eval on a checkpoint, per-item results),
:mod:`kinterval.eval.downstream_compare` (paired statistics against a baseline) and
:mod:`kinterval.eval.probes`; this module parses the flags and prints.
"""

from __future__ import annotations

import json
from pathlib import Path

from kinterval import atomic

# the functions behind the commands; importable from here as well
from kinterval.eval.downstream import (  # noqa: F401
    NUMERICS_FIELDS,
    PAPER_SEED,
    FewshotUnknownWarning,
    NumericsUnknownWarning,
    check_downstream_args,
    check_same_numerics,
    effective_fewshot,
    parse_batch_size,
    run_downstream,
    warn_unknown_numerics,
)
from kinterval.eval.downstream_compare import (  # noqa: F401
    MARGIN,
    NLL_METRICS,
    PRIMARY_DEFAULT,
    PRIMARY_METRICS,
    check_groups,
    check_same_fewshot,
    difference_name,
    downstream_compare,
    format_compare,
    format_group_summary,
    group_summary,
    primary_metric,
)
from kinterval.stats.format import num


# ---------------------------------------------------------------------- CLI
def _downstream(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from kinterval.eval.checkpoints import run_folder

    out = args.out or str(run_folder(args.run) / "downstream" / (args.operator or "native"))
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
    if args.json:  # never into a folder it reads: its records would be replaced
        inputs = [
            getattr(args, "baseline", None) or args.reference,
            *(_condition(c)[1] for c in args.conditions),
        ]
        atomic.check_target(args.json, inputs=inputs)


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
    if args.json:  # before the table: `... | head` stops the printing, never the file
        atomic.write_text(args.json, json.dumps(rows, indent=1, allow_nan=False) + "\n")
    print(format_compare(rows))
    print("* BH q < 0.05 within task x metric over the conditions; ° CI excludes 0 but q >= 0.05")
    if kw["groups"]:
        print()
        print(format_group_summary(group_summary(rows, primary)))
        print("per group: condition x task comparisons on each task's primary metric (--primary)")
    return 0


def _probes(args) -> int:
    from kinterval.eval.checkpoints import run_folder
    from kinterval.eval.probes import in_probeab, interval_text, run_probes
    from kinterval.train.checkpoint import enclosing_run

    out = args.out or str(run_folder(args.run) / "probes" / (args.operator or "native"))
    if (run := enclosing_run(out)) and run[0] == Path(out).resolve():  # RUN/probes/NAME is the place
        raise ValueError(
            f"--out {out} is {run[1]}: its samples would mix with its files; give RUN/probes/NAME"
        )
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
    out = {
        name: compare_probes(folder, args.reference, n_resamples=args.resamples, seed=args.seed)
        for name, folder in conditions.items()
    }
    if args.json:  # before the table: `... | head` stops the printing, never the file
        atomic.write_text(args.json, json.dumps(out, indent=1) + "\n")
    for name, res in out.items():
        print(f"{name} ({res['operator']}) - reference ({res['reference_operator']})")
        for r in res["deltas"]:
            mark = "  tab:probeab" * in_probeab(r)
            print(f"  {r['probe']} {r['metric']:<5} {r['param']!s:>4} {r['condition']:<18} {num(r['delta'])} "
                  f"{interval_text(r['lo'], r['hi'], signed=True)} n={r['n']}{mark}")  # fmt: skip
        for r in res["slopes"]:
            print(f"  {r['probe']} {r['metric']:<5} {r['condition']:<18} slope vs log2 {r['params']}: "
                  f"{num(r['slope'])} {interval_text(r['lo'], r['hi'], signed=True)}")  # fmt: skip
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
    p.add_argument("--num-fewshot", type=int, help="few-shot examples per item (default: the task's own)")
    p.add_argument("--batch-size", type=int, default=1, help="lm-eval's batch size (default 1)")
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
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the sign flips (default 0)")
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
    p.add_argument("--seed", type=int, default=0, help="seed of the probe samples (default 0)")
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
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", help="write {condition: {operator, reference_operator, deltas, slopes}} here")
    p.set_defaults(func=_probes_compare)
