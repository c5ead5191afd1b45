"""CLI glue of ``kinterval train``: each flag sets its documented config field, ``--set`` parses TOML values
(mutation audit, benchmarks/results/mutation-2026-11-24/cli_glue.md)."""

import os

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
    cfg = config(
        "--set", "optim.beta2=0.99", "--set", "operator.name=lerp-k4", "--set", " log.eval_blocks = 4"
    )
    assert (cfg.optim.beta2, cfg.operator.name, cfg.log.eval_blocks) == (0.99, "lerp-k4", 4)
    assert isinstance(cfg.optim.beta2, float) and isinstance(cfg.log.eval_blocks, int)
    with pytest.raises(ValueError, match=r"--set expects FIELD=VALUE, got 'optim.beta2'"):
        config("--set", "optim.beta2")


@pytest.mark.parametrize(
    "flags, said",
    [(["--lr", "0.001", "--set", "optim.lr=0.002"], "--lr 0.001 and --set optim.lr=0.002"),
     (["--micro-batch", "4", "--set", "schedule.micro_batch=8"],
      "--micro-batch 4 and --set schedule.micro_batch=8"),
     (["--compile", "--set", "compile=false"], "--compile and --set compile=False"),
     (["--no-progress", "--set", "log.progress=true"], "--no-progress and --set log.progress=True")],
)  # fmt: skip
def test_a_flag_and_set_that_disagree_on_one_field_are_refused(flags, said):
    """``--lr 0.001 --set optim.lr=0.002`` trained at 0.002 without a word: which one won was nowhere said."""
    with pytest.raises(ValueError, match=f"{said} set one field to two values; give one"):
        config(*flags)
    assert config("--lr", "0.001", "--set", "optim.lr=0.001").optim.lr == 0.001  # agreeing: one value


def test_an_unknown_model_is_refused_before_the_presets_note(capsys):
    """``--model bogus`` first printed "--model bogus takes the preset's shape", as if it were a preset."""
    with pytest.raises(ValueError, match=r"--model must be one of \[.*'tiny'\], got 'bogus'"):
        config("--config", "tiny-cpu", "--model", "bogus")
    assert "takes the preset's shape" not in capsys.readouterr().out


# ------------------------------------------------------------------ audit fixes (seed range, demo --tokens)
@pytest.mark.parametrize("seed", ["99999999999999999999999", "4294967296", "-1"])
def test_train_refuses_a_seed_out_of_range_in_one_line(seed, tmp_path, capsys):
    """Only seed >= 0 was checked: a huge --seed failed in torch.manual_seed ("Overflow when unpacking long
    long", a traceback) after the run folder was made; numpy's legacy RNG takes seeds below 2^32."""
    from kinterval.cli import main

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--data", str(tmp_path), "--seed", seed]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kinterval train: error: --seed must be an integer from 0 to 4294967295")
    assert "\n" not in err and not out.exists()
    assert config("--seed", "4294967295").seed == 2**32 - 1
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 4294967295"):
        config("--set", f"seed={seed}")


@pytest.mark.parametrize(
    "flags, message",
    [(["--quick", "--tokens", "1000"], "--tokens must be at least 4097 for the quick demo (more than its "
      "4096 warmup tokens), got 1000"),
     (["--tokens", "50000"], "--tokens must be at least 50001 for the full demo"),
     (["--quick", "--seed", "99999999999999999999999"], "--seed must be an integer from 0 to 4294967295"),
     (["--quick", "--seed", "-1"], "--seed must be an integer from 0 to 4294967295")],
)  # fmt: skip
def test_demo_checks_tokens_and_seed_in_its_own_terms_before_any_work(flags, message, tmp_path, capsys):
    """`demo --quick --tokens 1000` failed after preparing the corpus, naming schedule.warmup_tokens (4096),
    which a demo user cannot set; a huge --seed prepared the corpus, then failed in torch with a traceback."""
    from kinterval.cli import main

    assert main(["demo", "--out", str(tmp_path / "d"), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kinterval demo: error: {message}") and "\n" not in err
    assert not (tmp_path / "d").exists()


def test_model_flag_takes_the_presets_shape_over_the_config_files(capsys):
    """--config tiny-cpu --model small trained tiny-cpu's 2 x 128 model while run_config.json said
    preset "small": the config file's shape fields won over --model, silently. --model now takes the preset's
    shape (and says which config fields it replaced); --block-size and --set still apply after it."""
    cfg = config("--config", "tiny-cpu", "--model", "small")
    shape = cfg.model_config(vocab_size=100)
    assert cfg.model.preset == "small" and (shape.n_layer, shape.n_embd, shape.block_size) == (6, 384, 512)
    assert (
        "--model small takes the preset's shape, not the config's model.n_layer=2" in capsys.readouterr().out
    )
    cfg = config("--config", "tiny-cpu", "--model", "small", "--block-size", "64", "--set", "model.n_layer=3")
    shape = cfg.model_config(vocab_size=100)
    assert (shape.n_layer, shape.n_embd, shape.block_size) == (3, 384, 64)
    tiny = config("--config", "tiny-cpu").model_config(vocab_size=100)  # without --model: the file's shape
    assert (tiny.n_layer, tiny.n_head, tiny.n_embd) == (2, 4, 128)


def test_threads_sets_torchs_threads_and_auto_on_a_cpu_warns_for_a_large_model(monkeypatch, capsys):
    """A shipped GPU protocol (device auto) on a machine without CUDA began a 124M run on the CPU without a
    word; train had no --threads (tiny CPU runs went 10x slower at torch's default)."""
    import torch

    import kinterval.train.loop as loop
    from kinterval.cli import main

    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(loop, "train", lambda *a, **k: _Done())  # what comes before training is checked
    assert main(["train", "--config", "124m-250m", "--data", "D", "--out", "O", "--threads", "3"]) == 0
    assert seen == [3]
    assert "device 'auto' trains this 124M-parameter model on the CPU" in capsys.readouterr().err
    assert main(["train", "--config", "124m-250m", "--data", "D", "--out", "O", "--device", "cpu"]) == 0
    assert main(["train", "--config", "tiny-cpu", "--data", "D", "--out", "O"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["train", "--data", "D", "--out", "O", "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err
    for huge in ("1000000000000", "100000"):  # torch overflowed on the first (a traceback)
        assert main(["train", "--data", "D", "--out", "O", "--threads", huge]) == 2
        assert f"--threads must be at most {max(64, 4 * (os.cpu_count() or 1))}" in capsys.readouterr().err
    assert seen == [3]


class _Done:
    status, exit_code = "failed", 0


@pytest.mark.parametrize("command", ["eval", "geometry", "graddiag", "tau-screen"])
def test_the_evaluation_commands_take_threads(command, monkeypatch, capsys):
    """`kinterval eval` took 5 min 27 s at torch's default threads where the demo's 1 thread is ~10x faster;
    eval, geometry, graddiag and tau-screen take --threads (set first, before any work)."""
    import torch

    from kinterval.cli import main

    seen = []

    def record(n):  # fixtures restore the thread count too: only --threads' 3 stops the command
        seen.append(n)
        if n == 3:
            raise FileNotFoundError("stop here")

    monkeypatch.setattr(torch, "set_num_threads", record)
    assert main([command, "--run", "nowhere", "--threads", "3"]) == 2
    assert seen[:1] == [3] and "stop here" in capsys.readouterr().err
    assert main([command, "--run", "nowhere", "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err
