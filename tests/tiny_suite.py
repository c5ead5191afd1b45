"""The tiny CPU suite that the gate, relocation and report tests train for real (1 layer, d = 32, T = 32,
closed-form backend, a synthetic corpus): the suite file's text, with the caller's groups."""

from __future__ import annotations


def tiny_suite(groups: str, *, name: str = "tiny", tokens: int = 4_096, geometry: bool = True) -> str:
    """A suite file: ``groups`` are its ``[[group]]`` tables; ``tokens`` per run, 2 checkpoints, seed 7;
    ``geometry``: probe each checkpoint's geometry (2 blocks)."""
    probe = "geometry = true\ngeometry_blocks = 2\n" if geometry else ""
    return f"""name = "{name}"
protocol = "tiny-cpu"
corpus = "synthetic"
seeds = [7]
checkpoints = 2
[overrides]
"model.n_layer" = 1
"model.n_head" = 2
"model.n_embd" = 32
"model.block_size" = 32
"schedule.tokens" = {tokens}
"schedule.warmup_tokens" = 512
"schedule.micro_batch" = 8
"operator.backend" = "closed_form"
[data]
source = "synthetic"
tokens = 20_000
[eval]
split = "val"
{probe}{groups.strip()}
"""
