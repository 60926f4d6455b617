"""The launch rule of the row-wise kernels (LayerNorm, RMSNorm, softmax), from n.

Rows up to FUSED_MAX elements are held whole in registers (one read, one write per element);
longer rows loop over LOOP_CHUNK-wide slices with the re-read served (in part) by L2, since a
single block would need more registers than a multiprocessor has. Short rows are packed
SHORT_TILE elements to a program. The table is measured on an NVIDIA H200 on 2026-11-29 with
Triton 3.6: LayerNorm bf16 over 2**26 elements, every (rows, warps) of a fused tile and every
(chunk, warps) of a looped row, as a fraction of the device-to-device copy bandwidth (about
3.95 TB/s); RMSNorm and softmax were within a few points with the same plans. A persistent
grid (1 or 2 programs per SM striding over rows) and prefetching 3 slices ahead both measured
slower for the looped rows (0.42-0.66 at 16K-64K), so neither is used.

| row block | plan                   | copy fraction | next best                       |
|-----------|------------------------|---------------|---------------------------------|
| <= 1024   | 2048-element tile, 4 w | 0.98 (1024)   | 1 row, 4 warps: 0.92            |
| 2048      | 1 row, 4 warps         | 0.99          | 2 rows, 8 warps: 0.96           |
| 4096      | 1 row, 8 warps         | 0.95          | 1 row, 4 warps: 0.94            |
| 8192      | 1 row, 4 warps         | 0.96          | 2 rows, 8 warps: 0.94           |
| 16384     | 1 row, 16 warps        | 0.87          | looped 4096, 16 warps: 0.61-0.73 |
| 32768     | looped 4096, 16 warps  | 0.65-0.72     | fused, 16 or 32 warps: 0.73     |
| 65536     | looped 4096, 16 warps  | 0.61-0.65     | looped 8192, 16 warps: 0.64-0.65 |

A second sweep of all three ops (row_plans_smem_row_triton_nvidia_h200.md, bf16, same day)
moved two plans: at 32768 the fused row with 32 warps matched the looped one for LayerNorm
(0.73 / 0.74) and beat it for RMSNorm (0.84 / 0.79) and softmax (0.72 / 0.69); at 16384
RMSNorm ran 0.95 with 8 warps against 0.75 with 16 (LayerNorm 0.88 / 0.87, softmax 0.81 /
0.90), so RMSNorm takes 8 there.

bfloat16 norms at 16K and 32K (RMSNorm from 4K) keep the row as loaded between its uses
(RowPlan.held), with registers capped so that two or three programs share a multiprocessor
(benchmarks/results/row_plans_triton_held_nvidia_h200.md, 2026-11-29; an earlier run within 1.5
points, where Liger reached LayerNorm 0.62 / 0.23 and RMSNorm 0.96 / 0.83 at 16K / 32K):

| row   | LayerNorm held / fused          | RMSNorm held / fused            |
|-------|---------------------------------|---------------------------------|
| 4096  | -                               | 0.98 (8 w, 80 regs) / 0.96      |
| 8192  | -                               | 0.97 (8 w, 80 regs) / 0.96      |
| 16384 | 0.93 (8 w, 80 regs) / 0.88      | 0.96 (8 w, 80 regs) / 0.92      |
| 32768 | 0.84 (32 w, 32 regs) / 0.75     | 0.96 (32 w, 32 regs) / 0.88     |

The held LayerNorm now sums (d, d^2) in one reduction; rerun on 2026-11-30
(row_plans_triton_held_one_reduction_nvidia_h200.md): 0.92 / 0.88 at 16K, 0.80 / 0.77 at 32K,
within this sweep's run-to-run spread of the table. A held softmax with its max and its sum as two
reductions gained nothing (0.92 / 0.92 at 16K, 0.74 / 0.76 at 32K, the earlier run). Merging
(max, sum) pairs in one reduction (_softmax_kernels.softmax_held) wins at 32K only: 0.78 / 0.75
and 0.77 / 0.75 (32 w, 32 regs against fused 32 warps) in two runs of 2026-11-30
(row_plans_triton_held_one_reduction_*, row_plans_triton_softmax_held_32k_*), while at 16K it
trailed (0.85 / 0.92).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .compile import cdiv, next_pow2

FUSED_MAX = 32768
SHORT_TILE = 2048
FUSED_WARPS = {2048: 4, 4096: 8, 8192: 4, 16384: 16, 32768: 32}  # row block -> warps; else 4
# Where one family measured otherwise: softmax with `.ca` loads, 16 warps at 8192 (97.9% of copy
# against 97.2 with 8) and 32 at 16384 (91.7 against 90.8 with 16), triton_softmax_variants.
FAMILY_FUSED_WARPS = {"rms_norm": {16384: 8}, "softmax": {8192: 16, 16384: 32}}
# RMSNorm's 16K row (8 warps) keeps the `evict_first` read it was swept with (95% of copy): with
# `.ca` it ran 78% in the next norms run (e58885f) and compiles to 127 registers against 110,
# while `.ca` lifted its 4K, 8K and 32K rows by 4-6 points.
FAMILY_UNCACHED = {"rms_norm": {16384}}
# bfloat16 rows held as loaded: row block -> (warps, register cap), by family (table above).
HELD = {"layer_norm": {16384: (8, 80), 32768: (32, 32)},
        "rms_norm": {4096: (8, 80), 8192: (8, 80), 16384: (8, 80), 32768: (32, 32)},
        "softmax": {32768: (32, 32)}}  # fmt: skip
LOOP_CHUNK = 4096
LOOP_WARPS = 16
# float32 RMSNorm rows of 4K loop over 2048-element slices with 16 warps, torch.compile's own
# two-pass shape (the second read served by the caches): 101.3% of copy, and 100.5 with
# 1024-element slices, against 97.2 for the fused row
# (row_plans_stream_row_block_row_triton_nvidia_h200.md, 2026-11-30). row block -> (chunk, warps)
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
