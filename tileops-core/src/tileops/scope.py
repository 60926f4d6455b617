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
from typing import TYPE_CHECKING, Any

import torch

from .device import NO_SIMULATIONS, SIMULATED

if TYPE_CHECKING:
    from .op import Op


@dataclass(frozen=True)
class Scope:
    """What the `with` blocks around the current context ask of dispatch."""

    pins: dict[tuple[type, str], str]
    records: tuple[Any, ...]


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("tileops_scope", default=None)


class ScopedHits:
    """Stands in for an op's hit cache while some pin, record or device simulation is active in
    the process: a hit then consults the current context's (and the plain cache when it has
    none of them)."""

    def __init__(self, op: Op) -> None:
        self.op = op

    def get(self, key: tuple) -> Any:
        table = self.op._table
        det = torch._C._get_deterministic_algorithms()
        scope, simulations = _scope.get(), SIMULATED.get()
        if scope is None and simulations is NO_SIMULATIONS:
            return table.modes[det][0].get(key)
        return table.scoped_hit(key, scope, simulations, det)


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
    return variant(op_cls, interface, call, _scope.get(), SIMULATED.get())


class Scopes:
    """Decides which cache each live op's hits read, so that a hit is one plain dict lookup
    while no pin, record or simulation is active anywhere: the cache of the current determinism
    mode, or, while some is active, a `ScopedHits` that consults the caller's context.

    Switching happens on the first and last scope, and when torch's determinism flag changes
    through `torch.use_deterministic_algorithms` (watched: torch offers no callback)."""

    def __init__(self) -> None:
        self.active = 0
        self.lock = threading.Lock()
        self.ops: weakref.WeakSet[Op] = weakref.WeakSet()

    def attach(self, op: Op) -> None:
        """Give `op` the caches matching the current state (called at construction)."""
        with self.lock:
            self.ops.add(op)
            self._set(op)

    @contextlib.contextmanager
    def enter(self, **changes: Any) -> Iterator[Scope]:
        outer = _scope.get() or Scope({}, ())
        scope = Scope(
            {**outer.pins, **changes.get("pins", {})}, outer.records + changes.get("records", ())
        )
        token = _scope.set(scope)
        try:
            with self.counted():
                yield scope
        finally:
            _scope.reset(token)

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """While inside, every op's hits consult their context: some context (the caller's)
        asks something of dispatch (a pin, a record, a device simulation)."""
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)

    def _count(self, delta: int) -> None:
        with self.lock:
            before = self.active
            self.active += delta
            if (before == 0) != (self.active == 0):
                self._set_all()

    def refresh(self) -> None:
        """Point every live op at the caches of the current state (the determinism flag)."""
        with self.lock:
            self._set_all()

    def _set_all(self) -> None:
        for op in list(self.ops):
            self._set(op)

    def _set(self, op: Op) -> None:
        if self.active:
            op._hits = ScopedHits(op)
        else:
            op._hits = op._table.modes[torch._C._get_deterministic_algorithms()][0]


SCOPES = Scopes()


def _watch_determinism() -> None:
    """Wrap torch.use_deterministic_algorithms so that flipping it re-points op caches: the
    switch takes effect on the next call, at no cost to hits."""
    original = torch.use_deterministic_algorithms
    if getattr(original, "_tileops_watched", False):
        return

    @functools.wraps(original)
    def use_deterministic_algorithms(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        SCOPES.refresh()

    use_deterministic_algorithms._tileops_watched = True
    torch.use_deterministic_algorithms = use_deterministic_algorithms


_watch_determinism()


def current_pin(op_cls: type, interface: str) -> str | None:
    scope = _scope.get()
    return None if scope is None else scope.pins.get((op_cls, interface))
