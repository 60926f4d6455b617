"""RowPlan.ctas: a fused row program spread over a thread-block cluster (sm_90).

Compiled offline for sm_90 (no GPU needed; Triton ships ptxas) in a child process without
TRITON_INTERPRET, under which these tests otherwise run: Triton splits the row over the
cluster's CTAs and reduces across distributed shared memory.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tileops_triton import _norm_kernels, _softmax_kernels

family = {family!r}
if family == "softmax":
    fn, signature, flags = _softmax_kernels.softmax_fused, {{"X": "*bf16", "Y": "*bf16"}}, {{}}
else:
    fn, signature = _norm_kernels.rms_norm_fused, {{"X": "*bf16", "W": "*bf16", "Y": "*bf16"}}
    flags = {{"HAS_W": True, "CACHED": True}}
signature = {{**signature, "rows": "i32", "n": "i32"}}
if family != "softmax":
    signature["eps"] = "fp32"
constants = {{"ROWS": 1, "BLOCK": 32768, **flags}}
signature.update(dict.fromkeys(constants, "constexpr"))
aligned = {{(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values())
           if kind.startswith("*")}}
source = ASTSource(fn, signature, constexprs=constants, attrs=aligned)
options = {{"num_warps": 16, "num_ctas": 2}}
print(triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"])
"""


@pytest.mark.parametrize("family", ["softmax", "rms_norm"])
def test_a_fused_row_over_two_ctas_is_one_cluster(family):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    ptx = subprocess.run(
        [sys.executable, "-c", COMPILE.format(family=family)],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    assert ".reqnctapercluster 2" in ptx
    assert "barrier.cluster.arrive" in ptx and "ld.shared::cluster" in ptx
