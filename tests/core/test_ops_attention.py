"""AttentionFwdOp and AttentionBwdOp against `F.scaled_dot_product_attention` (with explicit
masks, `enable_gqa`) and an explicit float64 softmax written here; masks, heads, dtypes, empty
calls and the errors for bad arguments."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from op_helpers import assert_matches, forbid_kernels, install_spy, randn
from torch.nn.attention.bias import causal_lower_right

from tileops import AttentionBwdOp, AttentionFwdOp, OpConfigError, OpInputError
from tileops.ops import AttentionCall
from tileops.ops.attention.prefill import AttentionBwdReference
from tileops.testing import isolated_registry

HALF_TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def qkv(batch, heads, kv_heads, q_len, kv_len, dim, v_dim=None, dtype=torch.float64, seed=0):
    q = randn(batch, heads, q_len, dim, dtype=dtype, seed=seed)
    k = randn(batch, kv_heads, kv_len, dim, dtype=dtype, seed=seed + 1)
    v = randn(batch, kv_heads, kv_len, v_dim or dim, dtype=dtype, seed=seed + 2)
    return q, k, v


def mask(q_len: int, kv_len: int, causal: bool, window: int | None = None) -> torch.Tensor:
    """Which keys each query sees, written out: query i stands at kv_len - q_len + i."""
    i = torch.arange(q_len)[:, None] + kv_len - q_len
    j = torch.arange(kv_len)[None, :]
    seen = torch.ones(q_len, kv_len, dtype=torch.bool)
    if causal:
        seen &= j <= i
    if window is not None:
        seen &= j > i - window
    return seen


def explicit(q, k, v, seen, scale):
    """The float64 softmax by hand: (out, lse); kv heads repeated for each query head."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


SHAPES = {  # batch, heads, kv_heads, q_len, kv_len, dim, v_dim
    "mha": (2, 4, 4, 9, 9, 16, 16),
    "gqa, q shorter": (2, 8, 2, 5, 13, 32, 32),
    "mqa, v_dim": (1, 6, 1, 7, 11, 16, 24),
    "decode": (3, 4, 2, 1, 17, 8, 8),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", SHAPES)
def test_matches_sdpa_and_an_explicit_softmax_in_float64(name, causal):
    batch, heads, kv_heads, q_len, kv_len, dim, v_dim = SHAPES[name]
    q, k, v = qkv(batch, heads, kv_heads, q_len, kv_len, dim, v_dim)
    seen = mask(q_len, kv_len, causal)
    out, lse = AttentionFwdOp(causal=causal)(q, k, v)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True)
    want_out, want_lse = explicit(q, k, v, seen, 1 / math.sqrt(dim))
    assert_matches(out, sdpa)
    assert_matches(out, want_out)
    assert_matches(lse, want_lse)


def test_causal_is_aligned_to_the_bottom_right():
    """As torch's `causal_lower_right` bias; for q_len == kv_len it is SDPA's is_causal, for a
    shorter q it is not (SDPA's is_causal aligns to the top left)."""
    q, k, v = qkv(1, 2, 2, 4, 10, 8)
    out, _ = AttentionFwdOp(causal=True)(q, k, v)
    assert_matches(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(4, 10))
    )
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(out, top_left)
    square = qkv(1, 2, 2, 6, 6, 8)
    out, _ = AttentionFwdOp(causal=True)(*square)
    assert_matches(out, F.scaled_dot_product_attention(*square, is_causal=True))


@pytest.mark.parametrize("window", [1, 3, 7, 40])
def test_a_sliding_window_sees_that_many_keys_ending_at_the_query(window):
    q, k, v = qkv(2, 4, 2, 12, 20, 16)
    seen = mask(12, 20, True, window)
    out, lse = AttentionFwdOp(causal=True, window=window)(q, k, v)
    assert_matches(out, F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True))
    assert_matches(lse, explicit(q, k, v, seen, 0.25)[1])
    assert seen.sum(-1).max() == min(window, 20)


def test_scale_multiplies_the_scores():
    q, k, v = qkv(1, 2, 2, 5, 5, 16)
    out, lse = AttentionFwdOp(scale=0.7)(q, k, v)
    assert_matches(out, F.scaled_dot_product_attention(q, k, v, scale=0.7))
    assert_matches(lse, explicit(q, k, v, mask(5, 5, False), 0.7)[1])


def test_query_head_i_reads_kv_head_i_over_group_size():
    q, k, v = qkv(1, 6, 3, 4, 4, 8)
    out, _ = AttentionFwdOp()(q, k, v)
    for head in range(6):
        one, _ = AttentionFwdOp()(
            q[:, head : head + 1], k[:, head // 2 : head // 2 + 1], v[:, head // 2 : head // 2 + 1]
        )
        assert_matches(out[:, head : head + 1], one)


def test_rows_that_see_no_key_give_zeros_and_minus_infinity():
    """Causal with q_len > kv_len: the first q_len - kv_len queries stand before every key."""
    q, k, v = qkv(1, 2, 2, 7, 4, 8)
    out, lse = AttentionFwdOp(causal=True)(q, k, v)
    assert (out[:, :, :3] == 0).all() and (lse[:, :, :3] == float("-inf")).all()
    seen = mask(7, 4, True)[3:]
    want_out, want_lse = explicit(q[:, :, 3:], k, v, seen, 1 / math.sqrt(8))
    assert_matches(out[:, :, 3:], want_out)
    assert_matches(lse[:, :, 3:], want_lse)


@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_head_dims_and_dtypes_match_the_float64_result_rounded_once(dim, dtype):
    q, k, v = qkv(1, 4, 2, 33, 40, dim, dtype=dtype)
    out, lse = AttentionFwdOp(causal=True)(q, k, v)
    want, want_lse = explicit(q, k, v, mask(33, 40, True), 1 / math.sqrt(dim))
    assert out.dtype == dtype and lse.dtype == torch.float32
    tolerance = HALF_TOLERANCE.get(dtype, 1e-5)
    torch.testing.assert_close(out, want.to(dtype), rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(lse, want_lse.float(), rtol=1e-5, atol=1e-5)


def test_non_contiguous_inputs_as_transformers_passes_them():
    """(batch, seq, heads, dim) projections transposed to (batch, heads, seq, dim) views."""
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv(2, 4, 2, 6, 6, 8))
    views = [t.transpose(1, 2) for t in (q, k, v)]
    assert not views[0].is_contiguous()
    out, _ = AttentionFwdOp(causal=True)(*views)
    assert_matches(out, AttentionFwdOp(causal=True)(*[t.contiguous() for t in views])[0])


def test_kernels_get_contiguous_tensors_and_the_resolved_call():
    log = []
    q, k, v = qkv(2, 4, 2, 3, 5, 8)
    with isolated_registry():
        install_spy(AttentionFwdOp, "attention", log)
        op = AttentionFwdOp(causal=True)
        op(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
        call = op.call_for(q, k, v)
    ((got_q, got_k, got_v),) = log
    assert all(t.is_contiguous() for t in (got_q, got_k, got_v))
    assert call == AttentionCall(
        device=q.device, batch=2, heads=4, kv_heads=2, q_len=3, kv_len=5, head_dim=8, v_dim=8,
        causal=True, scale=1 / math.sqrt(8), dtype=torch.float64, window=None,
    )  # fmt: skip


def test_one_query_row_is_no_causal_call_unless_a_window_looks_back():
    q, k, v = qkv(1, 2, 2, 1, 9, 8)
    assert not AttentionFwdOp(causal=True).call_for(q, k, v).causal
    assert AttentionFwdOp(causal=True, window=4).call_for(q, k, v).causal
    out, _ = AttentionFwdOp(causal=True)(q, k, v)
    assert_matches(out, F.scaled_dot_product_attention(q, k, v))


def test_a_growing_cache_keeps_one_decode_call_spec():
    """Decode calls differ in kv_len by a token per step: their call specs round it up to a
    power of two, so the dispatch cache hits; the output still reads every key."""
    op = AttentionFwdOp(causal=True)
    calls = [op.call_for(*qkv(1, 4, 2, 1, n, 8)) for n in (1, 2, 3, 4, 5, 100, 128)]
    assert [c.kv_len for c in calls] == [1, 2, 4, 4, 8, 128, 128]
    assert op.call_for(*qkv(1, 4, 2, 3, 100, 8)).kv_len == 100  # prefill: exact
    q, k, v = qkv(1, 4, 2, 1, 100, 8)
    assert_matches(op(q, k, v)[0], F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_the_call_spec_of_a_bucket_is_built_once_and_the_specs_kept_are_bounded():
    """A decode step's new key length mostly falls in its bucket: its spec is the one built
    for the bucket (the same object, no fields read again); specs of other q shapes or kv
    heads are their own, and the op keeps at most 256."""
    op = AttentionFwdOp(causal=True)
    first = op.call_for(*qkv(1, 4, 2, 1, 100, 8))
    assert op.call_for(*qkv(1, 4, 2, 1, 128, 8)) is first
    assert op.call_for(*qkv(2, 4, 2, 1, 100, 8)) is not first
    assert op.call_for(*qkv(1, 4, 1, 1, 100, 8)).kv_heads == 1
    for n in range(300):
        op.call_for(*qkv(1, 4, 2, 2, n + 1, 8))
    assert len(op._specs) <= 256


def test_a_layouts_later_calls_run_its_kernel_without_forward(monkeypatch):
    """From a layout's second call (a model's next layer, a decode step's), the op runs the
    kernel that served it without `forward`; other strides of that layout are made contiguous
    as `forward` makes them, and a new layout takes `forward` again."""
    op = AttentionFwdOp(causal=True)
    for _ in range(2):  # the first settles the op's target, the second makes the lane
        op(*qkv(2, 4, 2, 1, 17, 8))
    calls, forward = [], AttentionFwdOp.forward
    monkeypatch.setattr(AttentionFwdOp, "forward", lambda *a: calls.append(a) or forward(*a))
    for seed in range(2):
        q, k, v = qkv(2, 4, 2, 1, 17, 8, seed=seed)
        if seed:  # k as a view of another layout's memory: same shape, other strides
            k = randn(2, 17, 2, 8, dtype=torch.float64, seed=5).transpose(1, 2)
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert_matches(op(q, k, v)[0], want)
    assert calls == []
    op(*qkv(2, 4, 2, 1, 18, 8))
    assert len(calls) == 1


def test_no_keys_gives_zeros_without_a_kernel(monkeypatch):
    op = AttentionFwdOp(causal=True)
    forbid_kernels(monkeypatch, op)
    q, k, v = qkv(2, 4, 2, 3, 0, 8, 5)
    out, lse = op(q, k, v)
    assert out.shape == (2, 4, 3, 5) and (out == 0).all() and (lse == float("-inf")).all()


def test_no_queries_gives_empty_outputs_without_a_kernel(monkeypatch):
    op = AttentionFwdOp()
    forbid_kernels(monkeypatch, op)
    out, lse = op(*qkv(2, 4, 2, 0, 7, 8, dtype=torch.bfloat16))
    assert out.shape == (2, 4, 0, 8) and lse.shape == (2, 4, 0) and lse.dtype == torch.float32


def test_meta_tensors_infer_shapes_and_dtypes():
    q, k, v = (t.to("meta") for t in qkv(2, 8, 2, 5, 9, 16, 24, dtype=torch.bfloat16))
    out, lse = AttentionFwdOp(causal=True)(q, k, v)
    assert out.device.type == "meta" and out.shape == (2, 8, 5, 24) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 5) and lse.dtype == torch.float32


# -- the backward op -------------------------------------------------------------------------


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 3)])
def test_backward_op_matches_autograd_through_sdpa(causal, window):
    q, k, v = (t.requires_grad_() for t in qkv(2, 6, 2, 5, 9, 8))
    seen = mask(5, 9, causal, window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True)
    grad_out = randn(*out.shape, dtype=torch.float64, seed=7)
    want = torch.autograd.grad(out, (q, k, v), grad_out)
    got = AttentionBwdOp(causal, None, window)(grad_out, *(t.detach() for t in (q, k, v)))
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)


def test_the_forwards_backward_hands_its_kernel_the_forwards_out_and_lse(monkeypatch):
    """The backward kernel gets out and lse as the forward returned them, and None for both
    once a caller modified out in place (a kernel then recomputes what it needs)."""
    seen = []
    forward = AttentionBwdReference.forward

    def spy(self, grad_out, q, k, v, out, lse):
        seen.append((out, lse))
        return forward(self, grad_out, q, k, v, out, lse)

    monkeypatch.setattr(AttentionBwdReference, "__call__", spy)  # what an entry's call runs
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 5, 5, 8))
    out, lse = AttentionFwdOp(causal=True)(q, k, v)
    torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(seen[-1][0], out) and torch.equal(seen[-1][1], lse)
    out, _ = AttentionFwdOp(causal=True)(q, k, v)
    out.mul_(2)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    assert seen[-1] == (None, None)
    want = torch.autograd.grad((2 * F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True)).sum(), (q, k, v))  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)


def test_backward_op_takes_out_and_lse_together_or_neither():
    q, k, v = qkv(1, 2, 2, 5, 5, 8)
    grad_out = torch.ones(1, 2, 5, 8, dtype=torch.float64)
    out, lse = AttentionFwdOp()(q, k, v)
    with_saved = AttentionBwdOp()(grad_out, q, k, v, out, lse)
    for g, w in zip(with_saved, AttentionBwdOp()(grad_out, q, k, v), strict=True):
        assert torch.equal(g, w)
    with pytest.raises(OpInputError, match="argument 'out' is given without 'lse'"):
        AttentionBwdOp()(grad_out, q, k, v, out)
    with pytest.raises(OpInputError, match="argument 'lse' is given without 'out'"):
        AttentionBwdOp()(grad_out, q, k, v, lse=lse)


def test_backward_of_rows_without_keys_is_zero():
    q, k, v = qkv(1, 2, 2, 5, 2, 8)
    grads = AttentionBwdOp(causal=True)(torch.ones(1, 2, 5, 8, dtype=torch.float64), q, k, v)
    assert (grads[0][:, :, :3] == 0).all() and all(g.isfinite().all() for g in grads)


# -- errors ----------------------------------------------------------------------------------


K_MISMATCH = (
    r"'k' has shape \[1, 2, 4, 16\], expected \[1, kv_heads, kv_len, 8\]: "
    r"its dim 3 must equal q's dim 3 \(head_dim = 8\)"
)
BAD_SHAPES = {
    "heads": (
        [(1, 6, 4, 8), (1, 4, 4, 8), (1, 4, 4, 8)],
        r"'k' has 4 heads, which must divide the 6",
    ),
    "head_dim": ([(1, 4, 4, 8), (1, 2, 4, 16), (1, 2, 4, 8)], K_MISMATCH),
    "kv_len": (
        [(1, 4, 4, 8), (1, 2, 4, 8), (1, 2, 5, 8)],
        r"'v' has shape \[1, 2, 5, 8\], expected \[1, 2, 4, v_dim\]",
    ),
    "batch": (
        [(2, 4, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)],
        r"'k' has shape \[1, 2, 4, 8\], expected \[2, kv_heads",
    ),
    "rank": ([(4, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)], r"'q' must have 4 dimensions"),
    "zero head_dim": (
        [(1, 4, 4, 0), (1, 2, 4, 0), (1, 2, 4, 8)],
        r"'q' has head_dim 0; expected at least 1",
    ),
}


@pytest.mark.parametrize("name", BAD_SHAPES)
def test_bad_shapes_are_refused_naming_the_argument(name):
    shapes, message = BAD_SHAPES[name]
    with pytest.raises(OpInputError, match=r"AttentionFwdOp\(\): argument " + message):
        AttentionFwdOp()(*[torch.zeros(s) for s in shapes])


def test_dtypes_are_checked_naming_the_argument():
    q, k, v = qkv(1, 2, 2, 3, 3, 8, dtype=torch.float32)
    with pytest.raises(OpInputError, match=r"argument 'v' has dtype float16, expected float32"):
        AttentionFwdOp()(q, k, v.half())
    with pytest.raises(OpInputError, match=r"argument 'q' has dtype int64, expected float32"):
        AttentionFwdOp()(q.long(), k, v)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"window": 4}, r"parameter 'window' needs causal=True .* got window=4 with causal=False"),
        ({"causal": True, "window": 0}, r"parameter 'window' must be an int >= 1 .* got 0"),
        ({"causal": True, "window": 2.5}, r"parameter 'window' must be an int >= 1 .* got 2.5"),
        ({"scale": float("nan")}, r"parameter 'scale' must be a finite number or None, got nan"),
        ({"scale": "0.1"}, r"parameter 'scale' must be a finite number or None, got '0.1'"),
        ({"causal": 1}, r"parameter 'causal' must be a bool, got 1"),
    ],
)
def test_bad_params_are_refused_at_construction(params, message):
    with pytest.raises(OpConfigError, match=r"AttentionFwdOp: " + message):
        AttentionFwdOp(**params)
