"""The checkpoint files themselves (``kinterval.train.checkpoint``), without a training run: what a save
keeps, which steps and folders are found, and which damaged or edited ``state.json`` files are refused
(docs/training.md §4). Each test writes tiny checkpoints and takes milliseconds."""

import hashlib
import json
import shutil

import pytest
import torch

from kinterval.model import GPT, ModelConfig
from kinterval.train import checkpoint as C
from kinterval.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint


def tiny_state():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    return GPT(cfg).state_dict(), {"config": {}, "model_config": cfg.to_dict()}


def edit_state(ck, rehash=True, **changes):
    """Rewrite a checkpoint's state.json with ``changes`` (None deletes a key); ``rehash`` keeps its
    ``state_sha256`` consistent (an edit that the own-hash check cannot see), else drops it."""
    state = json.loads((ck / "state.json").read_text())
    for k, v in changes.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    state.pop("state_sha256", None)
    if rehash:
        state["state_sha256"] = C.state_sha256(state)
    (ck / "state.json").write_text(json.dumps(state))


def test_an_optimizer_state_dict_round_trips_with_its_integer_keys(tmp_path):
    """``optimizer`` of a loaded checkpoint is the nested state dict that was saved: torch's AdamW keys its
    per-parameter state by integer ids, and a fresh optimizer loaded from it continues exactly."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        (w**2).sum().backward()
        opt.step()
    msd, state = tiny_state()
    save_checkpoint(tmp_path, 3, msd, opt.state_dict(), state)
    loaded = load_checkpoint(latest_checkpoint(tmp_path)).optimizer
    assert list(loaded["state"]) == [0] and loaded["param_groups"][0]["params"] == [0]
    assert torch.equal(loaded["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = torch.optim.AdamW([w2], lr=0.1)
    opt2.load_state_dict(loaded)
    for o, p in ((opt, w), (opt2, w2)):
        o.zero_grad()
        (p**2).sum().backward()
        o.step()
    assert torch.equal(w, w2)  # the moments came back: without them the step would differ


def test_steps_past_six_digits_are_found_and_ordered_by_number(tmp_path):
    """``step_{step:06d}``: a millionth step has seven digits, and the newest checkpoint is the largest step
    number, not the last name in text order ("step_1000000" < "step_999999" as text)."""
    msd, state = tiny_state()
    for step in (999_999, 10, 1_000_000, 9):
        save_checkpoint(tmp_path, step, msd, {}, state)
    root = tmp_path / "checkpoints"
    names = ["step_000009", "step_000010", "step_999999", "step_1000000"]
    assert C.list_checkpoints(tmp_path) == [root / n for n in names]
    assert C.checkpoint_step(root / "step_1000000") == 1_000_000
    (root / "LATEST").unlink()  # no LATEST: the newest by step
    assert latest_checkpoint(tmp_path) == root / "step_1000000"
    assert load_checkpoint(root / "step_1000000").state["step"] == 1_000_000


def test_latest_is_followed_when_it_names_an_older_checkpoint_of_the_run(tmp_path, recwarn):
    """docs §4: LATEST is followed when it holds a ``step_NNNNNN`` name of a checkpoint beside it (e.g. set
    back by hand to resume from an earlier step), with no warning."""
    msd, state = tiny_state()
    for step in (2, 4):
        save_checkpoint(tmp_path, step, msd, {}, state)
    root = tmp_path / "checkpoints"
    (root / "LATEST").write_text("step_000002\n")
    assert latest_checkpoint(tmp_path) == root / "step_000002"
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    # A path is not a name, even when its last part is a step this run has: warned, and the newest is used.
    (root / "LATEST").write_text(str(tmp_path / "other" / "checkpoints" / "step_000002") + "\n")
    with pytest.warns(UserWarning, match="does not name a checkpoint of this run"):
        assert latest_checkpoint(tmp_path) == root / "step_000004"


def test_a_step_folder_without_state_json_is_not_a_checkpoint(tmp_path):
    """A ``step_*`` folder with no state.json (copied in part, or made by hand) is not listed; the complete
    checkpoint before it is the newest."""
    msd, state = tiny_state()
    save_checkpoint(tmp_path, 2, msd, {}, state)
    root = tmp_path / "checkpoints"
    (root / "step_000004").mkdir()
    shutil.copy(root / "step_000002" / "model.safetensors", root / "step_000004")
    (root / "LATEST").unlink()
    assert C.list_checkpoints(tmp_path) == [root / "step_000002"]
    assert latest_checkpoint(tmp_path) == root / "step_000002"


def test_a_save_after_a_kill_clears_the_leftovers_of_the_killed_save(tmp_path, monkeypatch):
    """A kill leaves a half-written ``.tmp-step_*`` folder, or both ``step_*`` and its ``.old-step_*`` copy
    (killed while the old copy was being removed): the next save of that step still completes and leaves
    only the checkpoint and LATEST."""
    msd, state = tiny_state()
    root = tmp_path / "checkpoints"
    (root / ".tmp-step_000001").mkdir(parents=True)
    (root / ".tmp-step_000001" / "model.safetensors").write_bytes(b"half")
    save_checkpoint(tmp_path, 1, msd, {}, state)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_000001"]

    shutil.copytree(root / "step_000001", root / ".old-step_000001")  # as the killed re-save leaves it
    new = {k: v + 1 for k, v in msd.items()}
    save_checkpoint(tmp_path, 1, new, {}, state)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_000001"]
    got = load_checkpoint(latest_checkpoint(tmp_path)).model["transformer.wte.weight"]
    assert torch.equal(got, new["transformer.wte.weight"])


def test_a_tensor_file_without_a_recorded_sha256_is_refused(tmp_path):
    """docs §4: each tensor file is checked against the sha256 in state.json; a state.json (its own hash
    made to fit) that records none for a file cannot vouch for it."""
    msd, state = tiny_state()
    ck = save_checkpoint(tmp_path, 1, msd, {}, state)
    files = json.loads((ck / "state.json").read_text())["files"]
    del files["optimizer.safetensors"]
    edit_state(ck, files=files)  # its own hash recomputed: only the files entry can tell
    with pytest.raises(CheckpointError, match=r"records no sha256 for optimizer\.safetensors"):
        load_checkpoint(ck)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format_version": 2}, r"unknown format 'kinterval-checkpoint' v2"),
        ({"step": True}, r"no valid step \(True\)"),
        ({"rng": None}, r"lacks a valid 'rng' entry"),
        ({"rng": [1, 2]}, r"lacks a valid 'rng' entry"),
    ],
)
def test_a_consistently_rehashed_bad_state_json_is_refused(tmp_path, change, match):
    """docs §4: the format and its version, a step (an integer: JSON true is not step 1) and the RNG state are
    checked even when state_sha256 was recomputed to fit the edit."""
    msd, state = tiny_state()
    ck = save_checkpoint(tmp_path, 1, msd, {}, state)
    edit_state(ck, **change)
    with pytest.raises(CheckpointError, match=match):
        C.read_state(ck, verify=True)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(ck)


def test_an_optimizer_structure_naming_a_missing_tensor_is_a_checkpoint_error(tmp_path):
    """An optimizer structure that names a tensor the file does not hold is a CheckpointError naming the
    mismatch, not a KeyError from inside the loader."""
    msd, state = tiny_state()
    ck = save_checkpoint(tmp_path, 1, msd, {"state": {0: {"exp_avg": torch.ones(2)}}}, state)
    structure = {"state": {"__int_keys__": {"0": {"exp_avg": {"__tensor__": "state.0.exp_avg_sq"}}}}}
    edit_state(ck, optimizer_structure=structure)
    with pytest.raises(CheckpointError, match="optimizer_structure does not match the tensors"):
        load_checkpoint(ck)


def test_config_differences_lists_a_field_that_one_side_lacks():
    """``field: saved -> requested`` for every differing field, a field present on one side only included
    (e.g. a config field added since the checkpoint was written)."""
    saved = {"optim": {"lr": 0.1}, "seed": 0}
    requested = {"optim": {"lr": 0.1, "beta2": 0.95}, "seed": 0}
    assert C.config_differences(saved, requested) == ["optim.beta2: None -> 0.95"]
    assert C.config_differences(requested, saved) == ["optim.beta2: 0.95 -> None"]
    assert C.config_differences(saved, saved) == []


def test_the_code_hash_covers_every_source_file_under_ops(tmp_path, monkeypatch):
    """docs §4: the code identity holds the SHA-256 of the ``src/kinterval/ops/`` sources: the triton kernels
    in ``ops/triton/`` included (relative path + bytes, sorted, as ``ops_sha256`` documents)."""
    pkg = tmp_path / "kinterval"
    (pkg / "train").mkdir(parents=True)
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "ops" / "api.py").write_bytes(b"A = 1\n")
    (pkg / "ops" / "triton" / "kernels.py").write_bytes(b"K = 1\n")
    (pkg / "ops" / "notes.txt").write_bytes(b"not a source file\n")
    monkeypatch.setattr(C, "__file__", str(pkg / "train" / "checkpoint.py"))
    want = hashlib.sha256(b"api.py\0A = 1\n\0triton/kernels.py\0K = 1\n\0").hexdigest()
    assert C.ops_sha256() == want
    (pkg / "ops" / "triton" / "kernels.py").write_bytes(b"K = 2\n")
    assert C.ops_sha256() != want


def test_the_loaded_model_state_is_whole_with_the_tied_head_restored(tmp_path):
    """docs §4: the tied ``lm_head.weight`` is stored once, as ``transformer.wte.weight``; the loaded
    ``model`` (of ``load_checkpoint`` and ``read_model_weights``) has every key again: it loads strictly."""
    msd, state = tiny_state()
    ck = save_checkpoint(tmp_path, 1, msd, {}, state)
    for model in (load_checkpoint(ck).model, C.read_model_weights(ck)):
        assert set(model) == set(msd)
        assert torch.equal(model["lm_head.weight"], msd["transformer.wte.weight"])
        cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)
        GPT(cfg).load_state_dict(model, strict=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_is_the_checkouts_not_that_of_a_repository_around_an_install(tmp_path, monkeypatch):
    """A package installed in a user's project (its .venv inside their git repository) recorded the user's
    HEAD as kinterval's commit."""
    import subprocess

    repo = tmp_path / "project"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    head = head.stdout.strip()
    for where, want in ((".venv/lib/site-packages", None), ("src", head)):
        module = repo / where / "kinterval" / "train" / "checkpoint.py"
        module.parent.mkdir(parents=True)
        monkeypatch.setattr(C, "__file__", str(module))
        assert C.git_commit() == want, where
