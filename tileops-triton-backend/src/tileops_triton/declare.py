"""Declarations every Triton kernel class shares: where Triton runs, which dtypes it serves, and
when it steps aside for tileops-cuda.

Triton runs on every CUDA architecture it supports (so no `supported_archs`), and on CPU tensors
when `TRITON_INTERPRET=1` is set at import: that is how CI runs the real kernel code.

tileops-cuda's TileLang kernels are the first choice wherever they serve a call; a Triton class
names their keys and refuses the calls one of them serves (the "deferral"), except in regions
where the Triton kernel was measured faster (its `FasterRegion`s), where it instead wins through
`preferred_over`. Deferring by refusal rather than asking tileops-cuda for `preferred_over` edges
keeps the two distributions independent, and no preference cycle can arise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from tileops import CallSpec
from tileops.backend import key_serves

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
"""Decided once, at import: Triton reads the variable when its kernels are first defined."""

DEVICES = frozenset({"cuda", "cpu"}) if INTERPRETING else frozenset({"cuda"})

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

H200 = "NVIDIA H200"
"""The board `FasterRegion`s were measured on; on any other board Triton defers everywhere."""

CUDA_ROW_KEYS = frozenset(
    {
        "tilelang_warp_rows",
        "tilelang_block_row",
        "tilelang_smem_row",
        "tilelang_stream_row",
        "tilelang_cluster_row",
    }
)
"""tileops-cuda's keys for LayerNormFwdOp, RMSNormFwdOp and SoftmaxFwdOp."""

CUDA_GEMM_KEYS = frozenset(
    {"cublas", "tilelang_gemm", "tilelang_gemm_hopper", "tilelang_gemm_skinny"}
)
"""tileops-cuda's keys for GemmOp: the TileLang ones (float16 / bfloat16 on sm_80 .. sm_90) and
cuBLAS (every float dtype on every CUDA arch), which Triton was measured slower than
(`benchmarks/results/gemm/gemm_nvidia_h200.md`: 0.93x torch.matmul at 4096^3, 0.47x at decode)."""


@dataclass(frozen=True)
class FasterRegion:
    """Calls of `dtype` with n_min <= n <= n_max where Triton measured faster on the H200."""

    dtype: torch.dtype
    n_min: int
    n_max: int

    def covers(self, call: CallSpec) -> bool:
        return call.dtype == self.dtype and self.n_min <= call.n <= self.n_max


def dtype_refusal(dtype: torch.dtype) -> str | None:
    """None for the dtypes Triton serves; float64 and others stay with the reference kernels."""
    if dtype in DTYPES:
        return None
    return (
        f"the Triton kernels serve float16, bfloat16 and float32, not {dtype}; "
        "the torch reference kernels serve it"
    )


def deferral(
    op: type, cuda_keys: Iterable[str], faster: Iterable[FasterRegion], call: CallSpec
) -> str | None:
    """A refusal sentence when an installed tileops-cuda kernel serves `call` and Triton was not
    measured faster there on this board; else None."""
    if call.calibration == H200 and any(region.covers(call) for region in faster):
        return None
    serving = _serving_keys(op, cuda_keys, call)
    if not serving:
        return None
    return (
        f"tileops-cuda's {', '.join(map(repr, serving))} serves this call, and Triton was not "
        f"measured faster here on {call.calibration or 'this device'}; Triton steps aside"
    )


def _serving_keys(op: type, cuda_keys: Iterable[str], call: CallSpec) -> list[str]:
    """The keys among `cuda_keys` installed for `op` that are available and applicable."""
    return [key for key in sorted(cuda_keys) if key_serves(op, key, call)]
