"""Attention kernels against the float64 reference on a real GPU (skipped without CUDA): each
vendor kernel on calls it serves (out, lse and the backward's gradients), the dispatched ops on
the issue's shapes scaled down, and each TileLang kernel pinned: masks, rows without keys,
grouped heads, decode over per-sequence lengths."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_attention_compile import sm_90_variant

import tileops
import tileops_cuda
from tileops import (
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenFwdOp,
    pinned,
)
from tileops.ops.attention._math import attend, attend_grads, attend_varlen, attend_varlen_grads

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_kernels_only")]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.6e-2}
BF16, F16 = torch.bfloat16, torch.float16
VENDOR_KEYS = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")

# (batch, heads, kv_heads, q_len, kv_len, dim, causal): calls every vendor kernel serves
# (causal only where q_len == kv_len, which cuDNN and the efficient kernel need), and more.
CALLS = [
    (2, 8, 2, 256, 256, 128, True),  # grouped heads, causal
    (2, 8, 8, 200, 333, 64, False),  # odd lengths, no grouping
    (1, 32, 8, 1, 4096, 128, False),  # grouped decode
    (4, 4, 1, 128, 128, 64, True),  # one kv head
    (1, 8, 2, 96, 640, 128, True),  # chunked prefill: causal, q_len < kv_len (flash only)
]


def rel_err(got: torch.Tensor, want: torch.Tensor, floor: float = 1e-30) -> float:
    """The error's norm over the reference's, or over `floor` where that is larger (a reference
    that is zero exactly leaves only rounding to measure)."""
    finite = want.isfinite()
    got, want = got.double()[finite], want.double()[finite]
    return float((got - want).norm() / want.norm().clamp_min(floor))


def inputs(batch, heads, kv_heads, q_len, kv_len, dim, dtype, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, device="cuda", generator=generator).to(dtype)

    return (
        randn(batch, heads, q_len, dim),
        randn(batch, kv_heads, kv_len, dim),
        randn(batch, kv_heads, kv_len, dim),
    )


def skip_unless_served(op_cls, key, call) -> None:
    reason = tileops_cuda.KERNELS[op_cls][key].refusal(call)
    if reason is not None:
        pytest.skip(f"{key} does not serve it: {reason}")


def reference(q, k, v, causal, grad_out=None):
    scale = 1 / math.sqrt(q.shape[-1])
    q64, k64, v64 = (t.double() for t in (q, k, v))
    if grad_out is None:
        return attend(q64, k64, v64, scale=scale, causal=causal, window=None)
    return attend_grads(grad_out.double(), q64, k64, v64, scale=scale, causal=causal, window=None)


@pytest.mark.parametrize("key", VENDOR_KEYS)
@pytest.mark.parametrize("shape", CALLS, ids=str)
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_each_vendor_forward_matches_the_float64_reference(key, shape, dtype):
    *dims, causal = shape
    q, k, v = inputs(*dims, dtype)
    op = AttentionFwdOp(causal=causal)
    skip_unless_served(AttentionFwdOp, key, op.call_for(q, k, v))
    with pinned(AttentionFwdOp, "attention", key):
        out, lse = op(q, k, v)
    want, want_lse = reference(q, k, v, causal)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert rel_err(out, want) < TOLERANCE[dtype]
    assert rel_err(lse, want_lse) < 1e-5


@pytest.mark.parametrize("key", VENDOR_KEYS)
@pytest.mark.parametrize("shape", CALLS[:2] + CALLS[3:], ids=str)
def test_each_vendor_backward_matches_the_float64_reference(key, shape):
    *dims, causal = shape
    q, k, v = inputs(*dims, BF16)
    grad_out = torch.randn_like(q)
    op = AttentionBwdOp(causal=causal)
    skip_unless_served(AttentionBwdOp, key, op.call_for(q, k, v))
    with pinned(AttentionBwdOp, "attention_bwd", key):
        grads = op(grad_out, q, k, v)
    for got, want, like in zip(grads, reference(q, k, v, causal, grad_out), (q, k, v), strict=True):
        assert got.shape == like.shape and got.dtype == like.dtype
        assert rel_err(got, want) < 2 * TOLERANCE[BF16]


@pytest.mark.parametrize("shape", CALLS[:2] + CALLS[3:], ids=str)
def test_the_cudnn_backward_from_the_forwards_out_and_lse_matches_the_float64_reference(shape):
    *dims, causal = shape
    q, k, v = inputs(*dims, BF16)
    grad_out = torch.randn_like(q)
    op = AttentionBwdOp(causal=causal)
    skip_unless_served(AttentionBwdOp, "sdpa_cudnn", op.call_for(q, k, v))
    out, lse = AttentionFwdOp(causal=causal)(q, k, v)  # whichever kernel serves the forward
    with pinned(AttentionBwdOp, "attention_bwd", "sdpa_cudnn"):
        grads = op(grad_out, q, k, v, out, lse)
    for got, want in zip(grads, reference(q, k, v, causal, grad_out), strict=True):
        assert rel_err(got, want) < 2 * TOLERANCE[BF16]


ISSUE_SHAPES = [  # the issue's prefill and decode shapes at a sixteenth of their tokens
    (1, 32, 8, 1024, 1024, 128, True),
    (4, 32, 8, 256, 256, 128, False),
    (1, 32, 8, 1, 8192, 128, False),
    (16, 32, 8, 1, 4096, 128, False),
]


@pytest.mark.parametrize("shape", ISSUE_SHAPES, ids=str)
def test_dispatched_attention_trains_as_sdpa(shape):
    *dims, causal = shape
    q, k, v = (t.requires_grad_() for t in inputs(*dims, BF16))
    out, lse = AttentionFwdOp(causal=causal)(q, k, v)
    out.float().square().sum().backward()
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*refs, is_causal=causal, enable_gqa=True)
    want.float().square().sum().backward()
    assert rel_err(out, want) < TOLERANCE[BF16]
    for got, ref in zip((q, k, v), refs, strict=True):
        assert rel_err(got.grad, ref.grad) < 2 * TOLERANCE[BF16]


# -- TileLang --------------------------------------------------------------------------------


def forward_key() -> str:
    """The TileLang forward of this GPU's architecture."""
    return (
        "tilelang_flash_fwd_sm90"
        if torch.cuda.get_device_capability() >= (9, 0)
        else "tilelang_flash_fwd"
    )


def reference_window(q, k, v, causal, window):
    scale = 1 / math.sqrt(q.shape[-1])
    return attend(*(t.double() for t in (q, k, v)), scale=scale, causal=causal, window=window)


def check(out, lse, want, want_lse, dtype) -> None:
    """out within the dtype's tolerance, lse to float32 rounding, -inf exactly where it is."""
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(lse.isinf(), want_lse.isinf())
    assert rel_err(out, want) < TOLERANCE[dtype]
    assert rel_err(lse, want_lse) < 1e-5


TILELANG_FORWARD = [  # (batch, heads, kv_heads, q_len, kv_len, dim, causal, window)
    (2, 8, 2, 256, 256, 128, True, None),
    (1, 8, 8, 200, 333, 64, False, None),  # lengths off the tiles
    (1, 4, 1, 300, 200, 64, True, None),  # the first 100 rows see no key
    (2, 8, 2, 384, 1000, 128, True, None),  # chunked prefill: q_len < kv_len
    (1, 8, 4, 512, 512, 128, True, 100),  # sliding window: key tiles skipped on both sides
    (1, 4, 4, 129, 700, 64, True, 1),  # a window of one key
]


@pytest.mark.parametrize("shape", TILELANG_FORWARD, ids=str)
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_the_tilelang_forward_matches_the_float64_reference(shape, dtype):
    *dims, causal, window = shape
    q, k, v = inputs(*dims, dtype)
    with pinned(AttentionFwdOp, "attention", forward_key()):
        out, lse = AttentionFwdOp(causal, None, window)(q, k, v)
    check(out, lse, *reference_window(q, k, v, causal, window), dtype)


def built_directly(kernel_type, call):
    """A kernel no op selects yet, built for `call` (which it must serve)."""
    assert kernel_type.refusal(call) is None, kernel_type.refusal(call)
    return kernel_type.entry_for(call)[1]()


SM_90_VARIANTS = [
    {"pingpong": True},
    {"heavy_first": True},
    {"pingpong": True, "heavy_first": True},
    {"workers": 132},
    {"workers": 5, "pingpong": True},  # few blocks: many query blocks each
]


@pytest.mark.parametrize("changes", SM_90_VARIANTS, ids=str)
@pytest.mark.parametrize("shape", TILELANG_FORWARD, ids=str)
def test_each_sm_90_forward_variant_matches_the_float64_reference(shape, changes):
    """The sm_90a forward with plans the prefill sweep measures before a kernel takes them:
    consumer warpgroups issuing in turns, the last query blocks launched first, persistent
    blocks; built and called directly."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the variants are of the sm_90a forward")
    *dims, causal, window = shape
    q, k, v = inputs(*dims, BF16)
    call = AttentionFwdOp(causal, None, window).call_for(q, k, v)
    out, lse = built_directly(sm_90_variant(**changes), call).forward(q, k, v)
    check(out, lse, *reference_window(q, k, v, causal, window), BF16)


@pytest.mark.parametrize("given", [True, False], ids=["out and lse given", "forward again"])
@pytest.mark.parametrize("shape", TILELANG_FORWARD, ids=str)
def test_the_tilelang_backward_matches_the_float64_reference(shape, given):
    """TileLangFlashBwd, built and called directly (the op prefers torch's kernels where they
    serve): from the forward's out and lse, and without them (it runs the forward again)."""
    from tileops_cuda.attention.kernels import TileLangFlashBwd

    *dims, causal, window = shape
    q, k, v = inputs(*dims, BF16)
    grad_out = torch.randn_like(q)
    out, lse = AttentionFwdOp(causal, None, window)(q, k, v) if given else (None, None)
    call = AttentionBwdOp(causal, None, window).call_for(q, k, v)
    grads = built_directly(TileLangFlashBwd, call).forward(grad_out, q, k, v, out, lse)
    scale = 1 / math.sqrt(q.shape[-1])
    as64 = (t.double() for t in (grad_out, q, k, v))
    wanted = attend_grads(*as64, scale=scale, causal=causal, window=window)
    # A window of one key makes each row's softmax constant, so dQ and dK are zero exactly:
    # their rounding is measured against a thousandth of dV's norm.
    floor = 1e-3 * float(wanted[2].norm())
    for got, want, like in zip(grads, wanted, (q, k, v), strict=True):
        assert got.shape == like.shape and got.dtype == like.dtype
        assert rel_err(got, want, floor) < 2 * TOLERANCE[BF16]


@pytest.mark.parametrize("shape", TILELANG_FORWARD[4:], ids=str)
def test_windowed_attention_trains_through_the_tilelang_backward(shape):
    """A sliding window, which torch's kernels refuse: autograd through AttentionFwdOp runs
    the TileLang forward and backward the ops select, against float64 gradients."""
    *dims, causal, window = shape
    q, k, v = (t.requires_grad_() for t in inputs(*dims, BF16))
    grad_out = torch.randn_like(q)
    with tileops.record() as record:
        out, _ = AttentionFwdOp(causal, None, window)(q, k, v)
        out.backward(grad_out)
    served = {(s.interface, s.key) for s in record.counts}
    assert {("attention", forward_key()), ("attention_bwd", "tilelang_flash_bwd")} <= served
    scale = 1 / math.sqrt(q.shape[-1])
    as64 = (t.detach().double() for t in (grad_out, q, k, v))
    wanted = attend_grads(*as64, scale=scale, causal=causal, window=window)
    floor = 1e-3 * float(wanted[2].norm())  # as in the test above: dQ, dK zero at window 1
    for got, want in zip((q.grad, k.grad, v.grad), wanted, strict=True):
        assert rel_err(got, want, floor) < 2 * TOLERANCE[BF16]


TILELANG_DECODE = [  # (batch, heads, kv_heads, q_len, kv_len, dim, causal, window)
    (1, 32, 8, 1, 4096, 128, False, None),  # the issue's batch-1 decode, scaled down
    (16, 32, 8, 1, 333, 64, False, None),
    (3, 16, 2, 4, 1000, 64, True, 100),  # speculative tokens, a window
    (2, 8, 8, 8, 8, 128, True, None),  # as many keys as queries
    (1, 32, 1, 2, 5000, 128, True, None),  # one kv head: 64 rows
]


@pytest.mark.parametrize("shape", TILELANG_DECODE, ids=str)
def test_the_tilelang_decode_matches_the_float64_reference(shape):
    *dims, causal, window = shape
    q, k, v = inputs(*dims, BF16)
    with pinned(AttentionFwdOp, "attention", "tilelang_flash_decode"):
        out, lse = AttentionFwdOp(causal, None, window)(q, k, v)
    check(out, lse, *reference_window(q, k, v, causal, window), BF16)


@pytest.mark.parametrize("q_len, window", [(1, None), (3, None), (2, 50)])
def test_the_tilelang_decode_over_per_sequence_lengths(q_len, window):
    """Lengths from empty to the whole cache, shorter than q_len too (rows without keys)."""
    q, k_cache, v_cache = inputs(6, 16, 4, q_len, 3000, 128, BF16)
    lens = torch.tensor([0, 1, 2, 777, 2048, 3000], dtype=torch.int32, device="cuda")
    op = AttentionDecodeOp(True, None, window)
    with pinned(AttentionDecodeOp, "attention_decode", "tilelang_flash_decode"):
        out, lse = op(q, k_cache, v_cache, lens)
    want = op.reference_forward(*(t.double() for t in (q, k_cache, v_cache)), lens)
    check(out, lse, *want, BF16)


def test_the_decode_partials_are_kept_per_stream_and_batch():
    """The split kernel's float32 partials are reused from call to call: one set per (stream,
    batch), at most PARTIAL_SETS; every call on either stream, of every batch, still right."""
    from tileops_cuda.attention import base, kernels

    op = AttentionDecodeOp(causal=True)
    q, k, v = inputs(4, 16, 4, 1, 3000, 128, BF16)
    kernel = kernels.TileLangCacheDecode.entry_for(op._spec(q, k, v, None)[1])[1]()
    lengths = torch.Generator().manual_seed(0)
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        with torch.cuda.stream(stream):
            for batch in (4, 2, 4, 1):
                lens = torch.randint(1, 3001, (batch,), generator=lengths, dtype=torch.int32)
                lens = lens.cuda()
                out, lse = kernel.forward(q[:batch], k[:batch], v[:batch], lens)
                want = op.reference_forward(*(t[:batch].double() for t in (q, k, v)), lens)
                check(out, lse, *want, BF16)
    torch.cuda.synchronize()
    assert len(kernel._scratch) == 6  # three batch sizes on each of two streams
    for batch in range(1, base.PARTIAL_SETS + 2):
        kernel.forward(
            q[:1].expand(batch, -1, -1, -1).contiguous(),
            *(t[:1].expand(batch, -1, -1, -1).contiguous() for t in (k, v)),
            torch.full((batch,), 3000, dtype=torch.int32, device="cuda"),
        )
    assert len(kernel._scratch) == base.PARTIAL_SETS


def test_a_captured_decode_keeps_partials_of_its_own():
    """A graph captured on a stream whose partials the kernel caches gets fresh ones: the
    cached set is evicted later and its memory handed to other tensors, which the graph's
    replays must not write."""
    from tileops_cuda.attention import base, kernels

    op = AttentionDecodeOp(causal=True)
    q, k, v = inputs(2, 16, 4, 1, 3000, 128, BF16)
    lens = torch.tensor([3000, 1234], dtype=torch.int32, device="cuda")
    kernel = kernels.TileLangCacheDecode.entry_for(op._spec(q, k, v, None)[1])[1]()
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernel.forward(q, k, v, lens)  # warm: this stream's set for batch 2 is cached
        cached = {key: [id(t) for t in found] for key, found in kernel._scratch.items()}
        shapes = [t.shape for found in kernel._scratch.values() for t in found]
        with torch.cuda.graph(graph, stream=stream):
            out, lse = kernel.forward(q, k, v, lens)
        assert {key: [id(t) for t in found] for key, found in kernel._scratch.items()} == cached
        for batch in range(3, base.PARTIAL_SETS + 4):  # evicts every set, the warm one too
            full = torch.full((batch,), 3000, dtype=torch.int32, device="cuda")
            kernel.forward(*(t[:1].expand(batch, -1, -1, -1).contiguous() for t in (q, k, v)), full)
        others = [torch.full(shape, float("nan"), device="cuda") for shape in shapes * 16]
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    want = op.reference_forward(*(t.double() for t in (q, k, v)), lens)
    check(out, lse, *want, BF16)
    assert all(t.isnan().all() for t in others)


@pytest.mark.parametrize("block_size", [8, 16, 64, 256])
@pytest.mark.parametrize("q_len, window", [(1, None), (3, None), (2, 50)])
def test_the_tilelang_paged_decode_matches_the_float64_reference(block_size, q_len, window):
    """Lengths from empty to the whole table, blocks shuffled, garbage in the table past each
    sequence's length (never looked up)."""
    batch, kv_heads, max_blocks = 5, 4, 3072 // block_size
    q = inputs(batch, 16, kv_heads, q_len, 1, 128, BF16)[0]
    num_blocks = batch * max_blocks + 3
    k_cache, v_cache = (
        torch.randn(num_blocks, kv_heads, block_size, 128, device="cuda", dtype=BF16) for _ in "kv"
    )
    table = torch.randperm(num_blocks, device="cuda")[: batch * max_blocks].view(batch, -1)
    table = table.to(torch.int32)
    lens = torch.tensor([0, 1, block_size + 3, 1000, 3072], dtype=torch.int32, device="cuda")
    for b, n in enumerate(lens.tolist()):
        table[b, -(-n // block_size) :] = -7  # entries past the length may hold anything
    op = AttentionDecodeOp(True, None, window)
    with pinned(AttentionDecodeOp, "attention_paged_decode", "tilelang_paged_decode"):
        out, lse = op(q, k_cache, v_cache, lens, table)
    want = op.reference_forward(q.double(), k_cache.double(), v_cache.double(), lens, table)
    check(out, lse, *want, BF16)


# -- packed sequences ------------------------------------------------------------------------

# (sequences as (q_len, kv_len), heads, kv_heads, dim, causal, window): empty sequences, one
# without keys, causal rows without keys (q_len > kv_len), grouped heads, windows, decode rows
PACKS = [
    ([(300, 300), (0, 5), (1000, 1000), (17, 17)], 8, 2, 128, True, None),
    ([(64, 200), (130, 70), (3, 0), (256, 256)], 4, 4, 64, True, None),
    ([(500, 700), (1, 1), (333, 129)], 8, 1, 128, False, None),
    ([(777, 777), (200, 900)], 8, 2, 128, True, 96),
    ([(1, 4096), (1, 100), (1, 1)], 32, 8, 128, True, None),
]


def packed_inputs(lengths, heads, kv_heads, dim, dtype):
    generator = torch.Generator(device="cuda").manual_seed(len(lengths))

    def randn(*shape):
        return torch.randn(shape, device="cuda", generator=generator).to(dtype)

    q_lens, kv_lens = zip(*lengths, strict=True)
    cu_q, cu_k = ([0, *torch.tensor(lens).cumsum(0).tolist()] for lens in (q_lens, kv_lens))
    q, k, v = (
        randn(cu_q[-1], heads, dim),
        randn(cu_k[-1], kv_heads, dim),
        randn(cu_k[-1], kv_heads, dim),
    )
    offsets = [torch.tensor(cu, device="cuda", dtype=torch.int32) for cu in (cu_q, cu_k)]
    return q, k, v, *offsets


@pytest.mark.parametrize("pack", PACKS, ids=str)
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_flash_attention_over_packed_sequences_matches_the_float64_reference(pack, dtype):
    lengths, heads, kv_heads, dim, causal, window = pack
    q, k, v, cu_q, cu_k = packed_inputs(lengths, heads, kv_heads, dim, dtype)
    grad_out = torch.randn_like(q)
    scale = 1 / math.sqrt(dim)
    options = {"scale": scale, "causal": causal, "window": window}
    with tileops.record() as calls:
        out, lse = AttentionVarlenFwdOp(causal, None, window)(q, k, v, cu_q, cu_k)
        grads = AttentionVarlenBwdOp(causal, None, window)(grad_out, q, k, v, cu_q, cu_k, out, lse)
        recomputed = AttentionVarlenBwdOp(causal, None, window)(grad_out, q, k, v, cu_q, cu_k)
    assert {served.key for served in calls.counts} == {"sdpa_flash"}, calls.summary()
    q64, k64, v64 = (t.double() for t in (q, k, v))
    want, want_lse = attend_varlen(q64, k64, v64, cu_q, cu_k, **options)
    assert rel_err(out, want) < TOLERANCE[dtype]
    assert torch.equal(lse.isneginf(), want_lse.isneginf())  # rows without keys: -inf
    assert rel_err(lse, want_lse) < 1e-5
    wanted = attend_varlen_grads(grad_out.double(), q64, k64, v64, cu_q, cu_k, **options)
    for found in (grads, recomputed):
        for got, want, like in zip(found, wanted, (q, k, v), strict=True):
            assert got.shape == like.shape and got.dtype == like.dtype and got.is_contiguous()
            assert rel_err(got, want) < 2 * TOLERANCE[dtype]


def test_packed_sequences_train_through_autograd_as_each_sequence_alone():
    q, k, v, cu_q, cu_k = packed_inputs([(300, 300), (700, 700)], 8, 2, 128, BF16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, _ = AttentionVarlenFwdOp(causal=True)(q, k, v, cu_q, cu_k)
    out.float().square().sum().backward()
    for rows in (slice(0, 300), slice(300, 1000)):
        one = [t.detach()[rows].transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v)]
        alone = F.scaled_dot_product_attention(*one, is_causal=True, enable_gqa=True)
        alone.float().square().sum().backward()
        for packed, single in zip((q, k, v), one, strict=True):
            want = single.grad[0].transpose(0, 1)
            assert rel_err(packed.grad[rows], want) < 2 * TOLERANCE[BF16]
