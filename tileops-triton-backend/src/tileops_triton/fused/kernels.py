"""Triton's kernels for the fused training ops: forward ones on each op's own interface, and
backward ones on its "backward" interface beside the recompute reference.

Every class serves float16/bfloat16/float32 calls on every CUDA arch Triton runs on (CPU too,
under the interpreter); tileops-cuda has no kernel for these ops, so nothing is deferred to.
The backward classes refuse calls that want gradients they do not compute (the rotary tables')
and, as every non-differentiable backward does, calls under create_graph.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import torch

from tileops import Kernel
from tileops.backend import RMS_NORM_DEFAULT_EPS, Build
from tileops.ops import (
    AddRMSNormCall,
    AddRMSNormInterface,
    BackwardCall,
    BackwardInterface,
    GLUCall,
    GLUInterface,
    RotaryCall,
    RotaryInterface,
)

from ..declare import DEVICES, dtype_refusal
from . import launch

ADD_RMS_NORM_KEY = GLU_KEY = ROTARY_KEY = "triton"
BACKWARD_KEY = "triton_backward"


def _row_refusal(n: int, limit: int = launch.MAX_ROW) -> str | None:
    if n > limit:
        return (
            f"rows of {n} elements exceed the {limit} one program holds; the reference serves them"
        )
    return None


def _backward_dtype_refusal(call: BackwardCall) -> str | None:
    for dtype in call.dtypes:
        if dtype is not None and dtype_refusal(dtype) is not None:
            return dtype_refusal(dtype)
    return None


class TritonFused(Kernel):
    """Where every fused-op kernel runs: any CUDA arch Triton supports (CPU when interpreted)."""

    devices = DEVICES
    supported_archs = None


class TritonAddRMSNorm(TritonFused, AddRMSNormInterface):
    """Every float16/bfloat16/float32 call with rows up to `launch.MAX_ROW`."""

    @classmethod
    def refusal(cls, call: AddRMSNormCall) -> str | None:
        return dtype_refusal(call.dtype) or _row_refusal(call.n)

    @classmethod
    def entry_for(cls, call: AddRMSNormCall) -> tuple[Hashable, Build]:
        return (call.eps,), lambda: cls(call.eps)

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = torch.empty_like(x), torch.empty_like(x)
        launch.add_rms_norm(x, residual, weight, self.eps, out, h)
        return out, h


class TritonAddRMSNormBackward(TritonFused, BackwardInterface):
    """dx = dresidual (one tensor, returned for both) and dweight, recomputing the sum and
    rstd from the saved inputs; dweight from per-program partial sums added in a fixed order."""

    @classmethod
    def refusal(cls, call: BackwardCall) -> str | None:
        params = dict(call.params)
        n = math.prod(params["normalized_shape"])
        return _backward_dtype_refusal(call) or _row_refusal(n, launch.BACKWARD_MAX_ROW)

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        return (call.params, call.needs), lambda: cls(dict(call.params), call.needs)

    def __init__(self, params: dict[str, Any], needs: tuple[bool, ...]) -> None:
        self.n = math.prod(params["normalized_shape"])
        self.eps = params["eps"]
        self.needs = needs

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        x, residual, weight = inputs
        dy, dh = grads
        n = self.n
        eps = RMS_NORM_DEFAULT_EPS[x.dtype] if self.eps is None else self.eps
        rows = [t.contiguous().view(-1, n) for t in (x, residual, dy)]
        dh = None if dh is None else dh.contiguous().view(-1, n)
        w = None if weight is None else weight.contiguous().view(n)
        dx, dw = launch.add_rms_norm_backward(*rows[:2], w, eps, rows[2], dh)
        dx = dx.view(x.shape)
        dw = None if dw is None else dw.view(weight.shape)
        return tuple(g if need else None for g, need in zip((dx, dx, dw), self.needs, strict=True))


class TritonGLU(TritonFused, GLUInterface):
    """Every float16/bfloat16/float32 call, rows of any row stride."""

    @classmethod
    def refusal(cls, call: GLUCall) -> str | None:
        return dtype_refusal(call.dtype)

    @classmethod
    def entry_for(cls, call: GLUCall) -> tuple[Hashable, Build]:
        return (call.act,), lambda: cls(call.act)

    def __init__(self, act: str) -> None:
        self.act = act

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(gate, memory_format=torch.contiguous_format)  # any row stride
        launch.glu(self.act, gate, up, out)
        return out


class TritonGLUBackward(TritonFused, BackwardInterface):
    """dgate = dy * up * act'(gate) and dup = dy * act(gate) in one pass."""

    @classmethod
    def refusal(cls, call: BackwardCall) -> str | None:
        return _backward_dtype_refusal(call)

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        return (call.params, call.needs), lambda: cls(dict(call.params)["act"], call.needs)

    def __init__(self, act: str, needs: tuple[bool, ...]) -> None:
        self.act = act
        self.needs = needs

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        gate, up = inputs
        n = gate.shape[-1] if gate.dim() else 1
        if gate.numel() == 0:
            return tuple(
                torch.zeros_like(t) if need else None
                for t, need in zip(inputs, self.needs, strict=True)
            )
        rows = [glu_rows(t, n) for t in (gate, up, grads[0])]
        dgate, dup = launch.glu_backward(self.act, *rows)
        found = dgate.view(gate.shape), dup.view(up.shape)
        return tuple(g if need else None for g, need in zip(found, self.needs, strict=True))


class TritonRotary(TritonFused, RotaryInterface):
    """Every float16/bfloat16/float32 call: q and k of any strides, partial rotary included."""

    @classmethod
    def refusal(cls, call: RotaryCall) -> str | None:
        return dtype_refusal(call.dtype)

    def forward(self, q, k, cos, sin, q_out, k_out) -> None:  # noqa: ANN001
        launch.rotary(*_unit_strides(q, k, cos, sin), q_out, k_out)


class TritonRotaryBackward(TritonFused, BackwardInterface):
    """dq and dk: the transpose of the rotation applied to the outputs' gradients. Refuses
    calls that want the tables' gradients (the reference computes those)."""

    @classmethod
    def refusal(cls, call: BackwardCall) -> str | None:
        if any(call.needs[2:]):
            return "it computes no gradient for cos and sin; the reference backward does"
        return _backward_dtype_refusal(call)

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        identity = (dict(call.params)["unsqueeze_dim"], call.needs)
        return identity, lambda: cls(*identity)

    def __init__(self, unsqueeze_dim: int, needs: tuple[bool, ...]) -> None:
        self.unsqueeze_dim = unsqueeze_dim
        self.needs = needs

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        q, k, cos, sin = inputs
        dq_out, dk_out = (
            g if g is not None else torch.zeros_like(t) for g, t in zip(grads, (q, k), strict=True)
        )
        dq, dk = (
            torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
        )
        if q.numel() and k.numel():
            views = [heads_second(t, self.unsqueeze_dim) for t in (dq_out, dk_out, dq, dk)]
            shape = (q.shape[0], views[0].shape[2], cos.shape[-1])
            tables = cos.expand(shape), sin.expand(shape)
            q_, k_, c_, s_ = _unit_strides(views[0], views[1], *tables)
            launch.rotary(q_, k_, c_, s_, views[2], views[3], backward=True)
        else:
            dq, dk = dq_out.clone(), dk_out.clone()
        return dq if self.needs[0] else None, dk if self.needs[1] else None, None, None


def glu_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` as (rows, n) with unit stride along n, a view where one exists (GLUInterface's
    layout: a packed input's half keeps its row stride)."""
    rows = t.reshape(-1, n)
    return rows if rows.stride(-1) == 1 or n == 1 else rows.contiguous()


def heads_second(t: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
    """`t` as RotaryInterface's (batch, heads, seq, head_dim) view: heads are on dim 1 for
    unsqueeze_dim 1 (or -3), on dim 2 for 2 (or -2)."""
    return t if unsqueeze_dim in (1, -3) else t.transpose(1, 2)


def _unit_strides(q, k, cos, sin) -> tuple:  # noqa: ANN001
    """The rotary tensors with unit stride along their last dim, and cos and sin of one
    layout (the program reads both through cos's strides)."""
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    return q, k, cos, sin
