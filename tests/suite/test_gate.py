"""The integrity gate on a tiny real suite (3 runs x 2 checkpoints, CPU, seconds): every checkpoint byte is
hashed, summaries are checked against their arrays, the manifest against its suite file and its schedule,
corrupt files are reported as ``ERROR <file>: ...`` lines; ``--results-only`` checks a copy without
checkpoints against ``gate.json``, with exactly one error per tampering."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kinterval.cli import main
from kinterval.stats import block_bootstrap_ci, block_length
from kinterval.suite.gate import RECORD, gate, sha256_file
from kinterval.suite.runner import run_suite
from tiny_suite import tiny_suite

pytestmark = pytest.mark.xdist_group("gate")  # one worker builds the module fixture

TINY = tiny_suite(
    """
[[group]]
name = "softmax"
operators = ["softmax"]
[[group]]
name = "lerp"
operators = ["lerp-k4"]
seeds = [7, 42]
"""
)
RUN = "lerp-k4-s7"


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_suite")
    (root / "tiny.toml").write_text(TINY)
    res = run_suite(root / "tiny.toml", root / "out", threads=1, log=lambda *_: None)
    assert set(res.values()) == {"completed"}
    rep = gate(root / "out")
    assert rep.ok and rep.record == root / "out" / RECORD, rep.errors
    return root / "out"


@pytest.fixture(scope="module")
def results_dir(suite_dir, tmp_path_factory):
    """The suite folder as it would be committed: no checkpoints, no data."""
    dst = tmp_path_factory.mktemp("results") / "tiny"
    shutil.copytree(suite_dir, dst, ignore=shutil.ignore_patterns("checkpoints", "data"))
    return dst


def _copy(src, tmp_path):
    """A copy of the folder, with its data folder (kilobytes) when it has one: it is found inside the copy."""
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def _edit_json(path, fn):
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d, indent=1))


def _eval(d, run=RUN, step=16):
    return d / "runs" / run / "eval" / "val" / f"step_{step:06d}.json"


def _ckpt(d, run=RUN, step=16):
    return d / "runs" / run / "checkpoints" / f"step_{step:06d}"


# ---------------------------------------------------------------------- tamperings
def shift_npz(d):
    npz = _eval(d).with_suffix(".npz")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["nll"] = arrays["nll"] + 1.0
    np.savez(npz, **arrays)


def edit_mean_nll(d):
    _edit_json(_eval(d), lambda s: s.update(mean_nll=s["mean_nll"] + 0.01))


def edit_seed(d):
    _edit_json(d / "manifest.json", lambda m: m["runs"][1].update(seed=8))


def edit_config_seed(d):
    _edit_json(d / "manifest.json", lambda m: m["runs"][1]["config"].update(seed=8))


def delete_eval(d):
    _eval(d, step=8).unlink()


def delete_run_entry(d):
    _edit_json(d / "manifest.json", lambda m: m["runs"].pop(2))


def drop_checkpoint_step(d):
    _edit_json(d / "manifest.json", lambda m: m["runs"][0]["checkpoint_steps"].pop(0))


def swap_evals(d):
    for ext in (".json", ".npz"):
        a, b = _eval(d).with_suffix(ext), _eval(d, "lerp-k4-s42").with_suffix(ext)
        tmp = a.with_name("swap")
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)


def edit_recorded_checkpoint_hash(d):
    _edit_json(_eval(d), lambda s: s["checkpoint_files"].update({"model.safetensors": "0" * 64}))


def edit_geometry(d):
    _edit_json(d / "runs" / RUN / "diagnostics" / "geometry" / "step_000016.json", lambda g: g.update(step=3))


def edit_n_blocks(d):
    """A block count that the 'nll' array does not have, the rest of the summary left as evaluated."""
    _edit_json(_eval(d), lambda s: s.update(n_blocks=s["n_blocks"] + 5))


def edit_mean_ci95(d):
    _edit_json(_eval(d), lambda s: s.update(mean_ci95=[s["mean_ci95"][0] - 0.01, s["mean_ci95"][1]]))


def edit_mean_ci95_block(d):
    """The block length recorded beside mean_ci95 says another block than block_length(n_blocks)."""
    _edit_json(_eval(d), lambda s: s.update(mean_ci95_block=s["mean_ci95_block"] + 1))


def edit_recorded_state_hash(d):
    _edit_json(_eval(d), lambda s: s.update(checkpoint_state_sha256="0" * 64))


def edit_train_code(d):
    _edit_json(_eval(d), lambda s: s["train_code"].update(ops_sha256="0" * 64))


def mark_operator_override(d):
    _edit_json(_eval(d), lambda s: s.update(operator_override=True))


def mark_partial_split(d):
    _edit_json(_eval(d), lambda s: s.update(all_blocks=False))


def drop_all_blocks(d):  # a summary that does not say it covered the full split
    _edit_json(_eval(d), lambda s: s.pop("all_blocks"))


def edit_eval_step(d):
    _edit_json(_eval(d), lambda s: s.update(step=8))


def drop_last_block(d):
    """One block fewer, with a summary that agrees with the shortened array."""
    npz = _eval(d).with_suffix(".npz")
    with np.load(npz) as z:
        nll = z["nll"][:-1]
    np.savez(npz, nll=nll)
    ci = block_bootstrap_ci(nll, block=block_length(nll.size))
    _edit_json(_eval(d), lambda s: s.update(n_blocks=nll.size, mean_nll=nll.mean(), mean_ci95=[ci.lo, ci.hi]))


def edit_train_config_checkpoint_count(d):
    """checkpoint.count is an execution field for a resume but part of a suite's protocol (its checkpoint
    steps): an evaluated checkpoint whose config has another count is not of the suite's run."""
    _edit_json(_eval(d), lambda s: s["train_config"]["checkpoint"].update(count=3))


def mark_run_incomplete(d):
    _edit_json(d / "runs" / RUN / "status.json", lambda s: s.update(status="running"))


def edit_n_jobs(d):
    _edit_json(d / "manifest.json", lambda m: m.update(n_jobs=m["n_jobs"] + 1))


SUMMARY_TAMPERINGS = [
    edit_n_blocks,
    edit_mean_ci95,
    edit_mean_ci95_block,
    edit_recorded_state_hash,
    edit_recorded_checkpoint_hash,
    edit_train_code,
    mark_operator_override,
    mark_partial_split,
    drop_all_blocks,
    edit_eval_step,
    drop_last_block,
    edit_train_config_checkpoint_count,
    mark_run_incomplete,
    edit_n_jobs,
]

TAMPERINGS = [
    shift_npz,
    edit_mean_nll,
    edit_seed,
    edit_config_seed,
    delete_eval,
    delete_run_entry,
    drop_checkpoint_step,
    swap_evals,
    edit_recorded_checkpoint_hash,
    edit_geometry,
]


# ---------------------------------------------------------------------- full mode
def test_full_gate_records_every_result_file_and_checkpoint(suite_dir):
    rec = json.loads((suite_dir / RECORD).read_text())
    assert rec["runs"] == ["softmax-s7", "lerp-k4-s7", "lerp-k4-s42"]
    assert set(rec["checkpoints"]) == {f"{r}/step_{s:06d}" for r in rec["runs"] for s in (8, 16)}
    ck = rec["checkpoints"][f"{RUN}/step_000016"]
    state = json.loads((_ckpt(suite_dir) / "state.json").read_text())
    assert ck["files"] == state["files"] and ck["n_blocks"] > 0
    assert "manifest.json" in rec["files"] and f"runs/{RUN}/eval/val/step_000016.npz" in rec["files"]
    assert all(f"runs/{r}/environment.jsonl" in rec["files"] for r in rec["runs"])  # where each run trained
    assert not any("/checkpoints/" in f for f in rec["files"])


@pytest.mark.parametrize("how", ["flip", "truncate", "delete", "swap"])
def test_full_gate_hashes_checkpoint_weights(suite_dir, tmp_path, how):
    d = _copy(suite_dir, tmp_path)
    model = _ckpt(d) / "model.safetensors"
    if how == "flip":
        b = bytearray(model.read_bytes())
        b[-5] ^= 0x01
        model.write_bytes(bytes(b))
    elif how == "truncate":
        model.write_bytes(model.read_bytes()[:-64])
    elif how == "delete":
        model.unlink()
    else:
        other = _ckpt(d, "lerp-k4-s42") / "model.safetensors"
        a, b = model.read_bytes(), other.read_bytes()
        model.write_bytes(b)
        other.write_bytes(a)
    rep = gate(d)
    assert len(rep.errors) == (2 if how == "swap" else 1), rep.errors
    assert all("model.safetensors" in e for e in rep.errors) and rep.record is None


@pytest.mark.parametrize(
    "tamper",
    [shift_npz, edit_mean_nll, edit_seed, delete_run_entry, drop_checkpoint_step],
    ids=lambda f: f.__name__,
)
def test_full_gate_cross_checks_summaries_and_manifest(suite_dir, tmp_path, tamper):
    d = _copy(suite_dir, tmp_path)
    tamper(d)
    rep = gate(d)
    assert len(rep.errors) == 1, rep.errors
    if tamper is edit_mean_nll:  # the summary was edited: the line names it, beside its arrays
        js = _eval(d).relative_to(d).as_posix()
        assert rep.errors[0].startswith(f"{js} disagrees with {Path(js).with_suffix('.npz').name}: mean_nll")


@pytest.mark.parametrize("tamper", SUMMARY_TAMPERINGS, ids=lambda f: f.__name__)
def test_full_gate_checks_each_evaluation_field(suite_dir, tmp_path, tamper):
    """Each field of an evaluation summary, the run status and the manifest's job count is checked on its own:
    one edit, one error, in full mode, where no recorded file hash stands behind the check."""
    d = _copy(suite_dir, tmp_path)
    tamper(d)
    rep = gate(d, write_record=False)
    assert len(rep.errors) == 1, rep.errors


def _geo(d, step=16):
    return d / "runs" / RUN / "diagnostics" / "geometry" / f"step_{step:06d}.json"


GEOMETRY_TAMPERINGS = {
    "deleted": lambda d: _geo(d).unlink(),
    "not JSON": lambda d: _geo(d).write_text("not json {"),
    "of another step": lambda d: _edit_json(_geo(d), lambda g: g.update(step=8, checkpoint="step_000008")),
    "of another checkpoint": lambda d: _edit_json(
        _geo(d), lambda g: g.update(checkpoint_state_sha256="0" * 64)
    ),
    "under another operator": lambda d: _edit_json(_geo(d), lambda g: g.update(probe_operator_arg="softmax")),
    "over other blocks": lambda d: _edit_json(_geo(d), lambda g: g["request"].update(max_blocks=1)),
    "without its layer means": lambda d: _edit_json(_geo(d), lambda g: g["mean"].pop("tv")),
}


@pytest.mark.parametrize("tamper", GEOMETRY_TAMPERINGS.values(), ids=GEOMETRY_TAMPERINGS.keys())
def test_full_gate_checks_the_geometry_probes_the_report_reads(suite_dir, tmp_path, tamper):
    """A suite that probes geometry: the full gate passed with a probe deleted or corrupt, and signed it off
    (the report then failed on the file, or had no geometry for the run)."""
    d = _copy(suite_dir, tmp_path)
    (d / RECORD).unlink()
    tamper(d)
    rep = gate(d)
    assert len(rep.errors) == 1 and "geometry" in rep.errors[0] and RUN in rep.errors[0], rep.errors
    assert not (d / RECORD).exists()  # nothing signed off


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda st: st.setdefault("operator", {}).update(full_name="lerp-k8"), "trained operator lerp-k8"),
        (lambda st: st.setdefault("code", {}).update(ops_sha256="0" * 64), "code identity 000000000000"),
    ],
    ids=["operator", "code"],
)
def test_full_gate_checks_the_checkpoints_own_operator_and_code(suite_dir, tmp_path, edit, says):
    """A checkpoint whose state.json names another operator or code than the manifest: the evaluation and the
    geometry probe re-pointed at the edited state.json, so only the checkpoint's own identity tells."""
    from kinterval.suite.gate import sha256_file

    d = _copy(suite_dir, tmp_path)
    state = _ckpt(d) / "state.json"
    _edit_json(state, edit)
    for js in (_eval(d), _geo(d)):
        _edit_json(js, lambda s: s.update(checkpoint_state_sha256=sha256_file(state)))
    (err,) = gate(d, write_record=False).errors
    assert err.startswith(f"{RUN} step 16: {says}") and "!= manifest" in err, err


def test_full_gate_checks_the_document_count_against_the_document_arrays(suite_dir, tmp_path):
    """A summary with document clusters whose n_documents is not the length of its document arrays."""
    from kinterval.eval.evaluate import evaluate_checkpoint

    d = _copy(suite_dir, tmp_path)
    summary = evaluate_checkpoint(_ckpt(d), doc_clusters=True, force=True, device="cpu")
    assert summary["n_documents"] >= 2 and gate(d, write_record=False).ok
    kept = _eval(d).read_bytes()
    _edit_json(_eval(d), lambda s: s.update(n_documents=s["n_documents"] + 5))
    (err,) = gate(d, write_record=False).errors
    assert f"the summary says n_documents {summary['n_documents'] + 5}" in err, err
    # the document-cluster mean and interval against the arrays (no test edited them before)
    for edit in (
        lambda s: s.update(doc_cluster_mean_nll=s["doc_cluster_mean_nll"] + 1e-3),
        lambda s: s.update(doc_cluster_ci95=[s["doc_cluster_ci95"][0], s["doc_cluster_ci95"][1] + 1e-3]),
    ):
        _eval(d).write_bytes(kept)
        _edit_json(_eval(d), edit)
        (err,) = gate(d, write_record=False).errors
        assert "doc_cluster_mean_nll / doc_cluster_ci95 differ from the document arrays" in err, err
    # a document array gone from the NPZ (its recorded hash updated, so that only the arrays tell)
    _eval(d).write_bytes(kept)
    npz = _eval(d).with_suffix(".npz")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files if k != "doc_tokens"}
    np.savez(npz, **arrays)
    _edit_json(_eval(d), lambda s: s.update(npz_sha256=sha256_file(npz)))
    errors = gate(d, write_record=False).errors
    assert any(
        "document clusters recorded without all of doc_ids, doc_nll, doc_tokens" in e for e in errors
    ), errors


def test_a_summary_from_before_the_recorded_block_is_an_error_that_says_re_evaluate(suite_dir, tmp_path):
    """A summary of version 2 has no mean_ci95_block (its mean_ci95 used block min(16, n), which below 32
    blocks is no valid block): the gate reports it with what to do, whatever version it claims."""
    d = _copy(suite_dir, tmp_path)
    for version in (2, 3):

        def old_summary(s, v=version):
            s.update(summary_version=v)
            s.pop("mean_ci95_block", None)

        _edit_json(_eval(d), old_summary)
        errors = [e for e in gate(d, write_record=False).errors if f"{RUN}/eval/val/step_000016" in e]
        assert len(errors) == 1 and "no mean_ci95_block" in errors[0] and "re-evaluate" in errors[0], errors


def test_a_run_that_never_started_is_one_error(suite_dir, tmp_path):
    """A suite cut short before a run began (no run folder): one line naming the run and the way on, not one
    per checkpoint, evaluation and probe it would have had."""
    d = _copy(suite_dir, tmp_path)
    shutil.rmtree(d / "runs" / RUN)
    rep = gate(d, write_record=False)
    assert len(rep.errors) == 1 and RUN in rep.errors[0] and "not run" in rep.errors[0], rep.errors
    assert "--partial" in rep.errors[0] and rep.jobs == gate(suite_dir, write_record=False).jobs


def test_full_gate_needs_the_data_folder(suite_dir, tmp_path):
    d = _copy(suite_dir, tmp_path)
    shutil.rmtree(d / "data")
    rep = gate(d)
    data = (d / "data").resolve()
    assert len(rep.errors) == 1 and str(data) in rep.errors[0] and "data folder" in rep.errors[0]


def test_full_gate_tells_a_data_folder_of_other_content_by_its_shards(suite_dir, tmp_path):
    """The suite's data folder replaced by another corpus of the same size (synthetic, seed 1: the same
    token and block counts, so names and block counts agree): one error for the folder, counting the
    checkpoints (training split) and evaluations (val) that record other shard hashes. One run's checkpoint
    recording other training data is that 1 of 6, named."""
    from kinterval.suite.gate import sha256_file

    d = _copy(suite_dir, tmp_path)
    assert gate(d, write_record=False).ok
    shutil.rmtree(d / "data")
    assert main(["data", "prepare", "--source", "synthetic", "--tokens", "20000", "--seed", "1",
                 "--out", str(d / "data")]) == 0  # fmt: skip
    (err,) = gate(d, write_record=False).errors
    assert err.startswith(f"data folder {(d / 'data').resolve()}: "), err
    assert "6 of 6 checkpoints record training shard hashes other than it holds" in err, err
    assert "6 of 6 evaluations record val shard hashes other than it holds" in err, err

    d = _copy(suite_dir, tmp_path / "one")
    state = _ckpt(d) / "state.json"
    _edit_json(state, lambda st: st["identity"]["data.identity"].update(shards_sha256=["0" * 64]))
    for js in (_eval(d), _geo(d)):
        _edit_json(js, lambda x: x.update(checkpoint_state_sha256=sha256_file(state)))
    (err,) = gate(d, write_record=False).errors
    assert (
        f"1 of 6 checkpoints record training shard hashes other than it holds (first: {RUN} step 16)" in err
    )
    assert "evaluations" not in err, err


def test_full_gate_hashes_the_shard_files_not_only_meta_json(suite_dir, tmp_path):
    """A flipped byte in a shard passed: the gate compared the runs' hashes with those meta.json lists."""
    d = _copy(suite_dir, tmp_path)
    shard = d / "data" / "val_0000.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    (err,) = gate(d, write_record=False).errors
    assert err == (
        f"data folder {(d / 'data').resolve()}: 1 of 1 val shard files do not hold what its meta.json lists "
        "(sha256; first: val_0000.bin): changed or written over since it was prepared"
    )


@pytest.mark.parametrize("what", ["garbage npz", "npy not npz", "corrupt json", "no nll"])
def test_corrupt_result_files_are_error_lines(suite_dir, tmp_path, capsys, what):
    d = _copy(suite_dir, tmp_path)
    js = _eval(d)
    npz = js.with_suffix(".npz")
    if what == "garbage npz":
        npz.write_bytes(b"\x00garbage" * 10)
    elif what == "npy not npz":
        np.save(npz.with_suffix(".npy"), np.zeros(3))
        npz.with_suffix(".npy").rename(npz)
    elif what == "corrupt json":
        js.write_text('{"mean_nll": 5.0,')
    else:
        np.savez(npz, loss=np.zeros(3))
    assert main(["suite", "gate", str(d)]) == 1
    out = capsys.readouterr().out
    bad = (js if what == "corrupt json" else npz).relative_to(d).as_posix()
    lines = [x for x in out.splitlines() if x.startswith("ERROR")]
    assert lines == [lines[0]] and lines[0].startswith(f"ERROR {bad}: ")
    assert "3 runs, 6 jobs, 1 errors" in out


def test_unreadable_manifest_is_an_error_line(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text("{not json")
    assert main(["suite", "gate", str(tmp_path)]) == 1
    assert "ERROR manifest.json: unreadable" in capsys.readouterr().out


# ---------------------------------------------------------------------- results-only mode
def test_results_only_green(results_dir, capsys):
    assert not any(results_dir.rglob("*.safetensors"))
    assert main(["suite", "gate", str(results_dir), "--results-only"]) == 0
    assert "(results only), suite tiny: 3 runs, 6 jobs, 0 errors" in capsys.readouterr().out


def test_a_full_gate_without_checkpoints_ends_with_the_results_only_hint(
    suite_dir, results_dir, tmp_path, capsys
):
    """A results folder (e.g. one in git) gave one "checkpoint missing" error per checkpoint, and no hint."""
    assert main(["suite", "gate", str(results_dir)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert sum("checkpoint missing" in x for x in lines) == 6
    cmd = "a results folder is checked with `kinterval suite gate {} --results-only`"
    assert lines[-1] == f"hint: {results_dir} holds no checkpoints; {cmd.format(results_dir)}"
    d = _copy(suite_dir, tmp_path)
    shutil.rmtree(_ckpt(d))  # one gone, the others there: the only error is a missing checkpoint
    assert main(["suite", "gate", str(d)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"hint: every error is a missing checkpoint; {cmd.format(d)}", lines
    _edit_json(_eval(d, step=8), lambda s: s.update(mean_nll=s["mean_nll"] + 0.01))  # another error: no hint
    assert main(["suite", "gate", str(d)]) == 1
    assert "hint:" not in capsys.readouterr().out


@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda f: f.__name__)
def test_results_only_one_error_per_tampering(results_dir, tmp_path, tamper):
    d = _copy(results_dir, tmp_path)
    tamper(d)
    rep = gate(d, results_only=True)
    assert len(rep.errors) == 1, rep.errors


def test_results_only_one_error_per_summary_edit(results_dir, tmp_path):
    for i, tamper in enumerate(SUMMARY_TAMPERINGS):
        d = _copy(results_dir, tmp_path / str(i))
        tamper(d)
        assert len(gate(d, results_only=True).errors) == 1, tamper.__name__


def _drop_recorded_checkpoint(rec):
    del rec["checkpoints"][f"{RUN}/step_000016"]


def _edit_recorded_block_count(rec):
    rec["checkpoints"][f"{RUN}/step_000016"]["n_blocks"] += 1


@pytest.mark.parametrize(
    ("edit", "says"),
    [(_drop_recorded_checkpoint, "not in gate.json"), (_edit_recorded_block_count, "evaluated blocks")],
)
def test_results_only_holds_each_job_against_the_record(results_dir, tmp_path, edit, says):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / RECORD, edit)
    (err,) = gate(d, results_only=True).errors
    assert f"{RUN} step 16" in err and says in err


def test_results_only_reports_a_result_file_the_record_lacks(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    (d / "runs" / RUN / "notes.txt").write_text("added after the gate\n")
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"runs/{RUN}/notes.txt: not in {RECORD}")


def test_results_only_names_the_cause(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    swap_evals(d)
    (err,) = gate(d, results_only=True).errors
    assert "swapped" in err and "lerp-k4-s7" in err and "lerp-k4-s42" in err
    d = _copy(results_dir, tmp_path / "b")
    edit_seed(d)
    (err,) = gate(d, results_only=True).errors
    assert "lerp-k4-s7" in err and "seed" in err


def test_results_only_needs_the_record(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    (d / RECORD).unlink()
    rep = gate(d, results_only=True)
    assert len(rep.errors) == 1 and rep.errors[0].startswith(f"{RECORD}: not found")


@pytest.mark.parametrize("how", ["removed", "edited"])
def test_manifest_suite_file_must_be_there_and_intact(suite_dir, tmp_path, how):
    d = _copy(suite_dir, tmp_path)
    if how == "removed":
        _edit_json(d / "manifest.json", lambda m: m.pop("suite_toml"))
    else:
        _edit_json(
            d / "manifest.json", lambda m: m.update(suite_toml=m["suite_toml"].replace("[7, 42]", "[7, 43]"))
        )
    (err,) = gate(d).errors
    assert err.startswith("manifest.json: cannot be checked against its suite file")
    assert ("neither embedded nor shipped" if how == "removed" else "sha256") in err


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_manifest_suite_file_cannot_write_outside_the_temp_folder(suite_dir, tmp_path, where):
    """A manifest's suite_file is only a name: the gate never writes the embedded suite text where it says."""
    d = _copy(suite_dir, tmp_path)
    target = tmp_path / "victim.toml"
    name = str(target) if where == "absolute" else "../" * 12 + str(target).lstrip("/")
    _edit_json(d / "manifest.json", lambda m: m.update(suite_file=name))
    (err,) = gate(d, write_record=False).errors
    assert err.startswith("manifest.json: cannot be checked against its suite file")
    assert "suite_file" in err and "plain .toml file name" in err
    assert not target.exists()


def test_results_only_malformed_record_is_an_error_line(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / RECORD, lambda r: r.update(files=["manifest.json"]))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"{RECORD}: unusable")


# ---------------------------------------------------------------------- the run logs the report reads
def _corrupt_metrics(d):
    """A first line that is not JSON: `kinterval report` refuses such a log ("line 1 is corrupt")."""
    log = d / "runs" / RUN / "metrics.jsonl"
    log.write_text("garbage\n" + log.read_text())
    return log


def test_full_gate_reads_each_run_log_as_the_report_does(suite_dir, tmp_path, capsys):
    """The old gate hashed a corrupt metrics.jsonl into gate.json, 0 errors; the report then refused it."""
    d = _copy(suite_dir, tmp_path)
    (d / RECORD).unlink()
    _corrupt_metrics(d)
    assert main(["suite", "gate", str(d)]) == 1
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("ERROR")]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR runs/{RUN}/metrics.jsonl: line 1 is corrupt")
    assert "3 runs, 6 jobs, 1 errors" in out and not (d / RECORD).exists()


@pytest.mark.parametrize("keep", [0, 1, -1])
def test_full_gate_refuses_a_truncated_log_of_a_completed_run(suite_dir, tmp_path, capsys, keep):
    """A completed run's metrics.jsonl cut after its first row (or emptied, or without only its last row)
    passed the gate, 0 errors, and the report then gave clip statistics of the first steps (it now refuses
    the file, as the gate does)."""
    d = _copy(suite_dir, tmp_path)
    (d / RECORD).unlink()
    log = d / "runs" / RUN / "metrics.jsonl"
    rows = log.read_text().splitlines(keepends=True)
    log.write_text("".join(rows[:keep]))
    trained = json.loads((d / "runs" / RUN / "status.json").read_text())["step"]
    assert main(["suite", "gate", str(d)]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    ends = "no logged step" if keep == 0 else f"its last row is step {json.loads(rows[keep - 1])['step']}"
    assert lines == [f"ERROR runs/{RUN}/metrics.jsonl: truncated: {ends} of the {trained} the run trained"]
    assert not (d / RECORD).exists()


def test_full_gate_refuses_a_log_with_a_hole(suite_dir, tmp_path, capsys):
    """A log deleted or cut inside a row, then resumed, ends at the last step but lacks the rows before the
    checkpoint: it passed the gate, and the report's clip statistics left those steps out."""
    d = _copy(suite_dir, tmp_path)
    (d / RECORD).unlink()
    log = d / "runs" / RUN / "metrics.jsonl"
    rows = log.read_text().splitlines(keepends=True)
    steps = [json.loads(r)["step"] for r in rows if "event" not in json.loads(r)]
    every = steps[1] - steps[0]
    log.write_text("".join(rows[:1] + rows[3:]))  # the second and third rows lost
    assert main(["suite", "gate", str(d)]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert lines == [f"ERROR runs/{RUN}/metrics.jsonl: 2 logged step(s) missing below its last row (step "
                     f"{steps[-1]}), the first {steps[1]} (a row every {every} steps)"]  # fmt: skip
    assert not (d / RECORD).exists()


def test_full_gate_follows_a_log_every_changed_on_resume(suite_dir, tmp_path, capsys):
    """A run resumed by hand with another --log-every logs the change (event log_every): the gate expects
    each stretch's own rows. It took the manifest's cadence for the whole log and called the steps the
    new cadence skips missing; a hole after the change is still an error."""
    d = _copy(suite_dir, tmp_path)
    (d / RECORD).unlink()
    log = d / "runs" / RUN / "metrics.jsonl"
    rows = [json.loads(r) for r in log.read_text().splitlines()]
    steps = [r["step"] for r in rows if "event" not in r]
    every, at, last = steps[1] - steps[0], steps[1], steps[-1]
    assert last > at + 3 * every  # the changed stretch holds several rows
    kept = [r for r in rows if r["step"] <= at or r["step"] % (2 * every) == 0 or r["step"] == last]
    change = {"event": "log_every", "step": at, "every": 2 * every, "was_every": every}
    kept.insert(kept.index(next(r for r in kept if r["step"] > at)), change)
    log.write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert main(["suite", "gate", str(d)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    hole = next(r["step"] for r in kept if r["step"] > at and "event" not in r)
    log.write_text("".join(json.dumps(r) + "\n" for r in kept if r["step"] != hole))
    assert main(["suite", "gate", str(d)]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert len(lines) == 1 and f"missing below its last row (step {last}), the first {hole}" in lines[0]


def test_results_only_reads_each_run_log_even_when_the_record_signs_it_off(results_dir, tmp_path):
    """A gate.json written by the old gate holds the corrupt log's hash: the bytes match, the log is still
    one error."""
    from kinterval.suite.gate import sha256_file

    d = _copy(results_dir, tmp_path)
    log = _corrupt_metrics(d)
    _edit_json(d / RECORD, lambda r: r["files"].update({f"runs/{RUN}/metrics.jsonl": sha256_file(log)}))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"runs/{RUN}/metrics.jsonl: line 1 is corrupt")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m.pop("runs"), "no valid 'runs' entry"),
        (lambda m: m.update(runs={"a": 1}), "no valid 'runs' entry"),
        (lambda m: m["runs"].append([1, 2]), "run entry 3 is not a JSON object"),
        (lambda m: m["runs"][1].pop("run_dir"), "run entry 1 ('lerp-k4-s7') has no valid 'run_dir'"),
        (lambda m: m["runs"][0].update(seed="7"), "run entry 0 ('softmax-s7') has no valid 'seed'"),
    ],
)
def test_a_malformed_manifest_is_one_error_line(results_dir, tmp_path, capsys, edit, says):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", edit)
    assert main(["suite", "gate", str(d), "--results-only"]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert len(lines) == 1 and lines[0].startswith("ERROR manifest.json: unreadable") and says in lines[0]


# ---------------------------------------------------------------------- results-only: the recorded bytes
def shift_eval_consistently(d):
    """Every block NLL lower by 0.05, with mean_nll and mean_ci95 recomputed as the evaluator writes them:
    the summary agrees with its arrays, only the bytes gate.json has tell."""
    npz = _eval(d).with_suffix(".npz")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    nll = arrays["nll"] = arrays["nll"] - 0.05
    np.savez(npz, **arrays)
    ci = block_bootstrap_ci(nll, block=block_length(nll.size))
    _edit_json(_eval(d), lambda s: s.update(mean_nll=float(nll.mean()), mean_ci95=[ci.lo, ci.hi]))


def double_geometry_mean(d):
    _edit_json(_geo(d), lambda g: g["mean"].update(span=2 * g["mean"]["span"]))


def edit_metrics_value(d):
    log = d / "runs" / RUN / "metrics.jsonl"
    lines = log.read_text().splitlines()
    rec = json.loads(lines[-1])
    rec["train_loss"] += 1.0
    log.write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")


def edit_environment(d):
    env = d / "runs" / RUN / "environment.jsonl"
    (row,) = [json.loads(x) for x in env.read_text().splitlines()]
    env.write_text(json.dumps({**row, "device_name": "NVIDIA H200"}) + "\n")


@pytest.mark.parametrize(
    ("tamper", "rel"),
    [
        (shift_eval_consistently, f"runs/{RUN}/eval/val/step_000016.json"),
        (double_geometry_mean, f"runs/{RUN}/diagnostics/geometry/step_000016.json"),
        (edit_metrics_value, f"runs/{RUN}/metrics.jsonl"),
        (edit_environment, f"runs/{RUN}/environment.jsonl"),
    ],
    ids=["evaluation", "geometry", "metrics", "environment"],
)
def test_results_only_compares_each_file_with_the_recorded_bytes(results_dir, tmp_path, tamper, rel):
    """An edit that leaves every file self-consistent is still caught: its bytes differ from gate.json."""
    d = _copy(results_dir, tmp_path)
    tamper(d)
    assert gate(d, results_only=True).errors == [f"{rel}: differs from the bytes {RECORD} has (sha256)"]


def test_results_only_compares_the_manifest_with_the_recorded_bytes(results_dir, tmp_path):
    """A manifest edit that no specific check explains (the code's commit) is the recorded-bytes error."""
    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", lambda m: m["code"].update(git_commit="0" * 40))
    (err,) = gate(d, results_only=True).errors
    assert err == f"manifest.json: differs from the bytes {RECORD} has (sha256)"


def test_results_only_refuses_the_record_of_another_suite(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / RECORD, lambda r: r.update(suite="other"))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"{RECORD}: unusable") and "suite 'other'" in err


def test_results_only_reports_a_run_the_record_does_not_sign_off(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / RECORD, lambda r: r["runs"].remove(RUN))
    assert gate(d, results_only=True).errors == [f"manifest.json: run {RUN} is not in {RECORD}"]


@pytest.fixture(scope="module")
def results_with_override(suite_dir, tmp_path_factory):
    """The suite with a second evaluation of one checkpoint (under an operator override, in
    eval/val__op-softmax/), gated in full, then copied as committed: no checkpoints, no data."""
    from kinterval.eval.evaluate import evaluate_checkpoint

    root = tmp_path_factory.mktemp("override")
    full = root / "full"
    shutil.copytree(suite_dir, full)
    (full / RECORD).unlink()
    evaluate_checkpoint(_ckpt(full), operator="softmax", device="cpu")
    assert gate(full).ok
    dst = root / "results"
    shutil.copytree(full, dst, ignore=shutil.ignore_patterns("checkpoints", "data"))
    return dst


def _override_eval(d):
    return d / "runs" / RUN / "eval" / "val__op-softmax" / "step_000016.json"


def test_results_only_accepts_another_evaluation_of_a_recorded_checkpoint(results_with_override, capsys):
    assert _override_eval(results_with_override).is_file()
    assert main(["suite", "gate", str(results_with_override), "--results-only"]) == 0
    assert "3 runs, 6 jobs, 0 errors" in capsys.readouterr().out


def test_results_only_checks_another_evaluation_against_the_record(results_with_override, tmp_path):
    """Its summary names another checkpoint; gate.json re-recorded over the edited bytes: one error."""
    from kinterval.suite.gate import sha256_file

    d = _copy(results_with_override, tmp_path)
    js = _override_eval(d)
    _edit_json(js, lambda s: s.update(checkpoint_state_sha256="0" * 64))
    _edit_json(d / RECORD, lambda r: r["files"].update({js.relative_to(d).as_posix(): sha256_file(js)}))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"runs/{RUN}/eval/val__op-softmax/step_000016.json: not an evaluation of the run's")


def test_results_only_record_whose_partial_is_not_a_boolean_is_unusable(results_dir, tmp_path):
    """``"partial": "false"`` (a string, truthy) would make a full record partial: its runs' absence from the
    folder then reads as "not run", not as missing results."""
    d = _copy(results_dir, tmp_path)
    _edit_json(d / RECORD, lambda r: r.update(partial="false"))
    assert gate(d, results_only=True).errors == [f"{RECORD}: unusable (partial malformed)"]


# ---------------------------------------------------------------------- one edit, the error that names it
def add_block(d):
    """One block more than the split has, with a summary that agrees with the lengthened array."""
    npz = _eval(d).with_suffix(".npz")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    nll = arrays["nll"] = np.append(arrays["nll"], arrays["nll"][0])
    np.savez(npz, **arrays)
    ci = block_bootstrap_ci(nll, block=block_length(nll.size))
    _edit_json(
        _eval(d),
        lambda s: s.update(
            n_blocks=int(nll.size),
            mean_nll=float(nll.mean()),
            mean_ci95=[ci.lo, ci.hi],
            mean_ci95_block=block_length(nll.size),
        ),
    )
    return nll.size


def _manifest(fn):
    return lambda d: _edit_json(d / "manifest.json", fn)


ONE_EDIT = {
    "manifest row config": (
        edit_config_seed,
        f"manifest.json: run {RUN} differs from the suite file (config seed: 8 -> 7)",
    ),
    "manifest row eval_dir": (
        _manifest(lambda m: m["runs"][1].update(eval_dir=f"runs/{RUN}/eval/test")),
        f"manifest.json: run {RUN} differs from the suite file (eval_dir: 'runs/{RUN}/eval/test', suite file "
        f"'runs/{RUN}/eval/val')",
    ),
    "manifest row run_dir": (
        _manifest(lambda m: m["runs"][1].update(run_dir="runs/lerp-k4-s42")),
        f"manifest.json: run {RUN} differs from the suite file (run_dir: 'runs/lerp-k4-s42', suite file "
        f"'runs/{RUN}')",
    ),
    "manifest n_runs": (
        _manifest(lambda m: m.update(n_runs=m["n_runs"] + 1)),
        "manifest.json: n_runs / n_jobs differ from its run entries",
    ),
    "manifest eval settings": (
        _manifest(lambda m: m["eval"].update(doc_clusters=True)),
        "manifest.json: suite name or eval settings differ from the suite file",
    ),
    "evaluation of another checkpoint": (
        lambda d: _edit_json(_eval(d), lambda s: s.update(checkpoint="step_000008")),
        f"{RUN} step 16: the evaluation is of step_000008 (step 16)",
    ),
    "evaluation through another operator": (
        lambda d: _edit_json(_eval(d), lambda s: s.update(operator_used="softmax")),
        f"{RUN} step 16: evaluated through softmax, not the run's operator lerp-k4",
    ),
    "evaluation by other code": (
        lambda d: _edit_json(_eval(d), lambda s: s["eval_code"].update(ops_sha256="0" * 64)),
        f"{RUN} step 16: evaluation or training code identity differs from the manifest's",
    ),
    "geometry of another checkpoint": (
        lambda d: _edit_json(_geo(d), lambda g: g.update(checkpoint="step_000008")),
        f"runs/{RUN}/diagnostics/geometry/step_000016.json: geometry probe of step_000008 (step 16) "
        f"[{RUN} step 16]",
    ),
    "geometry of another operator's run": (
        lambda d: _edit_json(_geo(d), lambda g: g.update(operator_trained="softmax")),
        f"runs/{RUN}/diagnostics/geometry/step_000016.json: geometry probe under softmax, not the run's "
        f"[{RUN} step 16]",
    ),
}


@pytest.mark.parametrize(("tamper", "says"), ONE_EDIT.values(), ids=ONE_EDIT.keys())
def test_full_gate_names_each_edit_by_its_own_error(suite_dir, tmp_path, tamper, says):
    """Each check on its own, in full mode (no recorded file hash stands behind it): the one error it gives,
    word for word."""
    d = _copy(suite_dir, tmp_path)
    tamper(d)
    assert gate(d, write_record=False).errors == [says]


def test_an_evaluation_of_more_blocks_than_the_split_has_is_an_error(suite_dir, results_dir, tmp_path):
    d = _copy(suite_dir, tmp_path)
    n = add_block(d)
    want = f"{RUN} step 16: {n} evaluated blocks, the split has {n - 1}"
    assert gate(d, write_record=False).errors == [want]
    d = _copy(results_dir, tmp_path / "results")  # results-only: the block count gate.json recorded
    add_block(d)
    (err,) = gate(d, results_only=True).errors
    assert err == want


def test_full_gate_checks_another_evaluation_against_its_checkpoint(suite_dir, tmp_path):
    """An evaluation under an operator override (eval/val__op-softmax/) whose summary names another
    checkpoint than the run's: one error in full mode too, where the checkpoint's own state.json is hashed."""
    from kinterval.eval.evaluate import evaluate_checkpoint

    d = _copy(suite_dir, tmp_path)
    evaluate_checkpoint(_ckpt(d), operator="softmax", device="cpu")
    assert gate(d, write_record=False).ok
    js = d / "runs" / RUN / "eval" / "val__op-softmax" / "step_000016.json"
    _edit_json(js, lambda s: s.update(checkpoint_state_sha256="0" * 64))
    assert gate(d, write_record=False).errors == [
        f"runs/{RUN}/eval/val__op-softmax/step_000016.json: not an evaluation of the run's checkpoint "
        "step_000016 (state.json hash differs)"
    ]


def test_a_boolean_seed_is_a_malformed_manifest(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", lambda m: m["runs"][0].update(seed=True))
    (err,) = gate(d, results_only=True).errors
    assert (
        err.startswith("manifest.json: unreadable")
        and "run entry 0 ('softmax-s7') has no valid 'seed'" in err
    )


def test_a_float_checkpoint_step_is_a_malformed_manifest(results_dir, tmp_path):
    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", lambda m: m["runs"][1]["checkpoint_steps"].__setitem__(0, 8.0))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith("manifest.json: unreadable")
    assert f"run entry 1 ('{RUN}') has a checkpoint step that is not an integer" in err


def test_a_manifest_row_the_suite_file_lacks_is_named(results_dir, tmp_path):
    """A run entry added to the manifest (its counts updated too): the manifest error names it."""

    def add_row(m):
        m["runs"].append({**m["runs"][1], "run_id": "lerp-k4-s99", "seed": 99})
        m.update(n_runs=len(m["runs"]), n_jobs=m["n_jobs"] + 2)

    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", add_row)
    errors = gate(d, results_only=True).errors
    assert "manifest.json: run lerp-k4-s99 is not in the suite file" in errors, errors


@pytest.mark.parametrize("key", ["run_dir", "eval_dir"])
def test_a_manifest_row_pointing_at_another_runs_files_is_one_error(results_dir, tmp_path, key):
    """A row whose run_dir or eval_dir names another run's folder was one manifest error plus one error per
    job of the run (each job checked in the other run's folder); the run's files are where the suite file
    puts them, and are checked there."""
    d = _copy(results_dir, tmp_path)
    _edit_json(d / "manifest.json", lambda m: m["runs"][1].update({key: m["runs"][2][key]}))
    (err,) = gate(d, results_only=True).errors
    assert err.startswith(f"manifest.json: run {RUN} differs from the suite file ({key}: ")


def test_manifest_checks_that_stand_without_its_suite_file(suite_dir, results_dir, tmp_path):
    """A manifest whose suite file is not embedded (nor shipped) is still held against its schedule and
    against gate.json's runs: the specific error names the row, in place of the generic one."""

    def steps_dropped(m):
        m.pop("suite_toml")
        m["runs"][1]["checkpoint_steps"].pop(0)
        m["n_jobs"] -= 1

    d = _copy(suite_dir, tmp_path)
    _edit_json(d / "manifest.json", steps_dropped)
    assert gate(d, write_record=False).errors == [
        f"manifest.json: run {RUN}: checkpoint steps [16] != its schedule [8, 16]"
    ]

    def run_dropped(m):
        m.pop("suite_toml")
        m["runs"].pop(2)
        m.update(n_runs=2, n_jobs=4)

    d = _copy(results_dir, tmp_path / "results")
    _edit_json(d / "manifest.json", run_dropped)
    assert gate(d, results_only=True).errors == [f"manifest.json: run lerp-k4-s42 of {RECORD} is missing"]


def _elsewhere_unhashed(state):
    state["config"]["data"].update(dir="/elsewhere/tokens")
    state["identity"].pop("data.identity")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda st: st["config"]["optim"].update(lr=0.5), "optim.lr: 0.5 -> 0.003"),
        # a data folder recorded without the data's hashes: its path is all there is to hold
        (lambda st: _elsewhere_unhashed(st), "data.dir: '/elsewhere/tokens' -> 'data'"),
    ],
    ids=["lr", "data"],
)
def test_full_gate_checks_the_checkpoints_own_config(suite_dir, tmp_path, edit, says):
    """A checkpoint whose state.json records another learning rate, or another data folder, than the suite's;
    its evaluation and probe re-pointed at the edited state.json: the checkpoint's own config tells."""
    from kinterval.suite.gate import sha256_file

    d = _copy(suite_dir, tmp_path)
    state = _ckpt(d) / "state.json"
    _edit_json(state, edit)
    for js in (_eval(d), _geo(d)):
        _edit_json(js, lambda s: s.update(checkpoint_state_sha256=sha256_file(state)))
    assert gate(d, write_record=False).errors == [
        f"{RUN} step 16: config differs from the suite protocol ({says})"
    ]


def test_a_checkpoint_of_the_same_data_in_another_folder_passes_and_of_other_data_fails(suite_dir, tmp_path):
    """The data told by content: a checkpoint whose config names another data folder but whose recorded
    training shard hashes are the suite's data (the folder moved between runs) is no error; with other
    hashes it is, by the data check's count."""
    from kinterval.suite.gate import sha256_file

    d = _copy(suite_dir, tmp_path)
    state = _ckpt(d) / "state.json"

    def repoint():
        for js in (_eval(d), _geo(d)):
            _edit_json(js, lambda s: s.update(checkpoint_state_sha256=sha256_file(state)))

    _edit_json(state, lambda st: st["config"]["data"].update(dir="/elsewhere/tokens"))
    repoint()
    assert gate(d, write_record=False).errors == []
    # its evaluation records the moved folder too (its train_config and data_dir): told by its shard hashes
    _edit_json(_eval(d), lambda s: s["train_config"]["data"].update(dir="/elsewhere/tokens"))
    _edit_json(_eval(d), lambda s: s.update(data_dir="/elsewhere/tokens"))
    assert gate(d, write_record=False).errors == []
    _edit_json(state, lambda st: st["identity"]["data.identity"].update(shards_sha256=["0" * 64]))
    repoint()
    (err,) = gate(d, write_record=False).errors
    assert "checkpoints record training shard hashes other than it holds" in err


def test_the_report_refuses_evaluation_files_swapped_or_edited(results_dir, tmp_path):
    """The gate caught these; the report read them as the checkpoint's NLL: a swap of two runs' evaluations
    gave a +0.0150 "separated" row for a difference of 1.6e-6, an NPZ with +0.5 in nll a ΔNLL of +0.5."""
    from kinterval.report.results import load_results

    d = _copy(results_dir, tmp_path / "swap")
    a, b = (d / "runs" / run / "eval" / "val" / "step_000016" for run in (RUN, "lerp-k4-s42"))
    for suffix in (".json", ".npz"):
        x, y = a.with_suffix(suffix), b.with_suffix(suffix)
        tmp = x.read_bytes()
        x.write_bytes(y.read_bytes())
        y.write_bytes(tmp)
    with pytest.raises(ValueError, match="an evaluation of run .*lerp-k4-s42.*, not of runs/lerp-k4-s7"):
        load_results(d)
    d = _copy(results_dir, tmp_path / "edit")
    npz = d / "runs" / RUN / "eval" / "val" / "step_000016.npz"
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(npz, **{**arrays, "nll": arrays["nll"] + 0.5})
    with pytest.raises(ValueError, match=r"step_000016.json and \S+step_000016.npz disagree \(its npz"):
        load_results(d)


def test_a_torn_status_is_one_error_and_a_damaged_environment_log_is_named(suite_dir, tmp_path):
    """A torn status.json was also blamed on the intact metrics.jsonl (two errors, one at the wrong file);
    a damaged environment.jsonl passed the gate, and the report then refused the folder."""
    d = _copy(suite_dir, tmp_path)
    status = d / "runs" / RUN / "status.json"
    status.write_text(status.read_text()[:12])
    errors = gate(d).errors
    assert len(errors) == 1 and "status.json: unreadable" in errors[0], errors
    status.write_text((suite_dir / "runs" / RUN / "status.json").read_text())
    env = d / "runs" / RUN / "environment.jsonl"
    env.write_text(env.read_text() + '{"device": "x"}\n')
    (error,) = gate(d).errors
    assert f"runs/{RUN}/environment.jsonl, line 2: not a session record" in error, error
    env.write_bytes(env.read_bytes() + b"\xff\xfe\n")  # not text: one line naming the file, not a traceback
    (error,) = gate(d).errors
    assert f"runs/{RUN}/environment.jsonl: not a session log (bytes that are not text" in error, error
