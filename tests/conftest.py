"""Session-wide test settings, loaded by pytest before any test module is imported."""

import os
import subprocess
import sys

import pytest
import torch

# Without CUDA, the Triton kernels run in Triton's CPU interpreter. This must be set before any module creates
# its @triton.jit functions, and other test modules may import libraries that import triton during collection.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # on a GPU the tests run each kernel's default config (autotuning compiles every candidate per
    # operator: minutes); test_gpu_every_autotune_candidate runs the others
    os.environ.setdefault("KINTERVAL_TRITON_AUTOTUNE", "0")

# Under pytest-xdist (-n N) each worker gets its share of the cores for torch's intra-op threads: N workers
# of all the cores each would crowd the machine (tests that need a thread count set their own).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))

# In CI the dev extras and ../shared are part of the setup: their absence must fail, not skip tests.
if os.environ.get("CI"):
    import datasets  # noqa: F401
    import lm_eval  # noqa: F401
    import tensorboard  # noqa: F401
    import transformers  # noqa: F401
    import triton  # noqa: F401

    from kinterval.ops.backends import triton_problem

    if triton_problem() is not None:  # the kernel tests would skip (tests/triton_gate.py)
        raise RuntimeError(f"CI needs a triton the fused kernels run on: {triton_problem()}")

    _shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tokenizers", "gpt2.tiktoken")
    if not os.path.isfile(_shared):
        raise RuntimeError(f"CI needs ../shared beside the clone ({_shared} is missing)")


def pytest_collection_modifyitems(config, items):
    """KINTERVAL_TEST_SHARD="i/n" keeps every n-th collected test from the i-th (1-based): one share of a
    test file too long for one command on a lent GPU (benchmarks/gpu_session.sh's tests-1, tests-2)."""
    shard = os.environ.get("KINTERVAL_TEST_SHARD")
    if not shard:
        return
    try:
        i, n = (int(x) for x in shard.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"KINTERVAL_TEST_SHARD must be i/n with 1 <= i <= n, got {shard!r}") from None
    keep = items[i - 1 :: n]
    kept = set(keep)
    config.hook.pytest_deselected(items=[x for x in items if x not in kept])
    items[:] = keep


# A tiny training setup, for the tests of any folder (kinterval is imported inside: the settings above first)
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


def tiny_config(data_dir, **overrides):
    """A 2-layer d=32 model on T=32 sequences (a ``TrainConfig``): a few ms per step on CPU."""
    from kinterval.train.config import TrainConfig

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


@pytest.fixture
def import_with_broken(tmp_path):
    """``import_with_broken(package, error, module)``: import ``module`` in a fresh interpreter where
    ``package`` is installed but its import raises ``ImportError(error)``; the finished process."""

    def run(package: str, error: str, module: str) -> subprocess.CompletedProcess:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise ImportError({error!r})\n")
        code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nimport {module}"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    return run


@pytest.fixture
def triton_installed(monkeypatch):
    """The backend dispatcher answers as where a triton the kernels run on is installed, whether or not it is
    here (a CPU-only macOS install has none: the dev extra asks for it on Linux only; torch 2.6 to 2.9 bring
    one too old)."""
    from kinterval.ops import backends

    monkeypatch.setattr(backends, "triton_problem", lambda: None)
