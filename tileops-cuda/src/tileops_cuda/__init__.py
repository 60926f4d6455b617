"""First-party CUDA kernels for tileops, written in TileLang.

Importing this module registers its kernels and nothing else: tilelang is imported only when a
kernel is first built (on a dispatch miss), never here.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import hookimpl, register_kernel_type
from tileops.ops import BatchNormFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {"name": "tileops-cuda", "version": _version("tileops-cuda"), "devices": ["cuda"]}


# Imported after the hook, so that it is in place even if a kernel module fails to import.
from . import batch_norm, gemm, norms, softmax  # noqa: E402

KERNELS = {
    LayerNormFwdOp: {
        "tilelang_warp_rows": norms.LayerNormWarpRows,
        "tilelang_block_row": norms.LayerNormBlockRow,
        "tilelang_smem_row": norms.LayerNormSmemRow,
        "tilelang_stream_row": norms.LayerNormStreamRow,
        "tilelang_cluster_row": norms.LayerNormClusterRow,
    },
    RMSNormFwdOp: {
        "tilelang_warp_rows": norms.RMSNormWarpRows,
        "tilelang_block_row": norms.RMSNormBlockRow,
        "tilelang_smem_row": norms.RMSNormSmemRow,
        "tilelang_stream_row": norms.RMSNormStreamRow,
        "tilelang_cluster_row": norms.RMSNormClusterRow,
    },
    SoftmaxFwdOp: {
        "tilelang_warp_rows": softmax.SoftmaxWarpRows,
        "tilelang_block_row": softmax.SoftmaxBlockRow,
        "tilelang_smem_row": softmax.SoftmaxSmemRow,
        "tilelang_stream_row": softmax.SoftmaxStreamRow,
        "tilelang_cluster_row": softmax.SoftmaxClusterRow,
    },
    BatchNormFwdOp: {
        "tilelang_bn_thread_channel": batch_norm.BatchNormThreadChannel,
        "tilelang_bn_block_channel": batch_norm.BatchNormBlockChannel,
        "tilelang_bn_smem_channel": batch_norm.BatchNormSmemChannel,
        "tilelang_bn_cluster_channel": batch_norm.BatchNormClusterChannel,
        "tilelang_bn_group_channel": batch_norm.BatchNormGroupChannel,
        "tilelang_bn_split_channel": batch_norm.BatchNormSplitChannel,
        "tilelang_bn_tiled": batch_norm.BatchNormTiled,
        "tilelang_bn_infer": batch_norm.BatchNormInfer,
    },
    GemmOp: {
        "tilelang_gemm": gemm.GemmGeneral,
        "tilelang_gemm_hopper": gemm.GemmHopper,
        "tilelang_gemm_skinny": gemm.GemmSkinny,
    },
}
"""Every kernel this package registers: op class -> key -> kernel class."""

for _op, _keys in KERNELS.items():
    for _key, _cls in _keys.items():
        register_kernel_type(_op, _key, _cls)
