"""Machine-code signature of the dK/dV and fused backward kernels, to compare two versions of kernels.py.

For each (kernel, operator, dtype, D, causal or mask) at the default tile: the SASS hash, registers, the
instruction count, the longest loop, and the multiset of floating-point, tensor-core and MUFU opcodes of
the whole kernel (the math it does). Compiles for sm_90a without a GPU (benchmarks/kernel_resources.py).

    PYTHONPATH=OLD/src python fpsig.py old.json bf16,tf32,ieee
    PYTHONPATH=NEW/src python fpsig.py new.json bf16,tf32,ieee
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import kernel_resources as KR  # noqa: E402
from kinterval.ops import OperatorSpec  # noqa: E402
from kinterval.ops.triton import kernels as K  # noqa: E402

OPS = [
    "softmax", "fwm-prob-k4", "minmax-weight-k4", "minmax-prob-k4", "lerp-k4", "fwm-weight-k4", "bf16-exp",
    "fp8-exp", "minmax-weight-k4[arithmetic=historical]", "minmax-prob-k4[arithmetic=historical]",
    "lerp-k4[range_grad=detach]", "lerp-k4[range_grad=max_only]", "resolved-weight-k4",
    "lerp-k4[range_grad=min_only]",
]  # fmt: skip
FP = re.compile(r"^(F[A-Z0-9]*|H[A-Z0-9]*|MUFU|DADD|DMUL|DFMA|I2F|F2I|F2F)$")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def signature(kernel, op, dtype, D, causal):
    cfg = K.candidate_configs(kernel, tiles="fma" if dtype == "ieee" else "mma")[0]
    r = KR.compile_one(kernel, OperatorSpec.from_full_name(op), dtype, D, cfg, "sm_90a", causal, not causal)
    fp, n = Counter(), 0
    for line in r["text"].splitlines():
        if m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            n += 1
            opcode = PREDICATE.sub("", m.group(1)).split()[0]  # with its modifiers, e.g. FSETP.GE.AND
            if FP.match(opcode.split(".")[0]):
                fp[opcode] += 1
    return dict(sass=r["sass"], regs=r["regs"], n=n, loop=r["loop"], fp=dict(fp))


def main(out, dtypes):
    sig = {}
    for dtype in dtypes.split(","):
        for D in (64, 128):
            for op in OPS:
                for kernel in ("dkdv", "fused"):
                    for causal in (True, False):
                        key = f"{kernel}/{op}/{dtype}/{D}/{'causal' if causal else 'mask'}"
                        sig[key] = signature(kernel, op, dtype, D, causal)
                        print(key, sig[key]["sass"], file=sys.stderr, flush=True)
    Path(out).write_text(json.dumps(sig, indent=0))


if __name__ == "__main__":
    main(*sys.argv[1:3])
