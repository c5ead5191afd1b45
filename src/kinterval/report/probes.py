"""The synthetic probes of a suite's runs against their same-seed softmax (Tables tab:probeab, tab:probec).

``kinterval probes --run RUN`` writes ``RUN/probes/native`` (``summary.json``, ``samples.jsonl``); each run
that is not softmax is compared with the softmax run of its seed (the control its ΔNLL is paired with) by
:func:`kinterval.eval.probes.compare_probes`, exactly as ``kinterval probes-compare`` compares them.
"""

from __future__ import annotations

import json
from pathlib import Path

from kinterval.report.results import REFERENCES

PROBES = Path("probes") / "native"  # the default output of `kinterval probes --run RUN`


NO_PROBES = f"no probes ({PROBES.as_posix()}: `kinterval probes --run RUN`)"


def _probe_dir(r, row: dict) -> Path:
    return r.dir / row["run_dir"] / PROBES


def no_samples(folder: Path) -> str | None:
    """Why the probes output ``folder`` is "not run" when its samples.jsonl holds no sample (an older
    ``kinterval probes`` wrote one when no probe fit the model's block size), else None."""
    try:
        with open(folder / "samples.jsonl", "rb") as f:
            if any(line.strip() for line in f):
                return None
        block = json.loads((folder / "summary.json").read_bytes()).get("block_size")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: compare_probes names the file
    fit = f"no probe fit block_size {block}" if isinstance(block, int) else "no probe fit the model"
    return f"{PROBES.as_posix()}/samples.jsonl holds no samples ({fit})"


def compare_pair(cond: str, entry: dict, mine: Path, ref_name: str, ref: Path, ref_run: str) -> dict:
    """Probes ``mine`` (condition ``cond``) vs those of its control ``ref`` (named ``ref_name``, the run
    ``ref_run``): ``compare_probes``'s result with ``run``, ``reference`` and ``reference_run``, or ``entry``
    with ``not_run`` when either has no probes or no samples in them (:func:`no_samples`). ``ValueError``
    naming both folders when they cannot be paired."""
    if not (mine / "summary.json").is_file():
        return dict(entry, not_run=NO_PROBES)
    if not (ref / "summary.json").is_file():
        return dict(entry, not_run=f"its control {ref_name} has no probes ({PROBES.as_posix()})")
    if why := no_samples(mine):
        return dict(entry, not_run=why)
    if why := no_samples(ref):
        return dict(entry, not_run=f"its control {ref_name}'s {why}")
    from kinterval.eval.probes import compare_probes  # torch, only for a report that has probes

    try:
        res = compare_probes(mine, ref)
    except ValueError as err:  # compare_probes names a field, not always the folders
        raise ValueError(f"probes of {cond} ({mine}) vs {ref_name} ({ref}): {err}") from None
    return dict({"run": entry["run"], "reference": ref_name, "reference_run": ref_run}, **res)


def probe_comparisons(results, pairing) -> dict[str, dict]:
    """Condition name -> ``compare_probes(condition, control)`` (``operator, reference_operator, deltas,
    slopes``) with the control's name (``reference``) and the two runs (``run``, ``reference_run``:
    ``suite/run_id``), or ``{operator, run, not_run: why}`` for a condition without probes or without a
    control that has them. Empty when no run of ``results`` has probes.

    ``pairing``: :func:`kinterval.report.analysis.softmax_pairs` of the primary evaluations (a run's control
    is the run its ΔNLL is paired with). ``ValueError`` naming both folders when two outputs cannot be paired
    (other samples, vocabulary or batch size; see ``compare_probes``)."""
    # keyed by suite folder: two folders of one suite (unmerged sittings) hold runs of the same id
    rows = {(str(r.dir), row["run_id"]): (r, row) for r in results for row in r.manifest["runs"]}
    if not any((_probe_dir(r, row) / "summary.json").is_file() for r, row in rows.values()):
        return {}
    evaluated = {str(r.dir): set(r.runs()) for r in results}
    control = {(x.point.folder, x.point.run_id): (x.control.folder, x.control.run_id) for x in pairing.pairs}
    suite_of = {str(r.dir): r.suite for r in results}
    names = {}  # "suite/run_id", or "folder/run_id" where one suite's folders share the run id
    for folder, rid in rows:
        names.setdefault((suite_of[folder], rid), []).append(folder)

    def run_name(folder: str, rid: str) -> str:
        same = names[(suite_of[folder], rid)]
        return f"{suite_of[folder] if len(same) == 1 else folder}/{rid}"

    def name(folder: str, rid: str) -> str:
        return rid if sum(len(v) for k, v in names.items() if k[1] == rid) == 1 else run_name(folder, rid)

    out = {}
    for (folder, rid), (r, row) in rows.items():
        if row["operator"] in REFERENCES:
            continue
        cond, mine = name(folder, rid), _probe_dir(r, row)
        entry = {"operator": row["operator"], "run": run_name(folder, rid)}
        ctrl = control.get((folder, rid))
        if ctrl is None:  # unpaired.md says why, for a run with evaluations
            why = "no same-seed softmax control" if rid in evaluated[folder] else "not evaluated"
            out[cond] = dict(entry, not_run=why if (mine / "summary.json").is_file() else NO_PROBES)
        else:
            ctrl_dir = _probe_dir(*rows[ctrl])
            out[cond] = compare_pair(cond, entry, mine, name(*ctrl), ctrl_dir, run_name(*ctrl))
    return out
