"""Triton LayerNorm and RMSNorm: kernel classes for the ops' interfaces, and their launchers.

The launchers take (rows, n) tensors and an output buffer, so the kernel classes (which return
a new tensor) and the triton target (which writes the op's output) share them.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tileops import Kernel
from tileops.kernel import Build
from tileops.ops import (
    LayerNormCall,
    LayerNormFwdOp,
    LayerNormInterface,
    RMSNormCall,
    RMSNormFwdOp,
    RMSNormInterface,
)

from .declare import CUDA_ROW_KEYS, DEVICES, FasterRegion, deferral, dtype_refusal
from .rows import RowPlan, row_plan

LAYER_NORM_KEY = "triton"
RMS_NORM_KEY = "triton"

# Where Triton measured faster than the tileops-cuda kernel serving the call, on the H200
# (2**26 elements, % of copy bandwidth). LayerNorm: nowhere (results/norms_nvidia_h200.md; at
# 16K, where Triton had led, tilelang_block_row with 8 vectors per lane leads, 95 vs 87 bf16).
# RMSNorm: float32 rows of 2K-4K (a 4096-wide block), which Triton loops over in two passes
# (rows.FLOAT32_LOOPED): 101.3 against tilelang_block_row's 97.3 in the plan sweep, and 100.7
# against 97 in the next norms run (row_plans_stream_row_block_row_triton and
# norms_4k_16k_float32, 2026-11-30).
LAYER_NORM_FASTER: tuple[FasterRegion, ...] = ()
RMS_NORM_FASTER = (FasterRegion(torch.float32, 2049, 4096),)


class TritonLayerNorm(Kernel, LayerNormInterface):
    """Every float16/bfloat16/float32 LayerNorm call, any n, on any CUDA device Triton runs on."""

    devices = DEVICES
    supported_archs = None
    # Over tileops-cuda only inside LAYER_NORM_FASTER: everywhere else the refusal defers.
    preferred_over = frozenset({"reference", *CUDA_ROW_KEYS})

    @classmethod
    def refusal(cls, call: LayerNormCall) -> str | None:
        return dtype_refusal(call.dtype) or deferral(
            LayerNormFwdOp, CUDA_ROW_KEYS, LAYER_NORM_FASTER, call
        )

    @classmethod
    def entry_for(cls, call: LayerNormCall) -> tuple[Hashable, Build]:
        identity = (call.n, call.eps, call.dtype)
        return identity, lambda: cls(*identity)

    def __init__(self, n: int, eps: float, dtype: torch.dtype) -> None:
        self.plan = row_plan(n, "layer_norm", dtype)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        out = torch.empty_like(x)
        self.into(x, weight, bias, out)
        return out

    def into(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        layer_norm(self.plan, x, weight, bias, self.eps, out)


class TritonRMSNorm(Kernel, RMSNormInterface):
    """Every float16/bfloat16/float32 RMSNorm call, any n, on any CUDA device Triton runs on."""

    devices = DEVICES
    supported_archs = None
    # Over tileops-cuda only inside RMS_NORM_FASTER: everywhere else the refusal defers.
    preferred_over = frozenset({"reference", *CUDA_ROW_KEYS})

    @classmethod
    def refusal(cls, call: RMSNormCall) -> str | None:
        return dtype_refusal(call.dtype) or deferral(
            RMSNormFwdOp, CUDA_ROW_KEYS, RMS_NORM_FASTER, call
        )

    @classmethod
    def entry_for(cls, call: RMSNormCall) -> tuple[Hashable, Build]:
        identity = (call.n, call.eps, call.dtype)
        return identity, lambda: cls(*identity)

    def __init__(self, n: int, eps: float, dtype: torch.dtype) -> None:
        self.plan = row_plan(n, "rms_norm", dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty_like(x)
        self.into(x, weight, out)
        return out

    def into(self, x: torch.Tensor, weight: torch.Tensor | None, out: torch.Tensor) -> None:
        rms_norm(self.plan, x, weight, self.eps, out)


def layer_norm(
    plan: RowPlan,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
) -> None:
    """Write LayerNorm of the contiguous (rows, n) `x` into `out` of the same layout."""
    from . import _norm_kernels as programs

    rows, n = x.shape
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None}
    w, b = _or(weight, x), _or(bias, x)  # absent vectors: any pointer, never read
    if plan.held:
        programs.layer_norm_held[(rows,)](
            x, w, b, out, n, eps, BLOCK=plan.block, **flags, num_warps=plan.warps,
            maxnreg=plan.maxnreg,
        )  # fmt: skip
    elif plan.fused:
        programs.layer_norm_fused[plan.grid(rows)](
            x, w, b, out, rows, n, eps, ROWS=plan.rows, BLOCK=plan.block, **flags,
            num_warps=plan.warps,
        )  # fmt: skip
    else:
        programs.layer_norm_looped[(rows,)](
            x, w, b, out, n, eps, CHUNK=plan.block, **flags, num_warps=plan.warps
        )


def rms_norm(
    plan: RowPlan, x: torch.Tensor, weight: torch.Tensor | None, eps: float, out: torch.Tensor
) -> None:
    """Write RMSNorm of the contiguous (rows, n) `x` into `out` of the same layout."""
    from . import _norm_kernels as programs

    rows, n = x.shape
    w, has_w = _or(weight, x), weight is not None
    if plan.held:
        programs.rms_norm_held[(rows,)](
            x, w, out, n, eps, BLOCK=plan.block, HAS_W=has_w, num_warps=plan.warps,
            maxnreg=plan.maxnreg,
        )  # fmt: skip
    elif plan.fused:
        programs.rms_norm_fused[plan.grid(rows)](
            x, w, out, rows, n, eps, ROWS=plan.rows, BLOCK=plan.block, HAS_W=has_w,
            CACHED=plan.cached, num_warps=plan.warps,
        )  # fmt: skip
    else:
        programs.rms_norm_looped[(rows,)](
            x, w, out, n, eps, CHUNK=plan.block, HAS_W=has_w, num_warps=plan.warps
        )


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    return fallback if t is None else t
