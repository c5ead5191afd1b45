"""``compile = true`` (``kinterval train --compile``): each block compiled, the K-interval operator eager.

One process-wide dynamo cache serves every test here (the models share their code), so they run in one
worker."""

import pytest
import torch
from safetensors.torch import load_file

import kinterval.model.gpt as gpt
from kinterval.cli import build_parser
from kinterval.data.loader import TokenShards
from kinterval.model import GPT
from kinterval.train import distributed as D
from kinterval.train.checkpoint import latest_checkpoint, read_model_weights
from kinterval.train.commands import config_from_args
from kinterval.train.evaluate import evaluate_nll
from kinterval.train.loop import train
from kinterval.train.metrics import read_metrics
from kinterval.train.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile")]


class Stop(Exception):
    pass


def losses(run) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run) if "train_loss" in r]


def weights(run) -> dict[str, torch.Tensor]:
    return load_file(latest_checkpoint(run) / "model.safetensors")


@pytest.fixture
def operator_calls(monkeypatch):
    """Whether torch.compile was tracing at each call of the operator."""
    calls = []
    real = gpt.kinterval_attention

    def spy(*args, **kwargs):
        calls.append(torch.compiler.is_compiling())
        return real(*args, **kwargs)

    monkeypatch.setattr(gpt, "kinterval_attention", spy)
    return calls


def test_compiled_blocks_train_as_eager_with_the_operator_outside_the_graph(
    make_config, tmp_path, operator_calls
):
    """The same losses as the eager run to float rounding, the blocks really compiled, and every call of the
    operator eager (so its numerics are its backend's)."""
    from torch._dynamo.utils import counters

    counters.clear()
    cfg = make_config(**{"operator.name": "minmax-weight-k4"})
    train(cfg, tmp_path / "eager")
    n_eager = len(operator_calls)
    train(cfg.override({"compile": True}), tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] > 0  # dynamo captured the blocks
    assert len(operator_calls) == 2 * n_eager > 0
    assert not any(operator_calls)  # never traced: a graph break around it
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert len(eager) == len(compiled) == 8
    assert compiled == pytest.approx(eager, rel=1e-5)
    a, b = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    assert a.keys() == b.keys()  # compiled in place: the state dict keeps its names (no "_orig_mod.")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)


def test_a_killed_compiled_run_resumes_bit_identically_and_either_way(make_config, tmp_path):
    """Kill after step 3 (checkpoint at 2), resume compiled: the uninterrupted compiled run's weights to the
    bit. `compile` is an execution field: an eager checkpoint resumes compiled."""
    cfg = make_config(**{"operator.name": "fwm-prob-k4", "compile": True})
    train(cfg, tmp_path / "whole")

    def stop(step, model):
        if step >= 3:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, tmp_path / "killed", on_step=stop)
    assert latest_checkpoint(tmp_path / "killed").name == "step_000002"
    train(cfg, tmp_path / "killed", resume=True)
    whole, resumed = weights(tmp_path / "whole"), weights(tmp_path / "killed")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")

    # activation checkpointing recomputes the compiled blocks: the same run to the bit
    train(cfg.override({"activation_checkpointing": True}), tmp_path / "ac")
    ac = weights(tmp_path / "ac")
    assert all(torch.equal(whole[k], ac[k]) for k in whole)

    with pytest.raises(Stop):
        train(cfg.override({"compile": False}), tmp_path / "switched", on_step=stop)
    train(cfg, tmp_path / "switched", resume=True)  # no "different config" refusal
    assert len(losses(tmp_path / "switched")) == 8


def test_validation_of_a_compiled_run_is_eager(make_config, tmp_path, operator_calls):
    """log.eval_every with compiled blocks: the validation row is the eager evaluator's, to the bit, on the
    same weights, and its row-span hooks ran."""
    cfg = make_config(**{"operator.name": "lerp-k4", "compile": True, "log.eval_every": 8})
    train(cfg, tmp_path / "run")
    (row,) = [r for r in read_metrics(tmp_path / "run") if r.get("event") == "validation"]
    assert row["row_span"] > 0
    model = GPT(cfg.model_config(512), cfg.operator.name)  # the synthetic corpus: vocab 512
    model.load_state_dict(read_model_weights(latest_checkpoint(tmp_path / "run")))
    val = TokenShards(cfg.data.dir, "val").tokens()
    nll = evaluate_nll(model, val, cfg.block_size, max_blocks=cfg.log.eval_blocks)
    assert row["val_loss"] == float(nll.mean())

    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # forget the graphs of the run above (its validation's, were there any)
    trainer = Trainer(cfg, tmp_path / "by-hand", D.setup(cfg.device))
    trainer.open_records()
    trainer.step()  # the training graphs
    counters.clear()
    trainer.validate()  # no_grad and new hooks: traced, they would be graphs of their own
    assert counters["stats"]["unique_graphs"] == 0
    trainer.close()


def test_the_flag_and_the_field():
    args = build_parser().parse_args(["train", "--data", "d", "--out", "o", "--compile"])
    assert config_from_args(args).compile is True
    args = build_parser().parse_args(["train", "--data", "d", "--out", "o"])
    assert config_from_args(args).compile is False
    from kinterval.train.config import TrainConfig

    with pytest.raises(ValueError, match="compile must be true or false"):
        TrainConfig().override({"data.dir": "d", "compile": "yes"}).validate()
