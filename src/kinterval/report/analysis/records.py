"""Training logs and diagnostics (``metrics.jsonl``, ``kinterval graddiag``): gradient-clipping statistics,
the fixed-upstream gradient decomposition (tab:graddecomp) and the logged validation pairs (fig:detach)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kinterval.eval.graddiag import DECOMP
from kinterval.report.analysis.core import Estimate, Pairing, estimate, final, key_order
from kinterval.report.results import Key, Point

# The trailing window of the clip statistics: the paper's "98% of steps clipped over the last 1.5B tokens" of
# a 2.5B-token run (App. D), the last 60% of the training tokens
CLIP_TAIL = 0.6


@dataclass
class ClipRow:
    """Gradient-clipping and gradient-norm statistics of training (from ``metrics.jsonl``), per condition:
    the fraction of all steps whose gradient norm was clipped (mean over seeds, and per seed), and per seed
    the clipped fraction of the logged steps in the last ``CLIP_TAIL`` of the training tokens, the final and
    the largest logged pre-clip gradient norm and the largest train-loss rise between consecutive logs (§5:
    "45% of steps clipped"; App. D: "98% of steps clipped over the last 1.5B tokens", "single-step gradient
    norms of 10^4", "final pre-clip gradient norms", "largest train-loss increase between consecutive logs";
    App. F: "final logged gradient norms"). None: not logged."""

    key: Key
    seeds: tuple[int, ...]
    mean: float
    per_seed: tuple[float, ...]
    tail: tuple[float | None, ...] = ()
    final_norm: tuple[float | None, ...] = ()
    max_norm: tuple[float | None, ...] = ()
    max_loss_rise: tuple[float | None, ...] = ()


def _run_clip_stats(rows: list[dict]) -> dict:
    """One run's statistics from its training rows (those with ``clipped_frac``), in step order."""
    norms = [float(r["grad_norm"]) for r in rows if r.get("grad_norm") is not None]
    budget = max((r.get("tokens", 0) for r in rows), default=0)
    tail = [r["clipped"] for r in rows if "clipped" in r and r.get("tokens", 0) > (1 - CLIP_TAIL) * budget]
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    rises = [b - a for a, b in zip(losses, losses[1:])]
    return dict(
        frac=float(rows[-1]["clipped_frac"]),
        tail=float(np.mean(tail)) if tail else None,
        final_norm=norms[-1] if norms else None,
        max_norm=max(norms) if norms else None,
        max_loss_rise=max(rises) if rises else None,
    )


def clip_fractions(points: list[Point], logs: dict[tuple, list[dict]]) -> list[ClipRow]:
    """``logs``: (suite folder, run_id) -> metrics rows. The whole-run fraction is the last logged
    ``clipped_frac`` of each run: the fraction of all its steps since step 0 whose gradient norm was
    clipped, kept across resumes (the trainer stores the count in each checkpoint; resumed from a checkpoint
    older than that count: the steps since then). The other statistics read the logged rows, one per
    ``log.every`` steps."""
    acc: dict[Key, dict[int, dict]] = defaultdict(dict)
    for p in final([p for p in points if p.primary]):
        if p.stopped is None and max(p.tokens, p.reached) < p.budget:  # still training: its log is partial
            continue
        rows = [r for r in logs.get((p.folder, p.run_id), []) if "clipped_frac" in r]
        if rows:
            acc[p.key][p.seed] = _run_clip_stats(sorted(rows, key=lambda r: r.get("step", 0)))
    out = []
    for k, v in sorted(acc.items(), key=lambda kv: key_order(kv[0])):
        seeds = tuple(sorted(v))
        # per seed, in ClipRow's field order: per_seed (frac), tail, final_norm, max_norm, max_loss_rise
        per = {name: tuple(v[s][name] for s in seeds) for name in next(iter(v.values()))}
        out.append(ClipRow(k, seeds, float(np.mean(per["frac"])), *per.values()))
    return out


GRAD_TERMS = DECOMP  # the terms `kinterval graddiag` writes


@dataclass
class GradDecompRow:
    """tab:graddecomp: the fixed-upstream decomposition of the score gradient at one checkpoint of one run
    (``kinterval graddiag``), layer means: norm ratios of the self / M / m terms to g_full, the relative error
    of each modified backward, and the zero-sum residual of the implemented score gradient."""

    suite: str
    run_id: str
    operator: str
    seed: int
    step: int
    tokens: int
    n_blocks: int
    terms: dict[str, float]  # GRAD_TERMS -> layer mean (absent when graddiag ran without the decomposition)
    zero_sum_residual: float
    rows_above_1e_3: float


def gradient_decomposition(results) -> list[GradDecompRow]:
    """One row per (run, checkpoint) with a ``kinterval graddiag`` output, by (operator, seed, tokens)."""
    rows = []
    for res in results:
        entry = {r["run_id"]: r for r in res.manifest["runs"]}
        for run_id, diags in res.graddiag.items():
            op, seed = entry[run_id]["operator"], int(entry[run_id]["seed"])
            for d in diags:
                m = d.get("mean")
                where = (int(d["step"]), int(d.get("tokens", 0)), int(d.get("n_blocks", 0)))
                missing = [
                    k
                    for k in ("zero_sum_residual", "rows_above_1e-3")
                    if not isinstance(m, dict) or k not in m
                ]
                if missing:
                    folder = res.dir / entry[run_id]["run_dir"] / "diagnostics" / "graddiag"
                    raise ValueError(
                        f"{folder}: the output of step {where[0]} has no {', '.join(map(repr, missing))} in "
                        "'mean'; rerun `kinterval graddiag` on that checkpoint"
                    )
                terms = {k: float(m[k]) for k in GRAD_TERMS if k in m}
                residual = (float(m["zero_sum_residual"]), float(m["rows_above_1e-3"]))
                rows.append(GradDecompRow(res.suite, run_id, op, seed, *where, terms, *residual))
    return sorted(rows, key=lambda x: (x.operator, x.seed, x.tokens, x.suite))


@dataclass
class ValidationPair:
    """Logged validation rows (``"event": "validation"`` of metrics.jsonl) of a modified-backward run and its
    same-seed full-gradient twin at the training tokens both logged (fig:detach a, b; fig:detachextra)."""

    key: Key  # the modified run's condition
    control: str  # the full-gradient twin's operator
    seed: int
    tokens: list[int]
    val_loss: list[float]
    control_val_loss: list[float]
    row_span: list[float]
    control_row_span: list[float]
    # the same-seed softmax run's logged validation loss at these tokens (NaN where it logged none there);
    # None without such a run
    softmax_val_loss: list[float] | None = None

    @property
    def diff(self) -> list[float]:
        """Validation loss, modified − full, at each logged token count."""
        return [a - b for a, b in zip(self.val_loss, self.control_val_loss)]

    @property
    def minus_softmax(self) -> tuple[list[float], list[float]] | None:
        """Validation loss − the same-seed softmax run's, of the modified run and of its full twin (fig:detach
        a, fig:detachextra a); None without a softmax run."""
        if self.softmax_val_loss is None:
            return None
        sm = self.softmax_val_loss
        return [a - b for a, b in zip(self.val_loss, sm)], [a - b for a, b in zip(self.control_val_loss, sm)]


def _validation_rows(rows: list[dict]) -> dict[int, dict]:
    return {int(r["tokens"]): r for r in rows if r.get("event") == "validation" and "val_loss" in r}


def validation_pairs(
    pairing: Pairing, logs: dict[tuple, list[dict]], points: list[Point] = ()
) -> tuple[list[ValidationPair], dict]:
    """The logged validation trajectories of each pair of ``pairing`` (``detach_pairs``' pairing: modified
    run -> same-seed full twin), with the same-seed softmax run's among ``points`` (same model, budget and
    data) where it logged validation; ``logs``: (suite folder, run_id) -> metrics rows. Returns the pairs and
    the runs skipped (run -> reason): either run without validation rows, or no token count logged by
    both."""
    softmax = {
        (p.model, p.seed, p.budget, p.data): p for p in points if p.operator == "softmax" and p.primary
    }
    out, skipped = [], {}
    for x in sorted(final(pairing.pairs, lambda x: x.point), key=lambda x: (x.point.run_id, x.point.tag)):
        if not x.point.primary:
            continue
        run_id = x.point.run_id
        own = _validation_rows(logs.get((x.point.folder, x.point.run_id), []))
        ctrl = _validation_rows(logs.get((x.control.folder, x.control.run_id), []))
        name = f"{run_id} vs {x.control.run_id}"
        if not own or not ctrl:
            skipped[name] = (
                f"no validation rows in metrics.jsonl of {run_id if not own else x.control.run_id}"
            )
            continue
        ts = sorted(set(own) & set(ctrl))
        if not ts:
            skipped[name] = "no training-token count logged by both runs"
            continue
        sm_point = softmax.get((x.point.model, x.point.seed, x.point.budget, x.point.data))
        sm = _validation_rows(logs.get((sm_point.folder, sm_point.run_id), [])) if sm_point else {}
        nan = float("nan")
        out.append(
            ValidationPair(
                x.point.key,
                x.control.operator,
                x.point.seed,
                ts,
                [float(own[t]["val_loss"]) for t in ts],
                [float(ctrl[t]["val_loss"]) for t in ts],
                [float(own[t].get("row_span", float("nan"))) for t in ts],
                [float(ctrl[t].get("row_span", float("nan"))) for t in ts],
                [float(sm[t]["val_loss"]) if t in sm else nan for t in ts] if sm else None,
            )
        )
    return out, skipped


# The trailing window of the training-fit table: the last 10% of a run's training tokens
FIT_TAIL = 0.1


@dataclass
class FitRow:
    """How well a condition fits its training data at the endpoint, beside its evaluation ΔNLL: the training
    loss logged over the last ``FIT_TAIL`` of the training tokens minus the same-seed softmax's at the same
    steps (the same batches: one seed gives one data order), with the one rule's interval over the per-step
    differences (one seed: block bootstrap over steps; several: t over seeds). Where the evaluation ΔNLL and
    the training Δ differ, the condition generalizes differently (e.g. memorizes less of a train split it saw
    several times); where they agree, it fits differently. Means over seeds."""

    key: Key
    seeds: tuple[int, ...]
    control: str  # the control's operator
    steps: int  # logged steps in the window (the fewest over seeds)
    train: float  # the condition's mean training loss over the window
    d_train: Estimate  # training loss, condition − control, per step
    d_eval: float  # endpoint evaluation ΔNLL, condition − control
    gap: float  # endpoint evaluation NLL − training loss over the window, the condition
    control_gap: float  # the same for the control


def _train_losses(rows: list[dict]) -> dict[int, float]:
    """Training tokens -> logged training loss, for the training rows (no ``event``) with a finite loss."""
    out = {}
    for r in rows:
        loss, tokens = r.get("train_loss"), r.get("tokens")
        number = isinstance(loss, (int, float)) and not isinstance(loss, bool) and np.isfinite(loss)
        if "event" not in r and number and isinstance(tokens, int) and not isinstance(tokens, bool):
            out[tokens] = float(loss)
    return out


def train_fit(pairing: Pairing, logs: dict[tuple, list[dict]]) -> tuple[list[FitRow], dict[str, str]]:
    """A :class:`FitRow` per condition at its endpoint, from the pairs of ``pairing`` (``softmax_pairs``) at
    each run's last checkpoint and ``logs``: (suite folder, run_id) -> metrics rows; and the pairs left out
    ("run vs control" -> why): those whose logs hold fewer than two common steps in the window."""
    per_key: dict[Key, dict[int, tuple]] = defaultdict(dict)
    skipped: dict[str, str] = {}
    for x in final(pairing.pairs, lambda x: x.point):
        p, c = x.point, x.control
        if not p.primary or p.run_id == c.run_id:
            continue
        if p.tokens < p.budget:  # still training, stopped, or not yet evaluated at its last checkpoint
            skipped[f"{p.run_id} vs {c.run_id}"] = (
                f"its last paired evaluation is at {p.tokens} of {p.budget} training tokens, not the endpoint"
            )
            continue
        own = _train_losses(logs.get((p.folder, p.run_id), []))
        ctrl = _train_losses(logs.get((c.folder, c.run_id), []))
        ts = sorted(t for t in set(own) & set(ctrl) if (1 - FIT_TAIL) * p.tokens < t <= p.tokens)
        if len(ts) < 2:
            skipped[f"{p.run_id} vs {c.run_id}"] = (
                f"{len(ts)} training step(s) logged by both runs in the last {FIT_TAIL:.0%} of the tokens; "
                "the table needs two"
            )
            continue
        train, ctrl_train = np.mean([own[t] for t in ts]), np.mean([ctrl[t] for t in ts])
        d = np.array([own[t] - ctrl[t] for t in ts])
        per_key[p.key][p.seed] = (d, train, p.mean - c.mean, p.mean - train, c.mean - ctrl_train, c.operator)
    out = []
    for key, v in sorted(per_key.items(), key=lambda kv: key_order(kv[0])):
        seeds = tuple(sorted(v))
        d, train, d_eval, gap, control_gap, control = zip(*(v[s] for s in seeds))
        est = estimate(dict(zip(seeds, d)), f"training loss of {key.operator} − control")
        mean = [float(np.mean(x)) for x in (train, d_eval, gap, control_gap)]
        out.append(FitRow(key, seeds, control[0], min(x.size for x in d), mean[0], est, *mean[1:]))
    return out, skipped
