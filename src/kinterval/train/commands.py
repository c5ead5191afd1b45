"""CLI: ``kinterval train`` (the demo, which composes training and reporting, lives in kinterval.demo)."""

from __future__ import annotations

import argparse
import os
import sys

from kinterval.environment import check_threads_bound
from kinterval.train.config import PRESETS, TrainConfig, flatten, shipped_configs

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - python 3.10
    import tomli as tomllib

# flag dest -> config field
FLAG_FIELDS = {
    "data": "data.dir",
    "model": "model.preset",
    "operator": "operator.name",
    "backend": "operator.backend",
    "tokens": "schedule.tokens",
    "seed": "seed",
    "device": "device",
    "micro_batch": "schedule.micro_batch",
    "accum": "schedule.accum",
    "block_size": "model.block_size",
    "lr": "optim.lr",
    "warmup_tokens": "schedule.warmup_tokens",
    "min_lr_ratio": "schedule.min_lr_ratio",
    "weight_decay": "optim.weight_decay",
    "grad_clip": "optim.grad_clip",
    "checkpoints": "checkpoint.count",
    "save_every": "checkpoint.save_every",
    "strategy": "dist.strategy",
    "log_every": "log.every",
    "eval_every": "log.eval_every",
    "autocast": "numerics.autocast_dtype",
}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="pretrain a GPT with a chosen attention operator",
        description="Train (or --resume) a run; flags override the --config TOML (its values: the defaults).",
    )
    p.add_argument("--config", help=f"TOML file or shipped name ({', '.join(shipped_configs())})")
    p.add_argument("--out", required=True, help="run folder (metrics.jsonl, status.json, checkpoints/)")
    p.add_argument("--data", help="prepared dataset folder")
    p.add_argument("--model", help="preset: gpt2-124m, gpt2-1b, small, tiny")
    p.add_argument(
        "--operator", help="softmax, sdpa, lerp-k4, fwm-prob-k4, ... (full names with [overrides] ok)"
    )
    p.add_argument("--backend", help="auto | reference | closed_form | triton")
    p.add_argument("--tokens", type=int, help="token budget (rounded up to whole steps)")
    p.add_argument("--seed", type=int, help="seed of the weights and the data order (config: seed)")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N (config: device)")
    p.add_argument("--micro-batch", type=int, help="sequences per forward pass")
    p.add_argument("--accum", type=int, help="micro-batches per step per process")
    p.add_argument("--block-size", type=int, help="sequence length T")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--warmup-tokens", type=int, help="linear warmup (config: schedule.warmup_tokens)")
    p.add_argument("--min-lr-ratio", type=float, help="final / peak lr of the cosine decay")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay")
    p.add_argument("--grad-clip", type=float, help="gradient-norm clip (0: off)")
    p.add_argument("--checkpoints", type=int, help="number of evenly spaced checkpoints")
    p.add_argument("--save-every", type=int, help="extra checkpoint every N steps")
    p.add_argument("--strategy", choices=("ddp", "fsdp2"), help="multi-process strategy under torchrun")
    p.add_argument("--log-every", type=int, help="a metrics.jsonl row every N steps")
    p.add_argument(
        "--eval-every",
        type=int,
        help="log validation loss and row span every N steps (log.eval_blocks blocks; 0: off)",
    )
    p.add_argument(
        "--autocast",
        choices=("bfloat16", "none"),
        help="autocast dtype outside attention (float16 is refused: no loss scaling)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="torch.compile each block (the K-interval operator stays eager); config field `compile`",
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=None,
        help="recompute each block in the backward (less activation memory, the same result)",
    )
    p.add_argument("--tensorboard", action="store_true", default=None, help="also write TensorBoard events")
    p.add_argument(
        "--quiet", "--no-progress", dest="no_progress", action="store_true", help="no tqdm progress bar"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any config field, e.g. --set optim.beta2=0.99 (TOML value syntax)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the run folder's newest checkpoint")
    p.add_argument(
        "--threads", type=int, help="torch CPU threads of this process (1 is much faster for tiny CPU models)"
    )
    p.add_argument("--kill-after-step", type=int, help=argparse.SUPPRESS)  # test hook: hard exit, no cleanup
    p.set_defaults(func=cmd_train)


# The model fields a preset fixes: --model replaces a config file's values of these with the preset's
# (flags such as --block-size and --set still apply after it)
PRESET_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_multiple")


def config_from_args(args) -> TrainConfig:
    cfg = TrainConfig.from_toml(args.config) if args.config else TrainConfig()
    if args.model is not None:
        if args.model not in PRESETS:  # before the note below, which would name it as a preset
            raise ValueError(f"--model must be one of {sorted(PRESETS)}, got {args.model!r}")
        dropped = {f: getattr(cfg.model, f) for f in PRESET_FIELDS if getattr(cfg.model, f) is not None}
        if dropped:
            d = cfg.to_dict()
            d["model"].update(dict.fromkeys(dropped))  # None: the preset's value
            cfg = TrainConfig.from_dict(d)
            fields = ", ".join(f"model.{f}={v}" for f, v in dropped.items())
            if os.environ.get("RANK", "0") == "0":
                print(
                    f"kinterval train: --model {args.model} takes the preset's shape, not the config's",
                    fields,
                )
    overrides = {field: getattr(args, dest) for dest, field in FLAG_FIELDS.items()}
    flags = {field: f"--{dest.replace('_', '-')} {overrides[field]}" for dest, field in FLAG_FIELDS.items()}
    for flag, field, value in (("--tensorboard", "log.tensorboard", True), ("--compile", "compile", True),
                               ("--activation-checkpointing", "activation_checkpointing", True),
                               ("--no-progress", "log.progress", False)):  # fmt: skip
        if getattr(args, flag[2:].replace("-", "_")):
            overrides[field], flags[field] = value, flag
    return cfg.override(with_sets(overrides, flags, args.set)).validate()


def with_sets(overrides: dict, flags: dict, sets: list[str]) -> dict:
    """``overrides`` {field: a flag's value or None} with the ``--set`` items added; a flag and a --set that
    give one field two values are a ValueError naming both (``flags`` {field: the flag as given})."""
    out = dict(overrides)
    for field, value in flatten(parse_sets(sets)).items():
        if out.get(field) is not None and out[field] != value:
            raise ValueError(
                f"{flags[field]} and --set {field}={value!r} set one field to two values; give one"
            )
        out[field] = value
    return out


def parse_sets(items: list[str]) -> dict:
    """``--set FIELD=VALUE`` items as ``{field: value}`` (TOML value syntax; a bare word is a string)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value  # bare strings
    return out


def set_threads(threads: int | None) -> None:
    """``--threads N`` of train and the evaluation commands: torch's CPU threads for this process (tiny CPU
    models run fastest on 1); None keeps torch's default."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be an integer >= 1, got {threads}")
        check_threads_bound(threads)
        import torch

        torch.set_num_threads(threads)


def _warn_auto_on_cpu(cfg: TrainConfig, large: int = 20_000_000) -> None:
    """Device ``auto`` without CUDA trains on the CPU: said once for a model of ``large`` parameters or more
    (the shipped GPU protocols' 124M and 1B would take days there; ``--device cpu`` says it is meant)."""
    import torch

    from kinterval.model.config import count_params

    if cfg.device != "auto" or torch.cuda.is_available() or os.environ.get("RANK", "0") != "0":
        return
    n = count_params(cfg.model_config(50257))  # GPT-2 BPE: the data, not read yet, may have fewer ids
    if n >= large:
        print(
            f"kinterval train: warning: no CUDA device here; device 'auto' trains this {n / 1e6:.0f}M-"
            "parameter model on the CPU (the shipped GPU protocols take days there): pass --device cpu to "
            "mean it",
            file=sys.stderr,
        )


def cmd_train(args) -> int:
    from kinterval.train.loop import train

    cfg = config_from_args(args)
    set_threads(args.threads)
    _warn_auto_on_cpu(cfg)
    hook = None
    if args.kill_after_step is not None:

        def hook(step, model):
            if step >= args.kill_after_step:
                os._exit(137)  # like SIGKILL: no cleanup, no final status

    result = train(cfg, args.out, resume=args.resume, on_step=hook)
    if result.status == "completed" and os.environ.get("RANK", "0") == "0":
        loss = "n/a" if result.last_loss is None else f"{result.last_loss:.4f}"
        what = "already complete, nothing to do" if result.resumed_finished else "done"
        print(
            f"kinterval train: {what}, {result.steps} steps, {result.tokens:,} tokens, last loss {loss}; "
            f"checkpoint {result.last_checkpoint}"
        )
    return result.exit_code
