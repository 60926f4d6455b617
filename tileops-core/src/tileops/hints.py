"""Declarations that are valid yet probably mistakes, said where people look for them.

Two slips pass every check because each is legal on its own: a `preferred_over` naming a key
that is not installed but close to one that is (a likely typo: the preference is ignored),
and a kernel class that never declares `devices`, so it runs on CUDA only (a CPU kernel
written that way is never chosen). `explain`, `doctor` and `audit` all report them from here.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import KernelDeclarationError
from .kernel import Kernel
from .plugins import LOADER
from .registry import REGISTRY
from .selection import Candidate


@dataclass(frozen=True)
class Hint:
    """One suspicious declaration of one key, with what to do about it."""

    op: str
    interface: str
    key: str
    text: str

    def __str__(self) -> str:
        return f"{self.op}.{self.interface}: {self.text}"


def dangling_preferences(op: str, interface: str, candidates: Iterable[Candidate]) -> list[Hint]:
    """Preferences that are likely typos: naming a key no installed kernel of `interface` has,
    but close to one that is installed. A preference over a key that is simply absent (another
    distribution's, not installed here) is what `preferred_over` is for and says nothing: it
    takes effect when that distribution is installed."""
    candidates = list(candidates)
    installed = {c.key for c in candidates}
    hints = []
    for cand in candidates:
        for missing in sorted(cand.preferred - installed):
            close = difflib.get_close_matches(missing, sorted(installed - {cand.key}), n=1)
            if not close:
                continue
            text = (
                f"{cand.key} is preferred over {missing!r}, which is not installed "
                f"(declared by {cand.source}); did you mean {close[0]!r}? (a preference over "
                "an absent key is ignored)"
            )
            hints.append(Hint(op, interface, cand.key, text))
    return hints


def declares_devices(cls: type) -> bool:
    """Whether `cls` (or a base of it other than `Kernel`) sets `devices` itself."""
    return any("devices" in vars(base) for base in cls.__mro__ if base is not Kernel)


def forgotten_devices(op: str, interface: str, candidates: Iterable[Candidate]) -> list[Hint]:
    """Kernels left on the default `{"cuda"}` by a backend that says it serves no CUDA."""
    hints = []
    for cand in candidates:
        served = backend_devices(cand.source)
        if declares_devices(cand.cls) or served is None or "cuda" in served:
            continue
        text = (
            f"{cand.key} [{cand.source}] declares no `devices`, so it runs on cuda only (the "
            f"default), but its backend serves {', '.join(served) or 'no device'}; declare "
            f"`devices = {set(served) or {'cpu'}!r}` on the class, or it is never chosen"
        )
        hints.append(Hint(op, interface, cand.key, text))
    return hints


def default_devices_note(cand: Candidate, device_type: str) -> str | None:
    """For `explain` on a non-CUDA call: why a key that declares no devices is unavailable
    (unless its backend says it serves CUDA: then the default is what it meant)."""
    served = backend_devices(cand.source) or ()
    if device_type == "cuda" or "cuda" in served or declares_devices(cand.cls):
        return None
    return (
        f"{cand.key} declares no `devices`, so it runs on cuda only (the default); a kernel "
        f"for {device_type} must declare `devices = {{{device_type!r}}}`"
    )


def backend_devices(source: str) -> tuple[str, ...] | None:
    """The device types the loaded backend behind `source` declares, or None if unknown."""
    for info in LOADER.infos.values():
        if source == info.distribution or source.startswith(f"{info.distribution}, "):
            return info.devices or None
    return None


def installed_hints(table_for: Callable[[type], Any]) -> Iterator[Hint]:
    """Every hint over every op and interface installed in this process; `table_for(op_cls)`
    gives an op class's table (table.py, a layer above this module)."""
    LOADER.ensure_loaded()
    for name in sorted(REGISTRY.known_ops):
        op_cls = REGISTRY.known_ops[name]
        try:
            candidates = table_for(op_cls).candidates
        except KernelDeclarationError:
            continue  # `doctor` and `list` report ops that cannot be constructed
        for interface, cands in candidates.items():
            yield from dangling_preferences(name, interface, cands)
            yield from forgotten_devices(name, interface, cands)
