"""The attention every reference kernel and op definition of the family computes, in plain,
differentiable torch: scores, the mask of keys each query sees, a softmax that keeps its
log-sum-exp, and the weighted sum of values.

Which keys query `i` of a sequence sees (queries are the last `q_len` positions of a sequence of
`kv_len` keys, so query `i` stands at position `p = kv_len - q_len + i`):

- every key `j < kv_len`;
- causal: only `j <= p` (the causal mask aligned to the bottom right, as FlashAttention 2 and
  transformers' KV-cache decode read it; for `q_len == kv_len` it is `F.scaled_dot_product_
  attention`'s `is_causal`, which aligns to the top left and so differs when `q_len != kv_len`);
- a sliding window of `w` keys (causal only): only `j > p - w`, the key at `p` and the `w - 1`
  before it (transformers' `sliding_window`, FlashAttention's `window_size=(w - 1, 0)`).

A query that sees no key (causal with `q_len > kv_len`) gets an output of zeros and a
log-sum-exp of -inf. 16-bit inputs are computed in float32 and the output rounded once; the
log-sum-exp (natural log, of the scaled scores) stays in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

Tensor = torch.Tensor

CHUNK_SCORES = 1 << 26
"""Scores held at once (a chunk of query rows at a time): bounds the reference's memory on long
sequences (256 MB of float32), where a GPU reference would otherwise hold all q_len x kv_len."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the math runs in: float32 for 16-bit inputs, else the inputs' own."""
    return torch.promote_types(dtype, torch.float32)


def visible_keys(
    q_pos: Tensor, k_pos: Tensor, kv_len: Tensor, causal: bool, window: int | None
) -> Tensor:
    """Which keys each query sees: a bool tensor broadcast from `q_pos[..., :, None]` against
    `k_pos[..., None, :]`, the positions of the queries and keys within their sequence, and
    `kv_len` (broadcastable to `q_pos[..., :, None]`), the sequence's number of keys."""
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
    seen = k < kv_len
    if causal:
        seen = seen & (k <= q)
    if window is not None:
        seen = seen & (k > q - window)
    return seen


def softmax_rows(scores: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
    """(probabilities, log-sum-exp) of each row of `scores` over the keys `seen` marks; rows
    that see none get probabilities of 0 and a log-sum-exp of -inf. Differentiable, without a
    NaN in any gradient (empty rows hold a constant 0 where the log-sum-exp is taken)."""
    empty = ~seen.any(-1, keepdim=True)
    masked = scores.masked_fill(~seen, float("-inf")).masked_fill(empty, 0.0)
    lse = torch.logsumexp(masked, -1, keepdim=True)
    probs = torch.exp(masked - lse).masked_fill(empty, 0.0)
    return probs, lse.squeeze(-1).masked_fill(empty.squeeze(-1), float("-inf"))


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    window: int | None,
    kv_lens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention of q (batch, heads, q_len, head_dim) over k (batch, kv_heads, kv_len,
    head_dim) and v (batch, kv_heads, kv_len, v_dim); query head `i` reads kv head
    `i // (heads // kv_heads)` (grouped-query attention, as `repeat_interleave` would expand
    them). `kv_lens` (batch,): the keys each sequence holds (the rest of k and v is not read);
    None: all kv_len. Returns (out (batch, heads, q_len, v_dim) in q's dtype, lse (batch,
    heads, q_len) in `compute_dtype`)."""
    batch, heads, q_len, _ = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    dtype = compute_dtype(q.dtype)
    lens = torch.full((batch,), kv_len, device=q.device) if kv_lens is None else kv_lens.long()
    k_pos = torch.arange(kv_len, device=q.device)
    kc, vc = k.to(dtype), v.to(dtype)
    step = max(CHUNK_SCORES // max(batch * heads * kv_len, 1), 1)
    outs, lses = [], []
    for start in range(0, q_len, step):
        rows = q[:, :, start : start + step].to(dtype)
        n = rows.shape[2]
        grouped = rows.reshape(batch, kv_heads, -1, n, rows.shape[-1])  # heads of a group
        scores = grouped @ kc.unsqueeze(2).transpose(-1, -2) * scale
        q_pos = lens[:, None] - q_len + torch.arange(start, start + n, device=q.device)
        seen = visible_keys(q_pos, k_pos, lens[:, None, None], causal, window)
        probs, lse = softmax_rows(scores, seen[:, None, None])
        outs.append((probs @ vc.unsqueeze(2)).reshape(batch, heads, n, v.shape[-1]))
        lses.append(lse.reshape(batch, heads, n))
    if not outs:  # q_len == 0
        return q.new_empty((batch, heads, 0, v.shape[-1])), q.new_empty(
            (batch, heads, 0), dtype=dtype
        )
    return torch.cat(outs, 2).to(q.dtype), torch.cat(lses, 2)


def attend_grads(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    window: int | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of `attend`'s out at q, k and v given `grad_out`, by the explicit formulas
    (the probabilities recomputed a chunk of query rows at a time): dP = dO V^T, D = rowsum(P *
    dP) (= rowsum(dO * O)), dS = P * (dP - D) * scale, dQ = dS K, dK = dS^T Q, dV = P^T dO,
    dK and dV summed over the query heads of each group. Plain torch ops: differentiable again
    (double backward), and usable inside an operator, where autograd does not record."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    dtype = compute_dtype(q.dtype)
    kc, vc = k.to(dtype).unsqueeze(2), v.to(dtype).unsqueeze(2)
    k_pos = torch.arange(kv_len, device=q.device)
    step = max(CHUNK_SCORES // max(batch * heads * kv_len, 1), 1)
    grad_q, grad_k, grad_v = [], kc.new_zeros(k.shape), vc.new_zeros(v.shape)
    for start in range(0, q_len, step):
        rows = q[:, :, start : start + step].to(dtype)
        n = rows.shape[2]
        rows = rows.reshape(batch, kv_heads, -1, n, head_dim)
        d_out = (
            grad_out[:, :, start : start + n].to(dtype).reshape(batch, kv_heads, -1, n, v.shape[-1])
        )
        scores = rows @ kc.transpose(-1, -2) * scale
        q_pos = kv_len - q_len + torch.arange(start, start + n, device=q.device)
        probs, _ = softmax_rows(scores, visible_keys(q_pos, k_pos, kv_len, causal, window))
        d_probs = d_out @ vc.transpose(-1, -2)
        d_scores = probs * (d_probs - (probs * d_probs).sum(-1, keepdim=True)) * scale
        grad_q.append((d_scores @ kc).reshape(batch, heads, n, head_dim))
        grad_k = grad_k + (d_scores.transpose(-1, -2) @ rows).sum(2)
        grad_v = grad_v + (probs.transpose(-1, -2) @ d_out).sum(2)
    found_q = torch.cat(grad_q, 2) if grad_q else q.new_zeros(q.shape, dtype=dtype)
    return found_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


def gather_pages(cache: Tensor, block_table: Tensor, kv_lens: Tensor) -> Tensor:
    """The paged `cache` (num_blocks, kv_heads, block_size, dim) as a contiguous (batch,
    kv_heads, max_blocks * block_size, dim) cache: sequence `b`'s token `t` lives in block
    `block_table[b, t // block_size]` at offset `t % block_size`. Table entries past a
    sequence's length are not read (they may hold anything)."""
    block_size = cache.shape[2]
    batch, max_blocks = block_table.shape
    used = torch.arange(max_blocks, device=cache.device) * block_size < kv_lens[:, None]
    table = torch.where(used, block_table.long(), 0)
    pages = cache[table]  # (batch, max_blocks, kv_heads, block_size, dim)
    return pages.transpose(1, 2).reshape(batch, cache.shape[1], max_blocks * block_size, -1)


def attend_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    scale: float,
    causal: bool,
    window: int | None,
) -> tuple[Tensor, Tensor]:
    """Attention of packed sequences: q (total_q, heads, head_dim), k (total_k, kv_heads,
    head_dim), v (total_k, kv_heads, v_dim); sequence `s` holds query tokens
    `cu_seqlens_q[s]:cu_seqlens_q[s + 1]` and key tokens `cu_seqlens_k[s]:cu_seqlens_k[s + 1]`,
    and its queries see its keys only, by the rules of `attend`. Returns (out (total_q, heads,
    v_dim) in q's dtype, lse (total_q, heads) in `compute_dtype`)."""
    heads = q.shape[1]
    dtype = compute_dtype(q.dtype)
    kc, vc = _packed_heads(k, dtype), _packed_heads(v, dtype)
    outs, lses = [], []
    for rows, seen in _varlen_chunks(q, k, cu_seqlens_q, cu_seqlens_k, causal, window):
        grouped = _packed_heads(q[rows], dtype, kc.shape[0])
        probs, lse = softmax_rows(grouped @ kc.transpose(-1, -2) * scale, seen)
        n = rows.stop - rows.start
        outs.append((probs @ vc).reshape(heads, n, -1).transpose(0, 1))
        lses.append(lse.reshape(heads, n).transpose(0, 1))
    if not outs:  # total_q == 0
        return q.new_empty((0, heads, v.shape[-1])), q.new_empty((0, heads), dtype=dtype)
    return torch.cat(outs).to(q.dtype), torch.cat(lses)


def attend_varlen_grads(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    scale: float,
    causal: bool,
    window: int | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of `attend_varlen`'s out at q, k and v given `grad_out` (total_q, heads,
    v_dim), by `attend_grads`' explicit formulas over packed sequences: differentiable again,
    and usable inside an operator."""
    _, heads, head_dim = q.shape
    dtype = compute_dtype(q.dtype)
    kc, vc = _packed_heads(k, dtype), _packed_heads(v, dtype)  # (kv_heads, 1, total_k, dim)
    grad_q, grad_k, grad_v = [], torch.zeros_like(kc[:, 0]), torch.zeros_like(vc[:, 0])
    for rows, seen in _varlen_chunks(q, k, cu_seqlens_q, cu_seqlens_k, causal, window):
        grouped = _packed_heads(q[rows], dtype, kc.shape[0])
        d_out = _packed_heads(grad_out[rows], dtype, kc.shape[0])
        probs, _ = softmax_rows(grouped @ kc.transpose(-1, -2) * scale, seen)
        d_probs = d_out @ vc.transpose(-1, -2)
        d_scores = probs * (d_probs - (probs * d_probs).sum(-1, keepdim=True)) * scale
        n = rows.stop - rows.start
        grad_q.append((d_scores @ kc).reshape(heads, n, head_dim).transpose(0, 1))
        grad_k = grad_k + (d_scores.transpose(-1, -2) @ grouped).sum(1)
        grad_v = grad_v + (probs.transpose(-1, -2) @ d_out).sum(1)
    found_q = torch.cat(grad_q) if grad_q else q.new_zeros(q.shape, dtype=dtype)
    return (
        found_q.to(q.dtype),
        grad_k.transpose(0, 1).to(k.dtype),
        grad_v.transpose(0, 1).to(v.dtype),
    )


def _packed_heads(t: Tensor, dtype: torch.dtype, kv_heads: int | None = None) -> Tensor:
    """Packed (tokens, heads, dim) as (kv_heads, heads // kv_heads, tokens, dim) in `dtype`:
    k and v (kv_heads None) as (kv_heads, 1, tokens, dim), broadcast over each group."""
    heads = t.to(dtype).transpose(0, 1)
    groups = 1 if kv_heads is None else t.shape[1] // kv_heads
    return heads.reshape(-1, groups, *heads.shape[1:])


def _varlen_chunks(
    q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, causal: bool,
    window: int | None,
) -> Iterator[tuple[slice, Tensor]]:  # fmt: skip
    """Chunks of packed query rows (bounded by CHUNK_SCORES) and the keys each row of a chunk
    sees, (rows, total_k) bool: its own sequence's keys, by the rules of `visible_keys`."""
    total_q, heads, _ = q.shape
    total_k = k.shape[0]
    seq_q, pos_q, len_q = _token_places(cu_seqlens_q.long(), total_q)
    seq_k, pos_k, _ = _token_places(cu_seqlens_k.long(), total_k)
    len_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
    step = max(CHUNK_SCORES // max(heads * total_k, 1), 1)
    for start in range(0, total_q, step):
        rows = slice(start, min(start + step, total_q))
        seq = seq_q[rows]
        q_abs = pos_q[rows] + len_k[seq] - len_q[rows]
        seen = visible_keys(q_abs, pos_k, len_k[seq][:, None], causal, window)
        yield rows, seen & (seq[:, None] == seq_k[None, :])


def _token_places(cu_seqlens: Tensor, total: int) -> tuple[Tensor, Tensor, Tensor]:
    """For each of `total` packed tokens: its sequence, its position in it, and the sequence's
    length (empty sequences own no token)."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:], tokens, right=True)
    start = cu_seqlens[seq]
    return seq, tokens - start, cu_seqlens[seq + 1] - start
