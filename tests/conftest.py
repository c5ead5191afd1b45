"""Session-wide test settings, loaded by pytest before any test module is imported."""

import os

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
    import transformers  # noqa: F401
    import triton  # noqa: F401

    _shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tokenizers", "gpt2.tiktoken")
    if not os.path.isfile(_shared):
        raise RuntimeError(f"CI needs ../shared beside the clone ({_shared} is missing)")
