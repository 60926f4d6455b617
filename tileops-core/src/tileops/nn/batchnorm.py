"""`BatchNorm1d/2d/3d`: torch.nn's modules, normalizing through `BatchNormFwdOp`.

The forward follows torch's `_BatchNorm.forward` line for line: batch statistics in training
and in eval without running stats, `num_batches_tracked` counted in training, running stats
updated only when tracked. Per call it picks the op's interface by `training`: the training
and the inference op are each built once per configuration (see `_ops.op_for`).

The op takes a fixed `momentum` in [0, 1]. `momentum=None` (a cumulative average, factor
1 / num_batches_tracked, different every call) and momenta outside [0, 1] are served by an op of
momentum 1, which writes the batch statistics into scratch tensors, blended into the running
stats here: `stat.lerp_(batch_stat, factor)`. The factor stays a tensor, so unlike torch this
path reads nothing back from the device.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops import BatchNormFwdOp
from ._base import TileModule, config_refusal
from ._ops import cast, compute_dtype, op_for

Tensor = torch.Tensor


class _BatchNorm(TileModule):
    """The forward every tileops BatchNorm shares; the torch.nn class comes second."""

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        return super().refusal(module) or config_refusal(
            lambda: BatchNormFwdOp(module.num_features, module.eps, training=False)
        )

    def forward(self, input: Tensor) -> Tensor:  # torch.nn's keyword
        x = input
        self._check_input_dim(x)
        factor = self._count_batch()
        stats_used = not self.training or self.track_running_stats
        mean = self.running_mean if stats_used else None
        var = self.running_var if stats_used else None
        if self.training or (self.running_mean is None and self.running_var is None):
            return self._normalize_batch(x, mean, var, factor)
        op = op_for(BatchNormFwdOp, x.device, self.num_features, self.eps, 0.0, False)
        return self._run(op, x, mean, var)

    def _count_batch(self) -> float | Tensor:
        """Count a training batch, as torch does; the running-stat factor of this call."""
        counted = self.training and self.track_running_stats
        if not counted or self.num_batches_tracked is None:
            return 0.0 if self.momentum is None else self.momentum
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average
            return 1.0 / self.num_batches_tracked
        return self.momentum

    def _normalize_batch(
        self, x: Tensor, mean: Tensor | None, var: Tensor | None, factor: float | Tensor
    ) -> Tensor:
        """Normalize with the batch statistics, updating the running ones when given."""
        direct = mean is None or (isinstance(factor, (int, float)) and 0.0 <= factor <= 1.0)
        momentum = factor if direct and mean is not None else 1.0
        op = op_for(BatchNormFwdOp, x.device, self.num_features, self.eps, momentum, True)
        if direct:
            return self._run(op, x, mean, var)
        batch_mean, batch_var = torch.zeros_like(mean), torch.zeros_like(var)
        y = self._run(op, x, batch_mean, batch_var)  # momentum 1: the batch stats themselves
        with torch.no_grad():
            blend = factor.to(mean.dtype) if isinstance(factor, Tensor) else factor
            mean.lerp_(batch_mean, blend)
            var.lerp_(batch_var, blend)
        return y

    def _run(
        self, op: BatchNormFwdOp, x: Tensor, mean: Tensor | None, var: Tensor | None
    ) -> Tensor:
        """The op on x, in the params' dtype when they differ (running stats are never cast:
        the op writes them in place)."""
        weight, bias = self.weight, self.bias
        dtype = compute_dtype(x, weight if weight is not None else mean)
        if dtype == x.dtype:
            return op(x, weight, bias, mean, var)
        return op(x.to(dtype), cast(weight, dtype), cast(bias, dtype), mean, var).to(x.dtype)


class BatchNorm1d(_BatchNorm, nn.BatchNorm1d):
    """`torch.nn.BatchNorm1d` (same arguments) whose forward calls `BatchNormFwdOp`."""


class BatchNorm2d(_BatchNorm, nn.BatchNorm2d):
    """`torch.nn.BatchNorm2d` (same arguments) whose forward calls `BatchNormFwdOp`."""


class BatchNorm3d(_BatchNorm, nn.BatchNorm3d):
    """`torch.nn.BatchNorm3d` (same arguments) whose forward calls `BatchNormFwdOp`."""
