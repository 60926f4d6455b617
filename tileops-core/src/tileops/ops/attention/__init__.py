"""The attention family: prefill and training (`AttentionFwdOp`, its backward
`AttentionBwdOp`), decode over a contiguous or paged KV cache (`AttentionDecodeOp`) and packed
variable-length sequences (`AttentionVarlenFwdOp`, its backward `AttentionVarlenBwdOp`).
Semantics (masks, grouped heads, the log-sum-exp) are those of `_math`, which the reference
kernels compute."""

from __future__ import annotations

from .decode import (
    AttentionDecodeCall,
    AttentionDecodeInterface,
    AttentionDecodeOp,
    AttentionPagedDecodeCall,
    AttentionPagedDecodeInterface,
)
from .prefill import (
    AttentionBwdInterface,
    AttentionBwdOp,
    AttentionCall,
    AttentionFwdOp,
    AttentionInterface,
)
from .varlen import (
    AttentionVarlenBwdInterface,
    AttentionVarlenBwdOp,
    AttentionVarlenCall,
    AttentionVarlenFwdOp,
    AttentionVarlenInterface,
)

__all__ = [
    "AttentionBwdInterface",
    "AttentionBwdOp",
    "AttentionCall",
    "AttentionDecodeCall",
    "AttentionDecodeInterface",
    "AttentionDecodeOp",
    "AttentionFwdOp",
    "AttentionInterface",
    "AttentionPagedDecodeCall",
    "AttentionPagedDecodeInterface",
    "AttentionVarlenBwdInterface",
    "AttentionVarlenBwdOp",
    "AttentionVarlenCall",
    "AttentionVarlenFwdOp",
    "AttentionVarlenInterface",
]
