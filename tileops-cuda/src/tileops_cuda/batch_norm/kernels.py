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
| tilelang_bn_block_channel  | registers (n <= 8192)  | C          | 32 < n <= 16384            |
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

cuDNN (`vendor`, keys `cudnn` and `cudnn_infer`) is preferred over all of them and steps aside
only where they measured faster on the H200 (TUNING.md#vendor-regions).

The plan rules are in `plans` (their measurements in TUNING.md), the programs in `programs`
(`held_program`, `streamed_program`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops.backend import Build
from tileops.ops import BatchNormCall, BatchNormInferInterface, BatchNormTrainInterface

from .._common.arith import CLUSTER_ARCHS, CLUSTER_SIZES, ceil_div, vector_width
from .._common.lanes import plan_smem_bytes
from .._common.operands import aligned
from .base import _BatchNorm
from .plans import (
    PARTIAL_FIELDS,
    REGISTER_CHANNEL_MAX,
    SPLIT_MIN_VALUES,
    THREAD_VALUES,
    TILED_BLOCKS_PER_SM,
    block_channel_plan,
    cluster_channel_plan,
    group_channel_plan,
    in_large_parts,
    smem_channel_plan,
    split_chunk_vectors,
    values_per_channel,
)
from .programs import infer_program, train_program
from .streamed_program import finish_program, partials_program


class _Train(_BatchNorm, BatchNormTrainInterface):
    """A training layout: y, and the batch mean and invstd kept for the backward."""

    layout: ClassVar[str]

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        return [(0, lambda: train_program(cls.layout, call, cls.layout_fields(call)))]

    def kept(self, x: torch.Tensor) -> torch.Tensor:
        """Where the program writes the batch mean (row 0) and invstd (row 1)."""
        return torch.empty((2, self.channels), dtype=torch.float32, device=x.device)


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
        if THREAD_VALUES < n <= REGISTER_CHANNEL_MAX:
            return None
        return (
            f"block_channel serves channels of {THREAD_VALUES + 1} to {REGISTER_CHANNEL_MAX} "
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
    holds the channel (TUNING.md#cluster-channel)."""

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
    every multiprocessor takes them (TUNING.md#group-channel)."""

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
    """Long channels (n > 16384) and too few of them to fill the device twice
    (TUNING.md#split-or-tiled): each channel split over several blocks. A partial kernel
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
        splits = ceil_div(x.shape[0] * x.shape[2], self.chunk)
        partials = torch.empty(
            (self.channels, splits, PARTIAL_FIELDS), dtype=torch.float32, device=x.device
        )
        self.launches[0](x, partials)
        y, kept = torch.empty_like(x), self.kept(x)
        params = self.per_channel(x, weight, bias, running_mean, running_var)
        self.launches[1](x, *params, partials, y, kept)
        return y, *kept


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


# -- refusals shared by layouts --------------------------------------------------------------


def long_channel_refusal(layout: str, n: int) -> str | None:
    """Refusal shared by the layouts of channels too long for registers (smem, cluster and
    split channel): block_channel holds the shorter ones."""
    if n <= REGISTER_CHANNEL_MAX:
        return f"{layout} serves channels of more than {REGISTER_CHANNEL_MAX} values, not {n}"
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
