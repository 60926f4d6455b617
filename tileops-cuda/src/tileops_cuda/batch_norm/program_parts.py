"""What every BatchNorm program shares: the call's static facts (`Shape`), the kernel
signature over the (batch, channels, spatial) layout, and the output and running-stat macros."""

from __future__ import annotations

from typing import Any

from tileops.ops import BatchNormCall

from .._common.arith import DTYPE_NAMES, vector_width
from .plans import param_dtype


def f32(value: Any) -> Any:
    """`value` as float32 (a 16-bit load, a parameter): TIR does not promote mixed types."""
    import tilelang.language as T

    return T.Cast("float32", value)


class Shape:
    """The static facts every program reads off the call: dtypes, sizes, vector width."""

    def __init__(self, call: BatchNormCall) -> None:
        import tilelang.language as T

        self.dtype, self.pdtype = DTYPE_NAMES[call.dtype], DTYPE_NAMES[param_dtype(call)]
        self.channels, self.spatial = call.channels, call.spatial
        self.vec = vector_width(call.spatial, call.dtype)
        self.runs = call.spatial // self.vec  # vectors per (batch, channel) run
        self.eps, self.momentum = call.eps, call.momentum
        self.weight, self.bias = call.has_weight, call.has_bias
        self.stats = call.has_running_stats
        self.batch = T.dynamic("batch")

    def x_shape(self, batch: Any = None) -> tuple:
        return (self.batch if batch is None else batch, self.channels, self.spatial)


CHANNEL_TENSORS = ("W", "Bias", "RM", "RV")  # weight, bias, running mean and variance


def bn_prim_func(
    body: Any,
    shape: Shape,
    batch: Any = None,
    channel_tensors: tuple[str, ...] = CHANNEL_TENSORS,
    output: bool = True,
    kept: bool = True,
    **scratch: tuple,
) -> Any:
    """The prim_func of body(X, W, Bias, RM, RV, P, S, Q, Y, M) over the (batch, C, S) layout
    and the tensors named here (the others None): X, `channel_tensors` (every training and
    inference program takes all four, a placeholder standing in for an absent one), the
    `scratch` tensors (float32, the counters Q int32), with `output` Y, and with `output` and
    `kept` M, the float32 (2, C) batch mean and invstd a training program keeps for the
    backward."""
    from .._common import tiles

    def main(X, W=None, Bias=None, RM=None, RV=None, P=None, S=None, Q=None, Y=None, M=None):
        body(X, W, Bias, RM, RV, P, S, Q, Y, M)

    x = shape.x_shape(batch)
    per_channel = dict.fromkeys(channel_tensors, (shape.channels,))
    dtypes = dict.fromkeys(per_channel, shape.pdtype)
    dtypes.update({name: "int32" if name == "Q" else "float32" for name in scratch})
    tensors = {"X": x, **per_channel, **scratch}
    if output:
        tensors["Y"] = x
        if kept:
            tensors["M"], dtypes["M"] = (2, shape.channels), "float32"
    return tiles.prim_func(main, shape.dtype, dtypes, **tensors)


def epilogue(shape: Shape):
    """Macros shared by the training layouts: the output of one vector, and the channel's
    statistics: the batch mean and invstd kept in M, the running-stat update (unbiased
    variance, momentum blend, in float32, stored in the stats' dtype)."""
    import tilelang.language as T

    momentum = shape.momentum

    @T.macro
    def normalized(X, W, Bias, Y, b, c, s, mean, rstd):
        scale = rstd * f32(W[c]) if shape.weight else rstd
        for v in T.vectorized(shape.vec):
            if shape.bias:
                Y[b, c, s + v] = (f32(X[b, c, s + v]) - mean) * scale + f32(Bias[c])
            else:
                Y[b, c, s + v] = (f32(X[b, c, s + v]) - mean) * scale

    @T.macro
    def update_stats(RM, RV, M, c, mean, var, count):
        M[0, c] = mean
        M[1, c] = T.rsqrt(var + shape.eps)
        if shape.stats:
            unbiased = var * count / T.max(count - 1.0, 1.0)
            RM[c] = (1.0 - momentum) * f32(RM[c]) + momentum * mean
            RV[c] = (1.0 - momentum) * f32(RV[c]) + momentum * unbiased

    return normalized, update_stats
