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


# Set by the backend loader while it imports an entry point's module.
loading_source: contextvars.ContextVar[Source | None] = contextvars.ContextVar(
    "tileops_loading_source", default=None
)


# Top-level module of each entry point the loader imported -> its source. A registration made
# outside the loader by such a module (imported directly, or registering later) still names its
# entry point.
_entry_point_modules: dict[str, Source] = {}


def remember_entry_point(module: str, source: Source) -> None:
    _entry_point_modules.setdefault(module.partition(".")[0], source)


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return packages_distributions()


def source_of_module(module: str) -> Source:
    """The distribution that ships `module`, or the module's own name if none does."""
    top = module.partition(".")[0]
    if top in _entry_point_modules:
        return _entry_point_modules[top]
    dists = _distributions().get(top)
    if not dists:
        return Source(f"module {module}")
    return Source(sorted(set(dists))[0])


def caller_source(depth: int = 2) -> Source:
    """Where a registration comes from: the backend being loaded, else the calling module.

    Frames of tileops itself are skipped, so a registration that `tileops.testing` makes for a
    test names the test, not tileops-core.
    """
    loading = loading_source.get()
    if loading is not None:
        return loading
    frame = sys._getframe(depth)
    while frame.f_back is not None and _is_core(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return source_of_module(frame.f_globals.get("__name__", "?"))


def _is_core(module: str) -> bool:
    return module == "tileops" or module.startswith("tileops.")
