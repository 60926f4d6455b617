"""What the Triton backend's tests share: its kernel classes by op, stand-ins declared like
tileops-cuda's row kernels, tolerances, and the interpreter marker."""

from __future__ import annotations

import pytest
import torch

from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.ops import (
    GemmOp,
    LayerNormFwdOp,
    LayerNormInterface,
    RMSNormFwdOp,
    RMSNormInterface,
    SoftmaxFwdOp,
    SoftmaxInterface,
)
from tileops_triton.declare import INTERPRETING
from tileops_triton.gemm import kernels as gemm
from tileops_triton.rows import kernels as rows

TRITON = {
    LayerNormFwdOp: (rows.LAYER_NORM_KEY, rows.TritonLayerNorm),
    RMSNormFwdOp: (rows.RMS_NORM_KEY, rows.TritonRMSNorm),
    SoftmaxFwdOp: (rows.SOFTMAX_KEY, rows.TritonSoftmax),
    GemmOp: (gemm.GEMM_KEY, gemm.TritonGemm),
}

FASTER = {
    LayerNormFwdOp: rows.LAYER_NORM_FASTER,
    RMSNormFwdOp: rows.RMS_NORM_FASTER,
    SoftmaxFwdOp: rows.SOFTMAX_FASTER,
}


def measured_faster(op_cls: type, call: object) -> bool:
    """Whether `call` lies in a region where Triton measured faster than tileops-cuda."""
    return call.calibration == "NVIDIA H200" and any(r.covers(call) for r in FASTER[op_cls])


interpreted = pytest.mark.skipif(not INTERPRETING, reason="runs Triton on CPU: TRITON_INTERPRET=1")


def _stand_in(interface: type, name: str, lo: int, hi: int) -> type:
    """A class declared like tileops-cuda's row kernels: sm_80..sm_90, rows lo < n <= hi."""

    def refusal(cls, call):
        return None if lo < call.n <= hi else f"{name} owns {lo} < n <= {hi}"

    return type(
        name,
        (Kernel, interface),
        {
            "supported_archs": frozenset({80, 86, 89, 90}),
            "refusal": classmethod(refusal),
            "forward": interface.forward,
        },
    )


STAND_IN_REGIONS = {
    "tilelang_warp_rows": (0, 1024),
    "tilelang_block_row": (1024, 16384),
    "tilelang_stream_row": (16384, 2**40),
}


def register_stand_ins() -> None:
    interfaces = {
        LayerNormFwdOp: LayerNormInterface,
        RMSNormFwdOp: RMSNormInterface,
        SoftmaxFwdOp: SoftmaxInterface,
    }
    for op, interface in interfaces.items():
        for key, (lo, hi) in STAND_IN_REGIONS.items():
            register_kernel_type(op, key, _stand_in(interface, f"StandIn_{key}", lo, hi))


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
