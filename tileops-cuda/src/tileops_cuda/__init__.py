"""First-party CUDA kernels for tileops, written in TileLang.

Importing this module registers its kernels and nothing else: tilelang is imported only when a
kernel is first built (on a dispatch miss), never here.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import hookimpl, register_kernel_type
from tileops.ops import (
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenFwdOp,
    BatchNormFwdOp,
    GemmOp,
    LayerNormFwdOp,
    RMSNormFwdOp,
    SoftmaxFwdOp,
)

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {"name": "tileops-cuda", "version": _version("tileops-cuda"), "devices": ["cuda"]}


# Imported after the hook, so that it is in place even if a kernel module fails to import.
from .attention import kernels as attention_kernels  # noqa: E402
from .batch_norm import backward as bn_backward  # noqa: E402
from .batch_norm import kernels as bn_kernels  # noqa: E402
from .batch_norm import vendor as bn_vendor  # noqa: E402
from .gemm import kernels as gemm_kernels  # noqa: E402
from .gemm import vendor as gemm_vendor  # noqa: E402
from .rows import backward_kernels as row_backward  # noqa: E402
from .rows import kernels as row_kernels  # noqa: E402
from .rows import vendor as row_vendor  # noqa: E402

KERNELS = {
    LayerNormFwdOp: {
        "tilelang_warp_rows": row_kernels.LayerNormWarpRows,
        "tilelang_block_row": row_kernels.LayerNormBlockRow,
        "tilelang_smem_row": row_kernels.LayerNormSmemRow,
        "tilelang_stream_row": row_kernels.LayerNormStreamRow,
        "tilelang_cluster_row": row_kernels.LayerNormClusterRow,
    },
    RMSNormFwdOp: {
        "tilelang_warp_rows": row_kernels.RMSNormWarpRows,
        "tilelang_block_row": row_kernels.RMSNormBlockRow,
        "tilelang_smem_row": row_kernels.RMSNormSmemRow,
        "tilelang_stream_row": row_kernels.RMSNormStreamRow,
        "tilelang_cluster_row": row_kernels.RMSNormClusterRow,
    },
    SoftmaxFwdOp: {
        "tilelang_warp_rows": row_kernels.SoftmaxWarpRows,
        "tilelang_block_row": row_kernels.SoftmaxBlockRow,
        "tilelang_smem_row": row_kernels.SoftmaxSmemRow,
        "tilelang_stream_row": row_kernels.SoftmaxStreamRow,
        "tilelang_cluster_row": row_kernels.SoftmaxClusterRow,
    },
    BatchNormFwdOp: {
        "tilelang_bn_thread_channel": bn_kernels.BatchNormThreadChannel,
        "tilelang_bn_block_channel": bn_kernels.BatchNormBlockChannel,
        "tilelang_bn_smem_channel": bn_kernels.BatchNormSmemChannel,
        "tilelang_bn_cluster_channel": bn_kernels.BatchNormClusterChannel,
        "tilelang_bn_group_channel": bn_kernels.BatchNormGroupChannel,
        "tilelang_bn_split_channel": bn_kernels.BatchNormSplitChannel,
        "tilelang_bn_tiled": bn_kernels.BatchNormTiled,
        "tilelang_bn_infer": bn_kernels.BatchNormInfer,
    },
    GemmOp: {
        "tilelang_gemm": gemm_kernels.GemmGeneral,
        "tilelang_gemm_hopper": gemm_kernels.GemmHopper,
        "tilelang_gemm_skinny": gemm_kernels.GemmSkinny,
    },
    AttentionFwdOp: {
        "sdpa_cudnn": attention_kernels.SdpaCudnn,
        "sdpa_flash": attention_kernels.SdpaFlash,
        "sdpa_efficient": attention_kernels.SdpaEfficient,
        "tilelang_flash_fwd": attention_kernels.TileLangFlashFwd,
        "tilelang_flash_fwd_sm90": attention_kernels.TileLangFlashFwdSm90,
        "tilelang_flash_decode": attention_kernels.TileLangFlashDecode,
    },
    AttentionBwdOp: {
        "sdpa_cudnn": attention_kernels.SdpaCudnnBackward,
        "sdpa_flash": attention_kernels.SdpaFlashBackward,
        "sdpa_efficient": attention_kernels.SdpaEfficientBackward,
        "tilelang_flash_bwd": attention_kernels.TileLangFlashBwd,
    },
    AttentionDecodeOp: {
        "tilelang_flash_decode": attention_kernels.TileLangCacheDecode,
        "tilelang_paged_decode": attention_kernels.TileLangPagedDecode,
    },
    AttentionVarlenFwdOp: {"sdpa_flash": attention_kernels.SdpaFlashVarlen},
    AttentionVarlenBwdOp: {"sdpa_flash": attention_kernels.SdpaFlashVarlenBackward},
}
"""The kernels this package writes (TileLang, and torch's SDPA backends for attention): op
class -> key -> kernel class."""

VENDOR_KERNELS = {
    GemmOp: {"cublas": gemm_vendor.CublasGemm},
    BatchNormFwdOp: {
        "cudnn": bn_vendor.CudnnBatchNormTrain,
        "cudnn_infer": bn_vendor.CudnnBatchNormInfer,
        "aten_bn_backward": bn_backward.BatchNormBackwardNative,
    },
    LayerNormFwdOp: {"aten_layer_norm": row_vendor.AtenLayerNorm},
    RMSNormFwdOp: {"aten_rms_norm": row_vendor.AtenRMSNorm},
}
"""cuBLAS, cuDNN, ATen's native BatchNorm backward and ATen's LayerNorm / RMSNorm (autograd
calls) through torch, candidates beside KERNELS: they serve wherever no TileLang kernel was
measured faster (`_common.vendor`). No program of
their own to compile."""

ROW_BACKWARD_KERNELS = {
    LayerNormFwdOp: {row_backward.BACKWARD_KEY: row_backward.TileLangLayerNormBackward},
    RMSNormFwdOp: {row_backward.BACKWARD_KEY: row_backward.TileLangRMSNormBackward},
    SoftmaxFwdOp: {row_backward.BACKWARD_KEY: row_backward.TileLangSoftmaxBackward},
}
"""The row ops' backward kernels (on each op's "backward" interface): op -> key -> class."""

for _kernels in (KERNELS, VENDOR_KERNELS, ROW_BACKWARD_KERNELS):
    for _op, _keys in _kernels.items():
        for _key, _cls in _keys.items():
            register_kernel_type(_op, _key, _cls)
