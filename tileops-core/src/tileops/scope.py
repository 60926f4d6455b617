"""Scopes: what the `with` blocks around the current thread or task ask of dispatch (pins,
records, device simulations), and which cache each live op's hits read because of them.

While no such block is active anywhere, op instances read their plain hit cache: the hit path
pays nothing for pins, records or simulations that nobody uses.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .device import SIMULATED, on_simulation_end, on_simulation_start


@dataclass(frozen=True)
class Scope:
    """What the `with` blocks around the current context ask of dispatch."""

    pins: dict[tuple[type, str], str]
    records: tuple[Any, ...]


SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("tileops_scope", default=None)
"""The scope of the current thread or task; None (the usual case) when no block asks anything."""


Variant = tuple[Any, Any]
"""(pinned key, device simulation) a context asks for one call: selections made under either
are kept apart from the plain ones, which every other context shares."""


def variant(
    op_cls: type, interface: str, call: Any, scope: Scope | None, simulations: Mapping
) -> Variant | None:
    """What the context asks of dispatch for this call, or None when it asks nothing."""
    pin = scope.pins.get((op_cls, interface)) if scope is not None else None
    simulation = simulations.get(getattr(call, "device", None)) if simulations else None
    return None if pin is None and simulation is None else (pin, simulation)


def current_variant(op_cls: type, interface: str, call: Any) -> Variant | None:
    """`variant` in the current thread or task."""
    return variant(op_cls, interface, call, SCOPE.get(), SIMULATED.get())


def current_pin(op_cls: type, interface: str) -> str | None:
    """The key a `pinned` block of the current context pins on `op_cls`'s `interface`."""
    scope = SCOPE.get()
    return None if scope is None else scope.pins.get((op_cls, interface))


class HitReader(Protocol):
    """What `Scopes` switches: an object (an op) whose hits read either its plain cache or,
    while some scope is active anywhere, a reader that consults the caller's context."""

    def _point_hits(self, scoped: bool) -> None: ...


class Scopes:
    """Decides which cache each live op's hits read, so that a hit is one plain dict lookup
    while no pin, record or simulation is active anywhere: the op's plain cache of the current
    determinism mode, or, while some is active, one that consults the caller's context.

    Switching happens on the first and last scope, and when torch's determinism flag changes
    through `torch.use_deterministic_algorithms` (watched: torch offers no callback). The
    readers point their hits themselves (`_point_hits`): the caches are theirs."""

    def __init__(self) -> None:
        self.active = 0
        self.lock = threading.Lock()
        self.readers: weakref.WeakSet[HitReader] = weakref.WeakSet()

    def attach(self, reader: HitReader) -> None:
        """Point `reader`'s hits for the current state now and on every switch (called at its
        construction)."""
        with self.lock:
            self.readers.add(reader)
            reader._point_hits(self.active > 0)

    @contextlib.contextmanager
    def enter(self, **changes: Any) -> Iterator[Scope]:
        outer = SCOPE.get() or Scope({}, ())
        scope = Scope(
            {**outer.pins, **changes.get("pins", {})}, outer.records + changes.get("records", ())
        )
        token = SCOPE.set(scope)
        try:
            with self.counted():
                yield scope
        finally:
            SCOPE.reset(token)

    @contextlib.contextmanager
    def resume(self, scope: Scope | None) -> Iterator[None]:
        """Run inside `scope`, captured in another context: an op call's, for its backward,
        which autograd runs in a thread of its own on GPUs, where the caller's context is not
        visible. Without one, the current context stays."""
        if scope is None or SCOPE.get() is scope:
            yield
            return
        token = SCOPE.set(scope)
        try:
            with self.counted():
                yield
        finally:
            SCOPE.reset(token)

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """While inside, every op's hits consult their context."""
        self.count(+1)
        try:
            yield
        finally:
            self.count(-1)

    def count(self, delta: int) -> None:
        """Some context starts (+1) or stops (-1) asking something of dispatch (a pin, a
        record, a device simulation); the first and the last switch every reader."""
        with self.lock:
            before = self.active
            self.active += delta
            if (before == 0) != (self.active == 0):
                self._point_all()

    def refresh(self) -> None:
        """Point every live reader at the caches of the current state (the determinism flag)."""
        with self.lock:
            self._point_all()

    def _point_all(self) -> None:
        for reader in list(self.readers):
            reader._point_hits(self.active > 0)


SCOPES = Scopes()


def _watch_determinism() -> None:
    """Wrap torch.use_deterministic_algorithms so that flipping it re-points op caches: the
    switch takes effect on the next call, at no cost to hits."""
    original = torch.use_deterministic_algorithms
    if getattr(original, "_tileops_watched", False):
        return

    @functools.wraps(original)
    def use_deterministic_algorithms(*args: Any, **kwargs: Any) -> None:
        before = torch._C._get_deterministic_algorithms()
        original(*args, **kwargs)
        if torch._C._get_deterministic_algorithms() != before:  # Dynamo re-sets it per frame
            SCOPES.refresh()  # it compiles, some inside SCOPES.lock: only a flip may take it

    use_deterministic_algorithms._tileops_watched = True
    torch.use_deterministic_algorithms = use_deterministic_algorithms


_watch_determinism()
on_simulation_start(lambda simulation: SCOPES.count(+1))
on_simulation_end(lambda simulation: SCOPES.count(-1))
