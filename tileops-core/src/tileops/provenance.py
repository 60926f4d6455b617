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


@functools.lru_cache(maxsize=None)
def _distributions() -> dict[str, list[str]]:
    return packages_distributions()


def source_of_module(module: str) -> Source:
    """The distribution that ships `module`, or the module's own name if none does."""
    top = module.partition(".")[0]
    dists = _distributions().get(top)
    if not dists:
        return Source(f"module {module}")
    return Source(sorted(set(dists))[0])


def caller_source(depth: int = 2) -> Source:
    """Where a registration comes from: the backend being loaded, else the calling module."""
    loading = loading_source.get()
    if loading is not None:
        return loading
    module = sys._getframe(depth).f_globals.get("__name__", "?")
    return source_of_module(module)


def forget_distributions() -> None:
    """Drop the cached module -> distribution map (after installing distributions)."""
    _distributions.cache_clear()
