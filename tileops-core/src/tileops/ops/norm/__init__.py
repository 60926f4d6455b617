"""Normalization ops: LayerNorm, RMSNorm, BatchNorm."""

from __future__ import annotations

from .batch_norm import (
    BatchNormCall,
    BatchNormFwdOp,
    BatchNormInferInterface,
    BatchNormTrainInterface,
)
from .layer_norm import (
    LayerNormBackwardCall,
    LayerNormBackwardInterface,
    LayerNormCall,
    LayerNormFwdOp,
    LayerNormInterface,
)
from .rms_norm import (
    RMSNormBackwardCall,
    RMSNormBackwardInterface,
    RMSNormCall,
    RMSNormFwdOp,
    RMSNormInterface,
)

__all__ = [
    "BatchNormCall",
    "BatchNormFwdOp",
    "BatchNormInferInterface",
    "BatchNormTrainInterface",
    "LayerNormBackwardCall",
    "LayerNormBackwardInterface",
    "LayerNormCall",
    "LayerNormFwdOp",
    "LayerNormInterface",
    "RMSNormBackwardCall",
    "RMSNormBackwardInterface",
    "RMSNormCall",
    "RMSNormFwdOp",
    "RMSNormInterface",
]
