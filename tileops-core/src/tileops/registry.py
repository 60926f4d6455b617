"""The process-wide tables that backends write: kernel types, detectors, builders, default target.

Every entry lives in one slot table, keyed by what it registers, and knows its source. Every
change bumps `generation`, so op classes know to rebuild their kernel tables. A transaction
logs the changes made in its own context and can undo exactly those: a registration another
thread makes meanwhile survives, and a backend's load undoes only its own changes. Closing a
source removes everything one backend registered, from whichever thread, and refuses what it
registers later: that is how a backend that fails halfway leaves no trace.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import BackendError, OpDefinitionError, UnknownOpError
from .provenance import Source


class _Builtin(str):
    """The type of `BUILTIN`: one instance, compared by identity as upstream TileOPs' sentinel
    is. It is also the string "builtin", so code that passed that string keeps working (every
    entry point turns the string into the sentinel, see `as_target`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BUILTIN"

    def __reduce__(self) -> str:
        return "BUILTIN"  # unpickles as the module's one instance


BUILTIN = _Builtin("builtin")
"""Not a target name: forces an op's own implementations even where a target claims the device."""


def as_target(target: object) -> object:
    """`target` with the string "builtin" made the `BUILTIN` sentinel; anything else as given."""
    return BUILTIN if target == BUILTIN else target


def kernel_owner(op: type) -> type:
    """The op class whose kernel registrations `op` uses: its `kernels_of` (an op that is
    another op under upstream's name and defaults, `GemmFwdOp`), else itself."""
    return getattr(op, "kernels_of", None) or op


@dataclass(frozen=True)
class Registration:
    """A kernel class added to an op under a key, and who added it."""

    op: type
    key: str
    cls: type
    source: Source


@dataclass(frozen=True)
class Detector:
    target: str
    detect: Callable[[torch.device], bool]
    source: Source

    def claims(self, device: torch.device) -> bool:
        """Whether the target claims `device`; a detector that raises or answers anything but
        a bool is the backend's bug, reported as such rather than read as a claim."""
        try:
            answer = self.detect(device)
        except Exception as exc:
            raise BackendError(
                f"the detector of target {self.target!r} ({self.source}) raised "
                f"{type(exc).__name__}: {exc} when asked about {device}",
                target=self.target,
                source=self.source,
            ) from exc
        if not isinstance(answer, bool):
            raise BackendError(
                f"the detector of target {self.target!r} ({self.source}) returned {answer!r} "
                f"({type(answer).__name__}) for {device}; a detector must return a bool, True "
                "to claim the device",
                target=self.target,
                source=self.source,
            )
        return answer


@dataclass(frozen=True)
class Builder:
    op: type
    target: str
    build_kernel: Callable[..., Callable[..., Any]]
    source: Source


@dataclass(frozen=True)
class DefaultTarget:
    target: str | None
    source: Source


@dataclass
class _Transaction:
    log: list[tuple[tuple, Any, Any]] = field(default_factory=list)  # (slot, old, new)
    source: Source | None = None  # undo only the entries of this source (a backend's load)

    def owns(self, entry: Any) -> bool:
        """Whether undoing may touch the change that put `entry` in; a removal (None) only an
        unfiltered transaction undoes."""
        return self.source is None or getattr(entry, "source", None) == self.source


_active: contextvars.ContextVar[_Transaction | None] = contextvars.ContextVar(
    "tileops_registry_transaction", default=None
)
_DEFAULT = ("default",)


class Registry:
    """The single registry instance lives in `REGISTRY`; ops and the backend API share it."""

    def __init__(self) -> None:
        self._slots: dict[tuple, Any] = {}
        self.generation = 0
        self.known_ops: dict[str, type] = {}  # unique op name -> op class
        self.lock = threading.RLock()
        self._closed: dict[Source, Callable[[tuple], Exception]] = {}  # source -> its refusal

    # -- ops -----------------------------------------------------------------------------------
    def add_op(self, op_cls: type) -> None:
        """Record a newly defined op class under its unique name. A class defined again in the
        same module (a reload) replaces the old one; another module taking the name is refused."""
        name = op_cls.op_name
        with self.lock:
            existing = self.known_ops.get(name)
            if existing is not None and existing.__module__ != op_cls.__module__:
                raise OpDefinitionError(
                    f"op name {name!r} of {op_cls.__module__}.{op_cls.__qualname__} is already "
                    f"taken by {existing.__module__}.{existing.__qualname__}; declare another "
                    "`namespace` on one of the two classes"
                )
            self.known_ops[name] = op_cls

    def op_class(self, op: type | str) -> type:
        """The op class `op` names: a known op class, its unique name, or an unambiguous short
        name (the class name alone)."""
        if isinstance(op, type):
            if self.known_ops.get(getattr(op, "op_name", None)) is op:
                return op
            raise UnknownOpError(f"{op!r} is not a known op class; ops subclass tileops.Op")
        if not isinstance(op, str):
            raise UnknownOpError(f"an op is named by its class or a str, got {op!r}")
        if op in self.known_ops:
            return self.known_ops[op]
        matches = sorted(n for n in self.known_ops if n.rpartition("::")[2] == op)
        if len(matches) == 1:
            return self.known_ops[matches[0]]
        if matches:
            raise UnknownOpError(
                f"op name {op!r} is ambiguous: it could be {', '.join(matches)}; "
                "use the full name or pass the op class"
            )
        close = difflib.get_close_matches(op, self._short_names(), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownOpError(
            f"{op!r} is not a known op.{hint} Known ops: {', '.join(sorted(self.known_ops))}"
        )

    def _short_names(self) -> list[str]:
        return sorted({n.rpartition("::")[2] for n in self.known_ops} | set(self.known_ops))

    # -- reads -------------------------------------------------------------------------------
    def kernel_types(self, op: type) -> dict[str, Registration]:
        owner = kernel_owner(op)
        return {s[2]: r for s, r in list(self._slots.items()) if s[0] == "kernel" and s[1] is owner}

    @property
    def detectors(self) -> dict[str, Detector]:
        return {s[1]: d for s, d in list(self._slots.items()) if s[0] == "detector"}

    def builder(self, op: type, target: str) -> Builder | None:
        return self._slots.get(("builder", op, target))

    def rules(self) -> list[Any]:
        """The operator's rules made through the API (tileops.prefer), in no special order."""
        return [r for s, r in list(self._slots.items()) if s[0] == "rule"]

    def builders(self) -> list[Builder]:
        return [b for s, b in list(self._slots.items()) if s[0] == "builder"]

    @property
    def default_target(self) -> str | None:
        default = self._slots.get(_DEFAULT)
        return None if default is None else default.target

    @property
    def default(self) -> DefaultTarget | None:
        """The process default target and who set it, if anyone did."""
        return self._slots.get(_DEFAULT)

    def ops_without_builder(self, target: str) -> list[str]:
        """Names of the ops that settle targets (those with a signature) for which `target` has
        no builder: calls of them settled on `target` raise OpNotAvailableError."""
        return sorted(
            name
            for name, op_cls in self.known_ops.items()
            if op_cls.signature is not None and self.builder(op_cls, target) is None
        )

    def targets(self) -> list[str]:
        named = set(self.detectors) | {b.target for b in self.builders()}
        return sorted(named)

    # -- writes ------------------------------------------------------------------------------
    def add(self, slot: tuple, entry: Any, clash: Callable[[Any], Exception]) -> RegistrationHandle:
        """Put `entry` in the empty `slot`, or raise `clash(existing)`; the handle undoes it."""
        with self.lock:
            self._admit(slot, entry.source)
            existing = self._slots.get(slot)
            if existing is not None:
                raise clash(existing)
            self._set(slot, entry)
        return RegistrationHandle(self, slot, entry)

    def remove(self, slot: tuple, entry: Any) -> bool:
        """Empty `slot` if it still holds `entry` (a registration's handle undoing it): what
        replaced it meanwhile stays. Returns whether it did."""
        with self.lock:
            if self._slots.get(slot) is not entry:
                return False
            self._set(slot, None)
            return True

    def set_default_target(self, target: str | None, source: Source) -> None:
        with self.lock:
            self._admit(_DEFAULT, source)
            self._set(_DEFAULT, DefaultTarget(as_target(target), source))

    def withdraw_kernel_types(self, op: type) -> None:
        """Remove every kernel type backends registered for `op`; for use inside a transaction
        (the conformance check computes expected values with the op's own kernels only)."""
        with self.lock:
            for key in self.kernel_types(op):
                self._set(("kernel", kernel_owner(op), key), None)

    def withdraw_source(self, source: Source) -> int:
        """Remove everything `source` registered (from any thread); returns how many."""
        with self.lock:
            slots = [s for s, entry in self._slots.items() if entry.source == source]
            for slot in slots:
                self._set(slot, None)
            return len(slots)

    def close_source(self, source: Source, refusal: Callable[[tuple], Exception]) -> int:
        """Withdraw everything `source` registered and refuse what it registers later (a thread
        of a backend that failed to load): each such registration raises `refusal(slot)`."""
        with self.lock:
            self._closed[source] = refusal
            return self.withdraw_source(source)

    def _admit(self, slot: tuple, source: Source) -> None:
        refusal = self._closed.get(source)
        if refusal is not None:
            raise refusal(slot)

    def bump(self) -> None:
        """Mark the tables stale without a registration (an operator rule changed)."""
        with self.lock:
            self.generation += 1

    def _set(self, slot: tuple, entry: Any) -> None:
        old = self._slots.get(slot)
        if entry is None:
            self._slots.pop(slot, None)
        else:
            self._slots[slot] = entry
        self.generation += 1
        transaction = _active.get()
        if transaction is not None:
            transaction.log.append((slot, old, entry))

    @contextlib.contextmanager
    def transaction(
        self, *, always_undo: bool = False, source: Source | None = None
    ) -> Iterator[None]:
        """Undo the changes made in this context inside the block if it raises (or always, when
        asked). Changes made by other threads meanwhile are left alone; given a `source`, so are
        the entries of other sources (a backend whose import imports another backend's module
        undoes its own registrations only)."""
        outer = _active.get()
        transaction = _Transaction(source=source)
        token = _active.set(transaction)
        try:
            yield
        except BaseException:
            kept = self._undo(transaction)
            if outer is not None:  # what it left alone is still the outer one's to undo
                outer.log.extend(kept)
            raise
        finally:
            _active.reset(token)
        if always_undo:
            self._undo(transaction)
        elif outer is not None:
            outer.log.extend(transaction.log)

    def _undo(self, transaction: _Transaction) -> list[tuple[tuple, Any, Any]]:
        """Undo the changes `transaction` owns; return those it left alone."""
        kept = []
        with self.lock:
            for change in reversed(transaction.log):
                slot, old, new = change
                if not transaction.owns(new):
                    kept.append(change)
                elif self._slots.get(slot) is new:  # nobody changed it since: put back the old
                    if old is None:
                        self._slots.pop(slot, None)
                    else:
                        self._slots[slot] = old
            self.generation += 1
        return kept[::-1]


class RegistrationHandle:
    """What a registration returns: `handle.remove()` undoes it, and so does the end of a
    `with handle:` block (as torch.library's RegistrationHandle). Like any registry change it
    reaches op instances constructed afterwards. Removing twice does nothing, and so does
    removing what a failed backend's withdrawal or an ended transaction took back already."""

    def __init__(self, registry: Registry, slot: tuple, entry: Any) -> None:
        self._registry, self._slot, self._entry = registry, slot, entry

    @property
    def registered(self) -> bool:
        """Whether the registration is still in force."""
        return self._registry._slots.get(self._slot) is self._entry

    def remove(self) -> None:
        """Undo the registration, if it is still in force."""
        self._registry.remove(self._slot, self._entry)

    def __enter__(self) -> RegistrationHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "registered" if self.registered else "removed"
        return f"<RegistrationHandle {describe_slot(self._slot)} by {self._entry.source}: {state}>"


def describe_slot(slot: tuple) -> str:
    """What a slot registers, in words."""
    kind = slot[0]
    if kind == "kernel":
        return f"kernel key {slot[2]!r} of {slot[1].op_name}"
    if kind == "detector":
        return f"the detector of target {slot[1]!r}"
    if kind == "builder":
        return f"the builder of target {slot[2]!r} for {slot[1].op_name}"
    if kind == "rule":
        return f"the rule {slot[1]}"
    return "the default target"


REGISTRY = Registry()
