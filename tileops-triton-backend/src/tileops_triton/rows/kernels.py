"""Triton's row-wise kernels (LayerNorm, RMSNorm, softmax): their keys, where they run, which
calls they serve, and where they win over tileops-cuda.

Every class serves float16/bfloat16/float32 calls of any n on every CUDA arch Triton runs on
(`declare.DEVICES`; CPU too, under the interpreter). Beside tileops-cuda it steps aside wherever
a TileLang row kernel serves the call (`declare.deferral`), except inside its measured `faster`
regions, where `preferred_over` makes it win. Launch plans: `plans.row_plan`; programs:
`norm_programs`, `softmax_programs`, called through `launch`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import torch

from tileops import CallSpec, Kernel
from tileops.backend import Build
from tileops.ops import (
    LayerNormFwdOp,
    LayerNormInterface,
    RMSNormFwdOp,
    RMSNormInterface,
    SoftmaxCall,
    SoftmaxFwdOp,
    SoftmaxInterface,
)

from ..declare import CUDA_ROW_KEYS, DEVICES, FasterRegion, deferral, dtype_refusal
from .launch import layer_norm, rms_norm, softmax
from .plans import row_plan

LAYER_NORM_KEY = "triton"
RMS_NORM_KEY = "triton"
SOFTMAX_KEY = "triton"

# Where Triton measured faster than the tileops-cuda kernel serving the call, on the H200
# (TUNING.md#faster-regions).
LAYER_NORM_FASTER: tuple[FasterRegion, ...] = ()
RMS_NORM_FASTER = (FasterRegion(torch.float32, 2049, 4096),)
SOFTMAX_FASTER = (FasterRegion(torch.bfloat16, 256, 512),)


class TritonRows(Kernel):
    """What the row kernels declare alike: any CUDA arch, and over tileops-cuda only inside
    `faster` (everywhere else the refusal defers). Subclasses name their op, plan family and
    regions."""

    devices = DEVICES
    supported_archs = None
    preferred_over = frozenset({"reference", *CUDA_ROW_KEYS})
    op_type: ClassVar[type]
    family: ClassVar[str]
    faster: ClassVar[tuple[FasterRegion, ...]]

    @classmethod
    def refusal(cls, call: CallSpec) -> str | None:
        return dtype_refusal(call.dtype) or deferral(cls.op_type, CUDA_ROW_KEYS, cls.faster, call)


class TritonNorm(TritonRows):
    """LayerNorm and RMSNorm: one plan and eps per (n, eps, dtype)."""

    @classmethod
    def entry_for(cls, call: CallSpec) -> tuple[Hashable, Build]:
        identity = (call.n, call.eps, call.dtype)
        return identity, lambda: cls(*identity)

    def __init__(self, n: int, eps: float, dtype: torch.dtype) -> None:
        self.plan = row_plan(n, self.family, dtype)
        self.eps = eps


class TritonLayerNorm(TritonNorm, LayerNormInterface):
    """Every float16/bfloat16/float32 LayerNorm call, any n, on any CUDA device Triton runs on."""

    op_type, family, faster = LayerNormFwdOp, "layer_norm", LAYER_NORM_FASTER

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


class TritonRMSNorm(TritonNorm, RMSNormInterface):
    """Every float16/bfloat16/float32 RMSNorm call, any n, on any CUDA device Triton runs on."""

    op_type, family, faster = RMSNormFwdOp, "rms_norm", RMS_NORM_FASTER

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty_like(x)
        self.into(x, weight, out)
        return out

    def into(self, x: torch.Tensor, weight: torch.Tensor | None, out: torch.Tensor) -> None:
        rms_norm(self.plan, x, weight, self.eps, out)


class TritonSoftmax(TritonRows, SoftmaxInterface):
    """Every float16/bfloat16/float32 softmax call, any n, on any CUDA device Triton runs on."""

    op_type, family, faster = SoftmaxFwdOp, "softmax", SOFTMAX_FASTER

    @classmethod
    def entry_for(cls, call: SoftmaxCall) -> tuple[Hashable, Build]:
        return (call.n, call.dtype), lambda: cls(call.n, call.dtype)

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        self.plan = row_plan(n, self.family, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.into(x, out)
        return out

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        softmax(self.plan, x, out)
