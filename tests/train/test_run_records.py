"""The run's record files (``kinterval.train.metrics``) and the loop's deterministic mode
(``kinterval.train.loop.deterministic``), tested directly: docs/training.md §3 and §5."""

import json
import os

import pytest
import torch

from kinterval.train.loop import deterministic
from kinterval.train.metrics import MetricsLog, read_metrics, write_status


def write(run, data: bytes):
    (run / "metrics.jsonl").write_bytes(data)


def test_only_an_unterminated_last_line_is_dropped(tmp_path):
    """docs §5: a torn last line (a write cut short, so no newline) is dropped; a corrupt line that was
    written in full, the last one included, is refused."""
    write(tmp_path, b'{"step": 1}\n{"step": 2, "lo')
    assert read_metrics(tmp_path) == [{"step": 1}]
    write(tmp_path, b'{"step": 1}\n{"step": 2, "lo\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is corrupt"):
        read_metrics(tmp_path)


def test_a_line_with_a_stray_byte_or_a_non_object_is_refused(tmp_path):
    """A line damaged by a stray non-UTF-8 byte is corrupt (not read as if the byte were absent), and a line
    that is JSON but not an object is refused by its number."""
    write(tmp_path, b'{"step": 1}\n{"step"\xff: 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is corrupt"):
        read_metrics(tmp_path)
    write(tmp_path, b'{"step": 1}\n[2, 3]\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON object"):
        read_metrics(tmp_path)


@pytest.mark.parametrize(
    "line, says",
    [
        (b'{"step": 2, "tokens": "12x"}', "'tokens' is '12x', not an integer"),
        (b'{"step": "2"}', "'step' is '2', not an integer"),
        (b'{"step": 2, "tokens": true}', "'tokens' is True, not an integer"),
        (b'{"step": 2, "train_loss": "low"}', "'train_loss' is 'low', not a number"),
        (b'{"step": 2, "grad_norm": [1.0]}', "'grad_norm' is \\[1.0\\], not a number"),
        (b'{"step": 2, "clipped": 1}', "'clipped' is 1, not true or false"),
        (b'{"event": "validation", "step": 2, "val_loss": {}}', "'val_loss' is \\{\\}, not a number"),
        (b'{"step": 2, "tr`in_loss": 2.4}', "unknown field 'tr`in_loss'"),  # a damaged key: its value unread
        # json reads a bare NaN as a float: it passed the gate, and the report printed "nan"
        (
            b'{"step": 2, "train_loss": NaN}',
            "'train_loss' is a bare nan \\(the trainer writes non-finite values as text\\)",
        ),
        (
            b'{"step": 2, "grad_norm": -Infinity}',
            "'grad_norm' is a bare -inf \\(the trainer writes non-finite values as text\\)",
        ),
    ],
)
def test_a_row_whose_known_fields_have_the_wrong_type_is_refused_by_its_line(tmp_path, line, says):
    """Readers compare and average these fields (the report's clip statistics, resume's truncation): a
    tampered value is named with its line, not a TypeError deep inside a table."""
    write(tmp_path, b'{"step": 1, "tokens": 8, "train_loss": 2.5, "clipped": false}\n' + line + b"\n")
    with pytest.raises(ValueError, match=f"line 2: {says}; refusing"):
        read_metrics(tmp_path)


def test_what_the_trainer_writes_passes_the_row_check(tmp_path):
    """Non-finite numbers (written as strings), None and integer-valued floats are all valid rows."""
    log = MetricsLog(tmp_path)
    row = {"step": 1, "tokens": 8, "train_loss": float("nan"), "grad_norm": None, "lr": 0, "clipped": True}
    log.write(row)
    log.write({"event": "validation", "step": 1, "tokens": 8, "val_loss": float("inf"), "val_blocks": 2})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 1]


def test_truncate_after_keeps_the_rows_up_to_the_checkpoint_step(tmp_path):
    """A resumed run redoes the steps after its checkpoint: their rows go, the checkpoint step's own row and
    the rows before it stay."""
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3, 4):
        log.write({"step": step, "train_loss": 1.0 / step})
    log.write({"step": 4, "event": "validation", "val_loss": 2.0, "row_span": 3.0})
    log.truncate_after(2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_non_finite_numbers_are_written_as_strings_so_the_files_stay_strict_json(tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))

    MetricsLog(tmp_path).write({"step": 1, "train_loss": float("inf"), "grad_norm": float("nan")})
    row = strict((tmp_path / "metrics.jsonl").read_text())
    assert row == {"step": 1, "train_loss": "inf", "grad_norm": "nan"}
    write_status(tmp_path, status="nonfinite_loss", loss=float("-inf"), history=(1.0, float("inf")))
    assert strict((tmp_path / "status.json").read_text()) == {
        "status": "nonfinite_loss", "loss": "-inf", "history": [1.0, "inf"]
    }  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "status.json"]  # no temp file left


@pytest.fixture
def restore_determinism(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    old = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    yield
    torch.use_deterministic_algorithms(old[0], warn_only=old[1])


def test_deterministic_mode_is_requested_on_cuda_and_restored(restore_determinism):
    """On CUDA the run requests deterministic algorithms (warn-only, so a kernel without a deterministic
    implementation still runs) and the cuBLAS workspace setting they need; afterwards the old mode is back.
    Only the flags are set, so this runs without a GPU."""

    with deterministic(torch.device("cpu")):  # CPU kernels are deterministic already: nothing requested
        assert not torch.are_deterministic_algorithms_enabled()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with deterministic(torch.device("cuda")):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_mode_can_be_switched_off(restore_determinism, monkeypatch):
    """KINTERVAL_DETERMINISTIC=0 runs as the paper's formal runs did (no deterministic algorithms); any
    other value than 0 or 1 is an error, not a silent default."""
    monkeypatch.setenv("KINTERVAL_DETERMINISTIC", "0")
    with deterministic(torch.device("cuda")):
        assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("KINTERVAL_DETERMINISTIC", "off")
    with pytest.raises(ValueError, match="KINTERVAL_DETERMINISTIC"):
        with deterministic(torch.device("cuda")):
            pass


def test_resuming_a_finished_run_does_not_touch_its_records(make_config, tmp_path):
    """docs §5: resuming a run that is already complete does nothing and leaves status.json and
    metrics.jsonl as they are: not rewritten (same bytes and modification time), not even for a moment."""
    from kinterval.train.loop import train

    cfg = make_config(**{"schedule.tokens": 32 * 8 * 3, "checkpoint.count": 1})
    run = tmp_path / "run"
    assert train(cfg, run).status == "completed"
    files = [run / "metrics.jsonl", run / "status.json"]
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in files]
    assert train(cfg, run, resume=True).status == "completed"
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in files] == before


@pytest.mark.parametrize("caller", [(False, False), (False, True), (True, False), (True, True)])
def test_deterministic_mode_gives_back_the_callers_flags_and_environment(
    restore_determinism, monkeypatch, caller
):
    """The context restored use_deterministic_algorithms(old) alone, so a caller's warn_only was lost, and on
    CUDA it left CUBLAS_WORKSPACE_CONFIG set in os.environ for good. Now flags and environment are the
    caller's again (a CUBLAS_WORKSPACE_CONFIG the caller set stays as it was). ``required`` (the gradient
    diagnostic) requests them on CPU too. Only flags are set: the CUDA branch runs without a GPU."""

    def state():
        flags = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        return flags, dict(os.environ)

    torch.use_deterministic_algorithms(caller[0], warn_only=caller[1])
    for device, required in (("cuda", False), ("cpu", True), ("cuda", True), ("cpu", False)):
        before = state()
        with deterministic(torch.device(device), required=required):
            if device == "cuda" or required:
                assert torch.are_deterministic_algorithms_enabled()
                # warn-only unless the caller asked for the strict mode
                assert torch.is_deterministic_algorithms_warn_only_enabled() == (caller[1] or not caller[0])
            assert ("CUBLAS_WORKSPACE_CONFIG" in os.environ) == (device == "cuda")
        assert state() == before
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the caller's own setting is kept
    before = state()
    with deterministic(torch.device("cuda")):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert state() == before
