"""cuBLAS as a GemmOp kernel (key "cublas"): torch.mm / torch.addmm on the operands' transposed
views, so every layout is read where it lies and the bias is cuBLAS's epilogue (as F.linear).

It is preferred over the TileLang keys and steps aside only inside `GEMM_FASTER`, the regions
where a TileLang kernel measured faster on the H200 (TUNING.md#vendor-regions); everywhere else
(other boards, float16, float32, float64, shapes and layouts not measured faster) cuBLAS
serves, so the op is never slower than cuBLAS where there is a measurement.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import GemmCall, GemmInterface, GemmOp

from .._common.vendor import Faster, deferral
from .tiles import PAD_MIN_FLOPS, misaligned

TILELANG_KEYS = frozenset({"tilelang_gemm", "tilelang_gemm_hopper", "tilelang_gemm_skinny"})
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class GemmRegion(Faster):
    """bfloat16 calls of `layouts` with m <= `max_m` and a weight of n * k elements within
    `weight`, at least `min_flops`, whose n or k are (`misaligned`) or are not multiples of 8."""

    layouts: frozenset[str] = frozenset({"NN"})
    max_m: int | None = None
    weight: tuple[int, int] = (0, 1 << 62)
    min_flops: int = 0
    misaligned: bool = False

    def covers(self, call: GemmCall) -> bool:
        return (
            call.dtype == torch.bfloat16
            and call.layout in self.layouts
            and (self.max_m is None or call.m <= self.max_m)
            and self.weight[0] <= call.n * call.k <= self.weight[1]
            and 2 * call.m * call.n * call.k >= self.min_flops
            and bool(misaligned(call)) == self.misaligned
        )


GEMM_FASTER = (
    GemmRegion(  # TUNING.md#vendor-regions, decode
        keys=("tilelang_gemm_skinny",),
        layouts=frozenset({"NN", "NT"}),
        max_m=16,
        weight=(4096 * 4096, 11008 * 4096),
        figure=(
            "the split-K kernel alone 1.08x F.linear at 1x4096x4096 NT; by kernel time 1.09x "
            "torch.matmul at 1x4096x4096 and 16x4096x4096, 1.06x at 1x11008x4096"
        ),
        source=(
            "benchmarks/results/gemm/linear_nvidia_h200.md, commit 752246a; "
            "benchmarks/results/gemm/gemm_decode_nvidia_h200.md, commit 5694f51"
        ),
    ),
    GemmRegion(  # TUNING.md#vendor-regions, padded
        keys=("tilelang_gemm_hopper",),
        min_flops=PAD_MIN_FLOPS,
        misaligned=True,
        figure="3.5x torch.matmul at 4096x4095x4096 (496.8 against 142.8 TFLOP/s)",
        source="benchmarks/results/batch_norm/batchnorm_gemm_nvidia_h200.md, commit e58885f",
    ),
)
"""Where a TileLang GEMM measured at least 2% faster than cuBLAS on the H200, bfloat16."""


class CublasGemm(Kernel, GemmInterface):
    """cuBLAS (torch's CUDA matmul) for float16 / bfloat16 / float32 / float64 on every CUDA
    arch: float32 follows torch's tf32 setting, as torch.mm does; 16-bit accumulates in
    float32 with the bias added before the one rounding (cuBLAS's beta = 1 epilogue)."""

    supported_archs = None
    preferred_over = TILELANG_KEYS
    torch_native = True  # under autograd: torch.mm / addmm with torch's backward, as F.linear

    @classmethod
    def refusal(cls, call: GemmCall) -> str | None:
        if call.dtype not in DTYPES:
            return f"{call.dtype} is not served (torch's CUDA matmul takes float types)"
        return deferral(GemmOp, "cuBLAS", GEMM_FASTER, call)

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        identity = (call.trans_a, call.trans_b)
        return identity, lambda: cls(*identity)

    def __init__(self, trans_a: bool, trans_b: bool) -> None:
        self.trans_a, self.trans_b = trans_a, trans_b

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        a = a.t() if self.trans_a else a
        b = b.t() if self.trans_b else b
        return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
