"""tileops: a registry of GPU kernels for PyTorch ops, with one dispatcher that picks per call."""

from __future__ import annotations

from . import library as _library
from .backward import BackwardCall, BackwardInterface, RecomputeBackward
from .callspec import CallSpec
from .control import pinned, prefer
from .device import DeviceFacts
from .errors import (
    AmbiguousDispatchError,
    AmbiguousTargetError,
    ArgumentError,
    BackendError,
    CallSpecFieldError,
    ControlError,
    KernelDeclarationError,
    NoImplementationError,
    OpConfigError,
    OpDefinitionError,
    OpInputError,
    OpNotAvailableError,
    TileOpsError,
    UnknownOpError,
    UnknownTargetError,
)
from .explanation import Explanation
from .kernel import Kernel, KernelInterface
from .op import BUILTIN, Op
from .ops import (
    AddRMSNormFwdOp,
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenFwdOp,
    BatchNormFwdOp,
    GemmFwdOp,
    GemmOp,
    GLUFwdOp,
    LayerNormFwdOp,
    LinearCrossEntropyFwdOp,
    LinearCrossEntropyGradOp,
    RMSNormFwdOp,
    RotaryFwdOp,
    SoftmaxFwdOp,
)
from .record import Record, record
from .requirements import Requirements
from .signature import BoundCall, Input, Output, Signature, TensorSpec

__version__ = "0.1.0"

# The catalogue's torch.library operators exist from import on, so that an exported program
# holding `tileops::RMSNormFwdOp` loads in a fresh process.
for _op in (BatchNormFwdOp, GemmFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp):
    _library.operator(_op)
for _op in (AttentionFwdOp, AttentionBwdOp, AttentionDecodeOp):
    _library.operator(_op)
for _op in (AttentionVarlenFwdOp, AttentionVarlenBwdOp):
    _library.operator(_op)
for _op in (LinearCrossEntropyFwdOp, LinearCrossEntropyGradOp):
    _library.operator(_op)
for _op in (AddRMSNormFwdOp, GLUFwdOp, RotaryFwdOp):
    _library.operator(_op)

__all__ = [
    "BUILTIN",
    "AddRMSNormFwdOp",
    "AmbiguousDispatchError",
    "AmbiguousTargetError",
    "ArgumentError",
    "AttentionBwdOp",
    "AttentionDecodeOp",
    "AttentionFwdOp",
    "AttentionVarlenBwdOp",
    "AttentionVarlenFwdOp",
    "BackendError",
    "BackwardCall",
    "BackwardInterface",
    "BatchNormFwdOp",
    "BoundCall",
    "CallSpec",
    "CallSpecFieldError",
    "ControlError",
    "DeviceFacts",
    "Explanation",
    "GemmFwdOp",
    "GLUFwdOp",
    "GemmOp",
    "Input",
    "Kernel",
    "KernelDeclarationError",
    "KernelInterface",
    "LayerNormFwdOp",
    "LinearCrossEntropyFwdOp",
    "LinearCrossEntropyGradOp",
    "NoImplementationError",
    "Op",
    "OpConfigError",
    "OpDefinitionError",
    "OpInputError",
    "OpNotAvailableError",
    "Output",
    "RMSNormFwdOp",
    "RecomputeBackward",
    "Record",
    "Requirements",
    "RotaryFwdOp",
    "Signature",
    "SoftmaxFwdOp",
    "TensorSpec",
    "TileOpsError",
    "UnknownOpError",
    "UnknownTargetError",
    "pinned",
    "prefer",
    "record",
]
