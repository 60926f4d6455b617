"""`RMSNorm` and `LayerNorm`: torch.nn's modules, normalizing through tileops' row-norm ops; and
`declared_norm`, the forward of the classes declared with `register_module_semantics`."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..errors import OpInputError
from ..ops import LayerNormFwdOp, RMSNormFwdOp
from ..signature import HALF_DTYPES
from ._base import TileModule, config_refusal
from ._ops import cast, compute_dtype, op_for
from .semantics import ModuleSemantics

NORM_OPS = {"rms_norm": RMSNormFwdOp, "layer_norm": LayerNormFwdOp}


class RMSNorm(TileModule, nn.RMSNorm):
    """`torch.nn.RMSNorm` (same arguments) whose forward calls `RMSNormFwdOp`."""

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        return super().refusal(module) or config_refusal(
            lambda: RMSNormFwdOp(module.normalized_shape, module.eps)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # torch.nn.RMSNorm's name
        op = op_for(RMSNormFwdOp, x.device, self.normalized_shape, self.eps)
        weight = self.weight
        dtype = compute_dtype(x, weight)
        if dtype == x.dtype:
            return op(x, weight)
        return op(x.to(dtype), cast(weight, dtype)).to(x.dtype)


class LayerNorm(TileModule, nn.LayerNorm):
    """`torch.nn.LayerNorm` (same arguments) whose forward calls `LayerNormFwdOp`."""

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        return super().refusal(module) or config_refusal(
            lambda: LayerNormFwdOp(module.normalized_shape, module.eps)
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch.nn.LayerNorm's name
        op = op_for(LayerNormFwdOp, input.device, self.normalized_shape, self.eps)
        weight, bias = self.weight, self.bias
        dtype = compute_dtype(input, weight)
        if dtype == input.dtype:
            return op(input, weight, bias)
        return op(input.to(dtype), cast(weight, dtype), cast(bias, dtype)).to(input.dtype)


def declared_norm(module: nn.Module, x: torch.Tensor, semantics: ModuleSemantics) -> torch.Tensor:
    """`semantics` computed over the last dim of `x` with `module`'s attributes.

    Rounding, against the declared classes' own torch code: "scale_then_cast" runs the op on
    the 16-bit x with float32 params (computed in float32, rounded once), as those classes do.
    "cast_then_scale" rounds the normalized x to x's dtype, then scales in the promoted dtype:
    when that is x's dtype the op applies the weight itself and rounds once, so a 16-bit result
    may differ from the class's two roundings by one unit in the last place; otherwise (say
    float32 weight, 16-bit x) the op normalizes and the weight is applied after it, exactly as
    the class does. A float64 x is computed in float64 (the classes upcast to float32 only).
    """
    if x.dim() == 0:
        raise OpInputError(
            f"{type(module).__name__}: argument 'input' is 0-d; it normalizes over the last dim"
        )
    eps = getattr(module, semantics.eps) if isinstance(semantics.eps, str) else semantics.eps
    op = op_for(NORM_OPS[semantics.kind], x.device, (x.shape[-1],), eps)
    weight = getattr(module, semantics.weight) if semantics.weight else None
    bias = getattr(module, semantics.bias) if semantics.bias else None
    affine = semantics.kind == "layer_norm"
    if weight is None and bias is None:
        return op(x, None, None) if affine else op(x, None)
    offset = semantics.weight_offset
    if semantics.order == "scale_then_cast":
        dtype = torch.float32 if x.dtype in HALF_DTYPES else x.dtype
        weight, bias = _offset(cast(weight, dtype), offset), cast(bias, dtype)
        return op(x, weight, bias) if affine else op(x, weight)
    scale = _offset(weight, offset)
    if _of_dtype(scale, x.dtype) and _of_dtype(bias, x.dtype):  # the usual case: no cast
        return op(x, scale, bias) if affine else op(x, scale)
    dtypes = [t.dtype for t in (x, scale, bias) if t is not None]
    if functools.reduce(torch.promote_types, dtypes) == x.dtype:
        scale, bias = cast(scale, x.dtype), cast(bias, x.dtype)
        return op(x, scale, bias) if affine else op(x, scale)
    y = op(x, None, None) if affine else op(x, None)
    y = y if scale is None else y * scale
    return y if bias is None else y + bias


def _of_dtype(t: torch.Tensor | None, dtype: torch.dtype) -> bool:
    return t is None or t.dtype == dtype


def _offset(weight: torch.Tensor | None, offset: float) -> torch.Tensor | None:
    return weight if weight is None or not offset else weight + offset
