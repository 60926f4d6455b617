"""GEMM, matching `a @ b` for 2-D a and b."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ..backward import BackwardInterface, RecomputeBackward
from ..callspec import CallSpec
from ..kernel import KernelInterface
from ..op import Op
from ..signature import Input, Output, Signature
from ._common import ReferenceKernel, sample_case

if TYPE_CHECKING:
    from ..samples import Case


class GemmCall(CallSpec):
    """One GEMM call: (m, k) @ (k, n)."""

    m: int
    n: int
    k: int
    dtype: torch.dtype


class GemmInterface(KernelInterface):
    """Interface "gemm": `a @ b`.

    Layout contract: `a` is a contiguous (m, k) tensor and `b` a contiguous (k, n) tensor, both
    of the call's dtype. Return a contiguous (m, n) tensor of that dtype, accumulated in at least
    float32. Calls with m == 0 or n == 0 never reach a kernel; k == 0 does (the result is zeros).
    """

    call_spec = GemmCall

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class GemmReference(ReferenceKernel, GemmInterface):
    """`torch.mm`: 16-bit operands are accumulated in float32, rounded once at the end."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)


class GemmOp(Op):
    """`a @ b` for a of shape (m, k) and b of shape (k, n), of one dtype."""

    namespace = "tileops"
    interfaces = {"gemm": GemmInterface, "backward": BackwardInterface}
    kernel_types = {"reference": GemmReference, "reference_backward": RecomputeBackward}
    signature = Signature(
        (Input("a", ("m", "k")), Input("b", ("k", "n"), dtypes=("a",))),
        {},
        (Output("out", shape=("m", "n"), dtype_of="a"),),
    )

    def __init__(self, *, target: str | None = None) -> None:
        super().__init__(target=target)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        (m, k), n = a.shape, b.shape[1]
        call = GemmCall(device=a.device, m=m, n=n, k=k, dtype=a.dtype)
        return self.call_kernel("gemm", call, (m, n), a.dtype, a.contiguous(), b.contiguous())

    def reference_forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({}, (64, 48), (48, 80))
        yield sample_case({}, (1, 256), (256, 7), note="skinny")
