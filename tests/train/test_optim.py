"""AdamW as the paper and docs/training.md specify it: the hyperparameters of every group and, parameter by
parameter, which weights decay under each policy."""

import pytest
import torch

from kinterval.model import GPT, ModelConfig
from kinterval.train.config import OptimSection
from kinterval.train.optim import build_optimizer


def expected_decay(name: str, policy: str) -> bool:
    """docs/training.md: "nanogpt" decays every parameter with >= 2 dimensions (Linear weights, the tied token
    embedding, the position embedding), never biases or LayerNorm parameters; "matrices" also exempts the two
    embeddings."""
    if name.endswith(".bias") or ".ln_" in name:  # LayerNorms: h.*.ln_1, h.*.ln_2, ln_f
        return False
    return not (policy == "matrices" and name in ("transformer.wte.weight", "transformer.wpe.weight"))


@pytest.mark.parametrize("policy", ["nanogpt", "matrices"])
def test_every_parameter_gets_the_policy_weight_decay_and_the_paper_hyperparameters(policy):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    cfg = OptimSection(lr=3e-4, weight_decay=0.1, decay=policy)
    opt, decayed = build_optimizer(model, cfg, torch.device("cpu"))
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())  # the tied lm_head.weight appears once, as transformer.wte.weight
    assert len(group_of) == len(names)  # every parameter is optimized, once
    for name, p in names.items():
        g = group_of[id(p)]
        want = expected_decay(name, policy)
        assert g["weight_decay"] == (0.1 if want else 0.0), name
        assert (name in decayed) == want, name
        assert g["betas"] == (0.9, 0.95) and g["eps"] == 1e-8 and g["lr"] == 3e-4, name
    assert isinstance(opt, torch.optim.AdamW)
    # Both policies leave biases and LayerNorm parameters alone and decay the block matrices.
    assert "transformer.h.0.attn.c_attn.weight" in decayed and "transformer.h.0.ln_1.weight" not in decayed
    assert ("transformer.wpe.weight" in decayed) == (policy == "nanogpt")


def test_a_ddp_wrapper_gets_the_same_groups_and_names():
    """Under DDP the parameters are named ``module.<name>``: the policy and the recorded decayed names must be
    those of the bare model (the "matrices" policy used to decay a wrapped model's embeddings)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))

    class Wrapper(torch.nn.Module):  # DistributedDataParallel's naming, without a process group
        def __init__(self, module):
            super().__init__()
            self.module = module

    cfg = OptimSection(weight_decay=0.1, decay="matrices")
    opt, decayed = build_optimizer(Wrapper(model), cfg, torch.device("cpu"))
    assert "transformer.h.0.attn.c_attn.weight" in decayed
    assert not any(n.startswith("module.") for n in decayed)
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay_of[id(model.transformer.wte.weight)] == decay_of[id(model.transformer.wpe.weight)] == 0.0


def test_the_configured_hyperparameters_reach_every_group():
    """Every optim setting is used, not only the paper's values (which are torch's defaults for eps): a run
    with other betas, eps, weight decay and learning rate gets them in both groups (decay 0 in the other)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    cfg = OptimSection(lr=1e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05)
    opt, _ = build_optimizer(model, cfg, torch.device("cpu"))
    assert [(g["lr"], g["betas"], g["eps"], g["weight_decay"]) for g in opt.param_groups] == [
        (1e-3, (0.8, 0.99), 1e-6, 0.05),
        (1e-3, (0.8, 0.99), 1e-6, 0.0),
    ]
