"""torch's own LayerNorm and RMSNorm (ATen's CUDA kernels, keys "aten_layer_norm" and
"aten_rms_norm") as row-norm kernels for calls under autograd, declared `torch_native`: where one
serves, the call runs torch's function under torch's autograd (`RowNorm.native_lane_for`), with
torch's backward and no node of the op's.

The op asks about an autograd call with its spec's `grad` and its rows (a power of two), so the
choice weighs the whole training call as a model pays it: forward, backward and the host's work
for both. The ATen kernel is preferred over the tileops keys and steps aside inside `GRAD_FASTER`,
where the op's node (TileLang forward and backward) measured faster as called on the H200
(TUNING.md#autograd-calls); elsewhere (other boards, dtypes, sizes never measured) torch's serves.
Plain calls are the TileLang kernels': the op's lane launches them directly, and they measured
faster than torch's by kernel time at every row length (benchmarks/results/norms), as called
0.80x (16 rows of 1K, host-bound) to 2.05x. Mixed calls (float32 params beside 16-bit x) stay
with the op's node: never measured against torch's, whose RMSNorm leaves its fused kernel there.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import (
    LayerNormCall,
    LayerNormFwdOp,
    LayerNormInterface,
    RMSNormCall,
    RMSNormFwdOp,
    RMSNormInterface,
)

from .._common.vendor import Faster, deferral

TILEOPS_KEYS = (
    "tilelang_block_row",
    "tilelang_cluster_row",
    "tilelang_smem_row",
    "tilelang_stream_row",
    "tilelang_warp_rows",
)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SOURCE = "benchmarks/results/norms/norm_calls_node_nvidia_h200.md"


@dataclass(frozen=True)
class GradRegion(Faster):
    """bfloat16 autograd calls, params of x's dtype or none, of row length n within `lengths`
    and at least `min_rows` rows (the spec's power of two)."""

    lengths: tuple[int, int] = (1, 1 << 30)
    min_rows: int = 1

    def covers(self, call: LayerNormCall | RMSNormCall) -> bool:
        return (
            call.dtype == torch.bfloat16
            and self.lengths[0] <= call.n <= self.lengths[1]
            and call.rows >= self.min_rows
        )


class _AtenNorm(Kernel):
    """torch's function on the (rows, n) rows the interface hands over; as a native lane, on
    the caller's tensors."""

    supported_archs = None
    # Triton's too: it steps aside for the tileops-cuda keys, but wins inside its own regions
    preferred_over = frozenset({*TILEOPS_KEYS, "triton"})
    torch_native = True  # under autograd: torch's function and its backward
    op: ClassVar[type]
    name: ClassVar[str]
    faster: ClassVar[tuple[Faster, ...]]

    @classmethod
    def refusal(cls, call: LayerNormCall | RMSNormCall) -> str | None:
        if not call.grad:
            return (
                "a plain call is left to the tileops kernels, which the op's lane launches "
                "directly (torch's is weighed only under autograd)"
            )
        if call.dtype not in DTYPES:
            return f"{call.dtype} is not served ({cls.name} on CUDA takes float types)"
        if call.param_dtype not in (None, call.dtype):
            return f"{call.param_dtype} params beside {call.dtype} x are not served (mixed)"
        return deferral(cls.op, cls.name, cls.faster, call)

    @classmethod
    def entry_for(cls, call: LayerNormCall | RMSNormCall) -> tuple[Hashable, Build]:
        identity = (call.eps,)
        return identity, lambda: cls(*identity)

    def __init__(self, eps: float) -> None:
        self.eps = eps


GRAD_FASTER: dict[type, tuple[Faster, ...]] = {
    LayerNormFwdOp: (),  # the node measured at most 1.00x torch's (32768 x 2048)
    RMSNormFwdOp: (
        GradRegion(  # TUNING.md#autograd-calls
            keys=("tilelang_block_row",),
            lengths=(16384, 16384),
            min_rows=8192,
            figure=(
                "the op's node (TileLang forward and backward) 1.29x torch's rms_norm as "
                "called, forward + backward, at 8192 x 16384 (716 against 923 us)"
            ),
            source=f"{SOURCE}, commit 1f442f4",
        ),
    ),
}
"""Where the op's node measured at least 2% faster than torch's function on the H200, as a
model calls it (forward and backward, back to back), bfloat16."""


class AtenLayerNorm(_AtenNorm, LayerNormInterface):
    op = LayerNormFwdOp
    name = "torch's layer_norm"
    faster = GRAD_FASTER[LayerNormFwdOp]

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], weight, bias, self.eps)


class AtenRMSNorm(_AtenNorm, RMSNormInterface):
    op = RMSNormFwdOp
    name = "torch's rms_norm"
    faster = GRAD_FASTER[RMSNormFwdOp]

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], weight, self.eps)
