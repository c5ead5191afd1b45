"""CLI: ``kinterval downstream``, ``kinterval downstream-compare`` and ``kinterval probes`` (App. C.3).

``downstream`` runs lm-evaluation-harness on a checkpoint and stores per-item results, one JSONL per
task (``doc_id``, metric values, per-choice log-likelihoods), so that two runs (e.g. an operator and
softmax) can be compared item by item: ``downstream-compare A B`` gives the mean paired difference B - A
per task and metric with a paired bootstrap CI (4000 resamples), a sign-flip permutation p (20,000 flips)
and BH q over the family (all task x metric rows of the comparison).
"""

from __future__ import annotations

import json
import math
from numbers import Number
from pathlib import Path

import numpy as np


# ---------------------------------------------------------------------- downstream
def _item(sample: dict) -> dict:
    """The per-item record of one lm-eval logged sample."""
    rec = {"doc_id": sample["doc_id"], "target": sample.get("target")}
    rec["metrics"] = {m: sample[m] for m in sample.get("metrics", []) if m in sample}
    resps = sample.get("filtered_resps", [])
    if resps and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in resps):  # loglikelihood requests
        rec["loglikelihoods"] = [float(r[0]) for r in resps]
        rec["is_greedy"] = [bool(r[1]) for r in resps]
    elif resps and all(isinstance(r, Number) for r in resps):  # loglikelihood_rolling
        rec["loglikelihoods"] = [float(r) for r in resps]
    else:
        rec["responses"] = resps
    return rec


def run_downstream(run, tasks, *, out, limit=None, operator=None, include_path=None, checkpoint="latest",
                   device="cpu", batch_size=1, num_fewshot=None) -> dict:  # fmt: skip
    """``lm_eval.simple_evaluate`` on a checkpoint; writes ``OUT/<task>.jsonl`` and ``OUT/results.json``."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from kinterval.eval.lm_eval_adapter import KIntervalLM

    lm = KIntervalLM(run, checkpoint=checkpoint, operator=operator, device=device, batch_size=batch_size)
    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    tm = TaskManager(include_path=str(include_path) if include_path else None)
    res = simple_evaluate(model=lm, tasks=tasks, limit=limit, log_samples=True, task_manager=tm,
                          num_fewshot=num_fewshot, bootstrap_iters=0)  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for task, samples in res["samples"].items():
        with open(out / f"{task}.jsonl", "w") as fh:
            for s in sorted(samples, key=lambda s: s["doc_id"]):
                fh.write(json.dumps(_item(s), default=_jsonable) + "\n")
    native = lm.state["config"]["operator"]["name"]
    summary = {"run": str(run), "operator": lm.operator, "native_operator": native,
               "checkpoint_step": lm.state.get("step"), "tasks": sorted(res["samples"]), "limit": limit,
               "results": res["results"]}  # fmt: skip
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=_jsonable) + "\n")
    return summary


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


# ---------------------------------------------------------------------- paired comparison
def _per_item(folder: Path) -> dict[str, dict]:
    """task -> {doc_id: {metric: float}}: scalar metrics, plus the item total ``loglikelihood`` (rolling)."""
    tasks = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        items = {}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            vals = {k: float(v) for k, v in rec["metrics"].items() if isinstance(v, (int, float))}
            if rec.get("loglikelihoods") and "is_greedy" not in rec:  # rolling (perplexity) tasks
                vals["loglikelihood"] = float(sum(rec["loglikelihoods"]))
            items[rec["doc_id"]] = vals
        tasks[path.stem] = items
    return tasks


def downstream_compare(a, b, *, n_resamples: int = 4000, n_perm: int = 20000, seed: int = 0) -> list[dict]:
    """Rows ``{task, metric, n, mean_a, mean_b, diff, lo, hi, p, q}``: B - A over the items both scored."""
    from kinterval.stats import bh_q, paired_bootstrap_ci, permutation_p_random

    A, B = _per_item(a), _per_item(b)
    rows = []
    for task in sorted(set(A) & set(B)):
        ids = sorted(set(A[task]) & set(B[task]))
        metrics = sorted(set.intersection(*(set(A[task][i]) & set(B[task][i]) for i in ids))) if ids else []
        for m in metrics:
            xa = np.array([A[task][i][m] for i in ids])
            xb = np.array([B[task][i][m] for i in ids])
            d = xb - xa
            row = {"task": task, "metric": m, "n": len(ids), "mean_a": xa.mean(), "mean_b": xb.mean(),
                   "diff": d.mean(), "lo": math.nan, "hi": math.nan, "p": 1.0}  # fmt: skip
            if len(d) >= 2 and np.any(d != 0):
                ci = paired_bootstrap_ci(d, n_resamples=n_resamples, seed=seed)
                row.update(lo=ci.lo, hi=ci.hi, p=permutation_p_random(d, n=n_perm, seed=seed))
            elif len(d) >= 2:
                row.update(lo=0.0, hi=0.0)
            rows.append({k: (float(v) if isinstance(v, np.floating) else v) for k, v in row.items()})
    if rows:
        for row, q in zip(rows, bh_q([r["p"] for r in rows])):
            row["q"] = float(q)
    return rows


def format_compare(rows: list[dict]) -> str:
    head = f"{'task':<24}{'metric':<16}{'n':>6}{'A':>10}{'B':>10}{'B-A':>10}{'95% CI':>22}{'p':>9}{'q':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ci = f"[{r['lo']:+.4f}, {r['hi']:+.4f}]"
        lines.append(f"{r['task']:<24}{r['metric']:<16}{r['n']:>6}{r['mean_a']:>10.4f}{r['mean_b']:>10.4f}"
                     f"{r['diff']:>+10.4f}{ci:>22}{r['p']:>9.4f}{r['q']:>9.4f}")  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def _downstream(args) -> int:
    tasks = [t for t in args.tasks.split(",") if t]
    out = args.out or str(Path(args.run) / "downstream" / (args.operator or "native"))
    summary = run_downstream(args.run, tasks, out=out, limit=args.limit, operator=args.operator,
                             include_path=args.include_path, checkpoint=args.checkpoint, device=args.device,
                             batch_size=args.batch_size, num_fewshot=args.num_fewshot)  # fmt: skip
    for task, metrics in summary["results"].items():
        shown = {k: v for k, v in metrics.items() if isinstance(v, float)}
        print(task, json.dumps(shown))
    print(f"per-item results: {out}")
    return 0


def _compare(args) -> int:
    rows = downstream_compare(args.a, args.b, seed=args.seed)
    if not rows:
        raise ValueError(f"no task with items in both {args.a} and {args.b}")
    print(format_compare(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _probes(args) -> int:
    from kinterval.eval.probes import run_probes

    out = args.out or str(Path(args.run) / "probes" / (args.operator or "native"))
    summary = run_probes(args.run, out=out, checkpoint=args.checkpoint, operator=args.operator,
                         families=args.families, device=args.device, seed=args.seed,
                         batch_size=args.batch_size)  # fmt: skip
    for r in summary["table"]:
        print(f"{r['probe']} {r['metric']:<5} {r['param']!s:>4} {r['condition']:<18} {r['mean']:.4f} "
              f"[{r['lo']:.4f}, {r['hi']:.4f}] n={r['n']}")  # fmt: skip
    skipped = {k: v for k, v in summary["skipped"].items() if v}
    if skipped:
        print(f"skipped (do not fit block_size {summary['block_size']}): {skipped}")
    print(f"per-sample results: {out}/samples.jsonl; summary: {out}/summary.json")
    return 0


def _common(p) -> None:
    p.add_argument("--run", required=True, help="training run folder (or a checkpoint folder)")
    p.add_argument("--checkpoint", default="latest", help="latest, a step number or a checkpoint path")
    p.add_argument("--operator", help="substitute this attention operator (e.g. softmax); default: the run's")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="output folder (default RUN/<command>/<operator>)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "downstream", help="lm-evaluation-harness tasks on a checkpoint, per-item results"
    )
    _common(p)
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=float, help="items per task (int) or fraction")
    p.add_argument("--include-path", help="folder of extra task YAML files")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--batch-size", type=int, default=1)
    p.set_defaults(func=_downstream)

    p = subparsers.add_parser(
        "downstream-compare", help="paired per-item comparison of two downstream outputs"
    )
    p.add_argument("a", help="baseline output folder (e.g. softmax)")
    p.add_argument("b", help="compared output folder; differences are B - A")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the rows as JSON here")
    p.set_defaults(func=_compare)

    p = subparsers.add_parser("probes", help="synthetic induction / retrieval / copy probes on a checkpoint")
    _common(p)
    p.add_argument("--families", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.set_defaults(func=_probes)
