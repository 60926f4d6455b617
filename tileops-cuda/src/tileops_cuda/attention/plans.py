"""Tiles of the TileLang attention kernels, from the call and the device facts: pure arithmetic,
no tilelang. The rules' reasons are in TUNING.md (anchors named beside each constant)."""

from __future__ import annotations

from dataclasses import dataclass

from tileops.ops import AttentionCall

from .._common.arith import ITEMSIZE, ceil_div

FWD_BLOCK_M = 128  # TUNING.md#fwd-tiles: query rows per block
FWD_THREADS = 256  # TUNING.md#fwd-tiles: 8 warps, 16 rows of the 128-row tile each
FWD_STAGES_TMA = 2  # TUNING.md#stages: K and V tiles in flight with TMA (sm_90a)
CP_ASYNC_STAGES = 1  # TUNING.md#stages: with cp.async, a symbolic key count allows one
FWD_BLOCK_N = (128, 64)  # TUNING.md#fwd-tiles: key columns per step, the widest that fits
DECODE_ROWS = 64  # TUNING.md#decode-rows: query rows of one kv head packed into one tile
DECODE_MIN_ROWS = 16  # the MMA's row tile: fewer rows are padded to it
DECODE_BLOCK_N = 64  # TUNING.md#decode-split: keys per step
DECODE_THREADS = 128  # TUNING.md#decode-split: 4 warps
DECODE_BLOCKS_PER_SM = 2  # TUNING.md#decode-split: split the keys until the grid fills this
BWD_BLOCK_M = 64  # TUNING.md#bwd-tiles: keys per backward block
BWD_BLOCK_N = {64: 64, 128: 32}  # TUNING.md#bwd-tiles: queries per step, by head_dim
BWD_THREADS = 128  # TUNING.md#bwd-tiles: 4 warps
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class FwdPlan:
    """One block: `block_m` query rows of one head, `block_n` keys per pipelined step."""

    block_m: int
    block_n: int
    stages: int
    threads: int
    overlap: bool = False  # fwd_ws_program: warp-specialized, softmax beside the MMAs (sm_90a)
    pingpong: bool = False  # with overlap: the consumer warpgroups issue their MMAs in turns
    heavy_first: bool = False  # with overlap, causal: the blocks with the most keys launch first
    workers: int = 0  # with overlap, > 0: that many persistent blocks walk the query blocks


@dataclass(frozen=True)
class BwdPlan:
    """One block of the backward: `block_m` keys of one kv head, `block_n` queries a step."""

    block_m: int
    block_n: int
    threads: int


@dataclass(frozen=True)
class DecodePlan:
    """One block: the `rows` query rows (heads of a group x tokens, padded to `block_h`) of one
    kv head against one of `splits` slices of the keys, `block_n` keys per step."""

    rows: int
    block_h: int
    block_n: int
    splits: int
    stages: int
    threads: int
    tma: bool = False  # K and V tiles through TMA (sm_90a), `stages` in flight
    block_size: int | None = None  # a paged cache's slots per block; None: one row a sequence


def fwd_smem_bytes(call: AttentionCall, block_n: int, stages: int) -> int:
    """Q and the output staging tile, and `stages` K and V tiles."""
    item = ITEMSIZE[call.dtype]
    return item * call.head_dim * (2 * FWD_BLOCK_M + 2 * stages * block_n)


def fwd_plan(call: AttentionCall, tma: bool) -> FwdPlan:
    """The widest key tile whose pipeline fits the device's shared memory per block; with TMA
    (sm_90a) the warp-specialized, overlapped program (TUNING.md#fwd-overlap)."""
    stages = FWD_STAGES_TMA if tma else CP_ASYNC_STAGES
    fits = [n for n in FWD_BLOCK_N if fwd_smem_bytes(call, n, stages) <= call.smem_budget]
    block_n = fits[0] if fits else FWD_BLOCK_N[-1]
    return FwdPlan(FWD_BLOCK_M, block_n, stages, FWD_THREADS, overlap=tma)


def bwd_plan(call: AttentionCall) -> BwdPlan:
    """TUNING.md#bwd-tiles: 64 keys a block, 64 queries a step at head_dim 64 and 32 at 128."""
    return BwdPlan(BWD_BLOCK_M, BWD_BLOCK_N[call.head_dim], BWD_THREADS)


def decode_rows(call: AttentionCall) -> int:
    """Query rows one kv head serves: the heads of its group times the query tokens."""
    return call.heads // call.kv_heads * call.q_len


def decode_plan(
    call: AttentionCall,
    batch: int,
    kv_heads: int,
    blocks_per_sm: int = DECODE_BLOCKS_PER_SM,
    block_n: int = DECODE_BLOCK_N,
    tma_stages: int = 0,
) -> DecodePlan:
    """Split the keys so that batch x kv_heads x splits blocks fill the SMs (`blocks_per_sm`
    each); one split where the grid fills them already. `tma_stages` > 0: the K and V tiles
    come through TMA, that many in flight."""
    rows = decode_rows(call)
    block_h = max(DECODE_MIN_ROWS, 1 << (rows - 1).bit_length())
    blocks = max(batch * kv_heads, 1)
    splits = max(ceil_div(call.sm_count * blocks_per_sm, blocks), 1)
    stages = tma_stages or CP_ASYNC_STAGES
    return DecodePlan(rows, block_h, block_n, splits, stages, DECODE_THREADS, tma_stages > 0)
