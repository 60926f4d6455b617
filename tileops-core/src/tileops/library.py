"""Each op as a `torch.library` operator, so PyTorch's stack sees one opaque node per call.

`torch.compile` and `torch.export` trace the op as `tileops::<Name>` (schema from the op's
signature, a fake implementation from its output rules), whatever kernel serves it: a TileLang
or Triton launch, a C extension, numpy. One exception (`traced_call`): where torch's own kernel
would serve a call eagerly, torch.compile traces torch's function instead, as the compiler would
without tileops. Autograd and autocast hang on the same operator:
gradients come from the op's backward interface, and under autocast the op casts as its torch
counterpart does. Eager calls skip all of this: the dispatcher directly (op.py), and under
autograd or autocast the same casts and backward without the operator (eager.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .backward import is_traced, run_backward
from .eager import (
    AUTOCAST_KEYS,
    cast_for_autocast,
    gradients,
    note_casts,
    refuse_gradients_it_lacks,
    remember_for_backward,
    takes_native_lane,
)
from .errors import OpDefinitionError, OpInputError, TileOpsError
from .op import Op
from .registry import BUILTIN, REGISTRY
from .scope import SCOPES
from .table import ENTRY_LIMIT, remember

_is_compiling = torch.compiler.is_compiling
_LIBRARIES: dict[str, torch.library.Library] = {}
_OPERATORS: dict[type, Any] = {}
_BACKWARD_OPERATORS: dict[type, Any] = {}
_INSTANCES: dict[tuple, Op] = {}
_lock = threading.RLock()


def operator(op_cls: type[Op]) -> Any:
    """The `torch.ops` overload packet of `op_cls`, defined on first need (also when that need
    comes while torch.compile traces: see `_defined`)."""
    if torch.compiler.is_compiling():
        _defined(op_cls)
    return _OPERATORS.get(op_cls) or _defined_operator(op_cls)


def _defined(op_cls: type[Op]) -> bool:
    """Define `op_cls`'s operator now. Dynamo runs this at trace time rather than tracing it
    (`assume_constant_result`), so an op first called, or built, inside a compiled function
    finds its operator defined, and Dynamo never meets the lock."""
    return _defined_operator(op_cls) is not None


# `torch.compiler.assume_constant_result(_defined)`, without what that call imports: it loads
# torch._dynamo (seconds, and triton) to set this one attribute, and `import tileops` must
# stay cheap. test_torch_integration checks the mark is the one torch's decorator sets.
_defined._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _defined_operator(op_cls: type[Op]) -> Any:
    with _lock:
        found = _OPERATORS.get(op_cls) or _define(op_cls)
        _OPERATORS[op_cls] = found
    return found


def library_name(op_cls: type[Op]) -> tuple[str, str]:
    """(namespace, name) of the operator: `tileops::RMSNormFwdOp` stays as it is; other
    characters a library name cannot hold become underscores."""
    namespace, _, name = op_cls.op_name.partition("::")
    return _identifier(namespace), _identifier(name)


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _define(op_cls: type[Op]) -> Any:
    namespace, name = library_name(op_cls)
    library = _LIBRARIES.get(namespace)
    if library is None:
        library = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library.define(f"{name}{schema_of(op_cls)}")
    qualname = f"{namespace}::{name}"
    library.impl(name, _eager_impl(op_cls), "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, _fake_impl(op_cls), lib=library)
    if any(spec.written for spec in op_cls.signature.inputs):
        # register_autograd takes functional operators only: wrap an autograd.Function.
        library.impl(name, _mutating_autograd(op_cls), "Autograd")
    else:
        torch.library.register_autograd(
            qualname, _backward(op_cls), setup_context=_setup_context(op_cls), lib=library
        )
    for device_type, key in AUTOCAST_KEYS.items():
        library.impl(name, _autocast_impl(op_cls, device_type), key)
    # With the forward: a compiled backward loaded from the compiler's cache calls it untraced.
    _BACKWARD_OPERATORS[op_cls] = _define_backward(op_cls, library)
    return getattr(getattr(torch.ops, namespace), name)


def schema_of(op_cls: type[Op]) -> str:
    """`(Tensor x, Tensor? weight, int[] normalized_shape, float? eps, str? target) -> Tensor`
    from the signature; inputs the op writes are marked mutable."""
    signature = op_cls.signature
    if signature.param_types is None:
        raise OpDefinitionError(
            f"{op_cls.op_name}: its signature names params without types, so it cannot become a "
            "torch.library operator (torch.compile, torch.export, autograd); give Signature "
            "its params as a dict of schema types, e.g. {'eps': 'float'}"
        )
    inputs = []
    for index, spec in enumerate(signature.inputs):
        alias = f"({chr(ord('a') + index)}!)" if spec.written else ""
        inputs.append(f"Tensor{alias}{'?' if spec.optional else ''} {spec.name}")
    params = [f"{kind} {name}" for name, kind in signature.param_types.items()]
    outputs = ", ".join("Tensor" for _ in signature.outputs)
    returns = outputs if len(signature.outputs) == 1 else f"({outputs})"
    return f"({', '.join([*inputs, *params, 'str? target=None'])}) -> {returns}"


def call_operator(op: Op, tensors: Sequence[torch.Tensor | None]) -> Any:
    """Call `op` through its operator: what tracing, autograd and autocast see."""
    params = op.params()
    return operator(type(op))(*tensors, *params.values(), op.target)


def call_traced(op: Op, tensors: Sequence[torch.Tensor | None]) -> Any:
    """What `Op.__call__` does under torch.compile and torch.export (see `traced_call`)."""
    target = "builtin" if op.target is BUILTIN else op.target  # a str Dynamo 2.11 can proxy
    return traced_call(type(op), tuple(tensors), tuple(op.params().values()), target)


Op._through_operator = call_traced


def traced_call(op_cls: type[Op], tensors: tuple, params: tuple, target: str | None = None) -> Any:
    """A call of `op_cls(*params)` as tracing takes it: under torch.compile, torch's own
    function (`Op.native_function`) where the eager call would run it, a `torch_native` kernel
    serving it (`Op.native_lane_for`), so the compiler sees, fuses and differentiates torch's
    ops as in a model without tileops; else, and under torch.export, the operator."""
    if _is_compiling() and _traced_natively(op_cls, tensors, params, target):
        return op_cls.native_function(*tensors, *params)
    return operator(op_cls)(*tensors, *params, target)


def _traced_natively(op_cls: type[Op], tensors: tuple, params: tuple, target: str | None) -> bool:
    """Decided once per traced call from constant facts; calls the decision cannot hold for
    (a target, autocast, sizes that vary) take the operator. Reading `SCOPES.active` makes
    Dynamo guard on it: a pin, record or simulation begun later retraces to the operator."""
    if op_cls.native_function is None or target is not None or SCOPES.active:
        return False
    static = torch.fx.experimental.symbolic_shapes.has_static_value
    facts = []
    for t in tensors:
        if t is None:
            facts.append(None)
            continue
        if torch.is_autocast_enabled(t.device.type):
            return False
        if not all(static(s) for s in (*t.shape, *t.stride())):
            return False
        facts.append((tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.requires_grad))
    return _serves_natively(op_cls, params, tuple(facts), torch.is_grad_enabled())


def _serves_natively(op_cls: type[Op], params: tuple, facts: tuple, grad_enabled: bool) -> bool:
    """Whether the eager call described by `facts` runs the op's native lane. Dynamo runs
    this at trace time (`assume_constant_result`, marked below), on fake tensors of `facts`;
    a call the op refuses takes the operator, which raises its error."""
    if exporting():
        return False
    op = instance(op_cls, dict(zip(op_cls.signature.param_types, params, strict=True)), None)
    with FakeTensorMode():
        fakes = tuple(None if f is None else _fake(*f) for f in facts)
    try:  # outside the mode: a kernel built on the way sees real tensors, fakes stay fake
        return takes_native_lane(op, fakes, grad_enabled)
    except TileOpsError:
        return False


_serves_natively._dynamo_marked_constant = True  # type: ignore[attr-defined]


def exporting() -> bool:
    """Whether torch.export is tracing, read at trace time (`assume_constant_result`, marked
    below): traced, torch 2.11's Dynamo answers `is_exporting()` as `is_compiling()`."""
    return torch.compiler.is_exporting()


exporting._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _fake(
    shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device, grad: bool
) -> torch.Tensor:
    t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return t.requires_grad_() if grad else t


def call_traced_or_eager(op: Op, tensors: Sequence[torch.Tensor | None]) -> Any:
    """Call `op` from inside another op's kernel (a backward's GEMMs): through its operator
    while traced (one node; fake tensors no kernel can read), else eagerly, as one autograd
    node where an input needs a gradient (create_graph)."""
    if is_traced(tensors):
        return call_operator(op, tensors)
    return op.call_eager_autograd(tuple(tensors))


def instance(op_cls: type[Op], params: dict[str, Any], target: str | None) -> Op:
    """One op instance per (class, params, target) and registry generation, shared by every
    operator call: like any op instance, it sees the registrations made before it."""
    key = (op_cls, _hashable(tuple(params.values())), target, REGISTRY.generation)
    found = _INSTANCES.get(key)
    if found is None:
        found = op_cls(**params, target=target)
        remember(_INSTANCES, key, found, ENTRY_LIMIT)
    return found


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _split(op_cls: type[Op], args: tuple) -> tuple[tuple, dict[str, Any], str | None]:
    count = len(op_cls.signature.inputs)
    names = list(op_cls.signature.param_types)
    end = count + len(names)
    params = dict(zip(names, args[count:end], strict=True))
    target = args[end] if len(args) > end else None  # the dispatcher drops a default target
    return args[:count], params, target


def _eager_impl(op_cls: type[Op]) -> Any:
    """The operator's kernel, run as torch runs a `torch.library.custom_op`'s: below the
    ADInplaceOrView key, so a kernel's output that views a buffer of its own is no view to
    autograd (a caller may modify it in place), and with the version of each tensor the op
    writes bumped once (what autograd checks saved tensors against). Which it writes is the
    instance's signature's say (BatchNorm's inference op writes nothing)."""

    def impl(*args: Any) -> Any:
        tensors, params, target = _split(op_cls, args)
        op = instance(op_cls, params, target)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            out = op.call_eager(tensors)
        for spec, t in zip(op.signature.inputs, tensors, strict=True):
            if spec.written and t is not None:
                torch.autograd.graph.increment_version(t)
        return out

    return impl


def _fake_impl(op_cls: type[Op]) -> Any:
    def fake(*args: Any) -> Any:
        tensors, params, target = _split(op_cls, args)
        outputs = instance(op_cls, params, target).outputs_for(tensors)  # GemmOp's: its layout
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return fake


def _setup_context(op_cls: type[Op]) -> Any:
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        tensors, params, target = _split(op_cls, inputs)
        op = instance(op_cls, params, target)
        refuse_gradients_it_lacks(op, tensors)
        remember_for_backward(ctx, op, tensors, output if isinstance(output, tuple) else (output,))
        ctx.params, ctx.target = params, target

    return setup_context


def _backward(op_cls: type[Op]) -> Any:
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        needs = tuple(ctx.needs_input_grad[: len(op_cls.signature.inputs)])
        tensor_grads = gradients(ctx, instance(op_cls, ctx.params, ctx.target), grads, needs)
        return (*tensor_grads, *[None] * (len(ctx.params) + 1))

    return backward


def backward_operator(
    op: Op, grads: tuple, inputs: tuple, outputs: tuple, needs: tuple[bool, ...]
) -> list[torch.Tensor]:
    """The gradients `needs` asks for, through `tileops::<Name>_backward`: one opaque node in
    a traced graph (its fake gives contiguous gradients shaped like the inputs), which selects
    the backward kernel on the real tensors when the graph runs."""
    op_cls = type(op)
    operator(op_cls)  # defines the backward operator with it
    params = op.params().values()
    packet = _BACKWARD_OPERATORS[op_cls]
    return packet(list(grads), list(inputs), list(outputs), list(needs), *params, op.target)


Op._backward_through_operator = backward_operator  # the route a traced backward takes


def _define_backward(op_cls: type[Op], library: torch.library.Library) -> Any:
    """`tileops::<Name>_backward`: what `backward_operator` calls."""
    namespace, name = library_name(op_cls)
    params = [f"{kind} {p}" for p, kind in op_cls.signature.param_types.items()]
    tensors = "Tensor[] grads, Tensor?[] inputs, Tensor?[] outputs, bool[] needs"
    library.define(
        f"{name}_backward({', '.join([tensors, *params, 'str? target=None'])}) -> Tensor[]"
    )
    library.impl(f"{name}_backward", _backward_impl(op_cls), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{namespace}::{name}_backward", _backward_fake, lib=library)
    return getattr(getattr(torch.ops, namespace), f"{name}_backward")


def _backward_impl(op_cls: type[Op]) -> Any:
    def impl(grads: list, inputs: list, outputs: list, needs: list, *args: Any) -> list:
        names = list(op_cls.signature.param_types)
        params = dict(zip(names, args[: len(names)], strict=True))
        target = args[len(names)] if len(args) > len(names) else None
        op = instance(op_cls, params, target)
        found = run_backward(op, tuple(grads), tuple(inputs), tuple(outputs), tuple(needs), False)
        held = {t.data_ptr() for t in (*grads, *inputs, *outputs) if t is not None}
        return [_fresh(g, held) for g, need in zip(found, needs, strict=True) if need]

    return impl


def _fresh(grad: torch.Tensor, held: set[int]) -> torch.Tensor:
    """`grad` contiguous and in memory of its own: an operator's outputs alias no input."""
    grad = grad.contiguous()
    return grad.clone() if grad.data_ptr() in held else grad


def _backward_fake(grads: list, inputs: list, outputs: list, needs: list, *args: Any) -> list:
    return [t.new_empty(t.shape) for t, need in zip(inputs, needs, strict=True) if need]


def _mutating_autograd(op_cls: type[Op]) -> Any:
    def autograd(*args: Any) -> Any:
        tensors, params, target = _split(op_cls, args)
        if torch.is_grad_enabled():
            refuse_gradients_it_lacks(instance(op_cls, params, target), tensors)
        return _MutatingOp.apply(op_cls, params, target, *tensors)

    return autograd


class _MutatingOp(torch.autograd.Function):
    """Autograd for an operator that writes some inputs (BatchNorm's running stats), which
    `register_autograd` does not take."""

    @staticmethod
    def forward(ctx: Any, op_cls: type[Op], params: dict, target: str | None, *tensors: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            out = operator(op_cls)(*tensors, *params.values(), target)
        op = instance(op_cls, params, target)  # its signature: BatchNorm's follows training
        remember_for_backward(ctx, op, tensors, out if isinstance(out, tuple) else (out,))
        ctx.op_cls, ctx.params, ctx.target = op_cls, params, target
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        op = instance(ctx.op_cls, ctx.params, ctx.target)
        return (None, None, None, *gradients(ctx, op, grads, tuple(ctx.needs_input_grad[3:])))


def _autocast_impl(op_cls: type[Op], device_type: str) -> Any:
    """Cast as the op's torch counterpart is cast under autocast, then run without autocast.
    `Op.__call__` ran the op's checks before (`Op.check_uncast`): the probe sees calls they
    accept, and the checks after the cast judge only what the cast changed."""

    def autocast(*args: Any) -> Any:
        given, params, target = _split(op_cls, args)
        specs = op_cls.signature.inputs
        tensors = given
        dtype = instance(op_cls, params, target).autocast_dtype(device_type, given)
        if dtype is not None:
            pairs = zip(given, specs, strict=True)
            tensors = tuple(cast_for_autocast(t, dtype, spec) for t, spec in pairs)
        try:
            with torch.autocast(device_type, enabled=False):
                return operator(op_cls)(*tensors, *params.values(), target)
        except OpInputError as exc:  # a dtype agreement the cast did not settle
            note_casts(exc, device_type, specs, given, tensors)
            raise

    return autocast
