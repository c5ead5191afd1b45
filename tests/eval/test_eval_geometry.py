"""Geometry probe on hand-made score rows: every quantity against a direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kinterval.eval.geometry import row_geometry

ROW = [0.0, -1.0, -2.5, -7.0, -3.0, -0.2]


def _softmax(s):
    e = np.exp(np.asarray(s) - max(s))
    return e / e.sum()


def _row(op):
    s = torch.tensor([ROW], dtype=torch.float64)
    return {k: float(v[0]) for k, v in row_geometry(s, torch.ones_like(s, dtype=torch.bool), op).items()}


def test_minmax_nearest_row_against_direct_computation():
    g = _row("minmax-weight-k4")
    span = max(ROW) - min(ROW)
    h = span / 4
    assert g["span"] == pytest.approx(span)
    assert g["h"] == pytest.approx(h)
    # Nearest level of each key on the grid b_l = m - M + l h, weights e^{b_l}.
    z = np.asarray(ROW) - max(ROW)
    levels = np.clip(np.floor((z + span) / h), 0, 3)
    t = (z + span - levels * h) / h
    levels = levels + (t >= 0.5)
    w = np.exp(-span + levels * h)
    pn, pe = w / w.sum(), _softmax(ROW)
    assert g["tv"] == pytest.approx(0.5 * np.abs(pn - pe).sum(), abs=1e-12)
    assert g["top_bucket_mass"] == pytest.approx(pe[levels == 4].sum())
    q = np.array([pe[levels == b].sum() for b in np.unique(levels)])
    assert g["eff_buckets"] == pytest.approx(math.exp(-(q * np.log(q)).sum()))
    assert g["entropy"] == pytest.approx(-(pe * np.log(pe)).sum())
    assert g["frac_z_below_6"] == pytest.approx(1 / 6)
    assert g["z_q001"] == pytest.approx(np.quantile(z, 0.001))


def test_fwm_width_tail_bucket_and_tv():
    g = _row("fwm-prob-k4")  # tau = 6: the key at z = -7 is in the zero tail
    assert g["h"] == pytest.approx(6 / 4)
    z = np.asarray(ROW)
    r = np.clip(np.floor((z + 6) / 1.5), 0, 3)
    t = (np.clip(z, -6, 0) + 6 - r * 1.5) / 1.5
    lev = r + (t >= 0.5)
    w = np.where(z >= -6, np.exp(-6 + lev * 1.5), 0.0)
    pe = _softmax(ROW)
    assert g["tv"] == pytest.approx(0.5 * np.abs(w / w.sum() - pe).sum(), abs=1e-12)
    buckets = [pe[(z >= -6) & (lev == b)].sum() for b in np.unique(lev[z >= -6])] + [pe[z < -6].sum()]
    q = np.array([b for b in buckets if b > 0])
    assert g["eff_buckets"] == pytest.approx(math.exp(-(q * np.log(q)).sum()))


def test_nearest_level_of_a_midpoint_key_rounds_up():
    """MinMax K=4 on [0, -0.5, -4]: h = 1, the key at -0.5 has t = 1/2 exactly and Nearest rounds it up to the
    top level (as the operator does), so the top bucket holds the softmax mass of 0 and -0.5."""
    s = torch.tensor([[0.0, -0.5, -4.0]], dtype=torch.float64)
    g = row_geometry(s, torch.ones_like(s, dtype=torch.bool), "minmax-weight-k4")
    p = _softmax([0.0, -0.5, -4.0])
    assert float(g["top_bucket_mass"][0]) == pytest.approx(p[0] + p[1], rel=1e-12)


@pytest.mark.parametrize("op", ["lerp-k4", "minmax-weight-k4"])
def test_degenerate_minmax_row_is_one_top_bucket(op):
    """A MinMax row of equal scores (span 0) is degenerate: every key gets weight 1 (App. A), the operator
    is exact there, and all the softmax mass is one bucket, the top one."""
    s = torch.tensor([[2.5, 2.5, 2.5]], dtype=torch.float64)
    g = row_geometry(s, torch.ones_like(s, dtype=torch.bool), op)
    assert float(g["top_bucket_mass"][0]) == 1.0
    assert float(g["eff_buckets"][0]) == 1.0 and float(g["tv"][0]) == 0.0


def test_lerp_row_top_bucket_is_the_top_interval():
    g = _row("lerp-k4")
    span = max(ROW) - min(ROW)
    z = np.asarray(ROW) - max(ROW)
    r = np.clip(np.floor((z + span) / (span / 4)), 0, 3)  # interval index; the top interval is r = K - 1
    pe = _softmax(ROW)
    assert g["top_bucket_mass"] == pytest.approx(pe[r == 3].sum()) and 0 < g["top_bucket_mass"] < 1
    q = np.array([pe[r == b].sum() for b in np.unique(r)])
    assert g["eff_buckets"] == pytest.approx(math.exp(-(q * np.log(q)).sum()))


def test_fwm_tail_keys_are_not_in_the_top_interval():
    """FWM at K = 1 (LERP): one interval [-tau, 0], and the keys below -tau are truncated to zero weight; the
    top-bucket mass is the softmax mass of the keys in that interval only, never of the tail, even though a
    tail key's clipped z (-tau) falls on the interval's index r = 0 = K - 1."""
    s = [0.0, -1.0, -7.0, -8.0]  # tau = 6: the last two keys are the tail
    t = torch.tensor([s], dtype=torch.float64)
    g = row_geometry(t, torch.ones_like(t, dtype=torch.bool), "fwm-lerp-k1")
    z = np.asarray(s) - max(s)
    pe = _softmax(s)
    in_interval = (z >= -6.0) & (z <= 0.0)
    want = pe[in_interval].sum()  # (1 + e^-1) / (1 + e^-1 + e^-7 + e^-8)
    assert want == pytest.approx((1 + math.exp(-1)) / (1 + math.exp(-1) + math.exp(-7) + math.exp(-8)))
    assert float(g["top_bucket_mass"][0]) == pytest.approx(want, rel=1e-12)
    assert float(g["top_bucket_mass"][0]) < 1 - 1e-4  # the tail's mass (about 9e-4) is left out
    q = np.array([want, pe[~in_interval].sum()])  # the interval and the tail: two buckets
    assert float(g["eff_buckets"][0]) == pytest.approx(math.exp(-(q * np.log(q)).sum()), rel=1e-12)


def independent_geometry(model, tokens, T, blocks, K, calibration, reconstruction, tau=6.0):
    """Every metric of every layer recomputed in float64 numpy from the layer inputs (own hooks on ln_1), row
    by row: scores q k^T / sqrt(D), rows i >= 1, the grid of App. A, the top interval (LERP) or top level
    (Nearest), the tail as one bucket; App. D.4's tail masses (keys z < -tau) and distinct nonzero levels
    (Nearest). ``resolved`` continues the grid below -tau (negative indices)."""
    inputs = {}
    layers = model.transformer.h
    hooks = [blk.ln_1.register_forward_hook(lambda m, i, o, L=L: inputs.setdefault(L, []).append(o.detach()))
             for L, blk in enumerate(layers)]  # fmt: skip
    with torch.no_grad():
        for b in range(blocks):
            model(torch.from_numpy(tokens[b * T : b * T + T].astype(np.int64))[None])
    for h in hooks:
        h.remove()
    out = []
    for L, blk in enumerate(layers):
        acc = {k: [] for k in ("span", "h", "z_q001", "entropy", "frac_z_below_6", "top_bucket_mass",
                               "eff_buckets", "tv", "q_norm", "k_norm", "tail_mass", "tail_mass_softmax",
                               "levels")}  # fmt: skip
        att = blk.attn
        for x in inputs[L]:
            C, H = x.shape[-1], att.n_head
            D = C // H
            qkv = (x[0].double() @ att.c_attn.weight.double().T + att.c_attn.bias.double()).detach()
            q, k, _ = (a.view(T, H, D).transpose(0, 1).numpy() for a in qkv.split(C, -1))
            S = q @ k.transpose(0, 2, 1) / math.sqrt(D)
            for h in range(H):
                for i in range(1, T):
                    s = S[h, i, : i + 1]
                    M, m = s.max(), s.min()
                    z = s - M
                    pe = np.exp(z) / np.exp(z).sum()
                    if calibration == "minmax":
                        hw, b0, zin, keep = (M - m) / K, m - M, z, np.ones_like(z, bool)
                    elif calibration == "resolved":
                        hw, b0, zin, keep = tau / K, -tau, z, np.ones_like(z, bool)
                    else:
                        hw, b0, zin, keep = tau / K, -tau, np.clip(z, -tau, 0), z >= -tau
                    low = -np.inf if calibration == "resolved" else 0
                    r = np.clip(np.floor((zin - b0) / hw), low, K - 1)
                    t = (zin - b0 - r * hw) / hw
                    if reconstruction == "lerp":
                        w, ids, top = (1 - t) * np.exp(b0 + r * hw) + t * np.exp(b0 + (r + 1) * hw), r, K - 1
                    else:
                        ids = r + (t >= 0.5)
                        w, top = np.exp(b0 + ids * hw), K
                    w = np.where(keep, w, 0.0)
                    q_b = [pe[keep & (ids == b)].sum() for b in np.unique(ids[keep])] + [pe[~keep].sum()]
                    q_b = np.array([x for x in q_b if x > 0])
                    q_b = q_b / q_b.sum()
                    acc["span"].append(M - m)
                    acc["h"].append(hw)
                    acc["z_q001"].append(np.quantile(z, 0.001))
                    acc["entropy"].append(-(pe * np.log(pe)).sum())
                    acc["frac_z_below_6"].append((z < -6).mean())
                    acc["top_bucket_mass"].append(pe[keep & (ids == top)].sum())
                    acc["eff_buckets"].append(math.exp(-(q_b * np.log(q_b)).sum()))
                    acc["tv"].append(0.5 * np.abs(w / w.sum() - pe).sum())
                    acc["q_norm"].append(np.linalg.norm(q[h, i]))
                    acc["k_norm"].append(np.linalg.norm(k[h, i]))
                    acc["tail_mass"].append((w / w.sum())[z < -tau].sum())
                    acc["tail_mass_softmax"].append(pe[z < -tau].sum())
                    nonzero = np.unique(ids[keep & (w > 0)])
                    acc["levels"].append(len(nonzero) if reconstruction == "nearest" else math.nan)
        out.append({k: float(np.mean(v)) for k, v in acc.items()})
    return out


@pytest.mark.parametrize(
    "op, K, calibration, reconstruction",
    [("lerp-k4", 4, "minmax", "lerp"), ("minmax-weight-k4", 4, "minmax", "nearest"),
     ("fwm-prob-k4", 4, "fwm", "nearest"), ("fwm-lerp-k8", 8, "fwm", "lerp"),
     ("resolved-weight-k4", 4, "resolved", "nearest")],
)  # fmt: skip
def test_probe_matches_an_independent_computation_on_every_layer(op, K, calibration, reconstruction):
    """Every metric of every layer (the probe was checked on layer 0's span and h only)."""
    from kinterval.eval.geometry import METRICS, TAIL_METRICS, geometry_probe
    from kinterval.model import GPT, preset

    torch.manual_seed(0)
    T = 16
    model = GPT(
        preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=T), op, "closed_form"
    )
    model.eval()
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(25)  # spans of tens of nats: FWM tails, several buckets in use
    # three blocks in the split, the first two probed
    tokens = np.random.default_rng(1).integers(0, 64, size=3 * T + 1).astype(np.uint16)
    got = geometry_probe(model, tokens, blocks=2)
    want = independent_geometry(model, tokens, T, 2, K, calibration, reconstruction)
    assert len(got["layers"]) == 2 and got["n_blocks"] == 2
    names = METRICS + TAIL_METRICS[: 3 if reconstruction == "nearest" else 2]  # levels: Nearest only
    for L in range(2):
        assert set(got["layers"][L]) == set(names)
        for name in names:
            assert got["layers"][L][name] == pytest.approx(want[L][name], rel=1e-4, abs=1e-7, nan_ok=True), (
                L,
                name,
            )
    for name in names:
        want_mean = np.mean([w[name] for w in want])
        assert got["mean"][name] == pytest.approx(want_mean, rel=1e-4, abs=1e-7, nan_ok=True)
    if calibration != "minmax":
        assert 0 < want[0]["frac_z_below_6"] < 1  # the tail is exercised
        assert (want[0]["tail_mass"] == 0) == (calibration == "fwm") and want[0]["tail_mass_softmax"] > 0
    if reconstruction == "nearest":
        assert want[0]["levels"] > 1


def test_softmax_has_no_operator_quantities_and_short_rows_are_nan():
    g = _row("softmax")
    assert math.isnan(g["h"]) and math.isnan(g["tv"])
    s = torch.tensor([[1.0, 2.0]])
    valid = torch.tensor([[True, False]])
    out = row_geometry(s, valid, "lerp-k4")
    assert math.isnan(float(out["span"][0]))


def test_tv_is_zero_when_operator_is_exact():
    # Scores on the MinMax grid points with LERP reproduce e^z exactly at the grid: TV ~ 0 at K=1 two keys.
    s = torch.tensor([[0.0, -2.0]], dtype=torch.float64)
    g = row_geometry(s, torch.ones_like(s, dtype=torch.bool), "lerp-k1")
    assert float(g["tv"][0]) == pytest.approx(0.0, abs=1e-12)


def test_probe_hooks_recompute_the_layer_scores():
    from kinterval.eval.attention import qkv_scores
    from kinterval.eval.geometry import geometry_probe
    from kinterval.model import GPT, preset

    torch.manual_seed(0)
    model = GPT(
        preset("tiny", vocab_size=32, n_layer=2, n_head=2, n_embd=16, block_size=16),
        "fwm-prob-k4",
        "closed_form",
    ).eval()
    tokens = np.random.default_rng(0).integers(0, 32, size=2 * 16 + 1).astype(np.uint16)
    res = geometry_probe(model, tokens, blocks=2)
    assert len(res["layers"]) == 2 and res["n_blocks"] == 2 and res["operator"] == "fwm-prob-k4"
    with torch.no_grad():
        spans = []
        for b in range(2):
            x = torch.from_numpy(tokens[b * 16 : b * 16 + 16].astype(np.int64))[None]
            h = model.transformer.h[0].ln_1
            e = model.transformer.wte(x) + model.transformer.wpe(torch.arange(16))
            _, _, _, s, valid = qkv_scores(model.transformer.h[0].attn, h(e))
            s = s[..., 1:, :].masked_fill(~valid[..., 1:, :], float("nan"))
            spans.append((np.nanmax(s.numpy(), -1) - np.nanmin(s.numpy(), -1)).ravel())
    assert res["layers"][0]["span"] == pytest.approx(np.concatenate(spans).mean(), rel=1e-5)
    assert res["layers"][0]["h"] == pytest.approx(1.5)


@pytest.mark.parametrize("blocks, n_tokens, message", [(0, 33, "blocks must be"), (-1, 33, "blocks must be"),
                                                       (8, 16, "holds no block of 16")])  # fmt: skip
def test_no_block_to_probe_is_an_error_not_a_nan_row(blocks, n_tokens, message):
    """--blocks 0 or an empty split used to print and write a row of NaN metrics with exit 0."""
    from kinterval.eval.geometry import geometry_probe
    from kinterval.model import GPT, preset

    model = GPT(
        preset("tiny", vocab_size=32, n_layer=1, n_head=2, n_embd=16, block_size=16), "lerp-k4"
    ).eval()
    tokens = np.zeros(n_tokens, dtype=np.uint16)
    with pytest.raises(ValueError, match=message):
        geometry_probe(model, tokens, blocks=blocks)


def test_non_finite_values_are_an_error_naming_the_layer(monkeypatch):
    """Non-finite per-row values were dropped, so a layer's mean came from its finite rows only; NaN scores
    crashed inside the bucket count with an index error."""
    from kinterval.eval import geometry
    from kinterval.model import GPT, preset

    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=32, n_layer=2, n_head=2, n_embd=16, block_size=16)
    model = GPT(cfg, "lerp-k4").eval()
    tokens = np.arange(2 * 16 + 1, dtype=np.uint16) % 32
    clean = geometry.geometry_probe(model, tokens, blocks=2)
    assert all(np.isfinite(v) for layer in clean["layers"] for v in layer.values())
    row_geometry = geometry.row_geometry

    def one_nan_row(s, valid, spec):  # one row of layer 1's TV is NaN
        rows = row_geometry(s, valid, spec)
        if s.shape[-1] == 16 and one_nan_row.calls % 2 == 1:
            rows["tv"][0, 0, 5] = float("nan")
        one_nan_row.calls += 1
        return rows

    one_nan_row.calls = 0
    monkeypatch.setattr(geometry, "row_geometry", one_nan_row)
    with pytest.raises(ValueError, match="geometry: layer 1: tv is NaN or infinite on 1 of"):
        geometry.geometry_probe(model, tokens, blocks=2)
    monkeypatch.undo()
    with torch.no_grad():
        model.transformer.wte.weight[7] = float("nan")  # token 7 sits mid-block: rows i >= 7 see it
    with pytest.raises(ValueError, match="geometry: layer 0: the scores are NaN or infinite"):
        geometry.geometry_probe(model, tokens, blocks=2)
    # a softmax probe has no operator quantities: those stay NaN, not an error
    res = geometry.geometry_probe(GPT(cfg, "softmax").eval(), tokens, blocks=2)
    assert math.isnan(res["mean"]["tv"]) and np.isfinite(res["mean"]["entropy"])


def test_probe_gives_back_train_mode():
    """The probe used to leave a training model in eval mode (dropout off for the rest of training)."""
    from kinterval.eval.geometry import geometry_probe
    from kinterval.model import GPT, preset

    model = GPT(
        preset("tiny", vocab_size=32, n_layer=2, n_head=2, n_embd=16, block_size=16), "lerp-k4"
    ).train()
    tokens = np.random.default_rng(0).integers(0, 32, size=2 * 16 + 1).astype(np.uint16)
    geometry_probe(model, tokens, blocks=2)
    assert model.training and all(m.training for m in model.modules())
    geometry_probe(model.eval(), tokens, blocks=2)
    assert not any(m.training for m in model.modules())


def test_a_probe_spec_sets_the_grid_on_every_layer_of_a_softmax_model():
    """``spec`` is the operator whose grid defines h, buckets and TV (a softmax run has none of its own, e.g.
    the operator one would deploy): every metric of every layer of a softmax model probed with "lerp-k4"
    against the independent computation on that model's own scores."""
    from kinterval.eval.geometry import METRICS, geometry_probe
    from kinterval.model import GPT, preset

    torch.manual_seed(0)
    T = 16
    cfg = preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=T)
    model = GPT(cfg, "softmax", "closed_form").eval()
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(25)
    tokens = np.random.default_rng(1).integers(0, 64, size=3 * T + 1).astype(np.uint16)
    got = geometry_probe(model, tokens, blocks=2, spec="lerp-k4")
    assert got["operator"] == "lerp-k4"
    want = independent_geometry(model, tokens, T, 2, 4, "minmax", "lerp")
    for L in range(2):
        for name in METRICS:
            assert got["layers"][L][name] == pytest.approx(want[L][name], rel=1e-4, abs=1e-7), (L, name)


@pytest.mark.parametrize("op", ["softmax", "fwm-prob-k4", "lerp-k4"])
def test_sink_share_of_a_model_with_attention_sinks(op):
    """With ``attn_sinks`` the probe adds the sink's share of the rows i >= 1, under the operator and under
    softmax, recomputed here from the layer inputs: the scores q k^T / sqrt(D) of row i with the head's sink
    logit as key i + 1."""
    from kinterval.eval.geometry import METRICS, SINK_METRICS, TAIL_METRICS, geometry_probe
    from kinterval.model import GPT, preset
    from kinterval.ops.reference import reference_probs

    torch.manual_seed(0)
    T = 12
    cfg = preset("tiny", vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=T, attn_sinks=True)
    model = GPT(cfg, op, "closed_form").eval()
    with torch.no_grad():
        for blk, sinks in zip(model.transformer.h, ([2.0, -1.0], [0.5, 4.0])):
            blk.attn.c_attn.weight.mul_(10)
            blk.attn.sinks.copy_(torch.tensor(sinks))
    tokens = np.random.default_rng(1).integers(0, 64, size=2 * T + 1).astype(np.uint16)
    got = geometry_probe(model, tokens, blocks=1)
    inputs = []
    hook = model.transformer.h[1].ln_1.register_forward_hook(lambda m, i, o: inputs.append(o.detach()))
    with torch.no_grad():
        model(torch.from_numpy(tokens[:T].astype(np.int64))[None])
    hook.remove()
    att = model.transformer.h[1].attn
    qkv = (inputs[0][0].double() @ att.c_attn.weight.double().T + att.c_attn.bias.double()).detach()
    q, k, _ = (a.view(T, 2, 16).transpose(0, 1) for a in qkv.split(32, -1))
    shares = {"sink_mass": [], "sink_mass_softmax": []}
    for h in range(2):
        for i in range(1, T):
            row = torch.cat([q[h, i] @ k[h, : i + 1].T / 4.0, att.sinks[h : h + 1].double().detach()])
            pe = torch.softmax(row, -1)
            shares["sink_mass_softmax"].append(float(pe[-1]))
            p = reference_probs(
                row[None], torch.ones(1, i + 2, dtype=torch.bool), model.transformer.h[1].attn.operator
            )
            shares["sink_mass"].append(float(p[0, -1]))
    # the tail measures with a grid (levels under Nearest: fwm-prob-k4)
    tail = {"softmax": (), "fwm-prob-k4": TAIL_METRICS, "lerp-k4": TAIL_METRICS[:2]}[op]
    assert set(got["layers"][1]) == set(METRICS) | set(SINK_METRICS) | set(tail)
    for name, values in shares.items():
        assert got["layers"][1][name] == pytest.approx(np.mean(values), rel=1e-4), name
    assert 0 < got["layers"][1]["sink_mass"] < 1
    if op == "softmax":
        assert got["mean"]["sink_mass"] == pytest.approx(got["mean"]["sink_mass_softmax"], rel=1e-12)
    else:
        assert got["mean"]["sink_mass"] != pytest.approx(got["mean"]["sink_mass_softmax"], rel=1e-3)


def test_a_model_without_sinks_has_no_sink_share():
    from kinterval.eval.geometry import METRICS, TAIL_METRICS, geometry_probe
    from kinterval.model import GPT, preset

    model = GPT(preset("tiny", vocab_size=64, n_layer=1, n_embd=32, block_size=8), "lerp-k4", "closed_form")
    tokens = np.random.default_rng(1).integers(0, 64, size=9).astype(np.uint16)
    assert set(geometry_probe(model, tokens, blocks=1)["mean"]) == set(METRICS) | set(TAIL_METRICS[:2])


@pytest.mark.parametrize(
    "op, tail_mass, levels",
    [("fwm-prob-k4", 0.0, 4), ("resolved-weight-k4", math.exp(-6), 5), ("lerp-k4", None, None)],
)  # fmt: skip
def test_tail_mass_and_levels_by_hand(op, tail_mass, levels):
    """App. D.4 on the row z = (0, -1.5, -3, -4.5, -6.5), K = 4, tau = 6 (h = 1.5: four keys on levels 4..1):
    FWM zeroes the tail key (mass 0, four levels); resolved puts it on level 0 (e^-6: five levels); the
    softmax mass of the tail key is e^-6.5 / sum e^z whatever the operator; LERP has no levels."""
    z = torch.tensor([[0.0, -1.5, -3.0, -4.5, -6.5]], dtype=torch.float64)
    g = row_geometry(z, torch.ones_like(z, dtype=torch.bool), op)
    e = np.exp(z[0].numpy())
    assert float(g["tail_mass_softmax"][0]) == pytest.approx(e[-1] / e.sum(), rel=1e-12)
    if tail_mass is not None:
        w = np.append(e[:-1], tail_mass)
        assert float(g["tail_mass"][0]) == pytest.approx(tail_mass / w.sum(), rel=1e-12, abs=0)
        assert float(g["levels"][0]) == levels
    else:
        assert 0 < float(g["tail_mass"][0]) and math.isnan(float(g["levels"][0]))
