"""Several paper suites in one report: suites C (1B) and D (124M) on the same WikiText-103 folder are
separate settings (tab:cross, tab:crossfull), a simple factorial effect exists wherever its two cells do
(suites A, C at K16), and the supplementary runs are one row per seed (tab:detach, tab:detachrep, tab:e1,
tab:lowprec, tab:taildecomp), while suite D's five seeds stay pooled (tab:seedend, tab:seedfact)."""

from __future__ import annotations

import json

import pytest
from synthetic_results import write_results

from kinterval.report import analysis as A
from kinterval.report.build import build_report
from kinterval.report.results import load_many, load_results

pytestmark = pytest.mark.xdist_group("suites_together")  # one worker builds the module fixture

HIST = "[arithmetic=historical]"
MM_W4 = f"minmax-weight-k4{HIST}"
K4 = ("softmax", "lerp-k4", MM_W4, f"minmax-prob-k4{HIST}", f"fwm-weight-k4{HIST}", f"fwm-prob-k4{HIST}")


def _planted(mm_w4: float):
    """ΔNLL vs softmax: ``mm_w4`` for MinMax–Weight K4, 0.05 for every other approximate condition."""
    return lambda r, frac: (
        frac * (0.0 if r["operator"] == "softmax" else mm_w4 if r["operator"] == MM_W4 else 0.05)
    )


def _c_and_d(tmp_path, c_runs=None):
    """Suite C (MinMax–Weight K4 at +0.3) and the K4 conditions of suite D (+0.2), both on a data folder
    named ``wt103``: same token budget, same data label, same seed 1337."""
    write_results(tmp_path / "C", "C", _planted(0.3), n_blocks=32, data="wt103", runs=c_runs)
    write_results(
        tmp_path / "D", "D", _planted(0.2), n_blocks=32, data="wt103", runs=lambda r: r["operator"] in K4
    )
    return [tmp_path / "C", tmp_path / "D"]


def test_suites_c_and_d_on_one_data_folder_are_separate_cross_columns(tmp_path):
    build_report(_c_and_d(tmp_path), tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    mm = {r["key"]["model"]: r for r in data["delta"] if r["key"]["operator"] == MM_W4}
    assert len(mm) == 2  # one row per model: C (1B) and D (124M)
    c, d = (next(r for r in mm.values() if len(r["seeds"]) == n) for n in (1, 5))
    assert c["est"]["mean"] == pytest.approx(0.3, abs=5e-3) and c["est"]["interval"] == "block bootstrap"
    assert d["est"]["mean"] == pytest.approx(0.2, abs=5e-3) and d["est"]["interval"] == "t (4 df)"
    cross = data["cross_setting"]
    columns = list(cross["columns"])
    assert len(columns) == 2 and columns[0].startswith("C") and columns[1].startswith("D")
    row = cross["rows"][MM_W4]
    assert row[columns[0]]["est"]["mean"] == pytest.approx(0.3, abs=5e-3)
    assert row[columns[1]]["est"]["mean"] == pytest.approx(0.2, abs=5e-3)
    header = (tmp_path / "rep" / "cross_setting.md").read_text().splitlines()[2]
    assert header.count("ΔNLL [95% CI]") == 2 and "| C: " in header and "| D: " in header
    # the factorial of each suite is its own: C one seed, D five
    inter = [r for r in data["factorial"] if r["K"] == 4 and r["contrast"] == "interaction"]
    assert sorted(len(r["seeds"]) for r in inter) == [1, 5]
    # tab:cross's layout: each factorial contrast a row, one column per suite, beside the condition rows
    name = "interaction (FWM_P − FWM_W) − (MM_P − MM_W), K4"
    by_column = cross["rows"][name]
    assert set(by_column) == set(columns)
    assert sorted(len(r["seeds"]) for r in by_column.values()) == [1, 5]
    for r in inter:
        col = next(c for c in columns if by_column[c]["seeds"] == r["seeds"])
        assert by_column[col]["est"]["mean"] == r["est"]["mean"]
    text = (tmp_path / "rep" / "cross_setting.md").read_text()
    assert f"| {name} |" in text and "| Prob − Weight under MinMax, K4 |" in text


def test_a_run_is_never_paired_with_a_control_of_another_model(tmp_path):
    """C without its softmax run: its conditions have no control (D's seed-1337 softmax is a 124M run)."""
    res = load_many(_c_and_d(tmp_path, c_runs=lambda r: r["operator"] != "softmax"))
    pts = [p for r in res for p in r.points if p.primary]
    pairing = A.softmax_pairs(pts)
    assert all(x.point.model == x.control.model for x in pairing.pairs)
    assert not any(x.point.suite == "C" for x in pairing.pairs)
    # D has a run of that name: the folder's suite names it
    why = pairing.unpaired["C/minmax-weight-k4.arithmetic-historical-s1337 [val] vs softmax"]
    assert "another model" in why and "12L 12H d768" in why
    rows = [r for r in A.delta_table(pairing) if r.key.operator == MM_W4]
    assert [r.seeds for r in rows] == [(7, 42, 253, 1337, 2026)]


def test_simple_effect_without_the_full_design(tmp_path):
    """Suite C has MinMax–Weight and FWM–Weight at K16 and K32 but no Prob-STE there: the Weight-STE simple
    effect (tab:crossfull "FWM − MinMax, Weight-STE, K16") is estimated, the main effects are not."""
    planted = {
        f"minmax-weight-k16{HIST}": 0.08,
        f"fwm-weight-k16{HIST}": 0.02,
        f"minmax-weight-k32{HIST}": 0.05,
    }
    write_results(
        tmp_path / "C", "C", lambda r, f: planted.get(r["operator"], 0.0) * f, n_blocks=32, data="wt"
    )
    rows = A.factorial_effects([p for p in load_results(tmp_path / "C").points if p.primary], {})
    by = {(r.K, r.contrast): r for r in rows}
    assert by[(16, "FWM − MinMax under Weight-STE")].est.mean == pytest.approx(-0.06, abs=5e-3)
    assert by[(32, "FWM − MinMax under Weight-STE")].est.mean == pytest.approx(-0.05, abs=5e-3)
    assert (
        (16, "interaction") not in by
        and (16, "calibration") not in by
        and (16, "Prob − Weight under FWM") not in by
    )
    assert by[(16, "FWM–Weight K16 − LERP K16")].est.interval == "block bootstrap"
    assert {c for K, c in by if K == 4} >= {
        "interaction",
        "calibration",
        "surrogate",
        "FWM − MinMax under Weight-STE",
    }


# The supplementary record, planted per seed as the paper reports it (App. F, tab:detachrep, tab:e1):
DETACH = {7: 0.80, 42: 0.78, 1337: 0.74}  # lerp-k32 detach − full
MAX_ONLY = {7: 0.015, 42: 0.009}  # max_only − full: gap recovery (0.80 - 0.015) / 0.80 = 0.981, 0.988
MIN_ONLY = {7: 0.79, 42: 0.72}
SUPP_D = (*K4, "lerp-k32")  # the suite-D conditions loaded beside it
REF = {
    "lerp-k4": 0.09,
    "lerp-k32": 0.005,
    MM_W4: 0.2,
    f"fwm-weight-k4{HIST}": 0.04,
    f"resolved-weight-k4{HIST}": 0.03,
}


def _supp_effect(r, frac):
    op, s = r["operator"], r["seed"]
    extra = {"detach": DETACH, "max_only": MAX_ONLY, "min_only": MIN_ONLY}
    mode = next((m for m in extra if f"range_grad={m}" in op), None)
    v = (
        REF["lerp-k32"] + extra[mode].get(s, 0.5)
        if op.startswith("lerp-k32[") and mode
        else REF.get(op, 0.01)
    )
    return 0.0 if op == "softmax" else v * frac


@pytest.fixture(scope="module")
def supp_rep(tmp_path_factory):
    """The report folder of suite D's conditions and the supplementary runs."""
    tmp = tmp_path_factory.mktemp("supp")
    kw = dict(n_blocks=64, data="wt103")
    write_results(tmp / "D", "D", _supp_effect, runs=lambda r: r["operator"] in SUPP_D, **kw)
    write_results(tmp / "S", "supplementary", _supp_effect, runs=lambda r: r["tokens"] > 10**7, **kw)
    build_report([tmp / "D", tmp / "S"], tmp / "rep")
    return tmp / "rep"


@pytest.fixture(scope="module")
def supp(supp_rep):
    return json.loads((supp_rep / "report.json").read_text())


def _endpoint(rows, contrast):
    end = max(r["tokens"] for r in rows if r["contrast"] == contrast)
    return {tuple(r["seeds"]): r for r in rows if r["contrast"] == contrast and r["tokens"] == end}


def test_detach_and_single_channel_rows_are_per_seed(supp):
    det = _endpoint(supp["detach"], "lerp-k32[range_grad=detach] − lerp-k32")
    assert sorted(det) == [(7,), (42,), (1337,)]
    for (s,), r in det.items():
        assert r["est"]["interval"] == "block bootstrap" and r["est"]["mean"] == pytest.approx(
            DETACH[s], abs=5e-3
        )
        assert r["key"]["seed"] == s and r["recovery"] == 0.0
    mx = _endpoint(supp["detach"], "lerp-k32[range_grad=max_only] − lerp-k32")
    assert sorted(mx) == [(7,), (42,)]
    for (s,), r in mx.items():  # gap recovery per seed, tab:e1
        assert r["est"]["interval"] == "block bootstrap"
        assert r["recovery"] == pytest.approx((DETACH[s] - MAX_ONLY[s]) / DETACH[s], abs=5e-3)
    vs_det = _endpoint(supp["detach"], "lerp-k32[range_grad=min_only] − lerp-k32[range_grad=detach]")
    assert {s: r["est"]["mean"] for (s,), r in vs_det.items()} == pytest.approx(
        {s: MIN_ONLY[s] - DETACH[s] for s in (7, 42)}, abs=5e-3
    )


def test_supplementary_delta_rows_are_per_seed_and_suite_d_stays_pooled(supp):
    delta = {(r["key"]["operator"], tuple(r["seeds"])): r for r in supp["delta"]}
    for s in (7, 42, 1337):  # tab:detachrep "100M, detach − softmax", tab:detach "historical − softmax"
        r = delta[("lerp-k32[range_grad=detach]", (s,))]
        assert r["est"]["interval"] == "block bootstrap"
        assert r["est"]["mean"] == pytest.approx(REF["lerp-k32"] + DETACH[s], abs=5e-3)
    assert delta[("lerp-k32", (7, 42, 253, 1337, 2026))]["est"]["interval"] == "t (4 df)"
    fac = [r for r in supp["factorial"] if r["K"] == 4 and r["contrast"] == "interaction"]
    assert any(r["est"]["interval"] == "t (4 df)" for r in fac)


def test_same_seed_references_of_the_supplementary_runs(supp):
    """tab:lowprec's seed-7 LERP and MinMax rows, tab:detach's seed-1337 full-gradient rows, tab:taildecomp's
    seed-1337 MinMax / FWM − softmax: the suite-D conditions at one seed, block bootstrap."""
    refs = {(r["key"]["operator"], r["key"]["seed"]): r for r in supp["seed_references"]}
    for op in ("lerp-k4", "lerp-k32", MM_W4):
        for s in (7, 42, 1337):
            r = refs[(op, s)]
            assert r["seeds"] == [s] and r["est"]["interval"] == "block bootstrap"
            assert r["est"]["mean"] == pytest.approx(REF[op], abs=5e-3)
    assert (K4[2], 253) not in refs  # no supplementary run on seed 253
    soft = {r["key"]["seed"]: r for r in supp["softmax"]}
    assert {7, 42, 1337} <= set(soft) and soft[7]["seeds"] == [7]
    tail = {r["contrast"]: r for r in supp["tail_decomposition"]}
    for name, value in (("MinMax", REF[MM_W4]), ("FWM", REF[f"fwm-weight-k4{HIST}"])):
        r = tail[f"{name} − softmax (weight-STE, K4)"]
        assert r["seeds"] == [1337] and r["est"]["mean"] == pytest.approx(value, abs=5e-3)
    assert tail["resolved − softmax (weight-STE, K4)"]["est"]["mean"] == pytest.approx(0.03, abs=5e-3)


def test_seed_references_table_lists_the_softmax_nll_at_each_seed(supp_rep, supp):
    """seed_references.md (tab:lowprec, tab:detach, tab:taildecomp) gives each seed's softmax NLL, no ΔNLL."""
    nll = {r["seeds"][0]: r["nll"] for r in supp["softmax"] if len(r["seeds"]) == 1}
    rows = (supp_rep / "seed_references.md").read_text().splitlines()
    for s in (7, 42, 1337):
        (row,) = [r.split(" | ") for r in rows if r.startswith(f"| softmax, seed {s} | ")]
        assert row[1] == str(s) and float(row[2]) == pytest.approx(nll[s], abs=1e-4) and row[3] == "-"


def test_detach_claim_is_one_entry_per_seed(supp):
    """tab:detach compares seed 1337's detach with its full twin, tab:detachrep seeds 7 and 42 each: the claim
    is checked on each seed's own block-bootstrap row, never on a pool of the lineages."""
    det = [c for c in supp["claims"] if c["claim"] == "LERP K32: detach − full > 0"]
    assert sorted(c["estimate"]["per_seed"][0] for c in det) == pytest.approx(
        sorted(DETACH.values()), abs=5e-3
    )
    assert all(c["estimate"]["interval"] == "block bootstrap" and c["direction_agrees"] for c in det)


TINY = """
name = "{name}"
protocol = "tiny-cpu"
seeds = [7, 42]
checkpoints = 2
{extra}
[overrides]
"model.n_layer" = 1
"model.n_head" = 1
"model.n_embd" = 32
"model.block_size" = 64
"schedule.tokens" = 12_288
"schedule.warmup_tokens" = 2_048
"schedule.micro_batch" = 8

[[group]]
name = "g"
operators = {operators}
"""


@pytest.mark.parametrize("flag", [True, False])
def test_a_suite_file_marked_supplementary_is_one_row_per_seed(tmp_path, flag):
    """``supplementary = true`` in a suite file of another name: its two detach seeds are two rows; without
    it they are a designed seed set (as ``mini`` with ``mini-seeds``), one t row."""
    files = {
        "main": ("", '["softmax", "lerp-k4"]'),
        "extra": ("supplementary = true" if flag else "", '["lerp-k4[range_grad=detach]"]'),
    }
    for name, (extra, ops) in files.items():
        (tmp_path / f"{name}.toml").write_text(TINY.format(name=name, extra=extra, operators=ops))
        eff = 0.3 if name == "extra" else 0.0
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f, e=eff: e * f, data="../d")
    pts = [p for r in load_many([tmp_path / "main", tmp_path / "extra"]) for p in r.points if p.primary]
    det, _ = A.detach_pairs(pts)
    end = [r for r in det if r.tokens == max(x.tokens for x in det)]
    assert sorted(r.seeds for r in end) == ([(7,), (42,)] if flag else [(7, 42)])


@pytest.mark.parametrize("same", [True, False])
def test_other_corpora_under_one_data_folder_name_are_never_paired(tmp_path, same):
    """Two suite folders that each prepared their own ``OUT/data`` (a suite file's ``[data]``): the labels
    agree (folder name, split, T, blocks), the contents (shard hashes) may not. A condition added in a
    folder of its own pairs with the first folder's softmax only when both evaluated the same split."""
    files = {"main": '["softmax", "lerp-k4"]', "added": '["lerp-k8"]'}
    for name, ops in files.items():
        (tmp_path / f"{name}.toml").write_text(TINY.format(name=name, extra="", operators=ops))
        shards = ("a" * 64,) if same or name == "main" else ("b" * 64,)
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f, shards=shards)
    pts = [p for r in load_many([tmp_path / "main", tmp_path / "added"]) for p in r.points if p.primary]
    pairing = A.softmax_pairs(pts)
    added = [x for x in pairing.pairs if x.point.operator == "lerp-k8"]
    if same:
        assert added and not any("lerp-k8" in k for k in pairing.unpaired)
        assert all("#" not in p.data[0] for p in pts)  # one content under the label: no hash in it
    else:
        assert not added
        assert pairing.unpaired["lerp-k8-s7 [val] vs softmax"] == "softmax seed 7 was evaluated on other data"
        assert [x.point.operator for x in pairing.pairs] == ["lerp-k4"] * len(pairing.pairs)


@pytest.mark.parametrize(
    "override, says",
    [(None, None), ('"optim.lr" = 1e-3', "optim.lr=0.001"), ('"schedule.micro_batch" = 16', "steps=12")],
)
def test_a_condition_trained_under_another_protocol_is_never_paired(tmp_path, override, says):
    """A condition added in a folder of its own whose suite file sets another learning rate or batch: same
    model, budget and data as the first folder's softmax, but another training protocol, so no ΔNLL against
    it (it was paired and reported as the operator's cost); the unpaired reason names the field."""
    files = {"main": '["softmax", "lerp-k4"]', "added": '["lerp-k8"]'}
    for name, ops in files.items():
        text = TINY.format(name=name, extra="", operators=ops)
        if override and name == "added":
            key = override.split(" = ")[0]
            text = "\n".join(x for x in text.splitlines() if not x.startswith(key))
            text = text.replace("[overrides]\n", f"[overrides]\n{override}\n")
        (tmp_path / f"{name}.toml").write_text(text)
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f)
    pts = [p for r in load_many([tmp_path / "main", tmp_path / "added"]) for p in r.points if p.primary]
    pairing = A.softmax_pairs(pts)
    added = [x for x in pairing.pairs if x.point.operator == "lerp-k8"]
    if override is None:
        assert added and all(x.point.model == "1L 1H d32" for x in pairing.pairs)
    else:
        assert not added
        why = pairing.unpaired["lerp-k8-s7 [val] vs softmax"]
        assert "another model or protocol" in why and says in why, why
        assert len({x.point.model for x in pairing.pairs}) == 1


@pytest.mark.parametrize(
    "main, added",
    [("", '"optim.grad_clip" = 1'), ('"model.rope_theta" = 10000.0', '"model.rope_theta" = 10000')],
)
def test_a_number_written_as_an_integer_or_a_float_is_one_protocol(tmp_path, main, added):
    """``10000`` and ``10000.0`` (``grad_clip = 1`` against the protocol's ``1.0``) train the same model,
    and a resume takes one for the other; the report compared their JSON text and named the two folders'
    runs apart (``[model.rope_theta=10000]``, ``[model.rope_theta=10000.0]``): never paired or pooled."""
    for name, ops, extra in (("main", '["softmax", "lerp-k4"]', main), ("added", '["lerp-k8"]', added)):
        text = TINY.format(name=name, extra="", operators=ops).replace(
            "[overrides]\n", f"[overrides]\n{extra}\n"
        )
        (tmp_path / f"{name}.toml").write_text(text)
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f)
    pts = [p for r in load_many([tmp_path / "main", tmp_path / "added"]) for p in r.points if p.primary]
    assert len({p.model for p in pts}) == 1 and "[" not in pts[0].model, {p.model for p in pts}
    pairing = A.softmax_pairs(pts)
    assert [x for x in pairing.pairs if x.point.operator == "lerp-k8"]
    assert not any("lerp-k8" in k for k in pairing.unpaired)


def _corpus(name: str) -> dict:
    return {"vocab_size": 50257, "split": "train", "n_tokens": 4096, "shards_sha256": [name * 64]}


@pytest.mark.parametrize("added", ["a", "b", None])
def test_a_condition_trained_on_other_data_is_never_paired(tmp_path, added):
    """Two folders that each trained on their own corpus but evaluated one validation split (same shard
    hashes, same data label): a condition of the second folder pairs with the first folder's softmax only
    when both trained on the same data; an evaluation that records no training data keeps the plain label
    (an older kinterval's) and pairs as before."""
    files = {"main": ('["softmax", "lerp-k4"]', _corpus("a")), "added": ('["lerp-k8"]', None)}
    files["added"] = ('["lerp-k8"]', _corpus(added) if added else None)
    for name, (ops, train) in files.items():
        (tmp_path / f"{name}.toml").write_text(TINY.format(name=name, extra="", operators=ops))
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f, train_data=train)
    results = load_many([tmp_path / "main", tmp_path / "added"])
    pairing = A.softmax_pairs([p for r in results for p in r.points if p.primary])
    paired = [x for x in pairing.pairs if x.point.operator == "lerp-k8"]
    if added == "b":
        assert not paired
        why = pairing.unpaired["lerp-k8-s7 [val] vs softmax"]
        assert "another model or protocol" in why and "[train data#" in why, why
        labels = {r.suite: {p.model for p in r.points} for r in results}
        assert len(labels["main"]) == len(labels["added"]) == 1 and labels["main"] != labels["added"]
    else:
        assert paired and {x.point.model for x in pairing.pairs} == {"1L 1H d32"}


def test_an_evaluation_that_records_no_training_data_keeps_the_plain_model_label(tmp_path):
    """Where one model and budget hold two training corpora, only the evaluations that record theirs get
    ``[train data#<hash>]``; a third folder of an older kinterval (no train_data) keeps the plain label."""
    files = {"main": ('["softmax", "lerp-k4"]', _corpus("a")), "added": ('["lerp-k8"]', _corpus("b"))}
    files["old"] = ('["lerp-k2"]', None)
    for name, (ops, train) in files.items():
        (tmp_path / f"{name}.toml").write_text(TINY.format(name=name, extra="", operators=ops))
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f, train_data=train)
    results = load_many([tmp_path / n for n in files])
    labels = {r.suite: {p.model for p in r.points} for r in results}
    assert all("[train data#" in x for n in ("main", "added") for x in labels[n]), labels
    assert labels["old"] == {"1L 1H d32"}, labels


def test_an_evaluation_without_shard_hashes_keeps_the_plain_data_label(tmp_path):
    """Where two folders' contents differ under one data label, only the evaluations that record their shard
    hashes get ``data#<hash>``; a third folder evaluated before the hashes were recorded keeps the plain
    label (there is no hash of its content to name)."""
    files = {"main": ('["softmax", "lerp-k4"]', ("a" * 64,)), "added": ('["lerp-k8"]', ("b" * 64,))}
    files["old"] = ('["lerp-k2"]', None)
    for name, (ops, shards) in files.items():
        (tmp_path / f"{name}.toml").write_text(TINY.format(name=name, extra="", operators=ops))
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f, shards=shards)
    results = load_many([tmp_path / n for n in files])
    labels = {r.suite: {p.data[0] for p in r.points if p.primary} for r in results}
    assert all("#" in x for n in ("main", "added") for x in labels[n]), labels
    assert all("#" not in x for x in labels["old"]), labels
    # without the added folder only one content is recorded under the label: the plain label for all
    results = load_many([tmp_path / "main", tmp_path / "old"])
    assert all("#" not in p.data[0] for r in results for p in r.points), results


def test_a_run_stopped_before_evaluation_under_another_protocol_is_labelled_apart(tmp_path):
    """A run of the added folder (another learning rate) stopped by a non-finite loss before its first
    checkpoint has no evaluation, only its stopped record: its model label names the protocol field that
    differs, as its evaluated siblings' would, and the first folder's runs are labelled apart from it."""
    files = {"main": '["softmax", "lerp-k4"]', "added": '["lerp-k8"]'}
    for name, ops in files.items():
        text = TINY.format(name=name, extra="", operators=ops)
        if name == "added":
            text = "\n".join(x for x in text.splitlines() if not x.startswith('"optim.lr"'))
            text = text.replace("[overrides]\n", '[overrides]\n"optim.lr" = 1e-3\n')
        (tmp_path / f"{name}.toml").write_text(text)
        stopped = (lambda r: 1) if name == "added" else None
        write_results(tmp_path / name, tmp_path / f"{name}.toml", lambda r, f: 0.02 * f, stopped=stopped)
    results = {r.suite: r for r in load_many([tmp_path / "main", tmp_path / "added"])}
    stopped = results["added"].stopped_unevaluated
    assert stopped and all("[optim.lr=0.001]" in u["model"] for u in stopped.values()), stopped
    assert {p.model for p in results["main"].points} == {"1L 1H d32 [optim.lr=0.003]"}


def test_the_model_label_names_the_attention_options_that_are_set():
    """Runs with grouped-query heads, a softcap or sinks are another model: their label says so, and runs of
    different labels are never paired."""
    from kinterval.report.results import model_label

    small = {"model": {"preset": "small"}}
    assert model_label(small) == "6L 6H d384"
    assert model_label({"model": {"preset": "small", "n_kv_head": 6, "attn_sinks": False}}) == "6L 6H d384"
    both = {"preset": "small", "n_kv_head": 2, "attn_softcap": 30.0, "attn_sinks": True}
    assert model_label({"model": both}) == "6L 6H d384 2KV softcap30 sinks"
    assert model_label({"model": {**both, "rope_theta": 5e5}}) == "6L 6H d384 2KV softcap30 sinks rope500000"
    assert model_label({"model": {"preset": "tiny", "attn_softcap": 2.5}}) == "2L 2H d64 softcap2.5"
    assert model_label({"model": {"preset": "tiny", "rope_theta": 1e4}}) == "2L 2H d64 rope10000"


def test_the_cross_setting_columns_follow_the_papers_order_b_a_c_d(tmp_path):
    """tab:cross's columns are B (124M@250M), A (124M@2.5B), C (1B@100M), D (five seeds): not by name."""
    for suite in ("C", "A", "B"):
        write_results(tmp_path / suite, suite, _planted(0.1), n_blocks=32, runs=lambda r: r["operator"] in K4)
    build_report([tmp_path / s for s in ("A", "B", "C")], tmp_path / "rep")
    columns = list(json.loads((tmp_path / "rep" / "report.json").read_text())["cross_setting"]["columns"])
    assert [c.split(":")[0] for c in columns] == ["B", "A", "C"]
