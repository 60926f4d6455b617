"""The forward's mask skipping (`fwd_program.tile_masked`) and the backward's query tiles
(`bwd_program.query_tiles`), checked by brute force on the CPU: a key tile runs without the mask
only if every row of the block sees every key of it, so a skipped mask can never let a row see
a key it must not; a backward block walks every query tile that sees one of its keys. Plain
integers stand in for TileLang's symbolic lengths (the conditions are the same expressions)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tileops.ops import AttentionCall
from tileops_cuda.attention.bwd_program import query_tiles
from tileops_cuda.attention.fwd_program import tile_masked, visible
from tileops_cuda.attention.plans import BwdPlan, FwdPlan

PLAN = FwdPlan(block_m=128, block_n=64, stages=2, threads=256)
LENGTHS = [(1, 1), (100, 64), (128, 128), (300, 200), (200, 333), (384, 1000), (512, 512)]


def call_for(causal: bool, window: int | None) -> AttentionCall:
    return AttentionCall(
        device=torch.device("cuda:0"), batch=1, heads=8, kv_heads=2, q_len=1, kv_len=1,
        head_dim=64, v_dim=64, causal=causal, scale=0.125, dtype=torch.bfloat16, window=window,
    )  # fmt: skip


def unmasked_tiles_seen_whole(call: AttentionCall, q_len: int, kv_len: int) -> tuple[int, int]:
    """(tiles that skip the mask, tiles in all); fails on a skipped tile some row misses."""
    skipped = total = 0
    for q_start in range(0, q_len, PLAN.block_m):
        rows = range(q_start, min(q_start + PLAN.block_m, q_len))
        for k_start in range(0, kv_len, PLAN.block_n):
            total += 1
            if tile_masked(call, PLAN, q_start, k_start, q_len, kv_len):
                continue
            skipped += 1
            for row, key in itertools.product(rows, range(k_start, k_start + PLAN.block_n)):
                seen = visible(call, row + kv_len - q_len, key, kv_len)
                assert seen, (q_start, k_start, row, key)
    return skipped, total


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 100), (False, 1)])
@pytest.mark.parametrize("q_len, kv_len", LENGTHS, ids=str)
def test_a_tile_skips_the_mask_only_where_every_row_sees_every_key(causal, window, q_len, kv_len):
    unmasked_tiles_seen_whole(call_for(causal, window), q_len, kv_len)


def test_the_mask_is_skipped_on_the_inner_tiles():
    """Not a test that passes by masking everything: full rows skip all but the tail tile, a
    causal square all but the diagonal's."""
    assert unmasked_tiles_seen_whole(call_for(False, None), 512, 1000) == (4 * 15, 4 * 16)
    skipped, total = unmasked_tiles_seen_whole(call_for(True, None), 512, 512)
    assert total == 4 * 8 and skipped == 0 + 2 + 4 + 6  # tiles wholly below each block's diagonal


BWD_PLAN = BwdPlan(block_m=64, block_n=32, threads=128)


def query_tiles_walked(call: AttentionCall, q_len: int, kv_len: int) -> tuple[int, int]:
    """(query tiles the backward's blocks walk, tiles in all); fails where a query that sees a
    key of a block lies outside the tiles that block walks."""
    walked = total = 0
    tiles = -(-q_len // BWD_PLAN.block_n)
    for k_start in range(0, kv_len, BWD_PLAN.block_m):
        first, end = (int(t) for t in query_tiles(call, BWD_PLAN, k_start, q_len, kv_len))
        assert 0 <= first <= end <= tiles, (k_start, first, end)
        walked, total = walked + end - first, total + tiles
        keys = range(k_start, min(k_start + BWD_PLAN.block_m, kv_len))
        for row, key in itertools.product(range(q_len), keys):
            if visible(call, row + kv_len - q_len, key, kv_len):
                assert first <= row // BWD_PLAN.block_n < end, (k_start, row, key, first, end)
    return walked, total


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 100), (True, 1)])
@pytest.mark.parametrize("q_len, kv_len", LENGTHS, ids=str)
def test_a_backward_block_walks_every_query_tile_that_sees_its_keys(causal, window, q_len, kv_len):
    query_tiles_walked(call_for(causal, window), q_len, kv_len)


def test_the_backward_skips_the_query_tiles_its_keys_are_hidden_from():
    """Not a test that passes by walking everything: a causal square walks the tiles from each
    block's diagonal on, a window only the tiles near it."""
    assert query_tiles_walked(call_for(False, None), 512, 512) == (8 * 16, 8 * 16)
    walked, total = query_tiles_walked(call_for(True, None), 512, 512)
    assert total == 8 * 16 and walked == sum(16 - 2 * block for block in range(8))
    walked, _ = query_tiles_walked(call_for(True, 64), 512, 512)
    assert walked == 7 * 4 + 2  # its two tiles, two more in the window's reach; the last: two
