"""Triton's GEMM kernel: its key, where it runs, which calls it serves, and where it steps
aside for tileops-cuda.

It serves float16/bfloat16/float32 GEMMs of any shape and layout (NN, NT, TN, TT, read as
stored), with or without a bias, on every CUDA arch Triton runs on
(`declare.DEVICES`; CPU too, under the interpreter), except the calls a tileops-cuda GEMM serves
(its cuBLAS key: every float call on every CUDA arch), where its refusal defers
(`declare.deferral`). Candidates:
`configs.candidates`, tuned once per build identity by `compile.tuned`; program: `programs`,
called through `launch`.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import GemmCall, GemmInterface, GemmOp

from ..compile import next_pow2, tuned
from ..declare import CUDA_GEMM_KEYS, DEVICES, FasterRegion, deferral, dtype_refusal
from .configs import GemmConfig, candidates
from .launch import gemm

GEMM_KEY = "triton"

# Where Triton measured faster than tileops-cuda's GEMM on the H200: nowhere yet
# (TUNING.md#faster-regions). A region added here also needs the TileLang keys in
# `preferred_over`.
GEMM_FASTER: tuple[FasterRegion, ...] = ()


class TritonGemm(Kernel, GemmInterface):
    """Every float16/bfloat16/float32 GEMM, any shape, on any CUDA device Triton runs on, except
    the calls a tileops-cuda GEMM serves (cuBLAS or TileLang), where it steps aside."""

    devices = DEVICES
    supported_archs = None
    preferred_over = frozenset({"reference"})  # beside tileops-cuda: the refusal defers

    @classmethod
    def refusal(cls, call: GemmCall) -> str | None:
        return dtype_refusal(call.dtype) or deferral(GemmOp, CUDA_GEMM_KEYS, GEMM_FASTER, call)

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        # m is bucketed: calls whose m rounds to the same power of two share a tuned config.
        # The layout changes which tiles read fastest; the bias (a launch argument) does not.
        facts = (call.arch, call.sm_count, call.smem_budget)
        shape = (min(next_pow2(call.m), 4096), call.n, call.k, call.dtype)
        identity = (*shape, call.trans_a, call.trans_b, *facts)
        return identity, lambda: cls(identity)

    def __init__(self, identity: tuple) -> None:
        self.identity = identity
        m, n, k, dtype, self.trans_a, self.trans_b, arch, sm_count, smem_budget = identity
        self.upcast = _upcast(dtype, arch)
        self.configs = candidates(m, n, k, dtype, sm_count, smem_budget)

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = (a.shape[1 if self.trans_a else 0], b.shape[0 if self.trans_b else 1])
        out = torch.empty(shape, dtype=a.dtype, device=a.device)
        self.into(a, b, bias, out)
        return out

    def into(
        self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor
    ) -> None:
        layout = {"trans_a": self.trans_a, "trans_b": self.trans_b, "upcast": self.upcast}

        def run(config: GemmConfig) -> None:
            gemm(config, a, b, out, bias, **layout)

        run(tuned("gemm", self.identity, self.configs, run))


def _upcast(dtype: torch.dtype, arch: int | None) -> bool:
    """float32 operands for bfloat16 dots, which need sm_80's tensor cores."""
    return dtype == torch.bfloat16 and arch is not None and arch < 80
