"""`Op`: what users call. Checks the call against the signature, settles a target, and runs.

The op's own path is `forward`, which picks a kernel interface by semantics and asks
`kernel_for` for the implementation. `kernel_for` is the hot path: one dict lookup on a hit.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from . import library
from .autocast import agreeing, autocast_policy
from .backend.plugins import LOADER, failure_note
from .backend.registry import BUILTIN, REGISTRY
from .call import CallSpec, check_fields
from .cases import Case
from .control import SCOPES, current_variant
from .errors import (
    AmbiguousTargetError,
    BackendError,
    OpInputError,
    OpNotAvailableError,
    UnknownTargetError,
    add_note,
)
from .explain import Explanation
from .kernel import Kernel, KernelInterface
from .signature import BoundCall, ShapePlan, Signature, TensorSpec
from .table import HIT_LIMIT, KernelTable, remember, table_for

_is_any_autocast_enabled = torch._C._is_any_autocast_enabled
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

    _entries: ClassVar[dict[tuple, Any]]
    _entries_lock: ClassVar[threading.Lock]
    _entry_locks: ClassVar[dict[tuple, threading.Lock]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.op_name = f"{cls.__dict__.get('namespace', cls.__module__)}::{cls.__qualname__}"
        cls._checks = cls.check is not Op.check  # most ops add no checks: skip the call
        REGISTRY.add_op(cls)
        cls._entries, cls._entry_locks, cls._entries_lock = {}, {}, threading.Lock()

    def __init__(self, *, target: str | None = None) -> None:
        if target is not None and not isinstance(target, str):
            raise TypeError(f"target must be a target name or None, got {type(target).__name__}")
        self.target = target
        if not torch.compiler.is_compiling():  # traced, it calls its operator: nothing to attach
            self._attach()

    # -- dispatch state: built at construction, or on first use (see __getattr__) -------------
    def _attach(self) -> None:
        """Give the op its dispatch state: the class's kernel table, its hit cache, target
        settling. Locks and caches, so never pickled (`__reduce__`) nor traced."""
        LOADER.ensure_loaded()
        self._table: KernelTable = table_for(type(self))
        SCOPES.attach(self)  # sets _hits: the cache a hit reads (see control.Scopes)
        self._settled: str | None = None
        self._settle_lock = threading.Lock()
        self._target_kernels: dict[tuple, Callable[..., Any]] = {}
        self._target_lock = threading.Lock()

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
        if (
            isinstance(out, torch.Tensor)
            and out.shape == shape
            and out.dtype == dtype
            and out.device == call.device
            and out.is_contiguous()
        ):
            return out
        raise self._broken_output(interface, call, out, shape, dtype)

    def _broken_output(
        self, interface: str, call: CallSpec, out: Any, shape: torch.Size, dtype: torch.dtype
    ) -> BackendError:
        expected = _describe(True, dtype, shape, call.device)
        if isinstance(out, torch.Tensor):
            got = _describe(out.is_contiguous(), out.dtype, out.shape, out.device)
        else:
            got = f"{type(out).__name__} {out!r}"[:120]
        return BackendError(
            f"Output of {self._table.serving(interface, call)} is wrong: it returned {got}, but "
            f"the interface's layout contract expects {expected}. Fix the kernel, or refuse such "
            "calls in its refusal()."
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

    @classmethod
    def outputs_for(cls, tensors: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
        """The outputs of a call on `tensors`, without running it (tracing's fake tensors):
        the signature's rule, contiguous. An op whose outputs keep an input's memory format
        (BatchNorm's channels_last) overrides it, so traced strides are the real ones."""
        return cls.signature.outputs_for(tensors)

    # -- calling the op ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.signature is None:
            return self.forward(*args, **kwargs)
        # An op with typed params is a torch.library operator (library.py): tracing, autocast
        # and autograd go through it; others run eagerly as they are.
        if torch.compiler.is_compiling() and self.signature.param_types is not None:
            tensors = self.signature.parse(type(self).op_name, args, kwargs)
            return library.call_operator(self, tensors)  # Dynamo sees one node, never our locks
        if _is_any_autocast_enabled() and self.signature.param_types is not None:
            tensors = self.signature.parse(type(self).op_name, args, kwargs)
            self.check_uncast(tensors)  # before autocast probes or casts anything
            return library.call_operator(self, tensors)
        plan = self.__dict__.get("_shape_plan") or self._make_shape_plan()
        call = self.signature.bind(type(self).op_name, args, kwargs, plan)
        if (
            call.requires_grad
            and torch.is_grad_enabled()
            and self.signature.param_types is not None
        ):
            return library.call_operator(self, call.tensors)
        if self._settled is BUILTIN and not self._checks and not call.written_empty:
            return self.forward(*call.tensors)  # the common case, one call shorter
        return self._execute(call)

    def call_eager(self, tensors: tuple[torch.Tensor | None, ...]) -> Any:
        """Run the op on `tensors` (signature order) through the dispatcher itself: what the
        torch.library operator does once autograd and autocast are dealt with."""
        plan = self.__dict__.get("_shape_plan") or self._make_shape_plan()
        return self._execute(self.signature.bind(type(self).op_name, tensors, {}, plan))

    def reference_forward(self, *inputs: torch.Tensor | None) -> Any:
        """The op in plain, differentiable torch: what the reference backward differentiates
        and what autocast is probed with. Ops of the catalogue define it."""
        raise NotImplementedError(f"{type(self).op_name} defines no reference_forward()")

    def check_uncast(self, tensors: tuple[Any, ...]) -> None:
        """The op's checks (signature, `check`) on a call autocast will cast, with the errors
        and messages they have without autocast; only a dtype disagreement between inputs
        autocast may cast waits for the cast (judged after it, as torch does)."""
        try:
            return self._check_tensors(tensors)
        except OpInputError:
            agreed = agreeing(self, tensors)
            if agreed is None:
                raise
        self._check_tensors(agreed)  # what is left once the castable inputs agree

    def _check_tensors(self, tensors: tuple[Any, ...]) -> None:
        plan = self.__dict__.get("_shape_plan") or self._make_shape_plan()
        call = self.signature.bind(type(self).op_name, tensors, {}, plan)
        if self._checks:
            self.check(call)

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
            return self._result(self.signature.make_outputs(call))
        if self._settled is BUILTIN:
            return self.forward(*call.tensors)
        if self._settled is None:
            return self._first_call(call)
        return self._run(self._settled, call)

    def params(self) -> dict[str, Any]:
        """The signature's params, read from the instance's attributes of the same names."""
        return {name: getattr(self, name) for name in self.signature.params}

    def _make_shape_plan(self) -> ShapePlan:
        self._shape_plan = self.signature.plan(self.params())
        return self._shape_plan

    def check(self, call: BoundCall) -> None:
        """Checks a signature cannot express; override to add them. Raise `OpInputError`."""

    @property
    def settled_target(self) -> str | None:
        """The target this instance settled on (BUILTIN for its own kernels), None before."""
        return self._settled

    def _first_call(self, call: BoundCall) -> Any:
        with self._settle_lock:
            if self._settled is not None:
                return self._run(self._settled, call)
            target = self._choose_target(call.device)
            result = self._run(target, call)  # a failure leaves the op unsettled
            self._settled = target
            return result

    def _run(self, target: str, call: BoundCall) -> Any:
        if target == BUILTIN:
            return self.forward(*call.tensors)
        return self._run_target(target, call)

    def _result(self, outputs: dict[str, torch.Tensor]) -> Any:
        values = tuple(outputs.values())
        return values[0] if len(values) == 1 else values

    # -- targets -----------------------------------------------------------------------------
    def _choose_target(self, device: torch.device) -> str:
        LOADER.ensure_loaded()  # settles backends imported directly since (see plugins.py)
        name = self.target or REGISTRY.default_target
        if name == BUILTIN:
            return BUILTIN
        if name is not None:
            known = REGISTRY.targets()
            if name not in known:
                raise UnknownTargetError(
                    f"{type(self).op_name}: unknown target {name!r}; known targets: "
                    f"{', '.join(known) or 'none'} (and {BUILTIN!r} for the op's own kernels). "
                    f"{failure_note()}".rstrip()
                )
            return name
        claims = [d for t, d in sorted(REGISTRY.detectors.items()) if d.claims(device)]
        if len(claims) > 1:
            raise AmbiguousTargetError(
                f"{type(self).op_name}: several targets claim {device}: "
                + ", ".join(f"{d.target!r} ({d.source})" for d in claims)
                + "; pass target= to the op or call tileops.backend.set_default_target()"
            )
        return claims[0].target if claims else BUILTIN

    def _run_target(self, target: str, call: BoundCall) -> Any:
        op = type(self).op_name
        builder = REGISTRY.builder(type(self), target)
        if builder is None:
            raise _no_builder(self, target, call.device)
        inputs = self._target_inputs(call)
        key = (
            target,
            call.device,
            tuple(None if t is None else (t.dtype, t.shape) for t in inputs),
        )
        built = self._target_kernels.get(key)
        if built is None:
            built = self._build_target_kernel(builder, key, inputs)
        kernel, names_outputs = built
        outputs = self.signature.make_outputs(call)
        try:
            returned = kernel(*inputs, **outputs)
        except Exception as exc:
            add_note(exc, f"raised by the kernel of target {target!r} [{builder.source}] for {op}")
            raise
        if returned is None and names_outputs:  # it wrote the buffers it takes by name
            return self._result(outputs)
        where = f"the kernel of target {target!r} [{builder.source}] for {op}"
        named_inputs = dict(zip(self.signature.names, inputs, strict=True))
        return self._result(_returned_outputs(where, returned, outputs, named_inputs))

    def _build_target_kernel(
        self, builder: Any, key: tuple, inputs: tuple[torch.Tensor | None, ...]
    ) -> tuple[Callable[..., Any], bool]:
        """The kernel built for `key`, and whether its signature names every output buffer
        (what lets a None it returns mean "written", see `_returned_outputs`)."""
        with self._target_lock:
            built = self._target_kernels.get(key)
            if built is None:
                specs = [None if t is None else TensorSpec.of(t) for t in inputs]
                try:
                    kernel = builder.build_kernel(*specs, **self.params())
                except Exception as exc:
                    note = f"raised by build_kernel of target {builder.target!r} [{builder.source}]"
                    add_note(exc, f"{note} for {builder.op.op_name} on {specs}")
                    raise
                names = [out.name for out in self.signature.outputs]
                built = kernel, _names_every_output(kernel, names)
                remember(self._target_kernels, key, built, HIT_LIMIT)
            return built

    def _target_inputs(self, call: BoundCall) -> tuple[torch.Tensor | None, ...]:
        """Inputs as a target sees them: those the op does not write made contiguous (written
        ones that must be contiguous were checked by the signature)."""
        return tuple(
            t if t is None or spec.written else t.contiguous()
            for spec, t in zip(self.signature.inputs, call.tensors, strict=True)
        )


_DISPATCH_STATE = frozenset(
    {"_table", "_hits", "_settled", "_settle_lock", "_target_kernels", "_target_lock"}
)


def _rebuilt(op_cls: type[Op], params: dict[str, Any], target: str | None) -> Op:
    return op_cls(**params, target=target)


def _names_every_output(kernel: Callable[..., Any], names: list[str]) -> bool:
    """Whether `kernel` takes each output buffer by its name: only then is a None it returns
    taken to mean it wrote them. One that takes them through `**kwargs` alone may never look at
    them, and a buffer it did not write is uninitialised memory; nothing after the call can
    tell (a GPU kernel writes memory torch does not see). An unreadable signature names none."""
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return all(n in parameters and parameters[n].kind in by_name for n in names)


def _returned_outputs(
    where: str, returned: Any, buffers: dict[str, torch.Tensor], inputs: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """The outputs a target kernel returned, in place of the buffers it was handed: a tensor
    (a tuple of them, in signature order, for several outputs), each of its buffer's shape,
    dtype and device, contiguous, and sharing no memory with an input."""
    names = list(buffers)
    if returned is None:
        raise BackendError(
            f"{where} returned None, but takes its output buffers ({', '.join(names)}) only "
            "through **kwargs (or has a signature Python cannot read), so nothing says it wrote "
            f"them: return the result, or name {', '.join(names)} as parameters of the kernel "
            "(`def kernel(x, *, out)`) and write them in place"
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
            f"{', '.join(names)} in place) or {expected} ({', '.join(names)})"
        )
    for name, result in zip(names, results, strict=True):
        if result is not buffers[name]:
            _check_returned(where, name, result, buffers[name], inputs)
    return dict(zip(names, results, strict=True))


def _check_returned(
    where: str, name: str, result: torch.Tensor, buffer: torch.Tensor, inputs: dict[str, Any]
) -> None:
    if not (
        result.shape == buffer.shape
        and result.dtype == buffer.dtype
        and result.device == buffer.device
        and result.is_contiguous()
    ):
        got = _describe(result.is_contiguous(), result.dtype, result.shape, result.device)
        expected = _describe(True, buffer.dtype, buffer.shape, buffer.device)
        raise BackendError(
            f"{where} returned for output {name!r} {got}, but the op's signature expects "
            f"{expected} (the buffer it was handed)"
        )
    storage = _storage(result)
    shared = [n for n, t in inputs.items() if t is not None and _storage(t) == storage]
    if storage and shared:
        raise BackendError(
            f"{where} returned for output {name!r} a tensor sharing memory with its input "
            f"{shared[0]!r}; return a new tensor, or write the output buffer it was handed"
        )


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def _describe(contiguous: bool, dtype: torch.dtype, shape: Any, device: torch.device) -> str:
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
        f" {failure_note()}".rstrip()
    )
