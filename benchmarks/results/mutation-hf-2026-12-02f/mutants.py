"""Mutation runner of the Hugging Face integration audit (NOTES.md). Run from the repository root with the
worktree's ``src`` first on PYTHONPATH: ``python benchmarks/results/mutation-hf-2026-12-02f/mutants.py [ID ...]``.

Each mutant replaces one exact string (it must occur exactly once) in one product file, runs the selection
(``pytest -x -q -p no:xdist -p no:cacheprovider`` on tests/integrations/test_hf.py and test_hf_export.py, the
three subprocess tests deselected: they exercise the import hint and the README, no mutated line), records
killed / survived and restores the file with ``git checkout``. One pytest process at a time."""

# ruff: noqa: E501

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HF = "src/kinterval/integrations/hf.py"
EX = "src/kinterval/integrations/hf_export.py"
API = "src/kinterval/ops/api.py"

SELECTION = [
    "tests/integrations/test_hf.py",
    "tests/integrations/test_hf_export.py",
    "-k",
    "not fresh_process and not missing_transformers and not broken_transformers",
]

MUTANTS = [
    # grouped-query attention
    (
        "H1",
        HF,
        "key = key.repeat_interleave(n_rep, dim=1)\n        value = value.repeat_interleave(n_rep, dim=1)",
        "key = key.repeat(1, n_rep, 1, 1)\n        value = value.repeat(1, n_rep, 1, 1)",
    ),  # heads tiled, not interleaved
    (
        "H2",
        HF,
        "value = value.repeat_interleave(n_rep, dim=1)",
        "value = value.repeat(1, n_rep, 1, 1)",
    ),  # v only
    # scaling
    (
        "H3",
        HF,
        "causal=causal, mask=mask, scale=scaling, backend",
        "causal=causal, mask=mask, scale=None, backend",
    ),
    ("H4", HF, "scale = q.shape[-1] ** -0.5 if scale is None else scale", "scale = q.shape[-1] ** -0.5"),
    # dropout
    (
        "H5",
        HF,
        "p = dropout if dropout > 0.0 and module.training else 0.0",
        "p = dropout if dropout > 0.0 else 0.0",
    ),
    ("H6", HF, "p = dropout if dropout > 0.0 and module.training else 0.0", "p = 0.0"),
    (
        "H7",
        HF,
        "torch.nn.functional.dropout(P, p=p, training=True) if p else P",
        "P",
    ),  # dropout rate dropped on the explicit path
    # output layout, returned weights
    (
        "H8",
        HF,
        "return out.transpose(1, 2).contiguous(), None",
        "return out.reshape(out.shape[0], out.shape[2], out.shape[1], out.shape[3]).contiguous(), None",
    ),
    ("H9", HF, "return out.transpose(1, 2).contiguous(), P", "return out.transpose(1, 2).contiguous(), None"),
    ("H10", HF, 'return bool(collector) and "attentions" in collector', "return False"),
    ("H11", HF, "if p or _attentions_requested():", "if True:"),  # explicit-P path always, P always returned
    # causal / mask
    ("H12", HF, "elif is_causal and tq > 1:", "elif is_causal and tq > 2:"),
    ("H13", HF, "elif is_causal and tq > 1:", "elif is_causal:"),  # a decoding query cut to the first key
    (
        "H14",
        HF,
        "causal, key, value = True, key[:, :, :tq], value[:, :, :tq]",
        "causal = True",
    ),  # static cache not cut
    (
        "H15",
        HF,
        'is_causal = kwargs.get("is_causal")\n',
        "is_causal = None\n",
    ),  # the is_causal argument ignored
    ("H16", HF, 'getattr(module, "is_causal", True)', 'getattr(module, "is_causal", False)'),
    (
        "H17",
        HF,
        "mask = _to_valid(attention_mask[:, :, :, : key.shape[2]])",
        "mask = _to_valid(attention_mask[:, :, :, : key.shape[2]])\n        causal = bool(is_causal) and tq > 1",
    ),  # causal flag also applied with a mask
    (
        "H18",
        HF,
        "mask = _to_valid(attention_mask[:, :, :, : key.shape[2]])",
        "mask = _to_valid(attention_mask)",
    ),
    (
        "H19",
        API,
        "blocked = mask <= torch.finfo(mask.dtype).min / 2",
        "blocked = mask <= torch.finfo(mask.dtype).min",
    ),
    ("H20", API, "blocked = mask <= torch.finfo(mask.dtype).min / 2", "blocked = mask < 0"),
    # dtypes
    (
        "H21",
        HF,
        "dtype = torch.get_autocast_dtype(device)",
        "dtype = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)",
    ),
    (
        "H22",
        HF,
        "dtype = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)",
        "dtype = query.dtype",
    ),
    (
        "H23",
        HF,
        "with torch.autocast(device_type=q.device.type, enabled=False):",
        "if True:",
    ),  # explicit path under autocast
    ("H24", HF, "wd = working_dtype(q.dtype)", "wd = q.dtype"),
    # mask builder, config operator
    ("H25", HF, "    if config is not None and _own_attention(type(config)):", "    if False:"),
    ("H26", HF, "    if config is not None and _own_attention(type(config)):", "    if True:"),
    (
        "H27",
        HF,
        "own = module != config_class.__module__ and not hasattr(",
        "own = module != config_class.__module__ and hasattr(",
    ),
    (
        "H28",
        HF,
        'if name == PREFIX and getattr(getattr(module, "config", None), "kinterval_operator", None):',
        'if getattr(getattr(module, "config", None), "kinterval_operator", None):',
    ),
    ("H29", HF, "        todo += [sub for sub in subs if isinstance(sub, PretrainedConfig)]", "        pass"),
    (
        "H30",
        HF,
        "    return sdpa_mask(*args, config=config, **kwargs)",
        '    return sdpa_mask(*args, config=config, **{k: v for k, v in kwargs.items() if k != "local_size"})',
    ),  # sliding window lost where sdpa may skip the mask
    (
        "H31",
        HF,
        "P = attention_probs(scores, spec, causal=causal, mask=mask, backend=probs_backend)",
        "P = attention_probs(scores, spec, causal=causal, mask=None, backend=probs_backend)",
    ),  # explicit path unmasked
    ("H32", HF, "return out.to(q.dtype), P", "return out, P"),  # explicit path output left in fp32
    ("H33", HF, "if name == PREFIX and getattr(", "if name != PREFIX and getattr("),
    # export-hf
    (
        "X1",
        EX,
        'out[f"{name}.weight"] = weight.t().contiguous()  # Conv1D: (in, out)',
        'out[f"{name}.weight"] = weight.contiguous() if lin == "attn.c_proj" else weight.t().contiguous()',
    ),
    ("X2", EX, "tie_word_embeddings=True", "tie_word_embeddings=False"),
    ("X3", EX, "n_positions=cfg.block_size", "n_positions=1024"),
    ("X4", EX, "layer_norm_epsilon=1e-5", "layer_norm_epsilon=1e-6"),
    ("X5", EX, 'activation_function="gelu"', 'activation_function="gelu_new"'),
    ("X6", EX, "n_head=cfg.n_head,", "n_head=cfg.n_layer,"),
    ("X7", EX, "n_head=cfg.n_head,", "n_head=1,"),
    ("X8", EX, "weight.new_zeros(weight.shape[0])", "weight.new_zeros(weight.shape[1])"),
    ("X9", EX, 'torch.zeros_like(sd[f"{name}.weight"])', 'torch.ones_like(sd[f"{name}.weight"])'),
    ("X10", EX, 'impl = "sdpa" if model.operator == "sdpa" else hf.PREFIX', "impl = hf.PREFIX"),
    ("X11", EX, 'if set(missing) - {"lm_head.weight"} or unexpected:', "if unexpected:"),
    (
        "X12",
        EX,
        "config.kinterval_operator = model.operator",
        "config.kinterval_operator = hf.DEFAULT_OPERATOR",
    ),
    ("X13", EX, "gpt2_tokenizer(cfg.block_size)", "gpt2_tokenizer(1024)"),
    ("X14", EX, "(out / name).unlink(missing_ok=True)", "pass"),
    ("X15", EX, "config.bos_token_id = config.eos_token_id = EOT", "config.eos_token_id = EOT"),
    ("X16", EX, 'and "kinterval_attn_implementation" in config', ""),
    ("X17", EX, 'cfg.numerics.attention_dtype != "float32"', "False"),
    ("X18", EX, 'step=state.get("step")', "step=None"),
]


def run(ids: list[str]) -> None:
    for mid, path, old, new in MUTANTS:
        if ids and mid not in ids:
            continue
        src = Path(path).read_text()
        assert src.count(old) == 1, (mid, src.count(old))
        Path(path).write_text(src.replace(old, new))
        t0 = time.time()
        try:
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-x",
                    "-q",
                    "-p",
                    "no:xdist",
                    "-p",
                    "no:cacheprovider",
                    *SELECTION,
                ],
                capture_output=True,
                text=True,
            )
        finally:
            subprocess.run(["git", "checkout", "--", path], check=True)
        failed = [ln for ln in res.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        verdict = "killed" if res.returncode else "survived"
        print(f"{mid}\t{verdict}\t{time.time() - t0:.0f}s\t{failed[0] if failed else ''}", flush=True)


if __name__ == "__main__":
    run(sys.argv[1:])
