"""Triton kernels for tileops, and a triton target.

Importing this module registers its kernels; it must not import triton (compile lazily): each
family package (`rows`, `gemm`) keeps its Triton programs in `programs` modules, which its
launchers import on first use.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import (
    hookimpl,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
)
from tileops.ops import (
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

from . import target
from .declare import DEVICES
from .fused.kernels import (
    ADD_RMS_NORM_KEY,
    GLU_KEY,
    ROTARY_KEY,
    TritonAddRMSNorm,
    TritonAddRMSNormBackward,
    TritonGLU,
    TritonGLUBackward,
    TritonRotary,
    TritonRotaryBackward,
)
from .gemm.kernels import GEMM_KEY, TritonGemm
from .linear_ce.kernels import (
    LINEAR_CE_KEY,
    TritonLinearCrossEntropy,
    TritonLinearCrossEntropyGrad,
    own_path_builder,
)
from .rows.backward_kernels import (
    BACKWARD_KEY,
    TritonLayerNormBackward,
    TritonRMSNormBackward,
    TritonSoftmaxBackward,
)
from .rows.kernels import (
    LAYER_NORM_KEY,
    RMS_NORM_KEY,
    SOFTMAX_KEY,
    TritonLayerNorm,
    TritonRMSNorm,
    TritonSoftmax,
)

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {
        "name": "tileops-triton-backend",
        "version": _version("tileops-triton-backend"),
        "devices": sorted(DEVICES),
    }


register_kernel_type(LayerNormFwdOp, LAYER_NORM_KEY, TritonLayerNorm)
register_kernel_type(RMSNormFwdOp, RMS_NORM_KEY, TritonRMSNorm)
register_kernel_type(SoftmaxFwdOp, SOFTMAX_KEY, TritonSoftmax)
register_kernel_type(GemmOp, GEMM_KEY, TritonGemm)
register_kernel_type(LayerNormFwdOp, BACKWARD_KEY, TritonLayerNormBackward)
register_kernel_type(RMSNormFwdOp, BACKWARD_KEY, TritonRMSNormBackward)
register_kernel_type(SoftmaxFwdOp, BACKWARD_KEY, TritonSoftmaxBackward)
register_kernel_type(LinearCrossEntropyFwdOp, LINEAR_CE_KEY, TritonLinearCrossEntropy)
register_kernel_type(LinearCrossEntropyGradOp, LINEAR_CE_KEY, TritonLinearCrossEntropyGrad)
register_kernel_type(AddRMSNormFwdOp, ADD_RMS_NORM_KEY, TritonAddRMSNorm)
register_kernel_type(AddRMSNormFwdOp, BACKWARD_KEY, TritonAddRMSNormBackward)
register_kernel_type(GLUFwdOp, GLU_KEY, TritonGLU)
register_kernel_type(GLUFwdOp, BACKWARD_KEY, TritonGLUBackward)
register_kernel_type(RotaryFwdOp, ROTARY_KEY, TritonRotary)
register_kernel_type(RotaryFwdOp, BACKWARD_KEY, TritonRotaryBackward)

register_detector(target=target.NAME, detect=target.claims_device)
register_kernel_builder(op=LayerNormFwdOp, target=target.NAME, build_kernel=target.build_layer_norm)
register_kernel_builder(op=RMSNormFwdOp, target=target.NAME, build_kernel=target.build_rms_norm)
register_kernel_builder(op=SoftmaxFwdOp, target=target.NAME, build_kernel=target.build_softmax)
register_kernel_builder(op=GemmOp, target=target.NAME, build_kernel=target.build_gemm)
register_kernel_builder(op=GemmFwdOp, target=target.NAME, build_kernel=target.build_gemm_fwd)
register_kernel_builder(op=BatchNormFwdOp, target=target.NAME, build_kernel=target.build_batch_norm)
for own_op in (LinearCrossEntropyFwdOp, LinearCrossEntropyGradOp):
    register_kernel_builder(op=own_op, target=target.NAME, build_kernel=own_path_builder(own_op))
ATTENTION_OPS = (
    AttentionFwdOp,
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionVarlenFwdOp,
    AttentionVarlenBwdOp,
)
for attention_op in ATTENTION_OPS:
    register_kernel_builder(
        op=attention_op, target=target.NAME, build_kernel=target.reference_builder(attention_op)
    )
# The fused ops on target "triton" (ROCm): their torch definitions, as for attention.
for fused_op in (AddRMSNormFwdOp, GLUFwdOp, RotaryFwdOp):
    register_kernel_builder(
        op=fused_op, target=target.NAME, build_kernel=target.reference_builder(fused_op)
    )
