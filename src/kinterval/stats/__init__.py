"""kinterval.stats: contrasts, bootstrap and seed-level intervals, permutation p, BH q and rank statistics.

Implements paper §4 "Statistics" and App. C.3 "Contrasts and intervals"; see docs/statistics.md.
"""

from .bootstrap import (
    BootstrapResult,
    block_bootstrap_ci,
    block_length,
    cluster_bootstrap_ci,
    family_bootstrap_ci,
    paired_bootstrap_ci,
)
from .contrasts import (
    FACTORIAL_WEIGHTS,
    Factorial2x2,
    KTrend,
    Labels,
    contrast,
    factorial_2x2,
    k_trend_slopes,
    k_trend_weights,
    label_single_seed,
)
from .ranks import SpearmanResult, kendall_w, pairwise_spearman, spearman
from .seeds import SeedSummary, bh_q, permutation_p_exact, permutation_p_random, seed_summary

__all__ = [
    "FACTORIAL_WEIGHTS",
    "BootstrapResult",
    "Factorial2x2",
    "KTrend",
    "Labels",
    "SeedSummary",
    "SpearmanResult",
    "bh_q",
    "block_bootstrap_ci",
    "block_length",
    "cluster_bootstrap_ci",
    "contrast",
    "factorial_2x2",
    "family_bootstrap_ci",
    "k_trend_slopes",
    "k_trend_weights",
    "kendall_w",
    "label_single_seed",
    "paired_bootstrap_ci",
    "pairwise_spearman",
    "permutation_p_exact",
    "permutation_p_random",
    "seed_summary",
    "spearman",
]
