"""Contrasts from loaded results (paper §4 "Statistics", App. C.3): every number the tables and figures show.

Every run is paired with its same-seed control (softmax, or the full-gradient twin of a modified backward) of
the same model at the same token budget, data, evaluation tag and checkpoint, across all the folders given.
A contrast is computed per validation block and per seed; :func:`estimate` then applies the paper's one rule:
one seed gives a circular block-bootstrap CI over blocks (evaluation sampling only), several seeds the seed
summary (mean of the per-seed contrasts, seed SD, t interval, exact sign-permutation p). Several seeds are
pooled only within a designed seed set (suite D's five seeds, ``mini`` with ``mini-seeds``): a supplementary
run's seeds are replications, not a seed distribution, and each is its own row (``Key.seed``; App. F "a
three-seed pool mixes lineages"). Every table row is a :class:`Row`.

The modules: :mod:`.core` (the one rule, pairing, endpoints, order, BH, ΔNLL vs softmax), :mod:`.factorial`
(the calibration x surrogate factorial and K), :mod:`.detach` (modified backward vs its full twin),
:mod:`.taildecomp` (tail decomposition and path ratio), :mod:`.heldout` (held-out and substituted forwards),
:mod:`.options` (attention options across models),
:mod:`.strict` (tab:strict), :mod:`.ranks` (seed robustness of the ordering), :mod:`.records` (training
logs and diagnostics) and :mod:`.hardware` (training stacks and evaluation devices). Every public name is
importable from here.
"""

from __future__ import annotations

from kinterval.report.analysis.cleanblocks import CleanRow, clean_blocks, read_coverage
from kinterval.report.analysis.core import (
    FAMILY_ORDER,
    MARGIN,
    N_RESAMPLES,
    Estimate,
    Pair,
    Pairing,
    ReferenceRow,
    Row,
    apply_bh,
    at_endpoint,
    condition,
    cross_setting,
    delta_table,
    design_of,
    estimate,
    final,
    final_geometry,
    full_twin,
    geometry_groups,
    key_order,
    note_partial_line,
    operator_order,
    pair_controls,
    seed_references,
    softmax_pairs,
    softmax_rows,
    stopped_runs,
    trajectories,
)

# private helpers, read from here by kinterval.report.claims (A._left_out, A._spec)
from kinterval.report.analysis.core import _left_out as _left_out
from kinterval.report.analysis.core import _spec as _spec
from kinterval.report.analysis.detach import detach_pairs
from kinterval.report.analysis.factorial import (
    FACTORIAL,
    PAPER_DESIGNS,
    SIMPLE_EFFECTS,
    SURROGATE_EFFECTS,
    VS_LERP,
    KPanels,
    factorial_cells,
    factorial_effects,
    k_panels,
    k_trends,
    surrogate_effects,
)
from kinterval.report.analysis.hardware import (
    NOT_RECORDED,
    STACK_FIELDS,
    Hardware,
    HardwareRow,
    hardware,
    process_seconds,
)
from kinterval.report.analysis.heldout import (
    AUDIT,
    SUBSTITUTED,
    HeldoutOrdering,
    heldout_ordering,
    heldout_table,
    split_half,
)
from kinterval.report.analysis.options import OPTION_FIELDS, OptionEffect, option_effects
from kinterval.report.analysis.ranks import (
    RankStats,
    WithinRun,
    rank_statistics,
    ranked_rows,
    within_run_spearman,
)
from kinterval.report.analysis.records import (
    CLIP_TAIL,
    FIT_TAIL,
    GRAD_TERMS,
    ClipRow,
    FitRow,
    GradDecompRow,
    ValidationPair,
    clip_fractions,
    gradient_decomposition,
    train_fit,
    validation_pairs,
)
from kinterval.report.analysis.strict import STRICT_GROUPS, StrictRow, strict_table
from kinterval.report.analysis.taildecomp import path_ratio_ci, tail_decomposition

__all__ = [
    "AUDIT",
    "CLIP_TAIL",
    "CleanRow",
    "ClipRow",
    "Estimate",
    "FACTORIAL",
    "FAMILY_ORDER",
    "FIT_TAIL",
    "GRAD_TERMS",
    "FitRow",
    "GradDecompRow",
    "Hardware",
    "HardwareRow",
    "HeldoutOrdering",
    "KPanels",
    "MARGIN",
    "NOT_RECORDED",
    "N_RESAMPLES",
    "OPTION_FIELDS",
    "OptionEffect",
    "PAPER_DESIGNS",
    "Pair",
    "Pairing",
    "RankStats",
    "ReferenceRow",
    "Row",
    "SIMPLE_EFFECTS",
    "STACK_FIELDS",
    "SUBSTITUTED",
    "STRICT_GROUPS",
    "SURROGATE_EFFECTS",
    "StrictRow",
    "VS_LERP",
    "ValidationPair",
    "WithinRun",
    "apply_bh",
    "at_endpoint",
    "clean_blocks",
    "clip_fractions",
    "condition",
    "cross_setting",
    "delta_table",
    "design_of",
    "detach_pairs",
    "estimate",
    "factorial_cells",
    "factorial_effects",
    "final",
    "final_geometry",
    "geometry_groups",
    "full_twin",
    "gradient_decomposition",
    "hardware",
    "heldout_ordering",
    "heldout_table",
    "k_panels",
    "k_trends",
    "key_order",
    "operator_order",
    "option_effects",
    "pair_controls",
    "path_ratio_ci",
    "rank_statistics",
    "read_coverage",
    "ranked_rows",
    "seed_references",
    "softmax_pairs",
    "softmax_rows",
    "split_half",
    "stopped_runs",
    "strict_table",
    "surrogate_effects",
    "tail_decomposition",
    "train_fit",
    "note_partial_line",
    "trajectories",
    "validation_pairs",
    "within_run_spearman",
    "process_seconds",
]
