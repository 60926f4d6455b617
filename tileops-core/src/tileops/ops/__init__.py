"""The op catalogue: each op with its signature, kernel interfaces, call specs and torch
reference kernels, so every op runs on CPU (and on meta tensors) with tileops-core alone."""

from __future__ import annotations

from ..backward import BackwardCall, BackwardInterface
from .attention import (
    AttentionBwdInterface,
    AttentionBwdOp,
    AttentionCall,
    AttentionDecodeCall,
    AttentionDecodeInterface,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionInterface,
    AttentionPagedDecodeCall,
    AttentionPagedDecodeInterface,
    AttentionVarlenCall,
    AttentionVarlenFwdOp,
    AttentionVarlenInterface,
)
from .fused import (
    AddRMSNormCall,
    AddRMSNormFwdOp,
    AddRMSNormInterface,
    GLUCall,
    GLUFwdOp,
    GLUInterface,
    RotaryCall,
    RotaryFwdOp,
    RotaryInterface,
)
from .gemm import GemmCall, GemmInterface, GemmOp
from .norm import (
    BatchNormCall,
    BatchNormFwdOp,
    BatchNormInferInterface,
    BatchNormTrainInterface,
    LayerNormCall,
    LayerNormFwdOp,
    LayerNormInterface,
    RMSNormCall,
    RMSNormFwdOp,
    RMSNormInterface,
)
from .softmax import SoftmaxCall, SoftmaxFwdOp, SoftmaxInterface

__all__ = [
    "AddRMSNormCall",
    "AddRMSNormFwdOp",
    "AddRMSNormInterface",
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
    "AttentionVarlenCall",
    "AttentionVarlenFwdOp",
    "AttentionVarlenInterface",
    "BackwardCall",
    "BackwardInterface",
    "BatchNormCall",
    "BatchNormFwdOp",
    "BatchNormInferInterface",
    "BatchNormTrainInterface",
    "GLUCall",
    "GLUFwdOp",
    "GLUInterface",
    "GemmCall",
    "GemmInterface",
    "GemmOp",
    "LayerNormCall",
    "LayerNormFwdOp",
    "LayerNormInterface",
    "RMSNormCall",
    "RMSNormFwdOp",
    "RMSNormInterface",
    "RotaryCall",
    "RotaryFwdOp",
    "RotaryInterface",
    "SoftmaxCall",
    "SoftmaxFwdOp",
    "SoftmaxInterface",
]
