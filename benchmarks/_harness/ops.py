"""The ops' inputs and call specs as the benchmarks build them: the row-wise ops (LayerNorm,
RMSNorm, softmax) at a row length, and BatchNorm with weight, bias and running statistics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tileops.ops import BatchNormCall, LayerNormFwdOp, RMSNormFwdOp, SoftmaxCall, SoftmaxFwdOp

from .copies import copy_moving
from .timing import kernel_us

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ELEMENTS = 2**26  # M * N of the row-wise benchmarks
EPS, MOMENTUM = 1e-5, 0.1


def row_op_setup(op: str, x: torch.Tensor) -> tuple[Any, tuple, Callable, str, Any]:
    """(tileops op, its args, torch eager fn, kernel interface, call spec) for `op`
    ("layer_norm", "rms_norm" or "softmax") on the rows of x, random parameters."""
    n = x.shape[-1]
    params = lambda: torch.randn(n, device=x.device, dtype=x.dtype)  # noqa: E731
    if op == "layer_norm":
        args = (x, params(), params())
        tile_op = LayerNormFwdOp(n, EPS)
        eager = lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS)  # noqa: E731
        return tile_op, args, eager, "layer_norm", tile_op.call_for(*args)
    if op == "rms_norm":
        args = (x, params())
        tile_op = RMSNormFwdOp(n, EPS)
        eager = lambda x, w: F.rms_norm(x, (n,), w, EPS)  # noqa: E731
        return tile_op, args, eager, "rms_norm", tile_op.call_for(*args)
    tile_op = SoftmaxFwdOp(-1)
    call = SoftmaxCall(device=x.device, n=n, dtype=x.dtype)
    return tile_op, (x,), lambda x: torch.softmax(x, -1), "softmax", call


def model_bytes(args: tuple) -> int:
    """The bytes a row-wise op moves on `args` (x first): x read, y written, params read."""
    x = args[0]
    return (2 * x.numel() + sum(a.numel() for a in args[1:])) * x.element_size()


def bn_params(x: torch.Tensor) -> list[torch.Tensor]:
    """Weight, bias, running mean and variance of x's channels, in x's dtype."""
    c = x.shape[1]
    w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    return [t.to(x.dtype) for t in (w, b, rm, rv)]


def bn_call_for(x: torch.Tensor) -> Any:
    """The call spec of an affine BatchNorm with running statistics on x, params in x's dtype."""
    return BatchNormCall(device=x.device, batch=x.shape[0], channels=x.shape[1],
                         spatial=x[0, 0].numel(), eps=EPS, momentum=MOMENTUM, dtype=x.dtype,
                         has_weight=True, has_bias=True, has_running_stats=True,
                         param_dtype=x.dtype)  # fmt: skip


def training_case(shape: tuple[int, ...]) -> tuple[torch.Tensor, list, Any, float]:
    """A bfloat16 x of `shape` (mean 0.5, spread 2), its bn_params, its call spec, and the
    kernel time of a copy of three passes' bytes (training's two reads and a write), in us."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    three_passes_us = kernel_us(copy_moving(3 * x.numel() * x.element_size()))
    return x, bn_params(x), bn_call_for(x), three_passes_us


def serving_entry(op: Any, inputs: tuple) -> tuple[Any, tuple]:
    """The kernel object serving `op(*inputs)` and the canonical arguments it is called with."""
    seen: dict[str, Any] = {}
    call_kernel = op.call_kernel

    def spy(interface, call, shape, dtype, *args):
        seen.update(interface=interface, call=call, args=args)
        return call_kernel(interface, call, shape, dtype, *args)

    op.call_kernel = spy
    try:
        op(*inputs)
    finally:
        del op.call_kernel
    return op.kernel_for(seen["interface"], seen["call"]), seen["args"]
