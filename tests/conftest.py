"""Session-wide test settings, loaded by pytest before any test module is imported."""

import os

import torch

# Without CUDA, the Triton kernels run in Triton's CPU interpreter. This must be set before any module creates
# its @triton.jit functions, and other test modules may import libraries that import triton during collection.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
