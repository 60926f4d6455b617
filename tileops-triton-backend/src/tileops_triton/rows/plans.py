"""The launch rule of the row programs (LayerNorm, RMSNorm, softmax), from n, family and dtype.

Rows up to FUSED_MAX elements are held whole in registers (one read, one write per element);
longer rows loop over LOOP_CHUNK-wide slices with the re-read served (in part) by L2, since a
single block would need more registers than a multiprocessor has. Short rows are packed
SHORT_TILE elements to a program. Every table here was measured on an NVIDIA H200: TUNING.md
gives each one's rule, date, commit and result file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compile import cdiv, next_pow2

FUSED_MAX = 32768  # TUNING.md#fused-rows
SHORT_TILE = 2048  # TUNING.md#fused-rows
# Fused rows (TUNING.md#fused-rows): row block -> warps; other blocks take 4.
FUSED_WARPS = {2048: 4, 4096: 8, 8192: 4, 16384: 16, 32768: 32}
# Where one family measured other warps (TUNING.md#family-warps): row block -> warps.
FAMILY_FUSED_WARPS = {"rms_norm": {16384: 8}, "softmax": {8192: 16, 16384: 32}}
# Fused reads with `evict_first` rather than `.ca` (TUNING.md#uncached-reads): row blocks.
FAMILY_UNCACHED = {"rms_norm": {16384}}
# bfloat16 rows held as loaded (TUNING.md#held-rows): row block -> (warps, register cap).
HELD = {"layer_norm": {16384: (8, 80), 32768: (32, 32)},
        "rms_norm": {4096: (8, 80), 8192: (8, 80), 16384: (8, 80), 32768: (32, 32)},
        "softmax": {32768: (32, 32)}}  # fmt: skip
LOOP_CHUNK = 4096  # TUNING.md#looped-rows
LOOP_WARPS = 16  # TUNING.md#looped-rows
# float32 rows looped in two passes (TUNING.md#float32-looped-rows): block -> (chunk, warps).
FLOAT32_LOOPED = {"rms_norm": {4096: (2048, 16)}}


@dataclass(frozen=True)
class RowPlan:
    """One launch shape: fused tiles of `rows` x `block`, or looped `block`-wide slices; `held`:
    one row per program, kept as loaded between its uses, registers capped at `maxnreg` per
    thread."""

    fused: bool
    block: int
    rows: int
    warps: int
    cached: bool = True  # the fused read through L1 (`.ca`), else `evict_first` (RMSNorm only)
    held: bool = False
    maxnreg: int | None = None

    def grid(self, rows: int) -> tuple[int]:
        return (cdiv(rows, self.rows),)


def row_plan(n: int, family: str, dtype: torch.dtype) -> RowPlan:
    """The launch shape for rows of length n (any n >= 1) of `family` ("layer_norm",
    "rms_norm" or "softmax") in `dtype`."""
    block = next_pow2(n)
    if block > FUSED_MAX:
        return RowPlan(fused=False, block=LOOP_CHUNK, rows=1, warps=LOOP_WARPS)
    looped = FLOAT32_LOOPED.get(family, {}).get(block) if dtype == torch.float32 else None
    if looped:
        return RowPlan(fused=False, block=looped[0], rows=1, warps=looped[1])
    held = HELD.get(family, {}).get(block) if dtype == torch.bfloat16 else None
    if held:
        return RowPlan(fused=True, block=block, rows=1, warps=held[0], held=True, maxnreg=held[1])
    rows = max(SHORT_TILE // block, 1)
    warps = FAMILY_FUSED_WARPS.get(family, {}).get(block, FUSED_WARPS.get(block, 4))
    cached = block not in FAMILY_UNCACHED.get(family, ())
    return RowPlan(fused=True, block=block, rows=rows, warps=warps, cached=cached)
