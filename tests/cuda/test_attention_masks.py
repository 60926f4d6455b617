"""The forward's mask skipping (`fwd_program.tile_masked`), checked by brute force on the CPU:
a key tile runs without the mask only if every row of the block sees every key of it, so a
skipped mask can never let a row see a key it must not. Plain integers stand in for TileLang's
symbolic lengths (the conditions are the same expressions)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tileops.ops import AttentionCall
from tileops_cuda.attention.fwd_program import tile_masked, visible
from tileops_cuda.attention.plans import FwdPlan

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
