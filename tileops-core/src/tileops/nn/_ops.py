"""What every tileops.nn module shares: the op instances it calls, and the mixed-precision path.

Modules hold no op of their own: an op is looked up per call from its configuration (read from
the module's attributes, so changing `eps` or `momentum` later is honoured) and the call's device.
Identical layers share one op instance, and the modules stay plain torch modules that copy,
pickle and swap class (see kernelize) without any extra state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import library
from ..op import Op
from ..signature import HALF_DTYPES

# The dtypes the ops' signatures accept (README: "float32, float16, bfloat16 and float64").
SERVED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})


def op_for(op_type: type[Op], device: torch.device, *config: Any) -> Callable[..., Any]:
    """What calls `op_type(*config)` on tensors of `device`: the shared op instance eagerly;
    under torch.compile its traced call (its torch.library operator, or torch's function where
    torch's kernel serves the call), so Dynamo never builds an op (locks, backend loading)
    while it traces. `config` is the op's signature params, in order."""
    if torch.compiler.is_compiling():
        return lambda *tensors: library.traced_call(op_type, tensors, config)
    return _shared_op(op_type, device, *config)


@functools.lru_cache(maxsize=1024)
def _shared_op(op_type: type[Op], device: torch.device, *config: Any) -> Op:
    """The shared `op_type(*config)` for calls on `device`: built once per configuration.

    Keyed by device too because an op instance settles its target on its first call's device.
    """
    return op_type(*config)


def compute_dtype(x: torch.Tensor, param: torch.Tensor | None) -> torch.dtype:
    """The dtype a norm module hands the op x and its params in: x's when they agree, or when
    they are autocast's layout (16-bit x beside float32 params), which the ops take as they are
    (normalizing in float32, and under autocast casting as torch's function is cast: float32
    out where CUDA's autocast runs the norm in float32); else their promotion, cast back."""
    if param is None or param.dtype == x.dtype:
        return x.dtype
    if param.dtype == torch.float32 and x.dtype in HALF_DTYPES:
        return x.dtype
    return torch.promote_types(x.dtype, param.dtype)


def cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def dtype_refusal(module: torch.nn.Module) -> str | None:
    """Why the ops cannot serve `module`'s parameters and buffers, or None."""
    served = ", ".join(sorted(str(d).removeprefix("torch.") for d in SERVED_DTYPES))
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        numeric = tensor.is_floating_point() or tensor.is_complex()  # not num_batches_tracked
        if numeric and tensor.dtype not in SERVED_DTYPES:
            dtype = str(tensor.dtype).removeprefix("torch.")
            return f"{name!r} has dtype {dtype}; the ops serve {served} (pass one as dtype=)"
    return None
