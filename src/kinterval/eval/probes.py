"""Synthetic probes (paper App. C.3, layer 2): induction, key-value retrieval and prefix copying.

Every sample is a random token sequence over the model's vocabulary (fixed seed, one RNG stream per family)
plus the positions to score: position ``i`` scores the prediction of ``tokens[i + 1]``.

* Probe A, induction: a bigram (A, B) at position p and A again at p + d; score B. Its matched control is
  the same sequence with the earlier (A, B) replaced by random tokens. One family = one (A, B) and one filler
  stream at every distance d (distances that do not fit the context are skipped and recorded).
* Probe B, key-value retrieval: n pairs ``k1 v1 ... kn vn`` then a query key; score its value. ``near``
  queries a key of the last quarter of pairs, ``far`` one of the first quarter; every sample has its own
  pairs (independent samples, paper Table tab:probeab).
* Probe C, prefix copying: a random segment of length L, a separator, the segment again; every token of the
  second copy is scored. Its own sample count: ``copies`` per L (paper App. C.3: 300 per L, 900 in total),
  not the ``families`` of probes A and B (400: 2,000 induction samples, 2,400 retrieval samples).

Scores per sample: mean target NLL (nats), top-1 accuracy; probe A also gives the induction gain (control NLL
minus induction NLL, per family and distance). Intervals: family bootstrap (every distance and pairing of a
family is resampled together).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import astuple, dataclass, field
from pathlib import Path

import numpy as np
import torch

from kinterval import atomic
from kinterval.eval.checkpoints import pick_device
from kinterval.eval.evaluate import applied_numerics
from kinterval.stats.format import num
from kinterval.train.load import load_run

DISTANCES = (64, 128, 256, 512, 896)
N_PAIRS = (16, 32, 64)
SEGMENT_LENGTHS = (32, 64, 128)
COPIES = 300  # probe C samples per segment length L (paper App. C.3: 300 per L, 900 in total)
PREFIX = 16  # random tokens before the first structure, so nothing starts at position 0
EOT = 50256  # GPT-2's end of text


def eot_of(vocab: int) -> int:
    """The end-of-text id probes leave out of their random tokens and put between the two copies of probe C:
    GPT-2's 50256 when the vocabulary holds it, else its last id (the synthetic corpus's EOT)."""
    return EOT if vocab > EOT else vocab - 1


@dataclass
class Sample:
    probe: str  # "A", "B" or "C"
    family: int
    condition: str  # A: induction/control, B: near/far, C: copy
    param: int  # A: distance d, B: number of pairs, C: segment length L
    tokens: list[int]
    score_pos: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------- generators
def _rng(seed: int, probe: str, family: int) -> np.random.Generator:
    return np.random.default_rng([seed, ord(probe), family])


def _draw(rng, vocab: int, n: int, exclude=()) -> np.ndarray:
    """n tokens uniform over [0, vocab) minus ``exclude`` (EOT, :func:`eot_of`, is always excluded)."""
    bad = np.array(sorted(set(exclude) | {eot_of(vocab)}))
    out = rng.integers(0, vocab, size=n)
    while True:
        redo = np.isin(out, bad)
        if not redo.any():
            return out
        out[redo] = rng.integers(0, vocab, size=int(redo.sum()))


def _distinct(rng, vocab: int, n: int) -> np.ndarray:
    return rng.choice(np.setdiff1d(np.arange(vocab), [eot_of(vocab)]), size=n, replace=False)


def induction_samples(n_families: int, vocab: int, block: int, distances=DISTANCES, seed: int = 0):
    """Probe A samples (induction + control per family and distance) and the distances skipped."""
    fits = [d for d in distances if PREFIX + d + 1 <= block]  # input length PREFIX + d + 1
    skipped = [d for d in distances if d not in fits]
    samples = []
    for f in range(n_families):
        rng = _rng(seed, "A", f)
        a, b = (int(t) for t in _distinct(rng, vocab, 2))
        stream = _draw(rng, vocab, PREFIX + max(distances, default=0) + 2, exclude=(a, b))
        for d in fits:
            seq = stream[: PREFIX + d + 2].copy()
            seq[PREFIX], seq[PREFIX + 1], seq[PREFIX + d], seq[PREFIX + d + 1] = a, b, a, b
            control = seq.copy()
            control[PREFIX : PREFIX + 2] = stream[-2:]  # the earlier (A, B) replaced by other random tokens
            for cond, s in (("induction", seq), ("control", control)):
                samples.append(Sample("A", f, cond, d, s.tolist(), [PREFIX + d]))
    return samples, skipped


def retrieval_samples(n_families: int, vocab: int, block: int, n_pairs=N_PAIRS, seed: int = 0):
    """Probe B samples (near and far query per family and pair count) and the pair counts skipped.

    Every sample draws its own key-value body: the paper's 2,400 probe-B samples are independent (Table
    tab:probeab, resampled by sample), so a near and a far query do not share one body."""
    fits = [n for n in n_pairs if 2 * n + 1 <= block]
    samples = []
    for f in range(n_families):
        rng = _rng(seed, "B", f)
        for n in fits:
            q = max(1, n // 4)
            for cond, lo, hi in (("near", n - q, n), ("far", 0, q)):
                keys = _distinct(rng, vocab, n)
                values = _draw(rng, vocab, n, exclude=keys.tolist())
                body = np.stack([keys, values], 1).reshape(-1)
                i = int(rng.integers(lo, hi))
                seq = np.concatenate([body, [keys[i], values[i]]])
                samples.append(Sample("B", f, cond, n, seq.tolist(), [2 * n]))
    return samples, [n for n in n_pairs if n not in fits]


def copy_samples(n_families: int, vocab: int, block: int, lengths=SEGMENT_LENGTHS, seed: int = 0):
    """Probe C samples (one copy task per family and segment length: ``n_families`` samples per L) and the
    lengths skipped."""
    sep = eot_of(vocab)
    fits = [L for L in lengths if PREFIX + 2 * L <= block]  # input PREFIX + 2L: the last token is a target
    samples = []
    for f in range(n_families):
        rng = _rng(seed, "C", f)
        for L in fits:
            pre, seg = _draw(rng, vocab, PREFIX, exclude=(sep,)), _draw(rng, vocab, L, exclude=(sep,))
            seq = np.concatenate([pre, seg, [sep], seg])
            start = PREFIX + L  # the separator predicts seg[0]
            samples.append(Sample("C", f, "copy", L, seq.tolist(), list(range(start, start + L))))
    return samples, [L for L in lengths if L not in fits]


def all_samples(
    n_families: int, vocab: int, block: int, seed: int = 0, distances=DISTANCES, copies: int = COPIES
):
    """Probes A and B with ``n_families`` families, probe C with ``copies`` samples per segment length."""
    a, skip_a = induction_samples(n_families, vocab, block, distances, seed)
    b, skip_b = retrieval_samples(n_families, vocab, block, seed=seed)
    c, skip_c = copy_samples(copies, vocab, block, seed=seed)
    return a + b + c, {"A": skip_a, "B": skip_b, "C": skip_c}


def _smallest_blocks(distances=DISTANCES) -> str:
    """The block size the shortest sample of each probe needs, e.g. "probe A needs block_size >= 81 (distance
    64), B >= 33 (16 pairs), C >= 80 (length 32)"."""
    d, n, L = min(distances, default=None), min(N_PAIRS), min(SEGMENT_LENGTHS)
    need = [f"A >= {PREFIX + d + 1} (distance {d})"] if d else []
    need += [f"B >= {2 * n + 1} ({n} pairs)", f"C >= {PREFIX + 2 * L} (length {L})"]
    return "probe " + ", ".join(need).replace(">=", "needs block_size >=", 1)


def samples_sha256(samples: list[Sample]) -> str:
    """sha256 of the generated samples (probe, family, condition, param, tokens, scored positions, in order):
    two probe outputs are paired only when they scored the same token sequences."""
    return hashlib.sha256(json.dumps([astuple(s) for s in samples]).encode()).hexdigest()


# ---------------------------------------------------------------------- scoring
@torch.no_grad()
def score(model, samples: list[Sample], *, device="cpu", batch_size: int = 1) -> list[dict]:
    """Per-sample rows: the sample's identity plus mean target NLL and top-1 accuracy over its scored tokens.

    One sequence per forward by default, as every number of the paper is taken (App. C.2: batch 1 and batch 8
    differ by up to 8.1e-3 nats on single blocks); ``batch_size > 1`` batches equal-length samples, faster
    and not bit-identical.

    ``model(idx)`` must return ``(logits, ...)`` as :class:`kinterval.model.GPT` does.
    """
    from kinterval.model.numerics import autocast, eval_precision

    device = pick_device(device)  # "auto" too: torch.tensor and autocast take only a real device
    numerics = getattr(getattr(model, "config", None), "numerics", None)
    rows: list[dict | None] = [None] * len(samples)
    by_len = defaultdict(list)  # equal lengths batch without padding
    for i, s in enumerate(samples):
        by_len[len(s.tokens)].append(i)
    for idx in by_len.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            seqs = torch.tensor([samples[i].tokens for i in chunk], device=device)
            ctx = (eval_precision(numerics), autocast(numerics, device)) if numerics is not None else ()
            with _stack(ctx):
                logits = model(seqs[:, :-1])[0]
            logp = torch.log_softmax(logits.float(), dim=-1)
            for row, i in enumerate(chunk):
                pos = torch.tensor(samples[i].score_pos, device=device)
                tgt = seqs[row, pos + 1]
                nll = -logp[row, pos].gather(-1, tgt[:, None]).squeeze(-1)
                acc = (logp[row, pos].argmax(-1) == tgt).float()
                s = samples[i]
                rows[i] = {"probe": s.probe, "family": s.family, "condition": s.condition, "param": s.param,
                           "nll": nll.mean().item(), "acc": acc.mean().item(),
                           "n_scored": len(pos)}  # fmt: skip
    return rows


def _stack(ctxs):
    import contextlib

    stack = contextlib.ExitStack()
    for c in ctxs:
        stack.enter_context(c)
    return stack


# ---------------------------------------------------------------------- summaries
def summarize(rows: list[dict], *, n_resamples: int = 4000, seed: int = 0) -> list[dict]:
    """Table rows ``{probe, metric, param, condition, mean, lo, hi, n}`` with family-bootstrap 95% CIs.

    Each probe leads with its pooled rows (``param="all"``), the paper's tab:probeab rows among them: probe A
    induction and control over every distance (resampled by family), probe B ``condition="all"`` (every
    sample, near and far, resampled by sample). Then the per distance / pair count / length breakdown. Probe A
    adds ``metric="gain"`` (control NLL - induction NLL) per distance and pooled (``param="all"``).
    ``lo``/``hi`` are None when the interval cannot be formed (one family: ``--families 1``/``--copies 1``).
    """
    from kinterval.stats import family_bootstrap_ci

    def row(probe, metric, param, cond, values, fams):
        values, fams = np.asarray(values, float), np.asarray(fams)
        lo = hi = None  # a bootstrap over a single family has no interval
        if len(np.unique(fams)) >= 2:
            ci = family_bootstrap_ci(values, fams, n_resamples=n_resamples, seed=seed)
            lo, hi = ci.lo, ci.hi
        return {"probe": probe, "metric": metric, "param": param, "condition": cond,
                "mean": float(values.mean()), "lo": lo, "hi": hi, "n": len(values)}  # fmt: skip

    out = []
    groups = defaultdict(list)
    for r in rows:
        groups[(r["probe"], r["param"], r["condition"])].append(r)
        if r["probe"] == "A":  # pooled over distances, as paired_deltas pools them
            groups[("A", "all", r["condition"])].append(r)
        if r["probe"] == "B":
            groups[("B", "all", "all")].append(r)
    order = lambda g: (g[0][0], g[0][1] != "all", str(g[0][1]).zfill(6), g[0][2])  # noqa: E731
    for (probe, param, cond), rs in sorted(groups.items(), key=order):
        ids = range(len(rs)) if cond == "all" else [r["family"] for r in rs]  # pooled B: by sample
        for metric in ("nll", "acc"):
            out.append(row(probe, metric, param, cond, [r[metric] for r in rs], ids))
    # induction gain, paired within (family, distance); printed after probe A's other rows, before B's
    nll = {(r["family"], r["param"], r["condition"]): r["nll"] for r in rows if r["probe"] == "A"}
    pairs = [(f, d, nll[(f, d, "control")] - v) for (f, d, c), v in nll.items() if c == "induction"]
    gain = []
    for d in sorted({p[1] for p in pairs}):
        sel = [p for p in pairs if p[1] == d]
        gain.append(row("A", "gain", d, "control-induction", [p[2] for p in sel], [p[0] for p in sel]))
    if pairs:
        values, fams = [p[2] for p in pairs], [p[0] for p in pairs]
        gain.append(row("A", "gain", "all", "control-induction", values, fams))
    n_a = sum(r["probe"] == "A" for r in out)  # A sorts first
    return out[:n_a] + gain + out[n_a:]


def in_probeab(r: dict) -> bool:
    """Whether a :func:`summarize` or :func:`paired_deltas` row is a row of the paper's Table tab:probeab:
    probe A pooled over distances (induction target NLL and top-1, induction gain), probe B pooled over every
    sample (near and far; target NLL and top-1)."""
    return r["param"] == "all" and (r["probe"], r["condition"]) in {
        ("A", "induction"), ("A", "control-induction"), ("B", "all")}  # fmt: skip


def interval_text(lo, hi, signed: bool = False) -> str:
    """``[lo, hi]`` as printed by ``kinterval probes`` (``signed``: ``probes-compare``), "-" when the interval
    could not be formed (``None``: a single family). A signed bound below the fourth decimal prints in two
    significant digits (``stats.format.num``): an interval that excludes 0 never reads [-0.0001, -0.0000]."""
    if lo is None or hi is None:
        return "-"
    return f"[{num(lo)}, {num(hi)}]" if signed else f"[{lo:.4f}, {hi:.4f}]"


def probe_tables(results_dir: str | Path) -> list[dict]:
    """The summary table rows of a ``kinterval probes`` output folder (see :func:`summarize`), each with the
    run's ``operator`` added."""
    path = Path(results_dir) / "summary.json"
    summary = _read_summary(path.parent)
    if not isinstance(summary.get("table"), list):
        raise ValueError(f"{path}: not a `kinterval probes` summary (no table)")
    return [dict(r, operator=summary["operator"]) for r in summary["table"]]


SAMPLE_FIELDS = ("probe", "family", "condition", "param", "nll", "acc")


def _bad_sample_field(row: dict) -> str | None:
    """The first field of a sample row of the wrong type (ids: probe and condition strings, family an
    integer, param an integer or string; nll and acc finite numbers), else None."""
    is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
    is_str = lambda x: isinstance(x, str)  # noqa: E731
    finite = lambda x: (is_int(x) or isinstance(x, float)) and math.isfinite(x)  # noqa: E731
    checks = {"probe": is_str, "family": is_int, "condition": is_str,
              "param": lambda x: is_int(x) or is_str(x), "nll": finite, "acc": finite}  # fmt: skip
    return next((f for f, ok in checks.items() if not ok(row[f])), None)


def _read_summary(folder: Path) -> dict:
    """``folder/summary.json``; ``ValueError`` naming the file when it is missing, not JSON (torn) or not a
    probes summary."""
    path = folder / "summary.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a `kinterval probes` output (no summary.json)")
    try:
        summary = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a JSON file ({err}); rerun `kinterval probes`") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("operator"), str):
        raise ValueError(f"{path}: not a `kinterval probes` summary (no operator name)")
    return summary


def _read_samples(folder: Path, summary: dict) -> list[dict]:
    """The rows of ``folder/samples.jsonl``. Its sha256 must be the summary's ``samples_jsonl_sha256`` (a
    summary written before it was recorded is not checked), and every line a sample row: ``ValueError``
    naming the file otherwise (samples of another run, or a file torn by a kill)."""
    path = folder / "samples.jsonl"
    data = path.read_bytes()
    want = summary.get("samples_jsonl_sha256")
    if want is not None and atomic.sha256_bytes(data) != want:
        raise ValueError(f"{path} is not the samples file {folder / 'summary.json'} was written with (sha256 "
                         "differs: a mixed or interrupted output); rerun `kinterval probes`")  # fmt: skip
    rows = []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}, line {n}: not a JSON record ({err})") from None
        if not isinstance(row, dict) or any(f not in row for f in SAMPLE_FIELDS):
            raise ValueError(f"{path}, line {n}: not a probe sample row (fields {', '.join(SAMPLE_FIELDS)})")
        bad = _bad_sample_field(row)
        if bad:  # else a TypeError in the pairing, or a NaN CI error naming no file
            raise ValueError(f"{path}, line {n}: {bad} is {row[bad]!r}, not a probe sample's value")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no samples (no probe fit the model's block_size "
                         f"{summary.get('block_size')}): probe a model with a larger block size")  # fmt: skip
    return rows


# ---------------------------------------------------------------------- paired comparison with softmax
def _paired_ci(probe, values, families, n_resamples, seed):
    """Probe A resamples whole families (distances and the induction/control pairing stay together); the
    samples of probes B and C are independent and are resampled directly (paper, Table tab:probeab).
    ``(None, None)`` when there is nothing to resample: one family (probe A) or one sample."""
    from kinterval.stats import family_bootstrap_ci, paired_bootstrap_ci

    units = len(np.unique(families)) if probe == "A" else len(values)  # what the bootstrap resamples
    if units < 2:
        return None, None
    if not np.any(values != values[0]):  # every resample has the same mean
        return (float(values[0]),) * 2
    if probe == "A":
        ci = family_bootstrap_ci(values, families, n_resamples=n_resamples, seed=seed)
    else:
        ci = paired_bootstrap_ci(values, n_resamples=n_resamples, seed=seed)
    return ci.lo, ci.hi


def _sample_table(rows, ref_rows) -> dict[tuple, tuple[dict, dict]]:
    """(probe, family, condition, param) -> (row, reference row); the two must score the same samples."""
    key = lambda r: (r["probe"], r["family"], r["condition"], r["param"])  # noqa: E731
    mine, ref = {key(r): r for r in rows}, {key(r): r for r in ref_rows}
    for probe in sorted({k[0] for k in mine} | {k[0] for k in ref}):
        a = {k for k in mine if k[0] == probe}
        b = {k for k in ref if k[0] == probe}
        if a != b:
            raise ValueError(f"probe {probe}: the samples differ from the reference's ({len(a)} vs {len(b)} "
                             f"samples, {len(a ^ b)} in only one); use the same --families, --copies, --seed "
                             "and model context")  # fmt: skip
    return {k: (mine[k], ref[k]) for k in mine}


def _gains(rows) -> dict[tuple[int, int], float]:
    """Probe A induction gain (control NLL - induction NLL) per (family, distance)."""
    nll = {(r["family"], r["param"], r["condition"]): r["nll"] for r in rows if r["probe"] == "A"}
    return {(f, d): nll[(f, d, "control")] - v for (f, d, c), v in nll.items() if c == "induction"}


def paired_deltas(rows, ref_rows, *, n_resamples: int = 4000, seed: int = 0) -> list[dict]:
    """Condition - reference (softmax) on the same samples, with paired 95% bootstrap CIs.

    Rows ``{probe, metric, param, condition, reference, value, delta, lo, hi, n}`` per probe, metric (``nll``,
    ``acc``; ``gain`` for probe A), param (distance / pair count / length, and ``"all"`` pooled) and sample
    condition. Probe B leads with its pooled rows (``param="all"``, ``condition="all"``: every sample, near
    and far; the paper's tab:probeab row). ``reference`` and ``value`` are the two means, ``delta`` their
    paired difference. Within a probe: the rows of tab:probeab first (:func:`in_probeab`), then by metric in
    the table's order (nll, gain, acc) and condition, each pooled row before its per-parameter rows.
    """
    pairs = _sample_table(rows, ref_rows)
    groups = defaultdict(list)  # (probe, metric, param, condition) -> [(family, value, reference value)]
    for (probe, fam, cond, param), (r, q) in sorted(pairs.items()):
        for metric in ("nll", "acc"):
            for p in (param, "all"):
                groups[(probe, metric, p, cond)].append((fam, r[metric], q[metric]))
            if probe == "B":
                groups[("B", metric, "all", "all")].append((fam, r[metric], q[metric]))
    gains, ref_gains = _gains(rows), _gains(ref_rows)
    for (fam, d), g in sorted(gains.items()):
        for p in (d, "all"):
            groups[("A", "gain", p, "control-induction")].append((fam, g, ref_gains[(fam, d)]))
    out = []
    for (probe, metric, param, cond), items in groups.items():
        fams = np.array([i[0] for i in items])
        value, ref = np.array([i[1] for i in items], float), np.array([i[2] for i in items], float)
        lo, hi = _paired_ci(probe, value - ref, fams, n_resamples, seed)
        out.append({"probe": probe, "metric": metric, "param": param, "condition": cond,
                    "reference": float(ref.mean()), "value": float(value.mean()),
                    "delta": float((value - ref).mean()), "lo": lo, "hi": hi, "n": len(items)})  # fmt: skip
    rank = ("nll", "gain", "acc").index
    # within a probe: the rows of tab:probeab, then each condition's pooled row before its per-parameter rows
    order = lambda r: (r["probe"], not in_probeab(r), rank(r["metric"]), r["condition"] != "all",  # noqa: E731
                       r["condition"], r["param"] != "all", str(r["param"]).zfill(6))  # fmt: skip
    return sorted(out, key=order)


def delta_slopes(rows, ref_rows, *, n_resamples: int = 4000, seed: int = 0) -> list[dict]:
    """Slope of the paired difference from the reference against log2 of the probe's length variable.

    The length variable is the distance d (A), the number of pairs (B) or the copied length L (C; paper Table
    tab:probec). Every family scores every length, so the least-squares slope over all samples equals the mean
    of the per-family slopes; the 95% CI bootstraps the families' slopes. Rows ``{probe, metric, condition,
    params, slope, lo, hi, n_families}`` for ``nll`` (every probe and condition) and ``gain`` (probe A).
    """
    from kinterval.stats import k_trend_slopes, paired_bootstrap_ci

    pairs = _sample_table(rows, ref_rows)
    series = defaultdict(dict)  # (probe, metric, condition) -> {(family, param): delta}
    for (probe, fam, cond, param), (r, q) in pairs.items():
        series[(probe, "nll", cond)][(fam, param)] = r["nll"] - q["nll"]
    ref_gains = _gains(ref_rows)
    for (fam, d), g in _gains(rows).items():
        series[("A", "gain", "control-induction")][(fam, d)] = g - ref_gains[(fam, d)]
    out = []
    for (probe, metric, cond), deltas in sorted(series.items()):
        params = sorted({p for _, p in deltas})
        fams = sorted({f for f, _ in deltas})
        if len(params) < 2 or len(fams) < 2:
            continue  # a slope needs two lengths, its CI two families
        d = np.array([[deltas[(f, p)] for p in params] for f in fams])
        slopes = k_trend_slopes(params, d).slopes  # per-family OLS slope against log2(param)
        ci = paired_bootstrap_ci(slopes, n_resamples=n_resamples, seed=seed)
        row = {"probe": probe, "metric": metric, "condition": cond, "params": params}
        out.append(dict(row, slope=float(slopes.mean()), lo=ci.lo, hi=ci.hi, n_families=len(fams)))
    return out


def compare_probes(results_dir, reference_dir, *, n_resamples: int = 4000, seed: int = 0) -> dict:
    """Paired deltas and slopes of a ``kinterval probes`` output folder against a reference (softmax) folder.

    Both must come from the same samples: same ``seed``, ``families``, ``copies``, skipped lengths,
    ``vocab_size`` and ``samples_sha256`` (the token sequences themselves), scored at the same ``batch_size``
    (``ValueError`` naming the field otherwise, or when an older summary lacks ``vocab_size`` or
    ``samples_sha256``). Each ``samples.jsonl`` must be the file its ``summary.json`` was written with
    (``samples_jsonl_sha256``; a summary written before it was recorded is not checked), and a torn or
    unreadable file is a ``ValueError`` naming it. And they must be scored with the same numerics (device
    type, autocast, attention dtype, TF32, eval dot precision; a summary written before they were recorded
    is compared unchecked, with a ``NumericsUnknownWarning`` when the other records them: see
    :func:`kinterval.eval.downstream.check_same_numerics`). Returns ``{operator, reference_operator,
    deltas, slopes}`` (see :func:`paired_deltas` and :func:`delta_slopes`).
    """
    from kinterval.eval.downstream import check_same_numerics, warn_unknown_numerics

    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    folders = {"reference": Path(reference_dir), "results": Path(results_dir)}  # checked in the CLI's order
    summaries, rows = {}, {}
    for name, folder in folders.items():
        if not (folder / "summary.json").is_file() or not (folder / "samples.jsonl").is_file():
            raise ValueError(f"{folder} is not a `kinterval probes` output (summary.json, samples.jsonl)")
        summaries[name] = _read_summary(folder)
        rows[name] = _read_samples(folder, summaries[name])
    for field_ in ("seed", "families", "copies", "skipped", "vocab_size", "samples_sha256", "batch_size"):
        a, b = summaries["results"].get(field_), summaries["reference"].get(field_)
        if field_ == "batch_size":  # recorded since batch 1 became the default; older outputs were batch 8
            a, b = a or 8, b or 8
        if field_ in ("vocab_size", "samples_sha256") and None in (a, b):
            old = folders["results" if a is None else "reference"]
            raise ValueError(f"{old}/summary.json has no {field_} (written before it was recorded): the "
                             "token sequences cannot be checked; rerun `kinterval probes`")  # fmt: skip
        if a != b:
            why = (  # the samples are the same; batched scoring rounds differently (see score)
                f"not scored alike: rerun one with --batch-size {b}"
                if field_ == "batch_size"
                else "not the same samples"
            )
            raise ValueError(f"probe {field_} differs from the reference's ({a} vs {b}): {why}")
    records = [(str(folders[name]), summaries[name]) for name in ("results", "reference")]
    unknown = check_same_numerics(records, "probe outputs")
    if len(unknown) == 1:  # two old summaries: nothing to warn about (both unknown, as before)
        warn_unknown_numerics(unknown, "scoring")
    kw = {"n_resamples": n_resamples, "seed": seed}
    ops = {
        "operator": summaries["results"]["operator"],
        "reference_operator": summaries["reference"]["operator"],
    }
    return dict(ops, deltas=paired_deltas(rows["results"], rows["reference"], **kw),
                slopes=delta_slopes(rows["results"], rows["reference"], **kw))  # fmt: skip


def run_probes(run, *, out, checkpoint="latest", operator=None, families: int = 400, copies: int = COPIES,
               device="auto", seed: int = 0, batch_size: int = 1, distances=DISTANCES) -> dict:  # fmt: skip
    """Generate, score and write ``samples.jsonl`` (one row per sample) and ``summary.json``: ``families``
    families for probes A and B, ``copies`` samples per segment length for probe C. ``device`` "auto" is
    CUDA when available, else the CPU; ``summary.json`` records the device and the numerics applied there
    (:func:`kinterval.eval.evaluate.applied_numerics`). ``ValueError``, nothing written, when no probe fits
    the model's block size."""
    checks = (
        ("families", families, 1),
        ("copies", copies, 1),
        ("batch_size", batch_size, 1),
        ("seed", seed, 0),
    )
    for name, value, lo in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    device = pick_device(device)  # once: load_run, score and the summary see the same torch.device
    loaded = load_run(run, checkpoint, device, operator)
    model, state = loaded.model, loaded.state
    cfg = model.config
    samples, skipped = all_samples(families, cfg.vocab_size, cfg.block_size, seed, distances, copies)
    if not samples:  # before anything is written: an empty output would only fail later, in the report
        need = _smallest_blocks(distances)
        raise ValueError(f"no probe fits {run}'s block_size {cfg.block_size} (nothing to score): {need}; "
                         "probe a model with a larger block size")  # fmt: skip
    rows = score(model, samples, device=device, batch_size=batch_size)
    bad = next((r for r in rows if not (math.isfinite(r["nll"]) and math.isfinite(r["acc"]))), None)
    if bad is not None:
        which = ", ".join(f"{k} {bad[k]}" for k in ("probe", "family", "condition", "param"))
        raise ValueError(f"the model scored a non-finite NLL on a probe sample ({which}): its logits hold "
                         "NaN or infinite values")  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # summary.json marks a finished output: the old one goes first, then samples.jsonl and last summary.json
    # (with the samples file's sha256) are written, each atomically. A kill leaves no summary beside samples
    # it was not written with.
    (out / "summary.json").unlink(missing_ok=True)
    data = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows).encode()
    atomic.write_bytes(out / "samples.jsonl", data)
    summary = {"run": str(run), "checkpoint_step": state.get("step"), "operator": model.operator,
               "backend": loaded.backend,
               "native_operator": state["config"]["operator"]["name"], "families": families, "copies": copies,
               "seed": seed, "block_size": cfg.block_size, "vocab_size": cfg.vocab_size,
               "batch_size": batch_size, "samples_sha256": samples_sha256(samples),
               "samples_jsonl_sha256": atomic.sha256_bytes(data), "skipped": skipped,
               "device": str(device), **applied_numerics(cfg.numerics, device),
               "table": summarize(rows)}  # fmt: skip
    atomic.write_text(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary


__all__ = [
    "COPIES",
    "DISTANCES",
    "Sample",
    "all_samples",
    "compare_probes",
    "copy_samples",
    "delta_slopes",
    "in_probeab",
    "induction_samples",
    "interval_text",
    "paired_deltas",
    "probe_tables",
    "retrieval_samples",
    "run_probes",
    "samples_sha256",
    "score",
    "summarize",
]
