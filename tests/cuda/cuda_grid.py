"""Calls the CUDA tests exercise: one or more row lengths per region of every kernel."""

from __future__ import annotations

import torch

import tileops_cuda
from tileops.ops import LayerNormCall, RMSNormCall, SoftmaxCall

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Per layout: lengths inside its region, its edges, and rows that are no multiple of the
# vector width (odd lengths).
LENGTHS = {
    "warp_rows": (1, 7, 100, 1024),
    "block_row": (1025, 4096, 16384),
    "smem_row": (16385, 65536),
    "stream_row": (65536, 262147),
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
    """(op name, key, class, n, dtype) for every kernel and every length of its region."""
    for op, keys in tileops_cuda.KERNELS.items():
        for key, cls in keys.items():
            for n in LENGTHS[cls.layout]:
                for dtype in dtypes:
                    yield op.__name__, key, cls, n, dtype
