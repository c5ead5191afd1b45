"""Config files, validation, and the token schedule."""

import math

import pytest
import torch

from kinterval.train.config import TrainConfig, shipped_configs
from kinterval.train.schedule import checkpoint_steps, lr_at, make_plan

# Paper App. C.1: (config, final steps, final tokens, warmup tokens, peak lr, checkpoints)
PROTOCOLS = [
    ("124m-250m", 1908, 250_085_376, 25_000_000, 6e-4, 10),
    ("124m-2p5b", 19_074, 2_500_067_328, 25_000_000, 6e-4, 20),
    ("124m-100m", 763, 100_007_936, 10_000_000, 6e-4, 5),
    ("1b-100m", 763, 100_007_936, 10_000_000, 3e-4, 5),
]


@pytest.mark.parametrize("name,steps,tokens,warmup,lr,count", PROTOCOLS)
def test_paper_protocol_configs(name, steps, tokens, warmup, lr, count):
    cfg = TrainConfig.from_toml(name).override({"data.dir": "/data"}).validate()
    plan = make_plan(cfg, world_size=1)
    assert plan.tokens_per_step == 131_072
    assert (plan.steps, plan.total_tokens) == (steps, tokens)
    assert cfg.schedule.warmup_tokens == warmup and cfg.optim.lr == lr
    assert (cfg.optim.beta1, cfg.optim.beta2, cfg.optim.weight_decay, cfg.optim.grad_clip) == (
        0.9,
        0.95,
        0.1,
        1.0,
    )
    assert cfg.schedule.micro_batch == 1 and cfg.schedule.min_lr_ratio == 0.1
    assert len(plan.checkpoint_steps) == count and plan.checkpoint_steps[-1] == steps
    assert (
        cfg.numerics.tf32_train and not cfg.numerics.tf32_eval and cfg.numerics.autocast_dtype == "bfloat16"
    )
    # Same global batch on 4 processes with a quarter of the accumulation: identical plan.
    four = cfg.override({"schedule.accum": cfg.schedule.accum // 4})
    assert make_plan(four, world_size=4) == plan


def test_all_shipped_configs_load():
    names = shipped_configs()
    assert {"124m-250m.toml", "124m-2p5b.toml", "124m-100m.toml", "1b-100m.toml", "tiny-cpu.toml"} <= set(
        names
    )
    for name in names:
        TrainConfig.from_toml(name).override({"data.dir": "x"}).validate()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("optim.lr", 0.0, "optim.lr must be > 0"),
        ("optim.beta2", 1.0, "optim.beta2 must be < 1"),
        ("schedule.micro_batch", 0, "schedule.micro_batch must be an integer >= 1"),
        ("schedule.tokens", 1.5, "schedule.tokens must be an integer"),
        ("schedule.min_lr_ratio", 2.0, "schedule.min_lr_ratio must be <= 1"),
        ("operator.name", "softmaks", "unknown operator name"),
        ("operator.backend", "cuda", "operator.backend must be one of"),
        ("model.preset", "gpt9", "model.preset must be one of"),
        ("model.preset", ["tiny"], "model.preset must be one of"),  # a TOML list: was a TypeError
        ("device", "tpu", "device must be one of"),
        ("device", "cuda:x", r"device must be one of .* or cuda:N"),
        ("device", "cuda:-1", r"device must be one of .* or cuda:N"),
        ("device", 0, r"device must be one of .* or cuda:N"),
        ("optim.decay", "all", "optim.decay must be one of"),
        ("schedule.warmup_tokens", 10**9, "warmup_tokens"),
        ("schedule.warmup_tokens", 1_000_000, r"warmup_tokens \(1000000\) must be < schedule.tokens"),
        ("optim.beta1", 1.0, "optim.beta1 must be < 1"),
        ("optim.eps", 0.0, "optim.eps must be > 0"),
        ("optim.weight_decay", -0.1, "optim.weight_decay must be >= 0"),
        ("optim.grad_clip", -1.0, "optim.grad_clip must be >= 0"),
        ("schedule.accum", 0, "schedule.accum must be an integer >= 1"),
        ("log.eval_every", -1, "log.eval_every must be an integer >= 0"),
        ("device", "cuda:", r"device must be one of .* or cuda:N"),
        ("data.verify", 1, "data.verify must be true or false"),
        ("log.progress", "yes", "log.progress must be true or false"),
        ("log.tensorboard", "no", "log.tensorboard must be true or false"),
        ("optim.fused", 2, "optim.fused must be true or false"),
        ("model.bias", "no", "model.bias must be true or false"),
        ("data.dir", 5, "data.dir must be a string"),
        ("name", 5, "name must be a string"),
        # fp16 without loss scaling flushes small gradients to zero: refused, bf16 named as the way out
        ("numerics.autocast_dtype", "float16", "'float16' cannot be used for training.*use 'bfloat16'"),
    ],
)
def test_bad_values_are_named(field, value, message):
    cfg = TrainConfig().override({"data.dir": "x", field: value})
    with pytest.raises(ValueError, match=message):
        cfg.validate()


@pytest.mark.parametrize("model", [{"attn_sinks": True}, {"attn_softcap": 30.0}])
def test_sdpa_takes_no_sinks_or_softcap(model):
    cfg = TrainConfig().override({"data.dir": "x", "operator.name": "sdpa", "model": model})
    with pytest.raises(
        ValueError, match="operator.name 'sdpa' .* takes no model.attn_softcap or model.attn_sinks"
    ):
        cfg.validate()


def test_a_nested_override_sets_its_fields_and_keeps_the_sections_others():
    """{"schedule": {"tokens": N}} (TOML's unquoted dotted key) sets one field; the section's other fields
    keep their values, not the defaults."""
    cfg = TrainConfig().override({"schedule.warmup_tokens": 500, "schedule.accum": 4})
    got = cfg.override({"schedule": {"tokens": 5000}}).schedule
    assert (got.tokens, got.warmup_tokens, got.accum) == (5000, 500, 4)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_a_run_names_one_gpu_of_several(device):
    TrainConfig().override({"data.dir": "x", "device": device}).validate()


def test_cuda_n_sets_the_current_device_and_is_refused_under_torchrun(monkeypatch):
    """A single process on cuda:N makes it the current device (library calls that take the current device
    take it); under torchrun each rank takes cuda:LOCAL_RANK, so an index is refused, not ignored."""
    from kinterval.train import distributed as D

    chosen = []
    monkeypatch.setattr(D, "pick_device", lambda name: torch.device(name))
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert D.setup("cuda:1").device == torch.device("cuda", 1)
    assert chosen == [torch.device("cuda", 1)]
    assert D.setup("cuda").device == torch.device("cuda") and len(chosen) == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="torchrun: each rank trains on cuda:LOCAL_RANK; pass --device cuda"):
        D.setup("cuda:1")
    assert len(chosen) == 1


def test_unknown_fields_and_missing_data(tmp_path):
    with pytest.raises(ValueError, match="unknown config field"):
        TrainConfig().override({"optim.momentum": 0.9})
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlearning_rate = 1e-3\n")
    with pytest.raises(ValueError, match="optim.learning_rate"):
        TrainConfig.from_toml(bad)
    with pytest.raises(ValueError, match="data.dir is required"):
        TrainConfig().validate()
    with pytest.raises(FileNotFoundError):
        TrainConfig.from_toml(tmp_path / "missing.toml")


def test_a_missing_path_never_falls_back_to_the_shipped_config_of_that_name(tmp_path, monkeypatch):
    """A mistyped path to an edited copy of a shipped config used to train with the shipped settings."""
    with pytest.raises(FileNotFoundError, match="config file not found: .*sub/124m-250m.toml"):
        TrainConfig.from_toml(tmp_path / "sub" / "124m-250m.toml")
    with pytest.raises(FileNotFoundError):
        TrainConfig.from_toml("elsewhere/1b-100m")
    monkeypatch.chdir(tmp_path)  # a bare name, with or without .toml, is a shipped config
    assert TrainConfig.from_toml("124m-250m.toml") == TrainConfig.from_toml("124m-250m")
    (tmp_path / "124m-250m.toml").write_text("[optim]\nlr = 1e-3\n")  # a file of that name comes first
    assert TrainConfig.from_toml("124m-250m.toml").optim.lr == 1e-3


def test_lr_schedule_known_points():
    peak, total, warm = 6e-4, 1_000_000, 100_000
    assert lr_at(50_000, total, peak, warm, 0.1) == pytest.approx(peak / 2)
    assert lr_at(warm, total, peak, warm, 0.1) == pytest.approx(peak)
    assert lr_at(total, total, peak, warm, 0.1) == pytest.approx(0.1 * peak)
    assert lr_at((total + warm) // 2, total, peak, warm, 0.1) == pytest.approx(0.55 * peak)
    # cosine shape: a quarter of the way through the decay
    q = warm + (total - warm) // 4
    assert lr_at(q, total, peak, warm, 0.1) == pytest.approx(
        0.06e-3 + 0.5 * 0.54e-3 * (1 + math.cos(math.pi / 4))
    )
    assert lr_at(10, total, peak, 0, 0.1) == pytest.approx(peak, rel=1e-6)


def test_plan_lr_reaches_floor_at_final_step():
    cfg = TrainConfig.from_toml("124m-250m").override({"data.dir": "x"})
    plan = make_plan(cfg, 1)
    lrs = [plan.lr(s) for s in range(plan.steps)]
    assert lrs[-1] == pytest.approx(6e-5)
    assert max(lrs) == pytest.approx(6e-4, rel=1e-3)
    assert min(lrs) == pytest.approx(lrs[0])  # first warmup step is the smallest
    assert all(a <= b for a, b in zip(lrs[:190], lrs[1:191]))


def test_checkpoint_steps():
    assert checkpoint_steps(763, 5) == (153, 305, 458, 610, 763)
    # halves round up: suite A's 4th and 5th of 20 are the paper's resume points, 500.0M and 625.1M tokens
    suite_a = checkpoint_steps(19_074, 20)
    assert [s * 131_072 for s in suite_a[3:5]] == [500_039_680, 625_082_368]
    assert suite_a[14] == 14_306 and len(suite_a) == 20 and suite_a[-1] == 19_074
    assert checkpoint_steps(10, 2, save_every=3) == (3, 5, 6, 9, 10)
    # The final step always: count 0 and a save_every that does not divide the steps used to leave a
    # "completed" run without its final weights.
    assert checkpoint_steps(10, 0) == (10,)
    assert checkpoint_steps(10, 0, save_every=3) == (3, 6, 9, 10)
    assert checkpoint_steps(12, 0, save_every=4) == (4, 8, 12)
    # more checkpoints than steps: every step, at once (a count of 1e12 looped over every mark)
    assert checkpoint_steps(4, 10**12) == (1, 2, 3, 4) and checkpoint_steps(7, 7) == tuple(range(1, 8))
    assert checkpoint_steps(7, 6) == (1, 2, 4, 5, 6, 7)


def test_a_larger_micro_batch_on_one_process_is_warned_of_its_other_batch():
    """Tokens per step = micro_batch x accum x world x block: --micro-batch 8 on one process trains 8x the
    protocol's tokens per step (an eighth of its steps) and was not warned of (the config called micro_batch
    free). A run at another context length (a suite such as mini) is another protocol: no warning."""
    from kinterval.train.trainer import protocol_batch_note

    cfg = TrainConfig.from_toml("124m-100m").override({"data.dir": "x", "schedule.micro_batch": 8})
    assert make_plan(cfg, 1).tokens_per_step == 8 * 131_072
    note = protocol_batch_note(cfg, make_plan(cfg, 1))
    assert "trains 131,072 tokens per step; this run trains 1,048,576" in note and "--accum 16" in note
    fixed = cfg.override({"schedule.accum": 16})
    assert (
        make_plan(fixed, 1).tokens_per_step == 131_072
        and protocol_batch_note(fixed, make_plan(fixed, 1)) is None
    )
    other_t = cfg.override({"model.block_size": 256})
    assert protocol_batch_note(other_t, make_plan(other_t, 1)) is None


def test_torchrun_with_a_protocols_accumulation_is_warned_of_its_other_batch():
    """`accum` counts micro-batches per process: a paper protocol under torchrun with 4 processes and its own
    --accum trained 4x its tokens per step (a quarter of its steps, another LR schedule) without a word."""
    from kinterval.train.trainer import protocol_batch_note

    cfg = TrainConfig.from_toml("124m-250m").override({"data.dir": "x"})
    assert protocol_batch_note(cfg, make_plan(cfg, 1)) is None
    note = protocol_batch_note(cfg, make_plan(cfg, 4))
    assert "trains 131,072 tokens per step; this run trains 524,288" in note and "--accum 32" in note
    fixed = cfg.override({"schedule.accum": 32})
    assert protocol_batch_note(fixed, make_plan(fixed, 4)) is None
    own = cfg.override({"name": "my-protocol"})  # not a shipped protocol: the user's own batch
    assert protocol_batch_note(own, make_plan(own, 4)) is None


def test_the_training_sequence_length_is_the_models_block_size_else_the_presets():
    from kinterval.model.config import PRESETS

    assert TrainConfig().block_size == PRESETS["tiny"].block_size
    assert TrainConfig().override({"model.block_size": 48}).block_size == 48


def test_an_override_of_none_is_a_flag_not_given():
    """The command line passes its unset flags as None: they keep the config's values."""
    cfg = TrainConfig().override({"schedule.tokens": 5000, "optim.fused": True})
    got = cfg.override({"schedule.tokens": None, "optim.fused": None, "seed": None})
    assert (got.schedule.tokens, got.optim.fused, got.seed) == (5000, True, 0)
