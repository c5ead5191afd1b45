"""``kinterval suite gate DIR``: the integrity gate (paper App. C.3, "130 runs, 646 jobs, 0 errors").

For every run of the manifest: the run is complete; every expected checkpoint exists; each checkpoint's config
equals the manifest's (protocol + operator + seed; execution-only fields such as device or micro-batch split
are
ignored) and its operator is the manifest's; its code identity (``ops_sha256``) equals the manifest's; every
checkpoint has an evaluation on the full split through its own operator (no override), for the current
checkpoint bytes, by the same operator code, with a finite per-block NLL array of the right length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinterval.data.loader import TokenShards
from kinterval.suite.manifest import read_manifest
from kinterval.train.checkpoint import CheckpointError, config_differences, read_state
from kinterval.train.loop import EXECUTION_FIELDS

IGNORED = EXECUTION_FIELDS - {"checkpoint.count", "data.dir"}


@dataclass
class GateReport:
    suite: str
    runs: int = 0
    jobs: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        return f"{self.runs} runs, {self.jobs} jobs, {len(self.errors)} errors"


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256((path / "state.json").read_bytes()).hexdigest()


def _expected_blocks(data_dir: str, split: str, T: int, cache: dict) -> int | None:
    key = (data_dir, split, T)
    if key not in cache:
        try:
            cache[key] = TokenShards(data_dir, split).n_blocks(T)
        except (FileNotFoundError, ValueError):
            cache[key] = None
    return cache[key]


def gate(out: str | Path) -> GateReport:
    out = Path(out)
    m = read_manifest(out)
    rep = GateReport(m["suite"])
    code = m["code"].get("ops_sha256")
    split = m["eval"]["split"]
    blocks_cache: dict = {}
    for r in m["runs"]:
        rep.runs += 1
        rid, run_dir = r["run_id"], out / r["run_dir"]
        status_file = run_dir / "status.json"
        status = json.loads(status_file.read_text()).get("status") if status_file.is_file() else "missing"
        if status != "completed":
            rep.errors.append(f"{rid}: run not complete (status {status})")
        for step in r["checkpoint_steps"]:
            rep.jobs += 1
            ck = run_dir / "checkpoints" / f"step_{step:06d}"
            job = f"{rid} step {step}"
            try:
                state = read_state(ck)
            except CheckpointError:
                rep.errors.append(f"{job}: checkpoint missing or unreadable ({ck})")
                continue
            diffs = [
                d for d in config_differences(state["config"], r["config"]) if d.split(":")[0] not in IGNORED
            ]
            if diffs:
                rep.errors.append(f"{job}: config differs from the suite protocol ({'; '.join(diffs)})")
            op = (state.get("operator") or {}).get("full_name", state["config"]["operator"]["name"])
            if op != r["operator"]:
                rep.errors.append(f"{job}: trained operator {op} != manifest {r['operator']}")
            ck_code = (state.get("code") or {}).get("ops_sha256")
            if ck_code != code:
                rep.errors.append(f"{job}: code identity {str(ck_code)[:12]} != manifest {str(code)[:12]}")
            rep.errors.extend(_check_eval(out / r["eval_dir"], ck, job, r, state, split, blocks_cache))
    return rep


def _check_eval(
    eval_dir: Path, ck: Path, job: str, r: dict, state: dict, split: str, cache: dict
) -> list[str]:
    js, npz = eval_dir / f"{ck.name}.json", eval_dir / f"{ck.name}.npz"
    if not (js.is_file() and npz.is_file()):
        return [f"{job}: checkpoint not evaluated (no {js.name} / {npz.name} in {eval_dir})"]
    s = json.loads(js.read_text())
    errs = []
    if s.get("checkpoint_state_sha256") != _sha(ck):
        errs.append(f"{job}: evaluation is of a different checkpoint (state.json hash differs)")
    if s.get("operator_override") or s.get("operator_used") != r["operator"]:
        errs.append(
            f"{job}: evaluated through {s.get('operator_used')}, not the run's operator {r['operator']}"
        )
    if s.get("eval_code", {}).get("ops_sha256") != (state.get("code") or {}).get("ops_sha256"):
        errs.append(f"{job}: evaluation code identity differs from the training code")
    if not s.get("all_blocks", False):
        errs.append(f"{job}: evaluation did not cover the full split")
    with np.load(npz) as z:
        nll = z["nll"]
    want = _expected_blocks(s.get("data_dir", r["config"]["data"]["dir"]), split, int(s.get("T", 0)), cache)
    if want is not None and nll.size != want:
        errs.append(f"{job}: {nll.size} evaluated blocks, the split has {want}")
    if nll.size != s.get("n_blocks") or not np.all(np.isfinite(nll)):
        errs.append(f"{job}: per-block NLL array is inconsistent with its summary or not finite")
    return errs
