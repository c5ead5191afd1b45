"""``kinterval suite gate DIR``: the integrity gate (paper App. C.3, "130 runs, 646 jobs, 0 errors").

Full mode (a suite folder with its checkpoints and data), for every run of the manifest:

- the manifest agrees with the suite file it was built from (embedded in the manifest), and each run's
  checkpoint steps with the schedule of its config;
- the run finished training: completed, or stopped by a non-finite loss or gradient norm at step N (an
  outcome, listed in the summary; its expected checkpoints are those before N); its ``metrics.jsonl`` reads
  as the report reads it; every expected checkpoint exists,
  each of its files has the sha256 its ``state.json`` records, its config equals the suite's (execution-only
  fields such as device or micro-batch split excepted), its operator and code identity (``ops_sha256``) the
  manifest's;
- every checkpoint has an evaluation of the full split through its own operator (no override), of these
  checkpoint bytes, by the same operator code, whose summary (mean NLL, its CI, block and document counts)
  is what its per-block arrays give, of the manifest's data folder, with as many blocks as the split of
  that folder has. Other evaluations of the run (``eval/<tag>/``) must agree with their arrays and be of the
  current checkpoints;
- the data folder holds the data itself, by content: the shard hashes every checkpoint records of its
  training split and every evaluation of the suite's split are those of the folder (one error for the
  folder, with the count, when some are not: a folder of the same name holding other data);
- when the suite probes geometry, every checkpoint has its probe (``diagnostics/geometry/step_*.json``, what
  the report reads): of these checkpoint bytes, under the run's own operator, over the suite's probe blocks,
  with every layer-mean quantity.

A suite folder may have been moved or copied since it ran: a data folder the manifest records relative to it
is found inside it, and the absolute path a checkpoint or evaluation recorded for that folder where the suite
folder then was (``/old/place/OUT/data`` for ``data``) names the same folder (:func:`same_data_dir`).

With 0 errors it writes ``DIR/gate.json``, the signed-off record: the sha256 of every result file (manifest,
run status, metrics, evaluations, probes), the hashes of every checkpoint and each job's block count. It is
written atomically; when it cannot be (a full disk, a read-only folder) the report keeps its verdict and
holds the ``OSError`` in ``record_error``.

Partial mode (``partial=True``, full mode only; a suite cut short, e.g. by a machine's time limit) gates the
runs whose work is finished (training completed or stopped, every checkpoint it keeps evaluated and, when the
suite probes geometry, probed) exactly as above, and lists the others as not run, not as errors. Its
``gate.json`` says ``"partial": true`` and signs off those runs alone: their result files and checkpoints.
``kinterval suite merge`` gathers such folders into one (:mod:`kinterval.suite.merge`).

Results-only mode (``results_only=True``; a copy without checkpoints or data, e.g. committed to git) runs the
manifest checks, every evaluation's internal checks and that of the run logs, and holds the folder against
``gate.json``: every result file's bytes, and the checkpoint hashes and block count each evaluation
recorded. Against a partial record it checks the runs the record signs off, lists the others as not run, and
reports the files of a run the record does not sign off as one error for that run (unverified results that a
report would read).

Each problem is reported once, at its cause: at most one error per subject (a run entry of the manifest, a
job, a file), so that one edit gives one error; two evaluations swapped between runs are one error.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinterval import atomic
from kinterval.atomic import sha256_file
from kinterval.data.loader import TokenShards
from kinterval.environment import ENVIRONMENT_FILE, read_environment
from kinterval.eval.geometry import METRICS as GEOMETRY
from kinterval.stats import block_bootstrap_ci, block_length, cluster_bootstrap_ci
from kinterval.suite.manifest import (
    MANIFEST,
    MANIFEST_TSV,
    STOPPED,
    eval_settings,
    final_steps,
    kept_before,
    manifest_suite,
    read_manifest,
    resolve_data_dir,
    run_row,
    same_data_dir,
    stopped_step,
)
from kinterval.train.checkpoint import FILES, CheckpointError, config_differences, read_state
from kinterval.train.config import TrainConfig
from kinterval.train.loop import EXECUTION_FIELDS
from kinterval.train.metrics import last_logged_step, missing_steps, read_metrics
from kinterval.train.schedule import make_plan

RECORD = "gate.json"
RECORD_FORMAT = "kinterval-gate-record"
IGNORED = EXECUTION_FIELDS - {"checkpoint.count", "data.dir"}
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile)
CHECKPOINT_MISSING = "checkpoint missing or unreadable"


def _log_every(row: dict) -> int | None:
    """The run's ``log.every`` from its manifest row (None where the row does not record it)."""
    log = row.get("config", {}).get("log") if isinstance(row.get("config"), dict) else None
    every = log.get("every") if isinstance(log, dict) else None
    return every if isinstance(every, int) and not isinstance(every, bool) and every >= 1 else None


@dataclass
class GateReport:
    suite: str
    runs: int = 0
    jobs: int = 0
    errors: list[str] = field(default_factory=list)
    results_only: bool = False
    record: Path | None = None  # the gate.json this gate wrote
    record_error: OSError | None = None  # why it could not be written (a full disk, a read-only folder)
    not_run: list[str] = field(default_factory=list)  # partial: runs of the manifest not gated
    stopped: dict[str, int] = field(default_factory=dict)  # gated runs stopped by a non-finite loss -> step
    hint: str | None = None  # a line to end the output with: the command that checks this folder instead

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        text = f"{self.runs} runs, {self.jobs} jobs, {len(self.errors)} errors"
        if self.stopped:
            text += f"; {len(self.stopped)} stopped by a non-finite loss"
        if self.not_run:
            text += f"; partial: {len(self.not_run)} of {self.runs + len(self.not_run)} runs not run"
        return text


def result_files(out: str | Path, runs: list[str] | None = None) -> list[str]:
    """Paths (relative, posix) of a suite folder's result files: the manifest and every file of the run
    folders (of ``runs`` only, when given) except their checkpoints and the temporary files of writes a kill
    cut short (``atomic.is_temp``)."""
    out = Path(out)
    files = [n for n in (MANIFEST, MANIFEST_TSV) if (out / n).is_file()]
    if (out / "runs").is_dir():
        for p in sorted((out / "runs").rglob("*")):
            rel = p.relative_to(out)
            if atomic.is_temp(p.name) or not p.is_file():
                continue
            if rel.parts[2:3] != ("checkpoints",) and (runs is None or rel.parts[1] in runs):
                files.append(rel.as_posix())
    return files


def run_of(rel: str) -> str | None:
    """The run a result file belongs to (``runs/<run_id>/...``), else None."""
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "runs" else None


def array_problem(arrays: dict) -> str | None:
    """What is wrong with an evaluation's per-block arrays alone (None when nothing)."""
    nll = arrays.get("nll")
    if nll is None:
        return "no 'nll' array"
    if nll.ndim != 1 or nll.size == 0 or not np.issubdtype(nll.dtype, np.floating):
        return f"'nll' is not a non-empty 1-D float array (shape {nll.shape}, {nll.dtype})"
    if not np.all(np.isfinite(nll)):
        return "'nll' holds non-finite values"
    return None


def summary_problem(s: dict, arrays: dict) -> str | None:
    """What in an evaluation summary disagrees with its per-block arrays (None when nothing), arrays that
    :func:`array_problem` passed: the block count, ``mean_nll``, the block-bootstrap CI and, with document
    clusters, the document count, mean and CI."""
    nll = arrays["nll"]
    if nll.size != s.get("n_blocks"):
        return f"{nll.size} blocks in 'nll', the summary says n_blocks {s.get('n_blocks')!r}"
    if not _close(s.get("mean_nll"), float(nll.mean())):
        return f"mean_nll {s.get('mean_nll')!r} != {float(nll.mean())!r}, the mean of 'nll'"
    if nll.size >= 2:  # the CI evaluate_checkpoint computes (deterministic: seeded resampling)
        block = block_length(nll.size)
        if "mean_ci95_block" not in s:
            return (
                f"no mean_ci95_block (summary_version {s.get('summary_version')!r}, written before version 3 "
                "recorded it); re-evaluate the checkpoint: `kinterval eval` and `kinterval suite run` redo a "
                "summary of an older version"
            )
        if s["mean_ci95_block"] != block:
            n = nll.size
            return f"mean_ci95_block {s['mean_ci95_block']!r} != {block}, the block length of {n} blocks"
        ci = block_bootstrap_ci(nll, block=block)
        if not _close_all(s.get("mean_ci95"), (ci.lo, ci.hi)):
            return f"mean_ci95 {s.get('mean_ci95')!r} != [{ci.lo!r}, {ci.hi!r}], the block bootstrap of 'nll'"
    docs = [arrays.get(k) for k in ("doc_ids", "doc_nll", "doc_tokens")]
    if "n_documents" in s or any(a is not None for a in docs):
        if any(a is None for a in docs):
            return "document clusters recorded without all of doc_ids, doc_nll, doc_tokens"
        ids, doc_sum, doc_n = docs
        if not ids.shape == doc_sum.shape == doc_n.shape == (s.get("n_documents"),):
            n_docs = s.get("n_documents")
            return f"document arrays of {ids.size} entries, the summary says n_documents {n_docs!r}"
        if ids.size >= 2:
            ci = cluster_bootstrap_ci(doc_sum / doc_n, ids, weights=doc_n)
            if not (
                _close(s.get("doc_cluster_mean_nll"), ci.mean)
                and _close_all(s.get("doc_cluster_ci95"), (ci.lo, ci.hi))
            ):
                return "doc_cluster_mean_nll / doc_cluster_ci95 differ from the document arrays"
    return None


def _close(a, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _close_all(a, b) -> bool:
    return isinstance(a, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))


def _plain(obj):
    """``obj`` as it reads back from JSON (tuples become lists), for comparison with stored rows."""
    return json.loads(json.dumps(obj))


class _Errors:
    """The first error of each subject. A generic subject ``(kind,)`` gives way to specific ones
    ``(kind, ...)``; an explained subject (the other half of a swap) reports nothing."""

    def __init__(self) -> None:
        self.first: dict[tuple, str] = {}
        self.explained: set[tuple] = set()

    def add(self, subject: tuple, msg: str) -> None:
        if subject not in self.first and subject not in self.explained:
            self.first[subject] = msg

    def has(self, kind: str) -> bool:
        return any(s[0] == kind for s in self.first)

    def lines(self) -> list[str]:
        specific = {s[0] for s in self.first if len(s) > 1}
        return [m for s, m in self.first.items() if len(s) > 1 or s[0] not in specific]


class _Gate:
    def __init__(self, out: Path, m: dict, results_only: bool, partial: bool = False) -> None:
        self.out, self.m, self.results_only, self.partial = out, m, results_only, partial
        self.gated: set[str] | None = None  # partial: the runs gated (None: every run of the manifest)
        self.not_run: list[str] = []
        self.stopped: dict[str, int] = {}  # run -> the step of its non-finite loss
        self.leave_ungated = False  # results-only: pass over the folders of runs a partial record lacks
        self.errs = _Errors()
        self.code = (m.get("code") or {}).get("ops_sha256")
        self.split = m["eval"]["split"]
        self.data_dir = str(m["data_dir"])  # as recorded: relative to out when the data lies in it
        self.expected: dict[str, dict] = {}  # run_id -> the row the suite file gives
        self.record: dict | None = None  # gate.json (results-only mode)
        self.checkpoints: dict[str, dict] = {}  # for the new gate.json (full mode)
        self.blocks: dict = {}
        self.hashes: dict = {}  # split -> the shard hashes of the manifest's data folder (full mode)
        self.data_jobs: dict[str, list[str]] = {"train": [], "eval": []}  # jobs the data check held
        self.other_data: dict[str, list[str]] = {"train": [], "eval": []}  # ... that name other data
        self.runs = self.jobs = 0
        self.subjects = {MANIFEST: ("manifest",), MANIFEST_TSV: ("manifest",)}
        for r in m["runs"]:
            try:
                self.subjects[f"{r['run_dir']}/status.json"] = ("run", r["run_id"])
                for s in r["checkpoint_steps"]:
                    job = ("job", r["run_id"], int(s))
                    for ext in ("json", "npz"):
                        self.subjects[f"{r['eval_dir']}/step_{int(s):06d}.{ext}"] = job
                    self.subjects[f"{r['run_dir']}/diagnostics/geometry/step_{int(s):06d}.json"] = job
            except (KeyError, TypeError, ValueError):
                continue  # reported by check_runs

    def rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.out).as_posix()
        except ValueError:
            return str(path)

    def subject(self, rel: str) -> tuple:
        return self.subjects.get(rel, ("file", rel))

    def config_diffs(self, got: dict, want: dict, by_content: bool = False) -> list[str]:
        """The differences of a recorded config from the expected one, execution fields aside; a ``data.dir``
        that names the expected folder from where the suite folder was (:func:`same_data_dir`) is none, nor
        is any other ``data.dir`` when ``by_content``: the job records its data's shard hashes, which are
        held against the suite's data folder (:meth:`_hold_data`; the same data moved to another folder)."""
        data = (got.get("data") or {}).get("dir"), (want.get("data") or {}).get("dir")
        moved = by_content or same_data_dir(*data)
        return [
            d
            for d in config_differences(got, want)
            if d.split(":")[0] not in IGNORED and not (d.startswith("data.dir:") and moved)
        ]

    # ------------------------------------------------------------------ the manifest
    def check_manifest(self) -> None:
        m, add = self.m, self.errs.add
        try:
            suite = manifest_suite(m)
            ev = eval_settings(suite)
            self.expected = {r.run_id: _plain(run_row(r, m["data_dir"], ev)) for r in suite.runs}
            if m.get("eval") != ev or m.get("suite") != suite.name:
                add(("manifest",), f"{MANIFEST}: suite name or eval settings differ from the suite file")
        except (OSError, ValueError, KeyError) as err:
            add(("manifest",), f"{MANIFEST}: cannot be checked against its suite file ({err})")
        listed = [r.get("run_id") if isinstance(r, dict) else None for r in m["runs"]]
        for rid in self.expected:
            if rid not in listed:
                add(("manifest", rid), f"{MANIFEST}: run {rid} of the suite file is missing")
        if self.record is not None:
            for rid in self.record.get("runs", []):
                if rid not in listed:
                    add(("manifest", rid), f"{MANIFEST}: run {rid} of {RECORD} is missing")
        n_jobs = 0
        for r, rid in zip(m["runs"], listed):
            try:
                n_jobs += len(r["checkpoint_steps"])
                self._check_row(r, rid)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                add(("manifest", rid), f"{MANIFEST}: run entry {rid} is malformed ({err!r})")
        if m.get("n_runs") != len(m["runs"]) or m.get("n_jobs") != n_jobs:
            add(("manifest",), f"{MANIFEST}: n_runs / n_jobs differ from its run entries")

    def _check_row(self, r: dict, rid: str) -> None:
        subj = ("manifest", rid)
        exp = self.expected.get(rid)
        if self.expected and exp is None:
            self.errs.add(subj, f"{MANIFEST}: run {rid} is not in the suite file")
        elif exp is not None:
            diffs = [
                f"{k}: {r.get(k)!r}, suite file {v!r}"
                for k, v in exp.items()
                if k != "config" and r.get(k) != v
            ]
            diffs += [f"config {d}" for d in config_differences(r["config"], exp["config"])]
            if diffs:
                self.errs.add(
                    subj, f"{MANIFEST}: run {rid} differs from the suite file ({'; '.join(diffs[:3])})"
                )
        if self.record is not None and not self.record.get("partial") and rid not in self.record["runs"]:
            self.errs.add(subj, f"{MANIFEST}: run {rid} is not in {RECORD}")
        steps = list(make_plan(TrainConfig.from_dict(r["config"]), 1).checkpoint_steps)
        if r["checkpoint_steps"] != steps:
            self.errs.add(
                subj,
                f"{MANIFEST}: run {rid}: checkpoint steps {r['checkpoint_steps']} != its schedule {steps}",
            )

    # ------------------------------------------------------------------ runs and jobs
    def select_runs(self) -> None:
        """Partial gates: the runs to gate (full mode: the :meth:`finished` ones; results-only mode: those a
        partial record signs off); the others are not run. A malformed entry is gated (and reported)."""
        if self.results_only:
            if not (self.record or {}).get("partial"):
                return
            signed = set(self.record["runs"])
            keep = lambda r: r.get("run_id") in signed  # noqa: E731
        elif self.partial:
            keep = self.finished
        else:
            return
        self.gated = set()
        for r in self.m["runs"]:
            rid = r.get("run_id") if isinstance(r, dict) else None
            try:
                ok = keep(r)
            except (KeyError, TypeError, AttributeError, OSError, ValueError):
                ok = True  # gated, so that check_manifest / check_runs report it
            (self.gated.add if ok else self.not_run.append)(rid)
        if not self.gated:
            self.errs.add(
                ("partial",), "partial gate: no run of the manifest is complete; nothing to sign off"
            )

    def finished(self, r: dict) -> bool:
        """Whether a run's suite work is done: training finished (completed, or stopped by a non-finite loss),
        and every checkpoint it keeps (:func:`final_steps`) evaluated (its JSON is written last) and, when the
        suite probes geometry, probed. A run killed at any point before is not."""
        run_dir = self.out / r["run_dir"]
        final = final_steps(_read_status(run_dir), [int(s) for s in r["checkpoint_steps"]])
        if final is None:
            return False
        names = [f"step_{s:06d}.json" for s in final]
        done = [self.out / r["eval_dir"] / n for n in names]
        if self.m["eval"].get("geometry"):
            done += [run_dir / "diagnostics" / "geometry" / n for n in names]
        return all(p.is_file() for p in done)

    def check_runs(self) -> None:
        for r in self.m["runs"]:
            try:
                rid = r["run_id"]
                # where the suite file puts the run's files: a row that says otherwise is one manifest error
                row = self.expected.get(rid, r)
                run_dir, eval_dir = self.out / row["run_dir"], self.out / row["eval_dir"]
                steps = [int(s) for s in r["checkpoint_steps"]]
                r["config"]["operator"]
            except (KeyError, TypeError, ValueError):
                self.runs += 1
                continue  # reported by check_manifest
            if self.gated is not None and rid not in self.gated:
                continue  # not run (partial)
            self.runs += 1
            if not self.results_only and not run_dir.exists():
                self.jobs += len(steps)  # one error at its cause, not one per checkpoint it would have
                self.errs.add(
                    ("run", rid),
                    f"{rid}: not run (no {self.rel(run_dir)}); `kinterval suite run` runs it, "
                    "`kinterval suite gate --partial` signs off the finished runs",
                )
                continue
            if (n := self._check_status(rid, run_dir)) is not None:
                steps = [s for s in steps if s < n]  # its checkpoints before the non-finite loss
            trusted = self._status_as_recorded(run_dir)
            if not trusted:  # an edited status.json is one error (check_files), not one per job it moves
                steps = [
                    s
                    for s in map(int, r["checkpoint_steps"])
                    if f"{rid}/step_{s:06d}" in self.record["checkpoints"]
                ]
            self._check_metrics(run_dir, trusted, _log_every(r))
            self._check_environment(run_dir)
            exp = self.expected.get(rid, r)
            for step in steps:
                self.jobs += 1
                self._check_job(r, exp, run_dir, eval_dir, step)
            self._check_other_evals(rid, run_dir, eval_dir)

    def _check_status(self, rid: str, run_dir: Path) -> int | None:
        """The run finished training: completed, or stopped by a non-finite loss (then the step before which
        its checkpoints are gated: that loss's, or its first checkpoint with a non-finite NLL:
        :func:`kept_before`)."""
        path = run_dir / "status.json"
        try:
            st = _read_status(run_dir)
        except (OSError, ValueError) as err:
            self.errs.add(("run", rid), f"{self.rel(path)}: unreadable ({err})")
            return None
        if (n := stopped_step(st)) is not None:
            self.stopped[rid] = n
            return kept_before(st)
        if st is None or st.get("status") != "completed":
            status = "missing" if st is None else st.get("status")
            self.errs.add(("run", rid), f"{rid}: run not complete (status {status})")
        return None

    def _status_as_recorded(self, run_dir: Path) -> bool:
        """Whether the run's status.json may say which checkpoints it keeps: always in full mode; in
        results-only mode when it holds the bytes the record signs off (else check_files reports it)."""
        if not self.results_only or self.record is None:
            return True
        rel, path = self.rel(run_dir / "status.json"), run_dir / "status.json"
        want = self.record["files"].get(rel)
        return want is None or (path.is_file() and sha256_file(path) == want)

    def _check_metrics(self, run_dir: Path, status_trusted: bool = True, every: int | None = None) -> None:
        """The run's metrics.jsonl, read as the report reads it (a torn last line is left out there too); a
        completed run's log reaches its last step (the trainer always logs it), or the report refuses it; and
        with the run's ``log.every`` it holds every such step up to its last row (a log deleted or cut short
        before a resume leaves a hole, and the clip statistics would leave those steps out)."""
        path = run_dir / "metrics.jsonl"
        rel = self.rel(path)
        try:
            rows = read_metrics(run_dir)
        except (OSError, ValueError) as err:
            self.errs.add(self.subject(rel), f"{rel}: {str(err).removeprefix(f'{path}: ')}")
            return
        try:
            st = _read_status(run_dir) or {}
        except (OSError, ValueError):  # named once, at its cause, by _check_status
            st = {}
        # the trainer logs a completed run's last step, and a stopped run's non-finite step as an event
        finished = status_trusted and isinstance(st, dict) and st.get("status") in ("completed", STOPPED)
        n = st.get("step") if finished else None
        if isinstance(n, int) and not isinstance(n, bool):
            last = last_logged_step(rows)
            if last is None or last < n:
                ends = "no logged step" if last is None else f"its last row is step {last}"
                self.errs.add(self.subject(rel), f"{rel}: truncated: {ends} of the {n} the run trained")
        last = last_logged_step([r for r in rows if "event" not in r])
        missing = missing_steps(rows, every, last) if every and last else []
        if missing:
            self.errs.add(
                self.subject(rel),
                f"{rel}: {len(missing)} logged step(s) missing below its last row (step {last}), the first "
                f"{missing[0]} (a row every {every} steps)",
            )

    def _check_environment(self, run_dir: Path) -> None:
        """The run's environment.jsonl, read as the report's hardware table reads it."""
        path = run_dir / ENVIRONMENT_FILE
        try:
            read_environment(path)
        except (OSError, ValueError) as err:
            rel, said = self.rel(path), str(err)
            said = rel + said.removeprefix(str(path)) if said.startswith(str(path)) else f"{rel}: {said}"
            self.errs.add(self.subject(rel), said)

    def _check_job(self, r: dict, exp: dict, run_dir: Path, eval_dir: Path, step: int) -> None:
        rid, name = r["run_id"], f"step_{step:06d}"
        subj, job, add = ("job", rid, step), f"{rid} step {step}", self.errs.add
        if self.results_only:
            ck = (self.record or {}).get("checkpoints", {}).get(f"{rid}/{name}")
            if self.record is not None and ck is None:
                add(subj, f"{job}: not in {RECORD}")
        else:
            ck = self._check_checkpoint(r, exp, run_dir / "checkpoints" / name, step, subj, job)
            if ck is None:
                return
        res = self._read_eval(eval_dir / f"{name}.json", subj, job)
        if res is None:
            return
        s, nll = res
        try:
            if s.get("checkpoint") != name or s.get("step") != step:
                add(subj, f"{job}: the evaluation is of {s.get('checkpoint')} (step {s.get('step')})")
            if s.get("operator_override") or s.get("operator_used") != r["operator"]:
                add(
                    subj,
                    f"{job}: evaluated through {s.get('operator_used')}, "
                    f"not the run's operator {r['operator']}",
                )
            if not s.get("all_blocks", False):
                add(subj, f"{job}: evaluation did not cover the full split")
            codes = {
                (s.get("eval_code") or {}).get("ops_sha256"),
                (s.get("train_code") or {}).get("ops_sha256"),
            }
            if codes != {self.code}:
                add(subj, f"{job}: evaluation or training code identity differs from the manifest's")
            # data told by content where the evaluation records its shard hashes (held below; the training
            # data's by the checkpoint's own): a data folder moved between runs is the same data
            hashed = isinstance((s.get("request") or {}).get("shards_sha256"), list)
            diffs = self.config_diffs(s.get("train_config") or {}, exp["config"], by_content=hashed)
            if diffs:
                add(
                    subj,
                    f"{job}: evaluated checkpoint's config differs from the run's ({'; '.join(diffs[:3])})",
                )
            if "data_dir" in s and not (hashed or same_data_dir(s["data_dir"], self.data_dir)):
                add(subj, f"{job}: evaluated on data {s['data_dir']}, not the suite's {self.data_dir}")
            if not self.results_only:
                self._hold_data("eval", self.split, (s.get("request") or {}).get("shards_sha256"), job)
            if ck is not None and s.get("checkpoint_state_sha256") != ck["state_sha256"]:
                add(subj, f"{job}: evaluation is of a different checkpoint (state.json hash differs)")
            if ck is not None and s.get("checkpoint_files") != ck["files"]:
                add(subj, f"{job}: evaluation records other checkpoint file hashes than the checkpoint's")
            if self.results_only:
                want = (ck or {}).get("n_blocks")
            else:
                want = self._n_blocks(int(s.get("T", 0)))
                self.checkpoints[f"{rid}/{name}"] = dict(ck, n_blocks=want)
        except (TypeError, ValueError, AttributeError, KeyError) as err:
            add(subj, f"{self.rel(eval_dir / name)}.json: malformed summary ({err!r}) [{job}]")
            return
        if want is not None and nll.size != want:
            add(subj, f"{job}: {nll.size} evaluated blocks, the split has {want}")
        if self.m["eval"].get("geometry"):
            self._check_geometry(
                r, run_dir / "diagnostics" / "geometry" / f"{name}.json", step, ck, subj, job
            )

    def _check_geometry(self, r: dict, js: Path, step: int, ck: dict | None, subj: tuple, job: str) -> None:
        """The geometry probe the report reads for this checkpoint: present, of this checkpoint under the
        run's own operator, over the suite's probe blocks, with every layer-mean quantity."""
        add = self.errs.add
        if not js.is_file():
            add(subj, f"{job}: geometry not probed (no {js.name} in {self.rel(js.parent)})")
            return
        try:
            g = json.loads(js.read_text())
            if not isinstance(g, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            add(subj, f"{self.rel(js)}: corrupt geometry probe ({err}) [{job}]")
            return
        req, mean = g.get("request"), g.get("mean")
        problems = []
        if g.get("checkpoint") != f"step_{step:06d}" or g.get("step") != step:
            problems.append(f"of {g.get('checkpoint')} (step {g.get('step')})")
        if ck is not None and g.get("checkpoint_state_sha256") != ck["state_sha256"]:
            problems.append("of a different checkpoint (state.json hash differs)")
        if g.get("probe_operator_arg") is not None or g.get("operator_trained") != r["operator"]:
            problems.append(
                f"under {g.get('probe_operator_arg') or g.get('operator_trained')}, not the run's"
            )
        if not isinstance(req, dict) or req.get("max_blocks") != self.m["eval"].get("geometry_blocks"):
            problems.append(f"over {(req or {}).get('max_blocks') if isinstance(req, dict) else req} blocks, "
                            f"not the suite's {self.m['eval'].get('geometry_blocks')}")  # fmt: skip
        if not isinstance(mean, dict) or not all(isinstance(mean.get(k), (int, float)) for k in GEOMETRY):
            problems.append("without its layer means")
        if problems:
            add(subj, f"{self.rel(js)}: geometry probe {'; '.join(problems)} [{job}]")

    def _check_checkpoint(
        self, r: dict, exp: dict, ck: Path, step: int, subj: tuple, job: str
    ) -> dict | None:
        """The checkpoint's hashes ({"state_sha256", "files"}), or None after reporting why it is unusable."""
        add = self.errs.add
        try:
            state = read_state(ck)
            files = state["files"]
            for f in FILES:
                if not (ck / f).is_file():
                    add(subj, f"{self.rel(ck / f)}: missing [{job}]")
                    return None
                if sha256_file(ck / f) != files.get(f):
                    add(
                        subj,
                        f"{self.rel(ck / f)}: corrupt, truncated or replaced "
                        f"(sha256 differs from state.json) [{job}]",
                    )
                    return None
            if state.get("step") != step:
                add(subj, f"{job}: state.json says step {state.get('step')!r}")
            trained = (state.get("identity") or {}).get("data.identity")
            hashed = isinstance(trained, dict) and isinstance(trained.get("shards_sha256"), list)
            diffs = self.config_diffs(state["config"], exp["config"], by_content=hashed)
            if diffs:
                add(subj, f"{job}: config differs from the suite protocol ({'; '.join(diffs)})")
            op = (state.get("operator") or {}).get("full_name", state["config"]["operator"]["name"])
            if op != r["operator"]:
                add(subj, f"{job}: trained operator {op} != manifest {r['operator']}")
            ck_code = (state.get("code") or {}).get("ops_sha256")
            if ck_code != self.code:
                add(subj, f"{job}: code identity {str(ck_code)[:12]} != manifest {str(self.code)[:12]}")
            if isinstance(trained, dict):
                self._hold_data("train", trained.get("split"), trained.get("shards_sha256"), job)
        except CheckpointError:
            add(subj, f"{job}: {CHECKPOINT_MISSING} ({ck})")
            return None
        except (KeyError, TypeError, AttributeError) as err:
            add(subj, f"{self.rel(ck / 'state.json')}: malformed ({err!r}) [{job}]")
            return None
        return {"state_sha256": sha256_file(ck / "state.json"), "files": files}

    def _read_eval(self, js: Path, subj: tuple, job: str) -> tuple[dict, np.ndarray] | None:
        """(summary, nll) of an evaluation whose summary agrees with its arrays; else None, reported."""
        npz = js.with_suffix(".npz")
        if not (js.is_file() and npz.is_file()):
            self.errs.add(
                subj, f"{job}: checkpoint not evaluated (no {js.name} / {npz.name} in {self.rel(js.parent)})"
            )
            return None
        try:
            s = json.loads(js.read_text())
            if not isinstance(s, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            self.errs.add(subj, f"{self.rel(js)}: corrupt evaluation summary ({err}) [{job}]")
            return None
        try:
            z = np.load(npz, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a bare .npy array, not an npz archive")
            with z:
                arrays = {k: z[k] for k in z.files}
        except _UNREADABLE as err:
            self.errs.add(subj, f"{self.rel(npz)}: unreadable ({type(err).__name__}: {err}) [{job}]")
            return None
        if problem := array_problem(arrays):
            self.errs.add(subj, f"{self.rel(npz)}: {problem} [{job}]")
            return None
        try:
            problem = summary_problem(s, arrays)
        except (TypeError, ValueError) as err:
            problem = f"summary fields malformed ({err})"
        if problem:  # the summary or its arrays: either may be the edited one
            self.errs.add(subj, f"{self.rel(js)} disagrees with {npz.name}: {problem} [{job}]")
            return None
        return s, arrays["nll"]

    def _check_other_evals(self, rid: str, run_dir: Path, eval_dir: Path) -> None:
        """Evaluations of the run other than the protocol's (other data, operator overrides)."""
        root = run_dir / "eval"
        tags = sorted(p for p in root.iterdir() if p.is_dir() and p != eval_dir) if root.is_dir() else []
        for js in (js for tag in tags for js in sorted(tag.glob("step_*.json"))):
            subj, label = ("file", self.rel(js)), f"{rid} {js.parent.name}/{js.stem}"
            res = self._read_eval(js, subj, label)
            if res is None:
                continue
            if self.results_only:
                want = (
                    (self.record or {}).get("checkpoints", {}).get(f"{rid}/{js.stem}", {}).get("state_sha256")
                )
            else:
                state = run_dir / "checkpoints" / js.stem / "state.json"
                want = sha256_file(state) if state.is_file() else "(no such checkpoint)"
            if (self.record is not None or not self.results_only) and res[0].get(
                "checkpoint_state_sha256"
            ) != want:
                self.errs.add(
                    subj,
                    f"{self.rel(js)}: not an evaluation of the run's checkpoint {js.stem} "
                    "(state.json hash differs)",
                )

    def _hold_data(self, kind: str, split, recorded, job: str) -> None:
        """Hold the shard hashes a checkpoint (``kind`` "train": its training split) or an evaluation ("eval":
        the suite's split) records against those of the manifest's data folder: a folder of the same name
        holding other data is told by content (:meth:`check_data`). Nothing to hold where either is
        unrecorded or unreadable (the folder's absence is reported by the block count)."""
        if not (isinstance(split, str) and isinstance(recorded, list)):
            return
        if split not in self.hashes:
            data_dir = resolve_data_dir(self.out, self.data_dir)
            try:
                shards = TokenShards(data_dir, split)
                self.hashes[split] = [x["sha256"] for x in shards.meta["splits"][split]["shards"]]
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                self.hashes[split] = None
            else:  # the files themselves, not only what meta.json says of them
                bad = [f.name for f, h in zip(shards.paths, self.hashes[split]) if sha256_file(f) != h]
                if bad:
                    self.errs.add(
                        ("data", "content"),
                        f"data folder {data_dir}: {len(bad)} of {len(shards.paths)} {split} shard files do "
                        f"not hold what its meta.json lists (sha256; first: {bad[0]}): changed or written "
                        "over since it was prepared",
                    )
        if self.hashes[split] is not None:
            self.data_jobs[kind].append(job)
            if recorded != self.hashes[split]:
                self.other_data[kind].append(job)

    def check_data(self) -> None:
        """One error for the data folder when checkpoints were trained on, or evaluations made of, other data
        than it holds (shard hashes): the count and the first such job say whether the folder or a run is
        the odd one out."""
        what = {"train": "checkpoints record training", "eval": f"evaluations record {self.split}"}
        parts = [
            f"{len(bad)} of {len(self.data_jobs[kind])} {what[kind]} shard hashes other than it holds "
            f"(first: {bad[0]})"
            for kind, bad in self.other_data.items()
            if bad
        ]
        if parts:
            self.errs.add(
                ("data", "content"),
                f"data folder {resolve_data_dir(self.out, self.data_dir)}: {'; '.join(parts)}: not the data "
                "this suite was trained and evaluated on (the same name, other shards)",
            )

    def _n_blocks(self, T: int) -> int | None:
        """Blocks of T tokens in the split of the manifest's data folder (resolved against the suite
        folder)."""
        data_dir = resolve_data_dir(self.out, self.data_dir)
        key = (data_dir, self.split, T)
        if key not in self.blocks:
            try:
                self.blocks[key] = TokenShards(data_dir, self.split).n_blocks(T)
            except (FileNotFoundError, ValueError) as err:
                self.blocks[key] = None
                self.errs.add(
                    ("data", str(data_dir)),
                    f"data folder {data_dir}: cannot count the blocks of split {self.split} ({err}); "
                    "the full gate needs the suite's data (--results-only checks a copy without it)",
                )
        return self.blocks[key]

    # ------------------------------------------------------------------ gate.json
    def read_record(self) -> None:
        path = self.out / RECORD
        try:
            rec = json.loads(path.read_text())
            if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
                raise ValueError(f"not a {RECORD_FORMAT}")
            shapes = {"files": dict, "checkpoints": dict, "runs": list}
            if not all(isinstance(rec.get(k), t) for k, t in shapes.items()):
                raise ValueError("files, checkpoints or runs malformed")
            if not isinstance(rec.get("partial", False), bool):
                raise ValueError("partial malformed")
            if rec.get("suite") != self.m.get("suite"):
                raise ValueError(f"it is the record of suite {rec.get('suite')!r}")
            self.record = rec
        except FileNotFoundError:
            self.errs.add(
                ("record",), f"{RECORD}: not found (the full gate writes it, on the folder with checkpoints)"
            )
        except (OSError, ValueError) as err:
            self.errs.add(("record",), f"{RECORD}: unusable ({err})")

    def ungated(self, rel: str) -> str | None:
        """The run of a result file that a partial record does not sign off, else None."""
        rid = run_of(rel)
        if rid is None or not (self.record or {}).get("partial") or rid in self.record["runs"]:
            return None
        return rid

    def check_moved_files(self) -> dict[str, str]:
        """Result files that hold the bytes the record has for another path; a swapped pair is one error."""
        recorded = self.record["files"]
        actual = {rel: sha256_file(self.out / rel) for rel in result_files(self.out) if not self.ungated(rel)}
        owner: dict[str, list[str]] = {}
        for rel, sha in recorded.items():
            owner.setdefault(sha, []).append(rel)
        moved = {}
        for rel, sha in actual.items():
            others = [q for q in owner.get(sha, []) if q != rel] if recorded.get(rel) != sha else []
            if others:
                moved[rel] = others[0]
        for p, q in sorted(moved.items()):
            if moved.get(q) == p:
                if p < q:
                    self.errs.add(
                        self.subject(p), f"{p} and {q} are swapped (each holds the other's recorded bytes)"
                    )
                    self.errs.explained.add(self.subject(q))
            else:
                self.errs.add(self.subject(p), f"{p}: holds the bytes {RECORD} has for {q}")
        return actual

    def check_files(self, actual: dict[str, str]) -> None:
        for rel, sha in self.record["files"].items():
            subj = self.subject(rel)
            if subj == ("manifest",) and self.errs.has("manifest"):
                continue  # explained by a specific manifest error
            if rel not in actual:
                self.errs.add(subj, f"{rel}: missing (listed in {RECORD})")
            elif actual[rel] != sha:
                self.errs.add(subj, f"{rel}: differs from the bytes {RECORD} has (sha256)")
        for rel in actual:
            if rel not in self.record["files"]:
                self.errs.add(self.subject(rel), f"{rel}: not in {RECORD} (re-run the full gate)")
        for rid in sorted({self.ungated(rel) for rel in result_files(self.out)} - {None}):
            if self.leave_ungated:
                continue
            self.errs.add(
                ("ungated", rid),
                f"runs/{rid}: results of run {rid}, which the partial {RECORD} does not sign off "
                "(remove the folder, or gate the suite folder it came from and merge that)",
            )

    def write_record(self) -> Path:
        runs = [r["run_id"] for r in self.m["runs"] if self.gated is None or r["run_id"] in self.gated]
        files = result_files(self.out, runs if self.gated is not None else None)
        hashes = {rel: sha256_file(self.out / rel) for rel in files}
        return write_record(self.out, self.m, runs, self.checkpoints, hashes)


def write_record(out: Path, manifest: dict, runs: list[str], checkpoints: dict, files: dict) -> Path:
    """Write ``OUT/gate.json`` signing off ``runs`` (in the manifest's order), their checkpoints' hashes
    and the sha256 of ``files``; partial when the manifest has other runs."""
    rows = [r for r in manifest["runs"] if r["run_id"] in runs]
    rec = {
        "format": RECORD_FORMAT,
        "version": 1,
        "suite": manifest["suite"],
        "runs": [r["run_id"] for r in rows],
        "partial": len(rows) < len(manifest["runs"]),
        "n_jobs": len(checkpoints),  # a run stopped by a non-finite loss has fewer than its manifest row
        "checkpoints": dict(sorted(checkpoints.items())),
        "files": dict(sorted(files.items())),
    }
    return atomic.write_json(Path(out) / RECORD, rec)


def _read_status(run_dir: Path) -> dict | None:
    """A run's ``status.json`` object, None without one; ``ValueError`` when it is not a JSON object."""
    path = run_dir / "status.json"
    if not path.is_file():
        return None
    st = json.loads(path.read_text())
    if not isinstance(st, dict):
        raise ValueError(f"not a JSON object ({type(st).__name__})")
    return st


def gate(
    out: str | Path,
    *,
    results_only: bool = False,
    write_record: bool = True,
    partial: bool = False,
    leave_ungated: bool = False,
) -> GateReport:
    """Gate the suite folder ``out`` (see the module docstring). Never raises on a bad file: every problem is
    an error line of the report. In full mode with 0 errors (and ``write_record``) it writes ``gate.json``.
    ``partial`` (full mode only) gates the completed runs and lists the others as not run;
    ``leave_ungated`` (results-only mode) passes over the folders of runs that a partial record does not
    sign off, as on the machine where the suite was cut short (:func:`kinterval.suite.merge.merge`)."""
    if partial and results_only:
        raise ValueError("--partial goes with the full gate (a results-only gate reads it from gate.json)")
    out = Path(out)
    try:
        m = read_manifest(out)
        g = _Gate(out, m, results_only, partial)
        g.leave_ungated = leave_ungated
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        # read_manifest's ValueError names the file already; anything else by its type
        why = str(err).removeprefix(f"{out / MANIFEST}: ") if type(err) is ValueError else repr(err)
        return GateReport("?", errors=[f"{MANIFEST}: unreadable ({why})"], results_only=results_only)
    actual = None
    if results_only:
        g.read_record()
        if g.record is not None:
            actual = g.check_moved_files()
    g.check_manifest()
    g.select_runs()
    g.check_runs()
    g.check_data()
    if actual is not None:
        g.check_files(actual)
    rep = GateReport(str(m.get("suite")), g.runs, g.jobs, g.errs.lines(), results_only)
    rep.not_run, rep.stopped = g.not_run, g.stopped
    if not results_only and rep.errors:
        # a results folder (e.g. one in git) has none: the full gate is the wrong check for it
        if next(out.rglob("step_*/state.json"), None) is None:
            why = f"{out} holds no checkpoints"
        elif all(CHECKPOINT_MISSING in e for e in rep.errors):
            why = "every error is a missing checkpoint"
        else:
            why = None
        if why:
            rep.hint = (
                f"hint: {why}; a results folder is checked with `kinterval suite gate {out} --results-only`"
            )
    if not results_only and write_record and rep.ok:
        try:
            rep.record = g.write_record()
        except OSError as err:  # the verdict stands; the caller says the record is missing
            rep.record_error = err
    return rep
