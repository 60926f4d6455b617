"""The forward in FlashAttention 3's manner for sm_90a: a producer warpgroup loads the K and V
tiles by TMA into a ring of `plan.stages` buffers (full and free mbarriers a slot), while two
consumer warpgroups (64 query rows each) issue tile t's Q K^T and tile t-1's P V as
asynchronous wgmma, run tile t's softmax while P V is still on the tensor cores, then rescale
the output. Masks, tiles visited, grouped-query heads and the outputs are those of
`fwd_program`; batch, q_len and kv_len are symbolic.
"""

from __future__ import annotations

from typing import Any

from tileops.ops import AttentionCall

from .._common.arith import DTYPE_NAMES
from .fwd_program import (
    LOG2E,
    finish_rows,
    fwd_shapes,
    key_tiles,
    mask_scores,
    online_softmax,
    softmax_state,
    store_rows,
)
from .plans import FwdPlan

CONSUMERS = 256  # two warpgroups: the MMA's 64 rows each, 128 query rows a block
PRODUCER = 128  # one warpgroup issuing TMA (its registers given back to the consumers)
WARPGROUP = 128
CONSUMER_REGISTERS, PRODUCER_REGISTERS = 240, 24
TURN_BARRIER = 8  # named barriers 8 and 9: the consumers' turns (TileLang's own use lower ids)


def produce(bn: int, stages: int) -> Any:
    """The producer warpgroup: for each key tile, wait for its slot to be free, then load K
    and V into it by TMA (the full barrier counts the bytes). The ring's position starts
    after the `done` tiles the block loaded before (for its earlier query blocks)."""
    import tilelang.language as T

    @T.macro
    def load(K, V, k_tiles, v_tiles, k_full, v_full, k_free, v_free, b, kv_head, first, tiles,
             done):  # fmt: skip
        for t in T.serial(tiles):
            k_start = (first + t) * bn
            slot, lap = (done + t) % stages, ((done + t) // stages) & 1
            T.barrier_wait(k_free[slot], lap ^ 1)
            T.tma_copy(
                K[b, kv_head, k_start : k_start + bn, :], k_tiles[slot, :, :],
                barrier=k_full[slot],
            )  # fmt: skip
            T.barrier_arrive(k_full[slot])
            T.barrier_wait(v_free[slot], lap ^ 1)
            T.tma_copy(
                V[b, kv_head, k_start : k_start + bn, :], v_tiles[slot, :, :],
                barrier=v_full[slot],
            )  # fmt: skip
            T.barrier_arrive(v_full[slot])

    return load


def turns(plan: FwdPlan) -> tuple[Any, Any]:
    """(take, give) of FlashAttention 3's ping-pong: with `plan.pingpong` each consumer
    warpgroup issues its MMAs only in its turn (named barrier TURN_BARRIER + its index, synced
    by it and arrived at by the other), so one's softmax runs while the other's MMAs do;
    without it, nothing. The second warpgroup gives the first its first turn."""
    import tilelang.language as T

    @T.macro
    def take(wg):
        T.sync_threads(TURN_BARRIER + wg, CONSUMERS)

    @T.macro
    def give(wg):
        T.named_barrier_arrive(TURN_BARRIER + 1 - wg, CONSUMERS)

    @T.macro
    def nothing(wg):
        T.evaluate(0)

    return (take, give) if plan.pingpong else (nothing, nothing)


def consume(call: AttentionCall, plan: FwdPlan) -> Any:
    """The consumer warpgroups over the key tiles: tile 0's Q K^T and softmax, then for each
    next tile its Q K^T and the previous tile's P V issued together, the softmax while P V
    runs, the rescale; the last P V. Each issue in the warpgroup's turn where the plan
    ping-pongs (`turns`); the first warpgroup gives its turn after the last, the second keeps
    it, so every turn given is taken. The ring's position starts after `done` tiles."""
    import tilelang.language as T

    bn, stages = plan.block_n, plan.stages
    softmax = online_softmax(plan.block_m, bn, call.scale * LOG2E)
    mask = mask_scores(call, plan)
    take, give = turns(plan)
    full_row = T.GemmWarpPolicy.FullRow

    @T.macro
    def attend(q_tile, k_tiles, v_tiles, k_full, v_full, k_free, v_free, scores, probs, acc,
               row_max, prev_max, scaled_max, rescale, tile_sum, row_sum,
               q_start, first, tiles, q_len, kv_len, done):  # fmt: skip
        wg = T.get_thread_binding() // WARPGROUP
        if wg == 1:
            give(wg)
        slot, lap = done % stages, (done // stages) & 1
        T.barrier_wait(k_full[slot], lap)
        mask(scores, q_start, first * bn, q_len, kv_len)
        take(wg)
        T.wgmma_gemm(q_tile, k_tiles[slot, :, :], scores, transpose_B=True, policy=full_row)
        give(wg)
        T.wait_wgmma(0)
        T.barrier_arrive(k_free[slot])
        softmax(scores, row_max, prev_max, scaled_max, rescale, tile_sum, row_sum)
        T.copy(scores, probs)
        for t in T.serial(1, tiles):
            slot, lap = (done + t) % stages, ((done + t) // stages) & 1
            prev, prev_lap = (done + t - 1) % stages, ((done + t - 1) // stages) & 1
            T.barrier_wait(k_full[slot], lap)
            mask(scores, q_start, (first + t) * bn, q_len, kv_len)
            take(wg)
            T.wgmma_gemm(q_tile, k_tiles[slot, :, :], scores, transpose_B=True, policy=full_row)
            T.barrier_wait(v_full[prev], prev_lap)
            T.wgmma_gemm(probs, v_tiles[prev, :, :], acc, policy=full_row)
            give(wg)
            T.wait_wgmma(1)  # Q K^T, the older; P V may still run
            T.barrier_arrive(k_free[slot])
            softmax(scores, row_max, prev_max, scaled_max, rescale, tile_sum, row_sum)
            T.wait_wgmma(0)
            T.barrier_arrive(v_free[prev])
            for i, j in T.Parallel(plan.block_m, call.head_dim):
                acc[i, j] *= rescale[i]
            T.copy(scores, probs)
        last = done + tiles - 1
        last, last_lap = last % stages, (last // stages) & 1
        T.barrier_wait(v_full[last], last_lap)
        take(wg)
        T.wgmma_gemm(probs, v_tiles[last, :, :], acc, policy=full_row)
        if wg == 0:
            give(wg)
        T.wait_wgmma(0)
        T.barrier_arrive(v_free[last])

    return attend


def ws_block(call: AttentionCall, plan: FwdPlan) -> Any:
    """The macro of one block: query block `q_block` of `head` in sequence `b`, the producer
    and the consumers over its key tiles, the finished rows stored."""
    import tilelang.language as T

    dtype, dim = DTYPE_NAMES[call.dtype], call.head_dim
    group = call.heads // call.kv_heads
    bm, bn, stages = plan.block_m, plan.block_n, plan.stages
    finish = finish_rows(bm, dim, call.scale)
    store = store_rows(bm)
    load, attend = produce(bn, stages), consume(call, plan)
    neg_inf = -T.infinity("float32")

    @T.macro
    def block(Q, K, V, Out, Lse, q_block, head, b, q_len, kv_len):
        q_tile = T.alloc_shared((bm, dim), dtype)  # the output's staging at the end
        k_tiles = T.alloc_shared((stages, bn, dim), dtype)
        v_tiles = T.alloc_shared((stages, bn, dim), dtype)
        scores, probs, acc, rows = softmax_state(bm, bn, dim, dtype)
        row_max, prev_max, scaled_max, rescale, tile_sum, row_sum, lse = rows
        q_ready = T.alloc_barrier(arrive_count=CONSUMERS + PRODUCER)
        k_full = T.alloc_barrier(arrive_count=[PRODUCER] * stages)
        v_full = T.alloc_barrier(arrive_count=[PRODUCER] * stages)
        k_free = T.alloc_barrier(arrive_count=[CONSUMERS] * stages)
        v_free = T.alloc_barrier(arrive_count=[CONSUMERS] * stages)
        tx = T.get_thread_binding()
        kv_head = head // group
        q_start = q_block * bm
        first, end = key_tiles(call, plan, q_start, q_len, kv_len)
        T.tma_copy(Q[b, head, q_start : q_start + bm, :], q_tile, barrier=q_ready)
        T.barrier_arrive(q_ready)
        if tx >= CONSUMERS:
            T.set_max_nreg(PRODUCER_REGISTERS, 0)
            load(K, V, k_tiles, v_tiles, k_full, v_full, k_free, v_free, b, kv_head, first,
                 end - first, 0)  # fmt: skip
        else:
            T.set_max_nreg(CONSUMER_REGISTERS, 1)
            T.fill(acc, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)
            T.barrier_wait(q_ready, 0)
            if end - first > 0:
                attend(q_tile, k_tiles, v_tiles, k_full, v_full, k_free, v_free, scores,
                       probs, acc, row_max, prev_max, scaled_max, rescale, tile_sum, row_sum,
                       q_start, first, end - first, q_len, kv_len, 0)  # fmt: skip
            finish(acc, row_max, row_sum, lse)
            store(acc, q_tile, lse, Out, Lse, b, head, q_start, q_len)

    return block


def fwd_ws_program(call: AttentionCall, plan: FwdPlan) -> Any:
    """The prim_func of the overlapped forward for `call` under `plan` (block_m 128): a block
    per (query block, head, sequence), the query blocks fastest; with `plan.heavy_first` on a
    causal call, slowest and the last first, so the blocks with the most keys start first and
    the light ones fill the last wave."""
    import tilelang.language as T

    from .._common import tiles

    batch, q_len, kv_len = T.dynamic("batch"), T.dynamic("q_len"), T.dynamic("kv_len")
    blocks, heads, threads = T.ceildiv(q_len, plan.block_m), call.heads, CONSUMERS + PRODUCER
    block = ws_block(call, plan)

    if plan.heavy_first and call.causal:

        def main(Q, K, V, Out, Lse):  # "main" either way: the module's entry (compile.Launch)
            with T.Kernel(heads, batch, blocks, threads=threads) as (head, b, bz):
                block(Q, K, V, Out, Lse, blocks - 1 - bz, head, b, q_len, kv_len)

    else:

        def main(Q, K, V, Out, Lse):
            with T.Kernel(blocks, heads, batch, threads=threads) as (bx, head, b):
                block(Q, K, V, Out, Lse, bx, head, b, q_len, kv_len)

    shapes = fwd_shapes(call, batch, q_len, kv_len)
    return tiles.prim_func(main, DTYPE_NAMES[call.dtype], {"Lse": "float32"}, **shapes)


def work_item(call: AttentionCall, blocks, batch, item) -> tuple:
    """(query block, head, sequence) of a persistent block's `item`: heads fastest (a group's
    heads read the same K and V close in time), query blocks slowest, the last first on a
    causal call (the items with the most keys come first, the light ones fill the end)."""
    heads = call.heads
    q_block = item // (heads * batch)
    if call.causal:
        q_block = blocks - 1 - q_block
    return q_block, item % heads, item // heads % batch


def fwd_persistent_program(call: AttentionCall, plan: FwdPlan) -> Any:
    """The overlapped forward as `plan.workers` persistent blocks, each walking the items
    (query block, head, sequence) `workers` apart. The producer loads an item's Q once the
    consumers are done with the previous one's, then its key tiles through the same ring, so
    the next item's loads overlap the current one's last tiles and its output's store; the
    output is staged in a tile of its own."""
    import tilelang.language as T

    from .._common import tiles

    dtype, dim = DTYPE_NAMES[call.dtype], call.head_dim
    group, workers = call.heads // call.kv_heads, plan.workers
    bm, bn, stages = plan.block_m, plan.block_n, plan.stages
    batch, q_len, kv_len = T.dynamic("batch"), T.dynamic("q_len"), T.dynamic("kv_len")
    blocks = T.ceildiv(q_len, bm)
    finish = finish_rows(bm, dim, call.scale)
    store = store_rows(bm)
    load, attend = produce(bn, stages), consume(call, plan)
    neg_inf = -T.infinity("float32")

    def main(Q, K, V, Out, Lse):
        with T.Kernel(workers, threads=CONSUMERS + PRODUCER) as worker:
            q_tile = T.alloc_shared((bm, dim), dtype)
            o_tile = T.alloc_shared((bm, dim), dtype)
            k_tiles = T.alloc_shared((stages, bn, dim), dtype)
            v_tiles = T.alloc_shared((stages, bn, dim), dtype)
            scores, probs, acc, rows = softmax_state(bm, bn, dim, dtype)
            row_max, prev_max, scaled_max, rescale, tile_sum, row_sum, lse = rows
            q_full = T.alloc_barrier(arrive_count=PRODUCER)
            q_free = T.alloc_barrier(arrive_count=CONSUMERS)
            k_full = T.alloc_barrier(arrive_count=[PRODUCER] * stages)
            v_full = T.alloc_barrier(arrive_count=[PRODUCER] * stages)
            k_free = T.alloc_barrier(arrive_count=[CONSUMERS] * stages)
            v_free = T.alloc_barrier(arrive_count=[CONSUMERS] * stages)
            done = T.alloc_var("int32", init=0)  # key tiles this block walked before
            items = T.ceildiv(blocks * call.heads * batch - worker, workers)
            if T.get_thread_binding() >= CONSUMERS:
                T.set_max_nreg(PRODUCER_REGISTERS, 0)
                for i in T.serial(items):
                    q_block, head, b = work_item(call, blocks, batch, worker + i * workers)
                    q_start = q_block * bm
                    first, end = key_tiles(call, plan, q_start, q_len, kv_len)
                    T.barrier_wait(q_free, (i & 1) ^ 1)
                    T.tma_copy(Q[b, head, q_start : q_start + bm, :], q_tile, barrier=q_full)
                    T.barrier_arrive(q_full)
                    load(K, V, k_tiles, v_tiles, k_full, v_full, k_free, v_free, b,
                         head // group, first, end - first, done)  # fmt: skip
                    done = done + end - first
            else:
                T.set_max_nreg(CONSUMER_REGISTERS, 1)
                for i in T.serial(items):
                    q_block, head, b = work_item(call, blocks, batch, worker + i * workers)
                    q_start = q_block * bm
                    first, end = key_tiles(call, plan, q_start, q_len, kv_len)
                    T.fill(acc, 0)
                    T.fill(row_sum, 0)
                    T.fill(row_max, neg_inf)
                    T.barrier_wait(q_full, i & 1)
                    if end - first > 0:
                        attend(q_tile, k_tiles, v_tiles, k_full, v_full, k_free, v_free,
                               scores, probs, acc, row_max, prev_max, scaled_max, rescale,
                               tile_sum, row_sum, q_start, first, end - first, q_len, kv_len,
                               done)  # fmt: skip
                    T.barrier_arrive(q_free)
                    finish(acc, row_max, row_sum, lse)
                    store(acc, o_tile, lse, Out, Lse, b, head, q_start, q_len)
                    done = done + end - first

    shapes = fwd_shapes(call, batch, q_len, kv_len)
    return tiles.prim_func(main, dtype, {"Lse": "float32"}, **shapes)
