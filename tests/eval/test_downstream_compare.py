"""``downstream-compare``: N conditions against one baseline on synthetic per-item result folders."""

import argparse
import json
import re
import shutil
import warnings

import numpy as np
import pytest
from scipy import stats

from kinterval.eval import downstream, downstream_commands
from kinterval.eval import downstream_compare as compare_module
from kinterval.eval.downstream_compare import downstream_compare

FAST = {"n_resamples": 400, "n_perm": 2000}
# folders without a recorded few-shot count warn; the tests of that warning catch it themselves
pytestmark = pytest.mark.filterwarnings("ignore::kinterval.eval.downstream.FewshotUnknownWarning")


def write(folder, task, values, targets=None):
    """One ``kinterval downstream`` per-item file: ``values`` maps metric -> per-item array."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(values.values())))
    with open(folder / f"{task}.jsonl", "w") as fh:
        for i in range(n):
            rec = {"doc_id": i, "target": targets[i] if targets else str(i % 3)}
            rec["metrics"] = {m: float(v[i]) for m, v in values.items()}
            fh.write(json.dumps(rec) + "\n")


@pytest.fixture
def folders(tmp_path):
    """Baseline plus three conditions with planted effects.

    * task ``qa``, ``acc``: ``big`` flips 120 of 400 wrong items to right (+0.30), ``tiny`` 2, ``same`` 0;
    * task ``lm``, ``nll`` (nats/token): ``big`` +0.05, ``tiny`` +0.001, ``same`` 0 (plus small item noise);
    * BLiMP paradigms ``blimp_a`` (100 pairs) and ``blimp_b`` (50 pairs): ``big`` +0.2 on a and 0 on b, so the
      macro-average difference is 0.1 (the item-pooled mean would be 0.133).
    """
    rng = np.random.default_rng(1)
    acc = np.zeros(400)
    acc[:160] = 1.0  # 40 % right
    nll = rng.normal(4.0, 0.5, 400)
    pa, pb = np.r_[np.ones(50), np.zeros(50)], np.r_[np.ones(25), np.zeros(25)]
    base = tmp_path / "softmax"
    write(base, "qa", {"acc": acc})
    write(base, "lm", {"nll": nll})
    write(base, "blimp_a", {"acc": pa})
    write(base, "blimp_b", {"acc": pb})
    conds = {}
    for name, flips, shift, blimp_flips in (
        ("big", 120, 0.05, 20),
        ("tiny", 2, 0.001, 0),
        ("same", 0, 0.0, 0),
    ):
        folder = tmp_path / name
        a = acc.copy()
        a[160 : 160 + flips] = 1.0
        write(folder, "qa", {"acc": a})
        noise = rng.normal(0, 0.002, 400) if name != "same" else 0.0
        write(folder, "lm", {"nll": nll + shift + noise})
        b = pa.copy()
        b[50 : 50 + blimp_flips] = 1.0
        write(folder, "blimp_a", {"acc": b})
        write(folder, "blimp_b", {"acc": pb})
        conds[name] = folder
    return base, conds


def by_key(rows):
    return {(r["task"], r["metric"], r["condition"]): r for r in rows}


def test_planted_differences_come_back(folders):
    base, conds = folders
    rows = by_key(downstream_compare(base, conds, **FAST))
    big = rows[("qa", "acc", "big")]
    assert big["diff"] == pytest.approx(0.30) and big["lo"] < 0.30 < big["hi"] and big["lo"] > 0.2
    assert big["baseline"] == pytest.approx(0.40) and big["value"] == pytest.approx(0.70)
    assert big["q"] < 0.05 and big["mark"] == "*" and big["detectable"]
    same = rows[("qa", "acc", "same")]
    assert same["diff"] == 0 and same["p"] == 1.0 and same["mark"] == "" and not same["detectable"]
    assert rows[("lm", "nll", "big")]["diff"] == pytest.approx(0.05, abs=3e-4)
    assert rows[("qa", "acc", "tiny")]["n"] == 400


def test_bh_family_is_the_conditions_of_one_task_and_metric(folders):
    base, conds = folders
    rows = downstream_compare(base, conds, **FAST)
    families = {}
    for r in rows:
        families.setdefault((r["task"], r["metric"]), []).append(r)
    assert set(families) == {
        ("qa", "acc"),
        ("lm", "nll"),
        ("blimp_a", "acc"),
        ("blimp_b", "acc"),
        ("blimp", "acc"),
    }
    for fam in families.values():
        assert [r["condition"] for r in fam] == ["big", "tiny", "same"]
        assert all(r["family_size"] == 3 for r in fam)
        want = stats.false_discovery_control([r["p"] for r in fam], method="bh")
        np.testing.assert_allclose([r["q"] for r in fam], want, rtol=1e-12)
    # BH over the whole table (the old family) would give other q values
    pooled = stats.false_discovery_control([r["p"] for r in rows], method="bh")
    assert not np.allclose([r["q"] for r in rows], pooled)


def test_blimp_macro_average_weighs_each_paradigm_once(folders):
    base, conds = folders
    rows = by_key(downstream_compare(base, conds, **FAST))
    macro = rows[("blimp", "acc", "big")]
    assert macro["paradigms"] == 2 and macro["n"] == 150
    assert macro["diff"] == pytest.approx(0.1)  # (0.2 + 0) / 2, not 20/150
    assert macro["baseline"] == pytest.approx(0.5) and macro["value"] == pytest.approx(0.6)
    assert macro["lo"] < 0.1 < macro["hi"]
    assert (
        abs((macro["lo"] + macro["hi"]) / 2 - 0.1) < 0.015
    )  # resampled as the macro mean, not the pooled 0.133
    assert rows[("blimp", "acc", "same")]["diff"] == 0


def test_margin_label_for_nll_metrics_only(folders):
    base, conds = folders
    rows = by_key(downstream_compare(base, conds, **FAST))
    tiny, big = rows[("lm", "nll", "tiny")], rows[("lm", "nll", "big")]
    assert tiny["hi"] < 0.01 and tiny["margin_status"] == "within margin" and tiny["detectable"]
    assert big["lo"] > 0.01 and big["margin_status"] == "not within margin"
    # a wider margin flips the large effect; accuracy metrics never get a margin status
    wide = by_key(downstream_compare(base, conds, margin=0.1, **FAST))
    assert wide[("lm", "nll", "big")]["margin_status"] == "within margin"
    assert rows[("qa", "acc", "tiny")]["margin_status"] is None


def test_nll_metrics_must_name_a_metric_of_the_results(folders):
    """--nll-metrics zzz was taken: no row got a margin label, silently."""
    base, conds = folders
    with pytest.raises(ValueError, match=r"--nll-metrics zzz: no task has that metric \(metrics: \['acc'"):
        downstream_compare(base, conds, nll_metrics=("nll", "zzz"), **FAST)
    rows = by_key(downstream_compare(base, conds, nll_metrics=["nll"], **FAST))  # named, and present
    assert rows[("lm", "nll", "tiny")]["margin_status"] == "within margin"


def test_differing_items_are_refused_naming_the_task(folders, tmp_path):
    base, conds = folders
    short = tmp_path / "short"
    short.mkdir()
    for task in ("qa", "lm", "blimp_a"):
        (short / f"{task}.jsonl").write_text((conds["big"] / f"{task}.jsonl").read_text())
    lines = (conds["big"] / "blimp_b.jsonl").read_text().splitlines()
    (short / "blimp_b.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="task 'blimp_b': item sets differ"):
        downstream_compare(base, {"big": conds["big"], "short": short}, **FAST)
    # same doc_ids, other items
    write(short, "blimp_b", {"acc": np.zeros(50)}, targets=[f"x{i}" for i in range(50)])
    with pytest.raises(ValueError, match="task 'blimp_b': item 0 has target"):
        downstream_compare(base, short, **FAST)
    (short / "blimp_b.jsonl").unlink()
    with pytest.raises(ValueError, match="blimp_b"):
        downstream_compare(base, short, **FAST)


def test_reads_lm_eval_sample_files_and_cli(folders, tmp_path, capsys):
    base, conds = folders
    lm = tmp_path / "lm_eval_out"
    lm.mkdir()
    for task in ("qa", "lm", "blimp_a", "blimp_b"):  # lm-eval --log_samples layout
        with open(lm / f"samples_{task}_2026-11-23T10-00-00.123456.jsonl", "w") as fh:
            for line in (conds["tiny"] / f"{task}.jsonl").read_text().splitlines():
                rec = json.loads(line)
                metrics = rec.pop("metrics")
                sample = dict(rec, **metrics, metrics=list(metrics), filtered_resps=[["-1.5", "False"]])
                fh.write(json.dumps(sample) + "\n")
    parser = argparse.ArgumentParser()
    downstream_commands.register(parser.add_subparsers())
    out = tmp_path / "rows.json"
    argv = ["downstream-compare", str(base), f"tiny={conds['tiny']}", f"lmeval={lm}", "--json", str(out)]
    args = parser.parse_args(argv + ["--resamples", "200", "--permutations", "500"])
    assert args.func(args) == 0
    rows = by_key(json.loads(out.read_text()))
    for task, metric in (("qa", "acc"), ("lm", "nll"), ("blimp", "acc")):
        assert rows[(task, metric, "lmeval")]["diff"] == rows[(task, metric, "tiny")]["diff"]
        assert rows[(task, metric, "lmeval")]["family_size"] == 2
    assert "within margin" in capsys.readouterr().out


def test_a_corrupt_result_line_names_the_file_and_line(folders):
    """A torn or edited per-item line used to end in json's JSONDecodeError traceback."""
    base, conds = folders
    path = conds["big"] / "qa.jsonl"
    path.write_text(path.read_text() + '{"doc_id": \n')
    with pytest.raises(ValueError, match=r"qa.jsonl, line \d+: not a JSON record"):
        downstream_compare(base, conds["big"], **FAST)


def lm_eval_samples(folder, task, samples):
    """An ``lm_eval --log_samples`` file: ``samples`` are (doc_id, filter or None, {metric: value})."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_2026-11-23T10-00-00.123456.jsonl", "w") as fh:
        for doc, filt, metrics in samples:
            rec = {
                "doc_id": doc,
                "target": "x",
                "metrics": list(metrics),
                "filtered_resps": [["-1.5", "False"]],
            }
            fh.write(json.dumps(dict(rec, **metrics, **({"filter": filt} if filt else {}))) + "\n")


def test_a_doc_logged_twice_is_refused_and_filters_are_kept_apart(tmp_path):
    """Items were keyed by doc_id alone: a doc logged twice (lm-eval logs one sample per doc and filter, or
    a concatenated file) kept only its last line, silently."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    lm_eval_samples(base, "gen", [(i, f, {"exact_match": float(f == "a")}) for i in range(6) for f in "ab"])
    lm_eval_samples(cond, "gen", [(i, f, {"exact_match": float(i < 3)}) for i in range(6) for f in "ab"])
    rows = {r["metric"]: r for r in downstream_compare(base, cond, **FAST)}
    assert set(rows) == {"exact_match,a", "exact_match,b"}
    assert (rows["exact_match,a"]["n"], rows["exact_match,a"]["diff"]) == (6, -0.5)
    assert (rows["exact_match,b"]["n"], rows["exact_match,b"]["diff"]) == (6, 0.5)
    lm_eval_samples(cond, "gen", [(i, "a", {"exact_match": 1.0}) for i in (0, 1, 2, 1)])
    with pytest.raises(ValueError, match=r"line 4: doc_id 1 under filter 'a' is logged twice"):
        downstream_compare(base, cond, **FAST)
    write(cond, "qa", {"acc": np.ones(3)})  # kinterval downstream layout, no filter
    (cond / "qa.jsonl").write_text((cond / "qa.jsonl").read_text() * 2)
    with pytest.raises(ValueError, match=r"qa.jsonl, line 4: doc_id 0 is logged twice"):
        downstream_compare(cond, base, **FAST)


def test_per_item_perplexity_is_reported_as_the_loglikelihood_it_is(tmp_path):
    """lm-eval's per-item "perplexity" of a loglikelihood task (LAMBADA) is the target's log-likelihood; the
    row used to be named "perplexity" and showed e.g. -15.25."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    lm_eval_samples(
        base, "lambada_openai", [(i, "none", {"perplexity": -2.0 - i, "acc": 0.0}) for i in range(4)]
    )
    lm_eval_samples(
        cond, "lambada_openai", [(i, "none", {"perplexity": -1.5 - i, "acc": 1.0}) for i in range(4)]
    )
    rows = {r["metric"]: r for r in downstream_compare(base, cond, **FAST)}
    assert set(rows) == {"acc", "loglikelihood"}
    assert (rows["loglikelihood"]["baseline"], rows["loglikelihood"]["diff"]) == (-3.5, 0.5)


def test_blimp_macro_row_tests_and_resamples_the_weighted_mean(tmp_path):
    """blimp_a: 2 items, both +1; blimp_b: 4 items, one -1. Macro diff (1 + -0.25) / 2 = 0.375. The sign-flip
    test of the weighted mean flips w d = (0.5, 0.5, -0.25): |sum| >= 0.75 in 4 of the 8 sign patterns, so
    p = 0.5 (unweighted d = (1, 1, -1) would give p = 1)."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    write(base, "blimp_a", {"acc": [0.0, 0.0]})
    write(base, "blimp_b", {"acc": [1.0, 0.0, 0.0, 0.0]})
    write(cond, "blimp_a", {"acc": [1.0, 1.0]})
    write(cond, "blimp_b", {"acc": [0.0, 0.0, 0.0, 0.0]})
    rows = by_key(downstream_compare(base, cond, n_resamples=2000, n_perm=20000))
    macro = rows[("blimp", "acc", str(cond))]
    assert macro["diff"] == pytest.approx(0.375) and macro["n"] == 6
    assert macro["p"] == pytest.approx(0.5, abs=0.015)


def test_identical_results_get_a_zero_ci_and_the_mark_follows_bh_q():
    """A condition equal to the baseline item by item has CI [0, 0] (within any margin, not detectable); the
    '*' mark needs BH q < 0.05, a CI that excludes zero with q >= 0.05 is '°'."""
    x = np.array([3.0, 4.0, 5.0])
    row = compare_module._paired("lm", "nll", "c", x, x.copy(), None, n_resamples=50, n_perm=50, seed=0)
    assert (row["lo"], row["hi"], row["p"], row["diff"]) == (0.0, 0.0, 1.0, 0.0)
    lab = compare_module._label(dict(row, q=1.0), margin=0.01, nll_metrics=("nll",))
    assert (lab["detectable"], lab["margin_status"], lab["mark"]) == (False, "within margin", "")
    sig = {"metric": "acc", "lo": 0.1, "hi": 0.3, "p": 0.01}
    mark = lambda q: compare_module._label(dict(sig, q=q), margin=0.01, nll_metrics=())["mark"]  # noqa: E731
    assert (mark(0.01), mark(0.2)) == ("*", "°")


def copy_of(folder, dest):
    """A new condition folder holding ``folder``'s result files."""
    shutil.copytree(folder, dest)
    return dest


def test_two_result_files_of_one_task_or_other_metrics_are_refused(folders, tmp_path):
    base, conds = folders
    twice = copy_of(conds["big"], tmp_path / "twice")
    (twice / "samples_qa_2026-11-23T10-00-00.123456.jsonl").write_text((base / "qa.jsonl").read_text())
    with pytest.raises(ValueError, match="task 'qa': more than one result file"):
        downstream_compare(base, twice, **FAST)
    (twice / "samples_qa_2026-11-23T10-00-00.123456.jsonl").unlink()
    write(twice, "lm", {"nll": np.ones(400), "acc": np.ones(400)})
    with pytest.raises(ValueError, match="task 'lm': item 0 has metrics"):
        downstream_compare(base, twice, **FAST)


def test_the_per_item_record_keeps_each_choice_loglikelihood_and_greedy_flag():
    sample = {"doc_id": 3, "target": 1, "metrics": ["acc"], "acc": 1.0,
              "filtered_resps": [[-1.5, False], [-0.5, True]]}  # fmt: skip
    assert downstream._item(sample) == {
        "doc_id": 3,
        "target": 1,
        "metrics": {"acc": 1.0},
        "loglikelihoods": [-1.5, -0.5],
        "is_greedy": [False, True],
    }


# ---------------------------------------------------------------------- mutation audit (cli_glue.md)
def lm_eval_lines(folder, task, records):
    """An ``lm_eval --log_samples`` file of the given sample dicts."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"samples_{task}_2026-11-23T10-00-00.123456.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_rolling_tasks_item_total_is_the_sum_of_its_loglikelihoods(tmp_path):
    """loglikelihood_rolling samples log one number per window; the row is the item total (their sum)."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    for folder, resps in ((base, [-3.0, -2.5]), (cond, [-2.0, -2.5])):
        recs = [{"doc_id": i, "target": "", "metrics": [], "filtered_resps": resps} for i in range(3)]
        lm_eval_lines(folder, "wikitext", recs)
    (row,) = downstream_compare(base, cond, **FAST)
    assert row["metric"] == "loglikelihood" and row["n"] == 3
    assert (row["baseline"], row["value"], row["diff"]) == (-5.5, -4.5, 1.0)


def test_a_doc_with_another_target_under_another_filter_is_refused(tmp_path):
    """Items are never silently merged: one doc_id must keep its target across lm-eval filters."""
    base = tmp_path / "base"
    recs = [{"doc_id": 0, "target": t, "filter": f, "metrics": ["acc"], "acc": 1.0,
             "filtered_resps": [["-1.5", "False"]]} for t, f in (("x", "a"), ("y", "b"))]  # fmt: skip
    lm_eval_lines(base, "gen", recs)
    with pytest.raises(ValueError, match="doc_id 0 has targets 'x' and 'y'"):
        downstream_compare(base, base, **FAST)


def test_a_condition_with_an_extra_task_is_refused(folders, tmp_path):
    base, conds = folders
    extra = copy_of(conds["big"], tmp_path / "extra")
    write(extra, "hellaswag", {"acc": np.ones(4)})
    with pytest.raises(ValueError, match=r"task\(s\) \['hellaswag'\] are in only one of"):
        downstream_compare(base, extra, **FAST)


def test_two_items_give_a_bootstrap_ci_and_one_item_gives_none(tmp_path):
    """The CI needs two items: with d = (1, 1) every resample's mean is 1, so the CI is [1, 1]. A task of one
    item has no CI (None) and no labels, whether or not its item differs."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    write(base, "two", {"acc": [0.0, 0.0]})
    write(cond, "two", {"acc": [1.0, 1.0]})
    write(base, "one", {"acc": [0.0]})
    write(cond, "one", {"acc": [0.0]})
    rows = {r["task"]: r for r in downstream_compare(base, cond, **FAST)}
    two, one = rows["two"], rows["one"]
    assert (two["n"], two["diff"], two["lo"], two["hi"], two["detectable"]) == (2, 1.0, 1.0, 1.0, True)
    assert 0.4 < two["p"] < 0.6  # |sum| >= 2 in 2 of the 4 sign patterns
    assert one["n"] == 1 and one["lo"] is None and one["hi"] is None
    assert (one["detectable"], one["margin_status"], one["mark"]) == (None, None, "")


def test_resamples_and_permutations_reach_their_own_procedures(folders, monkeypatch):
    """``n_resamples`` sizes both bootstraps (the BLiMP macro row's too) and ``n_perm`` the sign flips."""
    import kinterval.stats as S

    seen = []
    for name in ("paired_bootstrap_ci", "cluster_bootstrap_ci", "permutation_p_random"):
        real = getattr(S, name)

        def spy(*a, _real=real, _name=name, **k):
            seen.append((_name, k.get("n_resamples", k.get("n"))))
            return _real(*a, **k)

        monkeypatch.setattr(S, name, spy)
    base, conds = folders
    downstream_compare(base, {"big": conds["big"]}, n_resamples=123, n_perm=456)
    assert {n for name, n in seen if name == "paired_bootstrap_ci"} == {123}
    assert {n for name, n in seen if name == "cluster_bootstrap_ci"} == {123}
    assert {n for name, n in seen if name == "permutation_p_random"} == {456}


def test_the_mark_needs_q_strictly_below_005():
    """docs/downstream.md: ``*`` when q < 0.05, ``°`` when the CI excludes 0 but q >= 0.05."""
    sig = {"metric": "acc", "lo": 0.1, "hi": 0.3, "p": 0.01}
    assert compare_module._label(dict(sig, q=0.05), margin=0.01, nll_metrics=())["mark"] == "°"


def test_blimp_task_next_to_its_paradigms_is_refused(tmp_path):
    base = tmp_path / "base"
    write(base, "blimp_a", {"acc": [1.0, 0.0]})
    write(base, "blimp", {"acc": [1.0, 0.0]})
    with pytest.raises(ValueError, match="task 'blimp' is both a result file and the BLiMP macro"):
        downstream_compare(base, base, **FAST)


def test_blimp_macro_rows_cover_the_metrics_every_paradigm_has(tmp_path):
    """A metric that only some paradigms carry has no mean over the paradigms: no macro row for it."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    for folder, v in ((base, 0.0), (cond, 1.0)):
        write(folder, "blimp_a", {"acc": [v, 0.0]})
        write(folder, "blimp_b", {"acc": [v, 0.0], "acc_norm": [v, 1.0]})
    rows = downstream_compare(base, cond, **FAST)
    assert sorted(r["metric"] for r in rows if r["task"] == "blimp") == ["acc"]


def test_missing_or_empty_result_folders_and_no_condition_are_named_errors(folders, tmp_path):
    base, conds = folders
    with pytest.raises(ValueError, match="nowhere does not exist"):
        downstream_compare(base, tmp_path / "nowhere", **FAST)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no per-item result files \(\*.jsonl\) in .*empty"):
        downstream_compare(base, tmp_path / "empty", **FAST)
    # lm_eval --output_path OUT writes into OUT/<model name>/: the error names that folder
    inner = tmp_path / "lme" / "my__model"
    inner.mkdir(parents=True)
    (inner / "samples_piqa_2026-01-01T00-00-00.000000.jsonl").write_text("")
    with pytest.raises(
        ValueError, match=rf"lm-eval wrote its files one level down: pass {re.escape(str(inner))}$"
    ):
        downstream_compare(base, tmp_path / "lme", **FAST)
    with pytest.raises(ValueError, match="needs at least one condition"):
        downstream_compare(base, {}, **FAST)


def parse(argv):
    parser = argparse.ArgumentParser()
    downstream_commands.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_compare_cli_wires_each_flag_and_documents_its_defaults(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(
        downstream_commands, "downstream_compare", lambda b, c, **k: seen.update(k, c=c) or []
    )
    args = parse(["downstream-compare", "B", "c1", "x=c2"])
    assert args.func(args) == 0  # the help's defaults: margin 0.01, nll, 4000 resamples, 20000 flips, seed 0
    assert seen == {"margin": 0.01, "nll_metrics": ["nll"], "n_resamples": 4000, "n_perm": 20000, "seed": 0,
                    "task_differences": [], "groups": None, "c": {"c1": "c1", "x": "c2"}}  # fmt: skip
    args = parse(["downstream-compare", "B", "c1", "--margin", "0.05", "--nll-metrics", "nll", "ppl",
                  "--resamples", "11", "--permutations", "22", "--seed", "3"])  # fmt: skip
    assert args.func(args) == 0
    assert (seen["margin"], seen["nll_metrics"]) == (0.05, ["nll", "ppl"])
    assert (seen["n_resamples"], seen["n_perm"], seen["seed"]) == (11, 22, 3)


def test_compare_cli_refuses_repeated_names_and_an_empty_name(folders, tmp_path):
    base, conds = folders
    args = parse(["downstream-compare", str(base), f"a={conds['big']}", f"a={conds['tiny']}"])
    with pytest.raises(ValueError, match="condition names must be distinct"):
        args.func(args)
    args = parse(["downstream-compare", str(base), f"={conds['big']}"])  # not NAME=PATH: a path, missing
    with pytest.raises(ValueError, match="does not exist"):
        args.func(args)


def test_downstream_and_probes_write_to_run_command_operator_by_default(monkeypatch, tmp_path, capsys):
    """--out defaults to RUN/downstream/<operator|native> and RUN/probes/<operator|native>; --checkpoint is
    passed through."""
    from kinterval.eval import probes

    seen = {}
    summary = {"results": {}, "table": [], "skipped": {}, "block_size": 8}
    fake = lambda *a, **k: seen.update(k) or summary  # noqa: E731
    monkeypatch.setattr(downstream_commands, "run_downstream", fake)
    monkeypatch.setattr(probes, "run_probes", fake)
    run = tmp_path / "run"
    args = parse(["downstream", "--run", str(run), "--tasks", "a,b", "--checkpoint", "4"])
    assert args.func(args) == 0 and (seen["out"], seen["checkpoint"]) == (
        str(run / "downstream" / "native"),
        "4",
    )
    args = parse(["downstream", "--run", str(run), "--tasks", "a", "--operator", "softmax"])
    assert args.func(args) == 0 and seen["out"] == str(run / "downstream" / "softmax")
    args = parse(["probes", "--run", str(run)])
    assert args.func(args) == 0 and seen["out"] == str(run / "probes" / "native")
    # --run given as a checkpoint folder: the run's folder, as eval and geometry write (it wrote inside the
    # checkpoint, where report and results-only copies never look)
    ck = run / "checkpoints" / "step_000004"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    args = parse(["probes", "--run", str(ck)])
    assert args.func(args) == 0 and seen["out"] == str(run / "probes" / "native")
    args = parse(["downstream", "--run", str(ck), "--tasks", "a"])
    assert args.func(args) == 0 and seen["out"] == str(run / "downstream" / "native")


def test_probes_compare_cli_passes_resamples_and_seed(monkeypatch, tmp_path):
    from kinterval.eval import probes

    seen = []
    res = {"operator": "o", "reference_operator": "softmax", "deltas": [], "slopes": []}
    monkeypatch.setattr(probes, "compare_probes", lambda *a, **k: seen.append((a, k)) or res)
    args = parse(["probes-compare", "REF", "c=X", "--resamples", "7", "--seed", "5"])
    assert args.func(args) == 0 and seen == [(("X", "REF"), {"n_resamples": 7, "seed": 5})]


def test_a_folder_of_other_records_is_a_named_error_not_a_key_error(folders, tmp_path, capsys):
    """A probes folder (samples.jsonl: probe, family, nll, ...) given to downstream-compare, or an lm-eval
    sample without doc_id, ended in a KeyError traceback."""
    from kinterval.cli import main

    base, conds = folders
    probes_out = tmp_path / "probes"
    probes_out.mkdir()
    (probes_out / "samples.jsonl").write_text(json.dumps({"probe": "A", "family": 0, "nll": 1.0}) + "\n")
    assert main(["downstream-compare", str(base), str(probes_out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "samples.jsonl, line 1: not a per-item result record" in err and "\n" not in err
    for rec in ({"target": "x", "metrics": ["acc"], "acc": 1.0, "filtered_resps": []}, [1, 2]):
        lm_eval_lines(tmp_path / "odd", "qa", [rec])
        with pytest.raises(ValueError, match=r"line 1: not a per-item result record \(no doc_id\)"):
            downstream_compare(tmp_path / "odd", tmp_path / "odd", **FAST)
    (tmp_path / "odd" / "samples_qa_2026-11-23T10-00-00.123456.jsonl").write_text('{"doc_id": 0}\n')
    with pytest.raises(ValueError, match=r"line 1: not a per-item result record \(no metrics\)"):
        downstream_compare(tmp_path / "odd", tmp_path / "odd", **FAST)


def test_printed_table_keeps_long_names_apart():
    """A metric of 12 characters or more ran into the condition: 'loglikelihoodmmw-k4'."""
    from kinterval.eval.downstream_compare import format_compare

    row = {"task": "a_task_name_longer_than_24", "metric": "loglikelihood",
           "condition": "a-condition-over-20-chars", "n": 4, "baseline": -21.7925, "value": -21.7924,
           "diff": 1e-4, "lo": -3e-4, "hi": 6e-4, "p": 0.75, "q": 0.75, "mark": "",
           "margin_status": None}  # fmt: skip
    head, _, line = format_compare([row]).splitlines()
    assert line.split()[:3] == [row["task"], "loglikelihood", row["condition"]]
    assert head.index("metric") == line.index("loglikelihood")
    assert head.index("condition") == line.index("a-cond")


def test_lm_evals_own_log_samples_files_with_string_responses(tmp_path):
    """lm-eval writes filtered_resps as strings: a rolling task's ["-335.2"] gave its items no metric, and
    the task vanished from the comparison; "False" read as greedy (bool("False") is True)."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    for folder, resps in ((base, ["-3.0", "-2.5"]), (cond, ["-2.0", "-2.5"])):
        recs = [{"doc_id": i, "target": "", "metrics": ["word_perplexity"], "word_perplexity": [-5.5, 10],
                 "filtered_resps": resps} for i in range(3)]  # fmt: skip
        lm_eval_lines(folder, "wikitext", recs)
    (row,) = downstream_compare(base, cond, **FAST)
    assert (row["metric"], row["n"], row["baseline"], row["value"]) == ("loglikelihood", 3, -5.5, -4.5)
    from kinterval.eval.downstream import _item

    rec = _item({"doc_id": 0, "filtered_resps": [["-1.5", "False"], ["-0.5", "True"]]})
    assert rec["loglikelihoods"] == [-1.5, -0.5] and rec["is_greedy"] == [False, True]
    assert _item({"doc_id": 0, "filtered_resps": ["a generated answer"]})["responses"] == [
        "a generated answer"
    ]


def numerics_record(device_type="cpu", autocast="none"):
    """A results.json of `kinterval downstream` with the numerics fields it records."""
    return {"seed": 20260920, "batch_size": 1, "device": device_type, "device_type": device_type,
            "autocast": autocast, "attention_dtype": "float32", "tf32": False,
            "eval_dot_precision": "ieee", "results": {}}  # fmt: skip


def test_downstream_compare_refuses_results_scored_with_other_numerics(folders, tmp_path, capsys):
    """A condition scored on CUDA under bf16 autocast and a baseline scored on the CPU were paired without a
    word. Known differing numerics are refused (exit 2, one line); a folder without them (lm-eval's own
    output, or a results.json written before they were recorded) is unknown: such folders stay comparable
    among themselves, and against folders that record numerics they are compared with a warning."""
    import warnings

    from kinterval.cli import main
    from kinterval.eval.downstream import NumericsUnknownWarning

    base, conds = folders
    for folder, dev in ((base, "cpu"), (conds["tiny"], "cpu"), (conds["big"], "cuda")):
        rec = numerics_record(dev, "bfloat16" if dev == "cuda" else "none")
        (folder / "results.json").write_text(json.dumps(rec))
    message = r"numerics cannot be paired: device_type 'cpu' vs 'cuda', autocast 'none' vs 'bfloat16'"
    with pytest.raises(ValueError, match=message + r" \(.*softmax vs big\)"):
        downstream_compare(base, {"tiny": conds["tiny"], "big": conds["big"]}, **FAST)
    assert main(["downstream-compare", str(base), f"big={conds['big']}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: downstream results scored with different numerics" in err and "\n" not in err
    rec = numerics_record("cuda", "bfloat16")  # two conditions that differ from each other, baseline unknown
    (base / "results.json").unlink()
    with pytest.raises(ValueError, match=r"different numerics .*\(tiny vs big\)"):
        downstream_compare(base, {"tiny": conds["tiny"], "big": conds["big"]}, **FAST)
    (base / "results.json").write_text(json.dumps(rec))
    (conds["tiny"] / "results.json").write_text(json.dumps(dict(rec, device="cuda:1")))  # same kind: fine
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericsUnknownWarning)
        assert downstream_compare(base, {"tiny": conds["tiny"], "big": conds["big"]}, **FAST)
    old = {k: v for k, v in rec.items() if k in ("seed", "batch_size", "results")}
    (conds["big"] / "results.json").write_text(json.dumps(old))  # written before the numerics were recorded
    with pytest.warns(NumericsUnknownWarning, match="big: no recorded numerics"):
        assert downstream_compare(base, {"tiny": conds["tiny"], "big": conds["big"]}, **FAST)
    assert main(["downstream-compare", str(base), str(conds["same"]), "--resamples", "50",
                 "--permutations", "50"]) == 0  # fmt: skip
    assert "kinterval downstream-compare: warning: " in capsys.readouterr().err
    for folder in (base, conds["tiny"]):
        (folder / "results.json").write_text(json.dumps(old))
    with warnings.catch_warnings():  # old folders among themselves: comparable, nothing to warn about
        warnings.simplefilter("error", NumericsUnknownWarning)
        assert downstream_compare(base, {"tiny": conds["tiny"], "big": conds["big"]}, **FAST)
    (base / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="results.json: not a JSON file"):
        downstream_compare(base, conds["tiny"], **FAST)


def test_numerics_fields_are_the_evaluation_summarys():
    """The compared fields are those kinterval.eval.evaluate.applied_numerics records."""
    import torch

    from kinterval.eval.evaluate import applied_numerics
    from kinterval.model import ModelConfig

    got = applied_numerics(ModelConfig().numerics, torch.device("cpu"))
    assert set(downstream_commands.NUMERICS_FIELDS) == set(got)


class _Tasks:  # lm-eval's TaskManager walks every task YAML (10-20 s): not needed here
    def __init__(self, *a, **k):
        pass

    def match_tasks(self, names):
        return names


def test_downstream_device_defaults_to_auto_and_results_record_the_numerics(
    monkeypatch, tmp_path, softmax_run
):
    """`kinterval downstream --device` defaulted to cpu (eval, geometry, probes and lm-eval: auto), so on a
    GPU machine the battery ran without the paper's numerics; results.json did not say which were used."""
    pytest.importorskip("lm_eval")
    import lm_eval
    import lm_eval.tasks
    import torch

    from kinterval.eval.evaluate import applied_numerics

    cfg = softmax_run(50257)

    seen = {}
    sample = {"doc_id": 0, "target": "1", "metrics": ["acc"], "acc": 1.0, "filtered_resps": [[-1.0, True]]}

    def evaluate(model, **kw):
        seen["device"] = model._device
        return {"samples": {"t": [sample]}, "results": {"t": {"acc,none": 1.0}}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", _Tasks)
    args = parse(["downstream", "--run", str(tmp_path / "run"), "--tasks", "t", "--out", str(tmp_path / "o")])
    assert args.device == "auto" and args.func(args) == 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert seen["device"] == device
    rec = json.loads((tmp_path / "o" / "results.json").read_text())
    want = applied_numerics(cfg.numerics, device)
    assert {k: rec[k] for k in ["device", *want]} == {"device": str(device), **want}
    assert parse(["probes", "--run", "R"]).device == "auto"


@pytest.fixture
def fake_downstream(monkeypatch, tmp_path, softmax_run):
    """``run(samples, out)``: `kinterval downstream` of a tiny checkpoint with lm-eval stubbed to log
    ``samples`` (task -> per-item accuracies)."""
    pytest.importorskip("lm_eval")
    import lm_eval
    import lm_eval.tasks

    softmax_run(50257)

    logged = {}

    def evaluate(model, tasks, **kw):
        samples = {
            t: [{"doc_id": i, "target": "1", "metrics": ["acc"], "acc": a, "filtered_resps": [[-1.0, a > 0]]}
                for i, a in enumerate(logged[t])]
            for t in tasks
        }  # fmt: skip
        return {"samples": samples, "results": {t: {"acc,none": float(np.mean(logged[t]))} for t in tasks},
                "n-shot": {t: shots.get(t, 0) for t in tasks}}  # fmt: skip

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", _Tasks)

    shots = {}

    def run(samples, out, n_shot=None):
        logged.clear()
        logged.update(samples)
        shots.clear()
        shots.update(n_shot or {})
        return downstream_commands.run_downstream(tmp_path / "run", list(samples), out=out, device="cpu")

    return run


def test_downstream_outputs_are_written_atomically_results_json_last(fake_downstream, tmp_path, capsys):
    """<task>.jsonl was rewritten in place and results.json after it: a rerun cut short left new per-item
    files beside the previous run's results.json (or some tasks of each run). results.json now says the
    folder is being written until every per-item file is in place, and records their sha256."""
    from kinterval import atomic
    from kinterval.cli import main

    base, out = tmp_path / "base", tmp_path / "out"
    fake_downstream({"qa": [1.0, 0.0, 1.0], "lm": [0.0, 0.0, 1.0]}, base)
    first = fake_downstream({"qa": [1.0, 1.0, 1.0], "lm": [1.0, 0.0, 1.0]}, out)
    assert first["files_sha256"] == {
        f"{t}.jsonl": atomic.sha256_file(out / f"{t}.jsonl") for t in ("qa", "lm")
    }
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(first))
    assert sorted(p.name for p in out.iterdir()) == ["lm.jsonl", "qa.jsonl", "results.json"]
    assert downstream_compare(base, out, **FAST)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    written = []

    def cut_short(path, data):  # the rerun is killed after its first per-item file
        if written and path.suffix == ".jsonl":
            raise KeyboardInterrupt
        if path.suffix == ".jsonl":
            written.append(path)
        return atomic.write_with(path, lambda fh: fh.write(data))

    with pytest.MonkeyPatch.context() as m:
        m.setattr(atomic, "write_bytes", cut_short)
        with pytest.raises(KeyboardInterrupt):
            fake_downstream({"qa": [0.0, 0.0, 0.0], "lm": [0.0, 0.0, 0.0]}, out)
    assert json.loads((out / "results.json").read_text())["complete"] is False
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    capsys.readouterr()
    assert main(["downstream-compare", str(base), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "out/results.json: `kinterval downstream` was writing this folder and did not finish" in err
    assert "\n" not in err

    fake_downstream({"qa": [1.0, 1.0, 1.0], "lm": [1.0, 0.0, 1.0]}, out)  # the rerun finishes
    again = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {k: v for k, v in again.items() if k != "results.json"} == {
        k: v for k, v in before.items() if k != "results.json"
    }
    rows = downstream_compare(base, out, **FAST)
    assert {r["task"] for r in rows} == {"qa", "lm"}

    fake_downstream({"qa": [1.0, 1.0, 1.0]}, out)  # another task set: lm.jsonl of the last run goes
    assert sorted(p.name for p in out.iterdir()) == ["qa.jsonl", "results.json"]


def test_downstream_per_item_files_must_be_the_ones_results_json_records(fake_downstream, tmp_path, capsys):
    """A results.json of one run beside the per-item files of another, an extra task file or a missing one is
    refused naming the file; a torn or non-UTF-8 file is one line naming it, exit 2 (it was a traceback)."""
    from kinterval.cli import main

    base, a, b = tmp_path / "base", tmp_path / "a", tmp_path / "b"
    fake_downstream({"qa": [1.0, 0.0, 1.0]}, base)
    fake_downstream({"qa": [1.0, 1.0, 1.0]}, a)
    fake_downstream({"qa": [0.0, 1.0, 1.0]}, b)
    (b / "results.json").write_bytes((a / "results.json").read_bytes())  # a's record beside b's items
    with pytest.raises(ValueError, match=r"b/qa.jsonl is not the file .*b/results.json records"):
        downstream_compare(base, b, **FAST)
    (a / "lm.jsonl").write_bytes((a / "qa.jsonl").read_bytes())
    with pytest.raises(ValueError, match=r"a/lm.jsonl is not one of the files .*a/results.json records"):
        downstream_compare(base, a, **FAST)
    (a / "lm.jsonl").rename(a / "qa.jsonl.bak")
    (a / "qa.jsonl").unlink()
    with pytest.raises(ValueError, match=r"no per-item result files"):
        downstream_compare(base, a, **FAST)
    rec = json.loads((b / "results.json").read_text())
    del rec["files_sha256"]  # written before the hashes were recorded: not checked
    (b / "results.json").write_text(json.dumps(rec))
    assert downstream_compare(base, b, **FAST)
    for damage in (b'{"doc_id": 0, "targ', b'{"doc_id": 0, "target": "\xff"}\n', b""):
        (b / "qa.jsonl").write_bytes(damage)
        capsys.readouterr()
        assert main(["downstream-compare", str(base), str(b)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("kinterval downstream-compare: error: ") and "b/qa.jsonl" in err, err
        assert "\n" not in err
    (b / "results.json").write_bytes(b"\xff\xfe{")
    assert main(["downstream-compare", str(base), str(b)]) == 2
    assert "b/results.json: not a JSON file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--tasks", ""], "--tasks"),
        (["--tasks", ","], "--tasks"),
        (["--tasks", "qa", "--limit", "0"], "--limit"),
        (["--tasks", "qa", "--limit", "-1"], "--limit"),
        (["--tasks", "qa", "--limit", "nan"], "--limit"),
        (["--tasks", "qa", "--limit", "inf"], "--limit"),
        (["--tasks", "qa", "--limit", "2.5"], "--limit"),
        (["--tasks", "qa", "--num-fewshot", "-1"], "--num-fewshot"),
        (["--tasks", "qa", "--seed", "-1"], "--seed"),
        (["--tasks", "qa", "--seed", str(2**32)], "--seed"),
        (["--tasks", "qa", "--batch-size", "0"], "--batch-size"),
        (["--tasks", "qa", "--batch-size", "-2"], "--batch-size"),
    ],
)
def test_downstream_refuses_arguments_lm_eval_would_fail_on(monkeypatch, tmp_path, capsys, flags, named):
    """An empty task list or a --limit of 0, -1 or nan reached lm-eval (a traceback); --num-fewshot -1 was
    taken silently and --seed -1 failed in numpy; --batch-size 0 was "batch_size 0: ..." after lm-eval had
    scanned its tasks and the checkpoint was loaded. Each is now one line naming the flag, before lm-eval."""
    import lm_eval

    from kinterval.cli import main

    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda *a, **k: pytest.fail("lm-eval ran"), raising=False)
    out = tmp_path / "o"
    assert main(["downstream", "--run", str(tmp_path / "run"), *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval downstream: error: ") and named in err and "\n" not in err
    assert "auto" not in err  # the flag takes integers only: the message offered auto, which it refuses
    assert not out.exists()


def test_downstream_limit_keeps_lm_evals_fraction():
    from kinterval.eval.downstream import check_downstream_args

    check_downstream_args(["t"], 0.5, 0, 0)  # a fraction of each task's items, as lm-eval reads it
    check_downstream_args(["t"], 3.0, None, 20260920)
    for batch_size in (1, 8, "auto", "auto:4"):  # lm-eval's batch sizes
        check_downstream_args(["t"], None, None, 0, batch_size)
    with pytest.raises(ValueError, match="a positive integer, auto or auto:N, got 'auto:0'"):
        check_downstream_args(["t"], None, None, 0, "auto:0")  # from Python, lm-eval's strings are named


@pytest.mark.parametrize(
    "command, bad",
    [(c, b) for c in ("downstream-compare", "probes-compare")
     for b in ("json-dir", "json-no-folder", "seed-neg", "seed-huge", "resamples-0", "resamples-neg",
               "json-in-base", "json-in-condition", "json-under-file")]
    + [("downstream-compare", "perm-0")],  # probes-compare has no --permutations
)  # fmt: skip
def test_compare_json_target_and_seed_are_checked_before_the_table(folders, tmp_path, capsys, command, bad):
    """``--json DIR`` failed with IsADirectoryError after the table was printed, ``--seed -1`` ended in a
    numpy traceback and ``--permutations 0`` / ``--resamples -5`` were "n must be a positive integer" /
    "n_resamples must be ..."; each is now one line naming the flag, before anything is printed. A --json
    inside a folder the command reads replaced its record (``--json BASE/results.json``, exit 0), and one
    under a file was "the folder ... does not exist"."""
    from kinterval.cli import main

    base, conds = folders
    (tmp_path / "afile").write_text("x")
    kept = {p: p.read_bytes() for p in (*base.iterdir(), *conds["big"].iterdir()) if p.is_file()}
    flags = {"json-dir": ["--json", str(tmp_path)], "json-no-folder": ["--json", str(tmp_path / "no" / "r")],
             "seed-neg": ["--seed", "-1"], "seed-huge": ["--seed", str(2**32)],
             "resamples-0": ["--resamples", "0"], "resamples-neg": ["--resamples", "-5"],
             "perm-0": ["--permutations", "0"], "json-under-file": ["--json", str(tmp_path / "afile" / "r")],
             "json-in-base": ["--json", str(next(iter(kept)))],
             "json-in-condition": ["--json", str(conds["big"] / "c.json")]}[bad]  # fmt: skip
    said = {"json-in-base": "an input of this command", "json-in-condition": "an input of this command",
            "json-under-file": "a part of this path is a file"}.get(bad, "")  # fmt: skip
    capsys.readouterr()
    assert main([command, str(base), str(conds["big"]), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"kinterval {command}: error: ") and flags[0] in err, err
    assert said in err and not (tmp_path / "no").exists()
    assert all(p.read_bytes() == b for p, b in kept.items()) and not (conds["big"] / "c.json").exists()


def test_results_record_each_tasks_fewshot_and_compare_refuses_other_shots(fake_downstream, tmp_path, capsys):
    """results.json recorded only --num-fewshot: a folder of null (each task's default, 0 here) was refused
    against one of 0. It now records each task's count as lm-eval scored it (n-shot), compared per task."""
    from kinterval.cli import main

    base, cond, two = tmp_path / "base", tmp_path / "cond", tmp_path / "two"
    fake_downstream({"qa": [1.0, 0.0, 1.0], "lm": [0.0, 1.0, 1.0]}, base)
    fake_downstream({"qa": [1.0, 1.0, 1.0], "lm": [0.0, 1.0, 1.0]}, cond)
    fake_downstream({"qa": [1.0, 1.0, 1.0], "lm": [0.0, 1.0, 1.0]}, two, n_shot={"lm": 2})
    rec = json.loads((base / "results.json").read_text())
    assert rec["num_fewshot"] is None and rec["task_num_fewshot"] == {"lm": 0, "qa": 0}
    crec = json.loads((cond / "results.json").read_text())
    (cond / "results.json").write_text(json.dumps(dict(crec, num_fewshot=0)))  # --num-fewshot 0 given
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both record every task: no warning
        assert downstream_compare(base, cond, **FAST)
    capsys.readouterr()
    assert main(["downstream-compare", str(base), str(two)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "task 'lm' scored with different numbers of few-shot examples" in err
    assert "base: 0" in err and "two: 2" in err


def test_compare_reads_older_results_json_and_warns_where_the_fewshot_is_unknown(fake_downstream, tmp_path):
    """A results.json written before the per-task counts: its num_fewshot holds for every task, null (each
    task's default) is unknown and warned about instead of refused against 0."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    fake_downstream({"qa": [1.0, 0.0, 1.0]}, base)
    fake_downstream({"qa": [1.0, 1.0, 1.0]}, cond)
    rec = json.loads((cond / "results.json").read_text())
    del rec["task_num_fewshot"]
    for old, refused in ((dict(rec, num_fewshot=2), True), (rec, False)):
        (cond / "results.json").write_text(json.dumps(old))
        if refused:
            with pytest.raises(ValueError, match=r"task 'qa' scored with different numbers of few-shot"):
                downstream_compare(base, cond, **FAST)
        else:
            with pytest.warns(downstream_commands.FewshotUnknownWarning, match=r"in .*cond \(all tasks\)"):
                assert downstream_compare(base, cond, **FAST)


def lm_eval_results(folder, n_shot, configs=None):
    stamp = "2026-01-01T00-00-00.000001"
    res = {"results": {}, "n-shot": n_shot, "configs": configs or {}}
    (folder / f"results_{stamp}.json").write_text(json.dumps(res))


def test_lm_eval_log_samples_folders_are_compared_per_task_fewshot(tmp_path, capsys):
    """Two lm-eval --log_samples folders scored 0-shot and 2-shot were paired silently: their results_*.json
    (n-shot, else the task config's num_fewshot) now give each task's count; without one, a warning."""
    from kinterval.cli import main

    folders = {}
    for name in ("zero", "two", "cfg", "none"):
        folders[name] = tmp_path / name
        lm_eval_samples(folders[name], "qa", [(0, None, {"acc": 1.0}), (1, None, {"acc": 0.0})])
    lm_eval_results(folders["zero"], {"qa": 0})
    lm_eval_results(folders["two"], {"qa": 2})
    lm_eval_results(folders["cfg"], {}, {"qa": {"num_fewshot": 0}})
    with pytest.raises(
        ValueError, match=r"task 'qa' scored with different numbers of few-shot .*zero: 0, .*two: 2"
    ):
        downstream_compare(folders["zero"], folders["two"], **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert downstream_compare(folders["zero"], folders["cfg"], **FAST)
    capsys.readouterr()
    assert main(["downstream-compare", str(folders["zero"]), str(folders["none"])]) == 0
    err = capsys.readouterr().err
    assert "warning: no recorded number of few-shot examples in" in err and "none (all tasks)" in err


@pytest.mark.parametrize("bad", ["NaN", "Infinity"])
def test_a_non_finite_per_item_metric_is_refused_naming_folder_task_and_doc(tmp_path, capsys, bad):
    """A NaN metric (a NaN checkpoint scored by lm-eval) failed in the statistics with "diffs contains NaN
    or infinite values", naming no folder, task or item."""
    from kinterval.cli import main

    base, cond = tmp_path / "base", tmp_path / "cond"
    write(base, "qa", {"acc": [1.0, 0.0, 1.0]})
    write(cond, "qa", {"acc": [1.0, 0.0, 1.0]})
    lines = (cond / "qa.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"acc": 0.0', f'"acc": {bad}')
    (cond / "qa.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"cond: task 'qa', doc_id 1: acc is not finite"):
        downstream_compare(base, cond, **FAST)
    assert main(["downstream-compare", str(base), str(cond)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "cond: task 'qa', doc_id 1: acc is not finite" in err and "\n" not in err.strip()


def test_a_one_item_task_writes_null_and_prints_a_dash(tmp_path, capsys):
    """A task of one item has no CI: --json wrote bare NaN (not strict JSON) and the table "[+nan, +nan]"."""
    from kinterval.cli import main

    base, cond, out = tmp_path / "base", tmp_path / "cond", tmp_path / "rows.json"
    write(base, "one", {"acc": [1.0]})
    write(cond, "one", {"acc": [0.0]})
    assert main(["downstream-compare", str(base), str(cond), "--json", str(out)]) == 0
    line = capsys.readouterr().out.splitlines()[2]
    assert "nan" not in line and line.split()[7] == "-"  # task metric cond n base cond diff CI
    (row,) = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
    assert (row["lo"], row["hi"], row["detectable"]) == (None, None, None)


def test_printed_table_keeps_wide_numbers_apart():
    """Log-likelihood totals of 9+ characters ran into each other: "4-401.2724-400.2541"."""
    from kinterval.eval.downstream_compare import format_compare

    row = {"task": "kinterval_tiny_ppl", "metric": "loglikelihood", "condition": "o_fwm", "n": 4,
           "baseline": -401.2724, "value": -12345.2541, "diff": -11944.0, "lo": -20000.5, "hi": -3000.25,
           "p": 0.25, "q": 0.25, "mark": "", "margin_status": None}  # fmt: skip
    head, _, line = format_compare([row]).splitlines()
    assert line.split() == ["kinterval_tiny_ppl", "loglikelihood", "o_fwm", "4", "-401.2724", "-12345.2541",
                            "-11944.0000", "[-20000.5000,", "-3000.2500]", "0.250", "0.250"]  # fmt: skip
    for name, value in (("base", "-401.2724"), ("cond", "-12345.2541"), ("diff", "-11944.0000")):
        assert head.rindex(name) + len(name) == line.index(value) + len(value)  # right-aligned under its name


def test_printed_table_never_reads_a_p_or_q_of_zero():
    """The permutation p has a positive floor (here 1/20001): it printed "0.0000" for p and q."""
    from kinterval.eval.downstream_compare import format_compare

    row = {"task": "piqa", "metric": "acc", "condition": "c", "n": 500, "baseline": 0.6, "value": 0.5,
           "diff": -0.1, "lo": -0.113, "hi": -0.0865, "p": 1 / 20001, "q": 2 / 20001, "mark": "*",
           "margin_status": None}  # fmt: skip
    head, _, line = format_compare([row]).splitlines()
    assert line.split()[-2:] == ["<0.001", "<0.001*"], line


def test_docs_name_the_metric_of_each_task_of_the_papers_table():
    """docs/downstream.md did not say which metric the paper's layer-3 table reports per task."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "downstream.md").read_text()
    battery = text.split("### The paper's battery")[1].split("\n## ")[0]
    sentence = " ".join(battery[battery.index("The paper's table reports") :].split("\n`--limit")[0].split())
    assert "`acc_norm` for HellaSwag, PIQA and ARC-Easy, `acc` for LAMBADA and SciQ" in sentence


# ---------------------------------------------------------------------- --task-difference
SUPPORT = "sciq\u2212sciq_nosupport"  # the derived task: SciQ with minus without the support passage


@pytest.fixture
def sciq_folders(tmp_path):
    """SciQ scored with (``sciq``) and without (``sciq_nosupport``) the passage on the same 14 items, ``acc``
    and ``acc_norm`` (random 0/1), in a baseline and three conditions: ``loses`` keeps the no-passage scores
    but loses the passage's benefit on some items, ``same`` repeats the baseline, ``noisy`` is random."""
    rng = np.random.default_rng(7)
    n = 14
    targets = [str(i % 4) for i in range(n)]
    scores = {}
    for name in ("softmax", "loses", "same", "noisy"):
        if name in ("softmax", "same"):
            rng_s = np.random.default_rng(3)  # identical draws: same scores
            s = {t: {m: rng_s.integers(0, 2, n).astype(float) for m in ("acc", "acc_norm")}
                 for t in ("sciq", "sciq_nosupport")}  # fmt: skip
        elif name == "loses":
            s = {t: {m: v.copy() for m, v in ms.items()} for t, ms in scores["softmax"].items()}
            for m in ("acc", "acc_norm"):  # the passage's gains on the first 10 items lost
                s["sciq"][m][:10] = np.minimum(s["sciq"][m], s["sciq_nosupport"][m])[:10]
        else:
            s = {t: {m: rng.integers(0, 2, n).astype(float) for m in ("acc", "acc_norm")}
                 for t in ("sciq", "sciq_nosupport")}  # fmt: skip
        scores[name] = s
        for task, values in s.items():
            write(tmp_path / name, task, values, targets)
    conds = {name: tmp_path / name for name in ("loses", "same", "noisy")}
    return tmp_path / "softmax", conds, scores


def exact_sign_flip_p(d):
    """Two-sided sign-flip p over all 2^n sign vectors (n small), by brute force."""
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * len(d))).reshape(len(d), -1).T
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9))


def test_task_difference_rows_are_the_paired_difference_of_the_benefit(sciq_folders):
    """No command gave the paper's per-item comparison of the SciQ support-passage benefit, (cond_sciq -
    cond_sciq_ns) - (base_sciq - base_sciq_ns): the derived task's rows are that, with a task's statistics."""
    base, conds, scores = sciq_folders
    n_perm = 20000
    rows = downstream_compare(base, conds, n_resamples=400, n_perm=n_perm, seed=0,
                              task_differences=[("sciq", "sciq_nosupport")])  # fmt: skip
    got = by_key(rows)
    b = scores["softmax"]
    for m in ("acc", "acc_norm"):
        benefit_b = b["sciq"][m] - b["sciq_nosupport"][m]
        fam = [got[(SUPPORT, m, name)] for name in conds]
        for name, row in zip(conds, fam):
            c = scores[name]
            benefit_c = c["sciq"][m] - c["sciq_nosupport"][m]
            d = benefit_c - benefit_b
            assert row["n"] == 14 and row["family_size"] == 3
            assert row["baseline"] == pytest.approx(benefit_b.mean(), abs=1e-12)
            assert row["value"] == pytest.approx(benefit_c.mean(), abs=1e-12)
            assert row["diff"] == pytest.approx(d.mean(), abs=1e-12)
            if not d.any():
                assert row["p"] == 1.0 and row["lo"] == row["hi"] == 0.0
                continue
            p = exact_sign_flip_p(d)  # the random flips estimate it: within Monte Carlo error
            assert abs(row["p"] - p) < 4 * np.sqrt(p * (1 - p) / n_perm) + 2 / n_perm, (name, m, row["p"], p)
            assert row["lo"] <= d.mean() <= row["hi"]
        want = stats.false_discovery_control([r["p"] for r in fam], method="bh")  # BH within A-B x metric
        np.testing.assert_allclose([r["q"] for r in fam], want, rtol=1e-12)
    assert got[(SUPPORT, "acc", "loses")]["diff"] < 0 and got[(SUPPORT, "acc", "same")]["diff"] == 0
    # the tasks' own rows stay as they were without the option
    plain = by_key(downstream_compare(base, conds, n_resamples=400, n_perm=n_perm, seed=0))
    assert {k: v for k, v in got.items() if k[0] != SUPPORT} == plain
    assert {k[:2] for k in got} - {k[:2] for k in plain} == {(SUPPORT, "acc"), (SUPPORT, "acc_norm")}


def test_task_difference_has_acc_norm_only_where_both_tasks_have_it(sciq_folders, tmp_path):
    base, conds, scores = sciq_folders
    for name, folder in [("softmax", base), *conds.items()]:
        write(folder, "sciq_nosupport", {"acc": scores[name]["sciq_nosupport"]["acc"]},
              [str(i % 4) for i in range(14)])  # fmt: skip
    rows = downstream_compare(base, conds, **FAST, task_differences=[("sciq", "sciq_nosupport")])
    assert {r["metric"] for r in rows if r["task"] == SUPPORT} == {"acc"}


def test_task_difference_cli_prints_and_writes_json_rows(sciq_folders, tmp_path, capsys):
    from kinterval.cli import main

    base, conds, _ = sciq_folders
    out = tmp_path / "rows.json"
    argv = [
        "downstream-compare",
        str(base),
        *(f"{n}={f}" for n, f in conds.items()),
        "--resamples",
        "200",
        "--permutations",
        "500",
        "--task-difference",
        "sciq,sciq_nosupport",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    derived = [r for r in rows if r["task"] == SUPPORT]
    assert [(r["metric"], r["condition"]) for r in derived] == [
        (m, c) for m in ("acc", "acc_norm") for c in ("loses", "same", "noisy")
    ]
    direct = downstream_compare(base, conds, n_resamples=200, n_perm=500, seed=0,
                                task_differences=[("sciq", "sciq_nosupport")])  # fmt: skip
    assert rows == direct
    table = [line.split() for line in printed.splitlines() if line.startswith(SUPPORT)]
    assert len(table) == 6 and table[0][:3] == [SUPPORT, "acc", "loses"]


@pytest.mark.parametrize("case", ["no-b", "cond-no-b", "fewer-items", "other-target", "one-task", "same-task",
                                  "no-acc"])  # fmt: skip
def test_task_difference_refusals_are_one_line(sciq_folders, capsys, case):
    """A folder without A or B, items of A and B that differ, or not two task names: one line, exit 2."""
    from kinterval.cli import main

    base, conds, scores = sciq_folders
    spec, named = "sciq,sciq_nosupport", None
    targets = [str(i % 4) for i in range(14)]
    if case == "no-b":
        spec, named = "sciq,sciq_nosupprot", "has no result file for task 'sciq_nosupprot'"
    elif case == "cond-no-b":
        (conds["same"] / "sciq_nosupport.jsonl").rename(conds["same"] / "sciq_ns.jsonl")
        named = "same has no result file for task 'sciq_nosupport'"
    elif case == "fewer-items":
        for name, folder in [("softmax", base), *conds.items()]:
            values = {m: v[:13] for m, v in scores[name]["sciq_nosupport"].items()}
            write(folder, "sciq_nosupport", values, targets)
        named = "the items of 'sciq' (14) and 'sciq_nosupport' (13) differ"
    elif case == "other-target":
        for name, folder in [("softmax", base), *conds.items()]:
            write(folder, "sciq_nosupport", scores[name]["sciq_nosupport"], targets[:13] + ["9"])
        named = "item 13 has target '1' in 'sciq' but '9' in 'sciq_nosupport'"
    elif case == "one-task":
        spec, named = "sciq", "--task-difference must be two task names A,B"
    elif case == "same-task":
        spec, named = "sciq,sciq", "names one task twice"
    elif case == "no-acc":
        for name, folder in [("softmax", base), *conds.items()]:
            write(folder, "sciq_nosupport", {"acc_norm": scores[name]["sciq_nosupport"]["acc_norm"]}, targets)
        named = "do not both have the metric 'acc'"
    capsys.readouterr()
    argv = [
        "downstream-compare",
        str(base),
        *(f"{n}={f}" for n, f in conds.items()),
        "--task-difference",
        spec,
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("kinterval downstream-compare: error: --task-difference ") and named in err, err


def test_docs_give_the_support_passage_comparison_command():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "downstream.md").read_text()
    battery = text.split("### The paper's battery")[1].split("\n## ")[0]
    assert "--task-difference sciq,sciq_nosupport" in battery


# ---------------------------------------------------------------------- pre-declared condition groups
def test_groups_label_rows_and_count_each_groups_outcomes_on_the_primary_metric(folders):
    """Planted: ``big`` improves qa by +0.30 and the BLiMP macro row by +0.10; ``tiny`` adds 2 right answers
    of 400 on qa and nothing on BLiMP; ``same`` repeats the baseline. ``lm`` has only ``nll``, not the primary
    ``acc``: it is named as not counted. Reversed (``big`` as the baseline) the signs turn."""
    from kinterval.eval.downstream_compare import group_summary

    base, conds = folders
    groups = {"near": ["tiny", "same"], "large": ["big"]}
    rows = downstream_compare(base, conds, groups=groups, **FAST)
    plain = downstream_compare(base, conds, **FAST)
    assert {k: {f: v for f, v in r.items() if f != "group"} for k, r in by_key(rows).items()} == by_key(plain)
    assert {r["condition"]: r["group"] for r in rows} == {"big": "large", "tiny": "near", "same": "near"}
    qa = [r["condition"] for r in rows if (r["task"], r["metric"]) == ("qa", "acc")]
    assert qa == ["tiny", "same", "big"]  # the groups' order, the given order within a group
    near, large = group_summary(rows)
    assert (large["group"], large["conditions"], sorted(large["tasks"])) == (
        "large",
        ["big"],
        ["blimp", "qa"],
    )
    assert (large["comparisons"], large["positive"], large["negative"]) == (2, 2, 0)
    assert (large["detectable"], large["q05_positive"], large["q05_negative"]) == (2, 2, 0)
    assert large["skipped_tasks"] == near["skipped_tasks"] == ["lm"]
    assert (near["group"], near["conditions"], near["comparisons"]) == ("near", ["tiny", "same"], 4)
    assert (near["positive"], near["negative"], near["q05_positive"], near["q05_negative"]) == (1, 0, 0, 0)
    # --primary lm=nll counts the lm task too: big's +0.05 nats is a positive, detectable difference
    _, large = group_summary(rows, {"lm": "nll"})
    assert (large["comparisons"], large["positive"], large["q05_positive"], large["skipped_tasks"]) == (
        3,
        3,
        3,
        [],
    )

    rev = downstream_compare(conds["big"], {"soft": base, "tiny": conds["tiny"]},
                             groups={"a": ["soft"], "b": ["tiny"]}, **FAST)  # fmt: skip
    a, b = group_summary(rev)
    assert (a["comparisons"], a["negative"], a["q05_negative"], a["positive"]) == (2, 2, 2, 0)
    assert (b["comparisons"], b["negative"], b["q05_negative"]) == (2, 2, 2)  # tiny lacks big's gains


@pytest.mark.parametrize(
    "groups, message",
    [({"a": ["big", "tiny"]}, r"every condition needs a group; not in any: \['same'\]"),
     ({"a": ["big", "tiny"], "b": ["same", "big"]}, "'big' is already in group 'a'"),
     ({"a": ["big", "tiny", "same", "huge"]}, "'huge' is not a compared condition"),
     ({"a": ["big", "tiny", "same"], "b": []}, "give the group's conditions as a list"),
     ({}, "give at least one group")],
)  # fmt: skip
def test_groups_must_put_every_condition_in_exactly_one_group(folders, groups, message):
    base, conds = folders
    with pytest.raises(ValueError, match=message):
        downstream_compare(base, conds, groups=groups, **FAST)


def test_group_summary_needs_grouped_rows(folders):
    from kinterval.eval.downstream_compare import group_summary

    base, conds = folders
    with pytest.raises(ValueError, match="needs rows with a group"):
        group_summary(downstream_compare(base, conds, **FAST))


def test_group_cli_prints_the_counts_and_writes_the_group_of_each_row(folders, tmp_path, capsys):
    from kinterval.cli import main

    base, conds = folders
    out = tmp_path / "rows.json"
    argv = [
        "downstream-compare",
        str(base),
        *(f"{n}={f}" for n, f in conds.items()),
        "--resamples",
        "400",
        "--permutations",
        "2000",
        "--group",
        "large=big",
        "--group",
        "near=tiny,same",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert rows == downstream_compare(
        base, conds, groups={"large": ["big"], "near": ["tiny", "same"]}, **FAST
    )
    table = printed.split("q<.05, >0")[1].splitlines()[2:]
    counts = {
        line.split()[0]: line.split()[1:] for line in table if line and line.split()[0] in ("large", "near")
    }
    # conditions, tasks, compared, diff < 0, diff > 0, CI excludes 0, q < .05 and < 0, q < .05 and > 0
    assert counts == {"large": ["1", "2", "2", "0", "2", "2", "0", "2"],
                      "near": ["2", "2", "4", "0", "1", "0", "0", "0"]}  # fmt: skip
    assert "(not counted, no primary metric: lm)" in printed


@pytest.mark.parametrize(
    "flags, message",
    [(["--group", "large"], "--group must be NAME=COND"),
     (["--group", "=big,tiny,same"], "--group must be NAME=COND"),
     (["--group", "a=big", "--group", "a=tiny,same"], "--group a is given twice"),
     (["--group", "a=big,tiny"], "not in any: ['same']"),
     (["--group", "a=big,tiny,same", "--primary", "qa"], "--primary must be TASK=METRIC")],
)  # fmt: skip
def test_group_cli_refusals_are_one_line(folders, capsys, flags, message):
    from kinterval.cli import main

    base, conds = folders
    argv = ["downstream-compare", str(base), *(f"{n}={f}" for n, f in conds.items()), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kinterval downstream-compare: error: ") and message in err[0]


# ---------------------------------------------------------------------- mutation audit (downstream area)
def test_a_record_missing_some_numerics_fields_is_unknown_not_checked():
    """A results.json that records some numerics fields but not all (written before one was recorded) is
    unknown, and named for the warning, like one that records none."""
    full = numerics_record("cpu", "none")
    part = {k: v for k, v in full.items() if k != "eval_dot_precision"}
    got = downstream.check_same_numerics([("new", full), ("part", part), ("lm-eval", None)])
    assert got == ["part", "lm-eval"]


@pytest.mark.parametrize("shots", [True, False, 1.0])
def test_a_bool_or_float_number_of_fewshot_examples_is_refused(shots):
    """lm-eval would take True as 1 few-shot example and False as 0, silently."""
    with pytest.raises(ValueError, match="--num-fewshot must be an integer >= 0"):
        downstream.check_downstream_args(["qa"], None, shots, 0)


def test_results_json_records_the_operators_and_the_checkpoint_step(fake_downstream, tmp_path):
    """results.json names the operator the items were scored with, the run's own one and the checkpoint."""
    fake_downstream({"qa": [1.0, 0.0]}, tmp_path / "o")
    rec = json.loads((tmp_path / "o" / "results.json").read_text())
    assert (rec["operator"], rec["native_operator"], rec["checkpoint_step"]) == ("softmax", "softmax", 1)


def test_per_item_files_are_written_in_doc_id_order(monkeypatch, tmp_path, softmax_run):
    """lm-eval logs samples in its request order; <task>.jsonl is in doc_id order, so that one scoring always
    writes the same bytes (and sha256)."""
    pytest.importorskip("lm_eval")
    import lm_eval
    import lm_eval.tasks

    softmax_run(50257)
    samples = [{"doc_id": i, "target": "1", "metrics": ["acc"], "acc": 1.0, "filtered_resps": [[-1.0, True]]}
               for i in (2, 0, 1)]  # fmt: skip
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda model, **kw: {"samples": {"t": samples},
                                                                         "results": {"t": {}}})  # fmt: skip
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", _Tasks)
    downstream_commands.run_downstream(tmp_path / "run", ["t"], out=tmp_path / "o", device="cpu")
    lines = (tmp_path / "o" / "t.jsonl").read_text().splitlines()
    assert [json.loads(x)["doc_id"] for x in lines] == [0, 1, 2]


def test_a_rerun_over_an_older_folder_removes_the_tasks_its_results_json_names(fake_downstream, tmp_path):
    """A results.json written before the hashes were recorded names its tasks only: a rerun with other tasks
    removes their files too (else an old task would be compared beside the new ones)."""
    out = tmp_path / "o"
    fake_downstream({"qa": [1.0, 0.0], "lm": [0.0, 1.0]}, out)
    rec = json.loads((out / "results.json").read_text())
    del rec["files_sha256"]
    (out / "results.json").write_text(json.dumps(rec))
    fake_downstream({"qa": [1.0, 1.0]}, out)
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["qa.jsonl"]


def test_a_rerun_removes_only_file_names_inside_its_folder(fake_downstream, tmp_path):
    """A results.json naming a per-item file with a path (a damaged or hand-made one) never makes a rerun
    remove a file outside the output folder."""
    out, outside = tmp_path / "o", tmp_path / "keep.jsonl"
    outside.write_text("{}\n")
    fake_downstream({"qa": [1.0, 0.0]}, out)
    rec = json.loads((out / "results.json").read_text())
    rec["files_sha256"]["../keep.jsonl"] = "0" * 64
    (out / "results.json").write_text(json.dumps(rec))
    fake_downstream({"qa": [1.0, 1.0]}, out)
    assert outside.is_file()


def test_a_recorded_per_item_file_that_is_missing_is_refused(fake_downstream, tmp_path):
    base, cond = tmp_path / "base", tmp_path / "cond"
    fake_downstream({"qa": [1.0, 0.0], "lm": [0.0, 1.0]}, base)
    fake_downstream({"qa": [1.0, 1.0], "lm": [0.0, 1.0]}, cond)
    (cond / "lm.jsonl").unlink()
    with pytest.raises(ValueError, match=r"cond: lm.jsonl recorded in results.json but missing"):
        downstream_compare(base, cond, **FAST)


def test_lm_eval_results_files_that_disagree_leave_the_fewshot_unknown(tmp_path):
    """Two results_*.json in one lm-eval folder with other n-shot for a task: its count is unknown (warned
    of), not one of the two."""
    folder = tmp_path / "lm"
    lm_eval_samples(folder, "qa", [(0, None, {"acc": 1.0})])
    lm_eval_results(folder, {"qa": 0})
    res = {"results": {}, "n-shot": {"qa": 5}, "configs": {}}
    (folder / "results_2026-01-02T00-00-00.000001.json").write_text(json.dumps(res))
    assert compare_module._fewshot(folder, None, ["qa"]) == {"qa": None}
    (folder / "results_2026-01-02T00-00-00.000001.json").unlink()
    assert compare_module._fewshot(folder, None, ["qa"]) == {"qa": 0}


def test_a_task_difference_given_twice_is_refused():
    with pytest.raises(ValueError, match="--task-difference sciq,sciq_nosupport is given twice"):
        compare_module._check_differences([("sciq", "sciq_nosupport"), ["sciq", "sciq_nosupport"]])


def test_primary_flag_overrides_the_papers_metric_of_a_task():
    """--primary TASK=METRIC wins over the paper's (acc_norm for hellaswag), also for a task it names."""
    assert compare_module.primary_metric("hellaswag") == "acc_norm"
    assert compare_module.primary_metric("hellaswag", {"hellaswag": "acc"}) == "acc"
    assert compare_module.primary_metric("qa", {"hellaswag": "acc"}) == "acc"


@pytest.mark.parametrize("flag", ["hellaswag=", "=acc", " = "])
def test_primary_flag_needs_a_task_and_a_metric(flag):
    with pytest.raises(ValueError, match="--primary must be TASK=METRIC"):
        downstream_commands._primary([flag])


def test_downstream_tasks_flag_is_split_and_stripped(monkeypatch, tmp_path, capsys):
    seen = []
    monkeypatch.setattr(downstream_commands, "run_downstream", lambda run, tasks, **k: seen.append(tasks)
                        or {"results": {}})  # fmt: skip
    args = parse(["downstream", "--run", str(tmp_path), "--tasks", " qa, lm ,,"])
    assert args.func(args) == 0 and seen == [["qa", "lm"]]


@pytest.mark.parametrize("record", ["[]", "null", '"text"'])
def test_a_results_json_that_is_not_an_object_is_refused(fake_downstream, tmp_path, record):
    """A damaged results.json that is JSON but no object was read as none: the folder's per-item files were
    compared without their recorded sha256."""
    base, cond = tmp_path / "base", tmp_path / "cond"
    fake_downstream({"qa": [1.0, 0.0]}, base)
    fake_downstream({"qa": [1.0, 1.0]}, cond)
    (cond / "results.json").write_text(record)
    with pytest.raises(ValueError, match=r"cond/results.json: not a results record \(a JSON object\)"):
        downstream_compare(base, cond, **FAST)


def test_groups_take_lists_of_conditions_not_a_string():
    with pytest.raises(ValueError, match="--group g: give the group's conditions as a list"):
        compare_module.check_groups({"g": "ab"}, ["a", "b"])


def test_group_counts_need_q_strictly_below_005_as_the_mark():
    rows = [{"group": "g", "task": "qa", "metric": "acc", "condition": c, "diff": d, "detectable": False,
             "q": q} for c, d, q in (("a", -0.1, 0.05), ("b", 0.1, 0.0499))]  # fmt: skip
    (g,) = compare_module.group_summary(rows)
    assert (g["q05_negative"], g["q05_positive"], g["negative"], g["positive"]) == (0, 1, 1, 1)


def test_printed_table_gives_a_small_difference_in_two_significant_digits():
    """A difference below 5e-5 with an interval that excludes 0 read "+0.0000 [+0.0000, +0.0001]"."""
    from kinterval.eval.downstream_compare import format_compare

    row = {"task": "t", "metric": "nll", "condition": "c", "n": 4, "baseline": 2.5, "value": 2.50003,
           "diff": 3e-5, "lo": 2e-5, "hi": 1e-4, "p": 0.01, "q": 0.01, "mark": "",
           "margin_status": None}  # fmt: skip
    _, _, line = format_compare([row]).splitlines()
    assert "+3.0e-05" in line and "[+2.0e-05, +0.0001]" in line


def test_doc_ids_of_mixed_types_pair_and_other_ids_are_refused(tmp_path):
    """Integer and string doc_ids in one file (hand-made files) stopped with a TypeError from sorting."""
    from kinterval.eval.downstream_compare import downstream_compare

    for name, vals in (("base", [1, 0, 1]), ("cond", [0, 0, 1])):
        (tmp_path / name).mkdir()
        lines = [{"doc_id": i, "target": "0", "metrics": {"acc": v}} for i, v in zip([0, "x1", 2], vals)]
        (tmp_path / name / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = downstream_compare(tmp_path / "base", {"c": tmp_path / "cond"}, **FAST)
    assert (row["n"], row["diff"]) == (3, pytest.approx(-1 / 3))
    (tmp_path / "cond" / "t.jsonl").write_text(json.dumps({"doc_id": [0], "metrics": {"acc": 1}}) + "\n")
    with pytest.raises(
        ValueError, match=r"t.jsonl, line 1: doc_id must be an integer or a string, got \[0\]"
    ):
        downstream_compare(tmp_path / "base", {"c": tmp_path / "cond"}, **FAST)


def test_json_is_written_when_the_reader_of_the_table_leaves(folders, tmp_path):
    """``downstream-compare ... --json F | head -1``: the table's printing stopped at the closed pipe before
    the file was written (exit 141, no F)."""
    import subprocess
    import sys

    base, conds = folders
    args = [f"{name}={path}" for name, path in conds.items()]
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "kinterval", "downstream-compare", str(base), *args, "--json", str(out),
           "--resamples", "100", "--permutations", "200"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.close()  # the reader is gone before the first line
    assert proc.wait(timeout=300) == 141
    assert json.loads(out.read_text())
