"""The suite manifest (``OUT/manifest.json`` + a readable ``manifest.tsv``): one row per run with its operator
axes, seed, the exact training config it must have, its expected checkpoint steps, the code identity and the
paths of its checkpoints and results. Everything downstream (runner, gate, report) reads identity from here,
never from directory names.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from kinterval.suite.definition import RunSpec, Suite
from kinterval.train.checkpoint import code_identity
from kinterval.train.config import TrainConfig
from kinterval.train.schedule import make_plan

MANIFEST = "manifest.json"
MANIFEST_TSV = "manifest.tsv"
AXES = ("calibration", "reconstruction", "surrogate", "K", "tau", "range_grad", "arithmetic")


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


def build_manifest(
    suite: Suite, out: str | Path, data_dir: str | Path, *, previous: dict | None = None
) -> dict:
    """Manifest of ``suite`` run into ``out``; the code identity of ``previous`` (an earlier manifest) is kept
    so
        that a resumed suite is checked against the code it started with."""
    ev = eval_settings(suite)
    runs = []
    for r in suite.runs:
        cfg = expected_config(r, data_dir)
        plan = make_plan(cfg, 1)
        runs.append(
            {
                "run_id": r.run_id,
                "group": r.group,
                "operator": r.operator,
                **r.axes(),
                "seed": r.seed,
                "protocol": r.protocol,
                "checkpoints": r.checkpoints,
                "checkpoint_steps": list(plan.checkpoint_steps),
                "steps": plan.steps,
                "tokens": plan.total_tokens,
                "overrides": r.overrides,
                "config": cfg.to_dict(),
                "run_dir": f"runs/{r.run_id}",
                "eval_dir": f"runs/{r.run_id}/eval/{ev['split']}",
            }
        )
    src = Path(suite.source)
    code = (previous or {}).get("code") or code_identity()
    return {
        "format": "kinterval-suite-manifest",
        "version": 1,
        "suite": suite.name,
        "title": suite.title,
        "corpus": suite.corpus,
        "suite_file": src.name,
        "suite_sha256": hashlib.sha256(src.read_bytes()).hexdigest() if src.is_file() else None,
        "created": (previous or {}).get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code,
        "data_dir": str(data_dir),
        "eval": ev,
        "n_runs": len(runs),
        "n_jobs": sum(len(r["checkpoint_steps"]) for r in runs),
        "runs": runs,
    }


def write_manifest(out: str | Path, manifest: dict) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)
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
    (out / MANIFEST_TSV).write_text("\n".join(lines) + "\n")
    return path


def read_manifest(out: str | Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (create it with `kinterval suite run NAME --out {out}`)")
    m = json.loads(path.read_text())
    if m.get("format") != "kinterval-suite-manifest":
        raise ValueError(f"{path}: not a kinterval suite manifest")
    return m


def run_entry(manifest: dict, run_id: str) -> dict:
    for r in manifest["runs"]:
        if r["run_id"] == run_id:
            return r
    raise ValueError(f"manifest of suite {manifest['suite']}: no run {run_id!r}")
