"""`RMSNorm` and `LayerNorm`: torch.nn's modules, normalizing through tileops' row-norm ops."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import LayerNormFwdOp, RMSNormFwdOp
from ._base import TileModule, config_refusal
from ._ops import cast, compute_dtype, op_for


class RMSNorm(TileModule, nn.RMSNorm):
    """`torch.nn.RMSNorm` (same arguments) whose forward calls `RMSNormFwdOp`."""

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        return super().refusal(module) or config_refusal(
            lambda: RMSNormFwdOp(module.normalized_shape, module.eps)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = op_for(RMSNormFwdOp, x.device, self.normalized_shape, self.eps)
        weight = self.weight
        dtype = compute_dtype(x, weight)
        if dtype == x.dtype:
            return op(x, weight)
        return op(x.to(dtype), cast(weight, dtype)).to(x.dtype)


class LayerNorm(TileModule, nn.LayerNorm):
    """`torch.nn.LayerNorm` (same arguments) whose forward calls `LayerNormFwdOp`."""

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        return super().refusal(module) or config_refusal(
            lambda: LayerNormFwdOp(module.normalized_shape, module.eps)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = op_for(LayerNormFwdOp, x.device, self.normalized_shape, self.eps)
        weight, bias = self.weight, self.bias
        dtype = compute_dtype(x, weight)
        if dtype == x.dtype:
            return op(x, weight, bias)
        return op(x.to(dtype), cast(weight, dtype), cast(bias, dtype)).to(x.dtype)
