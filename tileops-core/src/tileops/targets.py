"""An op's target half: settling a target on the first call, then running the kernels the
target's builder builds (one per device, per-input presence, dtype and shape, kept on the op),
with the target contract's checks of what they return (docs/backends.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .errors import (
    AmbiguousTargetError,
    BackendError,
    OpNotAvailableError,
    UnknownTargetError,
    add_note,
)
from .plugins import LOADER, failure_note
from .registry import BUILTIN, REGISTRY
from .signature import BoundCall, TensorSpec
from .table import HIT_LIMIT, remember

if TYPE_CHECKING:
    from .op import Op


def result_of(outputs: dict[str, torch.Tensor]) -> Any:
    """What the op returns for `outputs`: the tensor, or a tuple of several."""
    values = tuple(outputs.values())
    return values[0] if len(values) == 1 else values


def choose_target(op: Op, device: torch.device) -> str:
    """The target `op` settles on for its first call on `device`: its own `target=`, else the
    process default, else the one detector that claims the device, else BUILTIN."""
    LOADER.ensure_loaded()  # settles backends imported directly since (see plugins.py)
    name = op.target or REGISTRY.default_target
    if name == BUILTIN:
        return BUILTIN
    if name is not None:
        known = REGISTRY.targets()
        if name not in known:
            raise UnknownTargetError(
                f"{type(op).op_name}: unknown target {name!r}; known targets: "
                f"{', '.join(known) or 'none'} (and {BUILTIN!r} for the op's own kernels). "
                f"{failure_note()}".rstrip(),
                op=type(op).op_name,
                target=name,
            )
        return name
    claims = [d for t, d in sorted(REGISTRY.detectors.items()) if d.claims(device)]
    if len(claims) > 1:
        raise AmbiguousTargetError(
            f"{type(op).op_name}: several targets claim {device}: "
            + ", ".join(f"{d.target!r} ({d.source})" for d in claims)
            + "; pass target= to the op or call tileops.backend.set_default_target()",
            op=type(op).op_name,
        )
    return claims[0].target if claims else BUILTIN


def run_target(op: Op, target: str, call: BoundCall) -> Any:
    """Run `call` through the kernel `target`'s builder builds for it (built once per key)."""
    name = type(op).op_name
    builder = REGISTRY.builder(type(op), target)
    if builder is None:
        raise _no_builder(op, target, call.device)
    inputs = _inputs(op, call)
    key = (
        target,
        call.device,
        tuple(None if t is None else (t.dtype, t.shape) for t in inputs),
    )
    built = op._target_kernels.get(key)
    if built is None:
        built = _build_kernel(op, builder, key, inputs)
    kernel, passing = built
    outputs = op.signature.make_outputs(call)
    try:
        returned = kernel(*inputs, **outputs) if passing is not RETURNS else kernel(*inputs)
    except Exception as exc:
        add_note(exc, f"raised by the kernel of target {target!r} [{builder.source}] for {name}")
        raise
    if returned is None and passing is NAMED:  # it wrote the buffers it takes by name
        return result_of(outputs)
    where = f"the kernel of target {target!r} [{builder.source}] for {name}"
    fields = {"op": name, "target": target, "source": builder.source}
    named_inputs = dict(zip(op.signature.names, inputs, strict=True))
    return result_of(_returned_outputs(where, fields, returned, outputs, named_inputs, passing))


NAMED, KWARGS, RETURNS = "named", "kwargs", "returns"
"""How a target kernel gets its output buffers: by name (a None it returns means it wrote
them), through **kwargs (it must return its result), or not at all (it takes only the inputs,
as upstream TileOPs' kernels do, and returns its result)."""


_HOW_TAKEN = {
    KWARGS: "only through **kwargs (or has a signature Python cannot read)",
    RETURNS: "not at all (it is called with the inputs alone)",
}


def _build_kernel(
    op: Op, builder: Any, key: tuple, inputs: tuple[torch.Tensor | None, ...]
) -> tuple[Callable[..., Any], str]:
    """The kernel built for `key`, and how it takes its output buffers (`output_passing`)."""
    with op._target_lock:
        built = op._target_kernels.get(key)
        if built is None:
            specs = [None if t is None else TensorSpec.of(t) for t in inputs]
            try:
                kernel = builder.build_kernel(*specs, **op.params())
            except Exception as exc:
                note = f"raised by build_kernel of target {builder.target!r} [{builder.source}]"
                add_note(exc, f"{note} for {builder.op.op_name} on {specs}")
                raise
            names = [out.name for out in op.signature.outputs]
            built = kernel, output_passing(kernel, names)
            remember(op._target_kernels, key, built, HIT_LIMIT)
        return built


def _inputs(op: Op, call: BoundCall) -> tuple[torch.Tensor | None, ...]:
    """Inputs as a target sees them: those the op does not write made contiguous (written
    ones that must be contiguous were checked by the signature)."""
    return tuple(
        t if t is None or spec.written else t.contiguous()
        for spec, t in zip(op.signature.inputs, call.tensors, strict=True)
    )


def output_passing(kernel: Callable[..., Any], names: list[str]) -> str:
    """How `kernel` takes the output buffers `names`: NAMED when it takes each by its name
    (only then is a None it returns taken to mean it wrote them), KWARGS when it takes keyword
    arguments it does not name (it may never look at them, and a buffer it did not write is
    uninitialised memory nothing after the call can detect, so it must return its result),
    RETURNS when it takes none of them (it is called with the inputs alone). An unreadable
    signature is taken as KWARGS: it gets the buffers, and must return its result."""
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return KWARGS
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if all(n in parameters and parameters[n].kind in by_name for n in names):
        return NAMED
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return KWARGS
    return RETURNS


def _returned_outputs(
    where: str,
    fields: dict[str, Any],
    returned: Any,
    buffers: dict[str, torch.Tensor],
    inputs: dict[str, Any],
    passing: str = "kwargs",
) -> dict[str, torch.Tensor]:
    """The outputs a target kernel returned, in place of the buffers it was handed: a tensor
    (a tuple of them, in signature order, for several outputs), each of its buffer's shape,
    dtype and device, contiguous, and sharing no memory with an input. `where` names the
    kernel in messages, `fields` in the errors' fields."""
    names = list(buffers)
    if returned is None:
        raise BackendError(
            f"{where} returned None, but takes its output buffers ({', '.join(names)}) "
            f"{_HOW_TAKEN[passing]}, so nothing says it wrote them: return the result, or name "
            f"{', '.join(names)} as parameters of the kernel "
            "(`def kernel(x, *, out)`) and write them in place",
            **fields,
        )
    results = (returned,) if len(names) == 1 else returned
    if not (
        isinstance(results, tuple)
        and len(results) == len(names)
        and all(isinstance(r, torch.Tensor) for r in results)
    ):
        expected = "a tensor" if len(names) == 1 else f"a tuple of {len(names)} tensors"
        raise BackendError(
            f"{where} returned {_shown(returned)}; expected None (having written "
            f"{', '.join(names)} in place) or {expected} ({', '.join(names)})",
            **fields,
        )
    for name, result in zip(names, results, strict=True):
        if result is not buffers[name]:
            _check_returned(where, fields, name, (result, buffers[name]), inputs)
    return dict(zip(names, results, strict=True))


def _check_returned(
    where: str,
    fields: dict[str, Any],
    name: str,
    returned: tuple[torch.Tensor, torch.Tensor],
    inputs: dict[str, Any],
) -> None:
    """Raise unless output `name`, `returned` as (result, the buffer it replaces), is shaped
    like its buffer and shares no memory with an input."""
    result, buffer = returned
    if not (
        result.shape == buffer.shape
        and result.dtype == buffer.dtype
        and result.device == buffer.device
        and result.is_contiguous()
    ):
        got = describe(result.is_contiguous(), result.dtype, result.shape, result.device)
        expected = describe(True, buffer.dtype, buffer.shape, buffer.device)
        raise BackendError(
            f"{where} returned for output {name!r} {got}, but the op's signature expects "
            f"{expected} (the buffer it was handed)",
            **fields,
        )
    storage = _storage(result)
    shared = [n for n, t in inputs.items() if t is not None and _storage(t) == storage]
    if storage and shared:
        raise BackendError(
            f"{where} returned for output {name!r} a tensor sharing memory with its input "
            f"{shared[0]!r}; return a new tensor, or write the output buffer it was handed",
            **fields,
        )


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def describe(contiguous: bool, dtype: torch.dtype, shape: Any, device: torch.device) -> str:
    layout = "contiguous" if contiguous else "non-contiguous"
    return (
        f"a {layout} {str(dtype).replace('torch.', '')} tensor of shape {list(shape)} on {device}"
    )


def _no_builder(op: Op, target: str, device: torch.device) -> OpNotAvailableError:
    """The error of a call settled on a target that cannot build the op: who owns the target,
    why the op settled there, and the two ways out."""
    name = type(op).op_name
    default, detector = REGISTRY.default, REGISTRY.detectors.get(target)
    if op.target == target:
        why = f"the op was constructed with target={target!r}"
    elif default is not None and default.target == target:
        why = f"it is the process default, set by {default.source}"
    elif detector is not None:
        why = f"its detector claims {device}"
    else:
        why = "the op settled on it on an earlier call, and keeps it"
    owners = [str(detector.source)] if detector else []
    owners += [str(b.source) for b in REGISTRY.builders() if b.target == target]
    owner = f" ({owners[0]})" if owners else ""
    return OpNotAvailableError(
        f"{name} settled on target {target!r}{owner}, which registered no kernel builder for "
        f"{name}: {why}. There is no fall-back to other kernels: construct the op with "
        f"target={BUILTIN!r} (its own kernels) or another target, or change the process default "
        f"with tileops.backend.set_default_target(...) (BUILTIN, or a target that builds {name})."
        f" {failure_note()}".rstrip(),
        op=name,
        target=target,
        source=owners[0] if owners else None,
    )
