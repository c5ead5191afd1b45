"""Synthetic probes: deterministic generators, verified structure, scoring, CLI path on a tiny checkpoint."""

import argparse
import hashlib
import json
import re

import numpy as np
import pytest
import torch

from kinterval.eval import probes
from kinterval.eval.probes import EOT, PREFIX
from kinterval.model import GPT, ModelConfig
from kinterval.train.checkpoint import save_checkpoint
from kinterval.train.load import load_run

V = 1000


def test_generators_are_deterministic():
    a1, _ = probes.all_samples(3, V, 1024, seed=5)
    a2, _ = probes.all_samples(3, V, 1024, seed=5)
    b, _ = probes.all_samples(3, V, 1024, seed=6)
    assert [s.tokens for s in a1] == [s.tokens for s in a2]
    assert [s.tokens for s in a1] != [s.tokens for s in b]


def test_probe_c_has_its_own_count_300_per_length():
    """Paper App. C.3: probe C has 300 samples per L, 900 in total, while probe A has 400 families (2,000
    induction samples) and B 2,400 samples; C used to take the families count (400 per L)."""
    samples, skipped = probes.all_samples(400, V, 1024, seed=0)
    count = lambda probe, **kw: sum(  # noqa: E731
        s.probe == probe and all(getattr(s, k) == v for k, v in kw.items()) for s in samples
    )
    assert skipped == {"A": [], "B": [], "C": []}  # every length fits the paper's context of 1024
    assert [count("C", param=L) for L in (32, 64, 128)] == [300, 300, 300] and count("C") == 900
    assert count("A", condition="induction") == 2_000 and count("B") == 2_400
    few, _ = probes.all_samples(2, V, 1024, seed=0, copies=5)
    assert sum(s.probe == "C" for s in few) == 3 * 5


def test_induction_structure_and_skipped_distances():
    samples, skipped = probes.induction_samples(4, V, 300, seed=0)
    assert skipped == [512, 896]  # PREFIX + d + 1 > 300
    by = {(s.family, s.param, s.condition): s for s in samples}
    assert len(by) == 4 * 3 * 2
    for (f, d, cond), s in by.items():
        t = s.tokens
        assert len(t) == PREFIX + d + 2 and s.score_pos == [PREFIX + d]
        a, b = t[PREFIX + d], t[PREFIX + d + 1]
        assert a != b and EOT not in t
        if cond == "induction":
            assert t[PREFIX] == a and t[PREFIX + 1] == b and t.count(a) == 2 and t.count(b) == 2
            assert t[PREFIX + d] == t[PREFIX]  # the A at distance d recurs
        else:
            control = t
            induction = by[(f, d, "induction")].tokens
            assert control.count(a) == 1 and control.count(b) == 1  # no earlier occurrence
            diff = [i for i in range(len(t)) if control[i] != induction[i]]
            assert diff == [PREFIX, PREFIX + 1]  # matched: only the earlier bigram differs
    # one family shares its bigram and filler across distances
    s64, s128 = by[(0, 64, "induction")].tokens, by[(0, 128, "induction")].tokens
    assert s64[:PREFIX] == s128[:PREFIX] and s64[PREFIX] == s128[PREFIX]


def test_retrieval_and_copy_structure():
    samples, skipped = probes.retrieval_samples(3, V, 1024, seed=0)
    assert skipped == [] and len(samples) == 3 * 3 * 2
    for s in samples:
        keys, values = s.tokens[0 : 2 * s.param : 2], s.tokens[1 : 2 * s.param : 2]
        assert len(set(keys)) == s.param and not set(keys) & set(values)
        i = keys.index(s.tokens[-2])
        assert s.tokens[-1] == values[i] and s.score_pos == [2 * s.param]
        q = max(1, s.param // 4)
        assert (i >= s.param - q) if s.condition == "near" else (i < q)
    copies, skipped = probes.copy_samples(3, V, 200, seed=0)
    assert skipped == [128]
    for s in copies:
        L, t = s.param, s.tokens
        sep = t[PREFIX + L]
        assert sep == V - 1 and sep not in t[: PREFIX + L] and t[PREFIX : PREFIX + L] == t[PREFIX + L + 1 :]
        assert s.score_pos == list(range(PREFIX + L, PREFIX + 2 * L))


def test_retrieval_samples_have_independent_bodies():
    """The paper's 2,400 probe-B samples are independent (resampled by sample); a near and a far query of the
    same family and pair count used to share one key-value body."""
    samples, _ = probes.retrieval_samples(50, V, 1024, seed=0)
    by = {(s.family, s.param, s.condition): s.tokens[: 2 * s.param] for s in samples}
    pairs = [(f, n) for f, n, c in by if c == "near"]
    assert len(pairs) == 50 * 3 and all(by[(f, n, "near")] != by[(f, n, "far")] for f, n in pairs)
    assert len({tuple(b) for b in by.values()}) == len(samples)  # no two samples share a body


class InductionStub(torch.nn.Module):
    """Predicts, at each position, the token that followed the previous occurrence of the current token."""

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, V)
        for b in range(B):
            seen = {}
            for i in range(T):
                tok = int(idx[b, i])
                if tok in seen:
                    logits[b, i, int(idx[b, seen[tok] + 1])] = 10.0
                if i + 1 < T:
                    seen[tok] = i
        return logits, None


def test_copying_model_has_positive_induction_gain():
    samples, _ = probes.all_samples(6, V, 300, seed=0, copies=6)
    rows = probes.score(InductionStub(), samples)
    table = probes.summarize(rows, n_resamples=200)
    gain = next(r for r in table if r["metric"] == "gain" and r["param"] == "all")
    assert gain["mean"] > 5 and gain["lo"] > 0 and gain["n"] == 6 * 3
    acc = {(r["probe"], r["condition"], r["param"]): r["mean"] for r in table if r["metric"] == "acc"}
    assert acc[("A", "induction", 64)] == 1.0 and acc[("A", "control", 64)] == 0.0
    assert acc[("B", "near", 16)] == 1.0 and acc[("C", "copy", 32)] > 0.9
    probes_in_order = [r["probe"] for r in table]  # probe A's gain rows print with A, before B and C
    assert probes_in_order == sorted(probes_in_order) and [r["metric"] for r in table].count("gain") == 4


def test_score_is_the_mean_target_nll_and_accuracy_over_every_scored_token():
    """App. C.3: probe C's second copy is scored per token. score() checked against log_softmax by hand on a
    random model, for samples of every probe (C scores L tokens; A and B one, where mean and last agree)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=160, vocab_size=V), "softmax").eval()
    samples, _ = probes.all_samples(2, V, 150, seed=0, copies=2)
    picked = [next(s for s in samples if s.probe == p) for p in "ABC"]
    assert len(picked[2].score_pos) > 1
    for s, row in zip(picked, probes.score(model, picked)):
        seq = torch.tensor([s.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq[:, :-1])[0].double(), -1)[0]
        nll = [-float(logp[p, s.tokens[p + 1]]) for p in s.score_pos]
        hit = [float(int(logp[p].argmax()) == s.tokens[p + 1]) for p in s.score_pos]
        assert row["nll"] == pytest.approx(np.mean(nll), rel=1e-5) and row["n_scored"] == len(nll)
        assert row["acc"] == pytest.approx(np.mean(hit))


def make_run(root, operator="fwm-prob-k4", block=160, vocab=V):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=block, vocab_size=vocab)
    model = GPT(cfg, operator, "closed_form")
    state = {"step": 1, "config": {"operator": {"name": operator, "backend": "closed_form"}},
             "model_config": cfg.to_dict()}  # fmt: skip
    save_checkpoint(root, 1, model.state_dict(), {}, state)
    return root


def test_cli_probes_on_tiny_checkpoint(tmp_path, capsys):
    from kinterval.eval import downstream_commands

    run = make_run(tmp_path / "run")
    parser = argparse.ArgumentParser()
    downstream_commands.register(parser.add_subparsers())
    for op in (None, "softmax"):
        argv = [
            "probes",
            "--run",
            str(run),
            "--families",
            "3",
            "--copies",
            "4",
            "--out",
            str(tmp_path / f"p-{op}"),
        ]
        args = parser.parse_args(argv + (["--operator", op] if op else []))
        assert args.func(args) == 0
    assert "skipped" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "p-None" / "samples.jsonl").read_text().splitlines()]
    assert {r["probe"] for r in rows} == {"A", "B", "C"} and all(np.isfinite(r["nll"]) for r in rows)
    summary = json.loads((tmp_path / "p-None" / "summary.json").read_text())
    assert summary["skipped"]["A"] == [256, 512, 896] and summary["operator"] == "fwm-prob-k4"
    assert summary["backend"] == "closed_form"  # "auto" resolved on the CPU
    assert (summary["families"], summary["copies"]) == (3, 4)
    assert summary["batch_size"] == 1  # the paper scores one sequence per forward (App. C.2)
    assert sum(r["probe"] == "C" for r in rows) == 4 * 2  # L = 32, 64 fit block 160
    out = tmp_path / "compare.json"
    argv = [
        "probes-compare",
        str(tmp_path / "p-softmax"),
        f"native={tmp_path / 'p-None'}",
        "--json",
        str(out),
    ]
    args = parser.parse_args(argv + ["--resamples", "100"])
    assert args.func(args) == 0
    res = json.loads(out.read_text())["native"]
    assert res["operator"] == "fwm-prob-k4" and res["reference_operator"] == "softmax"
    assert {(r["probe"], r["metric"]) for r in res["slopes"]} >= {("A", "nll"), ("A", "gain"), ("C", "nll")}
    delta = next(r for r in res["deltas"] if (r["probe"], r["metric"], r["param"]) == ("C", "nll", 32))
    assert delta["delta"] == pytest.approx(delta["value"] - delta["reference"]) and delta["n"] == 4
    b = [r for r in res["deltas"] if r["probe"] == "B"]
    assert (b[0]["param"], b[0]["condition"], b[0]["n"]) == ("all", "all", 3 * 3 * 2)  # every probe-B sample
    assert "B nll    all all" in capsys.readouterr().out.replace("  tab:probeab", "")
    table = probes.probe_tables(tmp_path / "p-softmax")
    assert table[0]["operator"] == "softmax" and {"probe", "metric", "param", "mean", "lo", "hi"} <= set(
        table[0]
    )


@pytest.mark.parametrize(
    "kw, message",
    [({"families": 0}, "families must be an integer >= 1"), ({"copies": 0}, "copies must be an integer >= 1"),
     ({"batch_size": 0}, "batch_size must be"),
     ({"batch_size": -1}, "batch_size must be"), ({"seed": -1}, "seed must be an integer >= 0")],
)  # fmt: skip
def test_out_of_range_probe_sizes_are_named(tmp_path, kw, message):
    """--families 0 used to write an empty result with exit 0; a batch size < 1 or a negative seed raised
    range()'s or numpy's error."""
    with pytest.raises(ValueError, match=message):
        probes.run_probes(tmp_path / "never-read", out=tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_a_model_too_short_for_every_probe_is_refused_and_an_earlier_output_kept(tmp_path, capsys):
    """Block size 32 skipped every probe: an empty samples.jsonl, exit 0, and a report that aborted on it."""
    from kinterval.cli import main

    run = make_run(tmp_path / "run", block=32)
    out = run / "probes" / "native"
    out.mkdir(parents=True)
    (out / "summary.json").write_text("earlier")
    argv = ["probes", "--run", str(run), "--families", "10", "--copies", "5", "--device", "cpu"]
    assert main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "no probe fits" in err and "block_size 32" in err and "B >= 33 (16 pairs)" in err, err
    need = "probe A needs block_size >= 81 (distance 64), B >= 33 (16 pairs), C >= 80 (length 32)"
    assert need in err, err
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "earlier"
    assert main([*argv, "--out", str(tmp_path / "new")]) == 2 and not (tmp_path / "new").exists()


def test_compare_needs_at_least_one_resample(tmp_path):
    """--resamples 0 was accepted (and only failed, if at all, inside the bootstrap)."""
    with pytest.raises(ValueError, match="n_resamples must be a positive integer, got 0"):
        probes.compare_probes(tmp_path, tmp_path, n_resamples=0)
    with pytest.raises(ValueError, match="n_resamples must be a positive integer, got True"):
        probes.compare_probes(tmp_path, tmp_path, n_resamples=True)


@pytest.mark.parametrize("bad", ["nope"])
def test_missing_checkpoint_is_a_clear_error(tmp_path, bad):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_run(tmp_path / bad)


def planted_rows(seed=0, families=40, block=1024):
    """Reference and condition rows on the same samples with planted condition - reference effects:
    A induction NLL +0.2 log2 d (control 0, so the gain changes by -0.2 log2 d, plus a per-family offset
    shared by every distance); B +1 at every pair count; C +0.5 log2 L - 2."""
    samples, _ = probes.all_samples(families, V, block, seed=seed, copies=families)
    rng = np.random.default_rng(seed)
    fam_offset = rng.normal(0, 0.5, families)
    ref, cond = [], []
    for s in samples:
        base = {"probe": s.probe, "family": s.family, "condition": s.condition, "param": s.param}
        nll = 5 + rng.normal(0, 0.3)
        if s.probe == "A":
            effect = 0.2 * np.log2(s.param) + fam_offset[s.family] if s.condition == "induction" else 0.0
        elif s.probe == "B":
            effect = 1.0
        else:
            effect = 0.5 * np.log2(s.param) - 2
        noisy = effect + rng.normal(0, 0.1)
        ref.append(dict(base, nll=nll, acc=0.0, n_scored=1))
        cond.append(dict(base, nll=nll + noisy, acc=float(s.probe == "B"), n_scored=1))
    return ref, cond


def test_paired_deltas_recover_planted_effects():
    from kinterval.stats import family_bootstrap_ci

    ref, cond = planted_rows()
    rows = probes.paired_deltas(cond, ref, n_resamples=500)
    by = {(r["probe"], r["metric"], r["param"], r["condition"]): r for r in rows}
    c32 = by[("C", "nll", 32, "copy")]
    assert c32["lo"] < 0.5 * 5 - 2 < c32["hi"] and c32["n"] == 40
    assert c32["delta"] == pytest.approx(c32["value"] - c32["reference"])
    b = by[("B", "nll", "all", "far")]
    assert b["lo"] < 1.0 < b["hi"] and b["hi"] - b["lo"] < 0.2
    assert by[("B", "acc", "all", "near")]["delta"] == 1.0
    assert by[("A", "nll", 64, "control")]["delta"] == pytest.approx(0, abs=0.05)
    gain = by[("A", "gain", 128, "control-induction")]
    assert gain["lo"] < -0.2 * 7 < gain["hi"] and gain["n"] == 40
    # probe A resamples whole families: its interval is the family bootstrap of the paired differences
    a = by[("A", "nll", "all", "induction")]
    d = np.array(
        [
            c["nll"] - r["nll"]
            for c, r in zip(cond, ref)
            if c["probe"] == "A" and c["condition"] == "induction"
        ]
    )
    f = [c["family"] for c in cond if c["probe"] == "A" and c["condition"] == "induction"]
    ci = family_bootstrap_ci(d, f, n_resamples=500)
    assert (a["lo"], a["hi"]) == (ci.lo, ci.hi) and a["n"] == 40 * 5


def test_probe_b_pooled_row_is_every_sample_resampled_by_sample():
    """Table tab:probeab gives one probe-B row per condition, n = 2,400 (near and far together, resampled by
    sample); the rows were split by query (near, far), the largest with n = 1,200."""
    from kinterval.stats import paired_bootstrap_ci

    ref, cond = planted_rows(families=400)
    order = lambda r: (r["family"], r["condition"], r["param"])  # noqa: E731  (paired_deltas' sample order)
    b_ref, b_cond = (sorted((r for r in rows if r["probe"] == "B"), key=order) for rows in (ref, cond))
    diffs = np.array([c["nll"] - r["nll"] for c, r in zip(b_cond, b_ref)])
    head = lambda r: (r["metric"], r["param"], r["condition"], r["n"])  # noqa: E731
    deltas = [r for r in probes.paired_deltas(cond, ref, n_resamples=50) if r["probe"] == "B"]
    pooled = deltas[0]  # the table's row leads probe B, the near/far breakdown follows
    assert head(pooled) == ("nll", "all", "all", 2400)
    assert pooled["delta"] == pytest.approx(diffs.mean()) and probes.in_probeab(pooled)
    assert pooled["value"] == pytest.approx(np.mean([c["nll"] for c in b_cond]))
    ci = paired_bootstrap_ci(diffs, n_resamples=50)
    assert (pooled["lo"], pooled["hi"]) == (ci.lo, ci.hi)
    assert head(deltas[1]) == ("acc", "all", "all", 2400)
    assert {r["n"] for r in deltas[2:] if r["param"] == "all"} == {1200}  # near, far: the breakdown
    assert not any(probes.in_probeab(r) for r in deltas[1:] if r["metric"] == "nll")
    table = [r for r in probes.summarize(cond, n_resamples=50) if r["probe"] == "B"]
    assert head(table[0]) == ("nll", "all", "all", 2400) and head(table[1]) == ("acc", "all", "all", 2400)
    assert table[0]["mean"] == pytest.approx(np.mean([c["nll"] for c in b_cond]))
    assert table[0]["lo"] < table[0]["mean"] < table[0]["hi"]


def test_paired_deltas_lead_each_probe_with_the_table_rows_then_pooled_before_per_parameter():
    """docs/downstream.md: rows by probe, the table's rows first, then metric and condition, each pooled row
    (param "all") before its per-parameter rows. Probe A's table row `A nll all induction` came 4th, after
    the per-distance rows of the control."""
    ref, cond = planted_rows(families=40)
    deltas = probes.paired_deltas(cond, ref, n_resamples=20)
    for probe in ("A", "B", "C"):
        rows = [r for r in deltas if r["probe"] == probe]
        marked = [probes.in_probeab(r) for r in rows]
        assert marked == sorted(marked, reverse=True)  # the tab:probeab rows, then the breakdown
        assert any(marked) == (probe != "C")
        key = lambda r: (r["metric"], r["condition"])  # noqa: E731
        for i, r in enumerate(rows):
            if r["param"] == "all":  # no row of its metric and condition before it
                assert not [x for x in rows[:i] if key(x) == key(r)], (probe, key(r))
    a = [(r["metric"], r["param"], r["condition"]) for r in deltas if r["probe"] == "A"][:3]
    assert a == [
        ("nll", "all", "induction"),
        ("gain", "all", "control-induction"),
        ("acc", "all", "induction"),
    ]


def test_delta_slopes_against_log2_length():
    ref, cond = planted_rows()
    slopes = {
        (r["probe"], r["metric"], r["condition"]): r for r in probes.delta_slopes(cond, ref, n_resamples=500)
    }
    c = slopes[("C", "nll", "copy")]
    assert c["params"] == [32, 64, 128] and c["n_families"] == 40 and c["lo"] < 0.5 < c["hi"]
    # the mean of per-family slopes is the least-squares slope over all samples
    x = [np.log2(s["param"]) for s in cond if s["probe"] == "C"]
    y = [a["nll"] - b["nll"] for a, b in zip(cond, ref) if a["probe"] == "C"]
    assert c["slope"] == pytest.approx(np.polyfit(x, y, 1)[0])
    g = slopes[("A", "gain", "control-induction")]
    assert g["params"] == list(probes.DISTANCES) and g["lo"] < -0.2 < g["hi"] and g["hi"] < -0.1
    b = slopes[("B", "nll", "near")]
    assert abs(b["slope"]) < 0.05 and b["hi"] - b["lo"] < 0.1  # no planted trend on B


def test_paired_deltas_refuse_other_samples(tmp_path):
    ref, cond = planted_rows()
    with pytest.raises(ValueError, match="probe C: the samples differ"):
        probes.paired_deltas([r for r in cond if not (r["probe"] == "C" and r["family"] == 3)], ref)
    for name, rows, seed in (("ref", ref, 0), ("cond", cond, 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"operator": name, "seed": seed, "families": 40, "skipped": {"A": [], "B": [], "C": []}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="probe seed differs"):
        probes.compare_probes(tmp_path / "cond", tmp_path / "ref")
    for name, copies in (("ref", 300), ("cond", 40)):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        (tmp_path / name / "summary.json").write_text(json.dumps(dict(summary, seed=0, copies=copies)))
    with pytest.raises(ValueError, match=r"probe copies differs from the reference's \(40 vs 300\)"):
        probes.compare_probes(tmp_path / "cond", tmp_path / "ref")


def test_compare_refuses_runs_that_scored_other_token_sequences(tmp_path):
    """Samples were paired by (probe, family, condition, param) only: a run over a vocabulary of 700 and one
    over 1000 (other token sequences under the same keys) were compared without error."""
    for name, vocab in (("a", 1000), ("b", 700), ("c", 1000)):
        probes.run_probes(make_run(tmp_path / name, "lerp-k4", vocab=vocab), out=tmp_path / f"out-{name}",
                          families=3, copies=3)  # fmt: skip
    out = {name: tmp_path / f"out-{name}" for name in "abc"}
    with pytest.raises(ValueError, match=r"probe vocab_size differs from the reference's \(700 vs 1000\)"):
        probes.compare_probes(out["b"], out["a"], n_resamples=20)
    assert probes.compare_probes(out["c"], out["a"], n_resamples=20)["deltas"]
    summary = json.loads((out["a"] / "summary.json").read_text())
    samples, _ = probes.all_samples(3, 1000, 160, 0, copies=3)
    assert (summary["vocab_size"], summary["samples_sha256"]) == (1000, probes.samples_sha256(samples))
    assert (summary["operator"], summary["native_operator"]) == ("lerp-k4", "lerp-k4")
    path = out["c"] / "summary.json"  # same vocabulary, other sequences (e.g. another generator version)
    summary = json.loads(path.read_text())  # c's own: a's records the sha256 of a's samples.jsonl
    path.write_text(json.dumps(dict(summary, samples_sha256="0" * 64)))
    with pytest.raises(ValueError, match="probe samples_sha256 differs from the reference's"):
        probes.compare_probes(out["c"], out["a"], n_resamples=20)
    path.write_text(json.dumps(dict(summary, batch_size=8)))  # same samples, scored 8 per forward
    with pytest.raises(ValueError, match=r"batch_size .*\(8 vs 1\): not scored alike: rerun"):
        probes.compare_probes(out["c"], out["a"], n_resamples=20)
    path.write_text(json.dumps({k: v for k, v in summary.items() if k != "batch_size"}))  # older: batch 8
    with pytest.raises(ValueError, match=r"batch_size .*\(8 vs 1\): not scored alike: rerun"):
        probes.compare_probes(out["c"], out["a"], n_resamples=20)
    del summary["samples_sha256"]  # a summary written before the hash was recorded
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="out-c/summary.json has no samples_sha256"):
        probes.compare_probes(out["c"], out["a"], n_resamples=20)


def test_drawn_tokens_never_hold_eot_and_a_distance_that_just_fits_is_kept():
    """EOT (50256) is excluded from every random draw (1e6 draws would hold ~20 by chance); distance d fits a
    block of PREFIX + d + 1 tokens (the model input is the sample minus its last token)."""

    assert not (probes._draw(np.random.default_rng(0), 50257, 1_000_000) == probes.EOT).any()
    # a smaller vocabulary's EOT is its last id (the synthetic corpus's), the separator of probe C: it was
    # drawn as a random token there (42 of 240 probe A/B samples held it)
    from kinterval.data.synthetic import EOT as SYNTHETIC_EOT
    from kinterval.data.synthetic import VOCAB_SIZE

    assert probes.eot_of(VOCAB_SIZE) == SYNTHETIC_EOT and probes.eot_of(50257) == probes.EOT
    drawn = probes._draw(np.random.default_rng(0), VOCAB_SIZE, 100_000)
    assert not (drawn == SYNTHETIC_EOT).any() and (drawn == SYNTHETIC_EOT - 1).any()
    a, _ = probes.induction_samples(3, VOCAB_SIZE, 300)
    b, _ = probes.retrieval_samples(3, VOCAB_SIZE, 300)
    assert not any(SYNTHETIC_EOT in s.tokens for s in a + b)
    c, _ = probes.copy_samples(3, VOCAB_SIZE, 300)
    assert all(s.tokens.count(SYNTHETIC_EOT) == 1 for s in c)
    samples, skipped = probes.induction_samples(1, 50257, probes.PREFIX + 64 + 1, distances=(64, 65))
    assert skipped == [65] and {s.param for s in samples} == {64}
    assert all(len(s.tokens) - 1 == probes.PREFIX + 64 + 1 for s in samples)


def test_probes_device_auto_scores_and_records_the_numerics(tmp_path, capsys):
    """`kinterval probes --device auto` died in a RuntimeError traceback: load_run resolved "auto" but
    score() passed the raw string to torch.tensor(device=...) and autocast. --device defaults to auto (as
    eval, geometry and lm-eval), and summary.json records the device and the numerics applied there."""
    from kinterval.cli import build_parser, main
    from kinterval.eval.evaluate import applied_numerics

    run, out = make_run(tmp_path / "run"), tmp_path / "out"
    assert build_parser().parse_args(["probes", "--run", str(run)]).device == "auto"
    argv = ["probes", "--run", str(run), "--families", "1", "--copies", "1", "--device", "auto"]
    assert main(argv + ["--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    want = applied_numerics(ModelConfig().numerics, device)
    assert {k: summary[k] for k in ["device", *want]} == {"device": str(device), **want}
    if device.type == "cpu":
        assert summary["autocast"] == "none" and summary["attention_dtype"] == "float32"
        assert summary["tf32"] is False
    rows = probes.score(load_run(run).model, probes.all_samples(1, V, 160, copies=1)[0][:2], device="auto")
    assert all(np.isfinite(r["nll"]) for r in rows)


def test_probes_compare_refuses_outputs_scored_with_other_numerics(tmp_path, capsys):
    """Two probe outputs, one scored on CUDA under bf16 autocast and one on the CPU, were paired without a
    word. Known differing numerics are refused (exit 2, one line); an older summary without them is
    unknown: two old ones stay comparable, an old one against a new one is compared with a warning."""
    from kinterval.cli import main
    from kinterval.eval.downstream import NumericsUnknownWarning

    run = make_run(tmp_path / "run")
    out = {name: tmp_path / name for name in ("ref", "cond")}
    for folder in out.values():
        probes.run_probes(run, out=folder, families=2, copies=2, device="cpu")
    assert probes.compare_probes(out["cond"], out["ref"], n_resamples=20)["deltas"]
    path = out["cond"] / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps(dict(summary, device="cuda:0", device_type="cuda", autocast="bfloat16")))
    with pytest.raises(ValueError, match=r"different numerics cannot be paired: device_type 'cuda' vs 'cpu', "
                                         r"autocast 'bfloat16' vs 'none' \(.*cond vs .*ref\)"):  # fmt: skip
        probes.compare_probes(out["cond"], out["ref"], n_resamples=20)
    capsys.readouterr()
    assert main(["probes-compare", str(out["ref"]), str(out["cond"]), "--resamples", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: probe outputs scored with different numerics" in err and "\n" not in err
    path.write_text(json.dumps(dict(summary, device="cuda:1")))  # another index of the same kind: the same
    assert probes.compare_probes(out["cond"], out["ref"], n_resamples=20)["deltas"]
    fields = ("device", "device_type", "autocast", "attention_dtype", "tf32", "eval_dot_precision")
    old = {k: v for k, v in summary.items() if k not in fields}  # written before the numerics were recorded
    path.write_text(json.dumps(old))
    with pytest.warns(NumericsUnknownWarning, match="cond: no recorded numerics"):
        assert probes.compare_probes(out["cond"], out["ref"], n_resamples=20)["deltas"]
    assert main(["probes-compare", str(out["ref"]), str(out["cond"]), "--resamples", "20"]) == 0
    assert "kinterval probes-compare: warning: " in capsys.readouterr().err
    (out["ref"] / "summary.json").write_text(json.dumps(old))  # both old: comparable, nothing to warn
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericsUnknownWarning)
        assert probes.compare_probes(out["cond"], out["ref"], n_resamples=20)["deltas"]


def test_a_summary_of_other_samples_is_refused_naming_the_file(tmp_path, monkeypatch):
    """samples.jsonl was rewritten in place and summary.json only after the bootstrap: a rerun cut short in
    between paired new samples with the old summary, and probes-compare accepted it. The old summary now goes
    first and the new one records the sha256 of the samples file; a summary of other samples is refused."""
    ref = tmp_path / "ref"
    probes.run_probes(make_run(tmp_path / "soft", "softmax"), out=ref, families=2, copies=2, device="cpu")
    outs = {}
    for op in ("fwm-prob-k4", "lerp-k4"):
        outs[op] = tmp_path / op
        probes.run_probes(make_run(tmp_path / f"run-{op}", op), out=outs[op], families=2, copies=2,
                          device="cpu")  # fmt: skip
    a, b = outs["fwm-prob-k4"], outs["lerp-k4"]
    summary = json.loads((a / "summary.json").read_text())
    assert probes.compare_probes(b, ref, n_resamples=20)["deltas"]
    (b / "summary.json").write_text(json.dumps(summary))  # a's summary beside b's samples
    with pytest.raises(ValueError, match=r"lerp-k4/samples.jsonl is not the samples file .*lerp-k4/summary"):
        probes.compare_probes(b, ref, n_resamples=20)
    assert summary["samples_jsonl_sha256"] == hashlib.sha256((a / "samples.jsonl").read_bytes()).hexdigest()
    old = {k: v for k, v in summary.items() if k != "samples_jsonl_sha256"}  # written before it was recorded
    (b / "summary.json").write_text(json.dumps(old))
    assert probes.compare_probes(b, ref, n_resamples=20)["deltas"]

    def cut_short(*args, **kwargs):
        raise RuntimeError("killed during the bootstrap")

    monkeypatch.setattr(probes, "summarize", cut_short)
    with pytest.raises(RuntimeError, match="killed"):
        probes.run_probes(make_run(tmp_path / "run-lerp-k4", "lerp-k4"), out=a, families=2, copies=2,
                          device="cpu")  # fmt: skip
    assert not (a / "summary.json").exists()  # a's old summary is not left beside the new samples
    assert sorted(p.name for p in a.iterdir()) == ["samples.jsonl"]  # no temporary files
    with pytest.raises(ValueError, match="is not a `kinterval probes` output"):
        probes.compare_probes(a, ref, n_resamples=20)


@pytest.mark.parametrize("damage", ["torn", "torn-old-summary", "empty", "empty-summary", "not-rows"])
def test_a_torn_probes_output_is_a_one_line_error(tmp_path, capsys, damage):
    """A samples.jsonl or summary.json cut short by a kill (or empty) ended probes-compare in a
    JSONDecodeError traceback (exit 1); now it is one line naming the file, exit 2."""
    from kinterval.cli import main

    run = make_run(tmp_path / "run")
    out = {name: tmp_path / name for name in ("ref", "cond")}
    for folder in out.values():
        probes.run_probes(run, out=folder, families=2, copies=2, device="cpu")
    samples, summary = out["cond"] / "samples.jsonl", out["cond"] / "summary.json"
    data = samples.read_bytes()
    if damage.startswith("torn"):
        samples.write_bytes(data[: len(data) // 2])
        if damage == "torn-old-summary":
            old = {k: v for k, v in json.loads(summary.read_text()).items() if k != "samples_jsonl_sha256"}
            summary.write_text(json.dumps(old))
        want = "line .*: not a JSON record" if damage == "torn-old-summary" else "is not the samples file"
    elif damage == "empty":
        samples.write_bytes(b"")
        want = "is not the samples file"
    elif damage == "empty-summary":
        summary.write_bytes(b"")
        want = "summary.json: not a JSON file"
    else:
        samples.write_text("[1, 2]\n")
        summary.write_text(json.dumps({k: v for k, v in json.loads(summary.read_text()).items()
                                       if k != "samples_jsonl_sha256"}))  # fmt: skip
        want = "line 1: not a probe sample row"
    capsys.readouterr()
    assert main(["probes-compare", str(out["ref"]), str(out["cond"]), "--resamples", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval probes-compare: error: ") and "\n" not in err, err
    assert re.search(want, err) and "cond/" in err, err


@pytest.mark.parametrize("damage", ["row-no-keys", "row-nan", "row-str-nll", "row-list-probe",
                                    "row-bool-family", "summary-list", "summary-no-operator",
                                    "summary-operator-list"])  # fmt: skip
def test_probes_files_of_another_schema_are_one_line_errors(tmp_path, capsys, damage):
    """A sample row without the sample keys ended in KeyError 'probe', a summary that is a JSON list in an
    AttributeError and one without ``operator`` in a KeyError; a row of other types (a list for the probe,
    a string or NaN for the NLL) failed later naming no file. Each is one line naming the file, exit 2."""
    from kinterval.cli import main

    run = make_run(tmp_path / "run")
    out = {name: tmp_path / name for name in ("ref", "cond")}
    for folder in out.values():
        probes.run_probes(run, out=folder, families=2, copies=2, device="cpu")
    samples, summary_path = out["cond"] / "samples.jsonl", out["cond"] / "summary.json"
    summary = {k: v for k, v in json.loads(summary_path.read_text()).items() if k != "samples_jsonl_sha256"}
    row = json.loads(samples.read_text().splitlines()[0])
    edits = {"row-no-keys": {"x": 1}, "row-nan": dict(row, nll=float("nan")),
             "row-str-nll": dict(row, nll="1"), "row-list-probe": dict(row, probe=["A"]),
             "row-bool-family": dict(row, family=True)}  # fmt: skip
    if damage in edits:
        samples.write_text(json.dumps(edits[damage]) + "\n" + samples.read_text())
        want = "samples.jsonl, line 1"
    else:
        no_op = {k: v for k, v in summary.items() if k != "operator"}
        summary = {"summary-list": [summary], "summary-no-operator": no_op,
                   "summary-operator-list": dict(summary, operator=["x"])}[damage]  # fmt: skip
        want = "summary.json: not a `kinterval probes` summary"
    summary_path.write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["probes-compare", str(out["ref"]), str(out["cond"]), "--resamples", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval probes-compare: error: ") and "\n" not in err, err
    assert want in err and "cond/" in err, err


def test_probes_compare_refuses_two_conditions_of_one_name(tmp_path, capsys):
    """``probes-compare REF a=X a=Y`` kept one of the two silently; refused as downstream-compare does."""
    from kinterval.cli import main

    assert main(["probes-compare", "REF", "a=X", "a=Y"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "condition names must be distinct" in err


def _strict_json(text):
    """json.loads that refuses the bare NaN/Infinity Python's json writes by default (invalid JSON)."""

    def refuse(const):
        raise AssertionError(f"not strict JSON: {const}")

    return json.loads(text, parse_constant=refuse)


def test_one_family_gives_no_interval_not_nan():
    """With one family (`--families 1`) or one copy (`--copies 1`) no bootstrap interval can be formed: lo/hi
    were NaN, printed "[+nan, +nan]" and written as bare NaN (invalid JSON). They are None (JSON null,
    printed "-"); the point estimates stay."""
    ref, cond = planted_rows(families=1)
    table = probes.summarize(cond, n_resamples=50)
    pooled_b = [r for r in table if (r["probe"], r["condition"]) == ("B", "all")]  # 6 samples, by sample
    assert all(r["lo"] is not None for r in pooled_b) and len(pooled_b) == 2
    assert all(r["lo"] is None and r["hi"] is None for r in table if r not in pooled_b)
    assert all(np.isfinite(r["mean"]) for r in table)
    a = next(
        r
        for r in table
        if (r["probe"], r["metric"], r["param"], r["condition"]) == ("A", "nll", 64, "induction")
    )
    assert a["mean"] == next(
        c["nll"] for c in cond if (c["probe"], c["param"], c["condition"]) == ("A", 64, "induction")
    )
    _strict_json(json.dumps(table, allow_nan=False))
    deltas = probes.paired_deltas(cond, ref, n_resamples=50)
    by = {(r["probe"], r["metric"], r["param"], r["condition"]): r for r in deltas}
    for key in [
        ("A", "nll", "all", "induction"),
        ("A", "gain", 64, "control-induction"),
        ("B", "nll", 16, "near"),
    ]:
        assert by[key]["lo"] is None and by[key]["hi"] is None and np.isfinite(by[key]["delta"])
    # probe B pools 6 independent samples of the one family: that interval exists
    assert by[("B", "nll", "all", "all")]["lo"] is not None
    _strict_json(json.dumps(deltas, allow_nan=False))
    assert probes.interval_text(None, None) == probes.interval_text(None, None, signed=True) == "-"
    assert probes.interval_text(-0.5, 0.25, signed=True) == "[-0.5000, +0.2500]"
    assert probes.interval_text(0.5, 0.25) == "[0.5000, 0.2500]"
    # probes-compare: an interval that excludes 0 by less than 5e-5 must not read as one that touches it
    assert probes.interval_text(-1e-4, -3e-5, signed=True) == "[-0.0001, -3.0e-05]"


def test_cli_one_family_prints_dash_and_writes_strict_json(tmp_path, capsys):
    from kinterval.cli import main

    run = make_run(tmp_path / "run")
    outs = {op: tmp_path / op for op in ("softmax", "native")}
    for op, out in outs.items():
        argv = ["probes", "--run", str(run), "--families", "1", "--copies", "1", "--device", "cpu"]
        assert main(argv + ["--out", str(out)] + (["--operator", op] if op == "softmax" else [])) == 0
        printed = capsys.readouterr().out
        assert "nan" not in printed.lower() and re.search(
            r"A nll    all induction +\S+ - n=2  tab:probeab", printed
        )
        summary = _strict_json((out / "summary.json").read_text())
        assert all(r["lo"] is None for r in summary["table"] if r["condition"] != "all")
    compare = tmp_path / "compare.json"
    argv = ["probes-compare", str(outs["softmax"]), f"native={outs['native']}", "--resamples", "20"]
    assert main(argv + ["--json", str(compare)]) == 0
    printed = capsys.readouterr().out
    assert "nan" not in printed.lower() and re.search(r"A nll    all induction +[-+]\S+ - n=2", printed)
    deltas = _strict_json(compare.read_text())["native"]["deltas"]
    assert any(r["lo"] is None for r in deltas)


def test_summarize_marks_the_rows_of_table_probeab():
    """Table tab:probeab's softmax row gives absolute probe-A target NLL, induction gain and top-1 over all
    2,000 induction samples, and probe-B target NLL and top-1 over all 2,400: summarize had no pooled probe-A
    target NLL / top-1 row, so `kinterval probes` marked only the gain and probe B."""
    from kinterval.stats import family_bootstrap_ci

    _, cond = planted_rows()
    table = probes.summarize(cond, n_resamples=200)
    want = {("A", "nll", "induction"), ("A", "acc", "induction"), ("A", "gain", "control-induction"),
            ("B", "nll", "all"), ("B", "acc", "all")}  # fmt: skip
    marked = [r for r in table if probes.in_probeab(r)]
    assert sorted((r["probe"], r["metric"], r["condition"]) for r in marked) == sorted(want)
    assert all(r["param"] == "all" for r in marked)
    ind = [c for c in cond if c["probe"] == "A" and c["condition"] == "induction"]
    for metric in ("nll", "acc"):
        (row,) = [r for r in marked if (r["probe"], r["metric"]) == ("A", metric)]
        ci = family_bootstrap_ci([c[metric] for c in ind], [c["family"] for c in ind], n_resamples=200)
        assert (row["mean"], row["lo"], row["hi"], row["n"]) == pytest.approx((ci.mean, ci.lo, ci.hi, 40 * 5))
    # pooled control rows too (as paired_deltas pools them), not in the table; pooled rows lead probe A
    a = [r for r in table if r["probe"] == "A" and r["metric"] != "gain"]
    assert [(r["param"], r["condition"]) for r in a[:4]] == [("all", "control")] * 2 + [
        ("all", "induction")
    ] * 2
    assert [r["param"] for r in a[4:]] == sorted(r["param"] for r in a[4:])  # then by distance
    # the same cells are marked among paired_deltas' rows
    ref, cond = planted_rows()
    marked = [r for r in probes.paired_deltas(cond, ref, n_resamples=20) if probes.in_probeab(r)]
    assert sorted((r["probe"], r["metric"], r["condition"]) for r in marked) == sorted(want)


def test_a_non_finite_score_is_an_error_not_a_nan_in_the_files(tmp_path, monkeypatch):
    """A model whose logits hold NaN gave NaN scores, written as bare NaN into samples.jsonl and summary.json
    (invalid JSON, and a NaN table)."""
    real = probes.score

    def nan_score(*a, **kw):
        rows = real(*a, **kw)
        rows[3]["nll"] = float("nan")
        return rows

    monkeypatch.setattr(probes, "score", nan_score)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"non-finite NLL on a probe sample \(probe A, family 0, condition"):
        probes.run_probes(make_run(tmp_path / "run"), out=out, families=1, copies=1, device="cpu")
    assert not (out / "summary.json").exists() and not (out / "samples.jsonl").exists()


def test_probes_compare_prints_a_small_delta_and_slope_in_two_significant_digits(monkeypatch, capsys):
    """A delta of 3e-5 printed "+0.0000" and a slope interval that excludes 0 "[+0.0000, +0.0001]"."""
    from kinterval.cli import main

    res = {"operator": "fwm-prob-k4", "reference_operator": "softmax",
           "deltas": [{"probe": "B", "metric": "nll", "param": "all", "condition": "all", "delta": 3e-5,
                       "lo": 2e-5, "hi": 1e-4, "n": 6}],
           "slopes": [{"probe": "A", "metric": "nll", "condition": "induction", "params": [16, 64],
                       "slope": -4e-5, "lo": -1e-4, "hi": -2e-5}]}  # fmt: skip
    monkeypatch.setattr(probes, "compare_probes", lambda *a, **k: res)
    assert main(["probes-compare", "ref", "cond"]) == 0
    out = capsys.readouterr().out
    assert "+3.0e-05 [+2.0e-05, +0.0001] n=6" in out
    assert "slope vs log2 [16, 64]: -4.0e-05 [-0.0001, -2.0e-05]" in out


def test_a_pair_count_or_copy_length_that_just_fits_is_kept():
    """Probe B with n pairs feeds the model 2n + 1 tokens, probe C of length L PREFIX + 2L (its last token is
    only a target): a block of exactly that size fits them. Probe C asked for PREFIX + 2L + 1 and skipped a
    length the model could score."""
    samples, skipped = probes.retrieval_samples(1, V, 2 * 16 + 1, n_pairs=(16, 17))
    assert {s.param for s in samples} == {16} and skipped == [17]
    assert max(len(s.tokens) for s in samples) - 1 == 2 * 16 + 1
    samples, skipped = probes.copy_samples(1, V, PREFIX + 2 * 32, lengths=(32, 33))
    assert {s.param for s in samples} == {32} and skipped == [33]
    assert len(samples[0].tokens) - 1 == PREFIX + 2 * 32


def test_probe_tables_refuses_a_summary_without_a_table(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"operator": "lerp-k4", "table": {"A": 1}}))
    with pytest.raises(ValueError, match=r"summary.json: not a `kinterval probes` summary \(no table\)"):
        probes.probe_tables(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"operator": "lerp-k4", "table": [{"probe": "A"}]}))
    assert probes.probe_tables(tmp_path) == [{"probe": "A", "operator": "lerp-k4"}]


def test_compare_refuses_an_output_without_samples_naming_the_block_size(tmp_path):
    """An older output of a model too short for every probe: an empty samples.jsonl gave empty deltas."""
    for name in ("ref", "cond"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "samples.jsonl").write_bytes(b"\n")
        summary = {"operator": name, "block_size": 32, "vocab_size": V, "samples_sha256": "0" * 64}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"ref/samples.jsonl holds no samples .*block_size 32"):
        probes.compare_probes(tmp_path / "cond", tmp_path / "ref", n_resamples=20)


def test_a_run_folder_as_out_is_refused(tmp_path, capsys):
    """``probes --out RUN`` wrote samples.jsonl and summary.json among the run's own files."""
    from kinterval.cli import main

    run = make_run(tmp_path / "run", block=32)
    before = sorted(p.name for p in run.iterdir())
    argv = ["probes", "--run", str(run), "--families", "10", "--copies", "5", "--device", "cpu"]
    assert main([*argv, "--out", str(run)]) == 2
    assert "is a kinterval run folder" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
