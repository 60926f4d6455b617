"""`Linear`: torch.nn's module, multiplying through `GemmOp`.

The weight stays in torch's (out, in) row-major layout (state_dict, tied weights, views,
FSDP/DDP and kernelize's "same tensors" rule depend on it) and is passed as it is: `x @ W^T`
is GemmOp's NT layout (`trans_b=True`), which the kernels read in place, and the bias is the
op's epilogue, added before the one rounding as `F.linear` adds it. Nothing is copied, and no
choice depends on the number of rows, so a symbolic batch traces to one graph.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import OpInputError
from ..ops import GemmOp
from ..ops.gemm.gemm import linear_rows
from ._base import TileModule
from ._ops import op_for


class Linear(TileModule, nn.Linear):
    """`torch.nn.Linear` (same arguments): `y = x @ W^T + b` over any leading dims, one
    `GemmOp(trans_b=True)` call with the bias in its epilogue."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch.nn.Linear's keyword
        x, shape = input, input.shape
        if not shape or shape[-1] != self.in_features:
            raise OpInputError(
                f"tileops.nn.Linear: argument 'input' of shape {list(shape)} cannot be "
                f"multiplied by weight of shape {list(self.weight.shape)}; its last dim must "
                f"be in_features={self.in_features}"
            )
        gemm = op_for(GemmOp, x.device, False, True)
        if len(shape) == 2:  # no view, as F.linear's: FSDP2 drops hooks on in-place ops on views
            return gemm(x, self.weight, self.bias)
        if isinstance(gemm, GemmOp):  # eager: the op flattens, or runs F.linear where it may
            return gemm.linear(x, self.weight, self.bias)
        return linear_rows(gemm, x, self.weight, self.bias)
