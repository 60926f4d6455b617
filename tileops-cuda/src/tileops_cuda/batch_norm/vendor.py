"""cuDNN BatchNorm as BatchNormFwdOp kernels ("cudnn" for training, "cudnn_infer"): torch's
F.batch_norm on CUDA, which runs cuDNN (or torch's own CUDA kernels where cuDNN does not take
the call), reading channels_last x where it lies. Training keeps the batch's mean and invstd
for the backward where torch's own kernels ran (they return them).

Each is preferred over the TileLang keys of its interface and steps aside only inside
`TRAIN_FASTER` / `INFER_FASTER`, where the TileLang kernels measured faster on the H200
(TUNING.md#vendor-regions): bfloat16 x in (batch, channels, spatial) order over the measured
layer sizes. channels_last x (which the TileLang kernels refuse), float16, float32, float64,
other boards and sizes never measured go to cuDNN.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import (
    BatchNormCall,
    BatchNormFwdOp,
    BatchNormInferInterface,
    BatchNormTrainInterface,
)

from .._common.vendor import Faster, deferral

TRAIN_KEYS = (
    "tilelang_bn_block_channel",
    "tilelang_bn_cluster_channel",
    "tilelang_bn_group_channel",
    "tilelang_bn_smem_channel",
    "tilelang_bn_split_channel",
    "tilelang_bn_thread_channel",
    "tilelang_bn_tiled",
)
INFER_KEYS = ("tilelang_bn_infer",)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_cudnn_enabled = torch._C._get_cudnn_enabled
_ATEN = 0  # torch._batch_norm_impl_index's answer when ATen's native kernels ran
SOURCE = "benchmarks/results/batch_norm/batchnorm_gemm_nvidia_h200.md"


@dataclass(frozen=True)
class BatchNormRegion(Faster):
    """bfloat16 x, not channels_last, per-channel tensors bfloat16 or float32 (or none), with
    `channels` and n = batch * spatial values per channel within the measured bounds."""

    channels: tuple[int, int] = (64, 2048)
    values: tuple[int, int] = (32 * 49, 4 * 1024 * 1024)

    def covers(self, call: BatchNormCall) -> bool:
        n = call.batch * call.spatial
        return (
            call.dtype == torch.bfloat16
            and not call.channels_last
            and call.param_dtype in (None, torch.bfloat16, torch.float32)
            and self.channels[0] <= call.channels <= self.channels[1]
            and self.values[0] <= n <= self.values[1]
        )


TRAIN_FASTER = (
    BatchNormRegion(  # TUNING.md#vendor-regions
        keys=TRAIN_KEYS,
        figure=(
            "2.4-8.8x cuDNN's bandwidth on ResNet-50's 24 layers at batch 32 and 256 and "
            "4x128x1024x1024 (slowest: 2.45x at 256x2048x7x7)"
        ),
        source=f"{SOURCE}, commit 9bf5cd2",
    ),
)
INFER_FASTER = (
    BatchNormRegion(  # TUNING.md#vendor-regions
        keys=INFER_KEYS,
        figure=(
            "1.75-4.8x cuDNN's bandwidth on ResNet-50's 24 layers at batch 32 and 256 and "
            "4x128x1024x1024 (slowest: 1.75x at 32x256x14x14)"
        ),
        source=f"{SOURCE}, commit 4f1e7e2",
    ),
)


class _Cudnn(Kernel):
    """F.batch_norm on x as the interface lays it out; channels_last x as the (batch,
    channels, spatial, 1) channels_last view of the same memory, so nothing is copied."""

    supported_archs = None
    channels_last = True
    torch_native = True  # under autograd: torch.batch_norm with torch's backward
    training: ClassVar[bool]
    faster: ClassVar[tuple[Faster, ...]]

    @classmethod
    def refusal(cls, call: BatchNormCall) -> str | None:
        if call.dtype not in DTYPES:
            return f"{call.dtype} is not served (F.batch_norm on CUDA takes float types)"
        return deferral(BatchNormFwdOp, "cuDNN", cls.faster, call)

    @classmethod
    def entry_for(cls, call: BatchNormCall) -> tuple[Hashable, Build]:
        identity = (call.eps, call.momentum if cls.training else 0.0, call.channels_last)
        return identity, lambda: cls(*identity)

    def __init__(self, eps: float, momentum: float, channels_last: bool) -> None:
        self.eps, self.momentum, self.last = eps, momentum, channels_last

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = x.transpose(1, 2).unsqueeze(-1) if self.last else x
        stats = running_mean, running_var
        # what torch.batch_norm runs, without F.batch_norm's Python checks (the op's ran
        # already); ATen's own kernels (impl 0, not cuDNN's) return the batch's mean and invstd
        y, mean, invstd, _, impl = torch._batch_norm_impl_index(
            x, weight, bias, *stats, self.training, self.momentum, self.eps, _cudnn_enabled()
        )
        y = y.squeeze(-1).transpose(1, 2).contiguous() if self.last else y
        if self.training and impl == _ATEN and mean.dtype == torch.float32:
            return y, mean, invstd
        return y


class CudnnBatchNormTrain(_Cudnn, BatchNormTrainInterface):
    training = True
    faster = TRAIN_FASTER
    preferred_over = frozenset(TRAIN_KEYS)


class CudnnBatchNormInfer(_Cudnn, BatchNormInferInterface):
    training = False
    faster = INFER_FASTER
    preferred_over = frozenset(INFER_KEYS)
