"""AdamW with the paper's settings and an explicit, recorded weight-decay policy.

Policy ``nanogpt`` (default, as nanoGPT and the paper's training code lineage): every parameter with >= 2
dimensions decays, i.e. all Linear weights and the (tied) token and the position embeddings; biases and
LayerNorm parameters do not. Policy ``matrices`` also exempts the embeddings.
"""

from __future__ import annotations

import torch

EMBEDDINGS = ("transformer.wte.weight", "transformer.wpe.weight")


def param_groups(model: torch.nn.Module, weight_decay: float, policy: str) -> tuple[list[dict], list[str]]:
    """The two AdamW groups and the names of the decayed parameters (tied weights appear once)."""
    decay, no_decay, names = [], [], []
    for name, p in model.named_parameters():  # named_parameters() skips the tied duplicate
        if not p.requires_grad:
            continue
        name = name.removeprefix("module.")  # DDP wrapper
        is_embedding = name in EMBEDDINGS
        if p.dim() >= 2 and not (policy == "matrices" and is_embedding):
            decay.append(p)
            names.append(name)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return groups, names


def build_optimizer(
    model: torch.nn.Module, optim_cfg, device: torch.device
) -> tuple[torch.optim.AdamW, list[str]]:
    groups, decayed = param_groups(model, optim_cfg.weight_decay, optim_cfg.decay)
    fused = optim_cfg.fused if optim_cfg.fused is not None else device.type == "cuda"
    opt = torch.optim.AdamW(
        groups, lr=optim_cfg.lr, betas=(optim_cfg.beta1, optim_cfg.beta2), eps=optim_cfg.eps, fused=fused
    )
    return opt, decayed
