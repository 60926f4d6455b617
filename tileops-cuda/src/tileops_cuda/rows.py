"""How row-wise kernels map a row of `n` elements onto threads, and which rows each layout owns.

Shared by the norm and softmax families. Pure arithmetic over the call spec and device facts:
importing this touches neither tilelang nor a device.

Every layout gives a row to `lanes` threads; each lane handles `chunks` vectors of `vec`
elements, the vectors of one chunk adjacent across lanes (coalesced). Where the row waits
between its reduction and its output pass decides the layout:

| layout     | row held in                | rows per block | owns                             |
|------------|----------------------------|----------------|----------------------------------|
| warp_rows  | registers of <= 32 lanes   | several        | n <= SHORT_ROW_MAX (1024)        |
| block_row  | registers of one block     | one            | up to 16384 (32-bit: 32768)      |
| smem_row   | shared memory of one block | one            | longer rows within the smem budget |
| stream_row | nowhere: read twice        | one            | every longer row                 |
| cluster_row| shared memory of a cluster | 1/2 .. 1/16    | long rows on sm_90 (see below)   |

cluster_row splits a row over a thread-block cluster (sm_90): each block keeps a slice of at
most CLUSTER_SLICE_BYTES in shared memory, so even 256K-element rows are read once and several
blocks share a multiprocessor (one loads while another reduces). Blocks exchange their partial
statistics through a small global workspace across a cluster barrier. On 32-bit LayerNorm and
RMSNorm rows of up to 256 KB each block's slice arrives by one TMA transfer (RowPlan.bulk).

Where layouts could overlap, the H200 decided (benchmarks/results/norms/norms_nvidia_h200.md and
the row_plans_*_nvidia_h200.md sweeps, which also set the plans' thread counts). 32-bit rows
stay in registers up to 32768 elements: their smem_row blocks (over 64 KB) would hold an SM
alone, and registers measured 4 points of copy faster there (LayerNorm 91 against 88, softmax
96 against 91 at 32K float32). smem_row wins on rows of up to 64 KB (LayerNorm, softmax; 128 KB
for RMSNorm, whose lone block per SM still beat the cluster by 3 points at 64K bfloat16): one
block keeps the whole row and no cluster barrier waits. cluster_row starts beyond and is
preferred there (longer rows leave a lone smem_row block per SM, stalled between its passes;
cluster_row reached 77-90% of copy bandwidth where stream_row's second read held it near 62%);
both win over stream_row. Should cluster_row be denied, smem_row still serves the rows it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from tileops import Kernel

from .compile import build_program

ITEMSIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# The widest load one thread issues (ld.global.v4.b32): vectors are 16 bytes or a divisor of n.
VECTOR_BYTES = 16
WARP = 32
MAX_THREADS = 1024
# Threads of a block that holds several short rows: 8 warps keep an SM's schedulers fed while
# leaving room for 8 such blocks per SM (2048 threads).
SHORT_BLOCK_THREADS = 256
# A lane keeps at most this many float32 values of its row in registers: 16 data registers
# out of the 64 a thread has when 1024 threads share an SM's 64K registers.
REGISTER_VALUES = 16
# A warp holds a short row when every lane keeps at most 32 elements (two 16-byte vectors of
# float32, four of 16-bit types): beyond that one block per row has more lanes to spread over.
SHORT_ROW_MAX = WARP * 32
REGISTER_ROW_MAX = MAX_THREADS * REGISTER_VALUES
# 32-bit rows stay in registers up to twice as long (module docstring): 512 lanes of 64 values.
WIDE_REGISTER_ROW_MAX = 2 * REGISTER_ROW_MAX
# block_row: a lane keeps up to 8 vectors (128 bytes of the row), and a block has at least 8
# warps. At 16K 16-bit elements that is 256 threads and two blocks per SM: 1024 threads of 16
# values each left one block per SM, idle between its passes (55-70% of copy against 94-97% in
# the H200 row_plans sweep); at 8K, 256 threads beat 128 and 512.
BLOCK_ROW_VECTORS = 8
BLOCK_ROW_MIN_THREADS = 8 * WARP
# 32-bit rows take as few as 4 warps: at 4K float32, 128 threads of 8 vectors reached 97.3 / 97.1
# / 97.4% of copy (LayerNorm / RMSNorm / softmax) against 94.1 / 96.1 / 97.2 for 256 threads of
# 4 (row_plans_block_row, 2026-11-29); 16-bit rows keep 8 warps (LayerNorm 4K bf16: 95.0
# against 88.8 with 128 threads).
WIDE_BLOCK_ROW_MIN_THREADS = 4 * WARP
# Threads one long row gets (smem_row, stream_row).
LONG_ROW_THREADS = 1024
# smem_row: a row of at most 64 KB leaves room for three blocks per SM, and then 256 threads
# each (16 vectors in flight) measured best; a longer row leaves one block per SM, which needs
# all LONG_ROW_THREADS.
SMALL_SMEM_ROW_BYTES = 64 * 1024
SMALL_SMEM_ROW_THREADS = 256
# Those 64 KB rows arrive faster by TMA (RowPlan.bulk) for RMSNorm and softmax: 95.9 against
# 92.7% of copy, and 92.9 / 92.7 against 91.1 / 90.2 in two runs, at 32K bfloat16; LayerNorm
# lost (85.7 against 88.1), as did every 128 KB row (RMSNorm 64K: 88.8 against 91.3)
# (row_plans_smem_row_tma and softmax_exponent_ab, 2026-11-29).
# Registers a lane needs beside the values it keeps: addresses, loop state, the reduction.
REGISTER_OVERHEAD = 24
REGISTER_FILE = 65536  # 32-bit registers per SM on sm_80 .. sm_90
THREADS_PER_SM = {80: 2048, 86: 1536, 89: 1536, 90: 2048}
# Shared memory a long-row block keeps for its cross-warp reductions (a few float32 per warp).
REDUCE_SCRATCH_BYTES = 1024
# Archs the kernels are compiled and checked for; nothing in them needs more than sm_80.
AMPERE_AND_LATER = frozenset({80, 86, 89, 90})
CLUSTER_ARCHS = frozenset({90})  # thread-block clusters: sm_90 and later
# cluster_row: cluster sizes, threads per block, and the slice a block keeps (three such
# blocks fit an sm_90 multiprocessor's shared memory). 16 is beyond the portable sizes (the
# launcher sets the non-portable attribute): at 1 MB float32 rows its 64 KB slices reached
# 78-83% of copy against 71-80% for 8 slices of 128 KB (row_plans_cluster_row, 2026-11-29).
# A row too long for 16 such slices takes larger ones on a portable cluster, one block per SM,
# and then the most threads (best in the plan sweep).
CLUSTER_SIZES = (2, 4, 8, 16)
CLUSTER_THREADS = 512
CLUSTER_SLICE_BYTES = 64 * 1024
CLUSTER_LONE_SIZE = 8
CLUSTER_LONE_BLOCK_THREADS = MAX_THREADS
# 32-bit LayerNorm and RMSNorm rows of up to 64K elements (256 KB): 32 KB slices of 256 threads
# (six blocks per SM) brought by TMA (RowPlan.bulk) reached 85 and 90.5% of copy at 64K float32,
# against 81 and 88 read through the lanes and 81.5 and 88.7 for the 64 KB slices otherwise
# served (row_plans_cluster_row, 2026-11-29, two runs). TMA lost elsewhere: 3-8 points for
# softmax, whose two walks over shared memory wait for the whole slice, and for longer or
# 16-bit rows.
BULK_ROW_BYTES = 256 * 1024
BULK_SLICE_BYTES = 32 * 1024
BULK_THREADS = 256
# Partials exchanged in shared memory (RowPlan.dsmem) on clusters of up to DSMEM_CLUSTER_MAX
# blocks, or of blocks of up to DSMEM_WIDE_CLUSTER_THREADS, read through the lanes: 2.5-3 points
# of copy at 64K bf16 LayerNorm and softmax and float32 softmax (84.0 / 86.7 / 89.9 against
# 81.5 / 83.7 / 87.9), 0-2 elsewhere at 64K-256K, -0.6 at worst (bf16 RMSNorm 256K); 16 blocks
# of 512 threads lost 2-11 points (each block writes to 16), of 256 threads gained 0.4-3.3;
# TMA-loaded slices lost 0.7 (row_plans_cluster_row_dsmem, 2026-11-29, two runs).
DSMEM_CLUSTER_MAX = 8
DSMEM_WIDE_CLUSTER_THREADS = 256
# smem_row beat cluster_row on rows of up to this many bytes: cluster_row starts beyond
# (a family may differ: ClusterRow.smem_row_over_cluster_bytes).
SMEM_ROW_OVER_CLUSTER_BYTES = 64 * 1024


@dataclass(frozen=True)
class RowPlan:
    """Threads of one row: `lanes` threads per row, `rows` rows per block, `chunks` vectors of
    `vec` elements per lane; `hold` is where the row waits: registers, shared or nowhere.
    `blocks_per_sm` is the residency the compiler must leave registers for (launch bounds);
    `cluster` blocks share one row, a slice each (cluster_row). `one_pass`: LayerNorm gathers
    its statistics while the row loads, as stream_row always does, with no pass over shared
    memory before the output: each lane sums x and x^2 shifted by its own first element, and
    the lanes' (count, mean, M2) merge as Chan's. (A softmax running max per vector measured
    slower than its two passes at every length, so softmax has no such option.) `bulk`: the
    block's slice arrives in shared memory by TMA (sm_90) before any lane reads it, instead of
    through the lanes' registers (bulk_eligible says which plans can). `scaled_exp` (softmax,
    held rows): each exponential is one fused multiply-add from the max in log2 units (tiles.
    exp_below) instead of a subtract and a multiply; 16-bit rows in shared memory take it.
    `dsmem` (cluster_row): the blocks write their partial statistics into each other's shared
    memory (tiles.exchange_partials) instead of the global workspace (DSMEM_CLUSTER_MAX)."""

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


def _pow2_ceil(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def vector_width(n: int, dtype: torch.dtype) -> int:
    """The widest power-of-two vector of at most 16 bytes that divides n (so every row starts
    aligned: rows are n elements apart)."""
    vec = VECTOR_BYTES // ITEMSIZE[dtype]
    while n % vec:
        vec //= 2
    return vec


def warp_rows_plan(n: int, dtype: torch.dtype) -> RowPlan:
    """Just enough lanes (at most a warp) that each keeps one to four vectors; the rest of
    the block's threads take further rows."""
    vec = vector_width(n, dtype)
    lanes = min(WARP, _pow2_ceil(_ceil_div(n, vec)))
    return RowPlan("registers", SHORT_BLOCK_THREADS // lanes, lanes, vec, _ceil_div(n, lanes * vec))


def block_row_plan(n: int, dtype: torch.dtype, threads: int | None = None) -> RowPlan:
    """`threads` lanes if given, else the fewest threads (at least BLOCK_ROW_MIN_THREADS,
    WIDE_BLOCK_ROW_MIN_THREADS for 32-bit rows) that keep at most BLOCK_ROW_VECTORS vectors
    each, twice as many beyond REGISTER_ROW_MAX (32-bit rows: 512 threads of 64 values beat
    1024 of 32 by 1-5 points at 32K)."""
    vec = vector_width(n, dtype)
    vectors = BLOCK_ROW_VECTORS if n <= REGISTER_ROW_MAX else 2 * BLOCK_ROW_VECTORS
    fewest = _pow2_ceil(_ceil_div(_ceil_div(n, vec), vectors))
    least = WIDE_BLOCK_ROW_MIN_THREADS if ITEMSIZE[dtype] == 4 else BLOCK_ROW_MIN_THREADS
    lanes = threads or min(MAX_THREADS, max(least, fewest))
    return RowPlan("registers", 1, lanes, vec, _ceil_div(n, lanes * vec))


def long_row_plan(n: int, dtype: torch.dtype, hold: str) -> RowPlan:
    """A whole block per long row: the most loads in flight for one SM's share of bandwidth,
    except small smem_row rows, whose blocks share an SM (SMALL_SMEM_ROW_BYTES)."""
    vec = vector_width(n, dtype)
    small = hold == "shared" and n * ITEMSIZE[dtype] <= SMALL_SMEM_ROW_BYTES
    lanes = SMALL_SMEM_ROW_THREADS if small else LONG_ROW_THREADS
    return RowPlan(hold, 1, lanes, vec, _ceil_div(n, lanes * vec))


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
        chunks = _ceil_div(n, size * threads * vec)
        plan = RowPlan("shared", 1, threads, vec, chunks, cluster=size)
        if plan.slice * ITEMSIZE[dtype] <= slice_bytes:
            return plan
    lanes = CLUSTER_LONE_BLOCK_THREADS
    chunks = _ceil_div(n, CLUSTER_LONE_SIZE * lanes * vec)
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


def with_occupancy(plan: RowPlan, call: Any) -> RowPlan:
    """`plan` with the most blocks per SM that its registers, threads and shared memory allow:
    while one block reduces or writes, another loads."""
    kept = plan.chunks * plan.vec if plan.hold == "registers" else plan.vec
    registers = _ceil_div(kept + REGISTER_OVERHEAD, 8) * 8
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


def smem_bytes(n: int, dtype: torch.dtype) -> int:
    """Shared memory a smem_row block needs for a row of n elements."""
    return plan_smem_bytes(long_row_plan(n, dtype, "shared"), dtype)


class RowKernel(Kernel):
    """Base of the TileLang row kernels: dtype refusal, build identity and the compiled call.

    Subclasses declare `layout` (which plan), their region (`region_refusal`) and
    `program(plan, call)`, the TileLang program factory for one build identity.
    """

    supported_archs = AMPERE_AND_LATER
    layout: ClassVar[str]

    @classmethod
    def refusal(cls, call: Any) -> str | None:
        if call.dtype not in ITEMSIZE:
            return (
                f"{call.dtype} is not served: these kernels compute in float32, which would "
                "lose float64 precision; the torch reference kernels serve it"
            )
        return cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        raise NotImplementedError

    @classmethod
    def plan(cls, call: Any) -> RowPlan:
        if cls.layout == "warp_rows":
            plan = warp_rows_plan(call.n, call.dtype)
        elif cls.layout == "block_row":
            plan = cls.block_plan(call)
        elif cls.layout == "cluster_row":
            plan = cls.cluster_plan(call)
        elif cls.layout == "smem_row":
            plan = cls.smem_plan(call)
        else:
            plan = long_row_plan(call.n, call.dtype, "none")
        return with_occupancy(plan, call)

    @classmethod
    def build_fields(cls, call: Any) -> tuple[Hashable, ...]:
        """Call-spec fields that change the compiled code besides dtype and n (eps, affine)."""
        return ()

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Any]:
        """Identity: arch, dtype, n, the plan (which the device facts shape) and the family's
        baked-in fields."""
        plan = cls.plan(call)
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, plan, *cls.build_fields(call))

        return identity, lambda: cls.build(plan, call, f"{cls.__name__}{identity}")

    @classmethod
    def build(cls, plan: RowPlan, call: Any, name: str) -> RowKernel:
        """The kernel of `plan` for `call`, compiled once across processes under `name`. Partials
        exchanged in shared memory (RowPlan.dsmem) arrive while the block still reduces, so its
        buffers each keep a region of their own (no reuse of a buffer TileLang deems dead)."""
        configs = {"tl.disable_shared_memory_reuse": True} if plan.dsmem else None
        program = build_program(name, cls.program(plan, call), call.arch, pass_configs=configs)
        return cls(program, plan)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        raise NotImplementedError

    def __init__(self, compiled: Any, plan: RowPlan) -> None:
        self.compiled = compiled
        self.plan = plan

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The cluster's exchange of partial statistics, (rows, cluster, 2) float32; none
        without a cluster or with RowPlan.dsmem."""
        if not self.plan.global_partials:
            return ()
        shape = (x.shape[0], self.plan.cluster, 2)
        return (torch.empty(shape, dtype=torch.float32, device=x.device),)


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
    # bring them (RowPlan.bulk).
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
    # One read over stream_row's two; over smem_row on the rows it starts at (module docstring).
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


def register_row_max(dtype: torch.dtype) -> int:
    """The longest row block_row keeps in registers (module docstring)."""
    return WIDE_REGISTER_ROW_MAX if ITEMSIZE[dtype] == 4 else REGISTER_ROW_MAX


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
