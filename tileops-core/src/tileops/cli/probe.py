"""The call an op makes for given inputs, found by asking the op itself.

`explain --shape`, `warmup` and `demo` name inputs by the first input's shape and a dtype. The
op's other inputs follow from its signature (a norm's weight and bias from the normalized dims,
BatchNorm's per-channel tensors from dim 1); GemmOp alone takes `M,N,K`. Which interface and
call spec those inputs lead to is the op's business: its `forward` runs on meta tensors until
it asks for a kernel, and the request is captured there. So the CLI never restates an op's
call-spec logic, and third-party ops work the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..callspec import CallSpec
from ..op import Op
from ..signature import BATCH, dtype_name

Shape = tuple[int, ...]

SHAPE_CONVENTIONS: dict[str, tuple[str, ...]] = {"tileops::GemmOp": ("m", "n", "k")}
"""Ops whose `--shape` is not their first input's shape: op name -> the sizes it gives, by the
names of the signature's dims (each input's shape follows from the op's own patterns, so
GemmOp's `trans_a` / `trans_b` lay them out)."""


@dataclass(frozen=True)
class Request:
    """What one op call asks the dispatcher for: the interface and the call spec."""

    op: Op
    inputs: tuple[torch.Tensor | None, ...]
    interface: str
    call: CallSpec

    def describe(self) -> str:
        names = self.op.signature.names
        shown = [
            f"{name} {list(t.shape)}"
            for name, t in zip(names, self.inputs, strict=True)
            if t is not None
        ]
        return f"{type(self.op).__name__}({_params(self.op)}) on {', '.join(shown)}"


class _Asked(Exception):
    """Raised by the stand-in for `kernel_for` to stop `forward` at its kernel request."""


MAX_SIZE = 2**63 - 1
"""The most elements a tensor (and so each size) can have: torch counts them in an int64."""


class ShapeError(ValueError):
    """A shape given on the command line cannot make the op's inputs; the command that read it
    names its flag (`--shape`, `--shapes`) in front of the message."""


def parse_shape(text: str) -> Shape:
    """`8,4096` or `8x4096` -> (8, 4096)."""
    parts = [p for p in re.split(r"[x,\s]+", text.strip()) if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ShapeError(f"a shape is integers separated by ',' or 'x', got {text!r}") from None
    if not shape or any(d < 0 for d in shape):
        raise ShapeError(f"a shape is one or more sizes >= 0, got {text!r}")
    too_big = [d for d in shape if d > MAX_SIZE]
    if too_big:
        raise ShapeError(f"a size is at most {MAX_SIZE}, got {too_big[0]}")
    return shape


def field_types(call_cls: type[CallSpec]) -> dict[str, Any]:
    """A call spec's fields (device excluded) -> their annotations, resolved."""
    namespace = vars(sys.modules[call_cls.__module__]) | vars(typing)
    hints = typing.get_type_hints(call_cls, namespace)
    return {f.name: hints[f.name] for f in dataclasses.fields(call_cls) if f.name != "device"}


def parse_dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{text!r} is not a torch dtype (e.g. float16, bfloat16, float32)")
    return dtype


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """`NAME=VALUE` constructor arguments; values are Python literals, else strings."""
    params = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"expected --param NAME=VALUE, got {item!r}")
        try:
            params[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            params[name] = text
    return params


def make_op(
    op_cls: type[Op], shape: Shape, params: Mapping[str, Any], target: str | None = None
) -> Op:
    """An instance of `op_cls` for inputs whose first has `shape`: the params the shape implies
    (normalized_shape, num_features), then those given."""
    if op_cls.signature is None:
        raise ValueError(f"{op_cls.op_name} has no signature; use the FIELD=VALUE form")
    implied = {} if op_cls.op_name in SHAPE_CONVENTIONS else _implied_params(op_cls, shape)
    return op_cls(**{**implied, **params}, target=target)


def make_inputs(
    op: Op, shape: Shape, dtype: torch.dtype, device: torch.device, omit: Sequence[str] = ()
) -> tuple[torch.Tensor | None, ...]:
    """Random inputs of the op's signature on `device` (meta: no memory), the first of
    `shape`; optional inputs whose shape the signature leaves open, or in `omit`, are None.
    Any dtype is made, so that the op's own signature judges it (an int32 norm, say)."""
    shapes = _input_shapes(op, shape, set(omit))
    made = []
    for spec, dims in zip(op.signature.inputs, shapes, strict=True):
        if dims is not None and math.prod(dims) > MAX_SIZE:
            raise ShapeError(
                f"input {spec.name!r} of shape {list(dims)} would hold more elements than a "
                f"tensor can ({MAX_SIZE})"
            )
        made.append(None if dims is None else _random(dims, dtype, device, "var" in spec.name))
    return tuple(made)


def _random(dims: Shape, dtype: torch.dtype, device: torch.device, positive: bool) -> torch.Tensor:
    """Random values of `dtype` (positive ones for variances); dtypes randn lacks (integers,
    float8) are cast from float32."""
    try:
        if (dtype.is_floating_point and dtype.itemsize > 1) or dtype.is_complex:
            t = torch.randn(dims, dtype=dtype, device=device)
            return t.abs() + 0.5 if positive else t
        t = torch.randn(dims, device=device)
        return (t.abs() + 0.5 if positive else t).to(dtype)
    except (RuntimeError, TypeError) as exc:  # torch's message is a paragraph: its first sentence
        first = (str(exc).splitlines() or [type(exc).__name__])[0].split(". ")[0]
        raise ValueError(f"cannot make {dtype_name(dtype)} inputs on {device}: {first}") from None


def request(op: Op, inputs: tuple[torch.Tensor | None, ...], device: torch.device) -> Request:
    """The interface and call spec `op` asks for on `inputs`, as if they were on `device`."""
    signature = op.signature
    bound = signature.bind(type(op).op_name, inputs, {}, signature.plan(op.params()))
    op.check(bound)  # the op's own input checks: explain reports what a call would raise
    interface, call = capture(op, inputs)
    if call.device != device:
        call = dataclasses.replace(call, device=device)
    return Request(op, inputs, interface, call)


def capture(op: Op, inputs: tuple[torch.Tensor | None, ...]) -> tuple[str, CallSpec]:
    """Run `op.forward(*inputs)` up to its first kernel request and return that request."""

    def ask(interface: str, call: CallSpec, *rest: Any) -> None:
        raise _Asked(interface, call)

    op.kernel_for = op.call_kernel = ask  # instance attributes: the class is untouched
    try:
        op.forward(*inputs)
    except _Asked as asked:
        return asked.args
    finally:
        del op.kernel_for, op.call_kernel
    raise ValueError(
        f"{type(op).op_name} returned without asking for a kernel on these inputs (an empty "
        "input needs none): nothing to explain"
    )


def _implied_params(op_cls: type[Op], shape: Shape) -> dict[str, Any]:
    """Params named in the first input's shape pattern, read off `shape`: a `*param` at the end
    covers the last dim; a dim named like a param is that param."""
    params = set(op_cls.signature.params)
    pattern = op_cls.signature.inputs[0].shape
    at = pattern.index(BATCH) if BATCH in pattern else len(pattern)
    head, tail = pattern[:at], pattern[at + 1 :]
    implied: dict[str, Any] = {}
    positions = [*enumerate(head), *((len(shape) - len(tail) + i, d) for i, d in enumerate(tail))]
    for index, dim in positions:
        if not isinstance(dim, str) or not 0 <= index < len(shape):
            continue
        if dim.startswith("*") and dim[1:] in params:
            implied[dim[1:]] = (shape[index],)
        elif dim in params:
            implied[dim] = shape[index]
    return implied


def _input_shapes(op: Op, shape: Shape, omit: set[str]) -> list[Shape | None]:
    """Each input's shape: the convention's, else what the signature's patterns bind, an input
    with a `...` taking the dims the first input's `...` covers (add + RMSNorm's residual)."""
    specs = op.signature.inputs
    unknown = omit - {s.name for s in specs if s.optional}
    if unknown:
        optional = ", ".join(s.name for s in specs if s.optional) or "none"
        raise ValueError(f"--omit takes optional inputs of {type(op).op_name} ({optional})")
    plan = op.signature.plan(op.params())
    sizes = dict(plan.sizes)
    convention = SHAPE_CONVENTIONS.get(type(op).op_name)
    shapes: list[Shape | None] = []
    batch: Shape = ()
    if convention is None:
        plan.patterns[0].match(shape, sizes)  # binds the names; a mismatch is reported by bind()
        shapes.append(shape)
        first = plan.patterns[0]
        if first.batch:  # the dims the first input's `...` covers: others with one share them
            batch = shape[len(first.head) : len(shape) - len(first.tail)]
    elif len(shape) != len(convention):
        given = ",".join(name.upper() for name in convention)
        raise ShapeError(f"{type(op).op_name} takes {given}, got {list(shape)}")
    else:
        sizes.update(zip(convention, shape, strict=True))
    names = [s.name for s in specs]
    for spec, pattern in zip(specs[len(shapes) :], plan.patterns[len(shapes) :], strict=True):
        if spec.like is not None and spec.name not in omit:  # same shape as an earlier input
            shapes.append(shapes[names.index(spec.like)])
            continue
        dims = [sizes.get(d, d) if isinstance(d, str) else d for d in pattern.head]
        dims += [*(batch if pattern.batch else ())]
        dims += [sizes.get(d, d) if isinstance(d, str) else d for d in pattern.tail]
        resolved = all(isinstance(d, int) for d in dims)
        if spec.name in omit or (spec.optional and not resolved):
            shapes.append(None)
        elif resolved:
            shapes.append(tuple(dims))
        else:
            raise ShapeError(f"cannot tell the shape of {spec.name!r} from {list(shape)}")
    return shapes


def _params(op: Op) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in op.params().items())
