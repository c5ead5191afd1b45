"""tau screen statistics: per-condition contrasts against softmax, stage-3 CIs, per-block arrays on disk."""

import re

import numpy as np
import pytest

from kinterval.eval.tau_screen import (
    Stage,
    StageResult,
    contrasts,
    key,
    load_per_block,
    save_per_block,
    stage3_table,
)

PLANTED = {
    (4, 5.0): 0.05,
    (4, 6.0): 0.02,
    (8, 5.0): 0.01,
    (8, 6.0): -0.004,
    (4, "minmax"): 1.0,
    (8, "minmax"): 0.5,
}


def planted_stage(blocks=120):
    """A stage-3 result whose conditions differ from softmax by PLANTED per block (plus small noise)."""
    rng = np.random.default_rng(0)
    res = StageResult(Stage("3", "zero", (4, 8), (5.0, 6.0), None, minmax=True))
    soft = rng.normal(4.3, 0.2, blocks)  # block-to-block spread shared by every condition (paired away)
    res.per_block["softmax"] = soft
    for (K, tau), delta in PLANTED.items():
        res.per_block[key(K, tau)] = soft + delta + rng.normal(0, 0.002, blocks)
    res.nll.update({name: float(v.mean()) for name, v in res.per_block.items()})
    return res


def test_every_condition_gets_a_ci_against_softmax():
    rows = contrasts(planted_stage(), n_resamples=500)
    assert len(rows) == len(PLANTED)
    for r in rows:
        planted = PLANTED[(r["K"], r["tau"])]
        assert r["lo"] < planted < r["hi"] and r["hi"] - r["lo"] < 0.005 and r["n_blocks"] == 120
    res = planted_stage()
    res.per_block.pop("softmax")
    with pytest.raises(ValueError, match="no softmax reference"):
        contrasts(res)


def test_a_short_stage_gets_a_ci_of_half_its_length_blocks():
    """A stage of 10 blocks: block 5 (stats.block_length), not the whole series, whose every circular resample
    is a rotation with the same mean (the old CI had zero width)."""
    rows = contrasts(planted_stage(blocks=10), n_resamples=500)
    for r in rows:
        assert r["hi"] - r["lo"] > 1e-4 and r["lo"] < r["delta"] < r["hi"], r


def test_stage3_table_gives_each_tau_minus_softmax():
    res = planted_stage()
    md, rows = stage3_table(res, n_resamples=500)
    assert res.global_tau() == 6.0 and [r["tau_star"] for r in rows] == [6.0, 6.0]
    for r in rows:
        assert set(r["tau_ci"]) == {5.0, 6.0}
        for tau, c in r["tau_ci"].items():
            assert c["lo"] < PLANTED[(r["K"], tau)] < c["hi"]
        assert r["minmax_ci"]["lo"] < PLANTED[(r["K"], "minmax")] < r["minmax_ci"]["hi"]
        assert (r["delta"], r["lo"], r["hi"]) == tuple(r["tau_ci"][6.0][k] for k in ("delta", "lo", "hi"))
    assert "tau=5 - softmax" in md and len(re.findall(r"\[[+-]", md)) == 2 * (1 + 3)  # tau*; MinMax, 2 taus
    tex, _ = stage3_table(res, n_resamples=500, fmt="tex")
    assert tex.count("\\begin{tabular}") == 2


def test_per_block_arrays_round_trip(tmp_path):
    res = planted_stage(blocks=7)
    path = save_per_block(res, tmp_path / "stage3.npz")
    back = load_per_block(path)
    assert set(back) == set(res.per_block)
    for name, arr in res.per_block.items():
        np.testing.assert_array_equal(back[name], arr)
