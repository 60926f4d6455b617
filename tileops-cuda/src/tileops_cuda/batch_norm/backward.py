"""BatchNorm's backward on the GPU through ATen's native kernels, without a second forward.

The reference backward (`RecomputeBackward`) runs the op's torch definition again and
differentiates it: a full forward (16-bit x upcast to a float32 copy, normalized, rounded) and
then torch's backward. This kernel reads x once for the batch statistics in float32
(`torch.batch_norm_stats`, the per-channel pass SyncBatchNorm uses) and hands them to
`native_batch_norm_backward`, which computes dx, dweight and dbias in float32 in one pass over
x and dy, NCHW and channels_last alike (the layout x has, kept in dx). In inference the running
statistics take the batch's place and no statistics pass runs.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import BackwardCall, BackwardInterface

from .._common.arith import AMPERE_AND_LATER, ITEMSIZE

HALF_DTYPES = (torch.float16, torch.bfloat16)

Tensor = torch.Tensor
Tensors = tuple[Tensor | None, ...]


class BatchNormBackwardNative(Kernel, BackwardInterface):
    """dx, dweight and dbias of `BatchNormFwdOp` from ATen's native batch-norm backward."""

    supported_archs = AMPERE_AND_LATER
    takes_state = True
    torch_native = True  # torch's own backward: native lanes may pass over it

    @classmethod
    def refusal(cls, call: BackwardCall) -> str | None:
        dtype = call.dtypes[0]
        if dtype not in ITEMSIZE:
            return (
                f"x of {dtype} is not served: the native kernel accumulates in float32, which "
                "would lose float64 precision; the recompute reference serves it"
            )
        return None

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        params = dict(call.params)
        identity = (bool(params["training"]), float(params["eps"]), call.needs)
        return identity, lambda: cls(*identity)

    def __init__(self, training: bool, eps: float, needs: tuple[bool, ...]) -> None:
        self.training, self.eps = training, eps
        self.mask = list(needs[:3])

    def forward(self, grads: Tensors, inputs: Tensors, state: Tensors = ()) -> Tensors:
        (dy,), (x, weight, bias, running_mean, running_var) = grads, inputs
        if self.training:  # the forward's (mean, invstd), else one pass over x for them
            stats = (None, None, *(state or torch.batch_norm_stats(x, self.eps)))
        else:  # empty saved stats: the native kernel reads the running ones
            unset = x.new_empty(0, dtype=torch.float32)
            stats = (running_mean, running_var, unset, unset)
        mask = [self.mask[0], self.mask[1] and weight is not None, self.mask[2]]
        scale = weight if weight is not None else _ones(x, bias, running_mean)
        dx, dweight, dbias = torch.ops.aten.native_batch_norm_backward(
            dy, x, scale, *stats, self.training, self.eps, mask
        )
        # the native kernel may return gradients its mask left out: keep only those asked for
        kept = [g if want else None for g, want in zip((dx, dweight, dbias), mask, strict=True)]
        return (*kept, None, None)


def _ones(x: Tensor, *params: Tensor | None) -> Tensor:
    """A unit weight in the dtype of the per-channel tensors given (float32 beside 16-bit x when
    none is): the native kernel's mixed-precision path needs one dtype for all of them."""
    given = next((t.dtype for t in params if t is not None), None)
    dtype = given or (torch.float32 if x.dtype in HALF_DTYPES else x.dtype)
    return torch.ones(x.shape[1], dtype=dtype, device=x.device)
