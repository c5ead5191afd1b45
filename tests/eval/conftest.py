"""Fixtures shared by the evaluation tests."""

import pytest


@pytest.fixture
def softmax_run(tmp_path):
    """``make(vocab_size, block_size=32, n_head=2)``: a one-checkpoint softmax run at ``tmp_path / "run"``
    (random weights, seed 0) whose state.json records the operator but no data folder; its ModelConfig."""
    import torch

    from kinterval.model import GPT, ModelConfig
    from kinterval.train.checkpoint import save_checkpoint

    def make(vocab_size, block_size=32, n_head=2):
        torch.manual_seed(0)
        cfg = ModelConfig(n_layer=1, n_head=n_head, n_embd=16, block_size=block_size, vocab_size=vocab_size)
        state = {"step": 1, "config": {"operator": {"name": "softmax", "backend": "closed_form"}},
                 "model_config": cfg.to_dict()}  # fmt: skip
        save_checkpoint(tmp_path / "run", 1, GPT(cfg, "softmax", "closed_form").state_dict(), {}, state)
        return cfg

    return make
