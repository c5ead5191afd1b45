"""Per-checkpoint diagnostics written next to the evaluations: ``RUN/diagnostics/<kind>/step_XXXXXX.json``.

``kind`` is ``geometry`` (:func:`~kinterval.eval.geometry.geometry_probe`) or ``graddiag``
(:func:`~kinterval.eval.graddiag.gradient_diagnostics`). An existing result is reused only for the same
checkpoint bytes and the same ``request`` (operator, split, data by content, blocks as ``max_blocks``, the
numerics on the device: the fingerprint of :func:`kinterval.eval.evaluate.request`); a result without one, or
without the numerics (written before they were recorded), is recomputed, and so is an unreadable one (torn,
not JSON, not an object). The result records the numerics
used under the field names of an evaluation summary (``device``, ``device_type``, ``autocast``,
``attention_dtype``, ``tf32``, ``eval_dot_precision``); ``graddiag`` also ``deterministic``.
A geometry probe under another operator goes to ``diagnostics/geometry__as-<operator>``. A stored result of
the same checkpoint under other options (blocks, split, data) is not replaced unless ``force`` (or
``replace_other``, the suite runner's, whose folder it is): it may be a suite's probe, which the gate and the
report read.
"""

from __future__ import annotations

import json
from pathlib import Path

from kinterval import atomic
from kinterval.eval.checkpoints import (
    checkpoint_name,
    evaluation_split,
    pick_device,
    select_checkpoints,
    state_file_sha256,
)
from kinterval.eval.evaluate import applied_numerics, request
from kinterval.eval.geometry import geometry_probe
from kinterval.eval.graddiag import gradient_diagnostics
from kinterval.model import safe_operator
from kinterval.train.checkpoint import read_state
from kinterval.train.load import load_run

KINDS = ("geometry", "graddiag")


def diagnostics_dir(run_dir: str | Path, kind: str) -> Path:
    return Path(run_dir) / "diagnostics" / kind


def diagnose_checkpoint(
    ckpt: str | Path,
    kind: str,
    *,
    blocks: int = 8,
    spec: str | None = None,
    data: str | Path | None = None,
    split: str = "val",
    out_dir: str | Path | None = None,
    device: str = "auto",
    force: bool = False,
    replace_other: bool = False,
) -> dict:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:  # before the cache, too
        raise ValueError(f"blocks must be a positive integer, got {blocks!r}")
    ckpt = Path(ckpt)
    if out_dir is None:
        out_dir = diagnostics_dir(ckpt.parent.parent, kind)
        if spec:  # a probe under another operator never replaces the run's own probe
            out_dir = out_dir.with_name(f"{kind}__as-{safe_operator(spec)}")
    out_dir = Path(out_dir)
    path = out_dir / f"{checkpoint_name(ckpt)}.json"
    sha = state_file_sha256(ckpt)
    stored = read_state(ckpt)
    shards = evaluation_split(data, split, stored, ckpt)
    dev = pick_device(device)  # before the cache: the request holds the device's numerics
    req = request(stored, shards, spec, blocks, False, dev)  # max_blocks: the probe's --blocks
    old = None if force else _stored(path)
    if old is not None:
        if old.get("checkpoint_state_sha256") == sha and old.get("request") == req:
            return dict(old, skipped=True, path=str(path))
        if old.get("checkpoint_state_sha256") == sha and not replace_other:
            _refuse_other_request(path, kind, old.get("request"), req)
    # closed_form: the probes form P explicitly and differentiate it
    loaded = load_run(ckpt, device=dev, backend="closed_form")
    model, state = loaded.model, loaded.state
    shards.check_vocab(model.config.vocab_size)
    tokens = shards.tokens()
    if kind == "geometry":
        res = geometry_probe(model, tokens, blocks=blocks, spec=spec)
    else:
        res = gradient_diagnostics(model, tokens, blocks=blocks)
    res.update(
        kind=kind,
        checkpoint=checkpoint_name(ckpt),
        step=int(state["step"]),
        tokens=int(state.get("tokens", 0)),
        checkpoint_state_sha256=sha,
        operator_trained=model.operator,
        probe_operator_arg=spec,
        split=shards.split,
        train_code=state.get("code", {}),
        device=str(dev),
        **applied_numerics(model.config.numerics, dev),
        request=req,
    )
    # again before writing: a result of another request that a concurrent command wrote meanwhile (its check
    # above passed beside ours) is not replaced either
    old = None if force or replace_other else _stored(path)
    if old is not None and old.get("checkpoint_state_sha256") == sha and old.get("request") != req:
        _refuse_other_request(path, kind, old.get("request"), req)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, res)  # a full disk leaves no partial file in the run folder (the gate hashes all)
    return dict(res, skipped=False, path=str(path))


def _stored(path: Path) -> dict | None:
    """The stored result at ``path``; None when there is none or it is unreadable (torn, not JSON, not an
    object): a cache entry that says nothing is recomputed and replaced, as an evaluation's is."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):  # missing; JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return old if isinstance(old, dict) else None


def _refuse_other_request(path: Path, kind: str, old: dict | None, req: dict) -> None:
    """A ValueError when the stored result ``old`` asked for another operator (``--as``), blocks, split or
    data than ``req`` (its numerics may differ: a result of another device is recomputed, as a cache)."""
    if not isinstance(old, dict):
        return
    was = []
    if old.get("operator") != req["operator"]:
        was.append(f"operator {old.get('operator')}")
    if old.get("max_blocks") != req["max_blocks"]:
        n = old.get("max_blocks")
        was.append(f"{n} block" + ("" if n == 1 else "s"))
    if old.get("split") != req["split"]:
        was.append(f"split {old.get('split')!r}")
    elif any(
        old.get(k) != req[k] for k in ("shards_sha256", "n_tokens", "T")
    ):  # another split: its own shards
        was.append("other data")
    if was:
        raise ValueError(
            f"{path} holds this checkpoint's {kind} for {', '.join(was)}, not for the options given (a "
            "suite's probe, perhaps, which its gate and report read): give the same options to reuse it, "
            "--out DIR to write this one elsewhere, or --force to replace it"
        )


def diagnose_run(run_dir: str | Path, kind: str, *, checkpoint: str | int = "all", **kwargs) -> list[dict]:
    return [diagnose_checkpoint(c, kind, **kwargs) for c in select_checkpoints(run_dir, checkpoint)]
