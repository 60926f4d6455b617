"""The row kernels (LayerNorm, RMSNorm, softmax forward) and which rows each one serves.

Where a row waits between its reduction and its output pass decides the layout; every family
(LayerNorm, RMSNorm, softmax) has one kernel class per layout, key `tilelang_<layout>`:

| layout      | row held in                | rows per block | serves (n = row length)            |
|-------------|----------------------------|----------------|------------------------------------|
| warp_rows   | registers of <= 32 lanes   | several        | n <= 1024                          |
| block_row   | registers of one block     | one            | 1024 < n <= 16384 (32-bit: 32768)  |
| smem_row    | shared memory of one block | one            | longer rows within the smem budget |
| stream_row  | nowhere: read twice        | one            | every longer row                   |
| cluster_row | shared memory of a cluster | 1/2 .. 1/16    | sm_90: longer rows but smem_row's  |
|             |                            |                | of up to 64 KB (RMSNorm: 128 KB)   |

Every layout serves sm_80, 86, 89 and 90 except cluster_row (sm_90 only). Preferences:
smem_row over stream_row (one read of x instead of two); cluster_row over stream_row and
smem_row (it refuses the rows smem_row measured faster on). So on sm_80 a 64K-element bfloat16
row (128 KB) goes to smem_row where the device's shared memory per block holds it, else to
stream_row; on sm_90 to cluster_row (RMSNorm's to smem_row). Why the bands lie where they
do: TUNING.md#regions.

cluster_row splits a row over a thread-block cluster: each block keeps a slice of at most 64 KB
in shared memory, so even 256K-element rows are read once and several blocks share a
multiprocessor (one loads while another reduces). The blocks' partial statistics meet in each
other's shared memory or a small global workspace, across a cluster barrier. On 32-bit
LayerNorm and RMSNorm rows of up to 256 KB each block's slice arrives by one TMA transfer.

The region classes come first (the declarations of a layout, shared by the three families),
then each family's classes; the plan rules are in `plans`, the programs in `norm_program` and
`softmax_program`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from tileops.ops import LayerNormInterface, RMSNormInterface, SoftmaxInterface

from .._common.arith import CLUSTER_ARCHS, DTYPE_NAMES, ITEMSIZE, MAX_THREADS
from .base import RowKernel
from .norm_program import norm_program
from .plans import (
    BULK_ROW_BYTES,
    BULK_SLICE_BYTES,
    BULK_THREADS,
    CLUSTER_LONE_SIZE,
    CLUSTER_THREADS,
    DSMEM_CLUSTER_MAX,
    DSMEM_WIDE_CLUSTER_THREADS,
    SHORT_ROW_MAX,
    SMALL_SMEM_ROW_BYTES,
    SMEM_ROW_OVER_CLUSTER_BYTES,
    RowPlan,
    block_row_plan,
    bulk_eligible,
    cluster_row_plan,
    long_row_plan,
    register_row_max,
    smem_bytes,
)
from .softmax_program import softmax_program

# -- regions: each layout's declarations, shared by every family --------------------------------


class WarpRows:
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""

    layout: ClassVar[str] = "warp_rows"

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return register_row_refusal(call, cls.layout)


class BlockRow:
    """Medium rows: one block per row, the row in its threads' registers."""

    layout: ClassVar[str] = "block_row"
    # 32-bit rows of lo < n <= hi that take a whole block of MAX_THREADS threads instead of
    # block_row_plan's fewest; a family may set it.
    full_block_32bit: ClassVar[tuple[int, int] | None] = None

    @classmethod
    def block_plan(cls, call: Any) -> RowPlan:
        span = cls.full_block_32bit
        if span and ITEMSIZE[call.dtype] == 4 and span[0] < call.n <= span[1]:
            return block_row_plan(call.n, call.dtype, MAX_THREADS)
        return block_row_plan(call.n, call.dtype)

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return register_row_refusal(call, cls.layout)


class SmemRow:
    """Long rows that fit the block's shared memory: read once, kept there for the output."""

    layout: ClassVar[str] = "smem_row"
    preferred_over: ClassVar[frozenset[str]] = frozenset({"tilelang_stream_row"})  # one read
    # Whether the family's rows of up to SMALL_SMEM_ROW_BYTES arrive by TMA where it can
    # bring them (RowPlan.bulk; TUNING.md#smem-row-tma).
    smem_bulk: ClassVar[bool] = False

    @classmethod
    def smem_plan(cls, call: Any) -> RowPlan:
        """The family's plan for the call: rows of up to SMALL_SMEM_ROW_BYTES by TMA where the
        family takes them and TMA can bring them, else through the lanes' loads."""
        plan = long_row_plan(call.n, call.dtype, "shared")
        small = call.n * ITEMSIZE[call.dtype] <= SMALL_SMEM_ROW_BYTES
        if cls.smem_bulk and small and bulk_eligible(plan, call.n, call.dtype, call.arch):
            return dataclasses.replace(plan, bulk=True)
        return plan

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return smem_row_refusal(call)


class StreamRow:
    """Any long row: statistics in a streaming pass, then the output pass (x read twice)."""

    layout: ClassVar[str] = "stream_row"

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return long_row_refusal(call, cls.layout)


class ClusterRow:
    """Long rows on sm_90: a cluster of blocks per row, each keeping its slice in shared memory
    (read once); partial statistics meet in the blocks' shared memory (DSMEM_CLUSTER_MAX) or a
    global workspace, across a cluster barrier."""

    layout: ClassVar[str] = "cluster_row"
    supported_archs: ClassVar[frozenset[int]] = CLUSTER_ARCHS
    # One read over stream_row's two; over smem_row on the rows it starts at (TUNING.md#regions).
    preferred_over: ClassVar[frozenset[str]] = frozenset(
        {"tilelang_stream_row", "tilelang_smem_row"}
    )

    # Whether the family gathers a slice's statistics while it loads (RowPlan.one_pass).
    cluster_one_pass: ClassVar[bool] = False
    # Whether the family's 32-bit rows of up to BULK_ROW_BYTES take TMA-loaded slices.
    cluster_bulk: ClassVar[bool] = False
    smem_row_over_cluster_bytes: ClassVar[int] = SMEM_ROW_OVER_CLUSTER_BYTES

    @classmethod
    def cluster_threads(cls, dtype: torch.dtype) -> int:
        """Threads per block while slices fit CLUSTER_SLICE_BYTES; a family may differ."""
        return CLUSTER_THREADS

    @classmethod
    def cluster_plan(cls, call: Any) -> RowPlan | None:
        """The family's plan for the call, None when no cluster holds the row: TMA-loaded
        BULK_SLICE_BYTES slices where the family takes them and TMA can bring them, else
        slices of up to CLUSTER_SLICE_BYTES (statistics while loading, if the family says so;
        not for odd rows, see norm_program's `shifted`), their partials exchanged in shared
        memory where that measured faster (DSMEM_CLUSTER_MAX)."""
        n, dtype, budget = call.n, call.dtype, call.smem_budget
        if cls.cluster_bulk and ITEMSIZE[dtype] == 4 and n * ITEMSIZE[dtype] <= BULK_ROW_BYTES:
            plan = cluster_row_plan(n, dtype, budget, BULK_THREADS, BULK_SLICE_BYTES)
            if plan and bulk_eligible(plan, n, dtype, call.arch):
                return dataclasses.replace(plan, bulk=True)
        plan = cluster_row_plan(n, dtype, budget, cls.cluster_threads(dtype))
        if plan is None:
            return None
        one_pass = cls.cluster_one_pass and plan.vec > 1
        dsmem = plan.cluster <= DSMEM_CLUSTER_MAX or plan.lanes <= DSMEM_WIDE_CLUSTER_THREADS
        return dataclasses.replace(plan, one_pass=one_pass, dsmem=dsmem)

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        refusal = long_row_refusal(call, cls.layout)
        if refusal:
            return refusal
        limit = cls.smem_row_over_cluster_bytes
        if call.n * ITEMSIZE[call.dtype] <= limit and smem_row_refusal(call) is None:
            return (
                f"cluster_row serves rows over {limit // 1024} KB; smem_row measured faster "
                f"on n={call.n} {DTYPE_NAMES[call.dtype]}"
            )
        if cls.cluster_plan(call):
            return None
        return (
            f"a row of n={call.n} {DTYPE_NAMES[call.dtype]} split over {CLUSTER_LONE_SIZE} "
            f"blocks needs more than this device's {call.smem_budget} bytes of shared memory "
            "per block; stream_row serves it"
        )


def long_row_refusal(call: Any, layout: str) -> str | None:
    """Refusal shared by the long-row layouts: short rows belong to the register layouts."""
    most = register_row_max(call.dtype)
    if call.n <= most:
        return (
            f"{layout} serves {DTYPE_NAMES[call.dtype]} rows longer than {most} elements; "
            f"n={call.n} fits in registers (warp_rows / block_row)"
        )
    return None


def smem_row_refusal(call: Any) -> str | None:
    refusal = long_row_refusal(call, "smem_row")
    if refusal:
        return refusal
    need = smem_bytes(call.n, call.dtype)
    if need > call.smem_budget:
        return (
            f"a row of n={call.n} {DTYPE_NAMES[call.dtype]} needs {need} bytes of shared memory, "
            f"over this device's {call.smem_budget} per block; stream_row serves it"
        )
    return None


def register_row_refusal(call: Any, layout: str) -> str | None:
    """Refusal of warp_rows / block_row: each owns one band of row lengths."""
    if layout == "warp_rows":
        low, high = 0, SHORT_ROW_MAX
    else:
        low, high = SHORT_ROW_MAX, register_row_max(call.dtype)
    if low < call.n <= high:
        return None
    return f"{layout} serves rows of {low + 1} to {high} elements, not n={call.n}"


# -- LayerNorm -------------------------------------------------------------------------------


class _LayerNorm(RowKernel, LayerNormInterface):
    @classmethod
    def build_fields(cls, call: Any) -> tuple:
        return (call.eps, call.has_weight, call.has_bias, call.param_dtype)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: norm_program("layer", plan, call, call.has_weight, call.has_bias)

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return self.rows_out(x, *[t for t in (weight, bias) if t is not None])


class LayerNormWarpRows(WarpRows, _LayerNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class LayerNormBlockRow(BlockRow, _LayerNorm):
    """Medium rows: one block per row, the row in its threads' registers."""


class LayerNormSmemRow(SmemRow, _LayerNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""


class LayerNormStreamRow(StreamRow, _LayerNorm):
    """Any long row: statistics in one streaming pass (shifted sums), then the output pass."""


class LayerNormClusterRow(ClusterRow, _LayerNorm):
    """Long rows on sm_90: a slice per block of a cluster, (sum, M2) of the slices merged."""

    cluster_one_pass = True  # statistics while the slice loads (TUNING.md#layer-norm-one-pass)
    cluster_bulk = True  # plans.BULK_ROW_BYTES

    @classmethod
    def cluster_threads(cls, dtype: torch.dtype) -> int:
        # 16-bit rows take 256 threads (TUNING.md#layer-norm-cluster-threads).
        return 256 if ITEMSIZE[dtype] == 2 else CLUSTER_THREADS


# -- RMSNorm ---------------------------------------------------------------------------------


class _RMSNorm(RowKernel, RMSNormInterface):
    @classmethod
    def build_fields(cls, call: Any) -> tuple:
        return (call.eps, call.has_weight, call.param_dtype)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: norm_program("rms", plan, call, call.has_weight, False)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return self.rows_out(x) if weight is None else self.rows_out(x, weight)


class RMSNormWarpRows(WarpRows, _RMSNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class RMSNormBlockRow(BlockRow, _RMSNorm):
    """Medium rows: one block per row, the row in its threads' registers."""

    full_block_32bit = (4096, 16384)  # float32 8K-16K: 1024 threads (TUNING.md#rms-norm-block-row)


class RMSNormSmemRow(SmemRow, _RMSNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""

    smem_bulk = True  # plans.SMALL_SMEM_ROW_BYTES


class RMSNormStreamRow(StreamRow, _RMSNorm):
    """Any long row: sum of squares in one streaming pass, then the output pass."""


class RMSNormClusterRow(ClusterRow, _RMSNorm):
    """Long rows on sm_90: a slice per block of a cluster, the slices' sums of squares added."""

    smem_row_over_cluster_bytes = 128 * 1024  # TUNING.md#regions
    cluster_bulk = True  # plans.BULK_ROW_BYTES


# -- Softmax ---------------------------------------------------------------------------------


class _Softmax(RowKernel, SoftmaxInterface):
    @classmethod
    def plan(cls, call: Any) -> RowPlan:
        """The layout's plan; 16-bit rows held in shared memory take scaled exponents
        (RowPlan.scaled_exp; TUNING.md#softmax-scaled-exponents)."""
        plan = super().plan(call)
        if plan.hold == "shared" and ITEMSIZE[call.dtype] == 2:
            return dataclasses.replace(plan, scaled_exp=True)
        return plan

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: softmax_program(plan, call)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows_out(x)


class SoftmaxWarpRows(WarpRows, _Softmax):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class SoftmaxBlockRow(BlockRow, _Softmax):
    """Medium rows: one block per row, the row (then its exponentials) in registers."""


class SoftmaxSmemRow(SmemRow, _Softmax):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""

    smem_bulk = True  # plans.SMALL_SMEM_ROW_BYTES


class SoftmaxStreamRow(StreamRow, _Softmax):
    """Any long row: running max and rescaled sum in one streaming pass, then the output."""


class SoftmaxClusterRow(ClusterRow, _Softmax):
    """Long rows on sm_90: a slice per block of a cluster, the slices' (max, sum) merged."""

    @classmethod
    def cluster_threads(cls, dtype: torch.dtype) -> int:
        return 256  # every dtype (TUNING.md#softmax-cluster-threads)
