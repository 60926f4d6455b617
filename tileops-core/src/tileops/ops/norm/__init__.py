"""Normalization ops: LayerNorm, RMSNorm, BatchNorm."""

from __future__ import annotations

from .batch_norm import (
    BatchNormCall,
    BatchNormFwdOp,
    BatchNormInferInterface,
    BatchNormTrainInterface,
)
from .layer_norm import LayerNormCall, LayerNormFwdOp, LayerNormInterface
from .rms_norm import RMSNormCall, RMSNormFwdOp, RMSNormInterface

__all__ = [
    "BatchNormCall",
    "BatchNormFwdOp",
    "BatchNormInferInterface",
    "BatchNormTrainInterface",
    "LayerNormCall",
    "LayerNormFwdOp",
    "LayerNormInterface",
    "RMSNormCall",
    "RMSNormFwdOp",
    "RMSNormInterface",
]
