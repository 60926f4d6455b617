"""Triton's row-wise backward kernels (RMSNorm, LayerNorm, softmax): their keys, where they run,
which calls they serve, and where they step aside.

Each serves float16/bfloat16/float32 calls of any n on every CUDA arch Triton runs on (CPU
too, under the interpreter), beside the recompute reference, which keeps float64, double
backward (create_graph: these gradients are not differentiable) and empty rows. Parameter
gradients go through per-program partial rows and a fixed-order sum: deterministic. Beside
tileops-cuda's backward kernels, Triton steps aside wherever one serves (`declare.deferral`),
except inside measured `faster` regions: none yet (TUNING.md#backward). Launch plans and
launchers: `backward_launch`; programs: `backward_programs`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import (
    LayerNormBackwardInterface,
    LayerNormFwdOp,
    RMSNormBackwardInterface,
    RMSNormFwdOp,
    SoftmaxBackwardCall,
    SoftmaxBackwardInterface,
    SoftmaxFwdOp,
)

from ..declare import DEVICES, FasterRegion, deferral, dtype_refusal
from .backward_launch import backward_plan, norm_backward, softmax_backward

BACKWARD_KEY = "triton_backward"
CUDA_BACKWARD_KEYS = frozenset({"tilelang_row_backward"})
"""tileops-cuda's keys on the row ops' backward interfaces."""

# Where Triton measured faster than tileops-cuda's backward kernels on the H200: none measured.
LAYER_NORM_BACKWARD_FASTER: tuple[FasterRegion, ...] = ()
RMS_NORM_BACKWARD_FASTER: tuple[FasterRegion, ...] = ()
SOFTMAX_BACKWARD_FASTER: tuple[FasterRegion, ...] = ()

EMPTY_ROWS = "rows of length 0 have no gradient to compute; the reference serves them"


class TritonRowsBackward(Kernel):
    """What the backward kernels declare alike; subclasses name their op and regions and add
    `own_refusal`."""

    devices = DEVICES
    supported_archs = None
    op_type: ClassVar[type]
    faster: ClassVar[tuple[FasterRegion, ...]]

    @classmethod
    def refusal(cls, call) -> str | None:
        if call.n == 0:
            return EMPTY_ROWS
        return (
            dtype_refusal(call.dtype)
            or cls.own_refusal(call)
            or deferral(cls.op_type, CUDA_BACKWARD_KEYS, cls.faster, call)
        )

    @classmethod
    def own_refusal(cls, call) -> str | None:
        return None


class TritonNormBackward(TritonRowsBackward):
    """LayerNorm's and RMSNorm's backward: dx, dweight (and dbias) from x and dy in one kernel,
    the row statistics recomputed from x; one build per (n, eps, dtype, param dtype, needs)."""

    center: ClassVar[bool]

    @classmethod
    def own_refusal(cls, call) -> str | None:
        if call.param_dtype is not None and call.param_dtype not in (call.dtype, torch.float32):
            return f"parameters of {call.param_dtype} beside x of {call.dtype} are not served"
        return None

    @classmethod
    def entry_for(cls, call) -> tuple[Hashable, Build]:
        identity = (call.n, call.eps, call.dtype, call.param_dtype, call.needs, call.sm_count)
        return identity, lambda: cls(*identity)

    def __init__(self, n, eps, dtype, param_dtype, needs, sm_count) -> None:
        self.n, self.eps, self.needs = n, eps, needs
        self.plan = backward_plan(n, sm_count)

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        (dy,), n = grads, self.n
        x, weight, bias = (*inputs, None)[:3]  # RMSNorm has no bias
        need_dx, need_dw, need_db = (*self.needs, False)[:3]
        wanted = (need_dx, need_dw and weight is not None, need_db and bias is not None)
        param_dtype = next((t.dtype for t in (weight, bias) if t is not None), x.dtype)
        w = None if weight is None else weight.contiguous().view(n)
        rows, dy_rows = x.contiguous().view(-1, n), dy.contiguous().view(-1, n)
        dx, dw, db = norm_backward(
            self.plan, rows, dy_rows, w, self.eps, self.center, wanted, param_dtype
        )
        found = (
            None if dx is None else dx.view(x.shape),
            None if dw is None else dw.view(weight.shape),
            None if db is None else db.view(bias.shape),
        )
        return found[: len(inputs)]


class TritonRMSNormBackward(TritonNormBackward, RMSNormBackwardInterface):
    """RMSNorm's dx and dweight, any n, float16/bfloat16/float32 (float32 weights too)."""

    op_type, faster, center = RMSNormFwdOp, RMS_NORM_BACKWARD_FASTER, False


class TritonLayerNormBackward(TritonNormBackward, LayerNormBackwardInterface):
    """LayerNorm's dx, dweight and dbias, any n, float16/bfloat16/float32 (float32 params too)."""

    op_type, faster, center = LayerNormFwdOp, LAYER_NORM_BACKWARD_FASTER, True

    @classmethod
    def own_refusal(cls, call) -> str | None:
        if call.n == 1:
            return (
                "a row of one column has dx exactly 0, which a fused multiply-add need not "
                "leave (dy * weight rounded, then subtracted); the reference serves it"
            )
        return super().own_refusal(call)


class TritonSoftmaxBackward(TritonRowsBackward, SoftmaxBackwardInterface):
    """Softmax's dx from the forward's y and dy, any n, float16/bfloat16/float32."""

    op_type, faster = SoftmaxFwdOp, SOFTMAX_BACKWARD_FASTER

    @classmethod
    def own_refusal(cls, call: SoftmaxBackwardCall) -> str | None:
        if not call.has_output:
            return (
                "the forward's output y was modified in place since the forward, and this "
                "kernel reads y; the reference recomputes it from x"
            )
        return None

    @classmethod
    def entry_for(cls, call: SoftmaxBackwardCall) -> tuple[Hashable, Build]:
        dim = dict(call.params)["dim"]
        return (call.n, dim), lambda: cls(call.n, dim)

    def __init__(self, n: int, dim: int) -> None:
        self.n, self.dim = n, dim
        self.plan = backward_plan(n, 0)

    def forward(self, grads: tuple, inputs: tuple, outputs: tuple) -> tuple:
        (dy,), (y,), n = grads, outputs, self.n
        rank = y.dim()
        dim = self.dim % rank if rank else 0
        moved = rank > 1 and dim != rank - 1
        if moved:  # the softmax dim last, as the forward's rows
            y, dy = y.movedim(dim, -1), dy.movedim(dim, -1)
        rows, dy_rows = y.contiguous().view(-1, n), dy.contiguous().view(-1, n)
        dx = softmax_backward(self.plan, rows, dy_rows).view(y.shape)
        return (dx.movedim(-1, dim) if moved else dx,)
