"""The training loop: ``train(cfg, out, resume=...)``.

One optimizer step sees the global sequences ``step*S .. step*S+S-1`` of the data order
(``SequenceSampler``); rank ``r`` takes the ``r``-th contiguous share and splits it into micro-batches. Every
micro-batch loss is scaled by ``micro_batch / per_rank_seqs`` (DDP/FSDP then average over ranks), so the
step's
gradient is that of the mean loss over all S sequences whatever the micro-batch, accumulation or world size.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from kinterval.data.loader import SequenceSampler, TokenShards, load_batch
from kinterval.model import GPT, SDPA, autocast, parse_operator, resolve_backend, train_precision
from kinterval.train import distributed as D
from kinterval.train.checkpoint import (
    CheckpointError,
    code_identity,
    config_differences,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from kinterval.train.config import TrainConfig
from kinterval.train.metrics import MetricsLog, write_status
from kinterval.train.optim import build_optimizer
from kinterval.train.schedule import Plan, make_plan

# Fields that change how a run executes but not what it computes (up to float rounding); a resume may
# change them. Everything else in the config must match the checkpoint.
EXECUTION_FIELDS = frozenset(
    {
        "name",
        "device",
        "operator.backend",
        "schedule.micro_batch",
        "schedule.accum",
        "dist.strategy",
        "log.every",
        "log.progress",
        "log.tensorboard",
        "checkpoint.count",
        "checkpoint.save_every",
        "data.dir",
        "data.verify",
    }
)

EXIT_NONFINITE = 3


@dataclass
class TrainResult:
    status: str  # "completed" or "nonfinite_loss"
    run_dir: Path
    steps: int  # optimizer steps completed
    tokens: int
    last_loss: float | None
    last_checkpoint: Path | None
    train_s: float | None = None  # training wall time over all sessions of the run
    resumed_finished: bool = False  # a resume found the run already complete and did nothing

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "completed" else EXIT_NONFINITE


StepHook = Callable[[int, torch.nn.Module], None]  # (completed steps, model) after each step


def data_identity(shards: TokenShards) -> dict:
    info = shards.meta["splits"][shards.split]
    return {
        "source": shards.meta.get("source"),
        "vocab_size": shards.vocab_size,
        "split": shards.split,
        "n_tokens": shards.n_tokens,
        "shards_sha256": [s.get("sha256") for s in info["shards"]],
    }


def identity(cfg: TrainConfig, plan: Plan, data: dict) -> dict:
    """What a checkpoint must agree on to be resumed: config minus execution fields, plus derived values."""
    from kinterval.train.config import flatten

    flat = {k: v for k, v in flatten(cfg.to_dict()).items() if k not in EXECUTION_FIELDS}
    flat["operator.name"] = str(
        cfg.operator.name if cfg.operator.name == "sdpa" else parse_operator(cfg.operator.name).full_name
    )
    flat["derived.seqs_per_step"] = plan.seqs_per_step
    flat["derived.steps"] = plan.steps
    flat["data.identity"] = data
    return flat


def _peak_mem(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def train(
    cfg: TrainConfig, out: str | Path, *, resume: bool = False, on_step: StepHook | None = None
) -> TrainResult:
    """Train (or with ``resume``, continue) the run in folder ``out``; see docs/training.md."""
    cfg.validate()
    out = Path(out)
    info = D.setup(cfg.device)
    old_det = torch.are_deterministic_algorithms_enabled()
    try:
        if info.device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        return _train(cfg, out, info, resume, on_step)
    finally:
        torch.use_deterministic_algorithms(old_det)
        D.teardown(info)


def _train(
    cfg: TrainConfig, out: Path, info: D.DistInfo, resume: bool, on_step: StepHook | None
) -> TrainResult:
    shards = TokenShards(cfg.data.dir, "train", verify=cfg.data.verify)
    tokens = shards.tokens()
    model_cfg = cfg.model_config(shards.vocab_size)
    shards.check_vocab(model_cfg.vocab_size)
    plan = make_plan(cfg, info.world_size)
    T, S = plan.block_size, plan.seqs_per_step
    mb = cfg.schedule.micro_batch
    per_rank = mb * cfg.schedule.accum  # sequences per step on this rank
    data_id = data_identity(shards)
    want = identity(cfg, plan, data_id)

    # ---- start or resume
    ckpt = None
    existing = latest_checkpoint(out)
    if existing is not None and not resume:
        raise ValueError(
            f"{out} already holds checkpoints ({existing.name}); pass --resume or choose another --out"
        )
    if resume and existing is not None:
        ckpt = load_checkpoint(existing)
        diffs = config_differences(ckpt.state.get("identity") or {}, want)
        if diffs:
            raise CheckpointError(
                f"checkpoint {existing} was made with a different config; refusing to resume. "
                f"Differing fields (checkpoint -> requested): {'; '.join(diffs)}"
            )
        if ckpt.state["step"] == plan.steps:  # finished: nothing to redo, leave the run's records as they are
            return _finished(out, info, plan, ckpt)
    check_fits(cfg, model_cfg, len(tokens), info.device)

    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)  # noqa: NPY002 (legacy global RNG, for user code)
    random.seed(cfg.seed)
    model = GPT(model_cfg, cfg.operator.name, cfg.operator.backend).to(info.device)
    model = D.wrap(model, info, cfg.dist.strategy)
    optimizer, decayed = build_optimizer(model, cfg.optim, info.device)
    start = 0
    if ckpt is not None:
        try:
            D.load_full_state(model, optimizer, ckpt.model, ckpt.optimizer)
            restore_rng(ckpt.rng["tensors"], ckpt.rng["json"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"checkpoint {ckpt.path}: cannot be restored ({err})") from None
        start = int(ckpt.state["step"])
    last_ckpt = ckpt.path if ckpt is not None else None

    sampler = SequenceSampler(len(tokens), T, cfg.seed)
    log = MetricsLog(out, cfg.log.tensorboard) if info.is_main else None
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        log.truncate_after(start)  # rows past the checkpoint are redone
        (out / "run_config.json").write_text(
            _json(
                {
                    "config": cfg.to_dict(),
                    "model": model_cfg.to_dict(),
                    "plan": asdict(plan),
                    "world_size": info.world_size,
                }
            )
        )
        write_status(
            out,
            status="running",
            step=start,
            steps=plan.steps,
            tokens=start * plan.tokens_per_step,
            last_checkpoint=str(last_ckpt) if last_ckpt else None,
        )

    show = cfg.log.progress and info.is_main and sys.stderr.isatty()
    bar = tqdm(
        total=plan.steps,
        initial=start,
        desc=f"train {model.module.operator if hasattr(model, 'module') else model.operator}",
        unit="step",
        disable=not show,
    )
    numerics = model_cfg.numerics
    # Clipped steps since step 0 (kept in the checkpoint); older checkpoints lack it: count from the resume.
    n_clipped = int(ckpt.state.get("clipped_steps", 0)) if ckpt is not None else 0
    clip_base = start if ckpt is not None and "clipped_steps" not in ckpt.state else 0
    train_s0 = float(ckpt.state.get("train_s", 0.0)) if ckpt is not None else 0.0
    last_loss, t_last, steps_since, t_start = None, time.perf_counter(), 0, time.perf_counter()
    train_s = train_s0
    model.train()
    try:
        with train_precision(numerics):
            for step in range(start, plan.steps):
                lr = plan.lr(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                offsets = sampler.offsets(step * S + info.rank * per_rank, per_rank)  # this rank's share
                loss_sum = accumulate_gradients(model, tokens, offsets, mb, T, numerics, info.device)
                train_loss = D.mean_across(loss_sum, info).item()
                grad_norm = clip_gradients(model, cfg.optim.grad_clip)
                done = step + 1
                if not (np.isfinite(train_loss) and np.isfinite(grad_norm)):
                    return _stop_nonfinite(out, info, log, plan, done, train_loss, grad_norm, last_ckpt)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                clipped = cfg.optim.grad_clip > 0 and grad_norm > cfg.optim.grad_clip
                n_clipped += int(clipped)
                last_loss = train_loss
                train_s = train_s0 + time.perf_counter() - t_start  # over all sessions of the run
                steps_since += 1
                bar.update(1)
                if info.is_main and (done % cfg.log.every == 0 or done == plan.steps):
                    now = time.perf_counter()
                    log.write(
                        {
                            "step": done,
                            "tokens": plan.tokens_after(step),
                            "train_loss": train_loss,
                            "lr": lr,
                            "grad_norm": grad_norm,
                            "clipped": bool(clipped),
                            "clipped_frac": n_clipped / (done - clip_base),
                            "tokens_per_s": steps_since * plan.tokens_per_step / max(now - t_last, 1e-9),
                            "peak_mem": _peak_mem(info.device),
                        }
                    )
                    bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}")
                    t_last, steps_since = now, 0
                if done in plan.checkpoint_steps:
                    extra = {
                        "train_loss": train_loss,
                        "clipped_steps": n_clipped,
                        "train_s": train_s,
                    }
                    last_ckpt = _save(
                        out, info, model, optimizer, cfg, model_cfg, plan, done, want, decayed, extra
                    )
                if on_step is not None:
                    on_step(done, model)
    finally:
        bar.close()
        if log is not None:
            log.close()
    if info.is_main:
        write_status(
            out,
            status="completed",
            step=plan.steps,
            steps=plan.steps,
            tokens=plan.total_tokens,
            last_loss=last_loss,
            last_checkpoint=str(last_ckpt) if last_ckpt else None,
            train_s=train_s,
        )
    return TrainResult("completed", out, plan.steps, plan.total_tokens, last_loss, last_ckpt, train_s)


def _finished(out: Path, info: D.DistInfo, plan: Plan, ckpt) -> TrainResult:
    """Resume of a finished run: change nothing (status.json is only written if a kill left it unfinished)."""
    state = ckpt.state
    result = TrainResult(
        "completed",
        out,
        plan.steps,
        plan.total_tokens,
        state.get("train_loss"),
        ckpt.path,
        state.get("train_s"),
        resumed_finished=True,
    )
    status_file = out / "status.json"
    try:
        done = json.loads(status_file.read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        done = False
    if info.is_main and not done:
        write_status(
            out,
            status="completed",
            step=plan.steps,
            steps=plan.steps,
            tokens=plan.total_tokens,
            last_loss=result.last_loss,
            last_checkpoint=str(ckpt.path),
            train_s=result.train_s,
        )
    return result


def check_fits(cfg: TrainConfig, model_cfg, n_tokens: int, device: torch.device) -> None:
    """Refuse, before allocating, a block size the data or the device cannot hold.

    The train split must hold one window of T+1 tokens. Without a fused kernel (backends other than triton,
    and sdpa off CUDA) every layer keeps its (micro_batch, n_head, T, T) fp32 probabilities for the backward,
    so ``n_layer * micro_batch * n_head * T^2 * 4`` bytes is a lower bound on the activation memory.
    """
    T, mb = cfg.block_size, cfg.schedule.micro_batch
    if T + 1 > n_tokens:
        raise ValueError(
            f"model.block_size {T} needs {T + 1} tokens per training window; the train split of "
            f"{cfg.data.dir} has {n_tokens}"
        )
    fused = (cfg.operator.name == SDPA and device.type == "cuda") or (
        resolve_backend(cfg.operator.backend, device) == "triton"
    )
    if fused:
        return
    need = model_cfg.n_layer * mb * model_cfg.n_head * T * T * 4
    have = device_memory(device)
    if have and need > have:
        raise ValueError(
            f"model.block_size {T}: the attention probabilities kept for the backward alone need "
            f"n_layer*micro_batch*n_head*T^2*4 = {need / 2**30:.1f} GiB, more than the "
            f"{have / 2**30:.1f} GiB of {device}; lower --block-size or --micro-batch "
            "(or use the triton backend on CUDA)"
        )


def device_memory(device: torch.device) -> int | None:
    """Total memory of a CUDA device, or the machine's physical memory for the CPU (None if unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def accumulate_gradients(model, tokens, offsets, mb, T, numerics, device) -> torch.Tensor:
    """Forward/backward the sequences at ``offsets`` in micro-batches of ``mb``; gradients of their mean loss.

    Returns that mean loss (detached). The gradient all-reduce of DDP/FSDP2 runs only on the last micro-batch.
    """
    n = len(offsets)
    loss_sum = torch.zeros((), device=device)
    for j in range(0, n, mb):
        x, y = load_batch(tokens, offsets[j : j + mb], T)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with D.grad_sync(model, j + mb >= n), autocast(numerics, device):
            _, loss = model(x, y)
            scaled = loss * (len(x) / n)
            scaled.backward()
        loss_sum += scaled.detach()
    return loss_sum


def clip_gradients(model: torch.nn.Module, grad_clip: float) -> float:
    """Clip the global gradient norm at ``grad_clip`` (0: no clipping); return the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2 returns a DTensor
        norm = norm.full_tensor()
    return norm.item()


def _save(out, info, model, optimizer, cfg, model_cfg, plan, done, want, decayed, extra) -> Path:
    msd, osd = D.full_state(model, optimizer)  # collective: every rank takes part
    path = out / "checkpoints" / f"step_{done:06d}"
    if info.is_main:
        state = {
            "step": done,
            "tokens": done * plan.tokens_per_step,
            "seq_counter": done * plan.seqs_per_step,
            **extra,
            "world_size": info.world_size,
            "config": cfg.to_dict(),
            "model_config": model_cfg.to_dict(),
            "operator": _operator_dict(cfg.operator.name),
            "plan": asdict(plan),
            "identity": want,
            "decayed_params": decayed,
            "code": code_identity(),
        }
        path = save_checkpoint(out, done, msd, osd, state)
    D.barrier(info)
    return path


def _stop_nonfinite(out, info, log, plan, done, train_loss, grad_norm, last_ckpt) -> TrainResult:
    """Leave the last good checkpoint untouched, record the event and report a failed run."""
    event = {
        "event": "nonfinite_loss",
        "step": done,
        "tokens": done * plan.tokens_per_step,
        "train_loss": train_loss,
        "grad_norm": grad_norm,
    }
    if info.is_main:
        log.write(event)
        write_status(
            out,
            status="nonfinite_loss",
            step=done,
            steps=plan.steps,
            train_loss=train_loss,
            grad_norm=grad_norm,
            last_checkpoint=str(last_ckpt) if last_ckpt else None,
        )
        print(
            f"kinterval train: non-finite loss/gradient at step {done} "
            f"(loss={train_loss}, grad_norm={grad_norm});"
            f" stopped. Last good checkpoint: {last_ckpt}",
            file=sys.stderr,
        )
    return TrainResult(
        "nonfinite_loss", out, done - 1, (done - 1) * plan.tokens_per_step, train_loss, last_ckpt
    )


def _operator_dict(name: str) -> dict:
    op = parse_operator(name)
    return {"name": "sdpa", "full_name": "sdpa"} if isinstance(op, str) else op.to_dict()


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=1) + "\n"
