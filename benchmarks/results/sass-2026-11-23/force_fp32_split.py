"""kernel_resources.py with the interior-tile split allowed for fp32 inputs too (section 9 of NOTES.md).

Run from the repository root: python benchmarks/results/sass-2026-11-23/force_fp32_split.py --dtypes tf32 ...
"""

import runpy
import sys

from kinterval.ops.triton import autograd as A
from kinterval.ops.triton import kernels as K


def split_any_dtype(kind, element_size, block_d, has_mask):
    return (not has_mask) and block_d <= K.SPLIT_MAX_D["fwd" if kind == "fwd" else "bwd"]


K.split_loops = A.split_loops = split_any_dtype
sys.argv = ["kernel_resources.py", *sys.argv[1:]]
runpy.run_path("benchmarks/kernel_resources.py", run_name="__main__")
