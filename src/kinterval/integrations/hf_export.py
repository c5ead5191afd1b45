"""``kinterval export-hf``: a training run's checkpoint as a transformers ``GPT2LMHeadModel`` folder.

kinterval's GPT is GPT-2 (pre-LayerNorm blocks, learned positions, exact GELU, tied embeddings), so the
weights map one to one; transformers' GPT-2 keeps its linear layers as ``Conv1D`` (weight transposed).
The attention is the kinterval operator through the plain ``attn_implementation`` ``"kinterval"`` of
:mod:`kinterval.integrations.hf`, which reads the operator from the config (``kinterval_operator``): that name
is registered for every operator, with or without overrides (``"kinterval-<operator>"`` names are registered
only for the baselines and K in ``AUTO_K`` without overrides). The config names it
(``kinterval_attn_implementation``) and the folder's README.md says how to load it. A run over GPT-2's BPE
(50257 ids) also gets GPT-2's tokenizer (built offline from the ranks file kinterval ships) and
``<|endoftext|>`` as its bos/eos token, so ``AutoTokenizer``, lm-eval's ``--model hf``, ``generate`` and the
Hub tooling then work.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import tempfile
from pathlib import Path

import torch

from kinterval.data.tokenizer import EOT, GPT2_VOCAB, gpt2_encoding, resolve_bpe_file
from kinterval.train.checkpoint import check_outside_runs

README = """# {name}

A kinterval training run exported as a transformers GPT-2 (`GPT2LMHeadModel`), step {step}, whose attention
is the K-interval operator `{operator}`. Load it with the kinterval attention registered first:

```python
import kinterval.integrations.hf  # registers "kinterval", which runs config.json's kinterval_operator
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("{name}", attn_implementation="{impl}")  # this folder
```

Without `attn_implementation` transformers loads its default attention (softmax), silently: always pass it.
{tokenizer_note}
"""


def export_hf(run, out, checkpoint="latest") -> Path:
    """Write ``out`` (config.json, model.safetensors, README.md; GPT-2's tokenizer files for a run over
    GPT-2's BPE) from ``run``'s ``checkpoint``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from kinterval.integrations import hf
    from kinterval.train.load import load_run

    check_out(out)
    out = Path(out)
    loaded = load_run(run, checkpoint)
    model, state = loaded.model, loaded.state
    cfg = model.config
    if (
        cfg.numerics.attention_dtype != "float32"
    ):  # the exported attention takes q, k, v as transformers gives
        raise ValueError(
            f"{run}: the run's attention takes q, k, v in {cfg.numerics.attention_dtype} "
            "(numerics.attention_dtype), which a transformers GPT-2 does not record; its logits would differ "
            "from the run's. export-hf takes runs with the paper's fp32 attention inputs"
        )
    if options := cfg.attention_options:  # GPT-2's architecture has none of them
        named = ", ".join(f"{name} = {value!r}" for name, value in options.items())
        raise ValueError(
            f"{run}: the model sets {named}, which a transformers GPT-2 does not have; "
            "export-hf takes GPT-2-shaped runs only"
        )
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
    if bad:  # a diverged run's last checkpoint: an export would only move its NaNs elsewhere
        raise ValueError(f"{run}: the checkpoint's weights are not finite ({', '.join(bad[:3])}); export an "
                         "earlier checkpoint (--checkpoint STEP)")  # fmt: skip
    # the plain "kinterval" name runs config.kinterval_operator: registered for every operator and override
    impl = "sdpa" if model.operator == "sdpa" else hf.PREFIX
    config = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    gpt2_bpe = cfg.vocab_size == GPT2_VOCAB  # every text source of `kinterval data prepare` is GPT-2 BPE
    if gpt2_bpe:  # documents end with <|endoftext|>: generate stops there, as GPT-2's own config says
        config.bos_token_id = config.eos_token_id = EOT
    config.kinterval_operator = model.operator
    config.kinterval_attn_implementation = impl
    hf_model = GPT2LMHeadModel(config).eval()
    missing, unexpected = hf_model.load_state_dict(gpt2_state_dict(model), strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:  # lm_head is tied to wte, nothing else may be left
        raise RuntimeError(f"GPT-2 weight mapping incomplete: missing {missing}, unexpected {unexpected}")
    # Written whole into a hidden folder beside ``out``, then put in its place: a re-export cut short (a
    # kill, a full disk) leaves the earlier export as it was, never its config beside the other weights
    stage, old = out.parent / f".{out.name}.export-tmp", out.parent / f".{out.name}.export-old"
    for leftover in (stage, old):  # of an export killed before
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        _write_export(hf_model, stage, out.name, state, model.operator, impl, gpt2_bpe, cfg)
        if out.exists():
            out.rename(old)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old.exists() and not out.exists():  # cut between the two renames: the earlier export back
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out


def _write_export(hf_model, folder: Path, name: str, state: dict, operator: str, impl: str, gpt2_bpe, cfg):
    """The export's files in ``folder``; its README names the folder as ``name``."""
    hf_model.save_pretrained(folder)
    if gpt2_bpe:
        gpt2_tokenizer(cfg.block_size).save_pretrained(folder)
    tokenizer_note = (
        "The tokenizer is GPT-2's BPE (tiktoken's `gpt2`, 50257 tokens), saved in this folder: "
        f'`AutoTokenizer.from_pretrained("{name}")`.'
        if gpt2_bpe
        else f"The vocabulary has {cfg.vocab_size} token ids, not GPT-2's 50257: the run was trained on "
        "token ids that are not GPT-2 BPE text (e.g. the synthetic corpus), so no text tokenizer goes with "
        "it; feed it ids from the same source."
    )
    (folder / "README.md").write_text(
        README.format(
            name=name,
            step=state.get("step"),
            operator=operator,
            impl=impl,
            tokenizer_note=tokenizer_note,
        )  # fmt: skip
    )


def gpt2_tokenizer(max_length: int):
    """GPT-2's BPE as a transformers fast tokenizer, built offline from the ranks file (the ids of
    ``kinterval.data.tokenizer.gpt2_encoding``: ``<|endoftext|>`` = 50256 is bos, eos and unk, as GPT-2's)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    enc = gpt2_encoding()  # checks the ranks file's sha256
    with tempfile.TemporaryDirectory() as tmp:
        ranks = resolve_bpe_file()
        if ranks is None:  # tiktoken's registry copy: the converter reads a ranks file
            ranks = Path(tmp) / "gpt2.tiktoken"
            ranks.write_text(
                "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in enc._mergeable_ranks.items())
            )
        backend = TikTokenConverter(
            vocab_file=str(ranks), pattern=enc._pat_str, extra_special_tokens=enc._special_tokens
        ).converted()
    eot = enc.decode([EOT])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=eot, eos_token=eot, unk_token=eot, model_max_length=max_length
    )


def check_out(out) -> None:
    """``ValueError`` (before anything is written) unless export-hf may write the folder ``out``.

    Refused: ``out`` (symlinks and ``..`` resolved) or any folder above it is a kinterval checkpoint (holds
    ``state.json``) or training run (holds ``run_config.json``, ``status.json``, ``checkpoints/LATEST`` or a
    ``checkpoints/step_*`` folder), whose files the export would overwrite or mix with; and an existing
    ``out`` that is not an empty folder or an earlier export-hf folder (whose config.json has
    ``kinterval_attn_implementation``), which would be overwritten in part.
    """
    path = Path(out).resolve()
    check_outside_runs(out, "export-hf would overwrite or mix with the run's files")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not _is_export(path):
        raise ValueError(
            f"--out {out} is a non-empty folder that is not an earlier export-hf output (no config.json with "
            "kinterval_attn_implementation): give a new or empty folder"
        )


def _is_export(folder: Path) -> bool:
    """Whether ``folder`` holds the config.json of an earlier export-hf (a GPT-2 naming its attention)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return (
        isinstance(config, dict)
        and config.get("architectures") == ["GPT2LMHeadModel"]
        and "kinterval_attn_implementation" in config
    )


def gpt2_state_dict(model) -> dict[str, torch.Tensor]:
    """kinterval GPT weights under transformers' GPT-2 names (Conv1D weights transposed, padding cut)."""
    cfg, sd = model.config, model.state_dict()
    out = {
        "transformer.wte.weight": sd["transformer.wte.weight"][: cfg.vocab_size],
        "transformer.wpe.weight": sd["transformer.wpe.weight"],
    }
    names = [f"transformer.h.{i}.{m}" for i in range(cfg.n_layer) for m in ("ln_1", "ln_2")] + [
        "transformer.ln_f"
    ]
    for name in names:
        out[f"{name}.weight"] = sd[f"{name}.weight"]
        out[f"{name}.bias"] = sd.get(f"{name}.bias", torch.zeros_like(sd[f"{name}.weight"]))
    for i in range(cfg.n_layer):
        for lin in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            name = f"transformer.h.{i}.{lin}"
            weight = sd[f"{name}.weight"]
            out[f"{name}.weight"] = weight.t().contiguous()  # Conv1D: (in, out)
            out[f"{name}.bias"] = sd.get(f"{name}.bias", weight.new_zeros(weight.shape[0]))
    return {k: v.detach().clone() for k, v in out.items()}


def _export(args: argparse.Namespace) -> int:
    try:
        import kinterval.integrations.hf  # noqa: F401  (imports transformers)
    except ImportError as err:  # its message names the cause of a broken install
        raise ValueError(str(err)) from None
    out = export_hf(args.run, args.out, args.checkpoint)
    print(f"exported {args.run} -> {out} (see {out / 'README.md'} to load it)")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("export-hf", help="write a run's checkpoint as a transformers GPT-2 model")
    p.add_argument("--run", required=True, help="training run folder (or a checkpoint folder)")
    p.add_argument("--checkpoint", default="latest", help="latest (default), a step number or a path")
    p.add_argument(
        "--out", required=True, help="output folder (config.json, model.safetensors, README.md, tokenizer)"
    )
    p.set_defaults(func=_export)
