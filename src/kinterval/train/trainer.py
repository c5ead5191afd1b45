"""One training run's state and what can be done with it: :class:`Trainer`.

A ``Trainer`` owns the run's components (model, AdamW optimizer, sequence sampler, step plan, metrics log) and
its counters (completed steps, clipped steps, training time). ``step()`` takes one optimizer step, ``save()``
writes a checkpoint, ``resume()`` restores the newest one. ``loop.train`` drives it top to bottom.

One optimizer step sees the global sequences ``step*S .. step*S+S-1`` of the data order
(``SequenceSampler``); rank ``r`` takes the ``r``-th contiguous share and splits it into micro-batches. Every
micro-batch loss is scaled by ``micro_batch / per_rank_seqs`` (DDP/FSDP then average over ranks), so the
step's gradient is that of the mean loss over all S sequences whatever the micro-batch, accumulation or world
size.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import resource
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from kinterval import atomic
from kinterval.data.loader import (
    SequenceSampler,
    TokenShards,
    data_passes,
    load_batch,
    n_blocks,
    passes_text,
)
from kinterval.environment import ENVIRONMENT_FILE, environment, read_environment
from kinterval.model import GPT, SDPA, CausalSelfAttention, autocast, parse_operator, train_precision
from kinterval.model.scores import attention_scores, row_span
from kinterval.ops import resolve_backend
from kinterval.train import distributed as D
from kinterval.train.checkpoint import (
    CheckpointError,
    checkpoint_step,
    code_identity,
    config_differences,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from kinterval.train.config import TrainConfig
from kinterval.train.evaluate import evaluate_nll
from kinterval.train.metrics import LOG_EVERY, MetricsLog, missing_steps, read_metrics, write_status
from kinterval.train.optim import build_optimizer
from kinterval.train.schedule import Plan, check_step_within_budget, make_plan

# Fields that change how a run executes but not what it computes (up to float rounding); a resume may
# change them. Everything else in the config must match the checkpoint.
EXECUTION_FIELDS = frozenset(
    {
        "name",
        "device",
        "compile",
        "activation_checkpointing",
        "operator.backend",
        "schedule.micro_batch",
        "schedule.accum",
        "dist.strategy",
        "log.every",
        "log.progress",
        "log.tensorboard",
        "log.eval_every",
        "log.eval_blocks",
        "checkpoint.count",
        "checkpoint.save_every",
        "data.dir",
        "data.verify",
        "data.source",  # a free-text note; the data's identity is its shards' hashes (data.identity)
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


@dataclass
class StepStats:
    """What one optimizer step reports."""

    step: int  # steps completed after it (1-based)
    lr: float
    train_loss: float
    grad_norm: float
    clipped: bool

    @property
    def finite(self) -> bool:
        return bool(np.isfinite(self.train_loss) and np.isfinite(self.grad_norm))


class Trainer:
    """The state of the run in folder ``out``: build with ``Trainer(cfg, out, info)``, then ``resume()``
    (or ``start()``), ``step()`` repeatedly, ``save()`` at the plan's checkpoint steps and ``finish()``."""

    def __init__(self, cfg: TrainConfig, out: str | Path, info: D.DistInfo):
        if not isinstance(cfg, TrainConfig):
            raise TypeError(
                f"cfg must be a TrainConfig (e.g. TrainConfig.from_toml(...)), got {type(cfg).__name__}"
            )
        if not isinstance(info, D.DistInfo):
            raise TypeError(f"info must be a DistInfo (kinterval.train.distributed.setup(device)), got "
                            f"{type(info).__name__}")  # fmt: skip
        self.cfg, self.out, self.info = cfg.validate(), Path(out), info
        shards = TokenShards(cfg.data.dir, "train", verify=cfg.data.verify)
        self.tokens, self.locate = shards.tokens(), shards.locate
        self.model_cfg = cfg.model_config(shards.vocab_size)
        shards.check_vocab(self.model_cfg.vocab_size)
        self.plan = make_plan(cfg, info.world_size)
        self.identity = identity(cfg, self.plan, data_identity(shards))
        check_fits(cfg, self.model_cfg, len(self.tokens), info.device)
        check_step_within_budget(cfg, self.plan, info.world_size)
        if info.is_main and (note := protocol_batch_note(cfg, self.plan)):
            print(f"kinterval train: warning: {note}", file=sys.stderr)
        self.passes = data_passes(self.plan.total_tokens, len(self.tokens), self.plan.block_size)
        if info.is_main and (note := passes_note(self.plan, len(self.tokens), cfg.data.dir)):
            print(f"kinterval train: note: {note}", file=sys.stderr)

        seed_all(cfg.seed)
        model = GPT(self.model_cfg, cfg.operator.name, cfg.operator.backend).to(info.device)
        model.activation_checkpointing = cfg.activation_checkpointing
        self.model = D.wrap(model, info, cfg.dist.strategy, compile=cfg.compile)
        self.optimizer, self.decayed = build_optimizer(self.model, cfg.optim, info.device)
        self.sampler = SequenceSampler(len(self.tokens), self.plan.block_size, cfg.seed)
        self.log = None
        with D.agreed(info, (ValueError,)):  # rank 0 alone keeps the log: its refusal stops every rank
            self.log = MetricsLog(self.out, cfg.log.tensorboard) if info.is_main else None
        self.val_tokens = TokenShards(cfg.data.dir, "val").tokens() if cfg.log.eval_every else None
        if self.val_tokens is not None and n_blocks(len(self.val_tokens), self.plan.block_size) == 0:
            raise ValueError(
                f"log.eval_every: the val split of {cfg.data.dir} holds no block of "
                f"{self.plan.block_size}+1 tokens"
            )

        self.done = 0  # optimizer steps completed
        self._resumed_every: int | None = None  # log.every of the session that saved the resumed checkpoint
        self.clipped_steps, self.clip_base = 0, 0  # clipped_frac = clipped_steps / (done - clip_base)
        self.train_s, self._t0 = (
            0.0,
            time.perf_counter(),
        )  # training time of earlier sessions; this one's start
        self.last_loss: float | None = None
        self.last_checkpoint: Path | None = None
        self.finished = False  # resume() found the run complete
        self._bar = None  # open_records() opens the session's records, close() ends them
        self._closed = False
        self._saved = (-1, 0.0)  # (step, train_s) of the last checkpoint this session wrote

    # ------------------------------------------------------------------ start / resume
    def start(self) -> None:
        """Begin a new run; a folder that already holds checkpoints is refused."""
        existing = latest_checkpoint(self.out)
        if existing is not None:
            raise ValueError(
                f"{self.out} already holds checkpoints ({existing.name}); "
                "pass --resume or choose another --out"
            )

    def resume(self) -> None:
        """Restore the newest checkpoint (none: start from scratch). A finished run sets ``finished``."""
        path = latest_checkpoint(self.out)
        if path is None:
            return
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as err:  # a damaged newest checkpoint: say how to go on without it
            older = [c for c in list_checkpoints(self.out) if checkpoint_step(c) < checkpoint_step(path)]
            hint = (
                f"remove {path} to resume from {older[-1].name}" if older else f"remove {path} to start over"
            )
            raise CheckpointError(f"{err} ({hint})") from None
        saved = ckpt.state.get("identity") or {}
        diffs = config_differences(resume_identity(saved), resume_identity(self.identity))
        if diffs:
            raise CheckpointError(
                f"checkpoint {path} was made with a different config; refusing to resume. "
                f"Differing fields (checkpoint -> requested): {'; '.join(diffs)}"
            )
        state = ckpt.state
        was, now = (state.get("code") or {}).get("ops_sha256"), code_identity()["ops_sha256"]
        if self.info.is_main and was is not None and was != now:
            # allowed (a fix may be the reason to resume), but the run then mixes two operators' code
            print(
                f"kinterval train: warning: {path} was trained by other operator code (ops_sha256 "
                f"{was[:12]}, this checkout {now[:12]}); the run goes on with this checkout's (a suite's "
                "gate reports the mix)",
                file=sys.stderr,
            )
        self.done, self.last_checkpoint = int(state["step"]), ckpt.path
        log = state["config"].get("log")
        every = log.get("every") if isinstance(log, dict) else None
        self._resumed_every = every if isinstance(every, int) and not isinstance(every, bool) else None
        self.last_loss, self.train_s = state.get("train_loss"), float(state.get("train_s", 0.0))
        # Clipped steps since step 0; checkpoints written before it was recorded count from the resume.
        self.clipped_steps = int(state.get("clipped_steps", 0))
        self.clip_base = 0 if "clipped_steps" in state else self.done
        if self.done == self.plan.steps:
            self.finished = True
            return
        try:
            D.load_full_state(self.model, self.optimizer, ckpt.model, ckpt.optimizer)
            restore_rng(ckpt.rng["tensors"], ckpt.rng["json"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"checkpoint {ckpt.path}: cannot be restored ({err})") from None

    def open_records(self) -> None:
        """Drop the log rows a resumed run will redo, write run_config.json and a "running" status."""
        self._t0 = time.perf_counter()
        show = self.cfg.log.progress and self.info.is_main and sys.stderr.isatty()
        self._bar = tqdm(
            total=self.plan.steps,
            initial=self.done,
            desc=f"train {D.unwrap(self.model).operator}",
            unit="step",
            disable=not show,
        )
        self._since, self._t_last = 0, time.perf_counter()
        if not self.info.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.log.truncate_after(self.done)  # rows past the checkpoint are redone
        self._check_log_reaches_checkpoint()
        if self.done and self._resumed_every and self.cfg.log.every != self._resumed_every:
            # the log's cadence changes here: what missing_steps (and a suite's gate) expect from now on
            change = {"every": self.cfg.log.every, "was_every": self._resumed_every}
            self.log.write({"event": LOG_EVERY, "step": self.done, **change})
        if self.done and not self.cfg.log.tensorboard and (self.out / "tensorboard").is_dir():
            print(
                f"kinterval train: warning: {self.out / 'tensorboard'} holds an earlier session's events, "
                "and this one runs with log.tensorboard off: those curves stop there and may show steps "
                f"after the checkpoint at step {self.done}, which this session redoes (metrics.jsonl is the "
                "record; resume with --tensorboard to rewrite the curves from it)",
                file=sys.stderr,
            )
        run_config = {
            "config": self.cfg.to_dict(),
            "model": self.model_cfg.to_dict(),
            "plan": asdict(self.plan),
            "world_size": self.info.world_size,
            # the data read (config.data.source is a free-text label, e.g. a protocol's corpus), the train
            # split's size, and how many times the planned tokens go over it (1 = each window once)
            "train_data": {
                "source": self.identity["data.identity"]["source"],
                "tokens": len(self.tokens),
                "passes": round(self.passes, 6),
            },
        }
        atomic.write_text(self.out / "run_config.json", json.dumps(run_config, indent=1) + "\n")
        self._record_environment()
        self._status("running")

    def _record_environment(self) -> None:
        """Append this session's machine to ``environment.jsonl`` (one line per session, from the step it
        starts at, with the run's training time before it, ``train_s``: a session's share of the run's time
        is the next line's ``train_s`` minus its own); the lines of sessions that started at or after that
        step are dropped first: their work is redone."""
        path = self.out / ENVIRONMENT_FILE
        try:
            kept = [row for row in read_environment(path) if int(row.get("step", 0)) < self.done]
        except ValueError as err:  # the record of earlier sessions only: say how to go on
            raise ValueError(
                f"{err}; fix or delete that line to go on (that session's record is lost)"
            ) from None
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        env = environment(self.info.device, self.info.world_size)
        kept.append({"step": self.done, "time": now, "train_s": round(self.train_s, 3), **env})
        atomic.write_text(path, "".join(json.dumps(row) + "\n" for row in kept))

    # ------------------------------------------------------------------ one step
    def step(self) -> StepStats:
        """One optimizer step over this rank's share of the step's sequences, its forwards and backwards under
        ``train_precision`` (TF32 per ``numerics.tf32_train``). A non-finite loss or gradient norm is reported
        without stepping the optimizer (the caller stops the run)."""
        self._check_open("step()")
        if self.done >= self.plan.steps:
            raise RuntimeError(
                f"Trainer.step(): the plan's {self.plan.steps} steps are done (finish() records the run)"
            )
        cfg, plan, info = self.cfg, self.plan, self.info
        s = self.done  # 0-based index of this step
        lr = plan.lr(s)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        per_rank = cfg.schedule.micro_batch * cfg.schedule.accum  # sequences per step on this rank
        offsets = rank_offsets(self.sampler, s, plan.seqs_per_step, info.rank, per_rank)
        with train_precision(self.model_cfg.numerics):  # TF32 per the policy, however the trainer is driven
            loss_sum = accumulate_gradients(
                self.model,
                self.tokens,
                offsets,
                cfg.schedule.micro_batch,
                plan.block_size,
                self.model_cfg.numerics,
                info.device,
                self.model_cfg.vocab_size,
                self.locate,
            )
        train_loss = D.mean_across(loss_sum, info).item()
        grad_norm = clip_gradients(self.model, cfg.optim.grad_clip)
        clipped = cfg.optim.grad_clip > 0 and grad_norm > cfg.optim.grad_clip
        stats = StepStats(s + 1, lr, train_loss, grad_norm, bool(clipped))
        if not stats.finite:
            return stats
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.done = s + 1
        self.clipped_steps += int(clipped)
        self.last_loss = train_loss
        self._since += 1
        self._bar.update(1)
        return stats

    def elapsed(self) -> float:
        """Training time over all sessions of the run."""
        return self.train_s + time.perf_counter() - self._t0

    def log_step(self, stats: StepStats) -> None:
        """Write the step's row to metrics.jsonl (main rank)."""
        self._check_open("log_step()")
        now = time.perf_counter()
        if self.info.is_main:
            self.log.write(
                {
                    "step": stats.step,
                    "tokens": self.plan.tokens_after(stats.step - 1),
                    "train_loss": stats.train_loss,
                    "lr": stats.lr,
                    "grad_norm": stats.grad_norm,
                    "clipped": stats.clipped,
                    "clipped_frac": self.clipped_steps / (stats.step - self.clip_base),
                    "tokens_per_s": self._since * self.plan.tokens_per_step / max(now - self._t_last, 1e-9),
                    "peak_mem": _peak_mem(self.info.device),
                }
            )
        self._bar.set_postfix(loss=f"{stats.train_loss:.4f}", lr=f"{stats.lr:.2e}")
        self._t_last, self._since = now, 0

    @torch.no_grad()
    def validate(self) -> dict:
        """Validation loss on the first ``log.eval_blocks`` validation blocks (the evaluator's protocol:
        batch 1, TF32 off) and, in the same forward passes, the geometry probe's row span ``M - m`` (rows
        i >= 1, averaged per layer, then over layers); written as a ``"validation"`` row of metrics.jsonl.
        A collective under FSDP2 (every rank runs it); it changes no training state."""
        if self.val_tokens is None:
            raise ValueError(
                "Trainer.validate() needs log.eval_every > 0 (the val split is loaded only then); "
                f"this run's config has log.eval_every = {self.cfg.log.eval_every}"
            )
        model = D.unwrap(self.model)
        layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
        sums, counts = [0.0] * len(layers), [0] * len(layers)

        def hook(i):
            def pre_hook(module, args):
                _, _, _, s, valid = attention_scores(module, args[0])
                span = row_span(s[..., 1:, :], valid[..., 1:, :])  # rows with at least two keys
                sums[i] += float(span.double().sum())
                counts[i] += span.numel()

            return pre_hook

        handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(layers)]
        try:
            n = self.cfg.log.eval_blocks
            # eager even with compiled blocks (`compile`): the evaluator's numerics, and the hooks above run
            with torch.compiler.set_stance("force_eager"):
                nll = evaluate_nll(model, self.val_tokens, self.plan.block_size, max_blocks=n)
        finally:
            for h in handles:
                h.remove()
        # T = 1: no row has two keys, so there is no span to log ("nan" in the file), only the loss
        spans = [s / c if c else float("nan") for s, c in zip(sums, counts)]
        row = {
            "event": "validation",
            "step": self.done,
            "tokens": self.done * self.plan.tokens_per_step,
            "val_loss": float(nll.mean()),
            "val_blocks": len(nll),
            "row_span": float(np.mean(spans)),
            "row_span_layers": spans,
        }
        if self.info.is_main:
            self.log.write(row)
        return row

    # ------------------------------------------------------------------ checkpoints and the end
    def save(self) -> Path:
        """Checkpoint the completed steps (a collective: every rank takes part; rank 0 writes)."""
        msd, osd = D.full_state(self.model, self.optimizer)
        path = self.out / "checkpoints" / f"step_{self.done:06d}"
        if self.info.is_main:
            plan, done = self.plan, self.done
            state = {
                "step": done,
                "tokens": done * plan.tokens_per_step,
                "seq_counter": done * plan.seqs_per_step,
                "train_loss": self.last_loss,
                "clipped_steps": self.clipped_steps,
                "train_s": self.elapsed(),
                "world_size": self.info.world_size,
                "config": self.cfg.to_dict(),
                "model_config": self.model_cfg.to_dict(),
                "operator": _operator_dict(self.cfg.operator.name),
                "plan": asdict(plan),
                "identity": self.identity,
                "decayed_params": self.decayed,
                "code": code_identity(),
            }
            path = save_checkpoint(self.out, done, msd, osd, state)
            self._saved = (done, state["train_s"])
        D.barrier(self.info)
        self.last_checkpoint = path
        return path

    def finish(self) -> TrainResult:
        """Record the completed run (a finished run found by ``resume()`` keeps its records)."""
        plan = self.plan
        if self.finished:
            train_s = self.train_s
            if self.info.is_main and not self._status_is("completed"):  # a kill before the final status
                self._status("completed", last_loss=self.last_loss, train_s=train_s)
        else:
            train_s = self._final_train_s()
            if self.info.is_main:
                self._status("completed", last_loss=self.last_loss, train_s=train_s)
        return TrainResult(
            "completed",
            self.out,
            plan.steps,
            plan.total_tokens,
            self.last_loss,
            self.last_checkpoint,
            train_s,
            resumed_finished=self.finished,
        )

    def stop_nonfinite(self, stats: StepStats) -> TrainResult:
        """Leave the last good checkpoint untouched, record the event and report a failed run."""
        done, plan = stats.step, self.plan
        if self.info.is_main:
            self.log.write(
                {
                    "event": "nonfinite_loss",
                    "step": done,
                    "tokens": done * plan.tokens_per_step,
                    "train_loss": stats.train_loss,
                    "grad_norm": stats.grad_norm,
                }
            )
            self._status(
                "nonfinite_loss",
                step=done,
                tokens=done * plan.tokens_per_step,
                train_loss=stats.train_loss,
                grad_norm=stats.grad_norm,
            )  # fmt: skip (the event's row)
            print(
                f"kinterval train: non-finite loss/gradient at step {done} "
                f"(loss={stats.train_loss}, grad_norm={stats.grad_norm});"
                f" stopped. Last good checkpoint: {self.last_checkpoint or 'none (before the first)'}",
                file=sys.stderr,
            )
        return TrainResult(
            "nonfinite_loss",
            self.out,
            done - 1,
            (done - 1) * plan.tokens_per_step,
            stats.train_loss,
            self.last_checkpoint,
        )

    def close(self) -> None:
        """End the session's records (progress bar, metrics log): no step() or log_step() after it."""
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self.log is not None:
            self.log.close()

    def _check_open(self, call: str) -> None:
        """Refuse a call out of order before it changes anything (the order: resume() or start(),
        open_records(), step()/log_step()/save(), close(), finish())."""
        if self._closed:
            raise RuntimeError(f"Trainer.{call} after close(): build a new Trainer and resume() to go on")
        if self._bar is None:
            raise RuntimeError(f"Trainer.{call} before open_records(), which opens the run's records")

    def _check_log_reaches_checkpoint(self) -> None:
        """Warn when metrics.jsonl lacks rows that the sessions before the resumed checkpoint logged (the
        file deleted, replaced or cut short since; :func:`missing_steps`): the resumed run would log on above
        a hole. A kill never causes it: a step's row is written before its checkpoint."""
        if not self.done or not self._resumed_every:
            return
        missing = missing_steps(read_metrics(self.out), self._resumed_every, self.done)
        if missing:
            warnings.warn(
                f"{self.log.path} lacks {len(missing)} row(s) up to step {self.done}, the checkpoint resumed "
                f"from (steps {missing[0]} to {missing[-1]}): those steps are lost from the log, and the "
                f"resumed run logs from step {self.done + 1} on",
                stacklevel=2,
            )

    def _final_train_s(self) -> float:
        """The time recorded in the final checkpoint when the last step was saved (so that a later no-op
        resume reports the same number), else the time now."""
        step, seconds = self._saved
        return seconds if step == self.done else self.elapsed()

    def _status(self, status: str, **extra) -> None:
        fields = {
            "status": status,
            "step": self.done,
            "steps": self.plan.steps,
            "tokens": self.done * self.plan.tokens_per_step,
            "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }
        write_status(self.out, **{**fields, **extra})

    def _status_is(self, status: str) -> bool:
        try:
            return json.loads((self.out / "status.json").read_text()).get("status") == status
        except (OSError, ValueError, AttributeError):
            return False


def seed_all(seed: int) -> None:
    """The generators a run's initialization draws from, seeded as training seeds them (torch; numpy's and
    Python's legacy global generators, for user code)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002
    random.seed(seed)


def data_identity(shards: TokenShards) -> dict:
    info = shards.meta["splits"][shards.split]
    return {
        "source": shards.meta.get("source"),
        "vocab_size": shards.vocab_size,
        "split": shards.split,
        "n_tokens": shards.n_tokens,
        "shards_sha256": [s.get("sha256") for s in info["shards"]],
    }


def resume_identity(identity: dict) -> dict:
    """What resume compares of an identity: its execution fields aside (also those a checkpoint of an older
    kinterval still holds), and the data by content, not by the ``--source`` string it was prepared from
    (``text:corpus`` and the same folder by its absolute path give the same shards, whose hashes count)."""
    out = {k: v for k, v in identity.items() if k not in EXECUTION_FIELDS}
    if isinstance(out.get("data.identity"), dict):
        out["data.identity"] = {k: v for k, v in out["data.identity"].items() if k != "source"}
    return out


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


def protocol_batch_note(cfg: TrainConfig, plan: Plan) -> str | None:
    """A warning when a shipped protocol runs, at its own context length, with another global batch than its
    own. Tokens per step = micro_batch x accum x world x block_size, so ``--micro-batch 8`` on one process,
    or ``torchrun --nproc_per_node 4`` with the protocol's accumulation, trains 8x (4x) the paper's tokens per
    step and an eighth (a quarter) of its steps unless ``--accum`` is divided to match. A run at another
    context length is another protocol by choice (a suite such as mini): no warning."""
    from kinterval.train.config import shipped_configs

    if f"{cfg.name}.toml" not in shipped_configs():
        return None
    own = TrainConfig.from_toml(cfg.name)
    s = own.schedule
    tokens = s.micro_batch * s.accum * own.block_size
    if plan.block_size != own.block_size or plan.tokens_per_step == tokens:
        return None
    world = plan.seqs_per_step // (cfg.schedule.micro_batch * cfg.schedule.accum)
    fix, per_accum = "", cfg.schedule.micro_batch * plan.block_size * world  # tokens of one unit of accum
    if tokens % per_accum == 0:
        fix = f"; --accum {tokens // per_accum} keeps the protocol's"
    return (
        f"protocol {cfg.name} trains {tokens:,} tokens per step; this run trains {plan.tokens_per_step:,} "
        f"({world} process(es) x accum {cfg.schedule.accum} x micro-batch {cfg.schedule.micro_batch} x "
        f"{plan.block_size} tokens){fix}"
    )


def passes_note(plan: Plan, n_tokens: int, data_dir: str) -> str | None:
    """A note when the planned tokens go over the train split more than once: every later pass repeats each
    training sequence (in a new order), so the run measures a multi-epoch regime, where a held-out NLL also
    reflects how much the model memorized of its train split."""
    passes = data_passes(plan.total_tokens, n_tokens, plan.block_size)
    if passes <= 1:
        return None
    shown = passes_text(passes)
    return (
        f"{plan.total_tokens:,} training tokens are {shown} passes over the train split of {data_dir} "
        f"({n_tokens:,} tokens): passes after the first repeat training sequences, in a new order; one "
        f"pass (each token seen at most once) needs a train split of {plan.total_tokens + 1:,} tokens or more"
    )


# Lower bounds on an unfused attention's memory, in (micro_batch, n_head, T, T) fp32 matrices: peak RSS of
# one CPU training step (closed_form, T = 1024 and 2048, 1 and 4 layers) grows by about 2.7 of them a layer
# (kept for the backward) plus about 8 at once for a baseline and 22 for a K-interval operator (one layer's
# scores, grid, weights and slopes in its forward and backward). With activation checkpointing a layer keeps
# only its input; the kept matrices are those of the one layer being recomputed.
KEPT_PER_LAYER = 2
AT_ONCE = {"baseline": 6, "kinterval": 16}


def check_fits(cfg: TrainConfig, model_cfg, n_tokens: int, device: torch.device) -> None:
    """Refuse, before allocating, a block size the data or the device cannot hold.

    The train split must hold one window of T+1 tokens. Without a fused kernel (backends other than triton)
    the attention materializes (micro_batch, n_head, T, T) fp32 matrices: ``KEPT_PER_LAYER`` a layer for the
    backward (of one layer with activation checkpointing) and ``AT_ONCE`` more while a layer runs, a lower
    bound on the activation memory. PyTorch's
    SDPA keeps none (flash or memory-efficient kernels on CUDA, flash on the CPU).
    """
    T, mb = cfg.block_size, cfg.schedule.micro_batch
    if T + 1 > n_tokens:
        raise ValueError(
            f"model.block_size {T} needs {T + 1} tokens per training window; the train split of "
            f"{cfg.data.dir} has {n_tokens}"
        )
    op = parse_operator(cfg.operator.name)
    if op == SDPA:
        return
    # the attention runs in fp32 (the paper's numerics)
    if resolve_backend(op, device, torch.float32, backend=cfg.operator.backend) == "triton":
        return
    layers_kept = 1 if cfg.activation_checkpointing else model_cfg.n_layer
    matrices = KEPT_PER_LAYER * layers_kept + AT_ONCE["kinterval" if op.is_kinterval else "baseline"]
    need = matrices * mb * model_cfg.n_head * T * T * 4
    have = device_memory(device)
    if have and need > have:
        hint = "" if cfg.activation_checkpointing else ", --activation-checkpointing"
        raise ValueError(
            f"model.block_size {T}: the attention's T x T matrices alone need at least {matrices} x "
            f"micro_batch*n_head*T^2*4 bytes = {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB "
            f"of {device}; lower --block-size or --micro-batch{hint} (or use the triton backend on CUDA)"
        )


def device_memory(device: torch.device) -> int | None:
    """Total memory of a CUDA device, or the machine's physical memory for the CPU (None if unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def rank_offsets(
    sampler: SequenceSampler, step: int, seqs_per_step: int, rank: int, per_rank: int
) -> np.ndarray:
    """Start offsets of rank ``rank``'s share of step ``step`` (0-based): the ``rank``-th contiguous run of
    ``per_rank`` sequences among the step's global sequences ``step*seqs_per_step ..``."""
    return sampler.offsets(step * seqs_per_step + rank * per_rank, per_rank)


def accumulate_gradients(
    model, tokens, offsets, mb, T, numerics, device, vocab_size=None, locate=None
) -> torch.Tensor:
    """Forward/backward the sequences at ``offsets`` in micro-batches of ``mb``; gradients of their mean loss.
    Each micro-batch's ids are checked against ``vocab_size`` on the host (see :func:`load_batch`; ``locate``
    names the file of a bad id).

    Returns that mean loss (detached). The gradient all-reduce of DDP/FSDP2 runs only on the last micro-batch.
    """
    n = len(offsets)
    loss_sum = torch.zeros((), device=device)
    for j in range(0, n, mb):
        x, y = load_batch(tokens, offsets[j : j + mb], T, vocab_size, locate)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with D.grad_sync(model, j + mb >= n):  # DDP's no_sync must hold the backward too
            with autocast(numerics, device):
                _, loss = model(x, y)
            scaled = loss * (len(x) / n)
            # backward outside autocast: the autograd engine takes the autocast state of the caller, so a
            # backward inside it ran the fp32 attention's backward matmuls (dQ, dK, dV, dP) in bf16
            scaled.backward()
        loss_sum += scaled.detach()
    return loss_sum


def clip_gradients(model: torch.nn.Module, grad_clip: float) -> float:
    """Clip the global gradient norm at ``grad_clip`` (0: no clipping); return the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2 returns a DTensor
        norm = norm.full_tensor()
    return norm.item()


def _operator_dict(name: str) -> dict:
    op = parse_operator(name)
    return {"name": "sdpa", "full_name": "sdpa"} if isinstance(op, str) else op.to_dict()
