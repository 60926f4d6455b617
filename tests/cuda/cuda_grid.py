"""Calls the CUDA tests exercise: one or more row lengths per region of every row kernel, and
the BatchNorm and GEMM call specs."""

from __future__ import annotations

import torch

import tileops_cuda
from tileops.ops import (
    BatchNormCall,
    GemmCall,
    LayerNormCall,
    LayerNormFwdOp,
    RMSNormCall,
    RMSNormFwdOp,
    SoftmaxCall,
    SoftmaxFwdOp,
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Per layout: lengths inside its region, its edges, and rows that are no multiple of the
# vector width (odd lengths).
LENGTHS = {
    "warp_rows": (1, 7, 100, 1024),
    "block_row": (1025, 2048, 8192, 16384, 32768),
    "smem_row": (16385, 32768, 40001, 65536),
    "stream_row": (65536, 262147),
    "cluster_row": (32769, 65536, 262147),
}
ROW_OPS = (LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp)
# Simulated devices of the selection tests: facts as torch reports them on these boards.
SIMULATED = {
    80: {"sm_count": 108, "calibration": "NVIDIA A100-SXM4-80GB", "smem_budget": 166912},
    86: {"sm_count": 84, "calibration": "NVIDIA RTX A6000", "smem_budget": 101376},
    90: {"sm_count": 132, "calibration": "NVIDIA H200", "smem_budget": 232448},
}
INTERFACES = {"LayerNormFwdOp": "layer_norm", "RMSNormFwdOp": "rms_norm", "SoftmaxFwdOp": "softmax"}


def make_call(op_name: str, n: int, dtype: torch.dtype, device: str = "cuda:0", **flags):
    device = torch.device(device)
    if op_name == "LayerNormFwdOp":
        flags = {"has_weight": True, "has_bias": True, **flags}
        return LayerNormCall(device=device, n=n, eps=1e-5, dtype=dtype, **flags)
    if op_name == "RMSNormFwdOp":
        flags = {"has_weight": True, **flags}
        return RMSNormCall(device=device, n=n, eps=1e-6, dtype=dtype, **flags)
    return SoftmaxCall(device=device, n=n, dtype=dtype)


def kernel_cases(dtypes=DTYPES):
    """(op name, key, class, n, dtype) for every row kernel and every length of its region."""
    for op in ROW_OPS:
        for key, cls in tileops_cuda.KERNELS[op].items():
            for n in LENGTHS[cls.layout]:
                for dtype in dtypes:
                    yield op.__name__, key, cls, n, dtype


def bn_call(
    batch: int,
    channels: int,
    spatial: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cuda:0",
    **flags,
) -> BatchNormCall:
    """A BatchNorm call with weight, bias and running stats of x's dtype unless `flags` say."""
    fields = {"has_weight": True, "has_bias": True, "has_running_stats": True, **flags}
    given = fields["has_weight"] or fields["has_bias"] or fields["has_running_stats"]
    fields.setdefault("param_dtype", dtype if given else None)
    return BatchNormCall(
        device=torch.device(device),
        batch=batch,
        channels=channels,
        spatial=spatial,
        eps=1e-5,
        momentum=0.1,
        dtype=dtype,
        **fields,
    )


GEMM_LAYOUTS = {"NN": (False, False), "NT": (False, True), "TN": (True, False), "TT": (True, True)}


def gemm_call(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "NN",
    has_bias: bool = False,
) -> GemmCall:
    trans_a, trans_b = GEMM_LAYOUTS[layout]
    return GemmCall(device=torch.device("cuda:0"), m=m, n=n, k=k, dtype=dtype, trans_a=trans_a,
                    trans_b=trans_b, has_bias=has_bias)  # fmt: skip
