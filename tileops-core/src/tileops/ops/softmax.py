"""Softmax forward, matching `torch.softmax(x, dim)`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ..backward import BackwardInterface, RecomputeBackward
from ..callspec import CallSpec
from ..errors import OpInputError
from ..kernel import KernelInterface
from ..op import Op
from ..signature import BATCH, BoundCall, Input, Output, Signature
from ._common import ReferenceKernel, as_rows, int_param, like, sample_case

if TYPE_CHECKING:
    from ..samples import Case


class SoftmaxCall(CallSpec):
    """One softmax call: rows of length `n` (the softmax dim's size)."""

    n: int
    dtype: torch.dtype


class SoftmaxInterface(KernelInterface):
    """Interface "softmax": `exp(x - max) / sum(exp(x - max))` along each row.

    Layout contract: `x` is a contiguous (rows, n) tensor; the op moved the softmax dim last
    and flattened the others into rows. Return a contiguous (rows, n) tensor of x's dtype; the
    op restores the caller's layout. Calls with rows == 0 or n == 0 never reach a kernel.
    """

    call_spec = SoftmaxCall

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class SoftmaxReference(ReferenceKernel, SoftmaxInterface):
    """`torch.softmax` along each row: 16-bit rows are summed in float32, rounded once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)


class SoftmaxFwdOp(Op):
    """`torch.softmax(x, dim)` for x of any shape; a 0-d x counts as one element along dim."""

    namespace = "tileops"
    interfaces = {"softmax": SoftmaxInterface, "backward": BackwardInterface}
    kernel_types = {"reference": SoftmaxReference, "reference_backward": RecomputeBackward}
    signature = Signature((Input("x", (BATCH,)),), {"dim": "int"}, (Output("out", like="x"),))

    def __init__(self, dim: int = -1, *, target: str | None = None) -> None:
        self.dim = int_param(type(self).__name__, "dim", dim)
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        rank = max(call.tensors[0].dim(), 1)
        if not -rank <= self.dim < rank:
            raise OpInputError(
                f"{type(self).__name__}(): dim {self.dim} is out of range for argument 'x' of "
                f"shape {list(call.tensors[0].shape)}; expected dim in [{-rank}, {rank - 1}]"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank = x.dim()
        dim = self.dim % rank if rank else -1
        moved = x if dim in (-1, rank - 1) else x.movedim(dim, -1)
        n = moved.shape[-1] if rank else 1
        rows = as_rows(moved, n)
        call = SoftmaxCall(device=x.device, n=n, dtype=x.dtype)
        y = like(self.call_kernel("softmax", call, rows.shape, x.dtype, rows), moved)
        return y if moved is x else like(y.movedim(-1, dim).contiguous(), x)  # as torch.softmax

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, self.dim)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"dim": -1}, (16, 100))
        yield sample_case({"dim": 1}, (4, 33, 5))
