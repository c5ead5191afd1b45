import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Tiny models run fastest on one thread, and a busy CI machine makes OpenMP spin-waiting very slow."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # for subprocesses
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
