"""Gated linear units: `act(gate) * up`, the SwiGLU ("silu") and GeGLU ("gelu", "gelu_tanh")
of gated MLPs (Llama, Mistral, Qwen, Gemma), from two inputs of one shape.

A packed input (last dim 2·I, gate first then up: transformers' Phi-3 `gate_up_proj`, Liger's
and vLLM's layout) is passed as its two halves, views with no copy (`tileops.nn.glu`): the
kernels take rows of any row stride.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import OpConfigError, OpInputError
from ...kernel import KernelInterface
from ...op import Op
from ...signature import BATCH, BoundCall, Input, Output, Signature
from .._common import ReferenceKernel, like, rows_lane, sample_case, upcasts

if TYPE_CHECKING:
    from ...samples import Case

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def activation(name: str, gate: torch.Tensor) -> torch.Tensor:
    """`name` ("silu", "gelu" (erf) or "gelu_tanh") of `gate`, as torch computes it."""
    if name == "silu":
        return F.silu(gate)
    return F.gelu(gate, approximate="tanh" if name == "gelu_tanh" else "none")


def glu(act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The op's torch definition: 16-bit inputs computed in float32, rounded once."""
    if upcasts(gate):
        return (activation(act, gate.float()) * up.float()).to(gate.dtype)
    return activation(act, gate) * up


class GLUCall(CallSpec):
    """One call: the activation and the inputs' dtype (shapes are read off the tensors)."""

    act: str
    dtype: torch.dtype


class GLUInterface(KernelInterface):
    """Interface "glu": `act(gate) * up` elementwise, computed in float32 for 16-bit inputs.

    Layout contract: `gate` and `up` are (rows, n) tensors of one dtype with unit stride along
    n and any row stride each (the halves of a packed input). Return a contiguous (rows, n)
    tensor of their dtype. Calls with rows == 0 or n == 0 never reach a kernel.
    """

    call_spec = GLUCall

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class GLUReference(ReferenceKernel, GLUInterface):
    """The torch definition."""

    build_fields = ("act",)

    def __init__(self, act: str) -> None:
        self.act = act

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return glu(self.act, gate, up).contiguous()


class GLUFwdOp(Op):
    """`act(gate) * up` for `act` in "silu" (SwiGLU), "gelu" and "gelu_tanh" (GeGLU, exact or
    tanh-approximated), for gate and up of one shape."""

    namespace = "tileops"
    layout_checks = True
    interfaces = {"glu": GLUInterface, "backward": BackwardInterface}
    kernel_types = {"reference": GLUReference, "reference_backward": RecomputeBackward}
    signature = Signature(
        (Input("gate", (BATCH,)), Input("up", (BATCH,), dtypes=("gate",))),
        {"act": "str"},
        (Output("out", like="gate"),),
    )

    def __init__(self, act: str = "silu", *, target: str | None = None) -> None:
        if act not in ACTIVATIONS:
            raise OpConfigError(
                f"{type(self).__name__}: parameter 'act' must be one of "
                f"{', '.join(map(repr, ACTIVATIONS))}, got {act!r}"
            )
        self.act = act
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        gate, up = call.tensors
        if gate.shape != up.shape:
            raise OpInputError(
                f"{type(self).__name__}(): argument 'up' has shape {list(up.shape)}, expected "
                f"gate's shape {list(gate.shape)} (no broadcasting)"
            )

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        n = gate.shape[-1] if gate.dim() else 1
        g, u = _rows(gate, n), _rows(up, n)
        out = self.call_kernel(
            "glu", self._spec(gate), torch.Size((g.shape[0], n)), gate.dtype, g, u
        )
        return like(out, gate)

    def lane_for(self, call: BoundCall) -> Callable[..., torch.Tensor] | None:
        gate = call.tensors[0]
        kernel = self._hits.get(("glu", self._spec(gate)))
        if kernel is None:
            return None
        n = gate.shape[-1] if gate.dim() else 1

        def lane(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
            return like(kernel(_rows(gate, n), _rows(up, n)), gate)

        return rows_lane(kernel, lane, gate.shape, n, rows_in=2)

    def _spec(self, gate: torch.Tensor) -> GLUCall:
        return GLUCall(device=gate.device, act=self.act, dtype=gate.dtype)

    def reference_forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return glu(self.act, gate, up)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({"act": "silu"}, (8, 64), (8, 64))
        yield sample_case({"act": "gelu"}, (3, 5, 33), (3, 5, 33))
        yield sample_case({"act": "gelu_tanh"}, (7, 40), (7, 40))


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` as (rows, n) with unit stride along n: a view where one exists (a packed input's
    half keeps its row stride), else a copy."""
    rows = t.reshape(-1, n)
    return rows if rows.stride(-1) == 1 or n == 1 else rows.contiguous()
