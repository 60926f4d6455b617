"""The fused ops' Triton programs compiled offline for sm_90 and sm_80 (no GPU needed; not
under the interpreter, which compiles nothing): every program at the shapes its launcher uses,
and the add + RMSNorm programs without spills up to the longest row they serve."""

from __future__ import annotations

import re
import subprocess

import pytest

from tileops_triton.compile import next_pow2
from tileops_triton.declare import INTERPRETING
from tileops_triton.fused import launch

pytestmark = pytest.mark.skipif(INTERPRETING, reason="compiles programs; the interpreter runs them")

SCALARS = {"n": "i32", "rows": "i32", "per_program": "i32", "eps": "fp32", "seq": "i32",
           "q_heads": "i32", "k_heads": "i32", "rot": "i32", "head_dim": "i32"}  # fmt: skip


def ptxas_usage(name: str, arch: int, warps: int, **constants: object) -> tuple[int, int]:
    """(registers, spill-store bytes) of fused program `name` on bfloat16 tensors for `arch`,
    as ptxas reports them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from tileops_triton.fused import programs

    program = getattr(programs, name)
    signature = {}
    for arg in program.arg_names:
        if arg in constants:
            signature[arg] = "constexpr"
        elif arg in SCALARS:
            signature[arg] = SCALARS[arg]
        elif arg == "DW":
            signature[arg] = "*fp32"
        elif arg[0].isupper():
            signature[arg] = "*bf16"
        else:
            signature[arg] = "i64"  # strides
    source = ASTSource(program, signature, constants)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}
    )
    sm = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    report = subprocess.run(
        [get_ptxas(arch).path, f"-arch={sm}", "-v", "-", "-o", "/dev/null"],
        input=compiled.asm["ptx"], capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores", report)
    return registers, int(spills.group(1)) if spills else 0


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("n", [1000, 2048, 4096, 8192, 16384])
@pytest.mark.parametrize("name", ["add_rms_norm_fwd", "add_rms_norm_bwd"])
def test_add_rms_norm_programs_compile_without_spills(name, n, arch):
    if n > (launch.BACKWARD_MAX_ROW if name.endswith("bwd") else launch.MAX_ROW):
        pytest.skip("longer than the program serves")
    block = next_pow2(n)
    flags = {"BLOCK": block, "HAS_W": True}
    warps = launch._row_warps(block)
    if name.endswith("bwd"):
        flags["HAS_DH"] = True
        warps = launch._backward_warps(block)
    _, spills = ptxas_usage(name, arch, warps, **flags)
    assert spills == 0


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("act", sorted(launch.ACTIVATIONS))
@pytest.mark.parametrize("name", ["glu_fwd", "glu_bwd"])
def test_glu_programs_compile(name, act, arch):
    _, spills = ptxas_usage(name, arch, 4, ACT=launch.ACTIVATIONS[act], BLOCK=launch.GLU_BLOCK)
    assert spills == 0


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("rest", [0, 64])
def test_rotary_program_compiles_at_llama_shapes(rest, backward, arch):
    flags = {"Q_HEADS": 32, "K_HEADS": 8, "HALF": 64, "PASS": rest, "BACKWARD": backward}
    _, spills = ptxas_usage("rotary", arch, 4, **flags)
    assert spills == 0
