"""LayerNorm forward, matching `torch.nn.functional.layer_norm`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...backward import BackwardCall, BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...kernel import KernelInterface
from ...op import Op
from ...signature import HALF_DTYPES
from .._common import ReferenceKernel, eps_param, float32, param_dtype, sample_case, upcasts
from ._rows import RowNorm, norm_signature, rows_backward_facts

if TYPE_CHECKING:
    from ...samples import Case


class LayerNormCall(CallSpec):
    """One LayerNorm call: rows of length `n` normalized with `eps`, affine params present.
    An autograd call is asked about as `grad` with its `rows` (`RowNorm.native_lane_for`), so
    a kernel can weigh what the whole training call costs (torch's, with its own backward)."""

    n: int
    eps: float
    dtype: torch.dtype
    has_weight: bool
    has_bias: bool
    param_dtype: torch.dtype | None = None  # weight/bias dtype: x's, or float32 (mixed)
    grad: bool = False  # under autograd: the kernel's forward comes with the op's backward
    rows: int = 0  # of a grad call: its rows rounded up to a power of two (else 0)


class LayerNormInterface(KernelInterface):
    """Interface "layer_norm": `(x - mean) / sqrt(var + eps) * weight + bias` per row.

    Layout contract: `x` is a contiguous (rows, n) tensor (the op flattened the normalized dims
    and the leading batch dims); `weight` and `bias` are contiguous (n,) tensors of
    `call.param_dtype` (x's dtype, or float32 beside a 16-bit x under mixed precision), or None;
    a kernel that reads only x's dtype refuses the mixed calls. The variance is biased. Return
    a contiguous (rows, n) tensor of x's dtype; the op restores the caller's shape. Calls with
    rows == 0 or n == 0 never reach a kernel.
    """

    call_spec = LayerNormCall

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError


class LayerNormReference(ReferenceKernel, LayerNormInterface):
    """`F.layer_norm` over each row: 16-bit rows are normalized in float32, rounded once (torch's
    16-bit CPU path does not: it upcasts here)."""

    build_fields = ("eps",)

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dtype in HALF_DTYPES:
            return _in_float32(x, x.shape[-1:], weight, bias, self.eps)
        return F.layer_norm(x, x.shape[-1:], weight, bias, self.eps)


def _in_float32(
    x: torch.Tensor,
    shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """`F.layer_norm` of 16-bit x computed in float32, rounded once to x's dtype."""
    return F.layer_norm(x.float(), shape, float32(weight), float32(bias), eps).to(x.dtype)


class LayerNormBackwardCall(BackwardCall):
    """One LayerNorm backward: rows of length `n` of `dtype` normalized with `eps`, the affine
    params' dtype (None: neither present), whether x and dy are contiguous; `needs` says which
    of (dx, dweight, dbias), and `dtypes` which params are present."""

    n: int
    eps: float
    dtype: torch.dtype
    param_dtype: torch.dtype | None
    contiguous: bool


class LayerNormBackwardInterface(BackwardInterface):
    """Interface "backward" of LayerNorm: the gradients of x, weight and bias.

    Layout contract: `grads` is (dy,) shaped like x, `inputs` is (x, weight, bias) as the
    caller passed them (any strides, weight and bias None or of normalized_shape). Return
    (dx, dweight, dbias) shaped and typed like them, None where `call.needs` is False. The
    row statistics are not kept: kernels recompute them from x, which they read for dx anyway
    (TUNING.md of each backend says why)."""

    call_spec = LayerNormBackwardCall


class LayerNormRecompute(RecomputeBackward, LayerNormBackwardInterface):
    """`RecomputeBackward` on LayerNorm's backward interface: every call, device and dtype."""


class LayerNormFwdOp(RowNorm, Op):
    """`F.layer_norm(x, normalized_shape, weight, bias, eps)` over any leading batch shape."""

    namespace = "tileops"
    interfaces = {"layer_norm": LayerNormInterface, "backward": LayerNormBackwardInterface}
    kernel_types = {"reference": LayerNormReference, "reference_backward": LayerNormRecompute}
    signature = norm_signature("weight", "bias")
    interface_name = "layer_norm"

    def __init__(
        self, normalized_shape: int | Sequence[int], eps: float = 1e-5, *, target: str | None = None
    ) -> None:
        super().__init__(normalized_shape, eps_param(type(self).__name__, eps), target=target)

    def call_for(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> LayerNormCall:
        return LayerNormCall(
            device=x.device,
            n=self._n,
            eps=self.eps,
            dtype=x.dtype,
            has_weight=weight is not None,
            has_bias=bias is not None,
            param_dtype=param_dtype(weight, bias),
        )

    def backward_facts(
        self, grads: tuple, inputs: tuple, outputs: tuple
    ) -> tuple[type[LayerNormBackwardCall], dict]:
        return LayerNormBackwardCall, {
            **rows_backward_facts(self._n, grads, inputs),
            "eps": self.eps,
        }

    def reference_forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if upcasts(x):
            return _in_float32(x, self.normalized_shape, weight, bias, self.eps)
        return self.torch_forward(x, weight, bias)

    @classmethod
    def native_function(
        cls,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        normalized_shape: Any,
        eps: float,
    ) -> torch.Tensor:
        return F.layer_norm(x, normalized_shape, weight, bias, eps)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"normalized_shape": (64,)}, (8, 64), (64,), (64,))
        yield sample_case({"normalized_shape": (64,)}, (8, 64), None, (64,), note="no weight")
        yield sample_case({"normalized_shape": (3, 40), "eps": 1e-3}, (2, 5, 3, 40))
