"""TileLang building blocks of the row kernels: per-lane row walks and group reductions.

Imported only from the program factories (inside a build), never at package import.
"""

from __future__ import annotations

import tilelang.language as T

from .arith import WARP
from .lanes import RowPlan

NEG_INF = float("-inf")
UNROLL = 8  # chunks in flight per lane in long rows: 8 x 16 bytes x 1024 lanes = 128 KB per SM


def chunk_loop(plan: RowPlan):
    """The loop over a lane's chunks: fully unrolled when the row is kept in registers (the
    array must be indexed by constants) or short, UNROLL chunks per step otherwise (loads in flight
    without a long unrolled body)."""
    if plan.hold == "registers" or plan.chunks <= UNROLL:
        return T.unroll(plan.chunks)
    return T.unroll(plan.chunks, annotations={"pragma_unroll_factor": UNROLL})


def warps(plan: RowPlan) -> int:
    return max(plan.lanes // WARP, 1)


def reduce_group(value, op: str, plan: RowPlan, scratch, slot: int, lane):
    """`value` reduced (op "sum" or "max") over the lanes of one row; every lane gets it.

    Lanes of a short row are a power-of-two group inside one warp: xor shuffles stay inside
    it. A block-wide row adds one shared-memory round between warps (`scratch`: one float32
    per warp, used by this reduction only).
    """
    width = min(plan.lanes, WARP)
    offsets = [width >> i for i in range(1, width.bit_length())]  # width/2, ..., 1
    return _reduce_group(value, op == "max", offsets, warps(plan), scratch, slot, lane)


@T.macro
def _reduce_group(value, is_max: bool, offsets: list, nwarps: int, scratch, slot: int, lane):
    acc = T.alloc_var("float32", init=value)
    for offset in offsets:
        if is_max:
            acc = T.max(acc, T.shfl_xor(acc, offset))
        else:
            acc = acc + T.shfl_xor(acc, offset)
    if nwarps > 1:
        if lane % WARP == 0:
            scratch[slot, lane // WARP] = acc
        T.sync_threads()
        acc = scratch[slot, 0]
        for w in T.unroll(1, nwarps):
            if is_max:
                acc = T.max(acc, scratch[slot, w])
            else:
                acc = acc + scratch[slot, w]
    return acc


@T.macro
def share_partials(S, row, part, first, second):
    """cluster_row: block `part` of `row` publishes its two partial statistics in S[row, part],
    then waits at the cluster barrier until every block of the cluster has published its own."""
    if T.get_thread_binding() == 0:
        S[row, part, 0] = first
        S[row, part, 1] = second
    T.cluster_sync()


@T.macro
def cluster_partials(parts: int):
    """RowPlan.dsmem, at launch: the cluster's partial statistics in this block's shared memory,
    P[0, part] for each block `part` of the row (exchange_partials fills it). Every block
    announces that it runs (its shared memory may be written): the exchange waits for that
    announcement instead of a full barrier."""
    T.cluster_arrive_relaxed()
    return T.alloc_shared((1, parts, 2), "float32")


@T.macro
def exchange_partials(P, part, first, second, parts: int):
    """RowPlan.dsmem: block `part` writes its two partial statistics into P[0, part] of every
    block of its cluster (distributed shared memory), then waits at the cluster barrier until
    every block has written its own: no round trip to L2 after the barrier, as share_partials'
    global workspace costs. Other blocks write P while this one still reduces, so the program
    must be compiled without shared-memory reuse (rows.base.RowKernel.build)."""
    mine = T.alloc_shared((2,), "float32")
    if T.get_thread_binding() == 0:
        mine[0] = first
        mine[1] = second
    T.cluster_wait()  # every block of the cluster runs (cluster_partials' announcement)
    for r in T.serial(parts):
        T.copy_cluster(mine, P[0, part, :], dst_block=r)
    T.cluster_sync()


def partials_at(plan: RowPlan, S, P, row):
    """Where a cluster's partial statistics are read: (buffer, row index), S[row] in the global
    workspace or P[0] in the block's shared memory (RowPlan.dsmem)."""
    return (P, 0) if plan.dsmem else (S, row)


@T.macro
def publish_partials(plan: RowPlan, S, P, row, part, first, second):
    """share_partials or, with RowPlan.dsmem, exchange_partials."""
    if plan.dsmem:
        exchange_partials(P, part, first, second, plan.cluster)
    else:
        share_partials(S, row, part, first, second)


# Blocks that meet through global memory instead of a cluster barrier (BatchNorm's
# group_channel), as CUDA the kernel imports: blocks take tickets in the order they start, so
# the blocks already running are always the first tickets, and a row's parts, consecutive
# tickets, wait only for blocks that run or will run once earlier rows finish (the same argument
# as a decoupled look-back scan's). Only the last row to start can be incomplete, so the device
# must hold a row's parts at once (the caller's region refuses smaller ones). The partials are
# read from L2 (__ldcg): other multiprocessors wrote them.
GROUP_SYNC_CUDA = """
__device__ __forceinline__ int tileops_take_ticket(void* tickets) {
  return atomicAdd(static_cast<int*>(tickets), 1);
}
__device__ __forceinline__ void tileops_arrive_and_wait(void* arrived, int parts) {
  __threadfence();
  atomicAdd(static_cast<int*>(arrived), 1);
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
  } while (seen < parts);
}
__device__ __forceinline__ float tileops_load_l2(const void* at) {
  return __ldcg(static_cast<const float*>(at));
}
"""


def group_launch(plan: RowPlan, m):
    """launch's grid as plain blocks, `plan.cluster` per row, with GROUP_SYNC_CUDA."""
    return T.Kernel(T.ceildiv(m, plan.rows) * plan.cluster, threads=plan.threads,
                    prelude=GROUP_SYNC_CUDA)  # fmt: skip


@T.macro
def take_ticket(Q, m, lane):
    """This block's place in start order, from the ticket counter Q[m] (after the rows'
    arrival counts Q[:m])."""
    mine = T.alloc_shared((1,), "int32")
    if lane == 0:
        tickets = T.access_ptr(Q[m], "rw")
        mine[0] = T.call_extern("int32", "tileops_take_ticket", tickets)
    T.sync_threads()
    return mine[0]


@T.macro
def gather_partials(S, Q, row, part, first, second, parts: int, lane):
    """group_launch's share_partials: publish this part's two statistics in S[row, part], wait
    until all `parts` of the row have (Q[row] counts them), and gather them into shared memory,
    returned as P[0, part] (partials_at's dsmem layout)."""
    P = T.alloc_shared((1, parts, 2), "float32")
    if lane == 0:
        S[row, part, 0] = first
        S[row, part, 1] = second
        arrived = T.access_ptr(Q[row], "rw")
        T.evaluate(T.call_extern("handle", "tileops_arrive_and_wait", arrived, parts))
    T.sync_threads()
    if lane < 2 * parts:
        P[0, lane // 2, lane % 2] = T.call_extern(
            "float32", "tileops_load_l2", T.access_ptr(S[row, lane // 2, lane % 2], "r")
        )
    T.sync_threads()
    return P


@T.macro
def merged_mean(S, row, parts: int, values):
    """The whole's mean from the parts' sums in S[row, :, 0] (share_partials), over `values`."""
    acc = T.alloc_var("float32", init=0.0)
    for p in T.unroll(parts):
        acc += S[row, p, 0]
    return acc / values


@T.macro
def merged_var(S, row, parts: int, values, mean, count_of):
    """Chan's merge of the parts' (sum, M2) in S[row]: the whole's variance over `values`, each
    part p holding `count_of(p)` of them."""
    acc = T.alloc_var("float32", init=0.0)
    for p in T.unroll(parts):
        gap = S[row, p, 0] / T.max(count_of(p), 1.0) - mean
        acc += S[row, p, 1] + count_of(p) * gap * gap
    return acc / values


def row_store(plan: RowPlan, dtype: str):
    """Where a lane keeps its row between passes: float32 registers, the block's shared memory
    in the input dtype (the row at its storage size), or nowhere (None: read X again)."""
    if plan.hold == "registers":
        return T.alloc_local((plan.chunks * plan.vec,), "float32")
    if plan.hold == "shared":
        return T.alloc_shared((plan.slice,), dtype)
    return None


def launch(plan: RowPlan, m):
    """The kernel over m rows: one block per plan.rows rows, times the cluster's blocks."""
    grid = T.ceildiv(m, plan.rows) * plan.cluster
    if plan.cluster == 1:
        return T.Kernel(grid, threads=plan.threads)
    return T.Kernel(grid, threads=plan.threads, cluster_dims=plan.cluster)


@T.macro
def bulk_load(X, store, plan: RowPlan, row, base):
    """RowPlan.bulk: the block's slice of `row` from `base` into `store` by TMA; every lane
    waits for all of it. The copy engine keeps the whole slice in flight, where lanes' own
    loads keep only their unrolled chunks."""
    if plan.bulk:
        arrived = T.alloc_barrier(plan.threads)
        T.tma_copy(X[row, base : base + plan.slice], store, barrier=arrived)
        T.barrier_arrive(arrived)
        T.mbarrier_wait_parity(arrived, 0)


@T.macro
def load(X, store, plan: RowPlan, row, lane, k, t, base=0):
    """First pass: the lane's k-th vector of `row` into float32 `t`, kept in `store`; `base`:
    where the block's slice starts in the row (cluster_row). After bulk_load the slice is
    already in `store`."""
    at = (k * plan.lanes + lane) * plan.vec
    col = base + at
    if plan.bulk:
        reload(X, store, plan, row, lane, k, t, base)
    elif plan.hold == "shared":
        for v in T.vectorized(plan.vec):
            store[at + v] = X[row, col + v]
        for v in T.vectorized(plan.vec):
            t[v] = store[at + v]
    else:
        for v in T.vectorized(plan.vec):
            t[v] = X[row, col + v]
        if plan.hold == "registers":
            for v in T.vectorized(plan.vec):
                store[k * plan.vec + v] = t[v]


@T.macro
def reload(X, store, plan: RowPlan, row, lane, k, t, base=0):
    """Later passes: the same vector again, from where `load` kept it (or from X)."""
    at = (k * plan.lanes + lane) * plan.vec
    if plan.hold == "registers":
        for v in T.vectorized(plan.vec):
            t[v] = store[k * plan.vec + v]
    elif plan.hold == "shared":
        for v in T.vectorized(plan.vec):
            t[v] = store[at + v]
    else:
        for v in T.vectorized(plan.vec):
            t[v] = X[row, base + at + v]


def macro(*refs: str):
    """T.macro whose parameters named in `refs` take a T.alloc_var by reference (T.Ref): the
    macro reads and assigns the caller's variable itself, where a plain parameter would bind a
    copy on entry. Set here: this package's postponed annotations would reach TileLang as text."""

    def decorate(fn):
        fn.__annotations__ = dict.fromkeys(refs, T.Ref)
        return T.macro(fn)

    return decorate


def prim_func(fn, dtype: str, dtypes: dict[str, str] | None = None, **shapes):
    """`T.prim_func(fn)` with each parameter a tensor of the shape given here, of `dtype` unless
    `dtypes` names another (float32 weights beside 16-bit rows, under mixed precision).

    This package uses postponed annotations, which TileLang cannot resolve for a closure's
    shapes. Each parameter gets its own tensor type: a shared one would bind them to one buffer.
    """
    dtypes = dtypes or {}
    fn.__annotations__ = {
        name: T.Tensor(shape, dtypes.get(name, dtype)) for name, shape in shapes.items()
    }
    return T.prim_func(fn)


@T.macro
def exp_gap(value, top):
    """exp(value - top), 0 while `top` is still -inf (no finite element seen yet): keeps the
    online softmax sum free of exp(-inf - (-inf)) = NaN until the row proves all -inf."""
    return T.if_then_else(top == NEG_INF, 0.0, exp_from(value, top))


LOG2E = 1.4426950408889634


@T.macro
def exp_from(value, top):
    """exp(value - top) as 2^((value - top) * log2 e): one ex2.approx (relative error about
    2^-22) instead of expf's range reduction; the row max makes the argument <= 0."""
    return T.exp2((value - top) * LOG2E)


@T.macro
def in_log2_units(value):
    """value * log2 e rounded once (__fmul_rn, never fused into a later add): the sums and the
    output subtract the very same float, so its rounding cancels in their quotient."""
    return T.call_extern("float32", "__fmul_rn", value, LOG2E)


@T.macro
def exp_below(value, scaled_top):
    """exp(value - top) from scaled_top = in_log2_units(top): one fused multiply-add, exact
    before its one rounding (__fmaf_rn: the compiler may not split it), and one ex2.approx."""
    return T.exp2(T.call_extern("float32", "__fmaf_rn", value, LOG2E, -scaled_top))
