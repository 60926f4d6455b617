"""The launcher of the GEMM program (imported on first launch: it imports triton)."""

from __future__ import annotations

import torch

from ..compile import cdiv
from ..declare import INTERPRETING
from .configs import GemmConfig


def gemm(
    config: GemmConfig, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, upcast: bool = False
) -> None:
    """Write a @ b into `out` ((m, k), (k, n) and (m, n) contiguous, one dtype)."""
    from . import programs

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
