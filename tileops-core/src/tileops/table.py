"""An op class's validated kernel table, the per-call cache in front of it, and shared entries.

A table is built once per op class and registry generation, so every op instance constructed
under the same registrations shares its hit cache: 32 identical layers select once. Entries are
shared wider still, by every table of the op class, keyed by (interface, class, build identity).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .backend.plugins import distributions_serving, failure_note
from .backend.registry import REGISTRY
from .call import CallSpec, check_fields
from .device import on_simulation_change
from .errors import BackendError, KernelDeclarationError
from .explain import Explanation
from .kernel import Kernel, KernelInterface
from .provenance import Source, source_of_module
from .selection import Candidate, Judgement, find_cycle, judge, outranking

if TYPE_CHECKING:
    from .op import Op


class KernelTable:
    def __init__(self, op_cls: type[Op]) -> None:
        self.op = op_cls.__name__
        self.op_cls = op_cls
        self.candidates = _candidates(op_cls)
        self.outranks = {name: outranking(cands) for name, cands in self.candidates.items()}
        self.hits: dict[tuple[str, CallSpec], Callable[..., Any]] = {}
        self.keys: dict[tuple[str, CallSpec], str] = {}
        _live_tables.add(self)

    def judge(self, interface: str, call: CallSpec) -> Judgement:
        candidates = self.candidates.get(interface)
        if candidates is None:
            raise KeyError(
                f"{self.op} has no kernel interface {interface!r}; it has "
                f"{', '.join(sorted(self.candidates))}"
            )
        check_fields(call)
        return judge(self.op, interface, candidates, call, self.outranks[interface])

    def select(self, interface: str, call: CallSpec) -> Candidate:
        judgement = self.judge(interface, call)
        if judgement.winner is None:
            raise judgement.error(self.notes(call))
        self.keys[(interface, call)] = judgement.winner.key
        return judgement.winner

    def resolve(self, interface: str, call: CallSpec) -> Callable[..., Any]:
        """The miss path: select, then build or reuse the entry, then cache it for hits."""
        winner = self.select(interface, call)
        entry = _shared_entry(self.op_cls, interface, winner, call)
        self.hits[(interface, call)] = entry
        return entry

    def explain(self, interface: str, call: CallSpec) -> Explanation:
        judgement = self.judge(interface, call)
        error = None if judgement.winner else judgement.error(self.notes(call))
        return Explanation(judgement, self.candidates[interface], error)

    def notes(self, call: CallSpec) -> list[str]:
        serving = distributions_serving(call.device.type)
        device_note = (
            f"Installed backends that declare {call.device.type!r}: {', '.join(serving)}."
            if serving
            else f"No installed backend declares devices of type {call.device.type!r}."
        )
        return [device_note, failure_note()]


def _shared_entry(op_cls: type[Op], interface: str, winner: Candidate, call: CallSpec) -> Any:
    identity, build = winner.cls.entry_for(call)
    try:
        slot = (interface, winner.cls, identity)
        entry = op_cls._entries.get(slot)
    except TypeError as exc:
        raise BackendError(
            f"{op_cls.__name__}: kernel {winner.key!r} [{winner.source}] returned an unhashable "
            f"build identity {identity!r} from entry_for(); use a tuple of hashable values"
        ) from exc
    if entry is not None:
        return entry
    with op_cls._entries_lock:
        lock = op_cls._entry_locks.setdefault(slot, threading.Lock())
    with lock:
        entry = op_cls._entries.get(slot)
        if entry is None:
            entry = build()
            op_cls._entries[slot] = entry
    return entry


def _candidates(op_cls: type[Op]) -> dict[str, tuple[Candidate, ...]]:
    """Every key of the op, validated, grouped by the interfaces its class implements."""
    own_source = source_of_module(op_cls.__module__)
    keyed: dict[str, tuple[type, Source]] = {
        key: (cls, own_source) for key, cls in op_cls.kernel_types.items()
    }
    for key, reg in REGISTRY.kernel_types(op_cls.__name__).items():
        if key in keyed:
            raise KernelDeclarationError(
                f"{op_cls.__name__}: {reg.source} registers kernel key {key!r} "
                f"({reg.cls.__qualname__}), but backends cannot reuse keys it has "
                f"(already {keyed[key][0].__qualname__} from {keyed[key][1]}); pick another key"
            )
        keyed[key] = (reg.cls, reg.source)
    grouped: dict[str, list[Candidate]] = {name: [] for name in op_cls.interfaces}
    for key in sorted(keyed):
        cls, source = keyed[key]
        for name in _validate(op_cls, key, cls, source):
            grouped[name].append(Candidate(key, cls, str(source)))
    for name, cands in grouped.items():
        _validate_preferences(op_cls, name, cands)
    return {name: tuple(cands) for name, cands in grouped.items()}


def _validate(op_cls: type[Op], key: str, cls: Any, source: Source) -> list[str]:
    """The interfaces `cls` implements, after checking its declarations; raises otherwise."""
    where = (
        f"{op_cls.__name__}: kernel {key!r} ({getattr(cls, '__qualname__', cls)!r} from {source})"
    )
    if not (isinstance(cls, type) and issubclass(cls, Kernel)):
        raise KernelDeclarationError(f"{where} is not a subclass of tileops.Kernel")
    implemented = [n for n, iface in op_cls.interfaces.items() if issubclass(cls, iface)]
    if not implemented:
        raise KernelDeclarationError(
            f"{where} implements none of the op's interfaces "
            f"({', '.join(i.__name__ for i in op_cls.interfaces.values())}); inherit one of them"
        )
    for method in ("entry_for", "refusal"):
        if not isinstance(inspect.getattr_static(cls, method), classmethod):
            raise KernelDeclarationError(f"{where}: {method} must be a classmethod")
    _check_declarations(where, cls)
    for name in implemented:
        _check_forward(where, cls, op_cls.interfaces[name])
    return implemented


def _check_declarations(where: str, cls: type[Kernel]) -> None:
    if not (isinstance(cls.devices, frozenset) and all(isinstance(d, str) for d in cls.devices)):
        raise KernelDeclarationError(f"{where}: devices must be a set of device type names")
    archs = cls.supported_archs
    if archs is not None and not all(isinstance(a, int) and not isinstance(a, bool) for a in archs):
        raise KernelDeclarationError(
            f"{where}: supported_archs must be None or a set of integers such as 80, 90"
        )
    if not all(isinstance(k, str) for k in cls.preferred_over):
        raise KernelDeclarationError(f"{where}: preferred_over must be a set of kernel keys")
    if cls.general and cls.preferred_over:
        raise KernelDeclarationError(
            f"{where} is general and declares preferred_over "
            f"{sorted(cls.preferred_over)}; a general implementation ranks below every other, "
            "so it cannot be preferred over any"
        )


def _check_forward(where: str, cls: type, interface: type[KernelInterface]) -> None:
    contract = inspect.signature(interface.forward)
    actual = inspect.signature(cls.forward)
    params = list(contract.parameters.values())[1:]  # drop self
    positional = [
        object() for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    by_keyword = {
        p.name: object() for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    keyword_only = {p.name: object() for p in params if p.kind == p.KEYWORD_ONLY}
    for args, kwargs in ((positional, keyword_only), ([], by_keyword)):
        if any(p.kind == p.POSITIONAL_ONLY for p in params) and not args:
            continue
        try:
            actual.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise KernelDeclarationError(
                f"{where}: forward{actual} does not take the arguments of "
                f"{interface.__name__}.forward{contract} ({exc})"
            ) from None


def _validate_preferences(op_cls: type[Op], interface: str, cands: list[Candidate]) -> None:
    named = {c.key: f"{c.key} ({c.cls.__qualname__} from {c.source})" for c in cands}
    generals = [named[c.key] for c in cands if c.cls.general]
    if len(generals) > 1:
        raise KernelDeclarationError(
            f"{op_cls.__name__}.{interface}: more than one general implementation "
            f"({', '.join(generals)}); at most one may be the fallback"
        )
    cycle = find_cycle(cands)
    if cycle:
        raise KernelDeclarationError(
            f"{op_cls.__name__}.{interface}: preferred_over forms a cycle: "
            f"{' -> '.join(cycle)} ({', '.join(named[k] for k in sorted(set(cycle)))}); "
            "remove one of these preferences"
        )


def table_for(op_cls: type[Op]) -> KernelTable:
    """The table of `op_cls` for the current registrations, built on first need."""
    with _table_lock:
        cached = op_cls.__dict__.get("_table_cache")
        generation = REGISTRY.generation
        if cached is not None and cached[0] == generation:
            return cached[1]
        table = KernelTable(op_cls)
        op_cls._table_cache = (generation, table)
        return table


_table_lock = threading.Lock()
_live_tables: weakref.WeakSet[KernelTable] = weakref.WeakSet()


def _forget_selections() -> None:
    """Selections made under other device facts are stale once a simulation starts or ends."""
    for table in list(_live_tables):
        table.hits.clear()
        table.keys.clear()


on_simulation_change(_forget_selections)
