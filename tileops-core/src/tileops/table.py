"""An op class's validated kernel table, the per-call cache in front of it, and shared entries.

A table is built once per op class and registry generation, so every op instance constructed
under the same registrations shares its hit cache: 32 identical layers select once. Entries are
shared wider still, by every table of the op class, keyed by (interface, class, build identity).
Both caches are bounded: an op called with ever-new shapes keeps a flat memory footprint.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .backend.plugins import distributions_serving, failure_note
from .backend.registry import REGISTRY
from .call import CallSpec, check_fields
from .candidates import candidates_of
from .device import device_slot, on_simulation_change
from .errors import BackendError, add_note
from .explain import Explanation
from .selection import Candidate, Judgement, judge, outranking

if TYPE_CHECKING:
    from .op import Op

HIT_LIMIT = 4096
"""Calls remembered per op table. Past it the oldest quarter is forgotten: a forgotten call is
selected again on its next use (a miss, microseconds), while a hit stays one dict lookup."""

ENTRY_LIMIT = 1024
"""Built entries kept per op class, by build identity; the oldest quarter goes past it."""


class KernelTable:
    def __init__(self, op_cls: type[Op]) -> None:
        self.op = op_cls.op_name
        self.op_cls = op_cls
        self.candidates = candidates_of(op_cls, REGISTRY.kernel_types(op_cls))
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
        remember(self.keys, (interface, call), judgement.winner.key, HIT_LIMIT)
        return judgement.winner

    def resolve(self, interface: str, call: CallSpec) -> Callable[..., Any]:
        """The miss path: select, then build or reuse the entry, then cache it for hits."""
        winner = self.select(interface, call)
        entry = _shared_entry(self.op_cls, interface, winner, call)
        remember(self.hits, (interface, call), entry, HIT_LIMIT)
        return entry

    def serving(self, interface: str, call: CallSpec) -> str:
        """Which key (and distribution) serves `call`, for messages about its kernel's failures."""
        winner = self.judge(interface, call).winner
        key = f"kernel {winner.key!r} [{winner.source}]" if winner else "no kernel"
        return f"{key} serving {self.op}.{interface} for {call!r}"

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

    def forget_device(self, slot: tuple[str, int | None]) -> None:
        """Drop the selections made for calls on the device in `slot`, and only those."""
        for cache in (self.hits, self.keys):
            for key in [k for k in list(cache) if device_slot(k[1].device) == slot]:
                cache.pop(key, None)


def remember(cache: dict, key: Any, value: Any, limit: int) -> None:
    """`cache[key] = value`, first forgetting the oldest quarter when `cache` is full."""
    if len(cache) >= limit:
        for old in list(itertools.islice(cache, limit // 4)):
            cache.pop(old, None)
    cache[key] = value


def _shared_entry(op_cls: type[Op], interface: str, winner: Candidate, call: CallSpec) -> Any:
    where = f"building kernel {winner.key!r} [{winner.source}] for {op_cls.op_name}.{interface}"
    try:
        identity, build = winner.cls.entry_for(call)
    except Exception as exc:
        add_note(exc, f"raised by entry_for() while {where} for {call!r}")
        raise
    try:
        slot = (interface, winner.cls, identity)
        entry = op_cls._entries.get(slot)
    except TypeError as exc:
        raise BackendError(
            f"{op_cls.op_name}: kernel {winner.key!r} [{winner.source}] returned an unhashable "
            f"build identity {identity!r} from entry_for(); use a tuple of hashable values"
        ) from exc
    if entry is not None:
        return entry
    with op_cls._entries_lock:
        lock = op_cls._entry_locks.setdefault(slot, threading.Lock())
    with lock:
        entry = op_cls._entries.get(slot)
        if entry is None:
            try:
                entry = build()
            except Exception as exc:
                add_note(exc, f"raised while {where} (build identity {identity!r})")
                raise
            remember(op_cls._entries, slot, entry, ENTRY_LIMIT)
    with op_cls._entries_lock:
        op_cls._entry_locks.pop(slot, None)
    return entry


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


def _forget_selections(slot: tuple[str, int | None]) -> None:
    """Selections made under other facts of this device are stale once a simulation of it
    starts or ends; those for other devices stand."""
    for table in list(_live_tables):
        table.forget_device(slot)


on_simulation_change(_forget_selections)
