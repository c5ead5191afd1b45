"""The Trainer driven by hand, as docs/training.md shows, is the run that ``train`` makes."""

import torch

from kinterval.train import distributed as D
from kinterval.train.checkpoint import latest_checkpoint, load_checkpoint
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics
from kinterval.train.trainer import Trainer


def test_hand_driven_trainer_equals_train(make_config, tmp_path):
    cfg = make_config()
    train(cfg, tmp_path / "loop")
    trainer = Trainer(cfg, tmp_path / "hand", D.setup(cfg.device))
    trainer.resume()
    trainer.open_records()
    while trainer.done < trainer.plan.steps:
        stats = trainer.step()
        trainer.log_step(stats)
        if stats.step in trainer.plan.checkpoint_steps:
            trainer.save()
    trainer.close()
    result = trainer.finish()
    assert result.status == "completed" and result.steps == 8 and trainer.clipped_steps >= 0
    losses = [[r["train_loss"] for r in read_metrics(tmp_path / run)] for run in ("loop", "hand")]
    assert losses[0] == losses[1] and len(losses[0]) == 8
    a, b = (load_checkpoint(latest_checkpoint(tmp_path / run)).model for run in ("loop", "hand"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
