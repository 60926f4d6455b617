"""How a row of `n` elements maps onto threads in each layout: the plan rules and their constants.

Pure arithmetic over the call spec and device facts: importing this touches neither tilelang
nor a device. Every layout gives a row to `lanes` threads; each lane handles `chunks` vectors of
`vec` elements, the vectors of one chunk adjacent across lanes (coalesced). Each constant's
measurement is in TUNING.md, under the anchor its comment names.
"""

from __future__ import annotations

import torch

from .._common.arith import (
    CLUSTER_ARCHS,
    CLUSTER_SIZES,
    ITEMSIZE,
    MAX_THREADS,
    VECTOR_BYTES,
    WARP,
    ceil_div,
    pow2_ceil,
    vector_width,
)
from .._common.lanes import BLOCK_REGISTER_VALUES, RowPlan, plan_smem_bytes
from .._common.lanes import with_occupancy as with_occupancy  # every plan's residency rule

# Threads of a block that holds several short rows: 8 warps keep an SM's schedulers fed while
# leaving room for 8 such blocks per SM (2048 threads).
SHORT_BLOCK_THREADS = 256
# A warp holds a short row when every lane keeps at most 32 elements (two 16-byte vectors of
# float32, four of 16-bit types): beyond that one block per row has more lanes to spread over.
SHORT_ROW_MAX = WARP * 32
REGISTER_ROW_MAX = BLOCK_REGISTER_VALUES
# 32-bit rows stay in registers up to twice as long: 512 lanes of 64 values (TUNING.md#regions).
WIDE_REGISTER_ROW_MAX = 2 * REGISTER_ROW_MAX
# block_row: up to 8 vectors a lane, at least 8 warps a block (TUNING.md#block-row).
BLOCK_ROW_VECTORS = 8
BLOCK_ROW_MIN_THREADS = 8 * WARP
# 32-bit rows take as few as 4 warps (TUNING.md#block-row-32-bit).
WIDE_BLOCK_ROW_MIN_THREADS = 4 * WARP
# Threads one long row gets (smem_row, stream_row): the most loads in flight for one SM.
LONG_ROW_THREADS = 1024
# smem_row: rows of up to 64 KB take 256 threads, three blocks an SM (TUNING.md#smem-row).
SMALL_SMEM_ROW_BYTES = 64 * 1024
SMALL_SMEM_ROW_THREADS = 256
# cluster_row: 512-thread blocks keep slices of up to 64 KB, three an SM, in clusters of up to
# 16; longer rows take 8 blocks of 1024 threads, one an SM (TUNING.md#cluster-row).
CLUSTER_THREADS = 512
CLUSTER_SLICE_BYTES = 64 * 1024
CLUSTER_LONE_SIZE = 8
CLUSTER_LONE_BLOCK_THREADS = MAX_THREADS
# 32-bit rows of up to 256 KB: 32 KB slices of 256 threads brought by TMA
# (TUNING.md#cluster-row-tma).
BULK_ROW_BYTES = 256 * 1024
BULK_SLICE_BYTES = 32 * 1024
BULK_THREADS = 256
# Partials exchanged in shared memory on clusters of up to 8 blocks, or of blocks of up to 256
# threads (TUNING.md#cluster-row-dsmem).
DSMEM_CLUSTER_MAX = 8
DSMEM_WIDE_CLUSTER_THREADS = 256
# smem_row beat cluster_row on rows of up to this many bytes: cluster_row starts beyond
# (a family may differ: ClusterRow.smem_row_over_cluster_bytes; TUNING.md#regions).
SMEM_ROW_OVER_CLUSTER_BYTES = 64 * 1024


def warp_rows_plan(n: int, dtype: torch.dtype) -> RowPlan:
    """Just enough lanes (at most a warp) that each keeps one to four vectors; the rest of
    the block's threads take further rows."""
    vec = vector_width(n, dtype)
    lanes = min(WARP, pow2_ceil(ceil_div(n, vec)))
    return RowPlan("registers", SHORT_BLOCK_THREADS // lanes, lanes, vec, ceil_div(n, lanes * vec))


def block_row_plan(n: int, dtype: torch.dtype, threads: int | None = None) -> RowPlan:
    """`threads` lanes if given, else the fewest threads (at least BLOCK_ROW_MIN_THREADS,
    WIDE_BLOCK_ROW_MIN_THREADS for 32-bit rows) that keep at most BLOCK_ROW_VECTORS vectors
    each, twice as many beyond REGISTER_ROW_MAX (TUNING.md#wide-block-row)."""
    vec = vector_width(n, dtype)
    vectors = BLOCK_ROW_VECTORS if n <= REGISTER_ROW_MAX else 2 * BLOCK_ROW_VECTORS
    fewest = pow2_ceil(ceil_div(ceil_div(n, vec), vectors))
    least = WIDE_BLOCK_ROW_MIN_THREADS if ITEMSIZE[dtype] == 4 else BLOCK_ROW_MIN_THREADS
    lanes = threads or min(MAX_THREADS, max(least, fewest))
    return RowPlan("registers", 1, lanes, vec, ceil_div(n, lanes * vec))


def long_row_plan(n: int, dtype: torch.dtype, hold: str) -> RowPlan:
    """A whole block per long row: the most loads in flight for one SM's share of bandwidth,
    except small smem_row rows, whose blocks share an SM (SMALL_SMEM_ROW_BYTES)."""
    vec = vector_width(n, dtype)
    small = hold == "shared" and n * ITEMSIZE[dtype] <= SMALL_SMEM_ROW_BYTES
    lanes = SMALL_SMEM_ROW_THREADS if small else LONG_ROW_THREADS
    return RowPlan(hold, 1, lanes, vec, ceil_div(n, lanes * vec))


def cluster_row_plan(
    n: int,
    dtype: torch.dtype,
    smem_budget: int,
    threads: int = CLUSTER_THREADS,
    slice_bytes: int = CLUSTER_SLICE_BYTES,
) -> RowPlan | None:
    """The smallest cluster of `threads`-thread blocks whose slices fit `slice_bytes`, else
    CLUSTER_LONE_SIZE blocks of CLUSTER_LONE_BLOCK_THREADS threads if their slices fit the
    budget; None when no cluster holds the row."""
    vec = vector_width(n, dtype)
    for size in CLUSTER_SIZES:
        chunks = ceil_div(n, size * threads * vec)
        plan = RowPlan("shared", 1, threads, vec, chunks, cluster=size)
        if plan.slice * ITEMSIZE[dtype] <= slice_bytes:
            return plan
    lanes = CLUSTER_LONE_BLOCK_THREADS
    chunks = ceil_div(n, CLUSTER_LONE_SIZE * lanes * vec)
    plan = RowPlan("shared", 1, lanes, vec, chunks, cluster=CLUSTER_LONE_SIZE)
    return plan if plan_smem_bytes(plan, dtype) <= smem_budget else None


def bulk_eligible(plan: RowPlan, n: int, dtype: torch.dtype, arch: int) -> bool:
    """Whether TMA can bring `plan`'s slices: sm_90, a shared-memory plan covering the row
    exactly (no slice past its end) with 16-byte vectors (rows 16-byte aligned, as TMA needs)."""
    return (
        arch in CLUSTER_ARCHS
        and plan.hold == "shared"
        and plan.padded == n
        and plan.vec * ITEMSIZE[dtype] == VECTOR_BYTES
    )


def smem_bytes(n: int, dtype: torch.dtype) -> int:
    """Shared memory a smem_row block needs for a row of n elements."""
    return plan_smem_bytes(long_row_plan(n, dtype, "shared"), dtype)


def register_row_max(dtype: torch.dtype) -> int:
    """The longest row block_row keeps in registers (TUNING.md#regions)."""
    return WIDE_REGISTER_ROW_MAX if ITEMSIZE[dtype] == 4 else REGISTER_ROW_MAX
