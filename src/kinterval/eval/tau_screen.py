"""Inference-time tau screen on a frozen softmax checkpoint (paper App. C.3, "Selection of tau").

The attention operator of every layer is swapped at inference for a fixed-window (FWM) operator with window
``tau`` and ``K`` intervals and the validation NLL is measured per block. Two tail policies:

* ``zero`` — FWM as trained (keys with ``z < -tau`` get weight 0): ``fwm-<recon>-k{K}[tau=...]``;
* ``floor`` — the "floor tail" screening variant, *not* an operator of the family: ``z <- max(z, -tau)``, so
  tail keys keep the lowest level ``e^{-tau}`` instead of 0 (:func:`floor_probs`: FWM's grid on
  ``z~ = clip(z, -tau, 0)`` with every valid key kept; a tail key sits at ``r = 0, t = 0``, weight exactly
  ``e^{-tau}`` under LERP and Nearest alike).

Stages (defaults as in the paper): (1) floor tail, first 32 blocks, K in {4,16,32}, tau in {8,...,32};
(2a) floor tail and (2b) zero tail, tau in {4,5,6,7,8,10,12}; (3) zero tail, every block, K in {4,8,16,32},
tau in {5,6,7}, with MinMax at the same K as a reference. Every stage also scores softmax on the same
blocks, so each condition gets a paired per-block difference from softmax with a circular block-bootstrap
CI (:func:`contrasts`); the per-block NLL arrays are kept (:func:`save_per_block`). The stage-3 table marks
the best tau of each K and gives ``tau* - softmax`` [CI], tau* being the tau with the lowest mean NLL
averaged over K, and every tau - softmax [CI]. The forward uses the model's own numerics (bf16 autocast
outside attention on CUDA); :func:`screen_numerics` gives them under the evaluation summary's names, for the
stage records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from kinterval import atomic
from kinterval.eval.attention import patched_attention
from kinterval.eval.evaluate import applied_numerics
from kinterval.ops import OperatorSpec
from kinterval.ops.reference import (
    grid,
    lerp_weight,
    nearest_weight,
    normalize,
    place,
    reference_probs,
    row_extrema,
)
from kinterval.stats import block_bootstrap_ci, block_length
from kinterval.stats.format import num
from kinterval.train.evaluate import token_nll

RECONSTRUCTIONS = {"nearest": "weight", "lerp": "lerp"}


@dataclass(frozen=True)
class Stage:
    name: str
    tail: str  # "floor" or "zero"
    K: tuple[int, ...]
    taus: tuple[float, ...]
    blocks: int | None  # None: the full split
    minmax: bool = False


PAPER_STAGES = (
    Stage("1", "floor", (4, 16, 32), (8, 12, 16, 20, 24, 32), 32),
    Stage("2a", "floor", (4, 16, 32), (4, 5, 6, 7, 8, 10, 12), 32),
    Stage("2b", "zero", (4, 16, 32), (4, 5, 6, 7, 8, 10, 12), 32),
    Stage("3", "zero", (4, 8, 16, 32), (5, 6, 7), None, minmax=True),
)


def fwm_spec(K: int, tau: float, reconstruction: str = "nearest") -> OperatorSpec:
    if reconstruction == "lerp":
        return OperatorSpec.parse(f"fwm-lerp-k{K}", tau=tau)
    return OperatorSpec.parse(f"fwm-weight-k{K}", tau=tau)


def minmax_spec(K: int, reconstruction: str = "nearest") -> OperatorSpec:
    return OperatorSpec.parse(f"lerp-k{K}" if reconstruction == "lerp" else f"minmax-weight-k{K}")


def floor_probs(s: torch.Tensor, valid: torch.Tensor, spec: OperatorSpec) -> torch.Tensor:
    """The floor-tail forward of the FWM ``spec``: its grid on ``z~ = clip(z, -tau, 0)`` (App. A) with every
    valid key kept, so a key with ``z < -tau`` is reconstructed at ``z~ = -tau``, weight ``e^{-tau}``.

    Not a score transform: raising ``s`` to ``M - tau`` and letting FWM recompute ``z = s - M`` can round to
    just below ``-tau`` and hit FWM's zero tail. Forward only (the screen does not differentiate)."""
    if spec.calibration != "fwm":
        raise ValueError(f"the floor tail is a variant of FWM, got {spec.full_name}")
    ext = row_extrema(s, valid)
    g = grid(torch.where(valid, s, ext.M.expand_as(s)), valid, spec, ext.M, ext.m)
    g = replace(g, keep=valid)  # no zero tail: z < -tau is clamped to the window edge
    return normalize(place(lerp_weight(g) if spec.reconstruction == "lerp" else nearest_weight(g), g))


def probs_fn(spec: OperatorSpec, tail: str = "zero"):
    if tail == "floor":
        return lambda idx, s, valid, q, k: floor_probs(s, valid, spec)
    if tail != "zero":
        raise ValueError(f"tail must be 'floor' or 'zero', got {tail!r}")
    return lambda idx, s, valid, q, k: reference_probs(s, valid, spec)


def swapped_nll(
    model, tokens, spec: OperatorSpec, *, tail: str = "zero", blocks: int | None = None
) -> np.ndarray:
    """Per-block NLL with every layer's operator replaced by ``spec`` (``tail`` policy for FWM)."""
    with patched_attention(model, probs_fn(spec, tail)):
        return token_nll(model, tokens, model.config.block_size, max_blocks=blocks).mean(axis=1)


@dataclass
class StageResult:
    stage: Stage
    nll: dict[str, float] = field(
        default_factory=dict
    )  # condition -> mean NLL; keys "K=4 tau=6", "K=4 minmax"
    per_block: dict[str, np.ndarray] = field(default_factory=dict)

    def best_tau(self, K: int) -> float:
        return min(self.stage.taus, key=lambda t: self.nll[key(K, t)])

    def global_tau(self) -> float:
        return min(self.stage.taus, key=lambda t: np.mean([self.nll[key(K, t)] for K in self.stage.K]))


def tau_text(tau: float) -> str:
    """``tau`` as few digits as name it exactly (6 -> "6", 1.0000001 -> "1.0000001"): two taus that agree
    to six digits are two conditions, not one (the screen's keys and column heads)."""
    short = f"{tau:g}"
    return short if float(short) == tau else repr(float(tau))


def key(K: int, tau: float | str) -> str:
    return f"K={K} tau={tau_text(tau)}" if not isinstance(tau, str) else f"K={K} {tau}"


def screen_numerics(model) -> dict:
    """The device and numerics the screen's forwards run under (:func:`token_nll`: the model's own device and
    ``config.numerics``), named as an evaluation summary names them (``device`` plus
    :func:`kinterval.eval.evaluate.applied_numerics`)."""
    device = next(model.parameters()).device
    return {"device": str(device), **applied_numerics(model.config.numerics, device)}


def run_stage(model, tokens, stage: Stage, *, reconstruction: str = "nearest", progress=None) -> StageResult:
    res = StageResult(stage)
    conds = [(key(K, t), fwm_spec(K, t, reconstruction), stage.tail) for K in stage.K for t in stage.taus]
    if stage.minmax:
        conds += [(key(K, "minmax"), minmax_spec(K, reconstruction), "zero") for K in stage.K]
    conds.append(("softmax", OperatorSpec.parse("softmax"), "zero"))  # the reference of every contrast
    for name, spec, tail in conds:
        nll = swapped_nll(model, tokens, spec, tail=tail, blocks=stage.blocks)
        res.per_block[name], res.nll[name] = nll, float(nll.mean())
        if progress:
            progress(f"stage {stage.name} {name}: {res.nll[name]:.4f} ({nll.size} blocks)")
    return res


def _ci(d: np.ndarray, n_resamples: int) -> tuple[float, float]:
    """Circular block bootstrap 95% CI of a per-block mean (block ``stats.block_length``: 16, or n // 2 below
    32 blocks)."""
    if d.size < 2:
        return float("nan"), float("nan")
    ci = block_bootstrap_ci(d, block=block_length(d.size), n_resamples=n_resamples)
    return ci.lo, ci.hi


def contrasts(res: StageResult, *, n_resamples: int = 10_000) -> list[dict]:
    """Every condition of a stage minus softmax, paired per block: rows ``{condition, K, tau, delta, lo, hi,
    n_blocks, block}`` (``tau`` is ``"minmax"`` for the MinMax reference), 95% circular block-bootstrap CIs
    with the block length used."""
    if "softmax" not in res.per_block:
        raise ValueError(f"stage {res.stage.name} has no softmax reference to contrast against")
    soft = res.per_block["softmax"]
    rows = []
    for name, nll in res.per_block.items():
        if name == "softmax":
            continue
        K, tau = name.split(" ", 1)
        tau = tau.removeprefix("tau=")
        d = nll - soft
        lo, hi = _ci(d, n_resamples)
        tau = tau if tau == "minmax" else float(tau)
        rows.append({"condition": name, "K": int(K.removeprefix("K=")), "tau": tau, "delta": float(d.mean()),
                     "lo": lo, "hi": hi, "n_blocks": int(d.size), "block": block_length(d.size)})  # fmt: skip
    return rows


def save_per_block(res: StageResult, path) -> Path:
    """Write the per-block NLL of every condition to ``path`` (npz; keys are the condition names), atomically
    (a temporary file renamed into place: a kill leaves the old file or the new one). ``path`` is used as
    given: no ``.npz`` is appended."""
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in res.per_block.items()}
    return atomic.write_with(path, lambda fh: np.savez(fh, **arrays))


def load_per_block(path) -> dict[str, np.ndarray]:
    """The per-block arrays written by :func:`save_per_block`."""
    with np.load(path) as z:
        return {name: z[name] for name in z.files}


def stage3_table(res: StageResult, *, n_resamples: int = 10_000, fmt: str = "md") -> tuple[str, list[dict]]:
    """The stage-3 table: K rows; MinMax, one column per tau (best per row marked), tau* - softmax [CI].

    A second table gives every condition (MinMax and each tau) minus softmax [95% CI]; each row dict carries
    them as ``minmax_ci`` and ``tau_ci`` (``{tau: {delta, lo, hi}}``).
    """
    st = res.stage
    tau_star = res.global_tau()
    soft = res.per_block["softmax"]
    ci = {
        c["condition"]: {"delta": c["delta"], "lo": c["lo"], "hi": c["hi"]}
        for c in contrasts(res, n_resamples=n_resamples)
    }
    rows = []
    for K in st.K:
        star = ci[key(K, tau_star)]
        rows.append(
            {
                "K": K,
                "minmax": res.nll.get(key(K, "minmax")),
                "tau": {t: res.nll[key(K, t)] for t in st.taus},
                "best_tau": res.best_tau(K),
                "tau_star": tau_star,
                "delta": star["delta"],
                "lo": star["lo"],
                "hi": star["hi"],
                "minmax_ci": ci.get(key(K, "minmax")),
                "tau_ci": {t: ci[key(K, t)] for t in st.taus},
            }
        )
    bold = (lambda x: f"**{x}**") if fmt == "md" else (lambda x: f"\\textbf{{{x}}}")
    # num: below the fourth decimal in two significant digits, not -0.0000
    cell = lambda c: f"{num(c['delta'])} [{num(c['lo'])}, {num(c['hi'])}]" if c else "-"  # noqa: E731
    star_head = f"tau*={tau_text(tau_star)} - softmax [95% CI]"
    head = ["K", "MinMax", *[f"tau={tau_text(t)}" for t in st.taus], star_head]
    head2 = ["K", "MinMax - softmax", *[f"tau={tau_text(t)} - softmax" for t in st.taus]]
    lines, lines2 = [], []
    for r in rows:
        cells = [str(r["K"]), f"{r['minmax']:.4f}" if r["minmax"] is not None else "-"]
        cells += [bold(f"{v:.4f}") if t == r["best_tau"] else f"{v:.4f}" for t, v in r["tau"].items()]
        cells.append(cell(r))
        lines.append(cells)
        lines2.append([str(r["K"]), cell(r["minmax_ci"]), *[cell(r["tau_ci"][t]) for t in st.taus]])
    note = f"softmax {res.nll['softmax']:.4f}; {soft.size} blocks; best tau per K in bold"
    note2 = "each condition - softmax per block [95% circular block-bootstrap CI]"
    if fmt == "md":
        return f"{_md(head, lines)}\n{note}\n\n{_md(head2, lines2)}\n{note2}\n", rows
    return f"{_tex(head, lines)}% {note}\n{_tex(head2, lines2)}% {note2}\n", rows


def _md(head, lines) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(c) + " |" for c in lines
    ]
    return "\n".join(out) + "\n"


def _tex(head, lines) -> str:
    head = [h.replace("tau", "$\\tau$").replace("*", "^*") for h in head]
    body = " \\\\\n".join(" & ".join(c) for c in lines)
    return (
        f"\\begin{{tabular}}{{{'r' * (len(head) - 1)}l}}\n\\toprule\n{' & '.join(head)} \\\\\n\\midrule\n"
        f"{body} \\\\\n\\bottomrule\n\\end{{tabular}}\n"
    )
