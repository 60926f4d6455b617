"""The GEMM programs: one TileLang prim_func per tile (`tiles` holds the rules, `kernels` the
declarations). m is symbolic in every program; n and k are baked in, and so are the operands'
layouts (a stored (k, m) when `call.trans_a`, b (n, k) when `call.trans_b`: each tile is
copied as it is stored and T.gemm reads it transposed) and whether a bias is added."""

from __future__ import annotations

from typing import Any

import torch

from tileops.ops import GemmCall

from .._common.arith import DTYPE_NAMES, ceil_div, vector_width
from .tiles import SkinnyPlan, Tile

# Rasterize blocks in panels of this many tile rows so blocks running together share their
# B tiles in L2 (the Triton matmul tutorial's GROUP_M).
SWIZZLE_PANEL = 8
REDUCE_THREADS = 256
# TileLang lowerings that would pick wgmma and warp specialization on sm_90: off for the
# sm_80-style kernels, which build for plain sm_90 (their copies also say `disable_tma`: they
# serve shapes TMA cannot take).
MMA_SYNC_ONLY = {"tl.disable_warp_specialized": True, "tl.disable_wgmma": True}
NO_TMA = {"disable_tma": True}


def gemm_program(call: GemmCall, tile: Tile, tma: bool) -> Any:
    """C = op(A) @ op(B) (+ Bias) with `tile`: a pipelined k loop of T.copy into shared memory
    and T.gemm into a float32 fragment. On sm_90a (`tma`) TileLang lowers the copies to TMA and
    the product to wgmma, elsewhere (no `tma`, MMA_SYNC_ONLY) to cp.async and mma.sync. m is
    symbolic."""
    import tilelang.language as T

    n, k, dtype = call.n, call.k, DTYPE_NAMES[call.dtype]
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    m = T.dynamic("m")
    hints = None if tma else NO_TMA
    trans_a, trans_b = call.trans_a, call.trans_b
    a_tile_shape, b_tile_shape = stored(trans_a, bm, bk), stored(trans_b, bk, bn)
    add_bias = bias_epilogue(call, bm, bn)

    @T.macro
    def body(A, B, P, C, Count, Out, Bias):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), threads=tile.threads) as (bx, by):
            a_tile = T.alloc_shared(a_tile_shape, dtype)
            b_tile = T.alloc_shared(b_tile_shape, dtype)
            acc = T.alloc_fragment((bm, bn), "float32")
            T.use_swizzle(SWIZZLE_PANEL)
            T.clear(acc)
            for kk in T.Pipelined(T.ceildiv(k, bk), num_stages=tile.stages):
                if trans_a:
                    T.copy(A[kk * bk, by * bm], a_tile, annotations=hints)
                else:
                    T.copy(A[by * bm, kk * bk], a_tile, annotations=hints)
                if trans_b:
                    T.copy(B[bx * bn, kk * bk], b_tile, annotations=hints)
                else:
                    T.copy(B[kk * bk, bx * bn], b_tile, annotations=hints)
                T.gemm(a_tile, b_tile, acc, transpose_A=trans_a, transpose_B=trans_b,
                       policy=getattr(T.GemmWarpPolicy, tile.policy))  # fmt: skip
            if call.has_bias:
                add_bias(acc, Bias, bx)
            if tile.smem_epilogue:
                c_tile = T.alloc_shared((bm, bn), dtype)
                T.copy(acc, c_tile)
                T.copy(c_tile, C[by * bm, bx * bn])
            else:
                T.copy(acc, C[by * bm, bx * bn])

    return gemm_prim_func(body, dtype, {}, **operands(call, m), C=(m, n))


def stored(trans: bool, rows: Any, cols: Any) -> tuple:
    """The shape of a (rows, cols) operand, or of its tile, as it lies in memory."""
    return (cols, rows) if trans else (rows, cols)


def operands(call: GemmCall, m: Any) -> dict[str, tuple]:
    """A's and B's shapes as stored, and the bias's when the call adds one (gemm_prim_func's
    keywords)."""
    shapes = {"A": stored(call.trans_a, m, call.k), "B": stored(call.trans_b, call.k, call.n)}
    return {**shapes, "Bias": (call.n,)} if call.has_bias else shapes


def bias_epilogue(call: GemmCall, bm: int, bn: int) -> Any:
    """acc[i, j] += Bias[column] for the block's column tile `bx`, in float32 before C's one
    rounding (columns past n add nothing)."""
    import tilelang.language as T

    n = call.n

    @T.macro
    def add_bias(acc, Bias, bx):
        for i, j in T.Parallel(bm, bn):
            column = bx * bn + j
            acc[i, j] += T.if_then_else(column < n, T.cast(Bias[column], "float32"), 0.0)

    return add_bias


def skinny_program(call: GemmCall, plan: SkinnyPlan) -> Any:
    """Block (column tile, split) multiplies all m rows (one row tile) by its slice of k.
    Split: float32 partials into P[split * block_m + row, col]; unsplit: straight into C.
    Copies are cp.async, TMA's trailed at every decode shape (TUNING.md#skinny-split)."""
    import tilelang.language as T

    n, dtype = call.n, DTYPE_NAMES[call.dtype]
    tile, per_split = plan.tile, plan.k_tiles
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    split_k = plan.splits > 1
    m = T.dynamic("m")

    # The fixup's sum: each thread takes `vec` adjacent columns (one 16-byte float32 read per
    # split where n allows) and its passes are unrolled, so every split's reads are in flight at
    # once: the sum costs one L2 round trip, not one per element.
    vec = min(vector_width(n, torch.float32), bn)
    passes = ceil_div(bm * bn, tile.threads * vec)
    sum_splits = split_sum(call, plan, vec)
    trans_a, trans_b = call.trans_a, call.trans_b
    a_tile_shape, b_tile_shape = stored(trans_a, bm, bk), stored(trans_b, bk, bn)
    add_bias = bias_epilogue(call, bm, bn)

    @T.macro
    def fixup(P, Count, C, Bias, bx):
        """The split-k fixup: each block counts itself in for its column tile once its partials
        are written (release); the last to arrive (acquire) sums every split's partials of the
        tile into C and resets the counter for the next call."""
        tx = T.get_thread_binding()
        arrived = T.alloc_shared((1,), "int32")
        T.sync_threads()  # every thread's partials written before the count
        if tx == 0:
            arrived[0] = T.atomic_add(Count[bx], 1, memory_order="acq_rel", return_prev=True)
        T.sync_threads()
        if arrived[0] == plan.splits - 1:
            for i in T.unroll(passes):
                row = ((i * tile.threads + tx) * vec) // bn
                col = bx * bn + ((i * tile.threads + tx) * vec) % bn
                if row < m and col < n:
                    sum_splits(P, C, Bias, row, col)
            if tx == 0:
                Count[bx] = 0

    @T.macro
    def body(A, B, P, C, Count, Out, Bias):
        with T.Kernel(T.ceildiv(n, bn), plan.splits, threads=tile.threads) as (bx, split):
            a_tile = T.alloc_shared(a_tile_shape, dtype)
            b_tile = T.alloc_shared(b_tile_shape, dtype)
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for kk in T.Pipelined(per_split, num_stages=tile.stages):
                if trans_a:
                    T.copy(A[(split * per_split + kk) * bk, 0], a_tile, annotations=NO_TMA)
                else:
                    T.copy(A[0, (split * per_split + kk) * bk], a_tile, annotations=NO_TMA)
                if trans_b:
                    T.copy(B[bx * bn, (split * per_split + kk) * bk], b_tile, annotations=NO_TMA)
                else:
                    T.copy(B[(split * per_split + kk) * bk, bx * bn], b_tile, annotations=NO_TMA)
                T.gemm(a_tile, b_tile, acc, transpose_A=trans_a, transpose_B=trans_b)
            if split_k:
                T.copy(acc, C[split * bm, bx * bn])
            else:
                if call.has_bias:
                    add_bias(acc, Bias, bx)
                T.copy(acc, C[0, bx * bn])
            if split_k and plan.fixup:
                fixup(C, Count, Out, Bias, bx)

    if not split_k:
        return gemm_prim_func(body, dtype, {}, **operands(call, m), C=(m, n))
    tensors, dtypes = {**operands(call, m), "C": (plan.splits * bm, n)}, {"C": "float32"}
    if not plan.fixup:
        tensors.pop("Bias", None)  # the reduce kernel adds it
    else:
        tensors.update(Count=(ceil_div(n, bn),), Out=(m, n))
        dtypes["Count"] = "int32"
    return gemm_prim_func(body, dtype, dtypes, **tensors)


def split_sum(call: GemmCall, plan: SkinnyPlan, vec: int) -> Any:
    """C[row, col:col + vec] = the sum over splits of P[split * block_m + row, col:col + vec]
    (plus Bias[col:col + vec] when the call adds one), in float32, rounded once: the fixup's
    and the reduce kernel's sum."""
    import tilelang.language as T

    @T.macro
    def sum_splits(P, C, Bias, row, col):
        total = T.alloc_local((vec,), "float32")
        for v in T.vectorized(vec):
            total[v] = P[row, col + v]
        for s in T.unroll(1, plan.splits):
            for v in T.vectorized(vec):
                total[v] += P[s * plan.tile.block_m + row, col + v]
        if call.has_bias:
            for v in T.vectorized(vec):
                total[v] += T.cast(Bias[col + v], "float32")
        for v in T.vectorized(vec):
            C[row, col + v] = total[v]

    return sum_splits


def reduce_program(call: GemmCall, plan: SkinnyPlan) -> Any:
    """C[row, col] = sum over splits of P[split * block_m + row, col] (+ Bias[col]), in
    float32, rounded once. Threads take consecutive vectors of C (coalesced reads of every
    split's rows)."""
    import tilelang.language as T

    n, dtype, bm = call.n, DTYPE_NAMES[call.dtype], plan.tile.block_m
    vec = vector_width(n, torch.float32)
    runs = n // vec
    m = T.dynamic("m")
    sum_splits = split_sum(call, plan, vec)

    @T.macro
    def body(A, B, P, C, Count, Out, Bias):
        with T.Kernel(T.ceildiv(m * runs, REDUCE_THREADS), threads=REDUCE_THREADS) as bx:
            g = bx * REDUCE_THREADS + T.get_thread_binding()
            if g < m * runs:
                sum_splits(P, C, Bias, g // runs, (g % runs) * vec)

    tensors = {"P": (plan.splits * bm, n), "C": (m, n)}
    if call.has_bias:
        tensors["Bias"] = (n,)
    return gemm_prim_func(body, dtype, {"P": "float32"}, **tensors)


def gemm_prim_func(body: Any, dtype: str, dtypes: dict[str, str], **tensors: tuple) -> Any:
    """The prim_func of body(A, B, P, C, Count, Out, Bias) over the GEMM family's tensors that
    `tensors` names (the others None), in this order: A and B, the float32 partials (P, or C
    where the skinny kernel writes them), C, the fixup's arrival counters and output, the
    bias."""
    from .._common import tiles

    def main(A=None, B=None, P=None, C=None, Count=None, Out=None, Bias=None):
        body(A, B, P, C, Count, Out, Bias)

    return tiles.prim_func(main, dtype, dtypes, **tensors)
