"""Gradients of an op's inputs, through a kernel interface of their own.

Every catalogue op has a "backward" interface beside its forward ones. Its reference kernel,
`RecomputeBackward`, runs the op's torch definition (`Op.reference_forward`) again with autograd
on and differentiates it, so gradients match torch's for every op, dtype and shape the forward
serves, whichever kernel served the forward. Backends register faster backward kernels the way
they register forward ones: `register_kernel_type(OpClass, key, cls)` with a class inheriting
`BackwardInterface`; they win over the reference wherever they do not refuse.

A backward that runs under `create_graph` (double backward, hessians, gradgradcheck) must
return gradients that are themselves differentiable; the call says so (`create_graph`), and a
kernel that does not declare `differentiable = True` refuses it, so the reference serves.

An op whose backward kernels' regions depend on more than dtypes (a row length, which affine
params are present) says so in `Op.backward_facts`: its backward calls are then specs of its own
class, a subclass of `BackwardCall`, built from the concrete tensors. Under tracing
(torch.compile, export) the tensors may be symbolic: a differentiable kernel (the reference) is
traced as the torch ops it runs, and any other goes into the graph as one opaque operator (see
`library.backward_operator`) that selects with the real shapes when it runs.

An op with `keeps_state` lets its forward kernels hand the backward what they computed on the way
(BatchNorm's batch mean and inverse std): an eager autograd call collects it (`run_keeping_state`)
and backward kernels that declare `takes_state` receive it instead of recomputing it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch._subclasses.fake_tensor import is_fake

from .callspec import CallSpec
from .errors import KernelDeclarationError
from .kernel import Build, Kernel, KernelInterface
from .registry import REGISTRY
from .table import remember

if TYPE_CHECKING:
    from .op import Op

Tensors = tuple[torch.Tensor | None, ...]
_is_functional = torch._is_functional_tensor
NOT_DIFFERENTIABLE = (
    "this backward runs under create_graph (double backward), and the kernel does not declare "
    "differentiable = True: the gradients it returns would drop the second-order terms"
)


class BackwardCall(CallSpec):
    """One backward call: the op (unique name) and its params, the inputs' dtypes (None for an
    absent optional input), which inputs need a gradient, and whether the gradients must be
    differentiable themselves (`create_graph`: the backward runs with grad mode on). No
    shapes: under tracing they are symbolic, and a kernel reads them off its tensors."""

    op: str
    params: tuple[tuple[str, Hashable], ...]
    dtypes: tuple[torch.dtype | None, ...]
    needs: tuple[bool, ...]
    create_graph: bool = False


class BackwardInterface(KernelInterface):
    """Interface "backward": the gradients of an op's inputs.

    Layout contract: `grads` holds one gradient per output of the op, `inputs` the op's inputs
    exactly as its caller passed them (signature order, None for absent optional inputs, any
    strides). Return one tensor per input: the gradient, shaped and typed like that input,
    where `call.needs` is True, else None. Inputs the op writes (BatchNorm's running stats)
    never need a gradient and must not be written again.

    `differentiable`: True when the gradients are built from differentiable torch ops on
    `grads` and `inputs` (so autograd can differentiate them again). Only such kernels serve
    calls with `create_graph`; the others refuse them, whatever their own `refusal` says.

    `takes_state`: True when the kernel accepts `state=`, what the op's forward kernel kept
    for the backward (ops with `keeps_state`; the op's docs say what it holds). It is passed
    only where the forward kept some (an eager autograd call whose kernel returned it); the
    kernel computes what it needs otherwise.
    """

    call_spec: ClassVar[type[BackwardCall]] = BackwardCall
    differentiable: ClassVar[bool] = False
    takes_state: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.differentiable, bool):
            raise KernelDeclarationError(
                f"kernel class {cls.__qualname__!r}: differentiable must be True or False, got "
                f"{cls.differentiable!r}"
            )
        if issubclass(cls, Kernel) and not getattr(cls.refusal, "checks_graph", False):
            cls.refusal = _refusing_graphs(cls.refusal.__func__)

    def forward(self, grads: Tensors, inputs: Tensors) -> Tensors:
        raise NotImplementedError


def _refusing_graphs(own: Callable[..., str | None]) -> classmethod:
    """`own` refusal, after refusing create_graph calls where the kernel is not differentiable."""

    def refusal(cls: type, call: BackwardCall) -> str | None:
        if call.create_graph and not cls.differentiable:
            return NOT_DIFFERENTIABLE
        return own(cls, call)

    refusal.checks_graph = True
    return classmethod(refusal)


class RecomputeBackward(Kernel, BackwardInterface):
    """Differentiates the op's torch definition, recomputed from the saved inputs: exact
    agreement with torch's gradients, at the price of one more forward in torch. Under
    create_graph it recomputes on the saved inputs themselves, so its gradients carry their
    own graph and second-order terms flow."""

    devices = frozenset({"cpu", "meta", "cuda"})
    general = True
    differentiable = True

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        identity = (call.op, call.params, call.needs, call.create_graph)
        return identity, lambda: cls(call.op, dict(call.params), call.needs, call.create_graph)

    def __init__(
        self, op: str, params: dict[str, Any], needs: tuple[bool, ...], create_graph: bool
    ) -> None:
        self.op = REGISTRY.op_class(op)(**params)
        self.written = tuple(spec.written for spec in self.op.signature.inputs)
        self.needs = needs
        self.create_graph = create_graph

    def forward(self, grads: Tensors, inputs: Tensors, outputs: Tensors = ()) -> Tensors:
        graph = self.create_graph
        with torch.enable_grad():
            leaves = tuple(
                _leaf(t, need, written, graph)
                for t, need, written in zip(inputs, self.needs, self.written, strict=True)
            )
            outputs = self.op.reference_forward(*leaves)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            # an output that depends on no input needing a gradient (rotary's k when only q
            # needs one) is left out: autograd refuses to differentiate it
            pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
            wanted = [t for t, need in zip(leaves, self.needs, strict=True) if need]
            found = iter(
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    wanted,
                    [g for _, g in pairs],
                    allow_unused=True,
                    create_graph=graph,
                )
            )
        return tuple(next(found) if need else None for need in self.needs)


def _leaf(t: torch.Tensor | None, need: bool, written: bool, graph: bool) -> torch.Tensor | None:
    """What the recompute runs on: a copy of an input the op writes (running stats are never
    updated again); under create_graph, a node of its own on the input's graph per argument
    (the same tensor passed twice gets each argument's gradient); else a detached leaf."""
    if t is None:
        return None
    if written:
        return t.detach().clone()
    if graph:
        return t.view_as(t) if need else t
    return t.detach().requires_grad_(need)


def backward_of(
    op: Op,
    grads: Sequence[torch.Tensor],
    inputs: Tensors,
    needs: Sequence[bool],
    outputs: Tensors = (),
    state: Tensors = (),
) -> Tensors:
    """The gradients of `op`'s inputs, from the kernel its "backward" interface selects; with
    grad mode on (the caller's create_graph), a kernel whose gradients are differentiable.
    `outputs`: what the forward saved of its outputs (ops with `saves_outputs`; None for an
    output modified in place since). `state`: what its kernel kept (ops with `keeps_state`)."""
    grads, needs = tuple(grads), tuple(needs)
    if is_traced(grads, inputs):
        return _traced(op, grads, inputs, outputs, needs)
    return run_backward(op, grads, inputs, outputs, needs, torch.is_grad_enabled(), state)


def run_backward(
    op: Op,
    grads: Tensors,
    inputs: Tensors,
    outputs: Tensors,
    needs: tuple[bool, ...],
    create_graph: bool,
    state: Tensors = (),
) -> Tensors:
    """Select on the concrete tensors and run: the eager path, and the backward operator's."""
    call = backward_call(op, grads, inputs, outputs, needs, create_graph)
    kernel = op.kernel_for("backward", call)
    args = (grads, inputs, outputs) if type(op).saves_outputs else (grads, inputs)
    if state and getattr(kernel, "takes_state", False):
        return kernel(*args, state=state)
    return kernel(*args)


_KEPT: ContextVar[tuple[Any, list] | None] = ContextVar("tileops_kept_state", default=None)


def run_keeping_state(op: Op, run: Callable[[], Any]) -> tuple[Any, Tensors]:
    """`run()`'s result and the state `op`'s forward kernel kept on the way (empty if none)."""
    kept: list = []
    token = _KEPT.set((op, kept))
    try:
        return run(), tuple(kept)
    finally:
        _KEPT.reset(token)


def keep_state(op: Op, state: Sequence[torch.Tensor]) -> None:
    """Hand `state` to the eager autograd call of `op` collecting it, if one is (an op another
    op's kernel calls keeps its own state to itself)."""
    collecting = _KEPT.get()
    if collecting is not None and collecting[0] is op:
        collecting[1].extend(state)


def backward_call(
    op: Op,
    grads: Tensors,
    inputs: Tensors,
    outputs: Tensors,
    needs: tuple[bool, ...],
    create_graph: bool,
) -> BackwardCall:
    """The call spec of one backward: `BackwardCall`'s fields, and the op's own facts (its
    `backward_facts`) in the op's spec class, built once per op instance and combination of
    them. Under tracing a fact may be a SymInt (built each time: it keys no cache)."""
    device = next(t.device for t in inputs if t is not None)
    dtypes = tuple(None if t is None else t.dtype for t in inputs)
    own = op.backward_facts(grads, inputs, outputs)
    key = (device, dtypes, needs, create_graph, None if own is None else tuple(own[1].items()))
    calls = op.__dict__.get("_backward_calls")
    if calls is None:
        calls = op.__dict__["_backward_calls"] = {}
    try:
        call = calls.get(key)
    except TypeError:  # a symbolic fact
        key = call = None
    if call is None:
        common = {
            "device": device,
            "op": type(op).op_name,
            "params": tuple(op.params().items()),
            "dtypes": dtypes,
            "needs": needs,
            "create_graph": create_graph,
        }
        call = BackwardCall(**common) if own is None else own[0](**common, **own[1])
        if key is not None:
            remember(calls, key, call, 64)  # bounded: ever-new row lengths
    return call


def is_traced(*groups: Sequence[torch.Tensor | None]) -> bool:
    """Whether torch.compile traces, or any tensor of `groups` is a fake one (what AOTAutograd
    traces a backward with): shapes may be symbolic, and no kernel can read the data."""
    if torch.compiler.is_compiling():
        return True
    # a trace holds no real tensor beside fake ones: the first tensor tells (a plain tensor
    # that no functionalization wraps is real, and costs no `is_fake`)
    first = next((t for group in groups for t in group if t is not None), None)
    if first is None or (type(first) is torch.Tensor and not _is_functional(first)):
        return False
    return is_fake(first)


def _traced(
    op: Op, grads: Tensors, inputs: Tensors, outputs: Tensors, needs: tuple[bool, ...]
) -> Tensors:
    """Under tracing: the reference traced as torch ops where it is what serves the static
    facts; else one opaque operator, which selects on the real shapes when it runs. A
    symbolic fact (a dynamic row length) leaves the choice to run time."""
    call = backward_call(op, grads, inputs, outputs, needs, False)  # compile: no double backward
    if not any(isinstance(v, (torch.SymInt, torch.SymBool)) for v in call.__dict__.values()):
        kernel = op.kernel_for("backward", call)
        if getattr(kernel, "differentiable", False):
            return (
                kernel(grads, inputs, outputs) if type(op).saves_outputs else kernel(grads, inputs)
            )
    found = iter(op._backward_through_operator(grads, inputs, outputs, needs))
    return tuple(next(found) if need else None for need in needs)
