"""The process-wide tables that backends write: kernel types, detectors, builders, default target.

Every change bumps `generation`, so op classes know to rebuild their kernel tables. Changes can
be grouped in a transaction that restores the previous tables if anything inside fails: that is
how a backend that fails halfway through its import leaves no trace.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import BackendError, UnknownOpError
from ..provenance import Source

BUILTIN = "builtin"
"""Target name that forces an op's own implementations even where a target claims the device."""


@dataclass(frozen=True)
class Registration:
    """A kernel class added to an op under a key, and who added it."""

    op: str
    key: str
    cls: type
    source: Source


@dataclass(frozen=True)
class Detector:
    target: str
    detect: Callable[[torch.device], bool]
    source: Source


@dataclass(frozen=True)
class Builder:
    op: str
    target: str
    build_kernel: Callable[..., Callable[..., Any]]
    source: Source


@dataclass
class _Tables:
    kernel_types: dict[str, dict[str, Registration]] = field(default_factory=dict)
    detectors: dict[str, Detector] = field(default_factory=dict)
    builders: dict[tuple[str, str], Builder] = field(default_factory=dict)
    default_target: str | None = None


class Registry:
    """The single registry instance lives in `REGISTRY`; ops and the backend API share it."""

    def __init__(self) -> None:
        self._tables = _Tables()
        self.generation = 0
        self.known_ops: dict[str, type] = {}
        self.lock = threading.RLock()

    # -- reads -------------------------------------------------------------------------------
    def kernel_types(self, op: str) -> dict[str, Registration]:
        return dict(self._tables.kernel_types.get(op, {}))

    @property
    def detectors(self) -> dict[str, Detector]:
        return dict(self._tables.detectors)

    def builder(self, op: str, target: str) -> Builder | None:
        return self._tables.builders.get((op, target))

    @property
    def default_target(self) -> str | None:
        return self._tables.default_target

    def targets(self) -> list[str]:
        named = set(self._tables.detectors) | {t for _, t in self._tables.builders}
        return sorted(named)

    def op_name(self, op: type | str) -> str:
        """The registered name of `op`, or `UnknownOpError` naming the closest ones."""
        name = op.__name__ if isinstance(op, type) else op
        if not isinstance(name, str) or name not in self.known_ops:
            close = difflib.get_close_matches(str(name), self.known_ops, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UnknownOpError(
                f"{name!r} is not a known op.{hint} Known ops: {', '.join(sorted(self.known_ops))}"
            )
        return name

    # -- writes ------------------------------------------------------------------------------
    def add_kernel_type(self, registration: Registration) -> None:
        with self.lock:
            keys = self._tables.kernel_types.setdefault(registration.op, {})
            existing = keys.get(registration.key)
            if existing is not None:
                raise BackendError(
                    f"kernel key {registration.key!r} of {registration.op} is registered twice: "
                    f"by {existing.source} ({existing.cls.__qualname__}) and by "
                    f"{registration.source} ({registration.cls.__qualname__}); keys must be "
                    "unique per op, so one backend must rename its key"
                )
            keys[registration.key] = registration
            self.generation += 1

    def withdraw_kernel_types(self, op: str) -> None:
        """Remove every kernel type backends registered for `op`; for use inside a transaction
        (the conformance check computes expected values with the op's own kernels only)."""
        with self.lock:
            if self._tables.kernel_types.pop(op, None) is not None:
                self.generation += 1

    def add_detector(self, detector: Detector) -> None:
        with self.lock:
            existing = self._tables.detectors.get(detector.target)
            if existing is not None:
                raise BackendError(
                    f"target {detector.target!r} already has a detector, registered by "
                    f"{existing.source}; {detector.source} cannot register a second one"
                )
            self._tables.detectors[detector.target] = detector
            self.generation += 1

    def add_builder(self, builder: Builder) -> None:
        with self.lock:
            existing = self._tables.builders.get((builder.op, builder.target))
            if existing is not None:
                raise BackendError(
                    f"target {builder.target!r} already has a builder for {builder.op}, "
                    f"registered by {existing.source}; {builder.source} cannot register another"
                )
            self._tables.builders[(builder.op, builder.target)] = builder
            self.generation += 1

    def set_default_target(self, target: str | None) -> None:
        with self.lock:
            self._tables.default_target = target
            self.generation += 1

    @contextlib.contextmanager
    def transaction(self, *, always_undo: bool = False) -> Iterator[None]:
        """Undo every change made inside if the block raises (or always, when asked)."""
        with self.lock:
            saved = copy.copy(self._tables)
            saved.kernel_types = {op: dict(keys) for op, keys in saved.kernel_types.items()}
            saved.detectors = dict(saved.detectors)
            saved.builders = dict(saved.builders)
        try:
            yield
        except BaseException:
            self._restore(saved)
            raise
        if always_undo:
            self._restore(saved)

    def _restore(self, saved: _Tables) -> None:
        with self.lock:
            self._tables = saved
            self.generation += 1


REGISTRY = Registry()
