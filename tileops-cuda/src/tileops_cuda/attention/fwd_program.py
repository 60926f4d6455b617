"""The FlashAttention-2 forward in TileLang: one block per (128 query rows, head, sequence),
walking the key tiles its mask reaches with an online softmax (running max and sum, the output
rescaled as the max grows), so that scores never leave the SM.

Masks: keys past kv_len, the causal mask aligned to the bottom right (query i at position
kv_len - q_len + i) and a sliding window; key tiles no row of the block sees are skipped, both
past the causal edge and before the window. Grouped-query attention maps query head h to kv
head h // (heads // kv_heads). A row that sees no key writes zeros and a log-sum-exp of -inf.
batch, q_len and kv_len are symbolic: one build serves every length.
"""

from __future__ import annotations

from typing import Any

from tileops.ops import AttentionCall

from .._common.arith import DTYPE_NAMES
from .plans import FwdPlan

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def key_tiles(call: AttentionCall, plan: FwdPlan, q_start, q_len, kv_len) -> tuple:
    """(first, end) key tile a block of rows from `q_start` reaches: causal stops at the last
    row's own position, a window starts window - 1 keys before the first row's."""
    import tilelang.language as T

    offset = kv_len - q_len
    end = T.ceildiv(kv_len, plan.block_n)
    if call.causal:
        last = T.min(kv_len, q_start + plan.block_m + offset)
        end = T.max(T.ceildiv(last, plan.block_n), 0)
    first = 0
    if call.window is not None:
        first = T.max(q_start + offset - call.window + 1, 0) // plan.block_n
    return first, end


def tile_masked(call: AttentionCall, plan: FwdPlan, q_start, k_start, q_len, kv_len):
    """Whether some row of the block from `q_start` misses some key of the tile from `k_start`
    (a TIR condition): the tile past kv_len, the causal edge past the first row's position, the
    window start past the last row's. Other tiles skip the mask."""
    offset = kv_len - q_len
    masked = k_start + plan.block_n > kv_len
    if call.causal:
        masked = masked | (k_start + plan.block_n - 1 > q_start + offset)
    if call.window is not None:
        masked = masked | (k_start <= q_start + plan.block_m - 1 + offset - call.window)
    return masked


def visible(call: AttentionCall, q_pos, k_pos, kv_len):
    """Whether the query at position `q_pos` sees the key at `k_pos` (a TIR condition)."""
    seen = k_pos < kv_len
    if call.causal:
        seen = seen & (k_pos <= q_pos)
    if call.window is not None:
        seen = seen & (k_pos > q_pos - call.window)
    return seen


def mask_scores(call: AttentionCall, plan: FwdPlan) -> Any:
    """Start a tile of scores at 0 where its key is seen and -inf where not; only tiles some
    row misses (`tile_masked`) evaluate the mask, the rest are cleared."""
    import tilelang.language as T

    neg_inf = -T.infinity("float32")

    @T.macro
    def mask(scores, q_start, k_start, q_len, kv_len):
        if tile_masked(call, plan, q_start, k_start, q_len, kv_len):
            for i, j in T.Parallel(plan.block_m, plan.block_n):
                seen = visible(call, q_start + i + kv_len - q_len, k_start + j, kv_len)
                scores[i, j] = T.if_then_else(seen, 0.0, neg_inf)
        else:
            T.clear(scores)

    return mask


def online_softmax(rows: int, cols: int, scale_log2: float) -> Any:
    """The online softmax step over one tile of scores `S` (masked ones -inf): new running max
    `M` (previous in `M_prev`), the factor `rescale` the earlier sum and output shrink by, the
    tile's exponentials in place of the scores, and the running sum `L`. A row still at -inf
    subtracts 0 instead of its max (`M_scaled`), so its exponentials and factor are exp2(-inf)
    = 0, never exp(-inf - -inf): one test a row, none an element."""
    import tilelang.language as T

    neg_inf = -T.infinity("float32")

    @T.macro
    def step(S, M, M_prev, M_scaled, rescale, tile_sum, L):
        T.copy(M, M_prev)
        T.reduce_max(S, M, dim=1, clear=False)
        for i in T.Parallel(rows):
            M_scaled[i] = T.if_then_else(M[i] == neg_inf, 0.0, M[i] * scale_log2)
            rescale[i] = T.exp2(M_prev[i] * scale_log2 - M_scaled[i])
        for i, j in T.Parallel(rows, cols):
            S[i, j] = T.exp2(S[i, j] * scale_log2 - M_scaled[i])
        T.reduce_sum(S, tile_sum, dim=1)
        for i in T.Parallel(rows):
            L[i] = L[i] * rescale[i] + tile_sum[i]

    return step


def finish_rows(rows: int, dim: int, scale: float) -> Any:
    """Out = acc / L and lse = M * scale + ln L, natural log; rows without a key (L == 0): zeros
    and -inf."""
    import tilelang.language as T

    @T.macro
    def finish(acc, M, L, lse):
        for i, j in T.Parallel(rows, dim):
            acc[i, j] = T.if_then_else(L[i] > 0, acc[i, j] / L[i], 0.0)
        for i in T.Parallel(rows):
            lse[i] = T.if_then_else(
                L[i] > 0, M[i] * scale + T.log2(L[i]) * LN2, -T.infinity("float32")
            )

    return finish


def store_rows(rows: int) -> Any:
    """Write a block's `rows` outputs (through a shared staging tile) and the log-sum-exps of
    the rows before q_len."""
    import tilelang.language as T

    @T.macro
    def store(acc, staging, lse, Out, Lse, b, head, q_start, q_len):
        T.copy(acc, staging)
        T.copy(staging, Out[b, head, q_start : q_start + rows, :])
        for i in T.Parallel(rows):
            if q_start + i < q_len:
                Lse[b, head, q_start + i] = lse[i]

    return store


def softmax_state(bm: int, bn: int, dim: int, dtype: str) -> tuple:
    """A block's fragments (allocated where called, inside its kernel): the scores and their
    probabilities, the output accumulator, the online softmax's rows (`online_softmax`:
    max, previous max, scaled max, rescale, tile sum, sum) and the log-sum-exps."""
    import tilelang.language as T

    rows = [T.alloc_fragment((bm,), "float32") for _ in range(7)]
    scores = T.alloc_fragment((bm, bn), "float32")
    probs = T.alloc_fragment((bm, bn), dtype)
    acc = T.alloc_fragment((bm, dim), "float32")
    return scores, probs, acc, tuple(rows)


def fwd_shapes(call: AttentionCall, batch, q_len, kv_len) -> dict:
    """The forward's tensors, (batch, heads, length, dim) and the (batch, heads, q_len) lse."""
    dim = call.head_dim
    return {
        "Q": (batch, call.heads, q_len, dim),
        "K": (batch, call.kv_heads, kv_len, dim),
        "V": (batch, call.kv_heads, kv_len, dim),
        "Out": (batch, call.heads, q_len, dim),
        "Lse": (batch, call.heads, q_len),
    }


def fwd_program(call: AttentionCall, plan: FwdPlan) -> Any:
    """The prim_func of the forward for `call`'s heads, dims, mask and dtype under `plan`."""
    import tilelang.language as T

    from .._common import tiles

    dtype, dim = DTYPE_NAMES[call.dtype], call.head_dim
    heads, group = call.heads, call.heads // call.kv_heads
    bm, bn = plan.block_m, plan.block_n
    batch, q_len, kv_len = T.dynamic("batch"), T.dynamic("q_len"), T.dynamic("kv_len")
    softmax = online_softmax(bm, bn, call.scale * LOG2E)
    finish = finish_rows(bm, dim, call.scale)
    neg_inf = -T.infinity("float32")
    store = store_rows(bm)
    mask = mask_scores(call, plan)
    full_row = T.GemmWarpPolicy.FullRow

    def main(Q, K, V, Out, Lse):
        with T.Kernel(T.ceildiv(q_len, bm), heads, batch, threads=plan.threads) as (bx, head, b):
            q_tile = T.alloc_shared((bm, dim), dtype)
            k_tile = T.alloc_shared((bn, dim), dtype)
            v_tile = T.alloc_shared((bn, dim), dtype)
            o_tile = T.alloc_shared((bm, dim), dtype)
            scores, probs, acc, rows = softmax_state(bm, bn, dim, dtype)
            row_max, prev_max, scaled_max, rescale, tile_sum, row_sum, lse = rows
            kv_head = head // group
            q_start = bx * bm
            T.copy(Q[b, head, q_start : q_start + bm, :], q_tile)
            T.fill(acc, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)
            first, end = key_tiles(call, plan, q_start, q_len, kv_len)
            for t in T.Pipelined(end - first, num_stages=plan.stages):
                k_start = (first + t) * bn
                T.copy(K[b, kv_head, k_start : k_start + bn, :], k_tile)
                mask(scores, q_start, k_start, q_len, kv_len)
                T.gemm(q_tile, k_tile, scores, transpose_B=True, policy=full_row)
                softmax(scores, row_max, prev_max, scaled_max, rescale, tile_sum, row_sum)
                T.copy(scores, probs)
                for i, j in T.Parallel(bm, dim):
                    acc[i, j] *= rescale[i]
                T.copy(V[b, kv_head, k_start : k_start + bn, :], v_tile)
                T.gemm(probs, v_tile, acc, policy=full_row)
            finish(acc, row_max, row_sum, lse)
            store(acc, o_tile, lse, Out, Lse, b, head, q_start, q_len)

    return tiles.prim_func(
        main, dtype, {"Lse": "float32"}, **fwd_shapes(call, batch, q_len, kv_len)
    )
