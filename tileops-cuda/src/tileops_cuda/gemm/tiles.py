"""How each GEMM kernel tiles C: the tile rules over the device facts and their constants.

Pure arithmetic (no tilelang, no device); each constant's measurement is in TUNING.md, under
the anchor its comment names (the H200 sweeps of benchmarks/sweeps/gemm_tiles_h200.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tileops.ops import GemmCall

from .._common.arith import ceil_div, pow2_ceil

HALF = {torch.float16: 2, torch.bfloat16: 2}
# TMA (cp.async.bulk.tensor) needs 16-byte aligned row strides: 8 elements of a 16-bit type.
TMA_ALIGN_BYTES = 16
# The largest m the skinny kernel serves: one row tile of at most 64 (a decode batch).
SKINNY_M = 64
# Shared memory a block keeps beside its pipeline stages (mbarriers, the compiler's scratch).
SMEM_RESERVE = 2048
MIN_STAGES, MAX_STAGES = 2, 4
# Skinny: one block per SM of 64 x 64 weight tiles, at least 4 k tiles a split
# (TUNING.md#skinny-split).
SKINNY_BLOCKS_PER_SM = 1
MIN_K_TILES_PER_SPLIT = 4
# Up to this m the last block of a column tile sums a split k (TUNING.md#skinny-fixup).
SKINNY_FIXUP_MAX_M = 1


@dataclass(frozen=True)
class Tile:
    """One block's tile: block_m x block_n of C, block_k deep per pipeline stage; `policy`
    names TileLang's GemmWarpPolicy (how the warps split the tile); `smem_epilogue` stages C
    through shared memory (one bulk store, TMA on sm_90a) instead of each thread storing its
    fragment."""

    block_m: int
    block_n: int
    block_k: int
    threads: int
    stages: int = MIN_STAGES
    policy: str = "Square"
    smem_epilogue: bool = False

    def stage_bytes(self, itemsize: int) -> int:
        return (self.block_m + self.block_n) * self.block_k * itemsize

    def epilogue_bytes(self, itemsize: int) -> int:
        return self.block_m * self.block_n * itemsize if self.smem_epilogue else 0


# Candidate tiles, largest first; the rule takes the first whose tiles fill the device.
# Hopper: 128-row tiles run two consumer warpgroups (64 rows each, one wgmma m64nNk16 apiece);
# TileLang adds a producer warpgroup that issues the TMA loads. 64-deep k: a 128-byte row.
# FullRow warp policy and C stored from shared memory (TUNING.md#hopper-tiles).
HOPPER_TILES = (
    Tile(128, 256, 64, 256, policy="FullRow", smem_epilogue=True),
    Tile(128, 128, 64, 256, policy="FullRow", smem_epilogue=True),
    Tile(64, 128, 64, 128, policy="FullRow"),
)
# sm_80 style (mma.sync + cp.async): TileLang's Ampere example tiles, 32-deep k.
GENERAL_TILES = (Tile(128, 256, 32, 256), Tile(128, 128, 32, 128), Tile(64, 64, 32, 128))
# Skinny: narrow columns (more blocks along n), deep k (long weight streams per stage).
SKINNY_BLOCK_N, SKINNY_BLOCK_K, SKINNY_THREADS = 64, 64, 128
# Decode on the Hopper kernel (m <= SKINNY_M): one 64-row tile (a warpgroup's wgmma), k unsplit
# and a deep TMA pipeline of 128-deep stages, the narrowest column tile of DECODE_BLOCK_NS whose
# tiles fit one wave; from m = 48 it beats the split-K kernel (TUNING.md#hopper-decode).
DECODE_HOPPER_M = 48
DECODE_BLOCK_NS = (64, 128)
DECODE_BLOCK_K = 128
DECODE_MAX_STAGES = 6
# Misaligned calls are padded for TMA from 2^36 flops (TUNING.md#hopper-padding).
PAD_MIN_FLOPS = 1 << 36


def pick_tile(call: GemmCall, candidates: tuple[Tile, ...]) -> Tile:
    """The largest candidate whose tiles of C give every multiprocessor a block (one full wave),
    else the smallest; stages: as many as the shared-memory budget holds, 2 to 4."""
    tile = next((t for t in candidates if _tiles(call, t) >= call.sm_count), candidates[-1])
    return _with_stages(tile, call, ceil_div(call.k, tile.block_k))


def _tiles(call: GemmCall, tile: Tile) -> int:
    return ceil_div(call.m, tile.block_m) * ceil_div(call.n, tile.block_n)


def _with_stages(tile: Tile, call: GemmCall, k_tiles: int, most: int = MAX_STAGES) -> Tile:
    itemsize = HALF[call.dtype]
    room = call.smem_budget - SMEM_RESERVE - tile.epilogue_bytes(itemsize)
    fit = room // tile.stage_bytes(itemsize)
    stages = max(MIN_STAGES, min(most, fit, k_tiles))
    return replace(tile, stages=stages)


def decode_tile(call: GemmCall) -> Tile:
    """The Hopper kernel's tile for m <= SKINNY_M: 64 rows, the narrowest column tile whose
    tiles fit one wave (the most blocks streaming the weight, none waiting), up to
    DECODE_MAX_STAGES stages of DECODE_BLOCK_K."""
    fits = [bn for bn in DECODE_BLOCK_NS if ceil_div(call.n, bn) <= call.sm_count]
    block_n = fits[0] if fits else DECODE_BLOCK_NS[-1]
    tile = Tile(64, block_n, DECODE_BLOCK_K, 128, policy="FullRow")
    return _with_stages(tile, call, ceil_div(call.k, DECODE_BLOCK_K), DECODE_MAX_STAGES)


def misaligned(call: GemmCall) -> list[str]:
    """The sizes ("n=4095") that are not a multiple of 8 (16-bit) among those that set a row
    pitch TMA reads or writes: n (C's rows, and b's when not transposed), k (a's rows, or b's
    when transposed) and, when a is stored transposed, m (its rows)."""
    align = TMA_ALIGN_BYTES // HALF.get(call.dtype, 2)
    sizes = {"m": call.m} if call.trans_a else {}
    sizes |= {"n": call.n, "k": call.k}
    return [f"{name}={size}" for name, size in sizes.items() if size % align]


def tma_misaligned(call: GemmCall) -> bool:
    """Some row pitch TMA would use is not 16-byte aligned (`misaligned`)."""
    return bool(misaligned(call))


@dataclass(frozen=True)
class SkinnyPlan:
    """Skinny tiling: row tile block_m (m's bucket), `splits` slices of `k_tiles` k tiles.
    `fixup`: one launch for a split k, the last block of each column tile to finish summing
    the partials (a counter per column tile tells it), instead of a second kernel."""

    tile: Tile
    splits: int
    k_tiles: int
    fixup: bool = False


def skinny_plan(
    call: GemmCall,
    block_n: int = SKINNY_BLOCK_N,
    block_k: int = SKINNY_BLOCK_K,
    blocks_per_sm: float = SKINNY_BLOCKS_PER_SM,
) -> SkinnyPlan:
    """Row tile: m rounded up to a power of two, at least 16 (the mma's rows). Split k so that
    column tiles x splits reach `blocks_per_sm` blocks per multiprocessor, keeping at least
    MIN_K_TILES_PER_SPLIT k tiles per split; no split is left empty."""
    block_m = max(16, pow2_ceil(call.m))
    columns = ceil_div(call.n, block_n)
    k_tiles = ceil_div(call.k, block_k)
    wanted = ceil_div(blocks_per_sm * call.sm_count, columns)
    splits = max(1, min(wanted, k_tiles // MIN_K_TILES_PER_SPLIT))
    per_split = ceil_div(k_tiles, splits)
    tile = Tile(block_m, block_n, block_k, SKINNY_THREADS)
    splits = ceil_div(k_tiles, per_split)
    fixup = splits > 1 and call.m <= SKINNY_FIXUP_MAX_M
    return SkinnyPlan(_with_stages(tile, call, per_split), splits, per_split, fixup)
