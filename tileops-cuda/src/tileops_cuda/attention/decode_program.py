"""Split-KV decode in TileLang: the few query rows of each kv head (the heads of its group
times the query tokens, packed into one tile, so each key and value is read once per kv head)
against one slice of the keys per block, so that a small batch still fills the GPU; a second
kernel combines the slices' partial outputs by their log-sum-exps.

Q, Out and Lse keep q's (batch, heads, q_len) layout, so the host passes them with no view; the
partials are indexed by row, q viewed as (batch, heads * q_len, dim): row r of kv head h is
query head h * group + r // q_len, token r % q_len, standing at position length - q_len +
r % q_len, where length is the sequence's number of keys (its `Lens` entry, or the whole
cache). Masks as in the forward (`fwd_program.visible`). batch and the cache length are
symbolic.
"""

from __future__ import annotations

from typing import Any

from tileops.ops import AttentionCall

from .._common.arith import DTYPE_NAMES
from .fwd_program import LOG2E, finish_rows, online_softmax, visible
from .plans import DecodePlan

NO_TMA = {"disable_tma": True}  # cp.async where the plan takes no TMA


def split_program(
    call: Any, plan: DecodePlan, per_sequence: bool, block_size: int | None = None
) -> Any:
    """Partial (output, lse) of each (sequence, kv head, key slice): `OPart` (batch, heads *
    q_len, splits, dim) and `LsePart` (batch, heads * q_len, splits), float32, natural log;
    a slice with no key seen writes zeros and -inf. `block_size`: a paged cache of blocks of
    that many slots, found through `Table` (`paged_loads`); else one cache row per sequence."""
    import tilelang.language as T

    from .._common import tiles

    dtype, dim, q_len = DTYPE_NAMES[call.dtype], call.head_dim, call.q_len
    rows, bh, bn, splits = plan.rows, plan.block_h, plan.block_n, plan.splits
    group = call.heads // call.kv_heads
    batch = T.dynamic("batch")
    if block_size is None:
        capacity = T.dynamic("capacity")
    else:
        num_blocks, max_blocks = T.dynamic("num_blocks"), T.dynamic("max_blocks")
        capacity = max_blocks * block_size
    softmax = online_softmax(bh, bn, call.scale * LOG2E)
    finish = finish_rows(bh, dim, call.scale)
    neg_inf = -T.infinity("float32")
    load_tile = tile_loads(plan, block_size)

    def main(Q=None, K=None, V=None, Lens=None, Table=None, OPart=None, LsePart=None):
        with T.Kernel(splits, call.kv_heads, batch, threads=plan.threads) as (s, kv_head, b):
            q_tile = T.alloc_shared((bh, dim), dtype)
            k_tile = T.alloc_shared((bn, dim), dtype)
            v_tile = T.alloc_shared((bn, dim), dtype)
            scores = T.alloc_fragment((bh, bn), "float32")
            probs = T.alloc_shared((bh, bn), dtype)  # through shared: warps split the keys
            acc = T.alloc_fragment((bh, dim), "float32")
            stats = [T.alloc_fragment((bh,), "float32") for _ in range(7)]
            row_max, prev_max, scaled_max, rescale, tile_sum, row_sum, lse = stats
            length = Lens[b] if per_sequence else capacity
            chunk = T.ceildiv(T.ceildiv(capacity, splits), bn) * bn
            start = s * chunk
            stop = T.min(start + chunk, length)
            first = 0
            if call.window is not None:  # keys before every row's window: skipped
                first = T.max(length - q_len - call.window + 1 - start, 0) // bn
            for i, j in T.Parallel(bh, dim):  # the group's rows, then zeros to the MMA tile
                head = kv_head * group + i // q_len
                q_tile[i, j] = T.if_then_else(i < rows, Q[b, head, i % q_len, j], 0)
            T.fill(acc, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)
            for t in T.Pipelined(
                T.max(T.ceildiv(stop - start, bn) - first, 0), num_stages=plan.stages
            ):
                k_start = start + (first + t) * bn
                load_tile(K, Table, k_tile, b, kv_head, k_start, length)
                for i, j in T.Parallel(bh, bn):
                    seen = visible(call, length - q_len + i % q_len, k_start + j, stop)
                    scores[i, j] = T.if_then_else(seen & (i < rows), 0.0, neg_inf)
                T.gemm(q_tile, k_tile, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                softmax(scores, row_max, prev_max, scaled_max, rescale, tile_sum, row_sum)
                T.copy(scores, probs)
                for i, j in T.Parallel(bh, dim):
                    acc[i, j] *= rescale[i]
                load_tile(V, Table, v_tile, b, kv_head, k_start, length)
                T.gemm(probs, v_tile, acc, policy=T.GemmWarpPolicy.FullCol)
            finish(acc, row_max, row_sum, lse)
            for i, j in T.Parallel(bh, dim):
                if i < rows:
                    OPart[b, kv_head * rows + i, s, j] = acc[i, j]
            for i in T.Parallel(bh):
                if i < rows:
                    LsePart[b, kv_head * rows + i, s] = lse[i]

    paged = None if block_size is None else (num_blocks, max_blocks, block_size)
    shapes = split_shapes(call, plan, per_sequence, batch, capacity, paged)
    dtypes = {"Lens": "int32", "Table": "int32", "OPart": "float32", "LsePart": "float32"}
    return tiles.prim_func(main, dtype, dtypes, **shapes)


def split_shapes(call: Any, plan: DecodePlan, per_sequence: bool, batch, capacity, paged) -> dict:
    """The split kernel's tensors; `paged`: (num_blocks, max_blocks, block_size) of a paged
    cache (its K and V blocks, and the Table), else one cache row per sequence."""
    dim, total = call.head_dim, call.heads * call.q_len
    rows_of = (batch, call.kv_heads, capacity, dim)
    if paged is not None:
        rows_of = (paged[0], call.kv_heads, paged[2], dim)
    return {
        "Q": (batch, call.heads, call.q_len, dim),
        "K": rows_of,
        "V": rows_of,
        **({"Lens": (batch,)} if per_sequence else {}),  # else every sequence fills the cache
        **({"Table": (batch, paged[1])} if paged is not None else {}),
        "OPart": (batch, total, plan.splits, dim),
        "LsePart": (batch, total, plan.splits),
    }


def tile_loads(plan: DecodePlan, block_size: int | None) -> Any:
    """The macro that loads `plan.block_n` keys (or values) from `k_start` into a tile: from a
    sequence's cache row, or through the block table (`paged_loads`); TMA only where the plan
    takes it."""
    import tilelang.language as T

    loads = {} if plan.tma else {"annotations": NO_TMA}
    if block_size is not None:
        return paged_loads(block_size, plan.block_n, loads)
    bn = plan.block_n

    @T.macro
    def load(Cache, Table, tile, b, kv_head, k_start, length):
        T.copy(Cache[b, kv_head, k_start : k_start + bn, :], tile, **loads)

    return load


def paged_loads(block_size: int, bn: int, loads: dict) -> Any:
    """The macro that loads the `bn` keys (or values) from `k_start` of a paged cache into a
    tile: one block's slice where a block holds a tile (block_size a multiple of bn), else the
    tile's bn // block_size whole blocks. A block at or past the sequence's length is never
    looked up (its table entry may hold anything): block 0 stands in, its keys masked."""
    import tilelang.language as T

    if block_size % bn == 0:

        @T.macro
        def load(Cache, Table, tile, b, kv_head, k_start, length):
            block = T.if_then_else(k_start < length, Table[b, k_start // block_size], 0)
            offset = k_start % block_size
            T.copy(Cache[block, kv_head, offset : offset + bn, :], tile, **loads)

        return load

    @T.macro
    def load_blocks(Cache, Table, tile, b, kv_head, k_start, length):
        for p in T.unroll(bn // block_size):
            first = k_start + p * block_size
            block = T.if_then_else(first < length, Table[b, first // block_size], 0)
            T.copy(Cache[block, kv_head, 0:block_size, :],
                   tile[p * block_size : (p + 1) * block_size, :], **loads)  # fmt: skip

    return load_blocks


def combine_program(call: AttentionCall, plan: DecodePlan) -> Any:
    """Out (batch, heads, q_len, dim) and Lse (batch, heads, q_len) from the slices: lse =
    log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s; no key in any slice: zeros and
    -inf. One block per (row, sequence), a thread per dim."""
    import tilelang.language as T

    from .._common import tiles

    dtype, dim, splits = DTYPE_NAMES[call.dtype], call.head_dim, plan.splits
    q_len = call.q_len
    total = call.heads * q_len
    batch = T.dynamic("batch")
    neg_inf = -T.infinity("float32")

    def main(OPart, LsePart, Out, Lse):
        with T.Kernel(total, batch, threads=dim) as (row, b):
            col = T.get_thread_binding()
            top = T.alloc_var("float32", init=neg_inf)
            for s in T.serial(splits):
                top = T.max(top, LsePart[b, row, s])
            norm = T.alloc_var("float32", init=0.0)
            for s in T.serial(splits):
                gap = (LsePart[b, row, s] - top) * LOG2E
                norm = norm + T.if_then_else(top == neg_inf, 0.0, T.exp2(gap))
            lse = T.if_then_else(norm > 0, top + T.log2(norm) / LOG2E, neg_inf)
            value = T.alloc_var("float32", init=0.0)
            for s in T.serial(splits):
                weight = T.if_then_else(norm > 0, T.exp2((LsePart[b, row, s] - lse) * LOG2E), 0.0)
                value = value + weight * OPart[b, row, s, col]
            Out[b, row // q_len, row % q_len, col] = value
            if col == 0:
                Lse[b, row // q_len, row % q_len] = lse

    shapes = {
        "OPart": (batch, total, splits, dim),
        "LsePart": (batch, total, splits),
        "Out": (batch, call.heads, q_len, dim),
        "Lse": (batch, call.heads, q_len),
    }
    dtypes = {"OPart": "float32", "LsePart": "float32", "Lse": "float32"}
    return tiles.prim_func(main, dtype, dtypes, **shapes)
