"""The suite manifest (``OUT/manifest.json`` + a readable ``manifest.tsv``): one row per run with its operator
axes, seed, the exact training config it must have, its expected checkpoint steps, the code identity and the
paths of its checkpoints and results. Everything downstream (runner, gate, report) reads identity from here,
never from directory names.

A data folder inside the suite folder is recorded relative to it (``"data"``), so that the suite folder can be
moved or copied with its data; one outside it is recorded as an absolute path.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

from kinterval import atomic
from kinterval.suite.definition import RunSpec, Suite, load_suite, suite_path
from kinterval.train.checkpoint import code_identity
from kinterval.train.config import TrainConfig
from kinterval.train.schedule import make_plan

MANIFEST = "manifest.json"
MANIFEST_TSV = "manifest.tsv"
AXES = ("calibration", "reconstruction", "surrogate", "K", "tau", "range_grad", "arithmetic")
# The trainer's status of a run it stopped at a non-finite loss or gradient norm: an outcome too.
STOPPED = "nonfinite_loss"


def stored_data_dir(out: str | Path, data_dir: str | Path) -> str:
    """``data_dir`` as the manifest records it: relative (posix) when it lies in ``out``, else absolute."""
    data, root = Path(out, data_dir).resolve(), Path(out).resolve()
    return data.relative_to(root).as_posix() if data.is_relative_to(root) else str(data)


def resolve_data_dir(out: str | Path, data_dir: str | Path) -> Path:
    """The folder a recorded ``data_dir`` names: a relative one lies in the suite folder ``out``."""
    return Path(out, data_dir).resolve()


def same_data_dir(recorded, expected: str) -> bool:
    """A data path recorded by a checkpoint or evaluation names the manifest's ``expected`` one: equal, or,
    for a data folder inside the suite folder (``expected`` relative), the absolute path it had where the
    suite folder was when the file was written (``/old/place/OUT/data`` for ``data``)."""
    if not isinstance(recorded, str) or recorded == expected:
        return recorded == expected
    want = Path(expected)
    if want.is_absolute() or not want.parts:
        return False
    got = Path(recorded)
    return got.is_absolute() and got.parts[-len(want.parts) :] == want.parts


def expected_config(run: RunSpec, data_dir: str | Path) -> TrainConfig:
    """The protocol config with this run's operator, seed, checkpoint count, data folder and overrides."""
    cfg = TrainConfig.from_toml(run.protocol)
    fields = {
        **run.overrides,
        "name": run.run_id,
        "operator.name": run.operator,
        "seed": run.seed,
        "checkpoint.count": run.checkpoints,
        "data.dir": str(data_dir),
    }
    return cfg.override(fields).validate()


def eval_settings(suite: Suite) -> dict:
    e = suite.eval
    return {
        "split": e.get("split", "val"),
        "doc_clusters": bool(e.get("doc_clusters", False)),
        "geometry": bool(e.get("geometry", True)),
        "geometry_blocks": int(e.get("geometry_blocks", 8)),
    }


def run_row(run: RunSpec, data_dir: str | Path, ev: dict) -> dict:
    """The manifest row of one run: identity, axes, expected config and checkpoint schedule, paths."""
    cfg = expected_config(run, data_dir)
    plan = make_plan(cfg, 1)
    return {
        "run_id": run.run_id,
        "group": run.group,
        "operator": run.operator,
        **run.axes(),
        "seed": run.seed,
        "protocol": run.protocol,
        "checkpoints": run.checkpoints,
        "checkpoint_steps": list(plan.checkpoint_steps),
        "steps": plan.steps,
        "tokens": plan.total_tokens,
        "overrides": run.overrides,
        "config": cfg.to_dict(),
        "run_dir": f"runs/{run.run_id}",
        "eval_dir": f"runs/{run.run_id}/eval/{ev['split']}",
    }


def build_manifest(
    suite: Suite, out: str | Path, data_dir: str | Path, *, previous: dict | None = None
) -> dict:
    """Manifest of ``suite`` run into ``out``; the code identity of ``previous`` (an earlier manifest) is kept
    so that a resumed suite is checked against the code it started with. The suite file's text is embedded
    (``suite_toml``), so that the gate can check every row against the file the suite was run from."""
    ev = eval_settings(suite)
    data_dir = stored_data_dir(out, data_dir)
    runs = [run_row(r, data_dir, ev) for r in suite.runs]
    src = Path(suite.source)
    text = src.read_bytes().decode("utf-8") if src.is_file() else None
    code = (previous or {}).get("code") or code_identity()
    return {
        "format": "kinterval-suite-manifest",
        "version": 1,
        "suite": suite.name,
        "title": suite.title,
        "corpus": suite.corpus,
        "suite_file": src.name,
        "suite_sha256": _sha256_text(text) if text is not None else None,
        "suite_toml": text,
        "created": (previous or {}).get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code,
        "data_dir": data_dir,
        "eval": ev,
        "n_runs": len(runs),
        "n_jobs": sum(len(r["checkpoint_steps"]) for r in runs),
        "runs": runs,
    }


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest_suite(manifest: dict) -> Suite:
    """The suite a manifest was built from: its embedded suite file, else the shipped suite file of that name
    when its bytes are unchanged. ``ValueError`` when neither is available or the text does not match."""
    text, sha = manifest.get("suite_toml"), manifest.get("suite_sha256")
    if text is None:
        try:
            path = suite_path(manifest.get("suite", ""))
        except FileNotFoundError:
            raise ValueError(
                f"suite file {manifest.get('suite_file')!r} is neither embedded nor shipped"
            ) from None
        text = path.read_bytes().decode("utf-8")
        if _sha256_text(text) != sha:
            raise ValueError(
                f"the shipped suite file {path.name} changed since the manifest was written (sha256 differs)"
            )
    elif _sha256_text(text) != sha:
        raise ValueError("the suite file embedded in the manifest does not match its recorded sha256")
    name = manifest.get("suite_file")
    plain = isinstance(name, str) and name.endswith(".toml") and Path(name).name == name and "\\" not in name
    if not plain:
        raise ValueError(f"suite_file {name!r} is not a plain .toml file name")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "suite.toml"  # a fixed name: the manifest never chooses where to write
        path.write_bytes(text.encode("utf-8"))
        return load_suite(path)


def write_manifest(out: str | Path, manifest: dict) -> Path:
    """Write ``OUT/manifest.json`` and ``OUT/manifest.tsv``, each atomically (a full disk leaves the old file,
    never a torn one) and only when its bytes change: a resume of a finished suite writes nothing, and so runs
    on a read-only copy."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    cols = [
        "run_id",
        "group",
        "operator",
        "kind",
        *AXES,
        "seed",
        "protocol",
        "checkpoints",
        "run_dir",
        "eval_dir",
    ]
    lines = ["\t".join(cols)] + [
        "\t".join("" if r.get(c) is None else str(r.get(c)) for c in cols) for r in manifest["runs"]
    ]
    lines.append(
        f"# code ops_sha256={manifest['code'].get('ops_sha256')} git={manifest['code'].get('git_commit')}"
    )
    for target, text in (
        (path, json.dumps(manifest, indent=1) + "\n"),
        (out / MANIFEST_TSV, "\n".join(lines) + "\n"),
    ):
        data = text.encode("utf-8")
        try:
            same = target.read_bytes() == data
        except OSError:
            same = False
        if not same:
            atomic.write_bytes(target, data)
    return path


def read_manifest(out: str | Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (create it with `kinterval suite run NAME --out {out}`)")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: corrupt, not JSON ({err})") from None
    if not isinstance(m, dict) or m.get("format") != "kinterval-suite-manifest":
        raise ValueError(f"{path}: not a kinterval suite manifest")
    problem = _schema_problem(m)
    if problem:
        raise ValueError(f"{path}: malformed suite manifest ({problem})")
    for r in m["runs"]:  # a config field added to kinterval after the manifest was written: its default
        try:
            r["config"] = TrainConfig.from_dict(r["config"]).to_dict()
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: malformed suite manifest (run {r['run_id']!r}: {err})") from None
    return m


# What every reader (runner, gate, merge, report) indexes without a check: the entries' types.
_TOP = {"suite": str, "data_dir": str, "eval": dict, "runs": list}
_ROW = {"run_id": str, "group": str, "operator": str, "seed": int, "run_dir": str, "eval_dir": str,
        "checkpoint_steps": list, "config": dict}  # fmt: skip


def _schema_problem(m: dict) -> str | None:
    """What in a manifest's structure is missing or of the wrong type (None when nothing)."""
    for key, kind in _TOP.items():
        if not isinstance(m.get(key), kind):
            return f"no valid {key!r} entry"
    if not isinstance(m["eval"].get("split"), str):
        return "no valid eval 'split'"
    for i, r in enumerate(m["runs"]):
        if not isinstance(r, dict):
            return f"run entry {i} is not a JSON object"
        for key, kind in _ROW.items():
            v = r.get(key)
            if not isinstance(v, kind) or isinstance(v, bool):
                return f"run entry {i} ({r.get('run_id')!r}) has no valid {key!r}"
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in r["checkpoint_steps"]):
            return f"run entry {i} ({r['run_id']!r}) has a checkpoint step that is not an integer"
    return None


def stopped_step(status) -> int | None:
    """The step at which the trainer stopped a run with a non-finite loss or gradient norm, from its
    ``status.json`` object; None for any other status (or a malformed one)."""
    if not isinstance(status, dict) or status.get("status") != STOPPED:
        return None
    step = status.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else None


def kept_before(status) -> int | None:
    """For a run stopped by a non-finite loss, the step before which its checkpoints are kept for good: that
    loss's step, or an earlier checkpoint whose evaluation gave a non-finite NLL (``nonfinite_eval_step``,
    recorded by the suite runner: the checkpoint holds the diverging weights, and so would every later one);
    None for any other status."""
    n = stopped_step(status)
    if n is None:
        return None
    m = status.get("nonfinite_eval_step")
    return min(n, m) if isinstance(m, int) and not isinstance(m, bool) and m >= 1 else n


def final_steps(status, steps: list[int]) -> list[int] | None:
    """The checkpoint steps that a run whose ``status.json`` holds ``status`` keeps for good, or None while
    it is not finished (running, killed, no status): every step of a completed run; for a run stopped by a
    non-finite loss at step N, those before N (or before its first checkpoint with a non-finite NLL:
    :func:`kept_before`). Such a run is finished too: it is evaluated as far as it got and not trained again
    (a resume replays the same batches from its last checkpoint into the same state)."""
    if isinstance(status, dict) and status.get("status") == "completed":
        return list(steps)
    n = kept_before(status)
    return None if n is None else [s for s in steps if s < n]


def run_entry(manifest: dict, run_id: str) -> dict:
    for r in manifest["runs"]:
        if r["run_id"] == run_id:
            return r
    raise ValueError(f"manifest of suite {manifest['suite']}: no run {run_id!r}")
