"""The Trainer driven by hand, as docs/training.md shows, is the run that ``train`` makes."""

import math

import pytest
import torch

from kinterval.model import tf32
from kinterval.ops.tf32 import tf32_flags
from kinterval.train import distributed as D
from kinterval.train.checkpoint import latest_checkpoint, load_checkpoint
from kinterval.train.loop import run_lock, train
from kinterval.train.metrics import read_metrics
from kinterval.train.trainer import Trainer


def _doc_loop(trainer, poison_after=None):
    """The hand-driven loop of docs/training.md §7 (``poison_after``: NaN weights after that step)."""
    with run_lock(trainer.out):
        trainer.resume()
        trainer.open_records()
        result = None
        while trainer.done < trainer.plan.steps:
            stats = trainer.step()
            if not stats.finite:
                result = trainer.stop_nonfinite(stats)
                break
            trainer.log_step(stats)
            if stats.step in trainer.plan.checkpoint_steps:
                trainer.save()
            if stats.step == poison_after:
                with torch.no_grad():
                    trainer.model.transformer.ln_f.weight.fill_(float("nan"))
        trainer.close()
        return result or trainer.finish()


def test_calls_out_of_order_are_refused_before_they_change_anything(make_config, tmp_path):
    """step()/log_step() before open_records(), after close() or past the plan raise without stepping."""
    with pytest.raises(TypeError, match="cfg must be a TrainConfig"):
        Trainer(make_config().to_dict(), tmp_path / "x", D.setup("cpu"))
    with pytest.raises(TypeError, match="info must be a DistInfo"):
        Trainer(make_config(), tmp_path / "x", None)
    with pytest.raises(TypeError, match="override takes a dict"):
        make_config().override(["schedule.tokens"])
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(RuntimeError, match=r"step\(\) before open_records"):
        trainer.step()
    assert trainer.done == 0 and all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    _doc_loop(trainer)
    with pytest.raises(RuntimeError, match="after close"):
        trainer.step()
    trainer._closed = False  # past the plan, even with the records open
    with pytest.raises(RuntimeError, match="steps are done"):
        trainer.step()
    assert trainer.done == trainer.plan.steps
    with run_lock(tmp_path / "run"), pytest.raises(ValueError, match="is being trained by"):
        with run_lock(tmp_path / "run"):
            pass


def test_hand_driven_trainer_equals_train(make_config, tmp_path):
    cfg = make_config()
    train(cfg, tmp_path / "loop")
    trainer = Trainer(cfg, tmp_path / "hand", D.setup(cfg.device))
    seen = []  # the TF32 switches each training forward sees (settable without CUDA)
    trainer.model.register_forward_pre_hook(lambda m, a: seen.append(tf32_flags()))
    before = tf32_flags()
    with tf32(False):  # step() itself must set the training policy (paper: TF32 on in training)
        result = _doc_loop(trainer)
    assert tf32_flags() == before
    assert cfg.numerics.tf32_train and len(seen) == 16 and set(seen) == {(True, True)}
    assert result.status == "completed" and result.steps == 8 and trainer.clipped_steps >= 0
    losses = [[r["train_loss"] for r in read_metrics(tmp_path / run)] for run in ("loop", "hand")]
    assert losses[0] == losses[1] and len(losses[0]) == 8
    a, b = (load_checkpoint(latest_checkpoint(tmp_path / run)).model for run in ("loop", "hand"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _set_grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    return grads


def test_clip_gradients_clips_the_global_norm_and_returns_the_pre_clip_norm():
    """The paper's clip: the global gradient norm over every parameter is clipped at ``grad_clip``
    (direction kept); the logged norm is the one before clipping. 0 disables clipping (the norm is still
    reported)."""
    from kinterval.model import GPT, ModelConfig
    from kinterval.train.trainer import clip_gradients

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    grads = _set_grads(model, 1)
    norm = sum(float(g.double().pow(2).sum()) for g in grads.values()) ** 0.5  # well above 1
    assert norm > 5
    for clip in (1.0, 0.0, 2 * norm):
        _set_grads(model, 1)
        assert abs(clip_gradients(model, clip) - norm) < 1e-4 * norm
        scale = clip / norm if 0 < clip < norm else 1.0
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[n] * scale, rtol=1e-5, atol=1e-8, msg=n)


def test_hand_driven_loop_stops_on_a_non_finite_step(make_config, tmp_path):
    """The documented loop ends on a non-finite step (step() does not advance ``done``, so a loop without
    the check would retry it forever) with status nonfinite_loss and the checkpoints it had."""
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    result = _doc_loop(trainer, poison_after=3)
    assert result.status == "nonfinite_loss" and trainer.done == 3
    status = (tmp_path / "run" / "status.json").read_text()
    assert "nonfinite_loss" in status


def test_a_non_finite_step_leaves_weights_optimizer_and_counters_alone(make_config, tmp_path):
    """``step()`` reports a non-finite loss without stepping the optimizer (docstring): the other weights, the
    AdamW state and ``done`` stay as they were, so the last good state is what the caller keeps."""
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    trainer.open_records()
    trainer.step()
    with torch.no_grad():
        trainer.model.transformer.ln_f.weight.fill_(float("nan"))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in trainer.optimizer.state.items()}
    stats = trainer.step()
    trainer.close()
    assert not stats.finite and stats.step == 2 and trainer.done == 1
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items() if k != "transformer.ln_f.weight")
    for p, s in trainer.optimizer.state.items():
        assert all(torch.equal(v, moments[id(p)][k]) for k, v in s.items())


def test_float16_autocast_is_refused_for_training_but_not_for_a_model(make_config, tmp_path, capsys):
    """fp16 autocast trained without loss scaling (gradients underflowed); the Trainer, ``train`` and the CLI
    refuse it, while a model (evaluation, inference) may still run under it."""
    from kinterval.cli import main
    from kinterval.model import GPT, ModelConfig, NumericsConfig

    cfg = make_config(**{"numerics.autocast_dtype": "float16"})
    with pytest.raises(ValueError, match="'float16' cannot be used for training"):
        Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    with pytest.raises(ValueError, match="'float16' cannot be used for training"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        main(["train", "--data", str(tmp_path), "--autocast", "float16", "--out", str(tmp_path / "run")])
    assert "invalid choice: 'float16'" in capsys.readouterr().err
    numerics = NumericsConfig(autocast_dtype="float16")
    GPT(ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16, numerics=numerics))


def test_each_step_trains_on_its_global_sequences_of_the_seeded_order(make_config, tmp_path):
    """Step s (0-based) trains on global sequences s*S .. s*S+S-1 (S = 8 here) of the seed's order: epoch e
    is the permutation ``default_rng([seed, e])`` of the non-overlapping windows (docs/training.md), cut into
    micro-batches of 4 in that order; the weights start from ``torch.manual_seed(seed)``. A shifted data
    position or an ignored seed trains on other data, and a resume stays consistent with itself."""
    import numpy as np

    from kinterval.model import GPT

    seed, T, S, mb = 3, 32, 8, 4
    trainer = Trainer(make_config(seed=seed), tmp_path / "run", D.setup("cpu"))
    torch.manual_seed(seed)
    init = GPT(trainer.model_cfg, "softmax").state_dict()
    assert all(torch.equal(v, init[k]) for k, v in trainer.model.state_dict().items())
    seen = []
    trainer.model.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    trainer.open_records()
    for _ in range(3):
        trainer.step()
    trainer.close()
    tokens = np.asarray(trainer.tokens, dtype=np.int64)
    n_windows = (len(tokens) - 1) // T
    perm = np.random.default_rng([seed, 0]).permutation(n_windows)
    assert len(seen) == 3 * S // mb
    for j, x in enumerate(seen):  # micro-batch j holds global sequences j*mb .. j*mb+mb-1
        want = np.stack([tokens[perm[i] * T : perm[i] * T + T] for i in range(j * mb, j * mb + mb)])
        assert torch.equal(x, torch.from_numpy(want)), j


@pytest.mark.parametrize(
    "device, overrides",
    [
        ("cpu", {"numerics.autocast_on_cpu": True}),
        # the default numerics on a GPU: autocast_on_cpu off. On CPU the autocast region's device cannot be
        # told apart from the tensors' (a region for "cpu" around CUDA tensors would leave them in fp32)
        pytest.param(
            "cuda",
            {},
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
def test_training_forwards_run_under_the_autocast_policy(make_config, tmp_path, device, overrides):
    """Paper §4: everything outside attention runs under bf16 autocast in training (on a GPU by default, on
    CPU when ``numerics.autocast_on_cpu`` asks for it); tests/model checks the fp32 attention inside it."""
    cfg = make_config(device=device, **overrides)
    assert cfg.numerics.autocast_on_cpu == (device == "cpu")
    trainer = Trainer(cfg, tmp_path / "run", D.setup(device))
    block = trainer.model.transformer.h[0]
    dtypes = []
    block.mlp.c_fc.register_forward_hook(lambda m, a, out: dtypes.append(("mlp", out.dtype)))
    block.attn.c_attn.register_forward_hook(lambda m, a, out: dtypes.append(("qkv", out.dtype)))
    trainer.open_records()
    stats = trainer.step()
    trainer.close()
    assert stats.finite
    assert set(dtypes) == {("mlp", torch.bfloat16), ("qkv", torch.bfloat16)}


@pytest.mark.parametrize("backend", ["closed_form", "reference"])
def test_the_attention_backward_runs_in_fp32_outside_autocast(make_config, tmp_path, backend):
    """Paper §4: attention in fp32, bf16 autocast outside it, in the backward too. The trainer called
    backward() inside the autocast region; the autograd engine takes the caller's autocast state, so the
    backward of the operator's fp32 products (dQ, dK, dV, dP) ran as bf16 matmuls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class BatchedProducts(TorchDispatchMode):  # (phase, dtype) of every batched matmul: the attention's
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
                phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
                self.seen.add((phase, args[0].dtype))
            return func(*args, **(kwargs or {}))

    cfg = make_config(**{"numerics.autocast_on_cpu": True, "operator.name": "minmax-weight-k4",
                         "operator.backend": backend})  # fmt: skip
    trainer = Trainer(cfg, tmp_path / "run", D.setup("cpu"))
    trainer.open_records()
    with BatchedProducts() as products:
        stats = trainer.step()
    trainer.close()
    assert stats.finite
    assert products.seen == {("forward", torch.float32), ("backward", torch.float32)}, products.seen


def test_without_clipping_no_step_counts_as_clipped(make_config, tmp_path):
    """optim.grad_clip 0 disables clipping: the norm is still logged, and no step is "clipped"."""
    train(make_config(**{"optim.grad_clip": 0.0}), tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 8 and all(r["grad_norm"] > 0 for r in rows)
    assert [(r["clipped"], r["clipped_frac"]) for r in rows] == [(False, 0.0)] * 8


def test_a_non_finite_gradient_norm_with_a_finite_loss_is_not_finite():
    from kinterval.train.trainer import StepStats

    assert StepStats(1, 1e-3, 2.5, 0.7, False).finite
    for bad in (float("inf"), float("nan")):
        assert not StepStats(1, 1e-3, 2.5, bad, True).finite
        assert not StepStats(1, 1e-3, bad, 0.7, False).finite


def test_optimizer_step_uses_the_learning_rate_of_its_own_token_count(make_config, tmp_path):
    """Step s (0-based) runs at the schedule's value after (s+1) * 256 tokens (docs/training.md): linear
    warmup over 512 tokens to the peak 3e-3, then cosine to 0.1 * peak at the 2,048th token. Worked out by
    hand here; the value in the optimizer when it steps, and the logged one, must both be it."""
    import math

    peak, floor = 3e-3, 3e-4
    want = [peak * 256 / 512, peak] + [
        floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * (s - 1) / 6)) for s in range(2, 8)
    ]
    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    used = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: used.append({g["lr"] for g in opt.param_groups})
    )
    trainer.open_records()
    logged = [trainer.step().lr for _ in range(8)]
    trainer.close()
    assert [len(u) for u in used] == [1] * 8  # both groups, one value
    assert [u.pop() for u in used] == pytest.approx(want, rel=1e-12)
    assert logged == pytest.approx(want, rel=1e-12) and logged[-1] == pytest.approx(floor)


def test_a_logged_row_is_its_steps_stats_with_throughput_since_the_last_row_and_peak_mem_in_bytes(
    make_config, tmp_path, monkeypatch
):
    """docs/training.md §3: a row holds its step's own loss, learning rate (the one the step used), gradient
    norm and clip flag; tokens_per_s is the throughput since the previous row, so with log.every > 1 it
    counts all the steps since then (not one), and restarts at each row; peak_mem is in bytes (on Linux
    the process's peak resident size, which /proc/self/status reports in kB as VmHWM). A hand-set clock
    replaces the trainer's: 3 steps in 3 s, then 1 step in 2 s, at 256 tokens per step."""
    import re
    import resource
    from types import SimpleNamespace

    from kinterval.train import trainer as trainer_module

    now = [0.0]
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def hwm(pick):  # VmHWM and getrusage's ru_maxrss differ by some pages (different accounting)
        vm = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        return pick(vm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    trainer = Trainer(make_config(), tmp_path / "run", D.setup("cpu"))
    trainer.open_records()
    before, logged = hwm(min), []
    for seconds in (1, 1, 1):
        stats = trainer.step()
        now[0] += seconds
    trainer.log_step(stats)
    logged.append(stats)
    stats = trainer.step()
    now[0] += 2
    trainer.log_step(stats)
    logged.append(stats)
    after = hwm(max)
    trainer.close()
    rows = read_metrics(tmp_path / "run")
    assert trainer.plan.tokens_per_step == 256 and [r["step"] for r in rows] == [3, 4]
    fields = ("step", "train_loss", "lr", "grad_norm", "clipped")
    assert [tuple(r[k] for k in fields) for r in rows] == [
        tuple(getattr(s, k) for k in fields) for s in logged
    ]
    assert [r["tokens_per_s"] for r in rows] == [3 * 256 / 3, 256 / 2]
    assert before <= rows[0]["peak_mem"] <= rows[1]["peak_mem"] <= after


def test_validate_without_eval_every_names_the_setting(make_config, tmp_path):
    # docs/training.md §7: trainer.validate() needs log.eval_every > 0 (only then is the val split loaded)
    cfg = make_config()
    assert cfg.log.eval_every == 0
    trainer = Trainer(cfg, tmp_path / "run", D.setup(cfg.device))
    try:
        with pytest.raises(ValueError, match=r"log\.eval_every"):
            trainer.validate()
    finally:
        trainer.close()


def test_validation_at_one_position_logs_the_loss_and_no_span(make_config, tmp_path):
    """T = 1: no row has two keys, so the validation row has no row span ("nan" in the file) and the loss
    is still logged; it was a ZeroDivisionError after the first checkpoints."""
    cfg = make_config(
        **{"model.block_size": 1, "log.eval_every": 2, "schedule.tokens": 64, "schedule.warmup_tokens": 8}
    )
    trainer = Trainer(cfg, tmp_path / "run", D.setup(cfg.device))
    try:
        trainer.open_records()
        trainer.step()
        row = trainer.validate()
    finally:
        trainer.close()
    assert math.isfinite(row["val_loss"]) and math.isnan(row["row_span"])
    assert all(math.isnan(s) for s in row["row_span_layers"])
    (logged,) = [r for r in read_metrics(tmp_path / "run") if r.get("event") == "validation"]
    assert logged["row_span"] == "nan" and logged["val_loss"] == row["val_loss"]
