"""Residual add + RMSNorm: the pre-norm decoder layer's `h = x + residual; y = rms_norm(h)`
in one pass, returning both the normalized output and the new residual `h`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import OpInputError
from ...kernel import KernelInterface
from ...op import Op
from ...signature import BATCH, WIDENED, BoundCall, Input, Output, Signature
from .._common import (
    ReferenceKernel,
    as_rows,
    as_vector,
    eps_param,
    float32,
    like,
    sample_case,
    shape_param,
    upcasts,
)
from ..norm.rms_norm import DEFAULT_EPS
from ._outputs import call_kernel

if TYPE_CHECKING:
    from ...samples import Case


class AddRMSNormCall(CallSpec):
    """One call: rows of length `n`, `eps` resolved, x's dtype and the weight's (or None)."""

    n: int
    eps: float
    dtype: torch.dtype
    param_dtype: torch.dtype | None = None


class AddRMSNormInterface(KernelInterface):
    """Interface "add_rms_norm": `h = x + residual` rounded to x's dtype, then
    `h / sqrt(mean(h**2) + eps) * weight` per row, computed in float32 and rounded once.

    Layout contract: `x` and `residual` are contiguous (rows, n) tensors of one dtype; `weight`
    a contiguous (n,) tensor of `call.param_dtype` (x's, or float32 beside a 16-bit x), or None.
    Return (out, h): two contiguous (rows, n) tensors of x's dtype. Calls with rows == 0 or
    n == 0 never reach a kernel.
    """

    call_spec = AddRMSNormCall

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    normalized_shape: Sequence[int],
    eps: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's torch definition: the sum rounded to x's dtype (as `x + residual` is), the
    norm of 16-bit rows in float32, rounded once."""
    h = x + residual
    if upcasts(h):
        y = F.rms_norm(h.float(), normalized_shape, float32(weight), eps).to(h.dtype)
    else:
        y = F.rms_norm(h, normalized_shape, weight, eps)
    return y, h


class AddRMSNormReference(ReferenceKernel, AddRMSNormInterface):
    """The torch definition over each row."""

    build_fields = ("eps",)

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, residual, weight, x.shape[-1:], self.eps)


X = Input("x", (BATCH, "*normalized_shape"))
RESIDUAL = Input("residual", (BATCH, "*normalized_shape"), dtypes=("x",))
WEIGHT = Input("weight", ("*normalized_shape",), dtypes=(f"{WIDENED}x",), optional=True)


class AddRMSNormFwdOp(Op):
    """`h = x + residual; (F.rms_norm(h, normalized_shape, weight, eps), h)`: the normalized
    output and the new residual, from inputs of one shape."""

    namespace = "tileops"
    layout_checks = True
    interfaces = {"add_rms_norm": AddRMSNormInterface, "backward": BackwardInterface}
    kernel_types = {
        "reference": AddRMSNormReference,
        "reference_backward": RecomputeBackward,
    }
    signature = Signature(
        (X, RESIDUAL, WEIGHT),
        {"normalized_shape": "int[]", "eps": "float?"},
        (Output("out", like="x"), Output("residual_out", like="x")),
    )

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        *,
        target: str | None = None,
    ) -> None:
        op = type(self).__name__
        self.normalized_shape = shape_param(op, "normalized_shape", normalized_shape)
        self.eps = eps_param(op, eps, optional=True)
        self._n = math.prod(self.normalized_shape)
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        x, residual = call.tensors[0], call.tensors[1]
        if x.shape != residual.shape:
            raise OpInputError(
                f"{type(self).__name__}(): argument 'residual' has shape {list(residual.shape)}, "
                f"expected x's shape {list(x.shape)} (no broadcasting)"
            )

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self._n
        rows, res = as_rows(x, n), as_rows(residual, n)
        call = AddRMSNormCall(
            device=x.device,
            n=n,
            eps=DEFAULT_EPS[x.dtype] if self.eps is None else self.eps,
            dtype=x.dtype,
            param_dtype=None if weight is None else weight.dtype,
        )
        wanted = ((tuple(rows.shape), x.dtype),) * 2
        y, h = call_kernel(self, "add_rms_norm", call, wanted, rows, res, as_vector(weight, n))
        return like(y, x), like(h, x)

    def reference_forward(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, residual, weight, self.normalized_shape, self.eps)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"normalized_shape": (64,)}, (8, 64), (8, 64), (64,))
        yield sample_case({"normalized_shape": (33,), "eps": 1e-6}, (3, 5, 33), (3, 5, 33), None)
