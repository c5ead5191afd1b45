"""The fused kernels compile for sm_90a on a machine without a GPU (Triton's compiler and ptxas, through
``benchmarks/kernel_resources.py``): errors that only the compiler sees (the interpreter runs the kernels as
Python) show up here, in CI. Every kernel, the switches of several operators, every dot precision."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from triton_gate import needs_kernels, skip_without_kernels

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks" / "kernel_resources.py"
OPS = "softmax,minmax-prob-k4[arithmetic=historical],fwm-weight-k4[range_grad=p1],resolved-prob-k4"


def _tool():
    spec = importlib.util.spec_from_file_location("kernel_resources", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ptxas() -> bool:
    """Whether the ptxas that Triton runs for sm_90 is there (Triton 3.9: ptxas-blackwell)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return Path(_tool().nvidia_tool("ptxas", 90)).is_file()


@pytest.mark.skipif(not _ptxas(), reason="needs triton with the ptxas it runs for sm_90 (Linux)")
@pytest.mark.parametrize(
    ("ops", "dtypes", "masks", "gqa", "sinks"),
    [
        (OPS, "bf16", "causal", 1, False),
        ("minmax-weight-k4", "bf16", "mask", 1, False),
        ("lerp-k32[range_grad=detach]", "tf32,ieee,tf32x3,bf16x6", "causal", 1, False),
        ("minmax-prob-k4", "bf16", "causal", 4, False),  # grouped-query attention: k/v head h // 4
        ("softmax,fwm-prob-k4[range_grad=p1]", "bf16", "causal", 1, True),  # attention sinks: no fused kernel
        ("softmax,minmax-weight-k4", "bf16", "causal", 1, "softcap"),  # a softcap (every kernel)
        # a score bias with its gradient, with a softcap and sinks (every kernel but the fused backward)
        ("softmax,minmax-weight-k4,fwm-prob-k4[range_grad=p1]", "bf16", "mask", 1, "bias"),
    ],
)
def test_kernels_compile_for_sm90(ops, dtypes, masks, gqa, sinks):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        str(TOOL),
        "--ops",
        ops,
        "--dtypes",
        dtypes,
        "--D",
        "64",
        "--masks",
        masks,
        "--mix",
        "3",
        "--gqa",
        str(gqa),
    ] + {
        True: ["--sinks"],
        "softcap": ["--softcap", "30"],
        "bias": ["--bias", "2", "--softcap", "30", "--sinks"],
    }.get(sinks, [])
    res = subprocess.run(cmd + ["--configs", "first"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    kernel_row = re.compile(r"\| (fwd|infer|dq|dkdv|fused) \|")
    rows = [line.split("|") for line in res.stdout.splitlines() if kernel_row.match(line)]
    n_ops, n_dtypes, n_masks = len(ops.split(",")), len(dtypes.split(",")), len(masks.split(","))
    assert len(rows) == (4 if sinks in (True, "bias") else 5) * n_ops * n_dtypes * n_masks
    for r in rows:  # registers, loop instructions, a 12-digit SASS hash, the loops, 3 opcodes
        assert int(r[6]) > 0 and int(r[9]) > 0 and re.fullmatch(r" [0-9a-f]{12} ", r[11]), r
        loops = [float(n) for n in r[13].split(" / ")]  # every loop; the longest is instr/score
        assert abs(max(loops) - float(r[10])) <= 0.5, r
        mix = re.findall(r"([A-Z][A-Z0-9]+) (\d+\.\d)", r[14])
        assert len(mix) == 3 and sum(float(n) for _, n in mix) <= float(r[10]) + 0.5, r
    # bf16x6 launches on the split dots' tile list (tf32x3's) with its own dots: the tiles of tf32x3, and
    # machine code that is neither tf32x3's nor ieee's
    by = {(r[1].strip(), r[3].strip()): r for r in rows}
    for kernel in ("fwd", "infer", "dq", "dkdv", "fused") if "bf16x6" in dtypes else ():
        tile, sass = by[kernel, "bf16x6"][5], by[kernel, "bf16x6"][11]
        assert tile == by[kernel, "tf32x3"][5], (kernel, tile)
        assert sass not in (by[kernel, "tf32x3"][11], by[kernel, "ieee"][11]), kernel


@pytest.mark.skipif(not _ptxas(), reason="needs triton with the ptxas it runs for sm_90 (Linux)")
def test_forward_flags_non_finite_rows_in_machine_code():
    """The forward's non-finite-row check survives the compiler: fma(s, 0, s) stays an FFMA with the zero
    register (folding it to s would need fast-math) and the row max is the NaN-propagating FMNMX.NAN. The
    interpreter cannot tell: numpy's maximum propagates NaN either way."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    fma0 = r"FFMA R[0-9]+, RZ, (R[0-9]+), \1 "
    cmd = [sys.executable, str(TOOL), "--ops", "softmax,fwm-prob-k4,minmax-weight-k4",
           "--dtypes", "bf16,tf32", "--D", "64", "--kernels", "fwd,infer", "--configs", "first",
           "--count", r"FMNMX\.NAN", "--count", fma0]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split("|") for line in res.stdout.splitlines() if re.match(r"\| (fwd|infer) \|", line)]
    assert len(rows) == 12
    for r in rows:
        assert int(r[14]) > 0 and int(r[15]) > 0, r


@pytest.mark.skipif(not _ptxas(), reason="needs triton with the ptxas it runs for sm_90 (Linux)")
def test_the_launches_ask_for_fma_contraction():
    """Every launch asks for FMA contraction itself (``Launch``): the machine code the GPU tests passed with
    and the instruction counts stay what they are when Triton's default turns it off (Triton 3.9 warns that
    3.10 will; TRITON_DEFAULT_FP_FUSION=0 is that default now). Without the request the dQ kernel's SASS
    differs."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(TOOL.parent)!r})\n"
        "import kernel_resources as t\n"
        "from kinterval.ops import OperatorSpec\n"
        "spec, cfg = OperatorSpec.from_full_name('softmax'), t.launch_configs('dq', 'bf16', 64)[0]\n"
        "for default in ('1', '0'):\n"
        "    os.environ['TRITON_DEFAULT_FP_FUSION'] = default\n"
        "    print(t.compile_one('dq', spec, 'bf16', 64, cfg, 'sm_90a')['sass'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    fused, default_off = res.stdout.split()
    assert fused == default_off


def test_the_resource_tool_runs_the_ptxas_triton_runs_and_stops_when_it_fails():
    """Triton 3.9 assembles sm_90 with its newer ptxas-blackwell; the bundled ptxas cannot read that PTX and
    exits 255, which the table once showed as "None" registers. The tool asks Triton which ptxas it runs for
    an arch, and a tool that fails stops it with what the tool said."""
    skip_without_kernels()
    tool = _tool()
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        pytest.skip("this Triton has no get_ptxas")
    assert tool.nvidia_tool("ptxas", 90) == get_ptxas(90).path
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\): Unsupported .version 9.4"):
        tool._run_tool([sys.executable, "-c", "import sys; sys.exit('Unsupported .version 9.4')"])


def test_dtype_modes_of_the_resource_tool():
    """Each --dtypes mode is its input dtype and fp32 dot precision: bf16 and fp16 inputs (their native
    dots; the flag is "ieee"), fp32 with each precision of kinterval_attention; anything else stops."""
    import torch

    tool = _tool()
    assert tool.dtype_and_precision("bf16") == (torch.bfloat16, "ieee")
    assert tool.dtype_and_precision("fp16") == (torch.float16, "ieee")
    for precision in ("tf32", "tf32x3", "bf16x6", "ieee"):
        assert tool.dtype_and_precision(precision) == (torch.float32, precision)
    with pytest.raises(SystemExit, match="unknown dtype mode 'fp8'; choose from bf16, fp16, tf32"):
        tool.dtype_and_precision("fp8")


@needs_kernels
def test_the_resource_tool_compiles_the_tiles_the_launcher_keeps():
    """The head-dim limits of the launcher's pruner hold in the tool: above D = 64 the FMA ("ieee") list keeps
    tiles of at most 512 scores (its --configs first is 32 x 16, not the 64 x 32 of D = 64), above D = 128 the
    tensor-core list at most 64 x 32; at D = 64 every candidate stays."""
    from kinterval.ops.triton import kernels as K

    tool = _tool()
    area = lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]  # noqa: E731
    for kernel in ("fwd", "infer", "dq", "dkdv", "fused"):
        kind = tool.TILE_KIND.get(kernel, kernel)
        assert [K._tile(c) for c in tool.launch_configs(kernel, "bf16", 64)] == [
            K._tile(c) for c in K.candidate_configs(kind, tiles="mma")
        ][: len(tool.launch_configs(kernel, "bf16", 64))]
        ieee = tool.launch_configs(kernel, "ieee", 128)
        assert ieee and all(area(c) <= 512 for c in ieee), kernel
        mma = tool.launch_configs(kernel, "bf16", 256)
        assert mma and all(area(c) <= 64 * 32 for c in mma), kernel
    assert K._tile(tool.launch_configs("fwd", "ieee", 128)[0])[:2] == (32, 16)


@needs_kernels
def test_gqa_reaches_the_compiled_launch(monkeypatch):
    """--gqa G builds the launch the kernels get for grouped-query attention: k and v with HEADS / G heads,
    G in the kernels' shape argument; G must divide HEADS."""
    import torch

    from kinterval.ops import OperatorSpec

    tool = _tool()
    spec = OperatorSpec.from_full_name("minmax-prob-k4")
    for kernel in ("fwd", "dkdv", "fused"):
        launch = tool._meta_launch(kernel, spec, "bf16", 64, True, False, 4)
        k, v = launch.args[1][:2]
        assert k.shape[1] == v.shape[1] == tool.HEADS // 4
        assert launch.args[-2] == (tool.HEADS, 1024, 1024, 64, 4), kernel  # shape = (H, Tq, Tk, D, G)
    assert tool._meta_launch("dq", spec, "bf16", 64, True, False).args[-2][-1] == 1
    for kernel in ("fwd", "dq"):  # --sinks: one fp32 sink per q head reaches the kernels that read them
        launch = tool._meta_launch(kernel, spec, "bf16", 64, True, False, sinks=True)
        # causal, no mask, sinks, no softcap, no bias
        assert launch.meta["MASKING"] == (True, False, True, False, 0)
        assert launch.args[1][-2].shape == (tool.HEADS,) and launch.args[1][-2].dtype == torch.float32
    for kernel, mode in (("fwd", 2), ("infer", 1), ("dq", 2), ("dkdv", 2)):  # --bias 2: (1, H, T, T) fp32
        launch = tool._meta_launch(kernel, spec, "bf16", 64, True, False, bias=2)
        assert launch.meta["MASKING"] == (True, False, False, False, mode), kernel
        bias = launch.args[1][-1]  # expanded to (B, H, T, T), the batch dim broadcast
        assert bias.shape == (16, tool.HEADS, 1024, 1024) and bias.stride()[0] == 0, kernel
    groups = []

    def stop(*args, **kwargs):  # the launch the command line builds, recorded before anything compiles
        groups.append((args[6], kwargs.get("sinks")))
        raise KeyboardInterrupt

    tool._meta_launch = stop
    # main() drops TRITON_INTERPRET (it compiles); monkeypatch puts the conftest's value back afterwards
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    with pytest.raises(KeyboardInterrupt):
        tool.main(["--ops", "lerp-k4", "--kernels", "dq", "--D", "64", "--configs", "first", "--gqa", "8"])
    assert groups == [(8, False)]
    with pytest.raises(KeyboardInterrupt):
        tool.main(["--ops", "lerp-k4", "--kernels", "dq", "--D", "64", "--configs", "first", "--sinks"])
    assert groups[-1] == (1, True)
    with pytest.raises(SystemExit, match="--gqa must divide the 32 q heads, got 3"):
        tool.main(["--gqa", "3"])


@needs_kernels
def test_an_unknown_dtype_mode_stops_before_the_table():
    """A bad mode after good ones stops the tool before it prints the table or compiles anything."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(TOOL), "--ops", "softmax", "--dtypes", "bf16,fp8", "--D", "64",
           "--kernels", "fwd", "--configs", "first"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode != 0 and "unknown dtype mode 'fp8'" in res.stderr
    assert "| kernel |" not in res.stdout


@pytest.mark.skipif(not _ptxas(), reason="needs triton with the ptxas it runs for sm_90 (Linux)")
def test_the_resource_tool_compiles_tiles_given_by_hand():
    """--configs with tiles (the table's BMxBN/warps/stages form) compiles exactly those, candidates or not;
    a malformed one stops the tool before the table, naming the form it takes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(TOOL), "--ops", "softmax", "--kernels", "dkdv", "--D", "64", "--configs"]
    res = subprocess.run([*cmd, "128x64/8/1,64x16/4/1"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split("|") for line in res.stdout.splitlines() if line.startswith("| dkdv")]
    assert [r[5].strip() for r in rows] == ["128x64/8/1", "64x16/4/1"]  # the second is no candidate
    for bad in ("128x64", "a x b/1/1"):
        res = subprocess.run([*cmd, bad], capture_output=True, text=True, env=env, timeout=600)
        assert res.returncode != 0 and "| kernel |" not in res.stdout
        assert "--configs takes 'all', 'first' or tiles like 128x64/8/1" in res.stderr
