"""An op class's validated kernel table, the per-call cache in front of it, and shared entries.

A table is built once per op class and registry generation, so every op instance constructed
under the same registrations shares its hit cache: 32 identical layers select once. Entries are
shared wider still, by every table of the op class, keyed by (interface, class, build identity).
Both caches are bounded: an op called with ever-new shapes keeps a flat memory footprint.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from . import observe
from .callspec import CallSpec, check_fields
from .control import RULES, strict
from .device import NO_SIMULATIONS, SIMULATED, Simulation, on_simulation_end
from .errors import BackendError, KernelDeclarationError, NoImplementationError, add_note
from .explanation import Explanation
from .kernel_sets import candidates_of
from .plugins import distributions_serving, failure_note
from .record import record_call
from .registry import REGISTRY
from .scope import SCOPE, Scope, Variant, current_pin, current_variant
from .selection import REFUSED, Candidate, Judgement, Policy, find_cycle, judge, outranking

if TYPE_CHECKING:
    from .op import Op

LOG = logging.getLogger("tileops.dispatch")

HIT_LIMIT = 4096
"""Calls remembered per op table. Past it the oldest quarter is forgotten: a forgotten call is
selected again on its next use (a miss, microseconds), while a hit stays one dict lookup."""

ENTRY_LIMIT = 1024
"""Built entries kept per op class, by build identity; the oldest quarter goes past it."""

FALLBACK_WARNINGS = 16
FALLBACK_WINDOW = 60.0
"""At most FALLBACK_WARNINGS fallback warnings per op table in FALLBACK_WINDOW seconds: an op
called with ever-new shapes that all fall back must not flood the log."""

_now = time.monotonic


class KernelTable:
    def __init__(self, op_cls: type[Op]) -> None:
        self.op = op_cls.op_name
        self.op_cls = op_cls
        self.candidates = candidates_of(op_cls, REGISTRY.kernel_types(op_cls))
        self.sources = {
            name: {c.key: c.source for c in cands} for name, cands in self.candidates.items()
        }
        self.rules = RULES.for_op(
            op_cls, {i: {c.key for c in cs} for i, cs in self.candidates.items()}
        )
        self.outranks = {
            name: self._outranking(name, cands) for name, cands in self.candidates.items()
        }
        # whether a native lane (torch's forward, torch's backward) may serve autograd calls:
        # the forward's selection weighs the backward itself, or every backward kernel is the
        # op's general one or torch's own, so the lane passes over none a backend added
        self.native_lanes = op_cls.weighs_backward or all(
            c.cls.general or c.cls.torch_native for c in self.candidates.get("backward", ())
        )
        # Selections per determinism mode (torch.use_deterministic_algorithms off / on):
        # (hits, keys), each keyed by (interface, call).
        self.modes: dict[bool, tuple[dict, dict]] = {False: ({}, {}), True: ({}, {})}
        # Selections of contexts that pin or simulate, per variant (their pin, their
        # simulation) and determinism mode: (interface, call) -> (entry, key). A simulation's
        # go when it ends (forget_simulation).
        self.scoped: dict[Variant, tuple[dict, dict]] = {}
        self.fallbacks_seen: dict[tuple, None] = {}  # (interface, call, simulation); bounded
        self.fallback_log = FallbackLog(self.op)
        self.shared = shared_entries(op_cls)
        _live_tables.add(self)

    @property
    def hits(self) -> dict:
        return self.modes[False][0]

    @property
    def keys(self) -> dict:
        return self.modes[False][1]

    def hits_for(self, scoped: bool) -> dict | ScopedHits:
        """What an op's hits read: the plain cache of the current determinism mode, or, while
        some pin, record or simulation is active anywhere (`scoped`), a reader that consults the
        caller's context (see scope.Scopes)."""
        return ScopedHits(self) if scoped else self.modes[deterministic_mode()][0]

    def _outranking(self, interface: str, cands: tuple[Candidate, ...]) -> dict:
        edges = self.rules[interface].edges
        cycle = find_cycle(cands, edges)
        if cycle:
            origins = sorted({edges[e] for e in zip(cycle, cycle[1:], strict=False) if e in edges})
            raise KernelDeclarationError(
                f"{self.op}.{interface}: the operator's preferences ({', '.join(origins)}) and "
                f"the kernels' preferred_over form a cycle: {' -> '.join(cycle)}; drop one",
                op=self.op,
                interface=interface,
            )
        return outranking(cands, edges)

    def judge(
        self, interface: str, call: CallSpec, *, pin: str | None = None, det: bool | None = None
    ) -> Judgement:
        candidates = self.candidates.get(interface)
        if candidates is None:
            raise KeyError(
                f"{self.op} has no kernel interface {interface!r}; it has "
                f"{', '.join(sorted(self.candidates))}"
            )
        check_fields(call)
        rules = self.rules[interface]
        policy = Policy(
            denied=rules.denied,
            pin=(pin, "tileops.pinned()") if pin else rules.pin,
            deterministic=deterministic_mode() if det is None else det,
            edges=rules.edges,
        )
        return judge(self.op, interface, candidates, call, self.outranks[interface], policy)

    def select(self, interface: str, call: CallSpec) -> Candidate:
        pin, det = current_pin(self.op_cls, interface), deterministic_mode()
        judgement = self.judge(interface, call, pin=pin, det=det)
        if judgement.winner is None:
            raise judgement.error(self.notes(call))
        self._check_fallback(judgement)
        if current_variant(self.op_cls, interface, call) is None:
            remember(self.modes[det][1], (interface, call), judgement.winner.key, HIT_LIMIT)
        return judgement.winner

    def resolve(self, interface: str, call: CallSpec) -> Callable[..., Any]:
        """The miss path: select, then build or reuse the entry, then cache it for hits. Every
        decision is reported here and only here (log line, hook: observe.py); hits never are."""
        try:
            winner = self.select(interface, call)
        except observe.DISPATCH_ERRORS as exc:
            observe.decided(self.op, interface, call, None, exc)
            raise
        observe.decided(self.op, interface, call, winner, None)
        entry = self.shared.entry(self.op, interface, winner, call)
        asked, det = current_variant(self.op_cls, interface, call), deterministic_mode()
        if asked is None:
            remember(self.modes[det][0], (interface, call), entry, HIT_LIMIT)
        else:
            cache = self.scoped.setdefault(asked, ({}, {}))[det]
            remember(cache, (interface, call), (entry, winner.key), HIT_LIMIT)
        record_call(self, interface, call, winner.key)
        return entry

    def scoped_hit(
        self, key: tuple, scope: Scope | None, simulations: Mapping, det: bool
    ) -> Callable[..., Any] | None:
        """A hit while pins, records or simulations are active somewhere: what this context
        asks for the call (its pin, its simulation of the call's device) decides the cache,
        and its records count the call."""
        interface, call = key
        pin = scope.pins.get((self.op_cls, interface)) if scope is not None else None
        simulation = simulations.get(getattr(call, "device", None)) if simulations else None
        asked = None if pin is None and simulation is None else (pin, simulation)  # = variant()
        if asked is None:
            entry, served = self.modes[det][0].get(key), self.modes[det][1].get(key)
        else:
            caches = self.scoped.get(asked)
            entry, served = caches[det].get(key, (None, None)) if caches else (None, None)
        if entry is not None and scope is not None and scope.records:
            record_call(self, interface, call, served)
        return entry

    def _check_fallback(self, judgement: Judgement) -> None:
        """A GPU call that only the general fallback serves, because every specialised kernel
        refused it: say so once per call spec (within limits: FallbackLog), or refuse under
        TILEOPS_STRICT."""
        winner, call = judgement.winner, judgement.call
        if call.device.type != "cuda" or not winner.cls.general:
            return
        refused = [v for v in judgement.verdicts if v.status == REFUSED]
        if not refused:
            return
        reasons = "; ".join(f"{v.key} [{v.source}]: {v.reason}" for v in refused)
        message = (
            f"{self.op}.{judgement.interface}: only the general fallback {winner.key!r} serves "
            f"{call!r}; the specialised kernels refused it: {reasons}"
        )
        if strict():
            raise NoImplementationError(
                f"TILEOPS_STRICT is on: {message}",
                op=self.op,
                interface=judgement.interface,
                call=call,
                key=winner.key,
                source=winner.source,
                verdicts=judgement.verdicts,
            )
        # A simulation's fallbacks are its own: they must not silence the real device's.
        seen = (judgement.interface, call, SIMULATED.get().get(call.device))
        if seen not in self.fallbacks_seen:
            remember(self.fallbacks_seen, seen, None, HIT_LIMIT)
            self.fallback_log.warn(message)

    def serving(self, interface: str, call: CallSpec) -> str:
        """Which key (and distribution) serves `call`, for messages about its kernel's failures."""
        winner = self.judge(interface, call).winner
        key = f"kernel {winner.key!r} [{winner.source}]" if winner else "no kernel"
        return f"{key} serving {self.op}.{interface} for {call!r}"

    def serving_fields(self, interface: str, call: CallSpec) -> dict[str, Any]:
        """The error fields naming the kernel that serves `call` (see errors.TileOpsError)."""
        winner = self.judge(interface, call).winner
        key, source = (winner.key, winner.source) if winner else (None, None)
        return {"op": self.op, "interface": interface, "call": call, "key": key, "source": source}

    def explain(self, interface: str, call: CallSpec) -> Explanation:
        judgement = self.judge(interface, call, pin=current_pin(self.op_cls, interface))
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

    def forget_simulation(self, simulation: Simulation) -> None:
        """Drop the selections made under `simulation`, and only those."""
        for asked in [a for a in list(self.scoped) if a[1] is simulation]:
            self.scoped.pop(asked, None)


class FallbackLog:
    """The fallback warnings of one op table, at most FALLBACK_WARNINGS per FALLBACK_WINDOW
    seconds; the first one of a later window says how many were left out before it."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.window_start = -FALLBACK_WINDOW
        self.logged = self.left_out = 0

    def warn(self, message: str) -> None:
        now = _now()
        if now - self.window_start >= FALLBACK_WINDOW:
            if self.left_out:
                LOG.warning(
                    "%s: %d more calls served only by the general fallback were not logged",
                    self.op,
                    self.left_out,
                )
            self.window_start, self.logged, self.left_out = now, 0, 0
        if self.logged >= FALLBACK_WARNINGS:
            self.left_out += 1
            return
        self.logged += 1
        LOG.warning(message)
        if self.logged == FALLBACK_WARNINGS:
            LOG.warning(
                "%s: %d calls served only by the general fallback were logged in %.0f s; further "
                "ones in that time are counted, not logged (tileops explain shows a call's "
                "refusals; TILEOPS_STRICT=1 makes them raise)",
                self.op,
                FALLBACK_WARNINGS,
                FALLBACK_WINDOW,
            )


def remember(cache: dict, key: Any, value: Any, limit: int) -> None:
    """`cache[key] = value`, first forgetting the oldest quarter when `cache` is full."""
    if len(cache) >= limit:
        for old in list(itertools.islice(cache, limit // 4)):
            cache.pop(old, None)
    cache[key] = value


class SharedEntries:
    """The built entries of one op class, shared by every table of it (every registry
    generation), keyed by (interface, kernel class, build identity); a lock per identity being
    built, so concurrent misses on one call build once and different builds never wait."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}
        self.locks: dict[tuple, threading.Lock] = {}
        self.lock = threading.Lock()  # guards `locks`

    def entry(self, op: str, interface: str, winner: Candidate, call: CallSpec) -> Any:
        """The entry `winner` builds for `call`: reused, or built once and kept."""
        where = f"building kernel {winner.key!r} [{winner.source}] for {op}.{interface}"
        try:
            identity, build = winner.cls.entry_for(call)
        except Exception as exc:
            add_note(exc, f"raised by entry_for() while {where} for {call!r}")
            raise
        try:
            slot = (interface, winner.cls, identity)
            entry = self.entries.get(slot)
        except TypeError as exc:
            raise BackendError(
                f"{op}: kernel {winner.key!r} [{winner.source}] returned an unhashable "
                f"build identity {identity!r} from entry_for(); use a tuple of hashable values",
                op=op,
                interface=interface,
                call=call,
                key=winner.key,
                source=winner.source,
            ) from exc
        if entry is not None:
            return entry
        with self.lock:
            lock = self.locks.setdefault(slot, threading.Lock())
        seconds = None
        with lock:
            entry = self.entries.get(slot)
            if entry is None:
                started = observe.clock()
                try:
                    entry = build()
                except Exception as exc:
                    add_note(exc, f"raised while {where} (build identity {identity!r})")
                    raise
                seconds = observe.clock() - started
                remember(self.entries, slot, entry, ENTRY_LIMIT)
        with self.lock:
            self.locks.pop(slot, None)
        if seconds is not None:  # reported once per build, outside the lock other threads wait on
            observe.built(op, interface, winner, identity, seconds)
        return entry


class ScopedHits:
    """Stands in for an op's hit cache while some pin, record or device simulation is active in
    the process: a hit then consults the current context's (and the plain cache when it has
    none of them)."""

    def __init__(self, table: KernelTable) -> None:
        self.table = table

    def get(self, key: tuple) -> Any:
        table = self.table
        det = torch._C._get_deterministic_algorithms()
        scope, simulations = SCOPE.get(), SIMULATED.get()
        if scope is None and simulations is NO_SIMULATIONS:
            return table.modes[det][0].get(key)
        return table.scoped_hit(key, scope, simulations, det)


def deterministic_mode() -> bool:
    """Whether torch.use_deterministic_algorithms(True) is on (a C call, no lock)."""
    return torch._C._get_deterministic_algorithms()


def table_for(op_cls: type[Op]) -> KernelTable:
    """The table of `op_cls` for the current registrations, built on first need."""
    with _table_lock:
        cached = _tables.get(op_cls)
        generation = REGISTRY.generation
        if cached is not None and cached[0] == generation:
            return cached[1]
        table = KernelTable(op_cls)
        _tables[op_cls] = (generation, table)
        return table


def shared_entries(op_cls: type[Op]) -> SharedEntries:
    """The built entries of `op_cls`, made on first need."""
    with _shared_lock:
        shared = _shared.get(op_cls)
        if shared is None:
            shared = _shared[op_cls] = SharedEntries()
        return shared


# Per op class, for the process, as the registry keeps the op classes themselves.
_table_lock = threading.Lock()
_tables: dict[type, tuple[int, KernelTable]] = {}  # op class -> (generation, its table)
_shared_lock = threading.Lock()
_shared: dict[type, SharedEntries] = {}
_live_tables: weakref.WeakSet[KernelTable] = weakref.WeakSet()


def _forget_simulation(simulation: Simulation) -> None:
    """What was selected under a simulation serves nobody once it ends; selections made
    elsewhere (other contexts, other devices) never depended on it and stand."""
    for table in list(_live_tables):
        table.forget_simulation(simulation)


on_simulation_end(_forget_simulation)
