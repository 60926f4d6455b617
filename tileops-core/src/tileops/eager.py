"""Autograd and autocast for eager calls, without the trip through the torch.library operator.

Outside tracing, an op call that needs a gradient or runs under autocast does here what its
operator (library.py) would do: cast as the op's torch counterpart is cast, run the op with
autocast off, and record one autograd node whose backward is the op's "backward" interface.
The operator costs four dispatcher hops, each re-parsing the call in Python, on every call: in
a host-bound model (training, or inference at small batches) that cost was the whole gap to
eager torch. Tracing (torch.compile, torch.export) still takes the operator: one opaque node.

The helpers both routes share (which inputs may need a gradient, what a backward keeps of a
call and how it runs, the casts) live here; library.py imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .autocast import castable
from .backward import backward_of, run_keeping_state
from .errors import OpInputError, add_note
from .op import Op
from .scope import SCOPE, SCOPES
from .signature import dtype_name

if TYPE_CHECKING:
    from .signature import BoundCall, Input

_is_autocast_enabled = torch.is_autocast_enabled
_set_autocast_enabled = torch.set_autocast_enabled
_functorch_active = torch._C._are_functorch_transforms_active
AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
"""The device types autocast casts ops for, and their dispatch keys (the operator's)."""


def refuse_gradients_it_lacks(op: Op, tensors: tuple) -> None:
    """Under autograd, inputs the op has no gradient for (written ones, running stats) must not
    require grad: torch's ops refuse them at the call, and a backward could not serve them."""
    for k in op.signature.gradless_at:
        t, spec = tensors[k], op.signature.inputs[k]
        if t is not None and t.requires_grad:
            raise OpInputError(
                f"{type(op).op_name}(): argument {spec.name!r} requires grad, but the op has no "
                f"gradient for it{' (it writes it in place)' if spec.written else ''}; pass it "
                "with requires_grad=False (detach it)"
            )


def remember_for_backward(ctx: Any, op: Op, tensors: tuple, outputs: tuple) -> None:
    """What a backward needs of one call, for both routes: the inputs (None for those the op
    writes: they change during the forward), the scope the call ran in, the outputs kept where
    the op says so; outputs without a gradient (attention's log-sum-exp) marked so."""
    signature = op.signature
    if signature.frozen_at:
        ctx.mark_non_differentiable(*(outputs[k] for k in signature.frozen_at))
    if signature.written_at:
        tensors = tuple(None if k in signature.written_at else t for k, t in enumerate(tensors))
    ctx.save_for_backward(*tensors)
    ctx.scope = SCOPE.get()
    ctx.state = ()
    if type(op).saves_outputs:
        _keep_outputs(ctx, outputs)


def gradients(ctx: Any, op: Op, grads: tuple, needs: tuple[bool, ...]) -> Any:
    """The gradients `needs` asks for, from the op's backward interface, in the scope its
    forward ran in (pins and records reach it; autograd may run it on a thread of its own)."""
    args = op, grads, tuple(ctx.saved_tensors), needs, _kept_outputs(ctx), ctx.state
    if ctx.scope is None:  # no pin, record or simulation around the forward: nothing to resume
        return backward_of(*args)
    with SCOPES.resume(ctx.scope):
        return backward_of(*args)


def _keep_outputs(ctx: Any, outputs: tuple) -> None:
    """Keep the outputs for the backward kernels without claiming them as saved tensors: a
    caller may still modify an output in place (as after any of our ops); the backward then
    finds its version changed and goes without it. Detached aliases share the version
    counter, and hold no graph (no reference cycle through the output's grad_fn)."""
    ctx.kept = tuple(t.detach() for t in outputs)
    ctx.kept_versions = tuple(t._version for t in outputs)


def _kept_outputs(ctx: Any) -> tuple:
    """The outputs kept at the forward, None for one modified in place since."""
    if not hasattr(ctx, "kept"):
        return ()
    pairs = zip(ctx.kept, ctx.kept_versions, strict=True)
    return tuple(t if t._version == v else None for t, v in pairs)


def cast_for_autocast(t: torch.Tensor | None, dtype: torch.dtype, spec: Input) -> Any:
    if t is None or t.dtype == dtype or not castable(t, spec):
        return t
    return t.to(dtype)


def note_casts(exc: Exception, device_type: str, specs: Any, given: tuple, cast: tuple) -> None:
    changed = [
        f"{spec.name!r} from {dtype_name(t.dtype)} to {dtype_name(c.dtype)}"
        for spec, t, c in zip(specs, given, cast, strict=True)
        if t is not None and c is not t
    ]
    if changed:
        add_note(
            exc,
            f"under torch.autocast({device_type!r}) the op cast {', '.join(changed)}, as autocast "
            "casts its torch counterpart's inputs",
        )


# ---- the eager routes ----------------------------------------------------------------------


def autocast_eagerly(op: Op, tensors: tuple, checked: BoundCall | None) -> Any:
    """The call under autocast: inputs cast as the op's torch counterpart's are, then the op
    with autocast off for its device type (kernels that call torch ops get no second cast).
    `checked`: the call as the checks bound it before any cast (None when they wait for it)."""
    device_type = _device_type(tensors)
    if device_type not in AUTOCAST_KEYS or not _is_autocast_enabled(device_type):
        return op.call_eager_autograd(tensors, checked)  # autocast is on for another device
    specs = op.signature.inputs
    dtype = op.autocast_dtype(device_type, tensors)
    cast = tensors
    if dtype is not None:
        cast = tuple(cast_for_autocast(t, dtype, s) for t, s in zip(tensors, specs, strict=True))
    if checked is not None and any(c is not t for c, t in zip(cast, tensors, strict=True)):
        checked = None  # the cast call is bound anew
    _set_autocast_enabled(device_type, False)
    try:
        return op.call_eager_autograd(cast, checked)
    except OpInputError as exc:  # a dtype agreement the cast did not settle
        note_casts(exc, device_type, specs, tensors, cast)
        raise
    finally:
        _set_autocast_enabled(device_type, True)


def _device_type(tensors: tuple) -> str | None:
    return next((t.device.type for t in tensors if isinstance(t, torch.Tensor)), None)


def autograd_eagerly(op: Op, call: BoundCall, checked: bool = False) -> Any:
    """The call as one autograd node, whose backward is the op's "backward" interface; or,
    where the kernel serving the layout is torch's own function (`Op.native_lane_for`), that
    function under torch's autograd. `checked`: the op's checks ran on `call` already."""
    held, hits = call.lane[1], op._hits
    if held is None or held[0] is not hits:  # the layout's first call: checked, then decided
        if op._checks and not checked:
            op.check(call)
            checked = True
        refuse_gradients_it_lacks(op, call.tensors)
        held = _native_lane(op, call, hits)
    if held[1] is not None and not _functorch_active():
        if op._checks and not checked:
            op.check(call)
        out = held[1](*call.tensors)
        if out is not None:
            return out
    refuse_gradients_it_lacks(op, call.tensors)
    if _functorch_active():  # Function.apply's own path (and its error for our Function)
        return _EagerOp.apply(op, call, *call.tensors)
    # Function.apply less its Python wrapper (a third of its host time), which unwraps tensors
    # a finished transform left behind: the dispatcher takes those as they are
    return _apply(op, call, *call.tensors)


_NO_LANE = (None, None)


def takes_native_lane(op: Op, tensors: tuple, grad_enabled: bool) -> bool:
    """Whether the call of `op` on `tensors` (fake ones will do) is torch's own function: its
    layout's native lane serves it, a `torch_native` kernel serving the call. Of an op whose
    autograd specs weigh the backward (`Op.weighs_backward`), only autograd calls: the native
    lane asks of those specs, not of the plain call's."""
    call = op._bind(tensors)
    if type(op._hits) is not dict or call.written_empty or not op.runs_builtin(call.device):
        return False
    if op._checks:
        op.check(call)
    if call.requires_grad and grad_enabled:
        refuse_gradients_it_lacks(op, tensors)
        if not op._table.native_lanes:
            return False
    elif op.weighs_backward:
        return False
    lane = op.native_lane_for(call)
    return lane is not None and lane(*tensors) is not None


def _native_lane(op: Op, call: BoundCall, hits: Any) -> tuple:
    """(hits, the layout's native lane or None), decided before the layout's first call runs,
    so every call of it takes one path (a checkpointed region's recompute saves what its
    forward saved); kept while the op reads its plain cache (no pin, record or simulation)."""
    if type(hits) is not dict or not op.runs_builtin(call.device):
        return _NO_LANE
    native = op._table.native_lanes and not call.written_empty
    held = (hits, op.native_lane_for(call) if native else None)
    call.lane[1] = held
    return held


class _EagerOp(torch.autograd.Function):
    """What the operator's autograd registration does, for one eager call. (A forward taking
    `ctx`: with a separate setup_context, every apply re-reads the forward's signature.)"""

    @staticmethod
    def forward(ctx: Any, op: Op, call: BoundCall, *tensors: torch.Tensor | None) -> Any:
        # below ADInplaceOrView, as an operator's kernel runs: an output that views a buffer of
        # the kernel's own is no view to autograd, so a caller may modify it in place
        with torch._C._AutoDispatchBelowADInplaceOrView():
            if type(op).keeps_state:
                out, state = run_keeping_state(op, lambda: op._execute(call))
            else:
                out, state = op._execute(call), ()
        for k in op.signature.written_at:  # once, as an operator that writes it bumps it
            if tensors[k] is not None:
                torch.autograd.graph.increment_version(tensors[k])
        remember_for_backward(ctx, op, tensors, out if isinstance(out, tuple) else (out,))
        ctx.op, ctx.state = op, state
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, None, *gradients(ctx, ctx.op, grads, tuple(ctx.needs_input_grad[2:])))


Op._autocast_eagerly = autocast_eagerly
Op._autograd_eagerly = autograd_eagerly


_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _EagerOp)
