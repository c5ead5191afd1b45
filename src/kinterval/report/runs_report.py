"""``kinterval report --runs RUN ...``: endpoint ΔNLL of loose training runs (folders of ``kinterval train``,
each evaluated with ``kinterval eval``) against the softmax run among them, with block-bootstrap CIs: the
demo's report for runs a suite did not make. A suite folder gets the full report (seed pairing, claims,
geometry, ...); this one compares what the runs' evaluations on one split hold."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kinterval.eval.checkpoints import state_file_sha256
from kinterval.eval.evaluate import eval_dir, load_result, parse_eval_tag, read_summary, result_paths
from kinterval.report.build import demo_report
from kinterval.report.probes import PROBES, compare_pair
from kinterval.report.results import NOT_PROTOCOL, REFERENCES, train_data_hash
from kinterval.suite.manifest import stopped_step
from kinterval.train.checkpoint import check_outside_runs, list_checkpoints
from kinterval.train.config import flatten
from kinterval.train.load import find_checkpoint

# the request fields that may differ: everything else (split, shards, T, block cap, numerics) must agree for a
# per-block difference, the same blocks under the same numerics
MAY_DIFFER = ("operator", "doc_clusters")


@dataclass
class Evaluated:
    run: Path
    operator: str
    seed: int | None
    request: dict
    nll: np.ndarray  # per block, the latest checkpoint
    trajectory: list[tuple[int, float]]  # (training tokens, mean NLL) of every evaluated checkpoint
    tokens: int  # training tokens of the latest checkpoint
    tokens_per_step: int  # its global batch in tokens (micro-batch x accum x processes x T); 0 when unknown
    protocol: dict  # its training config but the seed, operator and execution fields (flattened)
    train_data: str  # a short hash of its training data (:func:`train_data_hash`); "" when not recorded
    stopped: int | None = None  # the step of the non-finite loss that stopped the run; None if not stopped


def _stopped_at(run: Path) -> int | None:
    """The step of the non-finite loss that stopped the run (its ``status.json``), else None (also without a
    status.json: a run still training); an unreadable one is a ``ValueError`` naming it (it may say that the
    run stopped, and which checkpoints hold finite weights)."""
    path = run / "status.json"
    try:
        return stopped_step(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from None


def _eval_command(run, tag: str, checkpoint: str | None = "latest") -> str:
    """The `kinterval eval` that writes the evaluation folder ``RUN/eval/TAG`` (``--split`` takes a tag,
    ``SPLIT[__DATA][__op-OPERATOR]``): the split as ``--split``; the other parts name the ``--data`` folder
    and the ``--operator`` the tag was made with."""
    split, data, ops = parse_eval_tag(tag)
    ck = "" if checkpoint is None else f" --checkpoint {checkpoint}"
    cmd = f"`kinterval eval --run {run}{ck} --split {split}"
    cmd += "".join(f" --data DIR/{d}" for d in data) + "".join(f" --operator {o}" for o in ops) + "`"
    if data:
        cmd += f" (DIR/{data[0]}: the data folder named {data[0]} that the tag {tag} was evaluated on)"
    return cmd


def _evaluated(run: Path, split: str) -> Evaluated:
    """The run's evaluation of its latest checkpoint on ``split`` (refused when missing or stale) and the
    mean NLL of every checkpoint evaluated there. A run stopped by a non-finite loss: its latest checkpoint
    evaluated there (the last one may hold the diverging weights, whose NLL is not finite)."""
    folder = eval_dir(run, split)
    stopped = _stopped_at(run)
    ckpt = find_checkpoint(run, "latest")
    if stopped is not None:
        done = [c for c in list_checkpoints(run) if _current(result_paths(folder, c)[1], c)]
        if not done:
            raise ValueError(
                f"{run}: stopped by a non-finite loss at step {stopped}, and none of its checkpoints is "
                f"evaluated on {split}: run {_eval_command(run, split, None)} (it evaluates every "
                "checkpoint up to the first whose NLL is not finite)"
            )
        ckpt = done[-1]
    _, path = result_paths(folder, ckpt)
    again = _eval_command(run, split)
    if not path.is_file():
        raise ValueError(
            f"{run}: its latest checkpoint ({ckpt.name}) has no evaluation on {split}; run {again}"
        )
    summary, arrays = load_result(path)
    if summary.get("checkpoint_state_sha256") != state_file_sha256(ckpt):
        raise ValueError(f"{path}: an evaluation of other checkpoint bytes than {ckpt}; run {again} again")
    config = summary.get("train_config") or {}
    seed = config.get("seed")
    trajectory = []
    for f in sorted(folder.glob("step_*.json")):
        s = read_summary(f)
        if s.get("request", {}).get("max_blocks") == summary["request"].get("max_blocks"):
            trajectory.append((int(s["tokens"]), float(s["mean_nll"])))
    protocol = {k: v for k, v in flatten(config).items() if k not in NOT_PROTOCOL}
    return Evaluated(
        run,
        summary["operator_used"],
        seed,
        summary["request"],
        arrays["nll"],
        sorted(trajectory),
        int(summary.get("tokens", 0)),
        int(summary.get("tokens", 0)) // step if (step := int(summary.get("step", 0))) > 0 else 0,
        protocol,
        train_data_hash(summary),
        stopped,
    )


def _current(path: Path, ckpt: Path) -> bool:
    """Whether ``path`` is an evaluation of the checkpoint ``ckpt`` as it is now."""
    try:
        return path.is_file() and read_summary(path).get("checkpoint_state_sha256") == state_file_sha256(ckpt)
    except (OSError, ValueError):
        return False


def _stopped_note(e: Evaluated) -> str:
    return (
        f"{e.operator} ({e.run}) was stopped by a non-finite loss at step {e.stopped}: its row is its last "
        f"evaluated checkpoint ({e.tokens:,} training tokens)"
    )


def _notes(e: Evaluated, control: Evaluated) -> list[str]:
    """What besides the operator differs between a run and the control: each is in its Δ too."""
    notes = [_stopped_note(e)] if e.stopped is not None else []
    if e.seed != control.seed:
        notes.append(
            f"{e.operator} ran seed {e.seed}, the control seed {control.seed}: its Δ holds seed variation too"
        )
    if e.tokens != control.tokens:
        notes.append(
            f"{e.operator}'s latest checkpoint trained {e.tokens:,} tokens, the control's "
            f"{control.tokens:,}: its Δ holds the training difference too"
        )
    if e.tokens_per_step and control.tokens_per_step and e.tokens_per_step != control.tokens_per_step:
        # micro_batch, accum and the process count are execution fields, left out of the protocol; their
        # product, the batch an optimizer step takes, is not
        notes.append(
            f"{e.operator} trained with another batch ({e.tokens_per_step:,} tokens per optimizer step, the "
            f"control's {control.tokens_per_step:,}): its Δ holds that difference too"
        )
    fields = sorted(
        k for k in set(e.protocol) | set(control.protocol) if e.protocol.get(k) != control.protocol.get(k)
    )
    if fields:
        said = ", ".join(  # every field: one left out would be a difference the reader cannot see
            f"{k}={e.protocol.get(k)!r} (control {control.protocol.get(k)!r})" for k in fields
        )
        notes.append(f"{e.operator} trained under another protocol ({said}): its Δ holds that difference too")
    if e.train_data and control.train_data and e.train_data != control.train_data:
        notes.append(
            f"{e.operator} trained on other data (train data#{e.train_data}, the control's "
            f"#{control.train_data}): its Δ holds the data's effect too"
        )
    return notes


def _probes(ev: list[Evaluated], control: Evaluated) -> dict[str, dict]:
    """Each run but the control -> its probes (``kinterval probes --run RUN``) vs the control's
    (:func:`kinterval.report.probes.compare_pair`), "not run" with why for a run or control without them;
    empty when no run has probes."""
    if not any((e.run / PROBES / "summary.json").is_file() for e in ev):
        return {}
    return {
        e.operator: compare_pair(
            e.operator,
            {"operator": e.operator, "run": str(e.run)},
            e.run / PROBES,
            control.run.name,
            control.run / PROBES,
            str(control.run),
        )
        for e in ev
        if e is not control
    }


def runs_report(runs: list[str | Path], out_dir: str | Path, split: str = "val") -> dict:
    """Endpoint ΔNLL of each run vs the one softmax (or sdpa) run among ``runs``, on ``split`` at each run's
    latest checkpoint: :func:`kinterval.report.demo_report`'s files in ``out_dir``, and its rows plus a
    ``notes`` list (e.g. runs of other seeds than the control: their Δ holds seed variation too); with
    ``probes`` (the probe table, :func:`_probes`) when a run has ``kinterval probes`` output. ``ValueError``
    naming both folders for probes that cannot be paired with the control's."""
    check_outside_runs(Path(out_dir), "the report's files would mix with the run's")
    given: dict[Path, str] = {}
    for r in runs:  # one run twice would be its own control, or two conditions of one
        if (key := Path(r).resolve()) in given:
            raise ValueError(f"--runs: run {key} is given twice (as {given[key]} and {r})")
        given[key] = str(r)
    ev = [_evaluated(Path(r), split) for r in runs]
    controls = [e for e in ev if e.operator in REFERENCES]
    if len(controls) != 1:
        found = ", ".join(str(e.run) for e in controls) or "none"
        raise ValueError(f"--runs needs exactly one softmax (or sdpa) run as the control; found {found}")
    control = controls[0]
    seen: dict[str, Path] = {}
    for e in ev:
        if e.operator in seen:
            raise ValueError(
                f"{seen[e.operator]} and {e.run} both ran {e.operator}: give one run per operator (a suite "
                "pairs several seeds, see `kinterval suite`)"
            )
        seen[e.operator] = e.run
        keys = sorted((set(e.request) | set(control.request)) - set(MAY_DIFFER))
        diff = [k for k in keys if e.request.get(k) != control.request.get(k)]
        if diff:
            raise ValueError(
                f"{e.run} and the control {control.run} were evaluated on other blocks or numerics ("
                + ", ".join(f"{k}: {e.request.get(k)!r} vs {control.request.get(k)!r}" for k in diff)
                + "): evaluate both alike"
            )
    notes = [_stopped_note(control)] if control.stopped is not None else []  # once, not once per run
    notes += [note for e in ev if e is not control for note in _notes(e, control)]
    name = {e.operator: ("softmax" if e is control else e.operator) for e in ev}
    per_block = {name[e.operator]: e.nll for e in [control, *(x for x in ev if x is not control)]}
    trajectories = {name[e.operator]: e.trajectory for e in ev if len(e.trajectory) > 1}
    title = f"kinterval runs ({split}, latest checkpoints; control {control.operator}, {control.run.name})"
    seeds = {name[e.operator]: e.seed or 0 for e in ev}
    probes = _probes(ev, control)  # before any file is written: unpairable probes leave no report
    rep = demo_report(
        per_block,
        out_dir,
        trajectories=trajectories or None,
        title=title,
        notes=notes,
        seeds=seeds,
        probes=probes,
    )
    return dict(rep, notes=notes)
