"""Triton GEMM: a kernel class for GemmOp's interface, its autotuned configs, and its launcher.

Candidates come from a rule over the shape and the device facts (listed best-guess first, which
is also what the interpreter runs); on a GPU `compile.tuned` times them once per build identity.
- m > 64: large tiles from the Triton matmul tutorial's Hopper/Ampere set; the tensor cores
  need BLOCK_K * BLOCK_N * stages of B and BLOCK_M * BLOCK_K * stages of A in shared memory.
- m <= 64 (skinny): BLOCK_M is m rounded up to 16 (the smallest dot), and K is split so the
  grid covers every multiprocessor at least twice; partial sums are reduced in float32.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from tileops import Kernel
from tileops.kernel import Build
from tileops.ops import GemmCall, GemmInterface, GemmOp

from .compile import cdiv, next_pow2, tuned
from .declare import CUDA_GEMM_KEYS, DEVICES, INTERPRETING, FasterRegion, deferral, dtype_refusal

KEY = "triton"

# Where Triton measured faster than tileops-cuda's GEMM on the H200: nowhere yet (tileops-cuda's
# GEMM is unmeasured, 2026-11-29), so Triton steps aside wherever a TileLang GEMM serves. A
# region added here also needs the TileLang keys in `preferred_over`.
FASTER: tuple[FasterRegion, ...] = ()


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    stages: int = 3
    warps: int = 8

    def smem(self, itemsize: int) -> int:
        return self.stages * (self.block_m + self.block_n) * self.block_k * itemsize


# (block_m, block_n, block_k, stages, warps): the tutorial's tensor-core set, best-guess first.
LARGE_16BIT = ((128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8),
               (128, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4))  # fmt: skip
LARGE_32BIT = ((128, 128, 32, 3, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
               (64, 64, 32, 4, 4))  # fmt: skip
# (block_n, block_k, split K?): split tiles cover the SMs in one launch plus a float32 sum;
# narrow unsplit tiles stream B in a single launch (fewer launches for tiny m).
SKINNY = ((64, 128, True), (128, 128, True), (64, 256, True), (128, 64, True),
          (32, 256, False), (32, 128, False), (64, 256, False))  # fmt: skip


class TritonGemm(Kernel, GemmInterface):
    """Every float16/bfloat16/float32 GEMM, any shape, on any CUDA device Triton runs on, except
    the calls a tileops-cuda GEMM serves (16-bit on sm_80 .. sm_90), where it steps aside."""

    devices = DEVICES
    supported_archs = None
    preferred_over = frozenset({"reference"})  # beside tileops-cuda: the refusal defers

    @classmethod
    def refusal(cls, call: GemmCall) -> str | None:
        return dtype_refusal(call.dtype) or deferral(GemmOp, CUDA_GEMM_KEYS, FASTER, call)

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        # m is bucketed: calls whose m rounds to the same power of two share a tuned config.
        facts = (call.arch, call.sm_count, call.smem_budget)
        identity = (min(next_pow2(call.m), 4096), call.n, call.k, call.dtype, *facts)
        return identity, lambda: cls(identity)

    def __init__(self, identity: tuple) -> None:
        self.identity = identity
        m, n, k, dtype, arch, sm_count, smem_budget = identity
        self.upcast = _upcast(dtype, arch)
        self.configs = candidates(m, n, k, dtype, sm_count, smem_budget)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        self.into(a, b, out)
        return out

    def into(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        def run(config: GemmConfig) -> None:
            gemm(config, a, b, out, upcast=self.upcast)

        run(tuned("gemm", self.identity, self.configs, run))


def candidates(
    m: int, n: int, k: int, dtype: torch.dtype, sm_count: int, smem_budget: int
) -> list[GemmConfig]:
    """The configs worth timing for this shape, rule-based default first."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if m <= 64:
        block_m = max(next_pow2(m), 16)
        found = [_skinny(block_m, bn, bk, split, m, n, k, sm_count) for bn, bk, split in SKINNY]
    else:
        table = LARGE_32BIT if itemsize == 4 else LARGE_16BIT
        found = [GemmConfig(bm, bn, bk, stages=s, warps=w) for bm, bn, bk, s, w in table]
    fitting = [c for c in found if not smem_budget or c.smem(itemsize) <= smem_budget]
    return fitting or [GemmConfig(32, 32, 32, stages=1, warps=4)]


def _skinny(
    block_m: int, bn: int, bk: int, split_k: bool, m: int, n: int, k: int, sm_count: int
) -> GemmConfig:
    tiles = cdiv(m, block_m) * cdiv(n, bn)
    split = min(next_pow2(cdiv(2 * max(sm_count, 1), tiles)), max(k // bk, 1), 16)
    split = split if split_k else 1
    return GemmConfig(block_m, bn, bk, split_k=split, group_m=1, stages=4, warps=4)


def _upcast(dtype: torch.dtype, arch: int | None) -> bool:
    """float32 operands for bfloat16 dots, which need sm_80's tensor cores."""
    return dtype == torch.bfloat16 and arch is not None and arch < 80


def gemm(
    config: GemmConfig, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, upcast: bool = False
) -> None:
    """Write a @ b into `out` ((m, k), (k, n) and (m, n) contiguous, one dtype)."""
    from . import _gemm_kernels as programs

    (m, k), n = a.shape, b.shape[1]
    if k == 0:
        out.zero_()
        return
    c = config
    split = min(c.split_k, cdiv(k, c.block_k))
    target = out if split == 1 else out.new_empty((split, m, n), dtype=torch.float32)
    grid = (cdiv(m, c.block_m) * cdiv(n, c.block_n), split)
    upcast = upcast or (INTERPRETING and a.dtype == torch.bfloat16)
    precision = "ieee" if upcast or a.dtype == torch.float32 else "tf32"
    programs.gemm[grid](
        a, b, target, m, n, k, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        GROUP_M=c.group_m, SPLIT_K=split, EVEN_K=k % (c.block_k * split) == 0, UPCAST=upcast,
        PRECISION=precision, num_stages=c.stages, num_warps=c.warps,
    )  # fmt: skip
    if split > 1:
        out.copy_(target.sum(dim=0))
