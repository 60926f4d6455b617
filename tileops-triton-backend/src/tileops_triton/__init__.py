"""Triton kernels for tileops, and a triton target.

Importing this module registers its kernels; it must not import triton (compile lazily): the
Triton programs live in the `_*_kernels` modules, which the launchers import on first use.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import (
    hookimpl,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
)
from tileops.ops import BatchNormFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp

from . import gemm, norms, softmax, target
from .declare import DEVICES

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {
        "name": "tileops-triton-backend",
        "version": _version("tileops-triton-backend"),
        "devices": sorted(DEVICES),
    }


register_kernel_type(LayerNormFwdOp, norms.LAYER_NORM_KEY, norms.TritonLayerNorm)
register_kernel_type(RMSNormFwdOp, norms.RMS_NORM_KEY, norms.TritonRMSNorm)
register_kernel_type(SoftmaxFwdOp, softmax.KEY, softmax.TritonSoftmax)
register_kernel_type(GemmOp, gemm.KEY, gemm.TritonGemm)

register_detector(target=target.NAME, detect=target.claims_device)
register_kernel_builder(op=LayerNormFwdOp, target=target.NAME, build_kernel=target.build_layer_norm)
register_kernel_builder(op=RMSNormFwdOp, target=target.NAME, build_kernel=target.build_rms_norm)
register_kernel_builder(op=SoftmaxFwdOp, target=target.NAME, build_kernel=target.build_softmax)
register_kernel_builder(op=GemmOp, target=target.NAME, build_kernel=target.build_gemm)
register_kernel_builder(op=BatchNormFwdOp, target=target.NAME, build_kernel=target.build_batch_norm)
