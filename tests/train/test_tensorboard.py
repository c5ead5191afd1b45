"""``log.tensorboard``: the rows of metrics.jsonl as TensorBoard scalars, each step once after a resume."""

import sys

import pytest

from kinterval.train.loop import train
from kinterval.train.metrics import MetricsLog, read_metrics

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (a dev dependency: pip install -e '.[dev]')",
)


class Killed(Exception):
    pass


def scalars(run) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: tag -> (step, value) in display order, orphaned events purged."""
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def logged(run, key, event=None) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in read_metrics(run) if r.get("event") == event and key in r]


def test_scalars_are_the_logged_rows_and_a_resume_shows_each_step_once(make_config, tmp_path):
    cfg = make_config(**{"log.tensorboard": True, "log.eval_every": 3})  # checkpoints after 2, 4, 6, 8

    def kill(step, model):
        if step == 7:  # past the checkpoint at 6, and past the validation at step 6
            raise Killed

    with pytest.raises(Killed):
        train(cfg, tmp_path / "run", on_step=kill)
    assert [s for s, _ in scalars(tmp_path / "run")["train/train_loss"]] == list(range(1, 8))
    train(cfg, tmp_path / "run", resume=True)
    shown = scalars(tmp_path / "run")
    assert {"train/train_loss", "train/lr", "train/grad_norm", "val/val_loss", "val/row_span"} <= set(shown)
    # steps 7 of the first session and of the resumed one: only the resumed one is shown
    for tag, key, event, steps in (
        ("train/train_loss", "train_loss", None, range(1, 9)),
        ("train/lr", "lr", None, range(1, 9)),
        ("train/grad_norm", "grad_norm", None, range(1, 9)),
        ("val/val_loss", "val_loss", "validation", [3, 6, 8]),
    ):
        want = logged(tmp_path / "run", key, event)
        assert [s for s, _ in shown[tag]] == [s for s, _ in want] == list(steps), tag
        assert [v for _, v in shown[tag]] == pytest.approx([v for _, v in want], rel=1e-6), tag  # float32


def test_without_the_package_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'kinterval\[tensorboard\]'"):
        MetricsLog(tmp_path, tensorboard=True)
    MetricsLog(tmp_path).write({"step": 1, "train_loss": 1.0})  # without TensorBoard: no import at all
    assert not (tmp_path / "tensorboard").exists()


def test_a_resume_that_turns_tensorboard_back_on_shows_every_logged_step(make_config, tmp_path):
    """On (killed at 5, checkpoint 4), off (resumed, killed at 7, checkpoint 6), on again (to 8): the curves
    are metrics.jsonl's rows. They lacked step 6, logged by the session without TensorBoard."""
    on = make_config(**{"log.tensorboard": True, "log.eval_every": 3})
    off = make_config(**{"log.tensorboard": False, "log.eval_every": 3})

    def kill_at(n):
        def kill(step, model):
            if step == n:
                raise Killed

        return kill

    with pytest.raises(Killed):
        train(on, tmp_path / "run", on_step=kill_at(5))
    with pytest.raises(Killed):
        train(off, tmp_path / "run", resume=True, on_step=kill_at(7))
    train(on, tmp_path / "run", resume=True)
    shown = scalars(tmp_path / "run")
    for tag, key, event in (
        ("train/train_loss", "train_loss", None),
        ("val/val_loss", "val_loss", "validation"),
    ):
        want = logged(tmp_path / "run", key, event)
        assert [s for s, _ in shown[tag]] == [s for s, _ in want], tag
        assert [v for _, v in shown[tag]] == pytest.approx([v for _, v in want], rel=1e-6), tag
    assert [s for s, _ in shown["train/train_loss"]] == list(range(1, 9))


def test_a_resume_with_tensorboard_off_warns_that_the_old_curves_go_stale(make_config, tmp_path, capsys):
    """The killed session's events stay (nothing rewrites them), so they may show steps past the checkpoint
    that this session redoes: the resume says so and how to rewrite them; a run that never wrote any is
    quiet."""
    on = make_config(**{"log.tensorboard": True})
    off = make_config(**{"log.tensorboard": False})

    def kill(step, model):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(on, tmp_path / "run", on_step=kill)
    capsys.readouterr()
    train(off, tmp_path / "run", resume=True)
    err = capsys.readouterr().err
    assert "tensorboard holds an earlier session's events" in err
    assert "after the checkpoint at step 4" in err and "resume with --tensorboard" in err
    assert [s for s, _ in scalars(tmp_path / "run")["train/train_loss"]] == list(range(1, 6))  # stale: 5

    with pytest.raises(Killed):
        train(off, tmp_path / "quiet", on_step=kill)
    train(off, tmp_path / "quiet", resume=True)
    assert "tensorboard" not in capsys.readouterr().err
