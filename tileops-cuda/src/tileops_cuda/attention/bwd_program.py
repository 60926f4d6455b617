"""The FlashAttention-2 backward in TileLang: one block per (`block_m` keys, kv head, sequence)
holds its K and V tiles and accumulates their gradients over every query tile of every query
head of the group that sees them; each step recomputes the probabilities from the forward's
log-sum-exp, and adds its share of dQ to a float32 buffer by atomics.

Per query tile, with P^T = exp(scale K Q^T - lse) masked and delta = rowsum(dO * O):
dV += P^T dO, dS^T = P^T * (V dO^T - delta), dK += dS^T Q, dQ += dS K; dK and dQ are scaled
by `scale` at the end (dQ by the caller, in float32). Masks are the forward's (`visible`);
query rows past q_len and rows that saw no key (lse -inf) add nothing. batch, q_len and kv_len
are symbolic: one build serves every length.
"""

from __future__ import annotations

from typing import Any

from tileops.ops import AttentionCall

from .._common.arith import DTYPE_NAMES
from .fwd_program import LOG2E, visible
from .plans import BwdPlan


def query_tiles(call: AttentionCall, plan: BwdPlan, k_start, q_len, kv_len) -> tuple:
    """(first, end) query tile that sees some key of the block from `k_start`: causal starts at
    the query standing at its first key, a window ends window - 1 queries past its last key."""
    import tilelang.language as T

    offset = kv_len - q_len
    first, end = 0, T.ceildiv(q_len, plan.block_n)
    if call.causal:
        first = T.max(k_start - offset, 0) // plan.block_n
    if call.window is not None:
        last_key = T.min(k_start + plan.block_m, kv_len) - 1
        end = T.ceildiv(T.max(T.min(q_len, last_key - offset + call.window), 0), plan.block_n)
    return first, T.max(end, first)


def probabilities(call: AttentionCall, plan: BwdPlan) -> Any:
    """P^T in place of the scores K Q^T: exp(scale s - lse) where the query sees the key, 0
    where it does not, past q_len, or where its row saw no key at all."""
    import tilelang.language as T

    bm, bn, scale_log2 = plan.block_m, plan.block_n, call.scale * LOG2E
    neg_inf = -T.infinity("float32")

    @T.macro
    def exp_masked(st, lse, q_start, k_start, q_len, kv_len):
        for i, j in T.Parallel(bm, bn):
            seen = visible(call, q_start + j + kv_len - q_len, k_start + i, kv_len)
            seen = seen & (q_start + j < q_len) & (lse[j] != neg_inf)
            st[i, j] = T.if_then_else(seen, T.exp2(st[i, j] * scale_log2 - lse[j] * LOG2E), 0.0)

    return exp_masked


def bwd_shapes(call: AttentionCall, batch, q_len, kv_len) -> dict:
    dim, heads, kv_heads = call.head_dim, call.heads, call.kv_heads
    return {
        "Q": (batch, heads, q_len, dim),
        "K": (batch, kv_heads, kv_len, dim),
        "V": (batch, kv_heads, kv_len, dim),
        "dO": (batch, heads, q_len, dim),
        "Lse": (batch, heads, q_len),
        "Delta": (batch, heads, q_len),
        "dQ": (batch, heads, q_len, dim),
        "dK": (batch, kv_heads, kv_len, dim),
        "dV": (batch, kv_heads, kv_len, dim),
    }


def bwd_program(call: AttentionCall, plan: BwdPlan) -> Any:
    """The prim_func of the backward for `call`'s heads, dims, mask and dtype under `plan`."""
    import tilelang.language as T

    from .._common import tiles

    dtype, dim = DTYPE_NAMES[call.dtype], call.head_dim
    group, bm, bn = call.heads // call.kv_heads, plan.block_m, plan.block_n
    batch, q_len, kv_len = T.dynamic("batch"), T.dynamic("q_len"), T.dynamic("kv_len")
    exp_masked = probabilities(call, plan)
    full_row = T.GemmWarpPolicy.FullRow

    def main(Q, K, V, dO, Lse, Delta, dQ, dK, dV):
        with T.Kernel(T.ceildiv(kv_len, bm), call.kv_heads, batch, threads=plan.threads) as (
            bx, kv_head, b,
        ):  # fmt: skip
            k_tile = T.alloc_shared((bm, dim), dtype)
            v_tile = T.alloc_shared((bm, dim), dtype)
            q_tile = T.alloc_shared((bn, dim), dtype)
            do_tile = T.alloc_shared((bn, dim), dtype)
            lse = T.alloc_shared((bn,), "float32")
            delta = T.alloc_shared((bn,), "float32")
            ds_tile = T.alloc_shared((bm, bn), dtype)
            st = T.alloc_fragment((bm, bn), "float32")
            dpt = T.alloc_fragment((bm, bn), "float32")
            pt = T.alloc_fragment((bm, bn), dtype)
            ds = T.alloc_fragment((bm, bn), dtype)
            dk = T.alloc_fragment((bm, dim), "float32")
            dv = T.alloc_fragment((bm, dim), "float32")
            dq = T.alloc_fragment((bn, dim), "float32")
            k_start = bx * bm
            T.copy(K[b, kv_head, k_start : k_start + bm, :], k_tile)
            T.copy(V[b, kv_head, k_start : k_start + bm, :], v_tile)
            T.clear(dk)
            T.clear(dv)
            first, end = query_tiles(call, plan, k_start, q_len, kv_len)
            steps = end - first  # query tiles per head of the group
            for t in T.Pipelined(group * steps, num_stages=1):
                head = kv_head * group + t // steps
                q_start = (first + t % steps) * bn
                T.copy(Q[b, head, q_start : q_start + bn, :], q_tile)
                T.copy(dO[b, head, q_start : q_start + bn, :], do_tile)
                T.copy(Lse[b, head, q_start : q_start + bn], lse)
                T.copy(Delta[b, head, q_start : q_start + bn], delta)
                T.clear(st)
                T.gemm(k_tile, q_tile, st, transpose_B=True, policy=full_row)
                exp_masked(st, lse, q_start, k_start, q_len, kv_len)
                T.copy(st, pt)
                T.gemm(pt, do_tile, dv, policy=full_row)
                T.clear(dpt)
                T.gemm(v_tile, do_tile, dpt, transpose_B=True, policy=full_row)
                for i, j in T.Parallel(bm, bn):
                    ds[i, j] = st[i, j] * (dpt[i, j] - delta[j])
                T.gemm(ds, q_tile, dk, policy=full_row)
                T.copy(ds, ds_tile)
                T.clear(dq)
                T.gemm(ds_tile, k_tile, dq, transpose_A=True)
                for i, j in T.Parallel(bn, dim):
                    if q_start + i < q_len:
                        T.atomic_add(dQ[b, head, q_start + i, j], dq[i, j])
            for i, j in T.Parallel(bm, dim):
                dk[i, j] *= call.scale
            T.copy(dk, k_tile)  # staged through shared, as the forward stores its output
            T.copy(k_tile, dK[b, kv_head, k_start : k_start + bm, :])
            T.copy(dv, v_tile)
            T.copy(v_tile, dV[b, kv_head, k_start : k_start + bm, :])

    shapes = bwd_shapes(call, batch, q_len, kv_len)
    floats = {"Lse": "float32", "Delta": "float32", "dQ": "float32"}
    return tiles.prim_func(main, dtype, floats, **shapes)
