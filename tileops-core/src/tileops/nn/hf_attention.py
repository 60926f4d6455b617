"""transformers' attention interface: `attn_implementation="tileops"` runs a model's attention
through `AttentionFwdOp`, prefill, training and KV-cache decode alike.

`register_transformers_attention()` registers the attention function under "tileops" and, for
its masks, transformers' own SDPA mask function: a model then builds exactly the masks it
builds for `"sdpa"`, and leaves them out (None) exactly where SDPA may rely on `is_causal`
instead. Those calls, the whole of unpadded prefill, training and decode, run through the op;
calls that come with a mask (padded batches, packed sequences, static-cache decode, sliding
windows shorter than the keys) or that need what the op has not (attention dropout, soft caps,
sinks, position biases, attention weights) run through transformers' SDPA function itself, so
the results are those of `"sdpa"` wherever they come from.

Sequences packed into one row with transformers' flash-attention keywords (`cu_seq_lens_q`,
`cu_seq_lens_k`, as `DataCollatorWithFlattening(return_flash_attn_kwargs=True)` provides) run
through `AttentionVarlenFwdOp` on those offsets, as transformers' FlashAttention path runs
them; the mask built for such a row only repeats the packing.

transformers is imported only when registering, never by `import tileops.nn`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import AttentionFwdOp, AttentionVarlenFwdOp
from ._ops import op_for

NAME = "tileops"
"""The attn_implementation name the function is registered under."""

UNSERVED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias")
"""Keywords of transformers' attention functions whose semantics the op does not have."""


def attention_function(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function contract: q (batch, heads, q_len, dim), k and v
    (batch, kv_heads, kv_len, dim) -> ((batch, q_len, heads, dim) output, no weights)."""
    served = dropout == 0.0 and not _unserved(kwargs)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    offsets = _packed_offsets(query, kwargs)
    if served and offsets is not None:
        window = kwargs.get("sliding_window") if causal else None
        attention = op_for(AttentionVarlenFwdOp, query.device, causal, scaling, window)
        packed = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
        out, _ = attention(*packed, *offsets)
        return out.unsqueeze(0), None
    if attention_mask is not None or not served:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = causal and q_len > 1  # one query row sees every key (decode)
    if causal and kv_len > q_len:
        # No mask with more keys than queries only comes from an empty static cache, whose
        # slots past the queries are empty: SDPA's causal mask (top left) never reaches them.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    attention = op_for(AttentionFwdOp, query.device, causal, scaling, None)
    out, _ = attention(query, key, value)
    return out.transpose(1, 2).contiguous(), None


def _packed_offsets(query: torch.Tensor, kwargs: dict[str, Any]) -> tuple | None:
    """The offsets of sequences packed into query's one row, where transformers passes them."""
    offsets = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if query.shape[0] != 1 or any(t is None for t in offsets):
        return None
    return offsets


def _unserved(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("output_attentions", False) or any(
        kwargs.get(name) is not None for name in UNSERVED_KWARGS
    )


def register_transformers_attention() -> str:
    """Register the "tileops" attention function and mask function with transformers (again is
    harmless); returns the name to pass as `attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_function)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
