"""Synthetic suite result folders for the report tests: a real manifest (``build_manifest`` of a suite file)
and, for every run and checkpoint, the evaluation files a suite run writes (``eval/<tag>/step_*.json`` +
``.npz``), the geometry probe and ``metrics.jsonl``, with planted effects. No training.

Per-block NLL = base(block) + seed level + ``effect(run, frac)`` + noise, where ``frac`` is the checkpoint's
fraction of the run; the base and the seed level are shared by every run of a seed, so they cancel in every
same-seed contrast and the planted effect comes back.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kinterval import atomic
from kinterval.suite.definition import load_suite
from kinterval.suite.manifest import build_manifest, write_manifest


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


def write_results(
    root: Path,
    suite,
    effect: Callable[[dict, float], float],
    *,
    n_blocks: int = 64,
    noise: float = 0.01,
    data: str = "data",
    geometry: Callable[[dict, float], dict] | None = None,
    heldout: dict[str, tuple[str, int, Callable[[dict], float], bool]] | None = None,
    clip: Callable[[dict], float] | None = None,
    runs: Callable[[dict], bool] | None = None,
    validation: Callable[[dict, float], dict | None] | None = None,
    stopped: Callable[[dict], int | None] | None = None,
    passes: Callable[[dict, float], float | None] | None = None,
    train: Callable[[dict, int], float] | None = None,
    shards: tuple[str, ...] | None = None,
    train_data: dict | None = None,
) -> dict:
    """Write the results of ``suite`` (a name or a .toml path) into ``root``; returns the manifest.

    ``heldout``: tag -> (data folder name, n_blocks, endpoint effect(run), with document clusters); those
    evaluations are written for the final checkpoint only. ``clip(run)``: fraction of clipped steps logged.
    ``runs(run)``: False drops a run's results (the manifest keeps it). ``validation(run, frac)``: the fields
    of the ``"validation"`` row logged at each checkpoint (None: the run logs none). ``stopped(run)``: the
    step of a non-finite loss that stopped the run (its status.json says so; no checkpoint from that step on).
    ``passes(run, frac)``: the ``train_passes`` each primary evaluation records (None: not recorded).
    ``train(run, step)``: the training loss logged at every step (a training row with its tokens).
    ``shards``: the shard hashes the primary evaluations' requests record. ``train_data``: the training data
    every evaluation records (an evaluation summary's ``train_data``; None: not recorded). ``effect`` may
    return an array of ``n_blocks`` (a per-block effect).
    """
    m = build_manifest(load_suite(suite), root, root / data)
    write_manifest(root, m)
    T = 64
    for r in m["runs"]:
        if runs is not None and not runs(r):
            continue
        run_dir = root / r["run_dir"]
        steps = r["checkpoint_steps"]
        tokens_per_step = r["tokens"] // steps[-1]
        stop = stopped(r) if stopped is not None else None
        if stop is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            status = {
                "status": "nonfinite_loss",
                "step": stop,
                "steps": steps[-1],
                "tokens": stop * tokens_per_step,
            }
            (run_dir / "status.json").write_text(json.dumps(status))
        level = _rng("seed", r["seed"]).normal(0, 0.05)
        base = _rng("base", r["seed"]).normal(5.0, 0.3, n_blocks) + level
        for i, step in enumerate(steps):
            if stop is not None and step >= stop:
                break
            frac = (i + 1) / len(steps)
            nll = base + effect(r, frac) + _rng(r["run_id"], step).normal(0, noise, n_blocks)
            _write_eval(
                run_dir / r["eval_dir"].split("/", 2)[2],
                step,
                step * tokens_per_step,
                root / data,
                T,
                nll,
                passes=passes(r, frac) if passes is not None else None,
                shards=shards,
                train_data=train_data,
            )
            if geometry is not None:
                g = run_dir / "diagnostics" / "geometry"
                g.mkdir(parents=True, exist_ok=True)
                (g / f"step_{step:06d}.json").write_text(json.dumps({"mean": geometry(r, frac)}))
        for tag, (name, n, eff, docs) in (heldout or {}).items():
            hb = _rng("heldout", name, r["seed"]).normal(5.0, 0.3, n)
            nll = hb + eff(r) + _rng(r["run_id"], tag).normal(0, noise, n)
            _write_eval(
                run_dir / "eval" / tag,
                steps[-1],
                steps[-1] * tokens_per_step,
                root / name,
                T,
                nll,
                docs,
                train_data=train_data,
            )
        rows = []
        last = stop - 1 if stop is not None else steps[-1]
        if train is not None:
            rows += [
                {"step": s, "tokens": s * tokens_per_step, "train_loss": train(r, s)}
                for s in range(1, last + 1)
            ]
        if clip is not None:
            rows += [{"step": s, "clipped_frac": clip(r), "train_loss": 5.0} for s in steps]
        for i, step in enumerate(steps if validation is not None else []):
            v = validation(r, (i + 1) / len(steps))
            if v is not None:
                rows.append({"event": "validation", "step": step, "tokens": step * tokens_per_step, **v})
        if rows:
            (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    return m


def _write_eval(
    ev: Path,
    step: int,
    tokens: int,
    data_dir: Path,
    T: int,
    nll,
    docs=False,
    passes=None,
    shards=None,
    train_data=None,
) -> None:
    ev.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    arrays = {"nll": nll}
    if docs:  # one document per two blocks; per-document NLL sums over its tokens
        ids = np.arange(nll.size) // 2
        arrays.update(
            doc_ids=np.unique(ids),
            doc_nll=np.bincount(ids, weights=nll * T),
            doc_tokens=np.bincount(ids) * T,
        )
    np.savez(ev / f"{name}.npz", **arrays)
    summary = {
        "step": step,
        "tokens": tokens,
        "operator_override": "__op-" in ev.name,
        "data_dir": str(data_dir),
        "split": ev.name.split("__")[0],
        "T": T,
        "n_blocks": int(nll.size),
        "mean_nll": float(nll.mean()),
    }
    if passes is not None:
        summary["train_passes"] = passes
    if shards is not None:
        summary["request"] = {"shards_sha256": list(shards), "T": T}
    if train_data is not None:
        summary["train_data"] = train_data
    (ev / f"{name}.json").write_text(json.dumps(summary))


def write_graddiag(root: Path, manifest: dict, mean: Callable[[dict, int], dict | None]) -> None:
    """``kinterval graddiag`` outputs (``RUN/diagnostics/graddiag/step_*.json``) with the planted layer means
    ``mean(run, step)`` (None: no output for that checkpoint)."""
    for r in manifest["runs"]:
        for step in r["checkpoint_steps"]:
            m = mean(r, step)
            if m is None:
                continue
            d = root / r["run_dir"] / "diagnostics" / "graddiag"
            d.mkdir(parents=True, exist_ok=True)
            out = {"mean": m, "layers": [m], "step": step, "tokens": step * 1000, "n_blocks": 8}
            (d / f"step_{step:06d}.json").write_text(json.dumps(out))


PROBE_SLOPE = 0.1  # planted probe C slope per doubling of the copied length L
PROBE_FAMILIES = 12


def _probe_rows(seed: int, shift: float) -> list[dict]:
    """Sample rows of probes A, B and C (``kinterval probes``'s samples.jsonl), ``PROBE_FAMILIES`` families: a
    softmax NLL per sample (the same for every run of a seed); a condition's (``shift`` > 0) adds ``shift``
    (and for C, PROBE_SLOPE per doubling of L) and ±0.01 alternating over families and cells, which averages
    out in every pooled row and slope: the planted values are the exact means, with intervals around them."""
    base = np.random.default_rng(seed)
    cells = [("A", d, c) for d in (64, 128) for c in ("induction", "control")]
    cells += [("B", n, c) for n in (16, 32) for c in ("near", "far")]
    cells += [("C", L, "copy") for L in (32, 64, 128)]
    rows = []
    for f in range(PROBE_FAMILIES):
        for j, (probe, param, cond) in enumerate(cells):
            nll = base.uniform(1, 4)
            if shift > 0:
                nll += shift + PROBE_SLOPE * np.log2(param / 32) * (probe == "C") + 0.01 * (-1) ** (f + j)
                nll += 0.01 * (-1) ** f * (param == 128 and probe == "C")  # slopes that differ by family
            rows.append({"probe": probe, "family": f, "condition": cond, "param": param,
                         "nll": float(nll), "acc": float(base.uniform() < 0.5),
                         "n_scored": 1})  # fmt: skip
    return rows


def write_probes(run_dir, operator: str, shift: float, seed: int = 7, batch_size: int = 1) -> None:
    """``run_dir/probes/native`` as ``kinterval probes --run RUN`` writes it (the fields its summary.json
    carries; the token sequences' hash shared by every run, as the same samples give). Every sample NLL of
    the condition is its softmax's + ``shift`` (probe C: + PROBE_SLOPE per doubling of L)."""
    from kinterval.eval.probes import summarize  # torch: only for the tests that write probes

    out = run_dir / "probes" / "native"
    out.mkdir(parents=True)
    rows = _probe_rows(seed, shift)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (out / "samples.jsonl").write_bytes(data)
    summary = {"run": str(run_dir), "operator": operator, "native_operator": operator,
               "families": PROBE_FAMILIES, "copies": PROBE_FAMILIES, "seed": 0, "block_size": 1024,
               "vocab_size": 50304, "batch_size": batch_size, "samples_sha256": "same samples",
               "samples_jsonl_sha256": atomic.sha256_bytes(data), "skipped": {"A": [], "B": [], "C": []},
               "table": summarize(rows, n_resamples=200)}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
