"""Triton softmax: a kernel class for SoftmaxFwdOp's interface, and its launcher."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tileops import Kernel
from tileops.kernel import Build
from tileops.ops import SoftmaxCall, SoftmaxFwdOp, SoftmaxInterface

from .declare import CUDA_ROW_KEYS, DEVICES, FasterRegion, deferral, dtype_refusal
from .rows import RowPlan, row_plan

KEY = "triton"

# Where Triton measured faster than the tileops-cuda kernel serving the call, on the H200, in
# one run of benchmarks/norms_h200.py with both backends (results/norms_nvidia_h200.md, commit
# 31aa0e5; bf16 and float32, 2**26 elements, % of copy bandwidth): bf16 N=256: 97 vs 91
# (tilelang_warp_rows). Not at 1K (98 vs 99) nor at 4K-16K (94/94/90 vs 98/99/98 for
# tilelang_block_row once it kept 8 vectors per lane), nor float32 16K (93 vs 97). The region
# ends below the 1K tie.
FASTER = (FasterRegion(torch.bfloat16, 256, 512),)


class TritonSoftmax(Kernel, SoftmaxInterface):
    """Every float16/bfloat16/float32 softmax call, any n, on any CUDA device Triton runs on."""

    devices = DEVICES
    supported_archs = None
    # Over tileops-cuda only inside FASTER: everywhere else the refusal defers.
    preferred_over = frozenset({"reference", *CUDA_ROW_KEYS})

    @classmethod
    def refusal(cls, call: SoftmaxCall) -> str | None:
        return dtype_refusal(call.dtype) or deferral(SoftmaxFwdOp, CUDA_ROW_KEYS, FASTER, call)

    @classmethod
    def entry_for(cls, call: SoftmaxCall) -> tuple[Hashable, Build]:
        return (call.n, call.dtype), lambda: cls(call.n, call.dtype)

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        self.plan = row_plan(n, "softmax", dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.into(x, out)
        return out

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        softmax(self.plan, x, out)


def softmax(plan: RowPlan, x: torch.Tensor, out: torch.Tensor) -> None:
    """Write the softmax of each row of the contiguous (rows, n) `x` into `out`."""
    from . import _softmax_kernels as programs

    rows, n = x.shape
    if plan.held:
        vec = min(16 // x.element_size(), plan.block)  # a lane's 16-byte vector
        programs.softmax_held[(rows,)](
            x, out, n, BLOCK=plan.block, VEC=vec, num_warps=plan.warps, maxnreg=plan.maxnreg
        )
    elif plan.fused:
        programs.softmax_fused[plan.grid(rows)](
            x, out, rows, n, ROWS=plan.rows, BLOCK=plan.block, num_warps=plan.warps
        )
    else:
        programs.softmax_looped[(rows,)](x, out, n, CHUNK=plan.block, num_warps=plan.warps)
