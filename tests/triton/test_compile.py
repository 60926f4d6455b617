"""The Triton row programs compiled offline for sm_90 (no GPU needed; not under the interpreter,
which compiles nothing): a held row keeps its bfloat16 values packed between its uses, so its
program needs far fewer registers than the fused one that keeps float32 values. Were the second
widening merged with the first (`x.to(tl.float32)` twice), the held programs would need about
as many as the fused ones, and the plans' register caps (plans.HELD) would spill; the served
plans are compiled under their caps with the installed Triton. The GEMM program compiles every
layout to warpgroup MMAs.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tileops_triton.declare import INTERPRETING
from tileops_triton.rows.plans import HELD

pytestmark = pytest.mark.skipif(INTERPRETING, reason="compiles programs; the interpreter runs them")

BLOCK = 32768
TYPES = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "rows": "i32", "n": "i32",
         "eps": "fp32"}  # fmt: skip
FLAGS = {"BLOCK": BLOCK, "HAS_W": True, "HAS_B": True, "ROWS": 1, "CACHED": True, "VEC": 8}


def ptxas_usage(
    name: str, warps: int, maxnreg: int | None = None, block: int = BLOCK
) -> tuple[int, int]:
    """(registers, spill-store bytes) of the row program `name` (in norm_programs or
    softmax_programs) on bfloat16 rows of `block` for sm_90, as ptxas reports them, with the
    pointers and n 16-aligned as the launcher's specialisation makes them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from tileops_triton.rows import norm_programs, softmax_programs

    module = softmax_programs if name.startswith("softmax") else norm_programs
    program = getattr(module, name)
    signature = {arg: TYPES.get(arg, "constexpr") for arg in program.arg_names}
    flags = {**FLAGS, "BLOCK": block}
    constants = {arg: flags[arg] for arg, kind in signature.items() if kind == "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(signature)
               if signature[arg].startswith("*") or arg == "n"}  # fmt: skip
    source = ASTSource(program, signature, constants, attrs=aligned)
    options = {"num_warps": warps, "maxnreg": maxnreg}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    report = subprocess.run(
        [get_ptxas(90).path, "-arch=sm_90a", "-v", "-", "-o", "/dev/null"],
        input=compiled.asm["ptx"], capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores", report)
    return registers, int(spills.group(1)) if spills else 0


@pytest.mark.parametrize("warps", [8, 32])
def test_held_rms_norm_rows_take_about_half_the_registers_of_fused_ones(warps):
    held, _ = ptxas_usage("rms_norm_held", warps)
    fused, _ = ptxas_usage("rms_norm_fused", warps)
    assert held <= 0.6 * fused, (held, fused)


def test_held_layer_norm_rows_fit_fewer_registers_without_spilling():
    held, spills = ptxas_usage("layer_norm_held", 8)
    fused, _ = ptxas_usage("layer_norm_fused", 8)
    assert held < fused and spills == 0, (held, spills, fused)


@pytest.mark.parametrize(
    "family,block", [(family, block) for family, plans in HELD.items() for block in plans]
)
def test_served_held_plans_fit_their_register_caps(family, block):
    """The caps in plans.HELD were measured with one Triton; a compiler that needs more
    registers under them spills, which costs more than the occupancy gains (a few values are
    tolerated)."""
    warps, maxnreg = HELD[family][block]
    registers, spills = ptxas_usage(f"{family}_held", warps, maxnreg, block)
    assert registers <= maxnreg and spills <= 32, (registers, spills)


GEMM_TYPES = {"A": "*bf16", "B": "*bf16", "C": "*bf16", "Bias": "*bf16", "M": "i32", "N": "i32",
              "K": "i32"}  # fmt: skip


@pytest.mark.parametrize("trans_a", [False, True], ids=["N", "T"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["N", "T"])
def test_gemm_program_compiles_every_layout_for_sm_90_to_warpgroup_mmas(trans_a, trans_b):
    """Each layout's tiles reach the tensor cores as they are stored: Triton's Hopper matmul
    (wgmma from shared memory), with a bias in the epilogue, bfloat16, the tutorial's tile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tileops_triton.gemm import programs

    program = programs.gemm
    signature = {arg: GEMM_TYPES.get(arg, "constexpr") for arg in program.arg_names}
    flags = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
             "EVEN_K": True, "UPCAST": False, "PRECISION": "tf32", "TRANS_A": trans_a,
             "TRANS_B": trans_b, "HAS_BIAS": True}  # fmt: skip
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(signature)
               if signature[arg] != "constexpr"}  # fmt: skip
    source = ASTSource(program, signature, flags, attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 8, "num_stages": 3})  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and ".bf16" in ptx
