"""RMSNorm forward, matching `torch.nn.functional.rms_norm`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...backward import BackwardCall, BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...kernel import KernelInterface
from ...op import Op
from ...signature import FLOAT_DTYPES
from .._common import ReferenceKernel, eps_param, float32, sample_case, upcasts
from ._rows import RowNorm, norm_signature, rows_backward_facts

if TYPE_CHECKING:
    from ...samples import Case

# F.rms_norm's eps=None is the machine epsilon of the dtype it computes in: float32 for 16-bit
# inputs (not the 16-bit dtype's own, much larger epsilon).
DEFAULT_EPS = {dt: torch.finfo(torch.promote_types(dt, torch.float32)).eps for dt in FLOAT_DTYPES}


class RMSNormCall(CallSpec):
    """One RMSNorm call: rows of length `n`; `eps` is the value added (defaults resolved).
    `grad` and `rows`: as LayerNormCall's."""

    n: int
    eps: float
    dtype: torch.dtype
    has_weight: bool
    param_dtype: torch.dtype | None = None  # weight dtype: x's, or float32 (mixed)
    grad: bool = False  # under autograd: the kernel's forward comes with the op's backward
    rows: int = 0  # of a grad call: its rows rounded up to a power of two (else 0)


class RMSNormInterface(KernelInterface):
    """Interface "rms_norm": `x / sqrt(mean(x**2) + eps) * weight` per row.

    Layout contract: `x` is a contiguous (rows, n) tensor (the op flattened the normalized dims
    and the leading batch dims); `weight` is a contiguous (n,) tensor of `call.param_dtype`
    (x's dtype, or float32 beside a 16-bit x under mixed precision), or None; a kernel that
    reads only x's dtype refuses the mixed calls.
    `eps` comes through the call spec already resolved to a float. Return a contiguous
    (rows, n) tensor of x's dtype; the op restores the caller's shape. Calls with rows == 0 or
    n == 0 never reach a kernel.
    """

    call_spec = RMSNormCall

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class RMSNormReference(ReferenceKernel, RMSNormInterface):
    """`F.rms_norm` over each row: 16-bit rows are scaled in float32, rounded once."""

    build_fields = ("eps",)

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is not None and weight.dtype != x.dtype:  # float32 weight, 16-bit x
            return F.rms_norm(x.float(), x.shape[-1:], weight, self.eps).to(x.dtype)
        return F.rms_norm(x, x.shape[-1:], weight, self.eps)


class RMSNormBackwardCall(BackwardCall):
    """One RMSNorm backward: rows of length `n` of `dtype`, `eps` resolved, the weight's dtype
    (None: no weight), whether x and dy are contiguous; `needs` says which of (dx, dweight)."""

    n: int
    eps: float
    dtype: torch.dtype
    param_dtype: torch.dtype | None
    contiguous: bool


class RMSNormBackwardInterface(BackwardInterface):
    """Interface "backward" of RMSNorm: the gradients of x and weight.

    Layout contract: `grads` is (dy,) shaped like x, `inputs` is (x, weight) as the caller
    passed them (any strides, weight None or of normalized_shape). Return (dx, dweight)
    shaped and typed like x and weight, None where `call.needs` is False. What the forward
    computed per row (the rstd) is not kept: kernels recompute it from x, which they read for
    dx anyway (TUNING.md of each backend says why)."""

    call_spec = RMSNormBackwardCall


class RMSNormRecompute(RecomputeBackward, RMSNormBackwardInterface):
    """`RecomputeBackward` on RMSNorm's backward interface: every call, any device and dtype."""


class RMSNormFwdOp(RowNorm, Op):
    """`F.rms_norm(x, normalized_shape, weight, eps)` over any leading batch shape."""

    namespace = "tileops"
    interfaces = {"rms_norm": RMSNormInterface, "backward": RMSNormBackwardInterface}
    kernel_types = {"reference": RMSNormReference, "reference_backward": RMSNormRecompute}
    signature = norm_signature("weight")
    interface_name = "rms_norm"

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        *,
        target: str | None = None,
    ) -> None:
        eps = eps_param(type(self).__name__, eps, optional=True)
        super().__init__(normalized_shape, eps, target=target)

    def call_for(self, x: torch.Tensor, weight: torch.Tensor | None) -> RMSNormCall:
        eps = self.eps
        return RMSNormCall(
            device=x.device,
            n=self._n,
            eps=DEFAULT_EPS[x.dtype] if eps is None else eps,
            dtype=x.dtype,
            has_weight=weight is not None,
            param_dtype=None if weight is None else weight.dtype,
        )

    def backward_facts(
        self, grads: tuple, inputs: tuple, outputs: tuple
    ) -> tuple[type[RMSNormBackwardCall], dict]:
        facts = rows_backward_facts(self._n, grads, inputs)
        eps = DEFAULT_EPS[facts["dtype"]] if self.eps is None else self.eps
        return RMSNormBackwardCall, {**facts, "eps": eps}

    def reference_forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if upcasts(x):  # as the kernels compute: in float32, rounded once
            y = F.rms_norm(x.float(), self.normalized_shape, float32(weight), self.eps)
            return y.to(x.dtype)
        return self.torch_forward(x, weight)

    @classmethod
    def native_function(
        cls, x: torch.Tensor, weight: torch.Tensor | None, normalized_shape: Any, eps: float | None
    ) -> torch.Tensor:
        return F.rms_norm(x, normalized_shape, weight, eps)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"normalized_shape": (64,)}, (8, 64), (64,))
        yield sample_case({"normalized_shape": (64,), "eps": 1e-6}, (8, 64), None, note="no weight")
        yield sample_case({"normalized_shape": (3, 40)}, (2, 5, 3, 40), (3, 40))
