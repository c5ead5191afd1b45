"""The token budget of a run: steps, checkpoint steps and the learning-rate schedule.

Step ``s`` (0-based) consumes global sequences ``s*S .. s*S+S-1`` with
``S = micro_batch * accum * world_size``;
after it ``(s+1) * S * T`` tokens have been seen. The learning rate of step ``s`` is a function of that count:
linear warmup to the peak over ``warmup_tokens``, then cosine decay reaching ``min_lr_ratio * peak`` exactly
at the final step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    seqs_per_step: int  # S, global sequences per optimizer step
    block_size: int  # T
    steps: int
    peak_lr: float
    warmup_tokens: int
    min_lr_ratio: float
    checkpoint_steps: tuple[int, ...]  # 1-based step counts after which a checkpoint is written

    @property
    def tokens_per_step(self) -> int:
        return self.seqs_per_step * self.block_size

    @property
    def total_tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def tokens_after(self, step: int) -> int:
        return (step + 1) * self.tokens_per_step

    def lr(self, step: int) -> float:
        return lr_at(
            self.tokens_after(step), self.total_tokens, self.peak_lr, self.warmup_tokens, self.min_lr_ratio
        )


def lr_at(tokens: int, total_tokens: int, peak: float, warmup_tokens: int, min_ratio: float) -> float:
    """Learning rate once ``tokens`` tokens have been consumed (counting the current step)."""
    if warmup_tokens > 0 and tokens < warmup_tokens:
        return peak * tokens / warmup_tokens
    floor = min_ratio * peak
    span = total_tokens - warmup_tokens
    progress = 1.0 if span <= 0 else min(1.0, max(0.0, (tokens - warmup_tokens) / span))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def checkpoint_steps(steps: int, count: int, save_every: int = 0) -> tuple[int, ...]:
    """``count`` evenly spaced step counts ending at ``steps`` (5/10/20 in the paper), plus multiples
    of ``save_every``, plus ``steps`` itself always: a completed run has its final weights (evaluation
    loads them; a resume of a finished run finds it complete).

    The i-th is ``i * steps / count`` rounded half up, in integers: suite A's fifth of twenty (step 4768.5
    of 19,074) is step 4769, 625.1M tokens, the checkpoint the paper resumed from (App. C.1)."""
    if count >= steps:  # marks closer than a step apart: every step (without looping over all count)
        marks = set(range(1, steps + 1))
    else:
        marks = {(2 * i * steps + count) // (2 * count) for i in range(1, count + 1)} if count else set()
    marks.add(steps)
    if save_every:
        marks |= set(range(save_every, steps + 1, save_every))
    return tuple(sorted(m for m in marks if m >= 1))


def check_step_within_budget(cfg, plan: Plan, world_size: int) -> None:
    """A run whose one optimizer step holds more tokens than its budget would train that one whole step
    (the steps are rounded up): refused, naming the factors."""
    s = cfg.schedule
    if plan.tokens_per_step > s.tokens:
        raise ValueError(
            f"one optimizer step trains {plan.tokens_per_step:,} tokens ({world_size} process(es) x accum "
            f"{s.accum} x micro-batch {s.micro_batch} x {plan.block_size} tokens), more than the run's "
            f"{s.tokens:,}: lower --accum or --micro-batch, or raise --tokens"
        )


def make_plan(cfg, world_size: int) -> Plan:
    s = cfg.schedule
    seqs = s.micro_batch * s.accum * world_size
    T = cfg.block_size
    steps = -(-s.tokens // (seqs * T))
    return Plan(
        seqs_per_step=seqs,
        block_size=T,
        steps=steps,
        peak_lr=cfg.optim.lr,
        warmup_tokens=s.warmup_tokens,
        min_lr_ratio=s.min_lr_ratio,
        checkpoint_steps=checkpoint_steps(steps, cfg.checkpoint.count, cfg.checkpoint.save_every),
    )
