"""AttentionDecodeOp (contiguous and paged KV caches) and AttentionVarlenFwdOp (packed
sequences) against `F.scaled_dot_product_attention` run per sequence, with the bottom-right
causal mask written out; and the errors for bad lengths, tables and offsets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import assert_matches, install_spy, randn
from test_ops_attention import mask

from tileops import (
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenFwdOp,
    OpInputError,
)
from tileops.testing import isolated_registry

F64 = torch.float64


def sdpa(q, k, v, causal, window=None, scale=None):
    """SDPA over one sequence, q (heads, q_len, dim), with the bottom-right causal mask."""
    seen = mask(q.shape[-2], k.shape[-2], causal, window)
    if not seen.any(-1).all():
        raise AssertionError("a row sees no key: SDPA gives NaN there")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)


def cache(batch=3, kv_heads=2, capacity=40, dim=16, seed=1):
    return randn(batch, kv_heads, capacity, dim, dtype=F64, seed=seed), randn(
        batch, kv_heads, capacity, dim, dtype=F64, seed=seed + 1
    )


def paged(k_cache, v_cache, block_size, seed=0):
    """The contiguous caches cut into blocks of `block_size` slots, stored in a shuffled order
    with two spare blocks, and the block table that finds them."""
    batch, kv_heads, capacity, dim = k_cache.shape
    per_seq = capacity // block_size
    order = torch.randperm(batch * per_seq + 2, generator=torch.Generator().manual_seed(seed))
    blocks_k = torch.zeros(batch * per_seq + 2, kv_heads, block_size, dim, dtype=k_cache.dtype)
    blocks_v = torch.zeros_like(blocks_k)
    table = torch.empty(batch, per_seq, dtype=torch.int32)
    for b in range(batch):
        for j in range(per_seq):
            block = int(order[b * per_seq + j])
            table[b, j] = block
            rows = slice(j * block_size, (j + 1) * block_size)
            blocks_k[block], blocks_v[block] = k_cache[b, :, rows], v_cache[b, :, rows]
    return blocks_k, blocks_v, table


@pytest.mark.parametrize(
    "q_len, causal, window", [(1, True, None), (3, True, None), (3, False, None), (2, True, 5)]
)
def test_contiguous_cache_matches_sdpa_per_sequence(q_len, causal, window):
    k_cache, v_cache = cache()
    lens = torch.tensor([7, 40, 19], dtype=torch.int32)
    q = randn(3, 8, q_len, 16, dtype=F64)
    out, lse = AttentionDecodeOp(causal, None, window)(q, k_cache, v_cache, lens)
    for b, n in enumerate(lens.tolist()):
        want = sdpa(q[b], k_cache[b, :, :n], v_cache[b, :, :n], causal, window)
        assert_matches(out[b], want)
        prefill = AttentionFwdOp(causal, None, window)(
            q[b : b + 1], k_cache[b : b + 1, :, :n], v_cache[b : b + 1, :, :n]
        )
        assert_matches(lse[b], prefill[1][0])


@pytest.mark.parametrize("block_size", [1, 8, 20])
def test_paged_cache_matches_the_contiguous_one(block_size):
    k_cache, v_cache = cache()
    lens = torch.tensor([0, 17, 40], dtype=torch.int64)
    q = randn(3, 4, 2, 16, dtype=F64)
    op = AttentionDecodeOp(causal=True, window=9)
    blocks_k, blocks_v, table = paged(k_cache, v_cache, block_size)
    table[0] = -1  # sequence 0 holds no key: its entries are never read
    table[1, -1] = 10**6  # nor the entries past a sequence's length
    got = op(q, blocks_k, blocks_v, lens, table)
    want = op(q, k_cache, v_cache, lens)
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)
    assert (got[0][0] == 0).all() and (got[1][0] == float("-inf")).all()


def test_the_block_table_picks_the_paged_interface():
    log = []
    k_cache, v_cache = cache(batch=2, capacity=16)
    blocks_k, blocks_v, table = paged(k_cache, v_cache, 4)
    lens = torch.tensor([3, 16])
    with isolated_registry():
        install_spy(AttentionDecodeOp, "attention_paged_decode", log)
        AttentionDecodeOp(causal=True)(
            randn(2, 2, 1, 16, dtype=F64), blocks_k, blocks_v, lens, table
        )
    ((_, _, _, got_lens, got_table),) = log
    assert got_lens.dtype == torch.int32 and got_table.dtype == torch.int32
    assert torch.equal(got_table, table)


@pytest.mark.parametrize("block_size", [None, 8])
def test_a_decode_loop_runs_its_layouts_kernel_without_forward(block_size, monkeypatch):
    """From a layout's second call, the steps of a decode loop (new lengths each step, int64
    lengths and table converted) skip `forward`, and still check their lengths."""
    k_cache, v_cache = cache()
    args, table = (k_cache, v_cache), None
    if block_size:
        *args, table = paged(k_cache, v_cache, block_size)
        table = table.long()
    op, q = AttentionDecodeOp(causal=True), randn(3, 4, 1, 16, dtype=F64)
    for step in range(2):
        op(q, *args, torch.tensor([5, 9, 2 + step]), table)
    calls, forward = [], AttentionDecodeOp.forward
    monkeypatch.setattr(AttentionDecodeOp, "forward", lambda *a: calls.append(a) or forward(*a))
    for step in range(3):
        lens, q = torch.tensor([7 + step, 40 - step, 3]), randn(3, 4, 1, 16, dtype=F64, seed=step)
        got = op(q, *args, lens, table)
        for g, w in zip(got, op.reference_forward(q, k_cache, v_cache, lens), strict=True):
            assert_matches(g, w)
    assert calls == []
    with pytest.raises(OpInputError, match=r"'cache_seqlens' holds 41 at sequence 0"):
        op(q, *args, torch.tensor([41, 1, 1]), table)


def test_a_growing_cache_keeps_one_decode_call_spec():
    """A cache that grows by a token per step (or a block table by a block) keeps one call
    spec: capacity and max_blocks are rounded up to a power of two; the output still reads
    every slot up to each sequence's length, and no further."""
    op, q = AttentionDecodeOp(causal=True), randn(3, 4, 1, 16, dtype=F64)
    assert {op._spec(q, *cache(capacity=n), None)[1].capacity for n in (33, 40, 64)} == {64}
    blocks = paged(*cache(), 8)[:2]
    tables = (torch.zeros(3, n, dtype=torch.int32) for n in (5, 7, 8))
    assert {op._spec(q, *blocks, table)[1].max_blocks for table in tables} == {8}
    specs = [op._spec(q, *cache(capacity=n), None)[1] for n in (33, 40, 64)]
    assert all(spec is specs[0] for spec in specs)  # built once for the bucket
    k_cache, v_cache = cache()
    lens = torch.tensor([40, 33, 1])
    out, _ = op(q, k_cache, v_cache, lens)
    for b, n in enumerate(lens.tolist()):
        assert_matches(out[b], sdpa(q[b], k_cache[b, :, :n], v_cache[b, :, :n], True))


def test_decode_in_16_bit_matches_the_float64_result_rounded_once():
    k_cache, v_cache = (t.bfloat16() for t in cache(dim=128))
    lens = torch.tensor([1, 25, 40])
    q = randn(3, 8, 1, 128, dtype=torch.bfloat16)
    out, lse = AttentionDecodeOp(causal=True)(q, k_cache, v_cache, lens)
    want, want_lse = AttentionDecodeOp(causal=True)(
        q.double(), k_cache.double(), v_cache.double(), lens
    )
    torch.testing.assert_close(out, want.bfloat16(), rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(lse, want_lse.float())


BAD_CACHE = {
    "too long": (
        [3, 41, 0],
        None,
        r"'cache_seqlens' holds 41 at sequence 1; expected lengths in \[0, 40\]",
    ),
    "negative": ([3, -1, 0], None, r"'cache_seqlens' holds -1 at sequence 1"),
    "block": (
        [3, 9, 0],
        [[0, 0], [1, 7], [2, 3]],
        r"'block_table' names block 7 at \[1, 1\], a block sequence 1 uses; "
        r"expected block numbers in \[0, 6\)",
    ),
    "table too short": (
        [3, 17, 0],
        [[0, 0], [1, 2], [2, 3]],
        r"'cache_seqlens' holds 17 at sequence 1; expected lengths in \[0, 16\]",
    ),
}


@pytest.mark.parametrize("name", BAD_CACHE)
def test_bad_lengths_and_tables_are_refused_on_the_cpu(name):
    lens, table, message = BAD_CACHE[name]
    q = randn(3, 2, 1, 16, dtype=F64)
    if table is None:
        caches = cache()
    else:
        caches = randn(6, 2, 8, 16, dtype=F64), randn(6, 2, 8, 16, dtype=F64)
        table = torch.tensor(table, dtype=torch.int32)
    with pytest.raises(OpInputError, match=r"AttentionDecodeOp\(\): argument " + message):
        AttentionDecodeOp()(q, *caches, torch.tensor(lens), table)


def test_a_contiguous_cache_holds_one_row_per_sequence():
    k_cache, v_cache = cache(batch=2)
    with pytest.raises(
        OpInputError,
        match=r"argument 'k_cache' holds 2 sequences \(dim 0\), but argument 'q' has batch 3; "
        "without a block_table",
    ):
        AttentionDecodeOp()(
            randn(3, 2, 1, 16, dtype=F64), k_cache, v_cache, torch.tensor([1, 2, 3])
        )


def test_lengths_must_be_integers_one_per_sequence():
    k_cache, v_cache = cache()
    q = randn(3, 2, 1, 16, dtype=F64)
    with pytest.raises(
        OpInputError, match=r"argument 'cache_seqlens' has dtype float32, expected int32, int64"
    ):
        AttentionDecodeOp()(q, k_cache, v_cache, torch.ones(3))
    with pytest.raises(
        OpInputError, match=r"argument 'cache_seqlens' has shape \[2\], expected \[3\]"
    ):
        AttentionDecodeOp()(q, k_cache, v_cache, torch.ones(2, dtype=torch.int32))


def test_decode_on_meta_tensors():
    k_cache, v_cache = (t.to("meta", torch.float16) for t in cache())
    blocks = torch.empty(9, 2, 8, 16, dtype=torch.float16, device="meta")
    table = torch.zeros(3, 5, dtype=torch.int32, device="meta")
    lens = torch.zeros(3, dtype=torch.int32, device="meta")
    q = torch.empty(3, 4, 1, 16, dtype=torch.float16, device="meta")
    for args in ((k_cache, v_cache, lens), (blocks, blocks, lens, table)):
        out, lse = AttentionDecodeOp(causal=True)(q, *args)
        assert out.shape == (3, 4, 1, 16) and lse.shape == (3, 4, 1) and lse.dtype == torch.float32


# -- packed sequences ------------------------------------------------------------------------

CU_Q = [0, 4, 4, 13, 20]
CU_K = [0, 9, 11, 24, 31]


def packed(cu_q, cu_k, heads=4, kv_heads=2, dim=16, dtype=F64):
    q = randn(cu_q[-1], heads, dim, dtype=dtype)
    k = randn(cu_k[-1], kv_heads, dim, dtype=dtype, seed=1)
    v = randn(cu_k[-1], kv_heads, dim, dtype=dtype, seed=2)
    return q, k, v


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 4)])
def test_varlen_matches_sdpa_per_sequence(causal, window):
    q, k, v = packed(CU_Q, CU_K)
    cu_q, cu_k = torch.tensor(CU_Q, dtype=torch.int32), torch.tensor(CU_K)
    out, lse = AttentionVarlenFwdOp(causal, 0.3, window)(q, k, v, cu_q, cu_k)
    for s in range(len(CU_Q) - 1):
        rows, keys = slice(CU_Q[s], CU_Q[s + 1]), slice(CU_K[s], CU_K[s + 1])
        if rows.start == rows.stop:
            continue
        one = [t.transpose(0, 1) for t in (q[rows], k[keys], v[keys])]
        want = sdpa(*one, causal, window, scale=0.3).transpose(0, 1)
        assert_matches(out[rows], want)
        whole = AttentionFwdOp(causal, 0.3, window)(*(t.unsqueeze(0) for t in one))
        assert_matches(lse[rows], whole[1][0].transpose(0, 1))


def test_varlen_gradients_match_sdpa_per_sequence():
    spans = [(slice(0, 5), slice(0, 7)), (slice(5, 12), slice(7, 15))]  # (queries, keys)
    q, k, v = (t.requires_grad_() for t in packed([0, 5, 12], [0, 7, 15]))
    cu_q, cu_k = torch.tensor([0, 5, 12]), torch.tensor([0, 7, 15])
    out, lse = AttentionVarlenFwdOp(causal=True)(q, k, v, cu_q, cu_k)
    assert not lse.requires_grad
    grad = randn(*out.shape, dtype=F64, seed=5)
    got = torch.autograd.grad(out, (q, k, v), grad)
    per_sequence = [
        sdpa(q[rows].transpose(0, 1), k[keys].transpose(0, 1), v[keys].transpose(0, 1), True)
        for rows, keys in spans
    ]
    want = torch.autograd.grad(
        torch.cat([o.transpose(0, 1) for o in per_sequence]), (q, k, v), grad
    )
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)


@pytest.mark.parametrize("saved", [True, False])
@pytest.mark.parametrize("window", [None, 3])
def test_the_varlen_backward_op_gives_the_forwards_gradients(saved, window):
    """Sequences with rows that see no key (q_len > kv_len, causal) and none at all."""
    cu_q, cu_k = [0, 6, 6, 10, 17], [0, 3, 8, 8, 20]
    q, k, v = (t.requires_grad_() for t in packed(cu_q, cu_k))
    offsets = torch.tensor(cu_q), torch.tensor(cu_k, dtype=torch.int32)
    out, lse = AttentionVarlenFwdOp(True, None, window)(q, k, v, *offsets)
    grad = randn(*out.shape, dtype=F64, seed=7)
    want = torch.autograd.grad(out, (q, k, v), grad)
    given = (out.detach(), lse) if saved else ()
    got = AttentionVarlenBwdOp(True, None, window)(grad, q, k, v, *offsets, *given)
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)
    assert not got[0][0:3].any() and not got[0][6:10].any()  # rows without keys


def test_the_varlen_backward_op_takes_out_and_lse_together():
    q, k, v = packed([0, 20], [0, 31])
    offsets = torch.tensor([0, 20]), torch.tensor([0, 31])
    out, _ = AttentionVarlenFwdOp()(q, k, v, *offsets)
    with pytest.raises(OpInputError, match=r"'out' is given without 'lse'; pass the forward's"):
        AttentionVarlenBwdOp()(out, q, k, v, *offsets, out)


BAD_OFFSETS = {
    "end": (
        [0, 4, 20],
        [0, 9, 30],
        r"'cu_seqlens_k' holds \[0, 9, 30\]; expected offsets starting at 0, non-decreasing, "
        r"ending at 31 \(the tokens of k and v\)",
    ),
    "start": (
        [1, 4, 20],
        [0, 9, 31],
        r"'cu_seqlens_q' holds \[1, 4, 20\]; expected offsets starting at 0",
    ),
    "order": (
        [0, 14, 4, 20],
        [0, 9, 9, 31],
        r"'cu_seqlens_q' holds \[0, 14, 4, 20\]; expected offsets starting at 0, non-decreasing",
    ),
    "count": ([0, 4, 20], [0, 9, 9, 31], r"'cu_seqlens_k' has shape \[4\], expected \[3\]"),
    "empty": ([], [], r"'cu_seqlens_q' is empty; expected seqs \+ 1 offsets"),
}


@pytest.mark.parametrize("name", BAD_OFFSETS)
def test_bad_offsets_are_refused_on_the_cpu(name):
    cu_q, cu_k, message = BAD_OFFSETS[name]
    q, k, v = packed([0, 20], [0, 31])
    with pytest.raises(OpInputError, match=r"AttentionVarlenFwdOp\(\): argument " + message):
        AttentionVarlenFwdOp()(
            q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
        )
