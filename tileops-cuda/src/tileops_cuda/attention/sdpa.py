"""Torch's SDPA backends (cuDNN, FlashAttention 2, memory-efficient) as kernels of the attention
interfaces: each calls its backend's own entry point, the operator `F.scaled_dot_product_
attention` dispatches to once it has chosen that backend, so the backend is forced (as under
`torch.nn.attention.sdpa_kernel`) and its log-sum-exp comes back with the output.

cuDNN's backward starts from the forward's out and log-sum-exp where the caller kept them
(whichever kernel served the forward: the attention interface fixes what they hold). Otherwise,
and always for FlashAttention and the memory-efficient kernel (whose backward entry points also
take the forward's random-number state), the backward recomputes the forward with the same
backend and runs that backend's backward. No autograd is involved, so it also runs inside the
backward operator, where autograd does not record.

FlashAttention's varlen entry points (`flash_varlen_forward`, `flash_varlen_backward`) take
packed sequences with their offsets and a sliding window. They are given the whole pack's token
counts as the longest sequence's: the real lengths live on the GPU, and reading them would stop
the host; a block past its sequence's end exits at once.

Causal masks: FlashAttention's entry point aligns its causal mask to the bottom right, as the
attention interfaces do (torch's `causal_lower_right` bias calls it so); cuDNN's and the
memory-efficient kernel's align to the top left, the same only where q_len == kv_len. Which
calls each backend serves is declared in `kernels`.
"""

from __future__ import annotations

import functools
import math

import torch

Tensor = torch.Tensor
Saved = tuple[Tensor, Tensor] | None
aten = torch.ops.aten


def _lse(lse: Tensor, q_len: int) -> Tensor:
    """The backend's log-sum-exp as (batch, heads, q_len): cuDNN's carries a trailing dim of 1
    in some torch versions, the memory-efficient kernel's is padded to a multiple of 32 rows."""
    if lse.dim() == 4:
        lse = lse[..., 0]
    return lse[..., :q_len].contiguous()


def repeat_heads(t: Tensor, heads: int) -> Tensor:
    """k or v with each kv head repeated for the query heads it serves (the kernels that take
    one kv head per query head)."""
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, 1)


def sum_groups(grad: Tensor, kv_heads: int) -> Tensor:
    """The gradient of repeated kv heads summed back onto each kv head."""
    batch, heads, length, dim = grad.shape
    if heads == kv_heads:
        return grad
    return grad.view(batch, kv_heads, heads // kv_heads, length, dim).sum(2)


def flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple:
    """FlashAttention 2's forward: its whole result (out, lse, and what its backward takes)."""
    return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)


def flash_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, saved: Saved, causal: bool, scale: float
):
    out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = flash_forward(q, k, v, causal, scale)
    return aten._scaled_dot_product_flash_attention_backward(
        grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, rng, unused,
        scale=scale,
    )  # fmt: skip


def cudnn_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple:
    return aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )


def cudnn_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, saved: Saved, causal: bool, scale: float
):
    if saved is None:
        out, lse, _, _, _, _, seed, offset, _ = cudnn_forward(q, k, v, causal, scale)
    else:  # no dropout: the state is the zeros cuDNN's forward returns then
        out, lse = saved[0], _cudnn_lse(saved[1])
        seed = offset = q.new_zeros(1, dtype=torch.int64)
    return aten._scaled_dot_product_cudnn_attention_backward(
        grad_out, q, k, v, out, lse, seed, offset, None, None, None, q.shape[2], k.shape[2],
        0.0, causal, scale=scale,
    )  # fmt: skip


def _cudnn_lse(lse: Tensor) -> Tensor:
    """The interface's (batch, heads, q_len) log-sum-exp in the shape cuDNN's forward gives."""
    return lse.unsqueeze(-1) if _cudnn_lse_rank() == 4 else lse


@functools.cache
def _cudnn_lse_rank() -> int:
    """The rank of the log-sum-exp cuDNN's forward returns in this torch (its meta kernel)."""
    q = torch.empty(1, 1, 8, 64, device="meta", dtype=torch.bfloat16)
    return cudnn_forward(q, q, q, False, 0.125)[1].dim()


def efficient_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple:
    """The memory-efficient kernel's forward, kv heads repeated (it takes one per query head)."""
    k, v = repeat_heads(k, q.shape[1]), repeat_heads(v, q.shape[1])
    return aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal, scale=scale
    )


def efficient_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, saved: Saved, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    kv_heads = k.shape[1]
    k, v = repeat_heads(k, q.shape[1]), repeat_heads(v, q.shape[1])
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal, scale=scale
    )
    grad_q, grad_k, grad_v, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal,
        scale=scale,
    )  # fmt: skip
    return grad_q, sum_groups(grad_k, kv_heads), sum_groups(grad_v, kv_heads)


def flash_varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, causal: bool, scale: float,
    window: int | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(out, lse) of FlashAttention's varlen forward, lse as the interface's (total_q, heads):
    -inf, not FlashAttention's +inf, where a query sees no key."""
    out, lse, *_ = aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, q.shape[0], k.shape[0], 0.0, causal, False, scale=scale,
        **_window_sizes(window),
    )  # fmt: skip
    lse = lse.t().contiguous()  # FlashAttention's (heads, total_q)
    return out, lse.nan_to_num_(nan=math.nan, posinf=-math.inf)


def flash_varlen_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, saved: Saved,
    causal: bool, scale: float, window: int | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(grad_q, grad_k, grad_v) of FlashAttention's varlen backward, from the forward's (out,
    lse) where given, else after the forward once more."""
    out, lse = saved or flash_varlen_forward(q, k, v, cu_q, cu_k, causal, scale, window)
    lse = lse.nan_to_num(nan=math.nan, neginf=math.inf).t().contiguous()
    no_dropout = torch.zeros(2, dtype=torch.uint64, device=q.device)  # its random state: unread
    grads = aten._flash_attention_backward(
        grad_out, q, k, v, out, lse, cu_q, cu_k, q.shape[0], k.shape[0], 0.0, causal,
        no_dropout, no_dropout[0], scale=scale, **_window_sizes(window),
    )  # fmt: skip
    return tuple(g.contiguous() for g in grads[:3])


def _window_sizes(window: int | None) -> dict[str, int]:
    """The interface's window of `window` keys (a query's own and those before it) in
    FlashAttention's terms: `window - 1` keys to the left, none to the right."""
    return {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}


FORWARDS = {"cudnn": cudnn_forward, "flash": flash_forward, "efficient": efficient_forward}
BACKWARDS = {"cudnn": cudnn_backward, "flash": flash_backward, "efficient": efficient_backward}


def forward(backend: str, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple:
    """(out, lse) of `backend`, lse as (batch, heads, q_len) float32."""
    result = FORWARDS[backend](q, k, v, causal, scale)
    return result[0].contiguous(), _lse(result[1], q.shape[2])  # out: a transposed view


def backward(
    backend: str,
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    saved: Saved,
    causal: bool,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_q, grad_k, grad_v) of `backend`, contiguous; `saved`: the forward's (out, lse),
    or None."""
    grads = BACKWARDS[backend](grad_out, q, k, v, saved, causal, scale)
    return tuple(g.contiguous() for g in grads[:3])
