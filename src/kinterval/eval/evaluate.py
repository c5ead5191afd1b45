"""``evaluate_run``: per-block NLL of every checkpoint of a run, resumable, one NPZ + one JSON per checkpoint.

Layout: ``RUN/eval/<tag>/step_000123.npz`` (``nll``: per-block NLL; with document clusters also ``doc_ids``,
``doc_nll``, ``doc_tokens``) and ``step_000123.json`` (summary: mean NLL, n_blocks, operator trained/used,
checkpoint identity and code identity of both training and evaluation, the numerics used, the request and
``npz_sha256``, the NPZ's own hash). The JSON is removed before the NPZ is replaced and written last.
``tag`` is the split, plus the data folder name when ``data`` is given and ``op-<operator>`` when the operator
is overridden. A result is reused only for the same checkpoint bytes and the same request (:func:`request`),
which includes the numerics of the device it runs on (:func:`applied_numerics`).
"""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from kinterval import atomic
from kinterval.data.loader import TokenShards, count_id, data_passes, n_blocks
from kinterval.environment import device_name
from kinterval.eval.checkpoints import (
    checkpoint_name,
    evaluation_split,
    pick_device,
    select_checkpoints,
    state_file_sha256,
    trained_operator,
)
from kinterval.eval.nll import document_ids, per_document
from kinterval.model import ModelConfig, NumericsConfig, operator_name, safe_operator
from kinterval.model.numerics import autocast_applied, eval_dot_setting
from kinterval.stats import block_bootstrap_ci, block_length, cluster_bootstrap_ci
from kinterval.train.checkpoint import code_identity, read_state
from kinterval.train.evaluate import check_max_blocks, token_nll
from kinterval.train.load import load_run

# 2: "request" (what a cached result must match), numerics actually used; 3: mean_ci95_block
SUMMARY_VERSION = 3


def eval_tag(split: str = "val", data: str | Path | None = None, operator: str | None = None) -> str:
    parts = [split]
    if data is not None:
        parts.append(Path(data).resolve().name)
    if operator is not None:
        parts.append("op-" + safe_operator(operator))
    return "__".join(parts)


def parse_eval_tag(tag: str) -> tuple[str, list[str], list[str]]:
    """The parts of an :func:`eval_tag`: the split, the data folder names and the operators (in their
    file-name form, :func:`~kinterval.model.safe_operator`)."""
    split, *rest = tag.split("__")
    return split, [p for p in rest if not p.startswith("op-")], [p[3:] for p in rest if p.startswith("op-")]


def eval_dir(run_dir: str | Path, split: str = "val", data=None, operator=None) -> Path:
    return Path(run_dir) / "eval" / eval_tag(split, data, operator)


def result_paths(out_dir: str | Path, ckpt: str | Path) -> tuple[Path, Path]:
    name = checkpoint_name(ckpt)
    return Path(out_dir) / f"{name}.npz", Path(out_dir) / f"{name}.json"


def read_summary(path: str | Path) -> dict:
    """An evaluation summary, checked as far as every reader relies on it: a JSON object with integers
    ``step`` and ``tokens`` >= 0, a finite ``mean_nll``, a ``request`` object and an ``operator_used`` name;
    else a ``ValueError`` naming the file (a torn, edited or foreign file)."""
    path = Path(path)
    try:
        s = json.loads(path.read_bytes())
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path}: not a readable evaluation summary ({err})") from None
    if not isinstance(s, dict):
        raise ValueError(f"{path}: not an evaluation summary (a JSON object expected)")

    def count(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    nll = s.get("mean_nll")
    problem = (
        "no integer step >= 0" if not count(s.get("step"))
        else "no integer tokens >= 0" if not count(s.get("tokens"))
        else "no finite mean_nll" if isinstance(nll, bool) or not isinstance(nll, (int, float))
        or not math.isfinite(nll)
        else "no request object" if not isinstance(s.get("request"), dict)
        else "no operator_used name" if not isinstance(s.get("operator_used"), str)
        else None
    )  # fmt: skip
    if problem:
        raise ValueError(f"{path}: not an evaluation summary ({problem}): evaluate the checkpoint again")
    return s


def applied_numerics(numerics: NumericsConfig, device: torch.device) -> dict:
    """The numerics of an evaluation (or probe) on ``device``: its type, the autocast dtype outside attention
    that :func:`kinterval.model.numerics.autocast` applies there ("none": off, as on CPU unless
    ``autocast_on_cpu``), the attention input dtype, TF32 (``numerics.tf32_eval``, what ``eval_precision``
    sets) and the fused kernels' eval dot precision (None: TF32 on, the kernels use "tf32"; off CUDA, where no
    fused kernel runs, "ieee": torch's fp32 matmuls, whatever ``$KINTERVAL_EVAL_DOT_PRECISION`` asks)."""
    dots = eval_dot_setting(numerics)
    return {
        "device_type": device.type,
        "autocast": autocast_applied(numerics, device),
        "attention_dtype": numerics.attention_dtype,
        "tf32": numerics.tf32_eval,
        "eval_dot_precision": dots if dots is None or device.type == "cuda" else "ieee",
    }


def request(
    state: dict,
    shards: TokenShards,
    operator: str | None,
    max_blocks: int | None,
    doc_clusters: bool,
    device: torch.device,
) -> dict:
    """What an evaluation of a checkpoint (``state``: its state.json) on ``device`` computes, besides the
    checkpoint itself: the operator used, the data by content (split, shard hashes, token count; not its
    folder, so that a moved data folder answers the same request), T, the block cap, document clusters and the
    numerics on that device (:func:`applied_numerics`: a CPU result never answers a CUDA request, nor one of
    another eval dot precision, ``$KINTERVAL_EVAL_DOT_PRECISION``). JSON values only."""
    numerics = ModelConfig.from_dict(state["model_config"]).numerics
    info = shards.meta["splits"][shards.split]
    return {
        "operator": operator_name(operator if operator is not None else trained_operator(state)),
        "split": shards.split,
        "shards_sha256": [s.get("sha256") for s in info["shards"]],
        "n_tokens": shards.n_tokens,
        "T": int(state["model_config"]["block_size"]),
        "max_blocks": max_blocks,
        "doc_clusters": bool(doc_clusters),
        **applied_numerics(numerics, device),
    }


def _answers(stored, req: dict) -> bool:
    """A stored request answers ``req`` when it is the same, or the same with document clusters where ``req``
    has none: the per-block NLL is the same, and a plain evaluation must not replace the per-document one."""
    return stored == req or (
        isinstance(stored, dict) and not req["doc_clusters"] and stored == dict(req, doc_clusters=True)
    )


def _is_current(json_path: Path, npz_path: Path, ckpt: Path, req: dict) -> bool:
    """The stored result is of these checkpoint bytes and answers this request (:func:`_answers`), written
    by this ``SUMMARY_VERSION`` (an older summary lacks fields that the gate and the report read, e.g.
    ``mean_ci95_block``), and the NPZ beside it is the one the summary was written with: its ``npz_sha256``,
    or for a summary written before that was recorded, the NPZ's block count and mean NLL. (An evaluation
    killed between the two renames of an older kinterval left the summary of one request beside the arrays
    of another.)"""
    if not (json_path.is_file() and npz_path.is_file()):
        return False
    try:
        s = read_summary(json_path)
        if not (
            isinstance(s, dict)
            and s.get("summary_version") == SUMMARY_VERSION
            and s.get("checkpoint_state_sha256") == state_file_sha256(ckpt)
            and _answers(s.get("request"), req)
        ):
            return False
    except (ValueError, OSError):  # a torn or unreadable summary (JSONDecodeError is a ValueError)
        return False
    return arrays_problem(npz_path, s) is None


def arrays_problem(npz: Path, summary: dict) -> str | None:
    """Why the NPZ ``npz`` is not the one ``summary`` was written with, or None: its ``npz_sha256`` (when
    recorded: older summaries lack it) and, in any case, the block count and mean NLL the summary states (an
    edited ``mean_nll`` beside intact arrays)."""
    if "npz_sha256" in summary and atomic.sha256_file(npz) != summary["npz_sha256"]:
        return "its npz_sha256 differs"
    try:
        with np.load(npz, allow_pickle=False) as z:
            nll = z["nll"]
    except Exception as err:  # torn, not an archive, no "nll"
        return f"unreadable: {err!r}"
    if nll.size != summary.get("n_blocks") or float(nll.mean()) != summary.get("mean_nll"):  # as written
        return "its block count or mean NLL differs from the summary's"
    return None


def _refuse_replacing_full(json_path: Path, ckpt: Path, max_blocks: int) -> None:
    """A ``ValueError`` when ``json_path`` holds an evaluation of every block of these checkpoint bytes: a
    ``--max-blocks`` look would replace the protocol result that the gate and the report read."""
    try:
        s = read_summary(json_path)
        full = s["checkpoint_state_sha256"] == state_file_sha256(ckpt) and s["request"]["max_blocks"] is None
    except (ValueError, OSError, KeyError, TypeError):  # none, unreadable or another layout: nothing to keep
        return
    if full:
        raise ValueError(
            f"{json_path} holds this checkpoint's evaluation of every block; --max-blocks {max_blocks} would "
            "replace it: give --out DIR to write the capped evaluation elsewhere, or --force to replace it"
        )


class NonFiniteNLL(ValueError):
    """A checkpoint whose per-token NLL is NaN or infinite (``step``: its training step); nothing of its
    evaluation is written."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _check_finite(tok: np.ndarray, ckpt: Path, split: str, step: int) -> None:
    """:class:`NonFiniteNLL` naming the checkpoint and the first block with a NaN or infinite per-token NLL
    (checkpoints evaluated before it keep their results)."""
    bad = ~np.isfinite(tok)
    if bad.any():
        k, t = (int(i) for i in np.argwhere(bad)[0])
        n = int(bad.any(axis=1).sum())
        raise NonFiniteNLL(
            f"checkpoint {ckpt}: non-finite NLL ({tok[k, t]}) in block {k} (target {t}) of split {split!r}; "
            f"{n} of {tok.shape[0]} blocks affected; nothing written for this checkpoint",
            step,
        )


def train_passes(state: dict, T: int) -> float | None:
    """Passes over its train split that a checkpoint's weights were trained on (:func:`data_passes`; above
    1 the model saw its training sequences again), from the data identity the checkpoint records; None for a
    checkpoint that records none."""
    data = (state.get("identity") or {}).get("data.identity")
    n = data.get("n_tokens") if isinstance(data, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n_blocks(n, T) == 0:
        return None
    return round(data_passes(int(state.get("tokens", 0)), n, T), 6)


def trained_data(state: dict) -> dict | None:
    """The training data a checkpoint records by content (vocabulary, split, token count and shard hashes; not
    the ``--source`` it was prepared from), None for a checkpoint that records none. The report tells runs
    trained on other data apart by it (:func:`kinterval.report.results.train_data_hash`)."""
    data = (state.get("identity") or {}).get("data.identity")
    return {k: v for k, v in data.items() if k != "source"} if isinstance(data, dict) else None


def evaluate_checkpoint(
    ckpt: str | Path,
    *,
    operator: str | None = None,
    split: str = "val",
    data: str | Path | None = None,
    out_dir: str | Path | None = None,
    doc_clusters: bool = False,
    device: str = "auto",
    max_blocks: int | None = None,
    force: bool = False,
    progress: bool = False,
) -> dict:
    """Evaluate one checkpoint (skipped if a result of the same checkpoint and :func:`request` exists, unless
    ``force``); its summary, with ``skipped`` and ``path`` (the summary's file) added."""
    check_max_blocks(max_blocks)  # before the cache: a bad cap is never answered with a cached result
    ckpt = Path(ckpt)
    run_dir = ckpt.parent.parent
    out_dir = Path(out_dir) if out_dir is not None else eval_dir(run_dir, split, data, operator)
    npz_path, json_path = result_paths(out_dir, ckpt)
    state = read_state(ckpt)
    shards = evaluation_split(data, split, state, ckpt)
    data_dir = shards.root
    dev = pick_device(device)  # before the cache: the request holds the device's numerics
    if max_blocks is not None and max_blocks >= shards.n_blocks(int(state["model_config"]["block_size"])):
        max_blocks = None  # a cap at or above the split's block count reads every block: the full request
    req = request(state, shards, operator, max_blocks, doc_clusters, dev)
    if not force and _is_current(json_path, npz_path, ckpt, req):
        return dict(read_summary(json_path), skipped=True, path=str(json_path))
    if not force and max_blocks is not None:
        _refuse_replacing_full(json_path, ckpt, max_blocks)
    check_makeable(out_dir)  # before evaluating: a folder that cannot be made there costs no evaluation
    loaded = load_run(ckpt, device=dev, operator=operator)  # weights checked against state.json's sha256
    model, state = loaded.model, loaded.state
    shards.check_vocab(model.config.vocab_size)
    numerics = model.config.numerics
    T = model.config.block_size
    tokens = shards.tokens()
    t0 = time.perf_counter()
    tok = token_nll(model, tokens, T, max_blocks=max_blocks, progress=progress, desc=f"eval {ckpt.name}")
    _check_finite(tok, ckpt, shards.split, int(state["step"]))  # before anything is written
    nll = tok.mean(axis=1)
    arrays = {"nll": nll}
    summary = {
        "summary_version": SUMMARY_VERSION,
        "run_dir": str(run_dir),
        "checkpoint": checkpoint_name(ckpt),
        "step": int(state["step"]),
        "tokens": int(state.get("tokens", 0)),
        "train_passes": train_passes(state, T),
        "checkpoint_state_sha256": state_file_sha256(ckpt),
        "checkpoint_files": state.get("files", {}),
        "operator_trained": trained_operator(state),
        "operator_used": model.operator,
        "operator_override": operator is not None,
        "backend": loaded.backend,  # what ran the operator ("auto" resolved; None: PyTorch's SDPA)
        "split": shards.split,
        "data_dir": str(data_dir),
        "data_source": shards.meta.get("source"),
        "T": T,
        "n_blocks": int(nll.size),
        "all_blocks": max_blocks is None,
        "mean_nll": float(nll.mean()),
        "batch": 1,
        "device": str(dev),
        "device_name": device_name(dev),  # which GPU (or CPU): a second evaluator is another machine
        **applied_numerics(numerics, dev),  # tf32, attention_dtype, eval_dot_precision, autocast, device_type
        "train_code": state.get("code", {}),
        "eval_code": code_identity(),
        "train_config": state["config"],
        "train_data": trained_data(state),
        "seconds": round(time.perf_counter() - t0, 3),
        "request": req,
    }
    if nll.size >= 2:  # block 16, or n // 2 below 32 blocks (a resample holds at least two blocks)
        block = block_length(nll.size)
        ci = block_bootstrap_ci(nll, block=block)
        summary["mean_ci95"] = [ci.lo, ci.hi]
        summary["mean_ci95_block"] = block
    if doc_clusters:
        ids, doc_sum, doc_n = per_document(tok, document_ids(tokens, shards.eot, nll.size, T))
        arrays.update(doc_ids=ids, doc_nll=doc_sum, doc_tokens=doc_n)
        summary["n_documents"] = int(ids.size)
        # the documents of the split's targets (tokens[1:], counted as n_documents counts those of the scored
        # ones): those wholly in the unscored tail (the last partial block, or beyond max_blocks) are the rest
        summary["n_documents_split"] = 1 + count_id(tokens, shards.eot, 1, len(tokens) - 1)
        if ids.size >= 2:
            ci = cluster_bootstrap_ci(doc_sum / doc_n, ids, weights=doc_n)
            summary["doc_cluster_mean_nll"] = ci.mean
            summary["doc_cluster_ci95"] = [ci.lo, ci.hi]
    if not force and max_blocks is not None:  # again: an evaluation of every block written meanwhile (a
        _refuse_replacing_full(json_path, ckpt, max_blocks)  # concurrent command) is not replaced either
    out_dir.mkdir(parents=True, exist_ok=True)
    # The JSON marks a finished evaluation: the old one goes before the NPZ is replaced and the new one is
    # written last, each atomically, and it records the NPZ's sha256 (checked by _is_current). A kill at any
    # point leaves no summary beside arrays it was not written with.
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    summary["npz_sha256"] = atomic.sha256_bytes(buf.getvalue())
    json_path.unlink(missing_ok=True)
    atomic.write_bytes(npz_path, buf.getvalue())
    atomic.write_json(json_path, summary)
    return dict(summary, skipped=False, path=str(json_path))


def check_makeable(folder: Path) -> None:
    """Make ``folder`` and remove again what was made: a folder that cannot be made there (a file in its
    path, a read-only or virtual file system) fails now, and an evaluation that fails later leaves no
    empty folder behind."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # the folder first, then its parents
    folder.mkdir(parents=True, exist_ok=True)
    for p in made:
        p.rmdir()


def evaluate_run(run_dir: str | Path, *, checkpoint: str | int = "all", **kwargs) -> list[dict]:
    """Evaluate the selected checkpoints of a run (see :func:`evaluate_checkpoint` for the options)."""
    return [evaluate_checkpoint(c, **kwargs) for c in select_checkpoints(run_dir, checkpoint)]


def check_arrays(json_path: str | Path, summary: dict) -> None:
    """``ValueError`` unless the NPZ beside ``json_path`` is the one its summary was written with
    (:func:`arrays_problem`). An edited or swapped NPZ would otherwise be read as that checkpoint's
    per-block NLL."""
    npz = Path(json_path).with_suffix(".npz")
    problem = arrays_problem(npz, summary)
    if problem:
        raise ValueError(
            f"{json_path} and {npz} disagree ({problem}): one of them was edited or swapped; evaluate the "
            "checkpoint again (`kinterval eval ... --force`)"
        )


def load_result(json_path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(summary, arrays) of one evaluated checkpoint; ``ValueError`` when the arrays are not the summary's
    (:func:`check_arrays`)."""
    json_path = Path(json_path)
    summary = read_summary(json_path)
    check_arrays(json_path, summary)
    with np.load(json_path.with_suffix(".npz")) as z:
        arrays = {k: z[k] for k in z.files}
    return summary, arrays


def checkpoint_step(path: str | Path) -> int:
    return int(read_state(path)["step"])
