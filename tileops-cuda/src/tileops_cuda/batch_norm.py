"""BatchNorm forward kernels in TileLang: seven training layouts and one inference kernel.

x arrives as a contiguous (batch, channels, spatial) tensor, so one channel's n = batch * spatial
values are `batch` runs of `spatial` contiguous elements, `channels * spatial` apart. Every
kernel reads them as vectors of `vec` elements, the widest of at most 16 bytes that divides
`spatial` (a vector never straddles two runs and stays aligned). Statistics are float32: two
passes (mean, then squared deviations) where a channel is held, Welford/Chan merges of
(count, mean, M2) where it is streamed; never E[x^2] - E[x]^2.

Which training layout serves a call (n = batch * spatial values per channel, C channels):

| key                        | channel held in        | blocks     | owns                       |
|----------------------------|------------------------|------------|----------------------------|
| tilelang_bn_thread_channel | one thread (L1)        | C / 128    | n <= THREAD_VALUES (32)    |
| tilelang_bn_block_channel  | registers (n <= 8192)  | C          | 32 < n <= REGISTER_ROW_MAX |
|                            | or smem of one block   |            |                            |
| tilelang_bn_smem_channel   | shared memory of one   | C          | longer n, in one block's   |
|                            | block                  |            | smem; 2 C >= SMs           |
| tilelang_bn_cluster_channel| shared memory of a     | C x 2..16  | sm_90: longer n, in 16     |
|                            | cluster's blocks       |            | blocks' smem, parts <= 64KB|
| tilelang_bn_group_channel  | shared memory of 16    | C x 16     | sm_90: 16 parts of more    |
|                            | blocks meeting in L2   |            | than 64 KB                 |
| tilelang_bn_split_channel  | nowhere: two kernels   | C x splits | longer n, C < ~2 x SMs     |
| tilelang_bn_tiled          | nowhere: tiles stream  | C          | every call (the fallback)  |

All but tiled are preferred over it, which serves what they refuse: long channels on a device
that C blocks already fill twice over; on sm_90 cluster_channel and group_channel (which split
the channels held in parts between them by the parts' size) are preferred over smem_channel and
split_channel too. Held channels (registers, shared memory) are read from DRAM once; split and
tiled read them twice. Inference reads the running statistics: one pass, one kernel
(`tilelang_bn_infer`).

Symbolic vs baked: channels and spatial are the layer's shape and are baked in (they fix the
vector width and the index arithmetic); batch is symbolic (one build serves every batch size),
except in the held layouts (block, smem, cluster and group channel), whose layout is sized by n.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import Kernel
from tileops.kernel import Build
from tileops.ops import BatchNormCall, BatchNormInferInterface, BatchNormTrainInterface

from .compile import build_program
from .operands import aligned
from .rows import (
    AMPERE_AND_LATER,
    CLUSTER_ARCHS,
    CLUSTER_SIZES,
    CLUSTER_SLICE_BYTES,
    DTYPE_NAMES,
    ITEMSIZE,
    REGISTER_ROW_MAX,
    WARP,
    RowPlan,
    plan_smem_bytes,
    vector_width,
    with_occupancy,
)

# A thread walks its channel three times (sum, squared deviations, output); the second and
# third walks hit L1. Beyond 32 values a thread's serial walk outlasts a block's reduction.
THREAD_VALUES = 32
THREAD_CHANNEL_THREADS = 128  # 4 warps: 32 adjacent channels per warp, adjacent addresses
# Split or tiled, measured on the H200 (batchnorm_gemm_nvidia_h200.md as of commit 8b86f1d):
# tiled's one block per channel wins once its C blocks give about two to every multiprocessor
# (C = 256 on 132: 64-68% of copy against split's 50-66%); with one or fewer per
# multiprocessor (C between half and TILED_BLOCKS_PER_SM x SMs), it wins only while a channel
# holds fewer than SPLIT_MIN_VALUES (C = 128 at 100K values: tiled 53%, split 44%; at 200K:
# split 54%, tiled 48%); below half the multiprocessors, splitting always wins.
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
# smem_channel: a channel in one block's shared memory, as smem_row holds a row. Even alone on
# its SM (200 KB) it beat streaming the channel twice on the H200 (results/batch_norm/bn_layouts and
# batchnorm_gemm, 2026-11-29, % of copy on three passes' bytes): 68 against tiled's 61 at
# 32x256x56x56 bf16, 67 against 51 at 32x128x56x56; two or three per SM, 53-78 against 38-65.
SMEM_CHANNEL_THREADS = 512
# Clusters of 16 blocks of 100 KB run 14 at a time on the H200 (224 of its 264 slots: a cluster
# stays in one GPC), 8 blocks 30 (240), 2 blocks every slot
# (results/batch_norm/cluster_placement_nvidia_h200.txt). Where the channel takes 16 parts of
# more than CLUSTER_SLICE_BYTES (two blocks per SM), plain blocks of 1024 threads meeting in L2
# (group_channel) beat the cluster (kernel times, bf16, same run: 328 against 365 us at
# 256x256x3136, 171 / 189 at 256x128x3136, 91 / 99 at 256x64x3136); with parts of up to 64 KB
# the cluster won (42 against 48-62 us at 32x64x12544; 2-8 parts: by 1-30%, the wait for parts
# that start later; results/batch_norm/bn_parts_nvidia_h200.md).
GROUP_CHANNEL_PARTS = 16
GROUP_CHANNEL_THREADS = 1024
# block_channel: one block of BLOCK_LANES threads (fewer for short channels) holds the channel
# in registers up to BLOCK_LANE_VALUES values a lane; longer channels wait in shared memory (x's
# dtype) for BLOCK_SMEM_LANES threads, which leaves registers for four blocks per SM instead of
# two. Measured against the earlier rule (up to 1024 lanes of 16 values, in registers), kernel
# times, bf16: 7.4 against 9.5 us at 32x512x196, 5.6 / 5.7 at 32x256x196, 5.3 / 5.5 at
# 32x512x49; shared memory 17.4 against 27.0 us at 256x512x49, 67.4 / 99.8 at 256x2048x49
# (registers and 512 lanes: 20.1, 76.4; results/batch_norm/bn_parts_nvidia_h200.md).
BLOCK_LANES = 256
SHORT_CHANNEL_VALUES = 1024  # held by 4 warps instead
BLOCK_LANE_VALUES = 32
BLOCK_SMEM_LANES = 512
# Inference: each thread normalizes INFER_VECTORS vectors (independent loads in flight).
INFER_THREADS = 256
INFER_VECTORS = 4
PARTIAL_FIELDS = 3  # count, mean, M2 of one split's values
SUM_FIELDS = 4  # a thread's count, shift, sum of (x - shift) and of its squares


def f32(value: Any) -> Any:
    """`value` as float32 (a 16-bit load, a parameter): TIR does not promote mixed types."""
    import tilelang.language as T

    return T.Cast("float32", value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_ceil(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def dtype_refusal(call: BatchNormCall) -> str | None:
    if call.dtype in ITEMSIZE:
        return None
    return (
        f"{call.dtype} is not served: these kernels compute in float32, which would lose "
        "float64 precision; the torch reference kernels serve it"
    )


def param_dtype(call: BatchNormCall) -> torch.dtype:
    """The per-channel tensors' dtype (x's when none is given: then nothing reads them)."""
    return call.param_dtype or call.dtype


def values_per_channel(call: BatchNormCall) -> int:
    return call.batch * call.spatial


class _BatchNorm(Kernel):
    """Base of the BatchNorm kernels: dtype refusal, build identity and the compiled call.

    Absent per-channel tensors are passed as one (channels,) placeholder that the program never
    reads: one kernel signature for every affine / running-stats combination.
    """

    supported_archs = AMPERE_AND_LATER

    @classmethod
    def refusal(cls, call: BatchNormCall) -> str | None:
        return dtype_refusal(call) or cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        """What, besides the common fields, shapes this layout's code (its plan)."""
        return ()

    @classmethod
    def entry_for(cls, call: BatchNormCall) -> tuple[Hashable, Build]:
        """Identity: arch, dtypes, the layer's channels and spatial size, eps, momentum, which
        tensors are given, and the layout's plan; the batch size is symbolic."""
        identity = (
            call.arch,
            DTYPE_NAMES[call.dtype],
            DTYPE_NAMES[param_dtype(call)],
            call.channels,
            call.spatial,
            call.eps,
            call.momentum,
            call.has_weight,
            call.has_bias,
            call.has_running_stats,
            *cls.layout_fields(call),
        )

        def build() -> _BatchNorm:
            name = f"{cls.__name__}{identity}"
            programs = cls.programs(call)
            return cls(call, [build_program(f"{name}/{k}", p, call.arch) for k, p in programs])

        return identity, build

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        """(index, prim_func factory) of each kernel of the entry, in launch order."""
        raise NotImplementedError

    def __init__(self, call: BatchNormCall, compiled: list[Any]) -> None:
        self.compiled = compiled
        self.channels = call.channels
        self.pdtype = param_dtype(call)
        self._placeholders: dict[torch.device, torch.Tensor] = {}

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
    ) -> torch.Tensor:
        """One kernel over x (the split layout, two kernels, has its own)."""
        x = aligned(x)
        y = torch.empty_like(x)
        params = self.per_channel(x, weight, bias, running_mean, running_var)
        self.compiled[0](x, *params, *self.workspace(x), y)
        return y

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Scratch tensors the kernel takes before y: none but a cluster's."""
        return ()

    def per_channel(self, x: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor]:
        """The per-channel tensors, a placeholder where one is absent."""
        if all(t is not None for t in tensors):
            return list(tensors)
        spare = self._placeholders.get(x.device)
        if spare is None:
            spare = torch.empty(self.channels, dtype=self.pdtype, device=x.device)
            self._placeholders[x.device] = spare
        return [spare if t is None else t for t in tensors]


class _Train(_BatchNorm, BatchNormTrainInterface):
    layout: ClassVar[str]

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        return [(0, lambda: train_program(cls.layout, call, cls.layout_fields(call)))]


# -- training: declarations ------------------------------------------------------------------


class BatchNormThreadChannel(_Train):
    """Few values per channel (n <= 32), usually many channels (BatchNorm1d on a small batch):
    one thread per channel, adjacent threads on adjacent channels."""

    layout = "thread_channel"
    preferred_over = frozenset({"tilelang_bn_tiled"})

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        n = values_per_channel(call)
        if n <= THREAD_VALUES:
            return None
        return f"thread_channel serves channels of at most {THREAD_VALUES} values, not n={n}"


class BatchNormBlockChannel(_Train):
    """Medium channels (32 < n <= 16384): one block per channel, the channel in its threads'
    registers (n <= 8192) or its shared memory, read once; batch is baked in (it sizes the
    layout)."""

    layout = "block_channel"
    preferred_over = frozenset({"tilelang_bn_tiled"})

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        n = values_per_channel(call)
        if THREAD_VALUES < n <= REGISTER_ROW_MAX:
            return None
        return (
            f"block_channel serves channels of {THREAD_VALUES + 1} to {REGISTER_ROW_MAX} "
            f"values, not n={n}"
        )

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        return (call.batch, block_channel_plan(call))


class BatchNormSmemChannel(_Train):
    """Channels too long for registers that fit one block's shared memory, with channels enough
    for half the multiprocessors: one block per channel, held in shared memory in x's dtype,
    read from DRAM once (statistics and output from shared memory); batch is baked in."""

    layout = "smem_channel"
    preferred_over = frozenset({"tilelang_bn_tiled"})

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        n = values_per_channel(call)
        if refusal := long_channel_refusal(cls.layout, n):
            return refusal
        need = plan_smem_bytes(smem_channel_plan(call), call.dtype)
        if need > call.smem_budget:
            return (
                f"a channel of {n} values needs {need} bytes of shared memory, over this device's "
                f"{call.smem_budget} per block: tiled or split_channel serves it"
            )
        if 2 * call.channels < call.sm_count:
            return (
                f"{call.channels} channels leave most of the {call.sm_count} multiprocessors "
                "idle: cluster_channel (sm_90) or split_channel serves it"
            )
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        return (call.batch, smem_channel_plan(call))


class BatchNormClusterChannel(_Train):
    """sm_90, channels longer than registers hold: a thread-block cluster per channel, each block
    holding its part in shared memory, read from DRAM once; the parts' (sum, M2) meet across
    the cluster barrier. Preferred over smem_channel, split_channel and tiled wherever a cluster
    holds the channel: on the H200 (bf16, % of copy on three passes' bytes, same run) 61 against
    split's 35 at 32x64x3136, 89-104 against 53-76 at 256x{128,256,512}x784, 72-80 against
    61-69 at 256x{64,128,256}x3136, 80 and 77 against smem_channel's 67 and 68 at 256x512x196
    and 32x256x3136, 60 against 62 at 32x128x784 (results/batch_norm/bn_layouts_nvidia_h200.md)."""

    layout = "cluster_channel"
    supported_archs = CLUSTER_ARCHS
    preferred_over = frozenset(
        {"tilelang_bn_smem_channel", "tilelang_bn_split_channel", "tilelang_bn_tiled"}
    )

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        if refusal := parts_refusal(cls.layout, call):
            return refusal
        if in_large_parts(cluster_channel_plan(call), call.dtype):
            return "a channel in 16 parts of more than 64 KB: group_channel serves it"
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        return (call.batch, cluster_channel_plan(call))

    def __init__(self, call: BatchNormCall, compiled: list[Any]) -> None:
        super().__init__(call, compiled)
        self.cluster = cluster_channel_plan(call).cluster

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each part's (sum, M2), met across the cluster barrier."""
        return (
            torch.empty((self.channels, self.cluster, 2), dtype=torch.float32, device=x.device),
        )


class BatchNormGroupChannel(BatchNormClusterChannel):
    """The channels that cluster_channel's plan cuts into 16 parts of more than 64 KB: the parts
    as plain blocks of 1024 threads that meet through global memory (tiles.GROUP_SYNC_CUDA), so
    every multiprocessor takes them (see GROUP_CHANNEL_PARTS)."""

    layout = "group_channel"

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        if refusal := parts_refusal(cls.layout, call):
            return refusal
        plan = cluster_channel_plan(call)
        if not in_large_parts(plan, call.dtype):
            return (
                f"a channel in {plan.cluster} parts of {plan_smem_bytes(plan, call.dtype)} bytes: "
                "cluster_channel serves it"
            )
        slots = call.sm_count * group_channel_plan(call).blocks_per_sm
        if slots < plan.cluster:  # tiles.GROUP_SYNC_CUDA: parts run side by side
            return (
                f"{call.sm_count} multiprocessors hold {slots} of its blocks at once, fewer than "
                f"a channel's {plan.cluster} parts"
            )
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        return (call.batch, group_channel_plan(call))

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each part's (sum, M2); the parts arrived per channel, then the ticket counter."""
        arrived = torch.zeros(self.channels + 1, dtype=torch.int32, device=x.device)
        return (*super().workspace(x), arrived)


class BatchNormSplitChannel(_Train):
    """Long channels (n > 16384) and too few of them to fill the device twice (see
    TILED_BLOCKS_PER_SM): each channel split over several blocks. A partial kernel
    writes each split's (count, mean, M2); a second kernel merges a channel's partials and
    normalizes its split (x read twice)."""

    layout = "split_channel"
    preferred_over = frozenset({"tilelang_bn_tiled"})

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        n = values_per_channel(call)
        if refusal := long_channel_refusal(cls.layout, n):
            return refusal
        if call.channels >= TILED_BLOCKS_PER_SM * call.sm_count:
            return (
                f"{call.channels} channels give each of the {call.sm_count} multiprocessors about "
                "two blocks: tiled serves it unsplit"
            )
        if 2 * call.channels >= call.sm_count and n < SPLIT_MIN_VALUES:
            return (
                f"{call.channels} channels of {n} values (< {SPLIT_MIN_VALUES}) fill half the "
                "multiprocessors with channels short enough to stream: tiled serves it unsplit"
            )
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        return (split_chunk_vectors(call),)

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        chunk = split_chunk_vectors(call)
        return [
            (0, lambda: partials_program(call, chunk)),
            (1, lambda: finish_program(call, chunk)),
        ]

    def __init__(self, call: BatchNormCall, compiled: list[Any]) -> None:
        super().__init__(call, compiled)
        self.chunk = split_chunk_vectors(call) * vector_width(call.spatial, call.dtype)

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
    ) -> torch.Tensor:
        x = aligned(x)
        splits = _ceil_div(x.shape[0] * x.shape[2], self.chunk)
        partials = torch.empty(
            (self.channels, splits, PARTIAL_FIELDS), dtype=torch.float32, device=x.device
        )
        self.compiled[0](x, partials)
        y = torch.empty_like(x)
        params = self.per_channel(x, weight, bias, running_mean, running_var)
        self.compiled[1](x, *params, partials, y)
        return y


class BatchNormTiled(_Train):
    """Every call: one block per channel streams it in tiles of TILED_THREADS vectors, twice
    (Welford statistics, then the output). The others are preferred where they serve."""

    layout = "tiled"


# -- inference -------------------------------------------------------------------------------


class BatchNormInfer(_BatchNorm, BatchNormInferInterface):
    """Every inference call: y = (x - running_mean) * rsqrt(running_var + eps) * w + b in one
    pass over x, threads on consecutive vectors of the flat (batch * channels, spatial) rows."""

    @classmethod
    def entry_for(cls, call: BatchNormCall) -> tuple[Hashable, Build]:
        # momentum and has_running_stats do not change the inference code: keep them out.
        call = type(call)(**{**call.__dict__, "momentum": 0.0, "has_running_stats": True})
        return super().entry_for(call)

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        return [(0, lambda: infer_program(call))]


# -- plans -----------------------------------------------------------------------------------


def block_channel_plan(call: BatchNormCall) -> RowPlan:
    """Registers of BLOCK_LANES lanes (4 warps up to SHORT_CHANNEL_VALUES) while a lane keeps
    at most BLOCK_LANE_VALUES values, else shared memory for BLOCK_SMEM_LANES lanes; residency
    from registers or shared memory."""
    vec = vector_width(call.spatial, call.dtype)
    n = values_per_channel(call)
    if n > BLOCK_LANES * BLOCK_LANE_VALUES:
        plan = RowPlan("shared", 1, BLOCK_SMEM_LANES, vec, _ceil_div(n // vec, BLOCK_SMEM_LANES))
        return with_occupancy(plan, call)
    lanes = BLOCK_LANES if n > SHORT_CHANNEL_VALUES else 4 * WARP
    return with_occupancy(RowPlan("registers", 1, lanes, vec, _ceil_div(n // vec, lanes)), call)


def long_channel_refusal(layout: str, n: int) -> str | None:
    """Refusal shared by the layouts of channels too long for registers (smem, cluster and
    split channel): block_channel holds the shorter ones."""
    if n <= REGISTER_ROW_MAX:
        return f"{layout} serves channels of more than {REGISTER_ROW_MAX} values, not {n}"
    return None


def parts_refusal(layout: str, call: BatchNormCall) -> str | None:
    """Refusal shared by the layouts of a channel in parts (cluster and group channel)."""
    n = values_per_channel(call)
    if refusal := long_channel_refusal(layout, n):
        return refusal
    if cluster_channel_plan(call) is None:
        return (
            f"a channel of {n} values does not fit {CLUSTER_SIZES[-1]} blocks' shared memory: "
            "split_channel or tiled serves it"
        )
    return None


def smem_channel_plan(call: BatchNormCall) -> RowPlan:
    """SMEM_CHANNEL_THREADS lanes walking the channel's vectors; residency from shared memory."""
    vec = vector_width(call.spatial, call.dtype)
    chunks = _ceil_div(values_per_channel(call) // vec, SMEM_CHANNEL_THREADS)
    return with_occupancy(RowPlan("shared", 1, SMEM_CHANNEL_THREADS, vec, chunks), call)


def group_channel_plan(call: BatchNormCall) -> RowPlan:
    """cluster_channel_plan's parts for GROUP_CHANNEL_THREADS threads each, where the parts
    still fit half the shared-memory budget (else its own threads)."""
    plan = cluster_channel_plan(call)
    chunks = _ceil_div(values_per_channel(call) // plan.vec, plan.cluster * GROUP_CHANNEL_THREADS)
    wide = dataclasses.replace(plan, lanes=GROUP_CHANNEL_THREADS, chunks=chunks)
    if plan_smem_bytes(wide, call.dtype) > call.smem_budget // 2:
        return plan
    return with_occupancy(wide, call)


def in_large_parts(plan: RowPlan, dtype: torch.dtype) -> bool:
    """Whether a channel's parts are group_channel's: 16 of more than CLUSTER_SLICE_BYTES."""
    large = plan_smem_bytes(plan, dtype) > CLUSTER_SLICE_BYTES
    return large and plan.cluster >= GROUP_CHANNEL_PARTS


def cluster_channel_plan(call: BatchNormCall) -> RowPlan | None:
    """The smallest cluster (CLUSTER_SIZES) of SMEM_CHANNEL_THREADS-thread blocks whose parts of
    the channel fit CLUSTER_SLICE_BYTES (three blocks per multiprocessor), else half the
    shared-memory budget (two); None when 16 parts do not fit."""
    vec = vector_width(call.spatial, call.dtype)
    vectors = values_per_channel(call) // vec
    for limit in (CLUSTER_SLICE_BYTES, call.smem_budget // 2):
        for size in CLUSTER_SIZES:
            chunks = _ceil_div(vectors, size * SMEM_CHANNEL_THREADS)
            plan = RowPlan("shared", 1, SMEM_CHANNEL_THREADS, vec, chunks, cluster=size)
            if plan_smem_bytes(plan, call.dtype) <= limit:
                return with_occupancy(plan, call)
    return None


def split_chunk_vectors(call: BatchNormCall) -> int:
    """Vectors of one channel each split covers: enough splits that C x splits blocks give
    every multiprocessor SPLIT_BLOCKS_PER_SM of them, a power of two (batch sizes within a
    factor of two share a build), at least MIN_VECTORS_PER_THREAD per thread."""
    vectors = values_per_channel(call) // vector_width(call.spatial, call.dtype)
    splits = _ceil_div(SPLIT_BLOCKS_PER_SM * call.sm_count, call.channels)
    chunk = _pow2_ceil(_ceil_div(vectors, splits))
    return max(chunk, SPLIT_THREADS * MIN_VECTORS_PER_THREAD)


# -- TileLang programs -----------------------------------------------------------------------


class _Shape:
    """The static facts every program reads off the call: dtypes, sizes, vector width."""

    def __init__(self, call: BatchNormCall) -> None:
        import tilelang.language as T

        self.dtype, self.pdtype = DTYPE_NAMES[call.dtype], DTYPE_NAMES[param_dtype(call)]
        self.channels, self.spatial = call.channels, call.spatial
        self.vec = vector_width(call.spatial, call.dtype)
        self.runs = call.spatial // self.vec  # vectors per (batch, channel) run
        self.eps, self.momentum = call.eps, call.momentum
        self.weight, self.bias = call.has_weight, call.has_bias
        self.stats = call.has_running_stats
        self.batch = T.dynamic("batch")

    def x_shape(self, batch: Any = None) -> tuple:
        return (self.batch if batch is None else batch, self.channels, self.spatial)


def _signature(main, shape: _Shape, batch: Any = None, **extra):
    """prim_func of main(X, W, Bias, RM, RV, [extra...], Y) over the (batch, C, S) layout."""
    from . import tiles

    per_channel = {name: (shape.channels,) for name in ("W", "Bias", "RM", "RV")}
    dtypes = dict.fromkeys(per_channel, shape.pdtype)
    dtypes.update({name: "int32" if name == "Q" else "float32" for name in extra})
    x = shape.x_shape(batch)
    return tiles.prim_func(main, shape.dtype, dtypes, X=x, **per_channel, **extra, Y=x)


def train_program(layout: str, call: BatchNormCall, fields: tuple) -> Any:
    """The prim_func of one single-kernel training layout (all but split_channel); a cluster's
    takes its workspace S before Y, a group's S and its counters Q."""
    shape = _Shape(call)
    if layout in ("block_channel", "smem_channel", "cluster_channel", "group_channel"):
        batch, plan = fields
        ticketed = layout == "group_channel"
        held_body = _held_channel_body(shape, batch, plan, ticketed)
        if ticketed:

            def main(X, W, Bias, RM, RV, S, Q, Y):
                held_body(X, W, Bias, RM, RV, S, Q, Y)

            return _signature(
                main, shape, batch, S=(shape.channels, plan.cluster, 2), Q=(shape.channels + 1,)
            )
        if plan.cluster > 1:

            def main(X, W, Bias, RM, RV, S, Y):
                held_body(X, W, Bias, RM, RV, S, None, Y)

            return _signature(main, shape, batch, S=(shape.channels, plan.cluster, 2))

        def main(X, W, Bias, RM, RV, Y):
            held_body(X, W, Bias, RM, RV, None, None, Y)

        return _signature(main, shape, batch)
    body = _thread_channel_body(shape) if layout == "thread_channel" else _streamed_body(shape)

    def main(X, W, Bias, RM, RV, Y):
        body(X, W, Bias, RM, RV, Y)

    return _signature(main, shape)


def _epilogue(shape: _Shape):
    """Macros shared by the training layouts: the output of one vector and the running-stat
    update (unbiased variance, momentum blend, in float32, stored in the stats' dtype)."""
    import tilelang.language as T

    momentum = shape.momentum

    @T.macro
    def normalized(X, W, Bias, Y, b, c, s, mean, rstd):
        scale = rstd * f32(W[c]) if shape.weight else rstd
        for v in T.vectorized(shape.vec):
            if shape.bias:
                Y[b, c, s + v] = (f32(X[b, c, s + v]) - mean) * scale + f32(Bias[c])
            else:
                Y[b, c, s + v] = (f32(X[b, c, s + v]) - mean) * scale

    @T.macro
    def update_stats(RM, RV, c, mean, var, count):
        if shape.stats:
            unbiased = var * count / T.max(count - 1.0, 1.0)
            RM[c] = (1.0 - momentum) * f32(RM[c]) + momentum * mean
            RV[c] = (1.0 - momentum) * f32(RV[c]) + momentum * unbiased

    return normalized, update_stats


def _thread_channel_body(shape: _Shape):
    import tilelang.language as T

    normalized, update_stats = _epilogue(shape)
    threads, spatial, batch = THREAD_CHANNEL_THREADS, shape.spatial, shape.batch

    @T.macro
    def body(X, W, Bias, RM, RV, Y):
        with T.Kernel(T.ceildiv(shape.channels, threads), threads=threads) as bx:
            c = bx * threads + T.get_thread_binding()
            count = T.Cast("float32", batch * spatial)
            total = T.alloc_var("float32", init=0.0)
            square = T.alloc_var("float32", init=0.0)
            if c < shape.channels:
                for b in T.serial(batch):
                    for s in T.unroll(spatial):
                        total += f32(X[b, c, s])
                mean = total / count
                for b in T.serial(batch):
                    for s in T.unroll(spatial):
                        square += (f32(X[b, c, s]) - mean) * (f32(X[b, c, s]) - mean)
                var = square / count
                rstd = T.rsqrt(var + shape.eps)
                for b in T.serial(batch):
                    for r in T.unroll(shape.runs):
                        normalized(X, W, Bias, Y, b, c, r * shape.vec, mean, rstd)
                update_stats(RM, RV, c, mean, var, count)

    return body


def _held_channel_body(shape: _Shape, batch: int, plan: RowPlan, ticketed: bool = False):
    """block, smem, cluster and group channel: the channel read once into `plan.hold`
    (float32 registers, or shared memory in x's dtype), then the exact mean, the exact squared
    deviations and the output, all from what is held. In parts, block `part` holds the
    channel's vectors [part * held, (part + 1) * held) and the blocks' (sum, M2) meet in
    S[channel, part] across the cluster barrier, or, `ticketed` (group_channel), once Q counts
    every part arrived (Chan's merge)."""
    import tilelang.language as T

    from . import tiles

    _, update_stats = _epilogue(shape)
    lanes, vec, runs, cluster = plan.lanes, plan.vec, shape.runs, plan.cluster
    vectors = batch * runs
    held = plan.chunks * lanes  # vectors one block holds
    exact = held * cluster == vectors
    count = float(batch * shape.spatial)
    in_registers = plan.hold == "registers"

    def slot(k, local):
        """Where the lane's k-th vector, the block's `local`-th, is held: registers are indexed
        by constants (k), shared memory by the vector's place in the block's part."""
        return k * vec if in_registers else local * vec

    def part_values(part):
        return T.Cast("float32", T.min(T.max(vectors - part * held, 0), held) * vec)

    launch = tiles.group_launch if ticketed else tiles.launch

    @T.macro
    def body(X, W, Bias, RM, RV, S, Q, Y):
        with launch(plan, shape.channels) as block:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            lane = T.get_thread_binding()
            bx = tiles.take_ticket(Q, shape.channels, lane) if ticketed else block
            c, part = bx // cluster, bx % cluster
            store = tiles.row_store(plan, shape.dtype)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            total = T.alloc_var("float32", init=0.0)
            square = T.alloc_var("float32", init=0.0)
            for k in tiles.chunk_loop(plan):
                local = k * lanes + lane
                j = part * held + local
                if exact or j < vectors:
                    if in_registers:
                        for v in T.vectorized(vec):
                            store[slot(k, local) + v] = f32(X[j // runs, c, (j % runs) * vec + v])
                    else:
                        for v in T.vectorized(vec):
                            store[slot(k, local) + v] = X[j // runs, c, (j % runs) * vec + v]
                    for v in T.vectorized(vec):
                        t[v] = store[slot(k, local) + v]
                    for v in T.unroll(vec):
                        total += t[v]
            part_total = tiles.reduce_group(total, "sum", plan, scratch, 0, lane)
            part_mean = part_total / T.max(part_values(part), 1.0)
            for k in tiles.chunk_loop(plan):
                local = k * lanes + lane
                if exact or part * held + local < vectors:
                    for v in T.vectorized(vec):
                        t[v] = store[slot(k, local) + v]
                    for v in T.unroll(vec):
                        square += (t[v] - part_mean) * (t[v] - part_mean)
            part_m2 = tiles.reduce_group(square, "sum", plan, scratch, 1, lane)
            mean = T.alloc_var("float32", init=part_mean)
            var = T.alloc_var("float32", init=part_m2 / count)
            if ticketed:
                G = tiles.gather_partials(S, Q, c, part, part_total, part_m2, cluster, lane)
                mean = tiles.merged_mean(G, 0, cluster, count)
                var = tiles.merged_var(G, 0, cluster, count, mean, part_values)
            elif cluster > 1:
                tiles.share_partials(S, c, part, part_total, part_m2)
                mean = tiles.merged_mean(S, c, cluster, count)
                var = tiles.merged_var(S, c, cluster, count, mean, part_values)
            scale = T.rsqrt(var + shape.eps)
            if shape.weight:
                scale = scale * f32(W[c])
            for k in tiles.chunk_loop(plan):
                local = k * lanes + lane
                j = part * held + local
                if exact or j < vectors:
                    b, s = j // runs, (j % runs) * vec
                    for v in T.vectorized(vec):
                        t[v] = store[slot(k, local) + v]
                    for v in T.vectorized(vec):
                        if shape.bias:
                            Y[b, c, s + v] = (t[v] - mean) * scale + f32(Bias[c])
                        else:
                            Y[b, c, s + v] = (t[v] - mean) * scale
            if lane == 0 and part == 0:
                update_stats(RM, RV, c, mean, var, count)

    return body


def _welford(shape: _Shape, threads: int):
    """Macros of the streamed layouts: a thread's shifted sums of its vectors (start, fold),
    turned into (count, mean, M2) (welford_of) and merged across the block (Chan et al.),
    every thread getting the result."""
    import tilelang.language as T

    vec, runs = shape.vec, shape.runs
    vectors = shape.batch * runs
    nwarps = threads // WARP
    offsets = [WARP >> i for i in range(1, WARP.bit_length())]  # 16, 8, 4, 2, 1

    @T.macro
    def merge(st, count, mean, m2):
        total = st[0] + count
        delta = mean - st[1]
        weight = T.if_then_else(total > 0.0, count / T.max(total, 1.0), 0.0)
        st[2] = st[2] + m2 + delta * delta * st[0] * weight
        st[1] = st[1] + delta * weight
        st[0] = total

    @T.macro
    def start(X, c, j, acc):
        """A thread's sums begin at its first value (the shift): sums of (x - shift) and of
        its squares then stay near the spread of the values, so M2 = S2 - S1^2 / n keeps its
        digits, and each vector costs adds and multiplies only (no division per vector)."""
        for f in T.unroll(SUM_FIELDS):
            acc[f] = 0.0
        if j < vectors:
            acc[1] = f32(X[j // runs, c, (j % runs) * vec])

    @T.macro
    def fold(X, c, j, acc, t):
        for v in T.vectorized(vec):
            t[v] = f32(X[j // runs, c, (j % runs) * vec + v])
        for v in T.unroll(vec):
            acc[2] += t[v] - acc[1]
            acc[3] += (t[v] - acc[1]) * (t[v] - acc[1])
        acc[0] += float(vec)

    @T.macro
    def welford_of(acc, st):
        """(count, shift, S1, S2) as (count, mean, M2), for the merges."""
        n = T.max(acc[0], 1.0)
        st[0] = acc[0]
        st[1] = acc[1] + acc[2] / n
        st[2] = T.max(acc[3] - acc[2] * acc[2] / n, 0.0)

    @T.macro
    def block_merge(st, scratch, lane):
        for offset in offsets:
            count = T.shfl_xor(st[0], offset)
            mean = T.shfl_xor(st[1], offset)
            m2 = T.shfl_xor(st[2], offset)
            merge(st, count, mean, m2)
        if nwarps > 1:
            if lane % WARP == 0:
                for f in T.unroll(PARTIAL_FIELDS):
                    scratch[f, lane // WARP] = st[f]
            T.sync_threads()
            for f in T.unroll(PARTIAL_FIELDS):
                st[f] = scratch[f, 0]
            for w in T.unroll(1, nwarps):
                merge(st, scratch[0, w], scratch[1, w], scratch[2, w])

    return start, fold, welford_of, merge, block_merge


def _streamed_body(shape: _Shape):
    """tiled: one block per channel, Welford over the channel's vectors, then the output."""
    import tilelang.language as T

    normalized, update_stats = _epilogue(shape)
    start, fold, welford_of, _, block_merge = _welford(shape, TILED_THREADS)
    threads, vec, runs = TILED_THREADS, shape.vec, shape.runs
    vectors = shape.batch * runs

    @T.macro
    def body(X, W, Bias, RM, RV, Y):
        with T.Kernel(shape.channels, threads=threads) as c:
            lane = T.get_thread_binding()
            acc = T.alloc_local((SUM_FIELDS,), "float32")
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            t = T.alloc_local((vec,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            start(X, c, lane, acc)
            for k in T.serial(T.ceildiv(vectors, threads)):
                if k * threads + lane < vectors:
                    fold(X, c, k * threads + lane, acc, t)
            welford_of(acc, st)
            block_merge(st, scratch, lane)
            var = st[2] / st[0]
            rstd = T.rsqrt(var + shape.eps)
            for k in T.serial(T.ceildiv(vectors, threads)):
                j = k * threads + lane
                if j < vectors:
                    normalized(X, W, Bias, Y, j // runs, c, (j % runs) * vec, st[1], rstd)
            if lane == 0:
                update_stats(RM, RV, c, st[1], var, st[0])

    return body


def partials_program(call: BatchNormCall, chunk: int) -> Any:
    """Split layout, kernel 1: block (split, c) writes the (count, mean, M2) of its `chunk`
    vectors of channel c to P[c, split]."""
    import tilelang.language as T

    shape = _Shape(call)
    start, fold, welford_of, _, block_merge = _welford(shape, SPLIT_THREADS)
    threads, vec = SPLIT_THREADS, shape.vec
    vectors = shape.batch * shape.runs
    splits = T.dynamic("splits")

    @T.macro
    def body(X, P):
        with T.Kernel(splits, shape.channels, threads=threads) as (split, c):
            lane = T.get_thread_binding()
            acc = T.alloc_local((SUM_FIELDS,), "float32")
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            t = T.alloc_local((vec,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            start(X, c, split * chunk + lane, acc)
            for k in T.unroll(chunk // threads, annotations={"pragma_unroll_factor": 4}):
                j = split * chunk + k * threads + lane
                if j < vectors:
                    fold(X, c, j, acc, t)
            welford_of(acc, st)
            block_merge(st, scratch, lane)
            if lane == 0:
                for f in T.unroll(PARTIAL_FIELDS):
                    P[c, split, f] = st[f]

    def main(X, P):
        body(X, P)

    from . import tiles

    return tiles.prim_func(
        main,
        shape.dtype,
        {"P": "float32"},
        X=shape.x_shape(),
        P=(shape.channels, splits, PARTIAL_FIELDS),
    )


def finish_program(call: BatchNormCall, chunk: int) -> Any:
    """Split layout, kernel 2: block (split, c) merges channel c's partials, normalizes its
    chunk; block (0, c) updates the running stats. Blocks run in the reverse of kernel 1's
    order, so the first ones re-read what kernel 1 read last, while it is still in L2."""
    import tilelang.language as T

    shape = _Shape(call)
    normalized, update_stats = _epilogue(shape)
    *_, merge, block_merge = _welford(shape, SPLIT_THREADS)
    threads, vec, runs = SPLIT_THREADS, shape.vec, shape.runs
    vectors = shape.batch * runs
    splits = T.dynamic("splits")

    @T.macro
    def body(X, W, Bias, RM, RV, P, Y):
        with T.Kernel(splits, shape.channels, threads=threads) as (bx, by):
            split, c = splits - 1 - bx, shape.channels - 1 - by
            lane = T.get_thread_binding()
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            for f in T.unroll(PARTIAL_FIELDS):
                st[f] = 0.0
            for k in T.serial(T.ceildiv(splits, threads)):
                if k * threads + lane < splits:
                    i = k * threads + lane
                    merge(st, P[c, i, 0], P[c, i, 1], P[c, i, 2])
            block_merge(st, scratch, lane)
            var = st[2] / st[0]
            rstd = T.rsqrt(var + shape.eps)
            for k in T.unroll(chunk // threads, annotations={"pragma_unroll_factor": 4}):
                j = split * chunk + k * threads + lane
                if j < vectors:
                    normalized(X, W, Bias, Y, j // runs, c, (j % runs) * vec, st[1], rstd)
            if split == 0 and lane == 0:
                update_stats(RM, RV, c, st[1], var, st[0])

    def main(X, W, Bias, RM, RV, P, Y):
        body(X, W, Bias, RM, RV, P, Y)

    return _signature(main, shape, P=(shape.channels, splits, PARTIAL_FIELDS))


def infer_program(call: BatchNormCall) -> Any:
    """Inference: thread g of the flat vector grid normalizes vectors g, g + G, ... of the
    (batch * channels) runs; the per-channel scale comes from L1-resident running stats."""
    import tilelang.language as T

    shape = _Shape(call)
    threads, vec, runs, channels = INFER_THREADS, shape.vec, shape.runs, shape.channels
    vectors = shape.batch * channels * runs
    step = threads * INFER_VECTORS

    @T.macro
    def body(X, W, Bias, RM, RV, Y):
        with T.Kernel(T.ceildiv(vectors, step), threads=threads) as bx:
            lane = T.get_thread_binding()
            for k in T.unroll(INFER_VECTORS):
                g = bx * step + k * threads + lane
                if g < vectors:
                    b, c, s = g // (channels * runs), (g // runs) % channels, (g % runs) * vec
                    rstd = T.rsqrt(f32(RV[c]) + shape.eps)
                    scale = rstd * f32(W[c]) if shape.weight else rstd
                    for v in T.vectorized(vec):
                        if shape.bias:
                            Y[b, c, s + v] = (f32(X[b, c, s + v]) - f32(RM[c])) * scale + f32(
                                Bias[c]
                            )
                        else:
                            Y[b, c, s + v] = (f32(X[b, c, s + v]) - f32(RM[c])) * scale

    def main(X, W, Bias, RM, RV, Y):
        body(X, W, Bias, RM, RV, Y)

    return _signature(main, shape)
