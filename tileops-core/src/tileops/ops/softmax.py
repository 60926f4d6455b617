"""Softmax forward, matching `torch.softmax(x, dim)`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ..backward import BackwardCall, BackwardInterface, RecomputeBackward
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


class SoftmaxBackwardCall(BackwardCall):
    """One softmax backward: rows of length `n` (the softmax dim's size) of `dtype`; whether
    the forward's output y is at hand (False: modified in place since the forward), and
    whether y and dy are (rows, n) as they lie (the softmax dim last, contiguous)."""

    n: int
    dtype: torch.dtype
    has_output: bool
    contiguous: bool


class SoftmaxBackwardInterface(BackwardInterface):
    """Interface "backward" of softmax: `dx = y * (dy - sum(dy * y))` along the dim.

    Layout contract: `grads` is (dy,), `inputs` (x,) and `outputs` (y,), all as the caller
    holds them (any strides); y is the forward's output, kept by autograd, or None when the
    caller modified it in place since (`call.has_output` says which). Return (dx,) shaped and
    typed like x, or (None,) when `call.needs` is (False,)."""

    call_spec = SoftmaxBackwardCall

    def forward(self, grads: tuple, inputs: tuple, outputs: tuple) -> tuple:
        raise NotImplementedError


class SoftmaxRecompute(RecomputeBackward, SoftmaxBackwardInterface):
    """`RecomputeBackward` on softmax's backward interface: recomputes y from x, so it serves
    calls whose y was modified in place too."""


class SoftmaxFwdOp(Op):
    """`torch.softmax(x, dim)` for x of any shape; a 0-d x counts as one element along dim."""

    namespace = "tileops"
    layout_checks = True
    interfaces = {"softmax": SoftmaxInterface, "backward": SoftmaxBackwardInterface}
    kernel_types = {"reference": SoftmaxReference, "reference_backward": SoftmaxRecompute}
    signature = Signature((Input("x", (BATCH,)),), {"dim": "int"}, (Output("out", like="x"),))
    saves_outputs = True  # the backward kernels read y, not x

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

    def backward_facts(
        self, grads: tuple, inputs: tuple, outputs: tuple
    ) -> tuple[type[SoftmaxBackwardCall], dict]:
        (x,), (dy,), y = inputs, grads, outputs[0] if outputs else None
        rank = x.dim()
        last = not rank or self.dim % rank == rank - 1
        facts = {
            "n": x.shape[self.dim] if rank else 1,
            "dtype": x.dtype,
            "has_output": y is not None,
            "contiguous": last and dy.is_contiguous() and (y is None or y.is_contiguous()),
        }
        return SoftmaxBackwardCall, facts

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, self.dim)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"dim": -1}, (16, 100))
        yield sample_case({"dim": 1}, (4, 33, 5))
