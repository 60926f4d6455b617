"""The held layouts' program (block, smem, cluster and group channel): the channel read once
into registers or shared memory, the statistics and the output from what is held."""

from __future__ import annotations

from typing import Any

from .._common.lanes import RowPlan
from .program_parts import Shape, epilogue, f32


def slot(plan: RowPlan, k: Any, local: Any) -> Any:
    """Where the lane's k-th vector, the block's `local`-th, is held: registers are indexed by
    constants (k), shared memory by the vector's place in the block's part."""
    return k * plan.vec if plan.hold == "registers" else local * plan.vec


def held_channel_body(shape: Shape, batch: int, plan: RowPlan, ticketed: bool = False):
    """block, smem, cluster and group channel: the channel read once into `plan.hold`
    (float32 registers, or shared memory in x's dtype), then the exact mean, the exact squared
    deviations and the output, all from what is held. In parts, block `part` holds the
    channel's vectors [part * held, (part + 1) * held) and the blocks' (sum, M2) meet in
    S[channel, part] across the cluster barrier, or, `ticketed` (group_channel), once Q counts
    every part arrived (Chan's merge)."""
    import tilelang.language as T

    from .._common import tiles

    lanes, vec, runs, cluster = plan.lanes, plan.vec, shape.runs, plan.cluster
    vectors = batch * runs
    held = plan.chunks * lanes  # vectors one block holds
    exact = held * cluster == vectors
    count = float(batch * shape.spatial)
    in_registers = plan.hold == "registers"

    def part_values(part):
        return T.Cast("float32", T.min(T.max(vectors - part * held, 0), held) * vec)

    launch = tiles.group_launch if ticketed else tiles.launch
    write_channel = _write_channel(shape, batch, plan)

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
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
                            store[slot(plan, k, local) + v] = f32(
                                X[j // runs, c, (j % runs) * vec + v]
                            )
                    else:
                        for v in T.vectorized(vec):
                            store[slot(plan, k, local) + v] = X[j // runs, c, (j % runs) * vec + v]
                    for v in T.vectorized(vec):
                        t[v] = store[slot(plan, k, local) + v]
                    for v in T.unroll(vec):
                        total += t[v]
            part_total = tiles.reduce_group(total, "sum", plan, scratch, 0, lane)
            part_mean = part_total / T.max(part_values(part), 1.0)
            for k in tiles.chunk_loop(plan):
                local = k * lanes + lane
                if exact or part * held + local < vectors:
                    for v in T.vectorized(vec):
                        t[v] = store[slot(plan, k, local) + v]
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
            write_channel(X, W, Bias, RM, RV, M, Y, store, t, mean, var, c, part, lane)

    return body


def _write_channel(shape: Shape, batch: int, plan: RowPlan):
    """The output walk over what the block holds, y = (x - mean) * rsqrt(var + eps) * w + b,
    and the running statistics' update by the channel's first block."""
    import tilelang.language as T

    from .._common import tiles

    _, update_stats = epilogue(shape)
    lanes, vec, runs = plan.lanes, plan.vec, shape.runs
    vectors, held = batch * runs, plan.chunks * lanes
    exact = held * plan.cluster == vectors
    count = float(batch * shape.spatial)

    @tiles.macro("mean", "var")
    def write_channel(X, W, Bias, RM, RV, M, Y, store, t, mean, var, c, part, lane):
        scale = T.rsqrt(var + shape.eps)
        if shape.weight:
            scale = scale * f32(W[c])
        for k in tiles.chunk_loop(plan):
            local = k * lanes + lane
            j = part * held + local
            if exact or j < vectors:
                b, s = j // runs, (j % runs) * vec
                for v in T.vectorized(vec):
                    t[v] = store[slot(plan, k, local) + v]
                for v in T.vectorized(vec):
                    if shape.bias:
                        Y[b, c, s + v] = (t[v] - mean) * scale + f32(Bias[c])
                    else:
                        Y[b, c, s + v] = (t[v] - mean) * scale
        if lane == 0 and part == 0:
            update_stats(RM, RV, M, c, mean, var, count)

    return write_channel
