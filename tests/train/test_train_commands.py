"""CLI glue of ``kinterval train``: each flag sets its documented config field, ``--set`` parses TOML values
(mutation audit, benchmarks/results/mutation-2026-11-24/cli_glue.md)."""

import pytest

from kinterval.cli import build_parser
from kinterval.train.commands import config_from_args


def config(*flags):
    return config_from_args(build_parser().parse_args(["train", "--out", "O", "--data", "D", *flags]))


def test_each_flag_sets_its_own_field():
    """docs/training.md's flag table: --warmup-tokens -> schedule.warmup_tokens, --checkpoints ->
    checkpoint.count, --save-every -> checkpoint.save_every, --log-every -> log.every, --eval-every ->
    log.eval_every, --min-lr-ratio -> schedule.min_lr_ratio, --tensorboard / --no-progress -> log.*."""
    cfg = config("--tokens", "4096", "--warmup-tokens", "128", "--min-lr-ratio", "0.2", "--checkpoints", "3",
                 "--save-every", "5", "--log-every", "7", "--eval-every", "9", "--tensorboard",
                 "--no-progress")  # fmt: skip
    assert (cfg.schedule.tokens, cfg.schedule.warmup_tokens, cfg.schedule.min_lr_ratio) == (4096, 128, 0.2)
    assert (cfg.checkpoint.count, cfg.checkpoint.save_every) == (3, 5)
    assert (cfg.log.every, cfg.log.eval_every, cfg.log.tensorboard, cfg.log.progress) == (7, 9, True, False)
    default = config()
    assert (default.log.tensorboard, default.log.progress) == (False, True)


def test_set_parses_toml_values_and_needs_field_equals_value():
    cfg = config("--set", "optim.beta2=0.99", "--set", "data.dir=corpus", "--set", " log.eval_blocks = 4")
    assert (cfg.optim.beta2, cfg.data.dir, cfg.log.eval_blocks) == (0.99, "corpus", 4)
    assert isinstance(cfg.optim.beta2, float) and isinstance(cfg.log.eval_blocks, int)
    with pytest.raises(ValueError, match=r"--set expects FIELD=VALUE, got 'optim.beta2'"):
        config("--set", "optim.beta2")
