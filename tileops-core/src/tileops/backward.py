"""Gradients of an op's inputs, through a kernel interface of their own.

Every catalogue op has a "backward" interface beside its forward ones. Its reference kernel,
`RecomputeBackward`, runs the op's torch definition (`Op.reference_forward`) again with autograd
on and differentiates it, so gradients match torch's for every op, dtype and shape the forward
serves, whichever kernel served the forward. Backends register faster backward kernels the way
they register forward ones: `register_kernel_type(OpClass, key, cls)` with a class inheriting
`BackwardInterface`; they win over the reference wherever they do not refuse.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .backend.registry import REGISTRY
from .call import CallSpec
from .kernel import Build, Kernel, KernelInterface

if TYPE_CHECKING:
    from .op import Op

Tensors = tuple[torch.Tensor | None, ...]


class BackwardCall(CallSpec):
    """One backward call: the op (unique name) and its params, the inputs' dtypes (None for an
    absent optional input) and which inputs need a gradient. No shapes: under tracing they are
    symbolic, and a kernel reads them off its tensors."""

    op: str
    params: tuple[tuple[str, Hashable], ...]
    dtypes: tuple[torch.dtype | None, ...]
    needs: tuple[bool, ...]


class BackwardInterface(KernelInterface):
    """Interface "backward": the gradients of an op's inputs.

    Layout contract: `grads` holds one gradient per output of the op, `inputs` the op's inputs
    exactly as its caller passed them (signature order, None for absent optional inputs, any
    strides). Return one tensor per input: the gradient, shaped and typed like that input,
    where `call.needs` is True, else None. Inputs the op writes (BatchNorm's running stats)
    never need a gradient and must not be written again.
    """

    call_spec = BackwardCall

    def forward(self, grads: Tensors, inputs: Tensors) -> Tensors:
        raise NotImplementedError


class RecomputeBackward(Kernel, BackwardInterface):
    """Differentiates the op's torch definition, recomputed from the saved inputs: exact
    agreement with torch's gradients, at the price of one more forward in torch."""

    devices = frozenset({"cpu", "meta", "cuda"})
    general = True

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        identity = (call.op, call.params, call.needs)
        return identity, lambda: cls(call.op, dict(call.params), call.needs)

    def __init__(self, op: str, params: dict[str, Any], needs: tuple[bool, ...]) -> None:
        self.op = REGISTRY.op_class(op)(**params)
        self.written = tuple(spec.written for spec in self.op.signature.inputs)
        self.needs = needs

    def forward(self, grads: Tensors, inputs: Tensors) -> Tensors:
        with torch.enable_grad():
            leaves = tuple(
                _leaf(t, need, written)
                for t, need, written in zip(inputs, self.needs, self.written, strict=True)
            )
            outputs = self.op.reference_forward(*leaves)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            wanted = [t for t, need in zip(leaves, self.needs, strict=True) if need]
            found = iter(torch.autograd.grad(outputs, wanted, grads, allow_unused=True))
        return tuple(next(found) if need else None for need in self.needs)


def _leaf(t: torch.Tensor | None, need: bool, written: bool) -> torch.Tensor | None:
    if t is None:
        return None
    if written:
        return t.detach().clone()  # the recompute must not update running stats again
    return t.detach().requires_grad_(need)


def backward_of(
    op: Op, grads: Sequence[torch.Tensor], inputs: Tensors, needs: Sequence[bool]
) -> Tensors:
    """The gradients of `op`'s inputs, from the kernel its "backward" interface selects."""
    call = BackwardCall(
        device=next(t.device for t in inputs if t is not None),
        op=type(op).op_name,
        params=tuple(op.params().items()),
        dtypes=tuple(None if t is None else t.dtype for t in inputs),
        needs=tuple(needs),
    )
    return op.kernel_for("backward", call)(tuple(grads), inputs)
