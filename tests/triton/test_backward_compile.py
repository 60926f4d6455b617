"""The Triton backward programs compiled offline for sm_90 and sm_80 (no GPU needed; not under
the interpreter, which compiles nothing), with the launch plans' block sizes and warps: each
compiles to a cubin, and the fused norm rows up to 8K keep x and dy in registers unspilled."""

from __future__ import annotations

import re
import subprocess

import pytest

from tileops_triton.declare import INTERPRETING
from tileops_triton.rows.backward_launch import (
    BACKWARD_CHUNK,
    BACKWARD_LOOP_WARPS,
    SUM_BLOCK_N,
    SUM_BLOCK_P,
    backward_plan,
)

pytestmark = pytest.mark.skipif(INTERPRETING, reason="compiles programs; the interpreter runs them")

POINTERS = {"X": "*bf16", "DY": "*bf16", "W": "*bf16", "DX": "*bf16", "DW_PART": "*fp32",
            "DB_PART": "*fp32", "Y": "*bf16", "PART": "*fp32", "OUT": "*bf16"}  # fmt: skip
SCALARS = {"rows": "i32", "n": "i32", "eps": "fp32", "parts": "i32"}
SUFFIX = {90: "a"}  # Triton's PTX for sm_90 targets sm_90a
NORM_FLAGS = {"CENTER": True, "HAS_W": True, "NEED_DX": True, "NEED_DW": True, "NEED_DB": True}


def compiled(name: str, arch: int, warps: int, **constants):
    """(registers, spill-store bytes) of backward program `name` compiled for sm_`arch`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from tileops_triton.rows import backward_programs

    program = getattr(backward_programs, name)
    types = {**POINTERS, **SCALARS}
    signature = {arg: types.get(arg, "constexpr") for arg in program.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(signature)
               if signature[arg].startswith("*") or arg == "n"}  # fmt: skip
    source = ASTSource(program, signature, constants, attrs=aligned)
    kernel = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}
    )
    assert kernel.asm["cubin"]
    flag = f"-arch=sm_{arch}{SUFFIX.get(arch, '')}"
    report = subprocess.run(
        [get_ptxas(arch).path, flag, "-v", "-", "-o", "/dev/null"],
        input=kernel.asm["ptx"], capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores", report)
    return registers, int(spills.group(1)) if spills else 0


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("n", [1024, 4096, 8192, 16384])
def test_fused_norm_backward_compiles(arch, n):
    plan = backward_plan(n, 132)
    assert plan.fused
    _, spills = compiled("norm_backward_fused", arch, plan.warps, ROWS=plan.rows,
                         BLOCK=plan.block, **NORM_FLAGS)  # fmt: skip
    if n <= 8192:
        assert spills == 0


@pytest.mark.parametrize("arch", [80, 90])
def test_looped_programs_and_the_partials_sum_compile(arch):
    assert not backward_plan(65536, 132).fused
    compiled("norm_backward_looped", arch, BACKWARD_LOOP_WARPS, CHUNK=BACKWARD_CHUNK, **NORM_FLAGS)
    compiled("softmax_backward_looped", arch, BACKWARD_LOOP_WARPS, CHUNK=BACKWARD_CHUNK)
    compiled("column_sums", arch, 4, BLOCK_P=SUM_BLOCK_P, BLOCK_N=SUM_BLOCK_N)


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("n", [1024, 16384])
def test_fused_softmax_backward_compiles(arch, n):
    plan = backward_plan(n, 132)
    _, spills = compiled("softmax_backward_fused", arch, plan.warps, ROWS=plan.rows,
                         BLOCK=plan.block)  # fmt: skip
    assert spills == 0
