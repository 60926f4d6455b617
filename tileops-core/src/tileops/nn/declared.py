"""Serving a declared class: a subclass generated per class, whose forward calls the op.

kernelize swaps a module's class in place, as for torch.nn's types, so the module keeps its
parameters, buffers, hooks and attributes. For a class of another library there is no tileops.nn
class to swap to: `declared_class` makes one, `(DeclaredNorm, cls)`, named as `cls` (code that
tests class names, as transformers' weight init does, still matches) and still an instance of
it. Generated classes cannot be imported by name, so instances pickle (and deep-copy) as a call
that regenerates the class from `cls` and the declaration.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import inspect
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ArgumentError
from ._base import TileModule, config_refusal
from .normalization import NORM_OPS, declared_norm
from .semantics import ModuleSemantics


class DeclaredNorm(TileModule):
    """Mixin first in the bases of a generated class; the declared class comes last."""

    semantics: ClassVar[ModuleSemantics]
    input_name: ClassVar[str | None]  # the name of the declared forward's one input

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) == 1 and not kwargs:
            return declared_norm(self, args[0], self.semantics)
        if not args and list(kwargs) == [self.input_name]:
            return declared_norm(self, kwargs[self.input_name], self.semantics)
        raise ArgumentError(
            f"{type(self).__name__}.forward() takes one tensor, {self.input_name!r}; got "
            f"{len(args)} positional argument(s) and keywords {sorted(kwargs)}"
        )

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        if cls.input_name is None:
            return "its forward does not take exactly one input, as a declared norm does"
        return (
            super().refusal(module)
            or _attribute_refusal(module, cls.semantics)
            or _probe_refusal(module, cls.semantics)
        )

    def __reduce_ex__(self, protocol: int) -> tuple:
        reduced = super().__reduce_ex__(protocol)
        if reduced[0] not in (copyreg.__newobj__, copyreg._reconstructor):
            return reduced  # the declared class pickles itself its own way
        # object's pickling: (make an empty instance of the class, ...), then the state
        return (_new_declared, (self.torch_type, self.semantics), *reduced[2:])


@functools.cache
def declared_class(cls: type[nn.Module], semantics: ModuleSemantics) -> type[DeclaredNorm]:
    """The class `kernelize` swaps instances of `cls` to: one per class and declaration."""
    namespace = {
        "__module__": __name__,
        "__qualname__": cls.__qualname__,
        "__doc__": f"`{cls.__qualname__}` computing {semantics} through tileops' op.",
        "semantics": semantics,
        "input_name": _input_name(cls),
    }
    return type(cls.__name__, (DeclaredNorm, cls), namespace)


def _new_declared(cls: type[nn.Module], semantics: ModuleSemantics) -> DeclaredNorm:
    """An empty instance of `declared_class(cls, semantics)`, for unpickling."""
    declared = declared_class(cls, semantics)
    return declared.__new__(declared)


def _input_name(cls: type[nn.Module]) -> str | None:
    """The name of the one input `cls.forward` takes, or None when it takes another number."""
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
    if len(params) == 1 and params[0].kind in plain:
        return params[0].name
    return None


def _attribute_refusal(module: nn.Module, semantics: ModuleSemantics) -> str | None:
    """Why `module`'s attributes do not fit `semantics`, or None."""
    params = {}
    for role in ("weight", "bias"):
        name = getattr(semantics, role)
        value = getattr(module, name, _MISSING) if name else None
        if value is _MISSING:
            return f"it has no attribute {name!r}, declared as its {role}"
        if value is not None and not (isinstance(value, torch.Tensor) and value.dim() == 1):
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            return f"its {role} {name!r} is {shape}, not a 1-D tensor over the normalized dim"
        params[role] = value
    sizes = {p.shape[0] for p in params.values() if p is not None}
    if len(sizes) > 1:
        return "its weight and bias differ in size"
    return _eps_refusal(module, semantics, sizes.pop() if sizes else 1)


def _eps_refusal(module: nn.Module, semantics: ModuleSemantics, n: int) -> str | None:
    eps = semantics.eps
    if isinstance(eps, str):
        eps = getattr(module, eps, None)
        if eps is None:
            return f"it has no eps in attribute {semantics.eps!r}"
    return config_refusal(lambda: NORM_OPS[semantics.kind]((n,), eps))


_MISSING = object()
PROBE_ROWS = 4


def _probe_refusal(module: nn.Module, semantics: ModuleSemantics) -> str | None:
    """Why `module`'s own forward does not compute `semantics` on a probe input, or None.

    A declaration names a class, and a library may change what that class computes between
    versions (which dtype it scales in, say); the probe, a float32 copy of the module on the
    CPU fed a bfloat16 input (where the rounding orders differ), catches that before the swap,
    not as a wrong result after it."""
    given = [getattr(module, name, None) for name in (semantics.weight, semantics.bias) if name]
    given = [t for t in given if isinstance(t, torch.Tensor)]
    if not given or any(t.is_meta for t in given):
        return None  # no parameters to order a rounding around, or no values to compare
    probe = copy.deepcopy(module).cpu().float()
    x = _probe_input(probe, semantics)
    with torch.no_grad():
        theirs = type(module).forward(probe, x)
        ours = declared_norm(probe, x, semantics)
    if theirs.dtype != ours.dtype:
        return (
            f"its forward returns {theirs.dtype} for a {x.dtype} input where {semantics} "
            f"returns {ours.dtype}: the class no longer computes what is declared for it"
        )
    tolerance = 4 * torch.finfo(x.dtype).eps
    if not torch.allclose(theirs.float(), ours.float(), rtol=tolerance, atol=tolerance):
        difference = (theirs.float() - ours.float()).abs().max().item()
        return (
            f"its forward differs from {semantics} on a probe input by up to {difference:.3g}: "
            "the class no longer computes what is declared for it"
        )
    return None


def _probe_input(module: nn.Module, semantics: ModuleSemantics) -> torch.Tensor:
    """(PROBE_ROWS, n) bfloat16 values away from zero (the probe's parameters are float32)."""
    names = (semantics.weight, semantics.bias)
    param = next(getattr(module, n) for n in names if n and getattr(module, n) is not None)
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(PROBE_ROWS, param.shape[0], generator=generator) * 2 + 0.5).bfloat16()
