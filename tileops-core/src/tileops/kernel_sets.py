"""An op's candidates: its own kernel types plus backends' registrations, checked as a whole.

The same check runs when a backend registers (so a broken registration fails in the backend
that made it) and when an op class's kernel table is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .errors import KernelDeclarationError
from .kernel import interfaces_implemented
from .provenance import Source, source_of_module
from .selection import Candidate, find_cycle

if TYPE_CHECKING:
    from .registry import Registration


def candidates_of(
    op_cls: type, registrations: Mapping[str, Registration]
) -> dict[str, tuple[Candidate, ...]]:
    """Every key of `op_cls`, validated, grouped by the interfaces its class implements."""
    own_source = source_of_module(op_cls.__module__)
    keyed: dict[str, tuple[type, Source]] = {
        key: (cls, own_source) for key, cls in op_cls.kernel_types.items()
    }
    for key, reg in registrations.items():
        if key in keyed:
            raise KernelDeclarationError(
                f"{op_cls.op_name}: {reg.source} registers kernel key {key!r} "
                f"({_name(reg.cls)}), but backends cannot reuse keys it has "
                f"(already {_name(keyed[key][0])} from {keyed[key][1]}); pick another key",
                op=op_cls.op_name,
                key=key,
                source=reg.source,
            )
        keyed[key] = (reg.cls, reg.source)
    aliases = {a: k for a, k in key_aliases(op_cls).items() if a not in keyed}
    grouped: dict[str, list[Candidate]] = {name: [] for name in op_cls.interfaces}
    for key in sorted(keyed):
        cls, source = keyed[key]
        where = f"{op_cls.op_name}: kernel {key!r} ({_name(cls)!r} from {source})"
        for name in interfaces_implemented(op_cls.interfaces, cls, where):
            grouped[name].append(Candidate(key, cls, str(source), aliases))
    for name, cands in grouped.items():
        _validate_preferences(op_cls, name, cands)
    return {name: tuple(cands) for name, cands in grouped.items()}


def key_aliases(op_cls: type) -> dict[str, str]:
    """Upstream TileOPs names an op's in-tree kernel after its interface (`layer_norm`,
    `rms_norm`, `gemm`); here the op's own kernel of an interface has its own key
    (`reference`). Each interface name with exactly one own kernel is another name of that
    key, so a backend written for upstream can say `preferred_over = {"layer_norm"}` or ask
    `key_serves(op, "layer_norm", call)`. A key a backend registers under that name wins."""
    aliases = {}
    for name, interface in op_cls.interfaces.items():
        own = [k for k, cls in op_cls.kernel_types.items() if issubclass(cls, interface)]
        if len(own) == 1 and name not in op_cls.kernel_types:
            aliases[name] = own[0]
    return aliases


def check_registration(
    op_cls: type, registration: Registration, registered: Mapping[str, Registration]
) -> None:
    """Raise if adding `registration` to what `op_cls` has would make its table invalid."""
    candidates_of(op_cls, {**registered, registration.key: registration})


def _validate_preferences(op_cls: type, interface: str, cands: list[Candidate]) -> None:
    named = {c.key: f"{c.key} ({c.cls.__qualname__} from {c.source})" for c in cands}
    generals = [named[c.key] for c in cands if c.cls.general]
    if len(generals) > 1:
        raise KernelDeclarationError(
            f"{op_cls.op_name}.{interface}: more than one general implementation "
            f"({', '.join(generals)}); at most one may be the fallback",
            op=op_cls.op_name,
            interface=interface,
        )
    cycle = find_cycle(cands)
    if cycle:
        raise KernelDeclarationError(
            f"{op_cls.op_name}.{interface}: preferred_over forms a cycle: "
            f"{' -> '.join(cycle)} ({', '.join(named[k] for k in sorted(set(cycle)))}); "
            "remove one of these preferences",
            op=op_cls.op_name,
            interface=interface,
        )


def _name(cls: object) -> str:
    return getattr(cls, "__qualname__", repr(cls))
