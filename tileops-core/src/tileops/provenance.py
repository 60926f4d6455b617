"""Which distribution a piece of code came from, for messages that must name it."""

from __future__ import annotations

import contextvars
import functools
import sys
from dataclasses import dataclass

from importlib_metadata import packages_distributions


@dataclass(frozen=True)
class Source:
    """A distribution, and the entry point it was loaded through if any."""

    distribution: str
    entry_point: str | None = None

    def __str__(self) -> str:
        if self.entry_point is None:
            return self.distribution
        return f"{self.distribution}, entry point {self.entry_point!r}"


# Set by the backend loader while it imports an entry point's module: the source of
# registrations made by modules that belong to no entry point (a helper library a backend uses).
loading_source: contextvars.ContextVar[Source | None] = contextvars.ContextVar(
    "tileops_loading_source", default=None
)


# Module of each installed entry point -> its source, filled before any backend loads: a
# registration names the entry point whose module made it, whoever imported that module (another
# backend, the user) and from whichever thread.
_entry_point_modules: dict[str, Source] = {}


def remember_entry_point(module: str, source: Source) -> None:
    _entry_point_modules.setdefault(module, source)


def entry_point_of(module: str) -> Source | None:
    """The entry point `module` belongs to: the one whose module is `module` or a package above
    it, else the only one in its top-level package (or, of several, the one loading now)."""
    name = module
    while name:
        if name in _entry_point_modules:
            return _entry_point_modules[name]
        name = name.rpartition(".")[0]
    top = module.partition(".")[0]
    sources = {s for m, s in _entry_point_modules.items() if m.partition(".")[0] == top}
    if len(sources) == 1:
        return sources.pop()
    loading = loading_source.get()
    return loading if loading in sources else None


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return packages_distributions()


def source_of_module(module: str) -> Source:
    """The entry point or distribution that ships `module`, or the module's own name if none."""
    source = entry_point_of(module)
    if source is not None:
        return source
    dists = _distributions().get(module.partition(".")[0])
    if not dists:
        return Source(f"module {module}")
    return Source(sorted(set(dists))[0])


def caller_source(depth: int = 2) -> Source:
    """Where a registration comes from: the entry point whose module made it; for a module of
    no entry point, the backend being loaded, else the module's distribution.

    Frames of tileops itself are skipped, so a registration that `tileops.testing` makes for a
    test names the test, not tileops-core.
    """
    frame = sys._getframe(depth)
    while frame.f_back is not None and _is_core(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "?")
    return entry_point_of(module) or loading_source.get() or source_of_module(module)


def _is_core(module: str) -> bool:
    return module == "tileops" or module.startswith("tileops.")
