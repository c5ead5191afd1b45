import pytest
import torch

from kinterval.train.config import TrainConfig


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Tiny models run fastest on one thread, and a busy CI machine makes OpenMP spin-waiting very slow."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # for subprocesses
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A small synthetic corpus (vocab 512) prepared by the data layer."""
    from kinterval.data.prepare import prepare

    out = tmp_path_factory.mktemp("data") / "synthetic"
    prepare("synthetic", out, tokens=60_000, seed=0, progress=False)
    return out


@pytest.fixture
def make_config(data_dir):
    return lambda **overrides: tiny_config(data_dir, **overrides)


@pytest.fixture(scope="session")
def shared_config(data_dir):
    """``make_config`` for module- and session-scoped fixtures."""
    return lambda **overrides: tiny_config(data_dir, **overrides)


def tiny_config(data_dir, **overrides) -> TrainConfig:
    """A 2-layer d=32 model on T=32 sequences: a few ms per step on CPU."""
    base = {
        "data.dir": str(data_dir),
        "device": "cpu",
        "model.preset": "tiny",
        "model.n_embd": 32,
        "model.block_size": 32,
        "schedule.tokens": 32 * 8 * 8,
        "schedule.warmup_tokens": 512,
        "schedule.micro_batch": 4,
        "schedule.accum": 2,
        "optim.lr": 3e-3,
        "checkpoint.count": 4,
        "log.progress": False,
    }
    base.update(overrides)
    return TrainConfig().override(base)
