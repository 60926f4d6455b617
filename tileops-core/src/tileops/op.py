"""`Op`: what users call. Checks the call against the signature, settles a target, and runs.

The op's own path is `forward`, which picks a kernel interface by semantics and asks
`kernel_for` for the implementation. `kernel_for` is the hot path: one dict lookup on a hit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from .autocast import agreeing, autocast_policy
from .backward import keep_state
from .callspec import _STATED, CallSpec, check_fields
from .errors import BackendError, CallSpecFieldError, OpInputError, add_note
from .explanation import Explanation
from .kernel import Kernel, KernelInterface
from .plugins import LOADER
from .registry import BUILTIN, REGISTRY, as_target
from .samples import Case
from .scope import SCOPES, current_variant
from .signature import BoundCall, ShapePlan, Signature
from .table import KernelTable, table_for
from .targets import choose_target, describe, result_of, run_target

_is_any_autocast_enabled = torch._C._is_any_autocast_enabled
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_deterministic = torch._C._get_deterministic_algorithms


class Op:
    """Base of ops. Subclasses declare `interfaces`, `kernel_types`, `signature` and `forward`.

    Every op class has a unique name, `op_name` = `"<namespace>::<qualname>"`, under which
    backends register for it and every message names it. The namespace is the class's own
    `namespace` declaration (not inherited), else its module's name: a downstream library's
    `RMSNormFwdOp` never shadows tileops' `tileops::RMSNormFwdOp`.
    """

    interfaces: ClassVar[dict[str, type[KernelInterface]]] = {}
    kernel_types: ClassVar[dict[str, type[Kernel]]] = {}
    signature: Signature | None = None  # None: called straight through to forward
    op_name: ClassVar[str]
    _checks: ClassVar[bool] = False
    layout_checks: ClassVar[bool] = False
    """True: `check` reads nothing but what the signature's checks key their verdicts by
    (shapes, dtypes, devices, which inputs are given, the params): it runs with them, once per
    input layout, instead of on every call."""
    saves_outputs: ClassVar[bool] = False
    """True: autograd keeps the op's outputs for its backward kernels (softmax's y), which
    then take them as a third argument; False: only the inputs are kept."""
    keeps_state: ClassVar[bool] = False
    """True: a forward kernel may return `(out, *state)`, what it computed on the way that the
    backward kernels can use instead of recomputing it (BatchNorm's batch mean and inverse
    std); `state_problem` checks it, and backward kernels with `takes_state` receive it."""
    weighs_backward: ClassVar[bool] = False
    """True: the forward call spec of an autograd call says so (`grad`, with its size), so the
    forward kernel serving it was chosen for the forward and backward together; a native lane
    then needs no check that the backward kernels are torch's own (the row norms)."""
    native_function: ClassVar[Callable[..., Any] | None] = None
    """A classmethod computing the op with torch's own function, called as its operator is
    (the tensors, then the params in signature order): what the op's native lanes run
    (`native_lane_for`), and what torch.compile traces where one would serve the call
    (library.traced_call). None: the op has no native lane."""
    _through_operator: ClassVar[Callable[..., Any]]
    """`op._through_operator(tensors)`: the op as tracing sees it (torch.compile, torch.export),
    its torch.library operator or, compiled, its native function; library.py installs it."""
    _autocast_eagerly: ClassVar[Callable[..., Any]]
    """`op._autocast_eagerly(tensors, checked)`: an eager call under autocast (eager.py)."""
    _autograd_eagerly: ClassVar[Callable[..., Any]]
    """`op._autograd_eagerly(call, checked=False)`: an eager call as one autograd node
    (eager.py); `checked`: the op's checks ran on `call` already."""
    _backward_through_operator: ClassVar[Callable[..., Any]]
    """`op._backward_through_operator(grads, inputs, outputs, needs)`: the gradients `needs`
    asks for, through the op's opaque backward operator (a traced backward calls it); library.py
    installs it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.op_name = f"{cls.__dict__.get('namespace', cls.__module__)}::{cls.__qualname__}"
        # most ops add no checks, or checks of the layout alone: no call per call
        cls._checks = cls.check is not Op.check and not cls.layout_checks
        if cls.keeps_state and cls.lane_for is not Op.lane_for:
            raise TypeError(
                f"{cls.__qualname__}: an op whose kernels keep state defines no lane_for (a lane "
                "calls the kernel without the state's check and collection)"
            )
        REGISTRY.add_op(cls)

    def __init__(self, *, target: str | None = None) -> None:
        if target is not None and not isinstance(target, str):
            raise TypeError(
                f"target must be a target name, BUILTIN or None, got {type(target).__name__}"
            )
        self.target = as_target(target)
        if not torch.compiler.is_compiling():  # traced, it calls its operator: nothing to attach
            self._attach()

    # -- dispatch state: built at construction, or on first use (see __getattr__) -------------
    def _attach(self) -> None:
        """Give the op its dispatch state: the class's kernel table, its hit cache, target
        settling. Locks and caches, so never pickled (`__reduce__`) nor traced."""
        LOADER.ensure_loaded()
        self._table: KernelTable = table_for(type(self))
        SCOPES.attach(self)  # points _hits, the cache a hit reads (see scope.Scopes)
        self._settled: str | None = None
        self._settle_lock = threading.Lock()
        self._target_kernels: dict[tuple, Callable[..., Any]] = {}
        self._target_lock = threading.Lock()

    def _point_hits(self, scoped: bool) -> None:
        """Read hits from the table's plain cache, or, while some pin, record or simulation is
        active anywhere, from a reader consulting the caller's context (scope.Scopes calls it)."""
        self._hits = self._table.hits_for(scoped)

    def __getattr__(self, name: str) -> Any:
        """Dispatch state of an op built while torch.compile traced or unpickled: attached on
        first use (only reached when the attribute is missing: a hit never comes here)."""
        if name in _DISPATCH_STATE and "target" in self.__dict__:
            self._attach()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self) -> tuple:
        """Pickle (and deepcopy) as the constructor's arguments: the signature's params and
        the target, the convention the torch.library operators rebuild ops by. An op without
        typed params keeps its attributes, less the dispatch state; both attach it anew."""
        if self.signature is not None and self.signature.param_types is not None:
            return _rebuilt, (type(self), self.params(), self.target)
        state = {k: v for k, v in self.__dict__.items() if k not in _DISPATCH_STATE}
        return object.__new__, (type(self),), state

    # -- the op's own kernels ----------------------------------------------------------------
    def kernel_for(self, interface: str, call: CallSpec) -> Callable[..., Any]:
        """The entry serving `call` on `interface`: a cache hit, or selected and built once."""
        try:
            entry = self._hits.get((interface, call))
        except TypeError:
            check_fields(call)
            raise
        if entry is None:
            if _STATED in call.__dict__:
                raise _stated_facts_refused(type(self).op_name, interface, call)
            entry = self._table.resolve(interface, call)
        return entry

    def key_for(self, interface: str, call: CallSpec) -> str:
        """The key that would serve `call` here and now, without building anything."""
        if current_variant(type(self), interface, call) is not None:  # a pin, a simulation
            return self._table.select(interface, call).key
        try:
            key = self._table.modes[_deterministic()][1].get((interface, call))
        except TypeError:
            check_fields(call)
            raise
        return key if key is not None else self._table.select(interface, call).key

    def call_kernel(
        self,
        interface: str,
        call: CallSpec,
        shape: torch.Size,
        dtype: torch.dtype,
        *args: torch.Tensor | None,
    ) -> torch.Tensor:
        """Run the kernel serving `call` on `args` and check what the interface's layout
        contract promises of its output: a contiguous tensor of `shape` and `dtype` on the
        call's device. A wrong output raises `BackendError` naming the key; a kernel's own
        exception keeps its type and message and gains a note naming the key."""
        try:
            kernel = self._hits.get((interface, call))
        except TypeError:
            kernel = None  # kernel_for names the field that cannot key a cache
        if kernel is None:
            kernel = self.kernel_for(interface, call)
        try:
            out = kernel(*args)
        except Exception as exc:
            add_note(exc, f"raised by {self._table.serving(interface, call)}")
            raise
        if type(out) is tuple and self.keeps_state:
            out, *state = out
            self._keep_state(interface, call, state)
        if (
            isinstance(out, torch.Tensor)
            and out.shape == shape
            and out.dtype == dtype
            and out.device == call.device
            and out.is_contiguous()
        ):
            return out
        raise self._broken_output(interface, call, out, shape, dtype)

    def _keep_state(self, interface: str, call: CallSpec, state: list) -> None:
        problem = self.state_problem(call, state)
        if problem is not None:
            raise BackendError(
                f"State kept by {self._table.serving(interface, call)} is wrong: {problem}. Fix "
                "the kernel, or return the output alone.",
                **self._table.serving_fields(interface, call),
            )
        keep_state(self, state)

    def state_problem(self, call: CallSpec, state: list[Any]) -> str | None:
        """What is wrong with the state a forward kernel kept for `call`, or None (ops with
        `keeps_state` say what it must be)."""
        return f"{type(self).op_name} keeps no state"

    def _broken_output(
        self, interface: str, call: CallSpec, out: Any, shape: torch.Size, dtype: torch.dtype
    ) -> BackendError:
        expected = describe(True, dtype, shape, call.device)
        if isinstance(out, torch.Tensor):
            got = describe(out.is_contiguous(), out.dtype, out.shape, out.device)
        else:
            got = f"{type(out).__name__} {out!r}"[:120]
        return BackendError(
            f"Output of {self._table.serving(interface, call)} is wrong: it returned {got}, but "
            f"the interface's layout contract expects {expected}. Fix the kernel, or refuse such "
            "calls in its refusal().",
            **self._table.serving_fields(interface, call),
        )

    def explain(self, interface: str, call: CallSpec) -> Explanation:
        """Every key's verdict on `call`, and what dispatch would do; never raises for a verdict."""
        return self._table.explain(interface, call)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        """Representative calls, for conformance checks of backends' kernels."""
        raise NotImplementedError(f"{cls.op_name} declares no sample_cases()")

    def forward(self, *inputs: torch.Tensor | None) -> Any:
        raise NotImplementedError(f"{type(self).op_name} does not define forward()")

    def outputs_for(self, tensors: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
        """The outputs of a call on `tensors`, without running it (tracing's fake tensors):
        the signature's rule (the instance's: GemmOp's follows its layout), contiguous. An op
        whose outputs keep an input's memory format (BatchNorm's channels_last) overrides it,
        so traced strides are the real ones."""
        return self.signature.outputs_for(tensors)

    # -- calling the op ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        signature = self.signature
        if signature is None:
            return self.forward(*args, **kwargs)
        # An op with typed params is a torch.library operator (library.py): tracing, autocast
        # and autograd go through it; others run eagerly as they are.
        operator = signature.param_types is not None
        if operator and _is_compiling():
            tensors = signature.parse(type(self).op_name, args, kwargs)
            return self._through_operator(tensors)  # what Dynamo traces, never our locks
        if operator and _is_any_autocast_enabled():
            tensors = signature.parse(type(self).op_name, args, kwargs)
            checked = self.check_uncast(tensors)  # before autocast probes or casts anything
            return self._autocast_eagerly(tensors, checked)
        plan = self.__dict__.get("_shape_plan") or self._make_shape_plan()
        values = signature.parse(type(self).op_name, args, kwargs)
        key, known = signature.known(values, plan)
        builtin = self._settled is BUILTIN and not self._checks  # no checks, no target
        if builtin and known is not None:  # the common case: a seen layout
            out = self._lane_call(known, values)
            if out is not None:
                return out
        call = signature.bound(type(self).op_name, values, key, known, plan)
        if call.requires_grad and operator and _is_grad_enabled():
            return self._autograd_eagerly(call)
        if builtin and not call.written_empty:
            return self._builtin(call)
        return self._execute(call)

    def _lane_call(self, verdict: tuple, values: tuple) -> Any:
        """What the plain lane of a seen layout returns for `values`, without building their
        `BoundCall` (`verdict` is its fields after the tensors); None where the call needs the
        op's own path: a gradient, only empty outputs, no lane, or other strides."""
        _, _, written_empty, requires_grad, lane = verdict
        held = lane[0]
        if held is None or held[0] is not self._hits or held[1] is None or written_empty:
            return None
        if requires_grad and _is_grad_enabled():
            return None
        return held[1](*values)

    def _builtin(self, call: BoundCall) -> Any:
        """The op's own kernels on a checked call: its layout's lane, else `forward` (and the
        lane made for the next calls of that layout: the op's own, else its native lane)."""
        held = call.lane[0]
        if held is not None and held[0] is self._hits and held[1] is not None:
            out = held[1](*call.tensors)
            if out is not None:  # None: a native lane made for other strides
                return out
        out = self.forward(*call.tensors)
        hits = self._hits  # a plain cache: no pin, record or simulation is active
        if type(hits) is dict and (held is None or held[0] is not hits):
            own = type(self).lane_for is not Op.lane_for
            call.lane[0] = (hits, self.lane_for(call) if own else self.native_lane_for(call))
        return out

    def lane_for(self, call: BoundCall) -> Callable[..., Any] | None:
        """A shortcut for the calls of `call`'s input layout, made after one ran `forward`
        (its output checked): the kernel that served it, called as `forward` would call it,
        without selecting or checking again. Lanes are made and taken only while the op reads
        its plain hit cache (no pin, record or simulation active anywhere), whose selections
        they repeat; None: every call runs `forward`."""
        return None

    def native_lane_for(self, call: BoundCall) -> Callable[..., Any] | None:
        """torch's own differentiable function for the calls of `call`'s input layout, where
        the kernel serving it (selected now if need be) declares `torch_native`: autograd
        calls run it under torch's autograd from the layout's first, with torch's backward,
        and plain calls from their second where the op defines no `lane_for`. The lane returns
        None for a call it was not made for (other strides), which then takes the op's own
        path. None: no lane."""
        return None

    def call_eager(self, tensors: tuple[torch.Tensor | None, ...]) -> Any:
        """Run the op on `tensors` (signature order) through the dispatcher itself: what the
        torch.library operator does once autograd and autocast are dealt with."""
        return self._execute(self._bind(tensors))

    def call_eager_autograd(
        self, tensors: tuple[torch.Tensor | None, ...], call: BoundCall | None = None
    ) -> Any:
        """`call_eager`, as one autograd node when an input needs a gradient: the eager
        route once autocast has cast (eager.py). `call`: `tensors` bound and checked already."""
        checked = call is not None
        if call is None:
            call = self._bind(tensors)
        if call.requires_grad and torch.is_grad_enabled():
            return self._autograd_eagerly(call, checked)
        return self._execute(call)

    def reference_forward(self, *inputs: torch.Tensor | None) -> Any:
        """The op in plain, differentiable torch: what the reference backward differentiates
        and what autocast is probed with. Ops of the catalogue define it."""
        raise NotImplementedError(f"{type(self).op_name} defines no reference_forward()")

    def backward_facts(
        self,
        grads: tuple[torch.Tensor, ...],
        inputs: tuple[torch.Tensor | None, ...],
        outputs: tuple[torch.Tensor | None, ...],
    ) -> tuple[type[CallSpec], dict[str, Any]] | None:
        """What this op's backward kernels' regions depend on beyond `BackwardCall`'s fields:
        the op's subclass of `BackwardCall` and its extra fields, read off the tensors of one
        backward call (under tracing a size may be a SymInt). None: the plain `BackwardCall`."""
        return None

    def check_uncast(self, tensors: tuple[Any, ...]) -> BoundCall | None:
        """The op's checks (signature, `check`) on a call autocast will cast, with the errors
        and messages they have without autocast; only a dtype disagreement between inputs
        autocast may cast waits for the cast (judged after it, as torch does). The call as
        checked, or None when a disagreement waits for the cast."""
        try:
            return self._check_tensors(tensors)
        except OpInputError:
            agreed = agreeing(self, tensors)
            if agreed is None:
                raise
        self._check_tensors(agreed)  # what is left once the castable inputs agree
        return None

    def _check_tensors(self, tensors: tuple[Any, ...]) -> BoundCall:
        call = self._bind(tensors)
        if self._checks:
            self.check(call)
        return call

    def autocast_dtype(
        self, device_type: str, tensors: tuple[torch.Tensor | None, ...]
    ) -> torch.dtype | None:
        """The dtype to cast floating inputs to under the current autocast, or None: exactly
        what autocast does to the op's torch counterpart (probed once per state)."""
        return autocast_policy(self, device_type, tensors)

    def _execute(self, call: BoundCall) -> Any:
        if self._checks:
            self.check(call)
        if call.written_empty:
            return result_of(self.signature.make_outputs(call))
        if self._settled is BUILTIN:
            return self._builtin(call)
        if self._settled is None:
            return self._first_call(call)
        return self._run(self._settled, call)

    def params(self) -> dict[str, Any]:
        """The signature's params, read from the instance's attributes of the same names."""
        return {name: getattr(self, name) for name in self.signature.params}

    def _bind(self, tensors: tuple[Any, ...]) -> BoundCall:
        """`tensors` (signature order) parsed and checked against the signature."""
        plan = self.__dict__.get("_shape_plan") or self._make_shape_plan()
        return self.signature.bind(type(self).op_name, tensors, {}, plan)

    def _make_shape_plan(self) -> ShapePlan:
        layout_check = self.check if type(self).layout_checks else None
        self._shape_plan = self.signature.plan(self.params(), layout_check)
        return self._shape_plan

    def check(self, call: BoundCall) -> None:
        """Checks a signature cannot express; override to add them. Raise `OpInputError`."""

    @property
    def settled_target(self) -> str | None:
        """The target this instance settled on (BUILTIN for its own kernels), None before."""
        return self._settled

    @property
    def serving_target(self) -> str | None:
        """Upstream TileOPs' name of `settled_target`: None before the first call that runs a
        kernel, BUILTIN for the op's own kernels, else the target's name."""
        return self._settled

    def built_entries(self, interface: str) -> Mapping[Hashable, Any]:
        """A read-only view of what has been built for `interface`, for tests and reports
        (never for dispatch: `kernel_for` builds on a miss). An instance settled on a target
        shows that target's kernels, keyed by (device, then per input (dtype, shape) or None),
        whatever the interface, as upstream does (a target serves the whole op); otherwise the
        op's own entries for `interface`, keyed by (kernel class, build identity): shared by
        every instance of the op class, as the entries themselves are."""
        if interface not in self.interfaces:
            raise KeyError(
                f"{type(self).op_name} has no interface {interface!r}; its interfaces: "
                f"{', '.join(self.interfaces)}"
            )
        if self._settled not in (None, BUILTIN):
            return MappingProxyType(
                {(k[1], *k[2]): kernel for k, (kernel, _) in list(self._target_kernels.items())}
            )
        entries = list(self._table.shared.entries.items())
        return MappingProxyType({(c, i): e for (f, c, i), e in entries if f == interface})

    def runs_builtin(self, device: torch.device) -> bool:
        """Whether the op runs its own kernels (no target) on `device`: settled so, or
        settling so now (a target settles only once its first call ran)."""
        if self._settled is None and choose_target(self, device) is BUILTIN:
            with self._settle_lock:
                if self._settled is None:
                    self._settled = BUILTIN
        return self._settled is BUILTIN

    def _first_call(self, call: BoundCall) -> Any:
        with self._settle_lock:
            if self._settled is not None:
                return self._run(self._settled, call)
            target = choose_target(self, call.device)
            result = self._run(target, call)  # a failure leaves the op unsettled
            self._settled = target
            return result

    def _run(self, target: str, call: BoundCall) -> Any:
        if target == BUILTIN:
            return self.forward(*call.tensors)
        return run_target(self, target, call)


def _stated_facts_refused(op: str, interface: str, call: CallSpec) -> CallSpecFieldError:
    stated = ", ".join(sorted(call.stated_device_facts))
    return CallSpecFieldError(
        f"{op}.{interface}: kernel_for reads the device facts from the call's device, but this "
        f"{type(call).__name__} states {stated}; a call spec with stated facts is for key_for() "
        "and explain() (asking about another device); to run as another device use "
        "tileops.testing.simulate_device",
        op=op,
        interface=interface,
        call=call,
    )


_DISPATCH_STATE = frozenset(
    {"_table", "_hits", "_settled", "_settle_lock", "_target_kernels", "_target_lock"}
    | {"_shape_plan"}  # rebuilt on first use, with the op's own check
)


def _rebuilt(op_cls: type[Op], params: dict[str, Any], target: str | None) -> Op:
    return op_cls(**params, target=target)
