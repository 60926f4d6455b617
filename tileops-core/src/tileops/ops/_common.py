"""What every op of the catalogue shares: constructor-param checks, the canonical row layout,
and the base of the torch reference kernels."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar

import torch

from .. import library
from ..backward import BackwardCall, BackwardInterface
from ..callspec import CallSpec
from ..errors import OpConfigError
from ..kernel import Build, Kernel
from ..registry import REGISTRY
from ..samples import Case
from ..signature import HALF_DTYPES, dtype_name

# -- constructor params ----------------------------------------------------------------------


def _config_error(op: str, name: str, expected: str, value: Any) -> OpConfigError:
    return OpConfigError(f"{op}: parameter {name!r} must be {expected}, got {value!r}")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of torch's int params (a schema `int` is an int64): dims, sizes."""


def _as_int(value: Any) -> int | None:
    """`value` as a Python int when torch takes it as an int param, else None: integers of any
    type with `__index__` (numpy's included) in the int64 range; never a bool."""
    if isinstance(value, bool):
        return None
    try:
        number = operator.index(value)
    except TypeError:  # not an integer (numpy's bool_ included)
        return None
    return number if INT64_MIN <= number <= INT64_MAX else None


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def eps_param(op: str, eps: Any, *, optional: bool = False) -> float | None:
    """`eps` as a float; None passes only where torch has a default for it."""
    if eps is None and optional:
        return None
    if not (_is_real(eps) and math.isfinite(eps) and eps >= 0):
        expected = "a finite number >= 0" + (" or None" if optional else "")
        raise _config_error(op, "eps", expected, eps)
    return float(eps)


def fraction_param(op: str, name: str, value: Any) -> float:
    if not (_is_real(value) and 0.0 <= value <= 1.0):
        raise _config_error(op, name, "a float in [0, 1]", value)
    return float(value)


def positive_int_param(op: str, name: str, value: Any) -> int:
    number = _as_int(value)
    if number is None or number < 1:
        raise _config_error(op, name, "an int >= 1 (at most 2**63 - 1)", value)
    return number


def int_param(op: str, name: str, value: Any) -> int:
    number = _as_int(value)
    if number is None:
        raise _config_error(op, name, "an int in the int64 range [-2**63, 2**63 - 1]", value)
    return number


def bool_param(op: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _config_error(op, name, "a bool", value)
    return value


def shape_param(op: str, name: str, value: Any) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints >= 0, as torch's `normalized_shape` accepts
    (numpy's ints too), as a tuple of Python ints."""
    dims = (value,) if _as_int(value) is not None else value
    if isinstance(dims, (tuple, list, torch.Size)):
        sizes = tuple(_as_int(d) for d in dims)
        if sizes and all(d is not None and d >= 0 for d in sizes):
            return sizes
    expected = "an int or a non-empty sequence of ints >= 0 (at most 2**63 - 1)"
    raise _config_error(op, name, expected, value)


# -- canonical layout ------------------------------------------------------------------------


def as_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """`x` as a contiguous (rows, n) tensor: the layout kernels of row-wise ops receive."""
    if x.dim() == 2 and x.is_contiguous():  # already rows: skip torch's slower view path
        return x
    return x.contiguous().view(-1, n)


def as_vector(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """A per-element parameter (weight, bias) as a contiguous (n,) tensor, or None."""
    if t is None or (t.dim() == 1 and t.is_contiguous()):
        return t
    return t.contiguous().view(n)


def like(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`y` in `x`'s shape, as a tensor autograd does not know as a view (torch's own ops return
    `_unsafe_view`s so): the caller may modify an op's output in place, even one made under
    no_grad, as it may torch's. `y` itself when it already has that shape and is no view."""
    if y.shape == x.shape and not y._is_view():
        return y
    with torch._C._AutoDispatchBelowADInplaceOrView():
        return y.view_as(x)


_is_contiguous = torch.Tensor.is_contiguous
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowADInplaceOrView


def rows_lane(
    kernel: Callable[..., torch.Tensor],
    general: Callable[..., torch.Tensor],
    shape: torch.Size,
    n: int,
    rows_in: int = 1,
) -> Callable[..., torch.Tensor]:
    """A lane for the calls of one input layout (x of `shape`) whose inputs are all given and
    contiguous: `kernel` on the first `rows_in` inputs (1 or all) as (rows, n) tensors and
    the others as they are, its (rows, n) output returned in `shape` as `like` would. The
    layout key fixes the shapes, so the views' sizes are known here; other strides take
    `general`."""
    if len(shape) == 2 and shape[1] == n:

        def lane(*inputs: torch.Tensor) -> torch.Tensor:
            if all(map(_is_contiguous, inputs)):
                return kernel(*inputs)
            return general(*inputs)

        return lane
    if not (shape and n):
        return general
    rows = math.prod(shape) // n
    dims = tuple(shape)

    def viewed_lane(x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        if not (_is_contiguous(x) and all(map(_is_contiguous, rest))):
            return general(x, *rest)
        if rows_in == 1:
            y = kernel(x.view(rows, n), *rest)
        else:
            y = kernel(x.view(rows, n), *[t.view(rows, n) for t in rest])
        with _BELOW_AUTOGRAD():
            return y.view(*dims)  # ints: a tuple costs torch more to parse

    return viewed_lane


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def float32(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` in float32 (itself when it already is), or None."""
    return None if t is None else t.float()


def upcasts(x: torch.Tensor) -> bool:
    """Whether an op's torch definition computes 16-bit `x` in float32 itself: yes, unless
    autocast is on for x's device, which then decides the dtype as for the torch counterpart."""
    if x.dtype not in HALF_DTYPES:
        return False
    device = x.device.type  # "meta" has no autocast
    return not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device))


def param_dtype(*params: torch.Tensor | None) -> torch.dtype | None:
    """The dtype of the parameters given (x's, or float32 under mixed precision; the op's
    checks made sure they agree), or None when none is: a call spec's `param_dtype`."""
    for t in params:
        if t is not None:
            return t.dtype
    return None


# -- reference kernels -----------------------------------------------------------------------


class ReferenceKernel(Kernel):
    """Base of the torch reference kernels: the fallback every other key beats, on every device
    torch runs them on (CPU, meta, CUDA), so any call torch serves is served (float64 on a GPU,
    say, which the GPU kernels refuse).

    Each calls the torch function it matches, so it has torch's numerics and autograd: float32
    and float64 compute in their own dtype; 16-bit inputs compute in float32 and round once.
    Torch's 16-bit CPU kernels do that for softmax, rms_norm and mm; layer_norm's and
    batch_norm's 16-bit paths do not (a constant row of 60000 normalizes to 0.99), so those
    kernels upcast themselves. tests/core/test_ops_numerics.py holds every kernel to the
    float32 computation rounded once, on inputs that expose the difference (large offsets,
    values near the 16-bit maximum). They are the baseline GPU kernels are checked against.
    `build_fields` names the call-spec fields the kernel is constructed with: they are its
    build identity.
    """

    devices = frozenset({"cpu", "meta", "cuda"})
    general = True
    build_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def entry_for(cls, call: CallSpec) -> tuple[Hashable, Build]:
        identity = tuple(getattr(call, name) for name in cls.build_fields)
        return identity, lambda: cls(*identity)


# -- sample cases (conformance checks of backends' kernels) ----------------------------------


def sample_case(params: Mapping[str, Any], *shapes: tuple[int, ...] | None, note: str = "") -> Case:
    """A `Case` of seeded float32 CPU inputs of `shapes` (None: an absent optional input)."""
    generator = torch.Generator().manual_seed(0)
    inputs = tuple(None if s is None else torch.randn(s, generator=generator) for s in shapes)
    return Case(dict(params), inputs, note)


def fits(t: Any, shape: tuple, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a kernel's output `t` keeps a several-output interface's layout contract."""
    return (
        isinstance(t, torch.Tensor)
        and tuple(t.shape) == tuple(shape)
        and t.dtype == dtype
        and t.device == device
        and t.is_contiguous()
    )


def describe(t: Any) -> str:
    """What a kernel returned, for the error that says its output is wrong."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    return f"a {layout} {dtype_name(t.dtype)} tensor of shape {list(t.shape)} on {t.device}"


class GradOpBackward(Kernel, BackwardInterface):
    """An op's reference backward that computes its gradients with another op of the catalogue,
    `grad_op`, built with the forward's params: that op's kernels are chosen by its own call's
    shapes (a backward call holds none). Traced (AOTAutograd, symbolic shapes) it is one node of
    its operator; eagerly it dispatches by shape; under create_graph its own autograd
    differentiates it, so the gradients are differentiable."""

    devices = frozenset({"cpu", "meta", "cuda"})
    general = True
    differentiable = True
    grad_op: ClassVar[type]

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        # the ops it builds select under the registrations of now: a generation's own entry
        identity = (call.params, call.needs, REGISTRY.generation)
        return identity, lambda: cls(dict(call.params), call.needs)

    def __init__(self, params: dict[str, Any], needs: tuple[bool, ...]) -> None:
        self.op = self.grad_op(**params)
        self.needs = needs

    def run_grad_op(self, tensors: tuple) -> Any:
        return library.call_traced_or_eager(self.op, tensors)

    def wanted(self, found: tuple) -> tuple:
        """`found`, one per input, with None where no gradient was asked for."""
        return tuple(g if need else None for g, need in zip(found, self.needs, strict=True))
