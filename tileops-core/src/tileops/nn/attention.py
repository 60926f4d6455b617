"""`MultiheadAttention`: torch.nn's module whose attention runs through `AttentionFwdOp`.

The projections are torch's own parameters, applied as torch applies them; only the attention
in between changes. Calls whose semantics the op does not have go through torch's forward
unchanged (see the class), so the module stays a drop-in replacement. kernelize does not swap
nn.MultiheadAttention: its usual owner, nn.TransformerEncoderLayer, bypasses its forward on its
inference fast path, and its default call asks for the attention weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import AttentionFwdOp
from ._base import TileModule
from ._ops import op_for

Tensor = torch.Tensor


class MultiheadAttention(TileModule, nn.MultiheadAttention):
    """`torch.nn.MultiheadAttention` (same arguments) whose attention calls `AttentionFwdOp`.

    Served: self- and cross-attention, batch_first or not, batched or not, kdim/vdim of their
    own, `is_causal=True` (torch's hint that attn_mask is the causal mask, which it then need
    not read) with as many queries as keys. Through torch's own forward: calls asking for the
    attention weights (`need_weights=True`, torch's default), with a key_padding_mask or an
    attn_mask that is not flagged causal, a causal hint with fewer queries than keys (torch
    aligns that mask to the top left), nested inputs, and dropout while training. Refused at
    construction: `add_bias_kv` and `add_zero_attn` (extra key/value rows the op does not add).
    """

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        if module.bias_k is not None or module.add_zero_attn:
            which = "add_bias_kv" if module.bias_k is not None else "add_zero_attn"
            return f"{which}=True appends key/value rows that AttentionFwdOp does not add"
        return super().refusal(module)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        args = (query, key, value, key_padding_mask, need_weights, attn_mask)
        if self._torch_serves(*args, is_causal):
            return super().forward(*args, average_attn_weights, is_causal)
        unbatched = query.dim() == 2
        q, k, v = (t.unsqueeze(1) if unbatched else t for t in (query, key, value))
        if self.batch_first and not unbatched:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out = self._attend(*self._project(q, k, v), is_causal)  # (L, N, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        if unbatched:
            return out.squeeze(1), None
        return (out.transpose(0, 1) if self.batch_first else out), None

    def _torch_serves(self, query, key, value, key_padding_mask, need_weights, attn_mask, causal):
        """Whether this call needs torch's own forward (see the class doc). A causal hint with
        more keys than queries too: torch's causal mask aligns to the top left, the op's to
        the bottom right."""
        if need_weights or key_padding_mask is not None or (attn_mask is not None and not causal):
            return True
        if (self.training and self.dropout > 0.0) or any(t.is_nested for t in (query, key, value)):
            return True
        seq = 1 if self.batch_first and query.dim() == 3 else 0
        return causal and query.shape[seq] != key.shape[seq]

    def _project(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The input projections, as torch's multi_head_attention_forward applies them."""
        bias = self.in_proj_bias
        biases = (None, None, None) if bias is None else bias.chunk(3)
        if self._qkv_same_embed_dim:
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        return tuple(F.linear(t, w, b) for t, w, b in zip((q, k, v), weights, biases, strict=True))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        """(L, N, E) projections -> (L, N, E) attention output, heads through the op."""
        heads, head_dim = self.num_heads, self.head_dim

        def split(t: Tensor) -> Tensor:  # (S, N, E) -> (N, heads, S, head_dim)
            return t.reshape(t.shape[0], t.shape[1], heads, head_dim).permute(1, 2, 0, 3)

        attention = op_for(AttentionFwdOp, q.device, causal, None, None)
        out, _ = attention(split(q), split(k), split(v))
        return out.permute(2, 0, 1, 3).reshape(q.shape[0], q.shape[1], heads * head_dim)
