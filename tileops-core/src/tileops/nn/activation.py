"""`Softmax`: torch.nn's module, through `SoftmaxFwdOp`."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..ops import SoftmaxFwdOp
from ._base import TileModule, config_refusal
from ._ops import op_for


class Softmax(TileModule, nn.Softmax):
    """`torch.nn.Softmax` (same arguments) whose forward calls `SoftmaxFwdOp`.

    `dim=None` keeps torch's deprecated implicit choice (and its warning): dim 0 for 0-, 1- and
    3-D inputs, else dim 1, picked per call from the input's rank. Under torch.compile the rank
    is known while tracing and the warning is left out: Dynamo cannot trace `warnings.warn`
    (torch's own module warns while compiling, from running F.softmax on fake tensors).
    """

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        if module.dim is None:
            return super().refusal(module)
        return super().refusal(module) or config_refusal(lambda: SoftmaxFwdOp(module.dim))

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch.nn.Softmax's name
        dim = self.dim if self.dim is not None else _implicit_dim(input.dim())
        return op_for(SoftmaxFwdOp, input.device, dim)(input)


def _implicit_dim(rank: int) -> int:
    """The dim torch's `F._get_softmax_dim` picks for an input of `rank` dims, with its warning."""
    if not torch.compiler.is_compiling():
        warnings.warn(
            "Implicit dimension choice for softmax has been deprecated. "
            "Change the call to include dim=X as an argument.",
            stacklevel=5,  # the caller of the module (as torch: through _call_impl)
        )
    return 0 if rank in (0, 1, 3) else 1
