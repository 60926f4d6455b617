"""How each BatchNorm training layout lays a channel over threads: the plan rules and their
constants. Pure arithmetic over the call spec and device facts (no tilelang, no device); each
constant's measurement is in TUNING.md, under the anchor its comment names."""

from __future__ import annotations

import dataclasses

import torch

from tileops.ops import BatchNormCall

from .._common.arith import CLUSTER_SIZES, WARP, ceil_div, pow2_ceil, vector_width
from .._common.lanes import BLOCK_REGISTER_VALUES, RowPlan, plan_smem_bytes, with_occupancy

# A thread walks its channel three times (sum, squared deviations, output); the second and
# third walks hit L1. Beyond 32 values a thread's serial walk outlasts a block's reduction.
THREAD_VALUES = 32
THREAD_CHANNEL_THREADS = 128  # 4 warps: 32 adjacent channels per warp, adjacent addresses
# block_channel holds channels of up to one block's registers' worth of values.
REGISTER_CHANNEL_MAX = BLOCK_REGISTER_VALUES
# Tiled beats split once C blocks give about two to every SM, or from half the SMs while a
# channel holds fewer than 2^17 values (TUNING.md#split-or-tiled).
TILED_BLOCKS_PER_SM = 1.9
SPLIT_MIN_VALUES = 1 << 17
# Split layout: aim for this many blocks per multiprocessor (a short tail: the last wave is at
# most a quarter of the work), each thread streaming at least MIN_VECTORS_PER_THREAD vectors
# (loads in flight), chunks rounded to powers of two so batch sizes share builds.
SPLIT_BLOCKS_PER_SM = 8
MIN_VECTORS_PER_THREAD = 4
SPLIT_THREADS = 256
# The fallback streams a whole channel through one block: the most loads in flight per SM.
TILED_THREADS = 512
# smem_channel: a channel in one block's shared memory, as smem_row holds a row
# (TUNING.md#smem-channel).
SMEM_CHANNEL_THREADS = 512
# A cluster's parts of a channel keep at most 64 KB each, three blocks an SM
# (TUNING.md#cluster-channel).
PART_BYTES = 64 * 1024
# Channels in 16 parts of more than PART_BYTES: 16 plain blocks of 1024 threads meeting in L2
# (TUNING.md#group-channel).
GROUP_CHANNEL_PARTS = 16
GROUP_CHANNEL_THREADS = 1024
# block_channel: 256 lanes (128 up to 1024 values) of up to 32 values in registers; longer
# channels wait in shared memory for 512 lanes (TUNING.md#block-channel).
BLOCK_LANES = 256
SHORT_CHANNEL_VALUES = 1024  # held by 4 warps instead
BLOCK_LANE_VALUES = 32
BLOCK_SMEM_LANES = 512
# Inference: each thread normalizes INFER_VECTORS vectors (independent loads in flight).
INFER_THREADS = 256
INFER_VECTORS = 4
PARTIAL_FIELDS = 3  # count, mean, M2 of one split's values
SUM_FIELDS = 4  # a thread's count, shift, sum of (x - shift) and of its squares


def param_dtype(call: BatchNormCall) -> torch.dtype:
    """The per-channel tensors' dtype (x's when none is given: then nothing reads them)."""
    return call.param_dtype or call.dtype


def values_per_channel(call: BatchNormCall) -> int:
    return call.batch * call.spatial


def block_channel_plan(call: BatchNormCall) -> RowPlan:
    """Registers of BLOCK_LANES lanes (4 warps up to SHORT_CHANNEL_VALUES) while a lane keeps
    at most BLOCK_LANE_VALUES values, else shared memory for BLOCK_SMEM_LANES lanes; residency
    from registers or shared memory."""
    vec = vector_width(call.spatial, call.dtype)
    n = values_per_channel(call)
    if n > BLOCK_LANES * BLOCK_LANE_VALUES:
        plan = RowPlan("shared", 1, BLOCK_SMEM_LANES, vec, ceil_div(n // vec, BLOCK_SMEM_LANES))
        return with_occupancy(plan, call)
    lanes = BLOCK_LANES if n > SHORT_CHANNEL_VALUES else 4 * WARP
    return with_occupancy(RowPlan("registers", 1, lanes, vec, ceil_div(n // vec, lanes)), call)


def smem_channel_plan(call: BatchNormCall) -> RowPlan:
    """SMEM_CHANNEL_THREADS lanes walking the channel's vectors; residency from shared memory."""
    vec = vector_width(call.spatial, call.dtype)
    chunks = ceil_div(values_per_channel(call) // vec, SMEM_CHANNEL_THREADS)
    return with_occupancy(RowPlan("shared", 1, SMEM_CHANNEL_THREADS, vec, chunks), call)


def cluster_channel_plan(call: BatchNormCall) -> RowPlan | None:
    """The smallest cluster (CLUSTER_SIZES) of SMEM_CHANNEL_THREADS-thread blocks whose parts of
    the channel fit PART_BYTES (three blocks per multiprocessor), else half the shared-memory
    budget (two); None when 16 parts do not fit."""
    vec = vector_width(call.spatial, call.dtype)
    vectors = values_per_channel(call) // vec
    for limit in (PART_BYTES, call.smem_budget // 2):
        for size in CLUSTER_SIZES:
            chunks = ceil_div(vectors, size * SMEM_CHANNEL_THREADS)
            plan = RowPlan("shared", 1, SMEM_CHANNEL_THREADS, vec, chunks, cluster=size)
            if plan_smem_bytes(plan, call.dtype) <= limit:
                return with_occupancy(plan, call)
    return None


def group_channel_plan(call: BatchNormCall) -> RowPlan:
    """cluster_channel_plan's parts for GROUP_CHANNEL_THREADS threads each, where the parts
    still fit half the shared-memory budget (else its own threads)."""
    plan = cluster_channel_plan(call)
    chunks = ceil_div(values_per_channel(call) // plan.vec, plan.cluster * GROUP_CHANNEL_THREADS)
    wide = dataclasses.replace(plan, lanes=GROUP_CHANNEL_THREADS, chunks=chunks)
    if plan_smem_bytes(wide, call.dtype) > call.smem_budget // 2:
        return plan
    return with_occupancy(wide, call)


def in_large_parts(plan: RowPlan, dtype: torch.dtype) -> bool:
    """Whether a channel's parts are group_channel's: 16 of more than PART_BYTES."""
    large = plan_smem_bytes(plan, dtype) > PART_BYTES
    return large and plan.cluster >= GROUP_CHANNEL_PARTS


def split_chunk_vectors(call: BatchNormCall) -> int:
    """Vectors of one channel each split covers: enough splits that C x splits blocks give
    every multiprocessor SPLIT_BLOCKS_PER_SM of them, a power of two (batch sizes within a
    factor of two share a build), at least MIN_VECTORS_PER_THREAD per thread."""
    vectors = values_per_channel(call) // vector_width(call.spatial, call.dtype)
    splits = ceil_div(SPLIT_BLOCKS_PER_SM * call.sm_count, call.channels)
    chunk = pow2_ceil(ceil_div(vectors, splits))
    return max(chunk, SPLIT_THREADS * MIN_VECTORS_PER_THREAD)
