"""How a row (or a BatchNorm channel) is laid over a block's lanes: the plan every TileLang walk
of `tiles` follows, with the residency and shared memory it leaves. Pure arithmetic."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .arith import ITEMSIZE, MAX_THREADS, ceil_div

# A lane keeps at most this many float32 values of its row in registers: 16 data registers
# out of the 64 a thread has when 1024 threads share an SM's 64K registers.
REGISTER_VALUES = 16
BLOCK_REGISTER_VALUES = MAX_THREADS * REGISTER_VALUES  # the most one block keeps
# Registers a lane needs beside the values it keeps: addresses, loop state, the reduction.
REGISTER_OVERHEAD = 24
REGISTER_FILE = 65536  # 32-bit registers per SM on sm_80 .. sm_90
THREADS_PER_SM = {80: 2048, 86: 1536, 89: 1536, 90: 2048}
BLOCKS_PER_SM = 32  # resident blocks per SM on sm_80 and sm_90
# Shared memory a long-row block keeps for its cross-warp reductions (a few float32 per warp).
REDUCE_SCRATCH_BYTES = 1024


@dataclass(frozen=True)
class RowPlan:
    """Threads of one row: `lanes` threads per row, `rows` rows per block, `chunks` vectors of
    `vec` elements per lane; `hold` is where the row waits: registers, shared or nowhere.
    `blocks_per_sm` is the residency the compiler must leave registers for (launch bounds);
    `cluster` blocks share one row, a slice each (cluster_row). `one_pass`: LayerNorm gathers
    its statistics while the row loads, as stream_row always does, with no pass over shared
    memory before the output: each lane sums x and x^2 shifted by its own first element, and
    the lanes' (count, mean, M2) merge as Chan's. (Softmax has no such option: a running
    max per vector measured slower than its two passes at every length.) `bulk`: the
    block's slice arrives in shared memory by TMA (sm_90) before any lane reads it, instead of
    through the lanes' registers (rows.plans.bulk_eligible says which plans can). `scaled_exp`
    (softmax, held rows): each exponential is one fused multiply-add from the max in log2 units
    (tiles.exp_below) instead of a subtract and a multiply; 16-bit rows in shared memory take
    it. `dsmem` (cluster_row): the blocks write their partial statistics into each other's
    shared memory (tiles.exchange_partials) instead of the global workspace."""

    hold: str
    rows: int
    lanes: int
    vec: int
    chunks: int
    blocks_per_sm: int = 1
    cluster: int = 1
    one_pass: bool = False
    bulk: bool = False
    scaled_exp: bool = False
    dsmem: bool = False

    @property
    def threads(self) -> int:
        return self.rows * self.lanes

    @property
    def slice(self) -> int:
        """Elements one block covers of its row."""
        return self.chunks * self.lanes * self.vec

    @property
    def padded(self) -> int:
        """Elements the layout covers: n rounded up to whole chunks."""
        return self.slice * self.cluster

    @property
    def global_partials(self) -> bool:
        """Whether the cluster's partial statistics meet in a global (rows, cluster, 2)
        workspace, the program's parameter before Y: clusters without `dsmem`."""
        return self.cluster > 1 and not self.dsmem


def with_occupancy(plan: RowPlan, call: Any) -> RowPlan:
    """`plan` with the most blocks per SM that its registers, threads and shared memory allow:
    while one block reduces or writes, another loads."""
    kept = plan.chunks * plan.vec if plan.hold == "registers" else plan.vec
    registers = ceil_div(kept + REGISTER_OVERHEAD, 8) * 8
    blocks = min(
        REGISTER_FILE // (plan.threads * registers),
        THREADS_PER_SM.get(call.arch, 1536) // plan.threads,
    )
    if plan.hold == "shared":
        blocks = min(blocks, call.smem_budget // plan_smem_bytes(plan, call.dtype))
    return dataclasses.replace(plan, blocks_per_sm=max(blocks, 1))


def plan_smem_bytes(plan: RowPlan, dtype: torch.dtype) -> int:
    """Shared memory a block of a shared-memory plan needs: its slice and the reductions'."""
    return plan.slice * ITEMSIZE[dtype] + REDUCE_SCRATCH_BYTES
