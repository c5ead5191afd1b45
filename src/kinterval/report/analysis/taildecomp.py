"""App. D.4 (tab:taildecomp): resolved calibration against the same-seed MinMax and FWM runs, and the path
ratio (MinMax − resolved) / (MinMax − FWM) with its block-bootstrap interval."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from kinterval.ops.spec import DEFAULT_TAU
from kinterval.report.analysis.core import N_RESAMPLES, Row, at_endpoint, estimate
from kinterval.report.results import Point
from kinterval.stats import block_length
from kinterval.stats.bootstrap import circular_block_means


def path_ratio_ci(minmax, resolved, fwm, level: float = 0.95) -> tuple[float, float, float] | None:
    """The path ratio (MinMax − resolved) / (MinMax − FWM) of the mean NLLs with a percentile interval from
    the circular block bootstrap over validation blocks (4000 resamples, block ``stats.block_length(n)``:
    16, or ``n // 2`` below 32 blocks; evaluation sampling only).
    The three runs' per-block NLL are resampled together: numerator and denominator use the same block starts
    (the same generator seed and draw shapes). Resamples with a zero denominator are dropped. Returns
    (ratio, lo, hi); None where it is undefined (MinMax and FWM of equal mean NLL). A non-finite NLL is a
    ``ValueError``."""
    mm, res, fwm = (np.asarray(x, dtype=np.float64) for x in (minmax, resolved, fwm))
    if not (mm.shape == res.shape == fwm.shape) or mm.ndim != 1 or mm.size < 2:
        raise ValueError(
            f"path ratio needs three per-block series of one length >= 2, got {mm.shape}, "
            f"{res.shape}, {fwm.shape}"
        )
    for name, x in (("MinMax", mm), ("resolved", res), ("FWM", fwm)):
        if not np.isfinite(x).all():
            at = int(np.argmin(np.isfinite(x)))
            raise ValueError(f"path ratio: the {name} per-block NLL is not finite at block {at}")
    gap = float(mm.mean() - fwm.mean())
    if gap == 0:
        return None
    block = block_length(mm.size)
    num = circular_block_means(mm - res, block, N_RESAMPLES, np.random.default_rng(0))
    den = circular_block_means(mm - fwm, block, N_RESAMPLES, np.random.default_rng(0))
    ok = den != 0
    lo, hi = np.quantile(num[ok] / den[ok], [(1 - level) / 2, (1 + level) / 2])
    return float(mm.mean() - res.mean()) / gap, float(lo), float(hi)


def tail_decomposition(points: list[Point], unpaired: dict[str, str] | None = None) -> list[Row]:
    """App. D.4 (tab:taildecomp): each resolved-calibration run against the same-seed MinMax and FWM runs of
    its surrogate, K, arithmetic and setting, the FWM run of its tau (resolved keeps FWM's step tau/K and
    origin -tau, App. D.4; MinMax has no tau and joins every tau): each of the three − the same-seed softmax
    (where it was evaluated at their endpoint), MinMax − resolved (untruncated fixed-step calibration
    contrast) and resolved − FWM (tail-policy contrast), per block, one seed each (block bootstrap); the path
    ratio (MinMax − resolved) / (MinMax − FWM) of the means is in ``recovery``, its block-bootstrap interval
    (:func:`path_ratio_ci`) in ``recovery_lo``, ``recovery_hi``. The three runs are taken at their common
    endpoint; one without an evaluation there goes to ``unpaired`` (``ValueError`` when it is None). A tau
    other than the paper's (6) is named in the contrast."""
    runs: dict[tuple, list[Point]] = defaultdict(list)  # every checkpoint of each run
    for p in points:
        s = p.spec
        if p.primary and s.reconstruction == "nearest" and s.calibration in ("minmax", "fwm", "resolved"):
            tau = None if s.calibration == "minmax" else s.tau
            runs[
                (s.calibration, tau, s.surrogate, s.K, s.arithmetic, s.range_grad, p.seed, p.key.setting())
            ].append(p)
    softmax = {(*p.identity, p.tag, p.tokens): p for p in points if p.primary and p.operator == "softmax"}
    rows = []

    def order(kv):  # setting, then Weight-STE before Prob-STE (tab:taildecomp), K ascending
        cal, tau, sur, K, *_, seed, setting = kv[0]
        return (setting, sur != "weight", K or 0, str(kv[0]))

    for (cal, tau, *rest), res_run in sorted(runs.items(), key=order):
        mm_run, fwm_run = runs.get(("minmax", None, *rest)), runs.get(("fwm", tau, *rest))
        if cal != "resolved" or mm_run is None or fwm_run is None:
            continue
        kept = at_endpoint(res_run + mm_run + fwm_run, "the tail decomposition", unpaired)
        by_cal = {p.spec.calibration: p for p in kept}
        if len(by_cal) != 3:
            continue
        mm, res, fwm = by_cal["minmax"], by_cal["resolved"], by_cal["fwm"]
        if not (mm.nll.size == fwm.nll.size == res.nll.size):
            continue
        where = f"{res.spec.surrogate}-STE, K{res.K}" + ("" if tau == DEFAULT_TAU else f", tau={tau:g}")
        soft = softmax.get((res.model, "softmax", res.seed, res.budget, res.data, res.tag, res.tokens))
        for name, p in (("MinMax", mm), ("FWM", fwm), ("resolved", res)):
            if soft is not None and soft.nll.size == p.nll.size:
                d = p.nll - soft.nll
                est = estimate({p.seed: d}, f"{p.run_id} − softmax ({p.tokens} tokens)")
                contrast = f"{name} − softmax ({where})"
                rows.append(Row(contrast, p.key, (p.seed,), est, p.tokens, p.K, p.family, nll=p.mean))
        contrasts = [  # estimated first: a non-finite block is named by its run there
            (name, estimate({res.seed: d}, f"{name} of {res.run_id} ({res.tokens} tokens)"))
            for name, d in (("MinMax − resolved", mm.nll - res.nll), ("resolved − FWM", res.nll - fwm.nll))
        ]
        ratio, lo, hi = path_ratio_ci(mm.nll, res.nll, fwm.nll) or (None, None, None)  # None: undefined
        for name, est in contrasts:
            rows.append(
                Row(
                    f"{name} ({where})",
                    res.key,
                    (res.seed,),
                    est,
                    tokens=res.tokens,
                    K=res.K,
                    family=res.family,
                    recovery=ratio,
                    recovery_lo=lo,
                    recovery_hi=hi,
                )
            )
    return rows
