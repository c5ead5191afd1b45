"""Suite files: the paper's designs expand to the right runs; bad files fail clearly."""

from __future__ import annotations

import re

import pytest

from kinterval.model import safe_operator
from kinterval.ops import OperatorSpec
from kinterval.suite.definition import load_suite, select, shipped_suites
from kinterval.suite.manifest import build_manifest, eval_settings
from kinterval.train.config import TrainConfig


@pytest.mark.parametrize(
    ("name", "runs", "jobs"),
    [
        ("A", 15, 300),
        ("B", 10, 100),
        ("C", 12, 60),
        ("D", 130, 650),
        ("supplementary", 30, 150),
        ("mini", 9, 45),
        ("mini-seeds", 14, 70),
        ("ci", 15, 45),
    ],
)
def test_paper_suite_sizes(name, runs, jobs):
    s = load_suite(name)
    assert len(s.runs) == runs and s.n_jobs == jobs


def test_suite_conditions():
    a = {r.spec.name for r in load_suite("A").runs}
    assert a == {
        "softmax",
        "lerp-k1",
        "lerp-k2",
        "lerp-k4",
        "lerp-k16",
        "lerp-k32",
        "minmax-weight-k4",
        "minmax-weight-k16",
        "minmax-weight-k32",
        "minmax-weight-k64",
        "minmax-prob-k4",
        "fwm-weight-k2",
        "fwm-weight-k4",
        "fwm-weight-k16",
        "fwm-prob-k4",
    }
    d = load_suite("D")
    assert {r.seed for r in d.runs} == {7, 42, 253, 1337, 2026}
    assert sum(r.spec.kind == "softmax" for r in d.runs) == 5
    assert {r.spec.K for r in d.runs if r.spec.is_kinterval} == {4, 8, 16, 32, 64}
    # formal STE runs carry the historical arithmetic, LERP has none
    assert all(r.spec.arithmetic == "historical" for r in d.runs if r.spec.surrogate)
    sup = {r.group: r for r in load_suite("supplementary").runs}
    assert sup["strict-forward"].spec.arithmetic == "strict"
    assert {r.spec.range_grad for r in load_suite("supplementary").runs if r.group == "single-channel"} == {
        "max_only",
        "min_only",
    }
    assert set(shipped_suites()) >= {"A", "B", "C", "D", "supplementary", "ci", "mini"}


def test_mini_seeds_extends_mini(tmp_path):
    """mini-seeds adds seeds 7 and 42 to mini's factorial and detach conditions and their controls, with
    configs equal to mini's but for the seed: the report pairs runs across the two folders by seed, token
    budget and data."""
    mini, more = load_suite("mini"), load_suite("mini-seeds")
    base = {r.operator: r for r in mini.runs}
    assert {r.seed for r in more.runs} == {7, 42} and {r.seed for r in mini.runs} == {1337}
    assert {r.operator for r in more.runs} == {
        "softmax",
        "lerp-k32",
        "lerp-k32[range_grad=detach]",
        *(f"{c}-{s}-k4[arithmetic=historical]" for c in ("minmax", "fwm") for s in ("weight", "prob")),
    }
    m_mini = {r["operator"]: r for r in build_manifest(mini, tmp_path / "a", "/data")["runs"]}
    for row in build_manifest(more, tmp_path / "b", "/data")["runs"]:
        assert row["operator"] in base
        want = dict(m_mini[row["operator"]]["config"], seed=row["config"]["seed"])
        assert {k: v for k, v in row["config"].items() if k != "name"} == {
            k: v for k, v in want.items() if k != "name"
        }


def test_mini_is_the_issues_list_with_the_main_contrast_first(tmp_path):
    """The issue's mini suite: softmax; LERP K = 4, 16, 32; LERP K = 32 with range_grad = detach; {MinMax,
    FWM} x {Weight, Prob} at K = 4 in historical arithmetic; a 6-layer model, d = 384, T = 256, ~50M tokens
    per run, one seed. The runs go in file order (three at a time with --per-gpu 3): Table 3's contrast
    (softmax, MinMax-Weight, FWM-Prob) first, then the rest of the factorial and LERP K = 32, then LERP
    K = 4/16 and the detached gradient, so that a suite cut short still has the main contrast."""
    mini = load_suite("mini")
    hist = "k4[arithmetic=historical]"
    ops = [r.operator for r in mini.runs]
    assert ops[:3] == ["softmax", f"minmax-weight-{hist}", f"fwm-prob-{hist}"]
    assert set(ops[3:6]) == {f"minmax-prob-{hist}", f"fwm-weight-{hist}", "lerp-k32"}
    assert set(ops[6:]) == {"lerp-k4", "lerp-k16", "lerp-k32[range_grad=detach]"} and len(ops) == 9
    assert {r.seed for r in mini.runs} == {1337}
    for row in build_manifest(mini, tmp_path, "/data")["runs"]:
        model, schedule = row["config"]["model"], row["config"]["schedule"]
        assert (model["n_layer"], model["n_embd"], model["block_size"]) == (6, 384, 256)
        tokens_per_step = schedule["micro_batch"] * schedule["accum"] * model["block_size"]
        assert tokens_per_step == 65_536 and 49e6 <= schedule["tokens"] <= 51e6


def test_manifest_rows_carry_identity_and_protocol(tmp_path):
    s = load_suite("B")
    m = build_manifest(s, tmp_path, "/data/fineweb")
    row = next(r for r in m["runs"] if r["operator"].startswith("fwm-prob-k16"))
    assert (row["calibration"], row["surrogate"], row["K"], row["tau"]) == ("fwm", "prob", 16, 6.0)
    assert row["config"]["operator"]["name"] == row["operator"]
    assert row["config"]["seed"] == 1337 and len(row["checkpoint_steps"]) == 10
    assert OperatorSpec.from_full_name(row["operator"]).arithmetic == "historical"
    assert m["code"]["ops_sha256"] and m["n_jobs"] == 100


def test_select_and_safe_names():
    runs = load_suite("ci").runs
    assert {r.run_id for r in select(runs, ["softmax"])} == {"softmax-s7", "softmax-s42"}
    assert [r.run_id for r in select(runs, ["softmax-s?"])] == ["softmax-s7"]  # ? is one character
    assert len(select(runs, ["*-s42"])) == 7
    assert safe_operator("lerp-k32[range_grad=detach]") == "lerp-k32.range_grad-detach"
    assert safe_operator("LERP-K32[Range_Grad=detach]") == "lerp-k32.range_grad-detach"  # one folder
    # a group name (not an operator or run id) selects the group's runs: 4 operators x 2 seeds
    factorial = {
        f"{c}-{s}-k4-s{seed}" for c in ("minmax", "fwm") for s in ("weight", "prob") for seed in (7, 42)
    }
    assert {r.run_id for r in select(runs, ["factorial"])} == factorial
    # an operator's full name selects its runs in whichever group it is (here "factorial")
    assert {r.run_id for r in select(runs, ["fwm-prob-k4"])} == {"fwm-prob-k4-s7", "fwm-prob-k4-s42"}


def test_show_help_names_every_shipped_suite(capsys, monkeypatch):
    from kinterval.cli import build_parser

    monkeypatch.setenv("COLUMNS", "400")  # one line: argparse would otherwise wrap at hyphens
    with pytest.raises(SystemExit):
        build_parser().parse_args(["suite", "show", "--help"])
    help_text = capsys.readouterr().out
    words = set(re.findall(r"[\w.-]+", help_text))
    missing = [name for name in shipped_suites() if name not in words]
    assert not missing, f"`kinterval suite show --help` does not name {missing}"


def test_bad_suite_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name="x"\nprotocol="tiny-cpu"\nseeds=[1]\ncheckpoints=2\ncolour="red"\n[[group]]\noperators=["softmax"]\n'
    )
    with pytest.raises(ValueError, match="unknown suite field"):
        load_suite(bad)
    bad.write_text(
        'name="x"\nprotocol="tiny-cpu"\nseeds=[1]\ncheckpoints=2\n[[group]]\noperators=["softmax","softmax"]\n'
    )
    with pytest.raises(ValueError, match="duplicate"):
        load_suite(bad)
    bad.write_text(
        'name="x"\nprotocol="tiny-cpu"\nseeds=[1]\ncheckpoints=2\n[[group]]\noperators=["lerp-k{K}"]\n'
    )
    with pytest.raises(ValueError, match="placeholder"):
        load_suite(bad)
    with pytest.raises(FileNotFoundError, match="unknown suite 'no-such-suite': not a .toml file"):
        load_suite("no-such-suite")
    # a suite file's path that names no file: said so, not "not a .toml file"
    with pytest.raises(FileNotFoundError, match=r"suite file '.*gone\.toml' not found"):
        load_suite(tmp_path / "gone.toml")


GOOD = 'name="x"\nprotocol="tiny-cpu"\nseeds=[1]\ncheckpoints=2\n'
G = '[[group]]\noperators=["softmax"]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD + "[eval]\ndoc_cluster=true\n" + G, r"\[eval\]: unknown field.*doc_cluster"),
        (GOOD + '[data]\nsorce="synthetic"\n' + G, r"\[data\]: unknown field.*sorce"),
        (GOOD + '[eval]\ngeometry="no"\n' + G, r"\[eval\]: field 'geometry' must be true or false"),
        (GOOD + '[eval]\nsplit="nope"\n' + G, r"\[eval\]: field 'split' must be one of"),
        (GOOD + '[data]\ntokens="many"\n' + G, r"\[data\]: field 'tokens' must be an integer"),
        (GOOD + '[[group]]\nname="g"\n', r"group 0: missing required field 'operators'"),
        (
            GOOD + '[[group]]\noperators="softmax"\n',
            r"group 0: field 'operators' must be a non-empty list of strings",
        ),
        (GOOD + G + 'seeds=["a"]\n', r"group 0: field 'seeds' must be a non-empty list of integers"),
        (GOOD.replace("seeds=[1]", "seeds=[]") + G, r"field 'seeds' must be a non-empty list of integers"),
        (GOOD + G + "seeds=[]\n", r"group 0: field 'seeds' must be a non-empty list of integers"),
        (GOOD + '[[group]]\noperators=["lerp-k{K}"]\nK=[0]\n', r"group 0: field 'K' must be"),
        (GOOD + '[[group]]\noperators=["lerp-k{K}"]\nK=[]\n', r"group 0: field 'K' must be a non-empty list"),
        (GOOD + '[[group]]\noperators=["softmax", 3]\n', r"group 0: field 'operators' must be a non-empty"),
        (GOOD + "group=[1]\n", r"field 'group' must be one or more \[\[group\]\] tables"),
        (
            GOOD + "[eval]\ngeometry_blocks=0\n" + G,
            r"\[eval\]: field 'geometry_blocks' must be an integer >= 1",
        ),
        (GOOD.replace("checkpoints=2\n", "") + G, r"missing required field 'checkpoints'"),
        (GOOD + "group=3\n", r"field 'group' must be one or more \[\[group\]\] tables"),
        (GOOD.replace("seeds=[1]", "seeds=7") + G, r"field 'seeds' must be"),
        (GOOD.replace("seeds=[1]\n", "") + G, r"missing required field 'seeds'"),
        (GOOD.replace("checkpoints=2", "checkpoints=0") + G, r"field 'checkpoints' must be an integer >= 1"),
        (GOOD.replace("checkpoints=2", "checkpoints=true") + G, r"field 'checkpoints' must be"),
        (GOOD + "overrides=3\n" + G, r"field 'overrides' must be a table"),
        # an operator name, an override or a K list that does not fit names the file and the group
        (GOOD + G + '[[group]]\noperators=["lerp-kk8"]\n', r"group 1: unknown operator name 'lerp-kk8'"),
        (GOOD + '[[group]]\noperators=["fwm-prob-k4[tua=4]"]\n', r"group 0: unknown override\(s\) \['tua'\]"),
        (
            GOOD + '[[group]]\noperators=["lerp-k{K}"]\n',
            r"group 0: operator 'lerp-k\{K\}' has a \{K\} placeholder",
        ),
        (
            GOOD + '[[group]]\noperators=["lerp-k8"]\nK=[4, 8]\n',
            r"group 0: operator 'lerp-k8' has no \{K\} placeholder",
        ),
    ],
)
def test_suite_fields_are_checked_at_load_time(tmp_path, text, message):
    """Unknown [eval]/[data] keys were dropped, geometry="no" became True, a group without operators was a
    KeyError, seeds=7 a TypeError, checkpoints=0 and split="nope" failed only after training."""
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_suite(bad)
    assert str(err.value).startswith(f"{bad}: ")


def test_suite_file_not_utf8_is_an_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(GOOD.encode() + b'title="caf\xe9"\n' + G.encode())
    with pytest.raises(ValueError, match="not UTF-8"):
        load_suite(bad)


def test_supplementary_matches_the_papers_run_matrix():
    """App. C.1 (hardware table) and App. F: historical detach record 16 runs (seed 1337 at 100M:
    MinMax-Weight K=2/4/8/16 and LERP K=4/32 detached, P1; 5M: six MinMax-Weight confirmations, three softmax
    references), detach replication 2, single-channel E1 4, strict-forward E2 4, tail policy 2, reduced
    precision 2."""
    runs = load_suite("supplementary").runs
    groups = {}
    for r in runs:
        groups[r.group] = groups.get(r.group, 0) + 1
    assert groups["detach-record"] + groups["detach-confirm-5m"] == 16
    assert {k: v for k, v in groups.items() if not k.startswith("detach-")} == {
        "single-channel": 4,
        "strict-forward": 4,
        "tail-policy": 2,
        "reduced-precision": 2,
    }
    assert groups["detach-replication"] == 2
    record = {
        r.operator
        for r in runs
        if r.group == "detach-record" and r.seed == 1337 and not r.overrides.get("schedule.tokens")
    }
    assert record == {
        *(f"minmax-weight-k{K}[range_grad=detach,arithmetic=historical]" for K in (2, 4, 8, 16)),
        "lerp-k4[range_grad=detach]",
        "lerp-k32[range_grad=detach]",
        "lerp-k32[range_grad=p1]",
    }
    (p1,) = [r for r in runs if r.spec.range_grad == "p1"]
    assert (p1.spec.name, p1.seed, p1.protocol, p1.run_id) == (
        "lerp-k32",
        1337,
        "124m-100m",
        "lerp-k32.range_grad-p1-s1337",
    )


def test_group_settings_beat_the_suites_and_an_operators_own_arithmetic_is_kept(tmp_path):
    """A group's override of a key the suite also sets wins (the suite's other keys stay); the group's
    arithmetic fills only operators that do not name their own (``[arithmetic=strict]`` stays strict)."""
    path = tmp_path / "s.toml"
    path.write_text(
        GOOD
        + 'arithmetic="strict"\n'
        + '[overrides]\n"schedule.tokens"=1000\n"schedule.warmup_tokens"=10\n'
        + '[[group]]\noperators=["minmax-weight-k4", "fwm-prob-k4[arithmetic=strict]"]\n'
        + 'arithmetic="historical"\n[group.overrides]\n"schedule.tokens"=2000\n'
    )
    runs = {r.spec.name: r for r in load_suite(path).runs}
    assert {n: r.spec.arithmetic for n, r in runs.items()} == {
        "minmax-weight-k4": "historical",
        "fwm-prob-k4": "strict",
    }
    for r in runs.values():
        assert r.overrides == {"schedule.tokens": 2000, "schedule.warmup_tokens": 10}


def test_a_groups_checkpoints_and_protocol_beat_the_suites(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(GOOD + G + '[[group]]\noperators=["lerp-k4"]\ncheckpoints=5\nprotocol="124m-100m"\n')
    runs = {r.operator: (r.checkpoints, r.protocol) for r in load_suite(path).runs}
    assert runs == {"softmax": (2, "tiny-cpu"), "lerp-k4": (5, "124m-100m")}
    # a group's overrides are checked against its own protocol: 3 heads divide 124M's 768, not tiny's 128
    path.write_text(
        GOOD + '[[group]]\noperators=["softmax"]\nprotocol="124m-100m"\noverrides={"model.n_head"=3}\n'
    )
    assert [r.overrides for r in load_suite(path).runs] == [{"model.n_head": 3}]


def test_eval_defaults_when_a_suite_has_no_eval_table(tmp_path):
    """Without [eval]: the val split, no document clusters, the geometry probe on 8 blocks (App. C.3)."""
    path = tmp_path / "s.toml"
    path.write_text(GOOD + G)
    assert eval_settings(load_suite(path)) == {
        "split": "val",
        "doc_clusters": False,
        "geometry": True,
        "geometry_blocks": 8,
    }


# ---------------------------------------------------------------------- audit of the definitions (2026-11-27)
def _suite(tmp_path, body: str, name="s"):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nprotocol = "124m-100m"\nseeds = [1]\ncheckpoints = 2\n{body}')
    return load_suite(path)


def test_an_unquoted_dotted_override_sets_one_field_not_the_whole_section(tmp_path):
    """`schedule.tokens = ...` unquoted is a nested TOML table: it replaced the protocol's whole schedule
    (warmup 0, accum 1: a 128x smaller batch) without an error."""
    from kinterval.suite.manifest import expected_config
    from kinterval.train.config import TrainConfig

    body = '[overrides]\nschedule.tokens = 50_000_000\n[[group]]\noperators = ["softmax"]\n'
    suite = _suite(tmp_path, body + "[group.overrides]\nschedule.accum = 64\n")
    got = expected_config(suite.runs[0], tmp_path).schedule
    want = TrainConfig.from_toml("124m-100m").schedule
    assert (got.tokens, got.accum) == (50_000_000, 64)
    assert (got.warmup_tokens, got.micro_batch, got.min_lr_ratio) == (
        want.warmup_tokens, want.micro_batch, want.min_lr_ratio
    )  # fmt: skip


@pytest.mark.parametrize("key", ['seed = 99', '"operator.name" = "lerp-k4"', '"checkpoint.count" = 7',
                                 'data.dir = "/x"', 'name = "x"'])  # fmt: skip
def test_overrides_of_what_each_run_sets_are_refused(tmp_path, key):
    """They were dropped silently: the run trained with its own seed, operator and checkpoint count."""
    with pytest.raises(ValueError, match="overrides may not set"):
        _suite(tmp_path, f'[overrides]\n{key}\n[[group]]\noperators = ["softmax"]\n')


@pytest.mark.parametrize(
    "body, where, match",
    [
        ('[overrides]\n"model.n_kv_heads" = 1\n', "[overrides]", "unknown config field 'model.n_kv_heads'"),
        ('[overrides]\n"model.n_kv_head" = 5\n', "[overrides]", "model.n_kv_head must be a positive integer"),
        ("", "group 0", "model.rope_theta must be"),  # the group's own overrides
    ],
)
def test_a_bad_override_names_the_file_and_its_table_when_the_suite_is_loaded(tmp_path, body, where, match):
    """A misspelt field or an impossible value failed only when `suite run` built its manifest, without the
    file's name; `suite show` listed the runs."""
    own = '[group.overrides]\n"model.rope_theta" = -1\n'
    group = '[[group]]\noperators = ["softmax"]\n' + ("" if body else own)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 's.toml'}: {where}: ") + ".*" + match):
        _suite(tmp_path, body + group)


def test_an_unknown_protocol_is_named_as_the_protocol_field(tmp_path):
    """It was reported as a fault of [overrides]: "[overrides]: config file not found: nosuchproto"."""
    path = tmp_path / "p.toml"
    path.write_text('name = "p"\nprotocol = "nosuchproto"\nseeds = [1]\ncheckpoints = 2\n'
                    '[[group]]\noperators = ["softmax"]\n')  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(f"{path}: protocol 'nosuchproto': config file not found")):
        load_suite(path)


def test_an_operators_own_arithmetic_wins_however_it_is_spaced(tmp_path):
    suite = _suite(tmp_path, 'arithmetic = "historical"\n[[group]]\n'
                   'operators = ["minmax-weight-k4[arithmetic = strict]", "fwm-prob-k4"]\n')  # fmt: skip
    assert [r.operator for r in suite.runs] == ["minmax-weight-k4", "fwm-prob-k4[arithmetic=historical]"]


def test_supplementary_is_a_boolean(tmp_path):
    with pytest.raises(ValueError, match="supplementary"):
        _suite(tmp_path, 'supplementary = "false"\n[[group]]\noperators = ["softmax"]\n')


@pytest.mark.parametrize(
    ("text", "message"),
    [(GOOD.replace("seeds=[1]", "seeds=[1, 99999999999999999999999]") + G, r"field 'seeds' must be a "
      r"non-empty list of integers from 0 to 4294967295 \(2\^32 - 1\), got \[1, 99999999999999999999999\]"),
     (GOOD.replace("seeds=[1]", "seeds=[4294967296]") + G, r"field 'seeds' must be"),
     (GOOD + G + "seeds=[-1]\n", r"group 0: field 'seeds' must be a non-empty list of integers from 0 to"),
     (GOOD + "[data]\nseed=-3\n" + G, r"\[data\]: field 'seed' must be an integer from 0 to 4294967295")],
)  # fmt: skip
def test_suite_seeds_out_of_range_are_refused_at_load_time(tmp_path, text, message, capsys):
    """A seed of 2^32 or more passed the load and failed every run in torch or numpy (a traceback in each
    run's log); a negative one failed each run's config check."""
    from kinterval.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_suite(bad)
    assert main(["suite", "show", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kinterval suite: error: {bad}: ") and "\n" not in err
    ok = GOOD.replace("seeds=[1]", "seeds=[0, 4294967295]") + G
    bad.write_text(ok)
    assert {r.seed for r in load_suite(bad).runs} == {0, 2**32 - 1}


def test_sdpa_is_a_suite_operator_as_in_train(tmp_path):
    """`train --operator sdpa` runs exact softmax through PyTorch's SDPA; a suite may run it too (it was
    'unknown operator name'), and its design axes are softmax's."""
    path = tmp_path / "s.toml"
    path.write_text(GOOD + '[[group]]\noperators=["softmax", "sdpa", " sdpa"]\n')
    with pytest.raises(ValueError, match="duplicate"):
        load_suite(path)
    path.write_text(GOOD + '[[group]]\noperators=["softmax", "sdpa"]\n')
    runs = {r.operator: r for r in load_suite(path).runs}
    assert sorted(runs) == ["sdpa", "softmax"]
    assert runs["sdpa"].spec == OperatorSpec.parse("softmax") and runs["sdpa"].axes()["name"] == "softmax"
    rows = build_manifest(load_suite(path), tmp_path / "out", tmp_path / "data")["runs"]
    assert [r["run_id"] for r in rows] == ["softmax-s1", "sdpa-s1"]


@pytest.mark.parametrize("option", ['"model.attn_sinks" = true', '"model.attn_softcap" = 20.0'])
def test_sdpa_with_a_softcap_or_sinks_is_refused_when_the_suite_is_loaded(tmp_path, option):
    """The file loaded and `suite show` listed the run; `suite run` trained the other runs and then failed
    the sdpa one (PyTorch's SDPA applies neither), as a traceback in its log."""
    path = tmp_path / "s.toml"
    path.write_text(GOOD + f"[overrides]\n{option}\n" + '[[group]]\noperators=["softmax", "sdpa"]\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: group 0: operator 'sdpa': ") + ".*use the op"):
        load_suite(path)
    path.write_text(GOOD + f"[overrides]\n{option}\n" + '[[group]]\noperators=["softmax", "lerp-k4"]\n')
    assert [r.operator for r in load_suite(path).runs] == ["softmax", "lerp-k4"]


def test_the_same_operator_under_other_group_overrides_is_refused_naming_the_way(tmp_path):
    """A group of the same operators with an attention option was refused as 'same operator and seed twice',
    which did not say why (a run id carries no overrides) nor what to do (a suite file of its own)."""
    path = tmp_path / "s.toml"
    sinks = '[group.overrides]\n"model.attn_sinks" = true\n'
    path.write_text(GOOD + '[[group]]\noperators=["softmax"]\n[[group]]\noperators=["softmax"]\n' + sinks)
    with pytest.raises(ValueError, match=r"duplicate runs \['softmax-s1'\] .*suite file of its own"):
        load_suite(path)
    path.write_text(GOOD + '[[group]]\noperators=["softmax"]\n[[group]]\noperators=["softmax"]\n')
    with pytest.raises(ValueError, match=r"\(same operator and seed twice\)$"):
        load_suite(path)


def test_mini_modern_is_mini_with_the_attention_options(tmp_path):
    """mini-modern: mini's model, data and protocol plus grouped-query heads (2 for 6), rotary positions and
    sinks; its four conditions are mini's (softmax, the Table 3 contrast, LERP K=32)."""
    mini, modern = load_suite("mini"), load_suite("mini-modern")
    m_mini = {r["operator"]: r for r in build_manifest(mini, tmp_path / "a", "/data")["runs"]}
    rows = build_manifest(modern, tmp_path / "b", "/data")["runs"]
    assert len(rows) == 4 and {r["operator"] for r in rows} <= set(m_mini)
    options = {"n_kv_head": 2, "rope_theta": 10000.0, "attn_sinks": True, "attn_softcap": None}
    for row in rows:
        want = m_mini[row["operator"]]["config"]
        want = dict(want, model=dict(want["model"], **options))
        assert {k: v for k, v in row["config"].items() if k != "name"} == {
            k: v for k, v in want.items() if k != "name"
        }
        TrainConfig.from_dict(row["config"]).validate().model_config(vocab_size=50257)  # a valid model


def test_a_manifest_without_its_suite_text_needs_the_unchanged_shipped_file(tmp_path):
    """A manifest that does not embed its suite file is checked against the shipped file of its name, and only
    while that file's bytes are the ones the manifest recorded (else the rows would be held against another
    design)."""
    from kinterval.suite.manifest import _sha256_text, manifest_suite, suite_path

    text = suite_path("ci").read_bytes().decode("utf-8")
    m = {"suite": "ci", "suite_file": "ci.toml", "suite_toml": None, "suite_sha256": _sha256_text(text)}
    assert manifest_suite(m).runs == load_suite("ci").runs
    with pytest.raises(ValueError, match=r"the shipped suite file ci.toml changed since the manifest"):
        manifest_suite({**m, "suite_sha256": _sha256_text(text + "\n")})
    with pytest.raises(ValueError, match=r"suite file 'gone.toml' is neither embedded nor shipped"):
        manifest_suite({**m, "suite": "gone", "suite_file": "gone.toml"})


def test_a_run_is_found_by_its_id_the_title_defaults_to_the_name_and_a_shipped_name_is_not_a_file(
    tmp_path, monkeypatch
):
    """``Suite.run`` takes a run id (not a group name); a suite without ``title`` is titled by its name; a
    shipped suite's name is read from the package even when the working directory holds a file of that name
    (only a path ending in .toml is a suite file)."""
    path = tmp_path / "s.toml"
    path.write_text(GOOD + G)
    suite = load_suite(path)
    assert suite.title == "x" and suite.run("softmax-s1").operator == "softmax"
    with pytest.raises(ValueError, match="suite x: no run 'group0'"):
        suite.run("group0")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ci").write_text("not a suite\n")
    assert load_suite("ci").name == "ci"
