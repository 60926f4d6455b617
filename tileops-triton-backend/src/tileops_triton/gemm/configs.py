"""The candidate launch configs of the Triton GEMM, from a rule over the shape and the device
facts, listed best-guess first (which is also what the interpreter runs); on a GPU
`compile.tuned` times them once per build identity (TUNING.md#candidates).
- m > 64: large tiles from the Triton matmul tutorial's Hopper/Ampere set; the tensor cores
  need BLOCK_K * BLOCK_N * stages of B and BLOCK_M * BLOCK_K * stages of A in shared memory.
- m <= 64 (skinny): BLOCK_M is m rounded up to 16 (the smallest dot), and K is split so the
  grid covers every multiprocessor at least twice; partial sums are reduced in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compile import cdiv, next_pow2


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
