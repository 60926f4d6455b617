"""Target "acme" for SoftmaxFwdOp: acme serves every call of op instances that settle on it.

A target codes against the op's signature, not its kernel interface: the builder receives one
`TensorSpec` per input (SoftmaxFwdOp has one, `x`) and the op's params by keyword (`dim`); the
kernel it returns is called with the input tensors positionally and the output buffers by
keyword (SoftmaxFwdOp's output is named `out`), and must write the result into them. `x`
arrives as the caller passed it (any shape, contiguous, on the call device), not flattened.
"""

from __future__ import annotations

import torch

from tileops.backend import TensorSpec


def claims_device(device: torch.device) -> bool:
    """acme claims no device on its own: users opt in with `SoftmaxFwdOp(target="acme")` or
    `tileops.backend.set_default_target("acme")`. Claiming "cpu" here would take every CPU
    softmax away from the op's own kernels, and clash with any other target claiming it."""
    return False


class AcmeSoftmax:
    """A built kernel: specialised on the dtype and the (normalised) softmax dim."""

    def __init__(self, dim: int, dtype: torch.dtype) -> None:
        self.dim = dim
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, *, out: torch.Tensor, **execution: object) -> None:
        """Writes softmax(x) into `out`; ignores execution arguments it has no use for."""
        if x.dim() == 0:  # a 0-d x is one element along dim
            out.fill_(1)
            return
        xf = x.float()
        e = (xf - xf.amax(dim=self.dim, keepdim=True)).exp_()
        out.copy_(e.div_(e.sum(dim=self.dim, keepdim=True)))


def build_softmax(x: TensorSpec, *, dim: int) -> AcmeSoftmax:
    """Called once per op instance and (device, dtype, shape) of `x`; build lazily here.

    The op has already checked that `dim` is in range for `x`; normalise it once so the
    kernel does no work per call that it could do here.
    """
    rank = len(x.shape)
    return AcmeSoftmax(dim % rank if rank else 0, x.dtype)
