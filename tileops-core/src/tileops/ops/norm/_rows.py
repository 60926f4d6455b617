"""What LayerNorm and RMSNorm share: normalizing each row over the trailing `normalized_shape`.

Both flatten the caller's tensor to the canonical (rows, n) layout their kernels receive, hand
weight/bias over as contiguous (n,) vectors, and restore the caller's shape on the way out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ...callspec import CallSpec
from ...signature import BATCH, WIDENED, BoundCall, Input, Output, Signature
from .._common import as_rows, as_vector, like, param_dtype, rows_lane, shape_param


def norm_signature(*affine: str) -> Signature:
    """x of shape [..., *normalized_shape]; each affine param of shape normalized_shape, all of
    one dtype: x's, or float32 beside a 16-bit x (the call spec carries one `param_dtype`)."""
    x = Input("x", (BATCH, "*normalized_shape"))
    params = tuple(
        Input(name, ("*normalized_shape",), dtypes=(f"{WIDENED}x",), optional=True)
        for name in affine
    )
    types = {"normalized_shape": "int[]", "eps": "float?"}
    outputs = (Output("out", like="x"),)
    return Signature((x, *params), types, outputs, same_dtype=(affine,))


def rows_backward_facts(n: int, grads: tuple, inputs: tuple) -> dict[str, Any]:
    """The facts a norm's backward kernels select on, beside `BackwardCall`'s: the row length,
    x's dtype, the params' dtype, and whether x and dy are contiguous (a kernel reads them as
    (rows, n) in place; else it copies them first)."""
    x, dy, affine = inputs[0], grads[0], inputs[1:]
    return {
        "n": n,
        "dtype": x.dtype,
        "param_dtype": param_dtype(*affine),
        "contiguous": x.is_contiguous() and dy.is_contiguous(),
    }


class RowNorm:
    """Mixin (not an Op, so it is no registered op) for the row-wise norms' shared path."""

    interface_name: ClassVar[str]
    weighs_backward: ClassVar[bool] = True  # an autograd call's spec says `grad`, its rows

    def __init__(self, normalized_shape: Any, eps: float | None, *, target: str | None) -> None:
        op = type(self).__name__
        self.normalized_shape = shape_param(op, "normalized_shape", normalized_shape)
        self.eps = eps
        self._n = math.prod(self.normalized_shape)
        self._calls: dict[tuple, CallSpec] = {}
        super().__init__(target=target)

    def call_for(self, x: torch.Tensor, *affine: torch.Tensor | None) -> CallSpec:
        """The call spec of this call (hot path: attribute reads only)."""
        raise NotImplementedError

    def torch_forward(self, x: torch.Tensor, *affine: torch.Tensor | None) -> torch.Tensor:
        """torch's own function on the caller's tensors (its autograd records torch's node)."""
        return self.native_function(x, *affine, self.normalized_shape, self.eps)

    def forward(self, x: torch.Tensor, *affine: torch.Tensor | None) -> torch.Tensor:
        n = self._n
        rows = as_rows(x, n)
        key = _spec_key(x, affine)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self.call_for(x, *affine)
        y = self.call_kernel(
            self.interface_name, call, rows.shape, x.dtype, rows, *[as_vector(t, n) for t in affine]
        )
        return y if rows is x else like(y, x)  # y has rows' shape: call_kernel checked it

    def lane_for(self, call: BoundCall) -> Callable[..., torch.Tensor] | None:
        x, *affine = call.tensors
        spec = self._calls.get(_spec_key(x, affine))
        kernel = None if spec is None else self._hits.get((self.interface_name, spec))
        if kernel is None:
            return None
        n = self._n

        def lane(x: torch.Tensor, *affine: torch.Tensor | None) -> torch.Tensor:
            rows = as_rows(x, n)
            y = kernel(rows, *[as_vector(t, n) for t in affine])
            return y if rows is x else like(y, x)

        if any(t is None or t.dim() != 1 for t in affine):
            return lane
        return rows_lane(kernel, lane, x.shape, n)

    def native_lane_for(self, call: BoundCall) -> Callable[..., torch.Tensor] | None:
        """torch's function under torch's autograd for the autograd calls whose grad spec (the
        call's spec with `grad` and its rows as a power of two) a `torch_native` kernel serves;
        the other sizes take the op's node. Each size is selected once, on its first call."""
        x, *affine = call.tensors
        spec = self._calls.get(_spec_key(x, affine)) or self.call_for(x, *affine)
        n, interface, select = self._n, self.interface_name, self.kernel_for
        function, config = self.native_function, (self.normalized_shape, self.eps)
        native: dict[int, bool] = {}

        def lane(x: torch.Tensor, *affine: torch.Tensor | None) -> torch.Tensor | None:
            rows = x.numel() // n if n else 0
            if not rows:  # no kernel sees it
                return None
            size = 1 << (rows - 1).bit_length()
            served = native.get(size)
            if served is None:
                kernel = select(interface, dataclasses.replace(spec, grad=True, rows=size))
                served = native[size] = getattr(kernel, "torch_native", False)
            return function(x, *affine, *config) if served else None

        return lane


def _spec_key(x: torch.Tensor, affine: Any) -> tuple:
    """What a norm's call spec follows from: x's dtype and device and the params' dtypes (so
    it is remembered per combination rather than built per call)."""
    return (x.dtype, x.device, *[None if t is None else t.dtype for t in affine])
