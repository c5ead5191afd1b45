"""Where the runs trained and were evaluated (tab:hardware), and operator family by training stack
(tab:dstack).

A run's training stack is what its ``environment.jsonl`` records of each training session: the device model,
the number of processes, torch, its CUDA and python (:data:`STACK_FIELDS`). Stacks are numbered S1, S2, ... in
the order they first appear (folders in report order, runs in manifest order, sessions in order); a run whose
sessions ran on several stacks has them all (``S1+S2``). A run without the file (trained before it was
recorded) is "not recorded": never guessed from its evaluations, which may have run elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinterval.report.analysis.core import operator_order
from kinterval.report.results import RunRecord, SuiteResults, operator_family

STACK_FIELDS = ("device_name", "processes", "torch", "cuda", "python")
NOT_RECORDED = "not recorded"


@dataclass
class HardwareRow:
    """One suite folder's group of runs."""

    suite: str
    group: str
    runs: list[str]  # run ids, manifest order
    stacks: dict[str, int]  # the runs' stack labels ("S1", "S1+S2", "not recorded") -> runs, first seen first
    eval_devices: list[str]  # the device models the runs' evaluations record ("not recorded": some do not)
    train_hours: float | None  # sum of training time x processes / 3600 (process_seconds) over the timed runs
    timed_runs: int  # the runs that record train_s


@dataclass
class Hardware:
    stacks: dict[str, dict] = field(default_factory=dict)  # "S1" -> {device_name, processes, torch, ...}
    rows: list[HardwareRow] = field(default_factory=list)
    run_stacks: dict[str, str] = field(default_factory=dict)  # "suite/run_id" -> its stack label
    # operator family -> stack label -> runs (tab:dstack); empty when no run records its environment
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def recorded(self) -> bool:
        return any(label != NOT_RECORDED for label in self.run_stacks.values())

    def columns(self) -> list[str]:
        """The stack labels of the runs, first seen first, "not recorded" last."""
        labels = list(dict.fromkeys(self.run_stacks.values()))
        return [x for x in labels if x != NOT_RECORDED] + [x for x in labels if x == NOT_RECORDED]


def stack_of(session: dict) -> tuple:
    """The stack of one session line: its :data:`STACK_FIELDS` (a field the line lacks: "not recorded")."""
    return tuple(session.get(f, NOT_RECORDED) for f in STACK_FIELDS)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def process_seconds(rec: RunRecord) -> float:
    """The run's training time × processes (``rec.train_s`` must be recorded): each session's share of the
    time (the next session's ``train_s`` at its start minus its own; the last one's: up to ``rec.train_s``)
    times its own process count. Where the sessions do not record that (lines written before ``train_s`` was,
    or times that do not add up), the whole time × the first session's process count (else the world size)."""
    counts = [_count(s.get("processes")) for s in rec.sessions]
    starts = [s.get("train_s") for s in rec.sessions]
    bounds = [*starts, rec.train_s]
    if rec.sessions and all(counts) and all(_number(t) for t in starts):
        shares = [b - a for a, b in zip(bounds, bounds[1:])]
        if starts[0] == 0 and min(shares) >= 0:
            return sum(share * n for share, n in zip(shares, counts))
    first = counts[0] if counts else None
    return rec.train_s * (first or rec.world_size or 1)


def hardware(results: list[SuiteResults]) -> Hardware:
    """tab:hardware and tab:dstack of the folders ``results`` (their :attr:`SuiteResults.records`)."""
    hw = Hardware()
    ids: dict[tuple, str] = {}
    groups: dict[tuple[str, str], HardwareRow] = {}
    for res in results:
        devices: dict[str, list[str]] = {}  # run -> the device models of its evaluations
        for p in res.points:
            devices.setdefault(p.run_id, []).append(p.device_name or NOT_RECORDED)
        for rec in res.records.values():
            own = []
            for session in rec.sessions:
                stack = stack_of(session)
                if stack not in ids:
                    ids[stack] = f"S{len(ids) + 1}"
                    hw.stacks[ids[stack]] = dict(zip(STACK_FIELDS, stack))
                own.append(ids[stack])
            label = "+".join(sorted(set(own), key=lambda s: int(s[1:]))) or NOT_RECORDED
            hw.run_stacks[f"{res.suite}/{rec.run_id}"] = label
            row = groups.get((res.suite, rec.group))
            if row is None:
                row = groups[(res.suite, rec.group)] = HardwareRow(res.suite, rec.group, [], {}, [], None, 0)
                hw.rows.append(row)
            row.runs.append(rec.run_id)
            row.stacks[label] = row.stacks.get(label, 0) + 1
            for d in devices.get(rec.run_id, []):
                if d not in row.eval_devices:
                    row.eval_devices.append(d)
            if rec.train_s is not None:
                row.train_hours = (row.train_hours or 0.0) + process_seconds(rec) / 3600
                row.timed_runs += 1
            family = operator_family(rec.operator)
            counts = hw.by_family.setdefault(family, {})
            counts[label] = counts.get(label, 0) + 1
    for row in hw.rows:  # recorded device models first (sorted), then "not recorded"
        row.eval_devices = sorted(d for d in row.eval_devices if d != NOT_RECORDED) + [
            d for d in row.eval_devices if d == NOT_RECORDED
        ]
    hw.by_family = dict(sorted(hw.by_family.items(), key=lambda kv: operator_order(kv[0])))
    return hw
