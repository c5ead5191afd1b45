"""``kinterval suite merge SRC DST``: gather the gated runs of a suite folder into one results folder.

A suite cut short (a lent machine's time limit, a Slurm job's) is signed off with ``suite gate --partial``;
its completed runs are then merged into one results folder, sitting after sitting, without checkpoints or
data: the folder that is kept in git and that ``kinterval report`` reads. SRC is a suite folder whose
``gate.json`` a (partial) full gate wrote, or a results folder; DST is a results folder, made when absent.

Nothing is written unless:

- SRC passes the results-only gate. Run folders its record does not sign off (a run killed by the time
  limit) are left behind;
- DST passes it too, when it exists;
- both are of the same suite file, with the same manifest rows (configs, checkpoint steps, data folder) and
  evaluation settings, and were run by the same operator code (``ops_sha256``): the gate's "same code";
- their evaluations are of the same data (the split's shard hashes);
- a run signed off in both holds the same bytes in both (merging a folder twice changes nothing).

The merged folder (DST's files, SRC's new runs, their ``logs/<run>.log``, one ``gate.json`` signing off both)
must pass the results-only gate before it replaces DST.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kinterval import atomic
from kinterval.atomic import sha256_file
from kinterval.suite.gate import RECORD, gate, run_of, write_record
from kinterval.suite.manifest import MANIFEST, MANIFEST_TSV, read_manifest

# Manifest fields that may differ between the sittings of one suite: when it was made, and the code identity
# besides the operator code (the commit, the torch version).
PER_SITTING = ("created", "code")


@dataclass
class MergeResult:
    dst: Path
    added: list[str] = field(default_factory=list)  # runs new in DST
    already: list[str] = field(default_factory=list)  # runs DST held already (same bytes)
    not_run: list[str] = field(default_factory=list)  # runs of the suite DST still lacks


def check_results_folder(folder: Path, what: str) -> tuple[dict, dict]:
    """(manifest, gate.json) of a folder that passes the results-only gate; ``ValueError`` otherwise."""
    if not (folder / MANIFEST).is_file():
        raise FileNotFoundError(f"{what} {folder}: no {MANIFEST} there, not a suite or results folder")
    if not (folder / RECORD).is_file():
        hint = (
            f"sign off its completed runs first: `kinterval suite gate {folder} --partial`"
            if (folder / "runs").is_dir() and any((folder / "runs").glob("*/checkpoints"))
            else "a results folder is made by `kinterval suite merge` (or copied from a gated suite folder)"
        )
        raise ValueError(f"{what} {folder}: no {RECORD}; {hint}")
    rep = gate(folder, results_only=True, leave_ungated=True)
    if rep.errors:
        shown = "; ".join(rep.errors[:3]) + (
            f"; and {len(rep.errors) - 3} more" if len(rep.errors) > 3 else ""
        )
        raise ValueError(
            f"{what} {folder} fails the results-only gate ({len(rep.errors)} errors: {shown}); "
            f"check it with `kinterval suite gate {folder} --results-only`"
        )
    return read_manifest(folder), json.loads((folder / RECORD).read_text())


def manifest_differences(a: dict, b: dict) -> list[str]:
    """Fields in which two manifests of one suite disagree, besides what may differ between sittings."""
    keys = sorted((set(a) | set(b)) - set(PER_SITTING))
    diffs = [k for k in keys if a.get(k) != b.get(k)]
    if (a.get("code") or {}).get("ops_sha256") != (b.get("code") or {}).get("ops_sha256"):
        diffs.append("code.ops_sha256 (the operator code)")
    return diffs


def data_hashes(folder: Path, manifest: dict, runs: list[str]) -> set[str]:
    """The data each protocol evaluation of ``runs`` was of: its split and shard hashes, as one string."""
    rows = {r["run_id"]: r for r in manifest["runs"]}
    seen = set()
    for rid in runs:
        for js in sorted((folder / rows[rid]["eval_dir"]).glob("step_*.json")):
            req = json.loads(js.read_text()).get("request") or {}
            seen.add(json.dumps([req.get("split"), req.get("shards_sha256")]))
    return seen


def _run_record(rec: dict, rid: str) -> tuple[dict, dict]:
    """The files and checkpoints a record signs off for one run."""
    files = {rel: sha for rel, sha in rec["files"].items() if run_of(rel) == rid}
    cks = {k: v for k, v in rec["checkpoints"].items() if k.split("/")[0] == rid}
    return files, cks


# Errors of the side a copy writes: named by the destination file (a full disk fails at the write, and
# shutil names the source file then).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _copy_file(src: Path, dst: Path) -> None:
    try:
        shutil.copy2(src, dst)
    except OSError as err:
        if err.errno in _WRITE_ERRNOS and err.filename != str(dst):
            raise OSError(err.errno, err.strerror, str(dst)) from err
        raise


def _copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """Copy the folder ``src`` to ``dst`` (made), leaving out the entries named in ``skip`` at any depth; stop
    at the first failure with an ``OSError`` naming the file (``shutil.copytree`` copies on and raises one
    ``shutil.Error`` listing every failure as text, which the command line could only show as a traceback)."""
    for root, dirs, files in os.walk(src, followlinks=True):  # as copytree: a linked folder is copied
        dirs[:] = sorted(d for d in dirs if d not in skip)
        here = dst / Path(root).relative_to(src)
        here.mkdir(parents=True, exist_ok=here != dst)
        for name in sorted(f for f in files if f not in skip and not atomic.is_temp(f)):
            _copy_file(Path(root) / name, here / name)


def replaced_folder(dst: str | Path) -> Path:
    """Where :func:`merge` keeps DST while the merged folder takes its place (``.DST.replaced`` beside it)."""
    dst = Path(dst).resolve()
    return dst.with_name(f".{dst.name}.replaced")


def merge(src: str | Path, dst: str | Path) -> MergeResult:
    """Merge the runs SRC's ``gate.json`` signs off into the results folder DST (see the module docstring).
    One merge into DST at a time: a second one stops at once, naming the first (both would build their
    folder from DST as it was, and the later rename would drop the earlier one's runs)."""
    src, dst = Path(src), Path(dst).resolve()  # resolved: DST may be "." (its name makes the work folders)
    if src.resolve() == dst:
        raise ValueError(f"{src}: source and destination are the same folder")
    busy = f"{dst} is being merged into by {{who}}: merge again once it is done"
    with atomic.exclusive(dst.with_name(f".{dst.name}.merge.lock"), busy, remove=True):
        return _merge(src, dst)


def _merge(src: Path, dst: Path) -> MergeResult:
    old = replaced_folder(dst)  # DST while the merged folder takes its place
    if old.is_dir():
        if dst.exists():  # the last merge finished but for removing it
            shutil.rmtree(old)
        else:  # the last merge was killed between its two renames: DST as it was comes back
            old.rename(dst)
    m_src, rec_src = check_results_folder(src, "SRC")
    if (dst / MANIFEST).is_file():
        m_dst, rec_dst = check_results_folder(dst, "DST")
        diffs = manifest_differences(m_src, m_dst)
        if diffs:
            raise ValueError(
                f"{src} and {dst} are not sittings of one suite run: their manifests differ in "
                f"{', '.join(diffs)}; a suite's sittings need the same suite file, data folder and operator "
                "code (run the next sitting from the commit DST's manifest names)"
            )
    elif dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists, is not empty and holds no suite manifest: not a results folder")
    else:
        m_dst, rec_dst = m_src, {"runs": [], "files": {}, "checkpoints": {}}

    res = MergeResult(dst)
    for rid in rec_src["runs"]:
        if rid not in rec_dst["runs"]:
            res.added.append(rid)
        elif _run_record(rec_src, rid) == _run_record(rec_dst, rid):
            res.already.append(rid)
        else:
            raise ValueError(
                f"run {rid} is signed off in both {src} and {dst} with different results; "
                "remove it from one of them first"
            )
    data = data_hashes(src, m_src, res.added) | data_hashes(dst, m_dst, rec_dst["runs"])
    if len(data) > 1:
        raise ValueError(f"{src} and {dst} evaluated their runs on different data (split or shard sha256)")

    signed = set(rec_dst["runs"]) | set(res.added)
    res.not_run = [r["run_id"] for r in m_dst["runs"] if r["run_id"] not in signed]
    files = {k: v for k, v in rec_dst["files"].items() if k not in (MANIFEST, MANIFEST_TSV)}
    checkpoints = dict(rec_dst["checkpoints"])
    for rid in res.added:
        f, c = _run_record(rec_src, rid)
        files.update(f)
        checkpoints.update(c)

    tmp = dst.with_name(f".{dst.name}.merging")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if (dst / MANIFEST).is_file():
            _copy_tree(dst, tmp)
        else:
            tmp.mkdir(parents=True)
            for name in (MANIFEST, MANIFEST_TSV):
                if (src / name).is_file():
                    _copy_file(src / name, tmp / name)
        for rid in res.added:
            _copy_tree(src / "runs" / rid, tmp / "runs" / rid, skip=("checkpoints",))
            log = src / "logs" / f"{rid}.log"
            if log.is_file():
                (tmp / "logs").mkdir(exist_ok=True)
                _copy_file(log, tmp / "logs" / log.name)
        # the manifest kept (DST's, or SRC's for a new folder), as its bytes are
        files.update({n: sha256_file(tmp / n) for n in (MANIFEST, MANIFEST_TSV) if (tmp / n).is_file()})
        write_record(tmp, m_dst, signed, checkpoints, files)
        rep = gate(tmp, results_only=True)
        if rep.errors:  # a defect of the merge itself: nothing replaces DST
            raise RuntimeError(f"the merged folder fails the results-only gate: {rep.errors[:3]}")
        if dst.exists():
            dst.rename(old)
        try:
            tmp.rename(dst)
        except BaseException:
            if old.exists() and not dst.exists():
                old.rename(dst)  # DST as it was
            raise
        shutil.rmtree(old, ignore_errors=True)
    except OSError as err:  # a full disk: named as the file of DST it was writing (the work folder goes)
        where = Path(str(err.filename)) if err.filename is not None else None
        if err.errno is None or where is None or not where.is_relative_to(tmp):
            raise
        raise OSError(err.errno, err.strerror, str(dst / where.relative_to(tmp))) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res
