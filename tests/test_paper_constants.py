"""Protocol constants of the paper that no other test pins, each at the value the paper states.

A failing assertion here means a default drifted away from the paper's protocol (the audit of 2026-11-28
cross-checked them line by line: benchmarks/results/paper-audit-2026-11-28/NOTES.md).
"""

from __future__ import annotations

import inspect

from kinterval.data.sources import C4_DOCUMENTS
from kinterval.eval import probes
from kinterval.eval.downstream import PAPER_SEED
from kinterval.eval.geometry import geometry_probe
from kinterval.ops.formulas import EPS_DEGENERATE
from kinterval.ops.spec import DEFAULT_TAU
from kinterval.report import analysis
from kinterval.stats import block_bootstrap_ci, seed_summary
from kinterval.stats.bootstrap import BLOCK
from kinterval.stats.seeds import permutation_p_random


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_operator_constants():
    assert DEFAULT_TAU == 6.0  # Table 1 and App. A: FWM tau = 6 nats
    assert EPS_DEGENERATE == 1e-12  # App. A: degenerate MinMax branch M - m <= 1e-12


def test_statistics_constants():
    # §4 and App. C.3: circular moving-block bootstrap, block 16, 4000 resamples, 95% percentile
    assert BLOCK == 16 and _default(block_bootstrap_ci, "block") == 16
    assert _default(block_bootstrap_ci, "n_resamples") == 4000 == analysis.N_RESAMPLES
    assert _default(block_bootstrap_ci, "level") == 0.95 == _default(seed_summary, "level")
    assert analysis.MARGIN == 0.01  # §4: the single-seed caution margin ("separated": lo > +0.01)
    assert _default(permutation_p_random, "n") == 20000  # App. C.3 downstream: permutation p, 20,000
    assert analysis.CLIP_TAIL == 0.6  # App. D: "98% of steps clipped over the last 1.5B tokens" of 2.5B


def test_evaluation_constants():
    assert _default(geometry_probe, "blocks") == 8  # §4 and App. C.3: geometry on 8 validation blocks
    # App. C.3 layer 2: probe A distances 64..896 (5), probe B 16-64 pairs, probe C L in {32, 64, 128},
    # 300 copies per L; 400 families
    assert probes.DISTANCES == (64, 128, 256, 512, 896)
    assert probes.N_PAIRS == (16, 32, 64)
    assert probes.SEGMENT_LENGTHS == (32, 64, 128) and probes.COPIES == 300
    assert _default(probes.run_probes, "families") == 400
    assert PAPER_SEED == 20260920  # App. C.3 layer 3: lm-eval seed
    assert C4_DOCUMENTS == 302  # App. C.3 layer 1: 302 C4 validation documents
