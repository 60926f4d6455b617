"""Fused training ops: residual add + RMSNorm, gated linear units, rotary embedding of q and k."""

from __future__ import annotations

from .add_rms_norm import AddRMSNormCall, AddRMSNormFwdOp, AddRMSNormInterface
from .glu import GLUCall, GLUFwdOp, GLUInterface
from .rotary import RotaryCall, RotaryFwdOp, RotaryInterface

__all__ = [
    "AddRMSNormCall",
    "AddRMSNormFwdOp",
    "AddRMSNormInterface",
    "GLUCall",
    "GLUFwdOp",
    "GLUInterface",
    "RotaryCall",
    "RotaryFwdOp",
    "RotaryInterface",
]
