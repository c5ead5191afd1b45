"""Run records: ``metrics.jsonl`` (one JSON object per logged step or event), ``status.json``, TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kinterval import atomic


class MetricsLog:
    """Append-only JSONL log; ``truncate_after(step)`` drops rows a resumed run will redo. With
    ``tensorboard`` the rows also go to TensorBoard events in ``RUN/tensorboard``."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = False):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb = None
        self._writer = None  # SummaryWriter, opened at the first truncate_after or write
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError(
                    "log.tensorboard needs the tensorboard package: pip install 'kinterval[tensorboard]'"
                ) from err
            self._writer = SummaryWriter

    def _open_tb(self, step: int) -> None:
        """TensorBoard's writer; a session that goes on from ``step`` hides every event an earlier session
        wrote (``purge_step`` 0), and ``truncate_after`` writes the kept rows again: else a resumed run's
        curves would hold the steps after ``step`` twice, or lack those an earlier session logged with
        ``log.tensorboard`` off."""
        if self._writer is not None and self.tb is None:
            purge = 0 if step > 0 else None
            self.tb = self._writer(str(self.path.parent / "tensorboard"), purge_step=purge)

    def truncate_after(self, step: int) -> None:
        """Keep the rows up to ``step`` (a torn last line, as a kill mid-write leaves, is dropped)."""
        self._open_tb(step)
        if not self.path.is_file():
            return
        # a cadence row at ``step`` belongs to a session that started from this checkpoint: it is redone too
        keep = [
            row
            for row in _parse(self.path)
            if row.get("step", 0) < step or (row.get("step", 0) == step and row.get("event") != LOG_EVERY)
        ]
        atomic.write_text(self.path, "".join(json.dumps(row) + "\n" for row in keep))
        if self.tb is not None and step > 0:
            for row in keep:
                self._add_scalars(row)

    def write(self, row: dict) -> None:
        with atomic.naming(self.path), open(self.path, "a") as f:  # a torn last line is dropped on reading
            f.write(json.dumps(_jsonable(row)) + "\n")
        self._open_tb(0)
        self._add_scalars(row)

    def _add_scalars(self, row: dict) -> None:
        """A row's numbers as scalars (a row read back from the file holds non-finite ones as strings:
        left out)."""

        def number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        if self.tb is not None and row.get("event") == "validation":
            for key in ("val_loss", "row_span"):
                if number(row.get(key)):
                    self.tb.add_scalar(f"val/{key}", row[key], row["step"])
        elif self.tb is not None and "event" not in row:
            for key, value in row.items():
                if key not in ("step", "tokens") and number(value):
                    self.tb.add_scalar(f"train/{key}", value, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl ([] when there is none); a torn last line is left out."""
    path = Path(run_dir) / "metrics.jsonl"
    return _parse(path) if path.is_file() else []


def last_logged_step(rows: list[dict]) -> int | None:
    """The largest ``step`` of the rows of :func:`read_metrics` (None: no logged step). The trainer always
    logs a run's last step, so a completed run whose log stops short of it was truncated."""
    return max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=None)


def missing_steps(rows: list[dict], every: int, through: int) -> list[int]:
    """The steps up to ``through`` that the trainer logs (every ``every``-th, :func:`kinterval.train.loop
    .train`) and ``rows`` lack: a log deleted or cut short before a resume leaves such a hole, and the
    statistics read from the log (clip fractions, largest gradient norm) would leave those steps out.
    ``every``: the log's cadence. A session resumed with another ``log.every`` logged a :data:`LOG_EVERY`
    row at its first step, with the cadence before (``was_every``) and after it (``every``); where the log
    holds such rows, they give every stretch's cadence, the first session's included."""
    logged = {r["step"] for r in rows if "event" not in r and isinstance(r.get("step"), int)}
    changes = sorted(
        (r["step"], r["every"], r["was_every"])
        for r in rows
        if r.get("event") == LOG_EVERY
        and all(_whole(r.get(k)) for k in ("step", "every", "was_every"))
        and min(r["every"], r["was_every"]) >= 1
    )
    if changes:
        every = changes[0][2]  # the first session's cadence
    bounds = [(0, every), *((t, c) for t, c, _ in changes), (through, None)]
    want = set()
    for (start, cadence), (end, _) in zip(bounds, bounds[1:]):
        want.update(s for s in range(start + 1, min(end, through) + 1) if s % cadence == 0)
    return sorted(want - logged)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse(path: Path) -> list[dict]:
    """Every row of a JSONL file. Only the last line may be unreadable, and only when it is unterminated (a
    write cut short by a kill): it is dropped. Anything unreadable before it is corruption: ValueError."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")  # the last element is "" when the file ends with a newline
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # unterminated last line: torn by a kill, drop it
                continue
            raise ValueError(f"{path}: line {i + 1} is corrupt ({err}); refusing to use this log") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i + 1} is not a JSON object")
        bad = _bad_field(row)
        if bad:
            raise ValueError(f"{path}: line {i + 1}: {bad}; refusing to use this log")
        rows.append(row)
    return rows


# The event of a session resumed with another log.every than the checkpoint's session: its step (the
# checkpoint's), the new cadence ``every`` and the one before, ``was_every``
LOG_EVERY = "log_every"

# The fields the trainer writes, by kind; readers (resume, report, gate) compare and sum them
_INTS = ("step", "tokens", "val_blocks", "peak_mem", "every", "was_every")
_NUMBERS = ("train_loss", "lr", "grad_norm", "clipped_frac", "tokens_per_s", "val_loss", "row_span")
_NONFINITE = ("nan", "inf", "-inf")  # how :func:`_jsonable` writes non-finite floats
_KNOWN = {*_INTS, *_NUMBERS, "clipped", "event", "row_span_layers"}


def _bad_field(row: dict) -> str | None:
    """What is wrong with a row (None: nothing): a field the trainer does not write (a damaged key would
    leave its value unread); integers must be integers, numbers finite numbers (or None, or a non-finite
    float as :func:`_jsonable` writes it, a string), ``clipped`` a boolean."""
    unknown = sorted(set(row) - _KNOWN)
    if unknown:
        return f"unknown field {unknown[0]!r}"
    for key in _INTS:
        v = row.get(key)
        if key in row and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{key!r} is {v!r}, not an integer"
    for key in _NUMBERS:
        v = row.get(key)
        if v is None or v in _NONFINITE:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{key!r} is {v!r}, not a number"
        if not math.isfinite(v):  # a bare NaN/Infinity (json reads them): the trainer writes "nan", "inf"
            return f"{key!r} is a bare {v!r} (the trainer writes non-finite values as text)"
    if "clipped" in row and not isinstance(row["clipped"], bool):
        return f"'clipped' is {row['clipped']!r}, not true or false"
    return None


def write_status(run_dir: str | Path, **status) -> None:
    atomic.write_text(Path(run_dir) / "status.json", json.dumps(_jsonable(status), indent=1) + "\n")


def _jsonable(obj):
    """Non-finite floats become the strings "nan"/"inf"/"-inf" so the files stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
