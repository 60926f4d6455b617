"""The operator's say over selection: deny keys, add preferences, pin keys, strict fallbacks.

Process-wide rules come from the environment, read once after the backends load:

    TILEOPS_DENY="RMSNormFwdOp.rms_norm=acme,GemmOp=triton"   (no interface: every interface)
    TILEOPS_PREFER="RMSNormFwdOp.rms_norm=fastnorm_rms>acme"
    TILEOPS_PIN="RMSNormFwdOp.rms_norm=tilelang_block_row"   (no interface: where the key is)
    TILEOPS_STRICT=1   (a GPU call that only a `general` fallback serves raises; booleans
                        read by `env_flag`: 1/true/yes/on, 0/false/no/off, empty)
    TILEOPS_TARGET=acme   (the process default target, where the program sets none: settles
                           targets whose detectors overlap; `builtin` for the ops' own kernels)

and from `prefer(...)` at run time. Like registrations, they shape the kernel tables of op
instances constructed after them. Names that match nothing, and pins that conflict, are
recorded in `tileops.backend.load_failures()` with a warning, as unknown backend names are.

`pinned(...)` pins a key for the calls inside a `with` block only (per thread and task, through
a context variable; see scope.py), as `record()` records and `tileops.testing.simulate_device`
simulates a device.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import observe
from .errors import ControlError
from .plugins import LOADER, LoadFailure
from .provenance import Source, caller_source
from .registry import BUILTIN, REGISTRY, RegistrationHandle
from .scope import SCOPES

if TYPE_CHECKING:
    from .op import Op

DENY, PREFER, PIN = "TILEOPS_DENY", "TILEOPS_PREFER", "TILEOPS_PIN"
TARGET = "TILEOPS_TARGET"
TARGET_SOURCE = Source(f"the {TARGET} setting")


@dataclass(frozen=True)
class Rule:
    """One operator rule: on `op` (a name as the user wrote it), `interface` (None: all)."""

    origin: str  # the variable, or the API call, that made it
    op: str
    interface: str | None
    keys: tuple[str, ...]  # deny/pin: (key,); prefer: (winner, loser)
    source: Any = None  # who made it through the API (a registry entry needs one)

    def __str__(self) -> str:
        target = self.op if self.interface is None else f"{self.op}.{self.interface}"
        return f"{self.origin} {target}={'>'.join(self.keys)}"


@dataclass
class InterfaceRules:
    """The rules that apply to one interface of one op class."""

    denied: dict[str, str] = field(default_factory=dict)  # key -> origin
    pin: tuple[str, str] | None = None  # (key, origin)
    edges: dict[tuple[str, str], str] = field(default_factory=dict)  # (winner, loser) -> origin


class Rules:
    """Every operator rule of the process; `for_op` resolves them against one op class."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def load_environment(self) -> list[tuple[str, str]]:
        """Read the variables; returns (origin, problem) for every entry that cannot parse,
        and for the other core settings whose values mean nothing (TILEOPS_STRICT)."""
        problems = []
        for variable, split in ((DENY, False), (PIN, False), (PREFER, True)):
            for entry in filter(None, (e.strip() for e in os.environ.get(variable, "").split(","))):
                rule = _parse(variable, entry, split)
                if isinstance(rule, str):
                    problems.append((variable, rule))
                else:
                    self.rules.append(rule)
        return problems + _setting_problems()

    def for_op(
        self, op_cls: type[Op], keys: Mapping[str, Collection[str]]
    ) -> dict[str, InterfaceRules]:
        """The rules in force on each interface of `op_cls`, whose keys per interface are
        `keys`. A pin naming no interface applies where its key implements the interface;
        pins that conflict on one interface leave it unpinned (`unmatched` reports them)."""
        found = {name: InterfaceRules() for name in op_cls.interfaces}
        for rule in [*self.rules, *REGISTRY.rules()]:
            if not _names(op_cls, rule.op) or rule.origin.startswith(PIN):
                continue
            for interface in [rule.interface] if rule.interface else list(op_cls.interfaces):
                if interface not in found:
                    continue
                if rule.origin.startswith(DENY):
                    found[interface].denied[rule.keys[0]] = rule.origin
                else:
                    found[interface].edges[rule.keys] = rule.origin
        for interface, pins in self._pins(op_cls, keys).items():
            if len(pins) == 1:
                (key, rule), *_ = pins.items()
                found[interface].pin = (key, rule.origin)
        return found

    def _pins(
        self, op_cls: type, keys: Mapping[str, Collection[str]]
    ) -> dict[str, dict[str, Rule]]:
        """Interface -> the keys the environment pins there (each with the first rule that
        does): more than one is a conflict."""
        pins: dict[str, dict[str, Rule]] = {}
        for rule in self.rules:
            if not rule.origin.startswith(PIN) or not _names(op_cls, rule.op):
                continue
            key = rule.keys[0]
            for interface in op_cls.interfaces:
                named = (
                    key in keys[interface]
                    if rule.interface is None
                    else rule.interface == interface
                )
                if named:
                    pins.setdefault(interface, {}).setdefault(key, rule)
        return pins

    def unmatched(self, known_ops: dict[str, type], keys_of: Any) -> list[str]:
        """Sentences for the rules that name no op, no interface or no installed key (a rule
        naming an interface: no key of that interface), and for pins that conflict."""
        problems = []
        for rule in self.rules:
            ops = [cls for cls in known_ops.values() if _names(cls, rule.op) and cls.interfaces]
            if not ops:
                names = sorted({c.op_name.rpartition("::")[2] for c in known_ops.values()})
                problem = f"{rule} names op {rule.op!r}, which no installed op has"
                problems.append(problem + _did_you_mean(rule.op, names))
                continue
            for op_cls in ops:
                problem = _unmatched_on(rule, op_cls, keys_of(op_cls))
                if problem:
                    problems.append(problem)
        pinned = {cls for cls in known_ops.values() for r in self.rules if _names(cls, r.op)}
        for op_cls in sorted(pinned, key=lambda cls: cls.op_name):
            problems += self._conflicts(op_cls)
        return problems

    def _conflicts(self, op_cls: type) -> list[str]:
        keys = {interface: _keys_on(op_cls, interface) for interface in op_cls.interfaces}
        problems = []
        for interface, pins in self._pins(op_cls, keys).items():
            if len(pins) > 1:
                named = [f"{key!r} ({rule})" for key, rule in pins.items()]
                problems.append(
                    f"{PIN} pins {op_cls.op_name}.{interface} to {', '.join(named[:-1])} and "
                    f"{named[-1]}; none applies there: keep one"
                )
        return problems


def _unmatched_on(rule: Rule, op_cls: type, installed: Collection[str]) -> str | None:
    """Why `rule` names nothing on `op_cls`, or None."""
    if rule.interface and rule.interface not in op_cls.interfaces:
        return (
            f"{rule} names interface {rule.interface!r}, which {op_cls.op_name} lacks "
            f"(it has {', '.join(op_cls.interfaces)})"
        )
    missing = [k for k in rule.keys if k not in installed]
    if missing:
        return (
            f"{rule} names key {missing[0]!r}, which no installed kernel of {op_cls.op_name} "
            f"has{_did_you_mean(missing[0], sorted(installed))}"
        )
    if rule.interface:
        there = _keys_on(op_cls, rule.interface)
        elsewhere = [k for k in rule.keys if k not in there]
        if elsewhere:
            return (
                f"{rule} names key {elsewhere[0]!r}, which does not implement "
                f"{op_cls.op_name}.{rule.interface} (its keys there: "
                f"{', '.join(sorted(there)) or 'none'})"
            )
    return None


def _did_you_mean(name: str, known: list[str]) -> str:
    """'; a typo? did you mean 'x'?' when `name` is close to one of `known`, else ''."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (a typo? did you mean {close[0]!r}?)" if close else ""


def _keys_on(op_cls: type, interface: str) -> set[str]:
    """The installed keys of `op_cls` whose classes implement its `interface`."""
    classes = {**op_cls.kernel_types}
    classes.update({key: r.cls for key, r in REGISTRY.kernel_types(op_cls).items()})
    wanted = op_cls.interfaces[interface]
    return {
        key for key, cls in classes.items() if isinstance(cls, type) and issubclass(cls, wanted)
    }


def _names(op_cls: type, name: str) -> bool:
    return name in (op_cls.op_name, op_cls.op_name.rpartition("::")[2])


def _parse(origin: str, entry: str, pair: bool) -> Rule | str:
    target, sep, value = entry.partition("=")
    namespace, colons, rest = target.strip().rpartition("::")
    op, dot, interface = rest.partition(".")
    keys = tuple(k.strip() for k in value.split(">")) if pair else (value.strip(),)
    if not sep or not op or (dot and not interface) or not all(keys) or len(keys) != 1 + pair:
        shape = "OP[.INTERFACE]=WINNER>LOSER" if pair else "OP[.INTERFACE]=KEY"
        return f"{origin} entry {entry!r} is not of the form {shape}"
    return Rule(origin, f"{namespace}{colons}{op}", interface or None, keys)


RULES = Rules()


def prefer(op: type | str, interface: str, winner: str, loser: str) -> RegistrationHandle:
    """Make `winner` preferred over `loser` on `op`'s `interface`: the operator settles an
    ambiguity between two backends that cannot know each other's keys. Reaches op instances
    constructed afterwards; a cycle with the declared preferences is refused then. The handle
    returned withdraws the preference (`.remove()`, or the end of a `with` block)."""
    op_cls = _check_target(op, interface, "prefer")
    keys = _installed_keys(op_cls)
    for key in (winner, loser):
        if key not in keys:
            raise ControlError(
                f"tileops.prefer: {op_cls.op_name} has no kernel {key!r}; it has "
                f"{', '.join(sorted(keys))}",
                op=op_cls.op_name,
                interface=interface,
                key=key,
            )
    rule = Rule("tileops.prefer()", op_cls.op_name, interface, (winner, loser), caller_source())
    # Kept in the registry: a transaction (isolated_registry) undoes it like a registration.
    return REGISTRY.add(
        ("rule", rule), rule, lambda existing: ControlError(f"{rule} is set already")
    )


@contextlib.contextmanager
def pinned(op: type | str, interface: str, key: str) -> Iterator[None]:
    """Inside the block, calls of `op`'s `interface` use kernel `key` (in this thread or task
    only, and in the backward of calls made inside, wherever autograd runs it). A pinned key
    that is unavailable or refuses a call raises the `no implementation serves this call` error
    with its own reason: a pin never falls back."""
    op_cls = _check_target(op, interface, "pinned")
    if key not in _installed_keys(op_cls):
        raise ControlError(
            f"tileops.pinned: {op_cls.op_name} has no kernel {key!r}; it has "
            f"{', '.join(sorted(_installed_keys(op_cls)))}",
            op=op_cls.op_name,
            interface=interface,
            key=key,
        )
    with SCOPES.enter(pins={(op_cls, interface): key}):
        yield


def _check_target(op: type | str, interface: str, api: str) -> type:
    LOADER.ensure_loaded()
    op_cls = REGISTRY.op_class(op)
    if interface not in op_cls.interfaces:
        raise ControlError(
            f"tileops.{api}: {op_cls.op_name} has no interface {interface!r}; it has "
            f"{', '.join(op_cls.interfaces)}",
            op=op_cls.op_name,
            interface=interface,
        )
    return op_cls


def _installed_keys(op_cls: type) -> set[str]:
    return set(op_cls.kernel_types) | set(REGISTRY.kernel_types(op_cls))


# -- boolean settings ------------------------------------------------------------------------

STRICT = "TILEOPS_STRICT"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(variable: str, default: bool = False) -> bool:
    """The boolean setting `variable`, read one way for every TILEOPS_* flag: 1/true/yes/on,
    0/false/no/off (any case, spaces around ignored), unset or empty for `default`. Anything
    else raises `ControlError` naming the variable: a typo must not flip a setting."""
    raw = os.environ.get(variable, "")
    word = raw.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise ControlError(
        f"{variable}={raw!r} is not a boolean: use {', '.join(TRUE_WORDS[:-1])} or "
        f"{TRUE_WORDS[-1]}; {', '.join(FALSE_WORDS[:-1])} or {FALSE_WORDS[-1]}; or leave it empty"
    )


def _setting_problems() -> list[tuple[str, str]]:
    """(variable, problem) for each core flag whose value is no boolean and each TILEOPS_LOG
    name that is no log: reported when the backends load, not left to be ignored."""
    problems = []
    for variable in (STRICT,):
        try:
            env_flag(variable)
        except ControlError as exc:
            problems.append((variable, str(exc)))
    known = ", ".join(observe.LOGGERS)
    for name in observe.unknown_log_names():
        problem = f"{observe.LOG_VARIABLE} names {name!r}, which is no tileops log; use one of: "
        problems.append((observe.LOG_VARIABLE, problem + known))
    return problems


def strict() -> bool:
    """Whether TILEOPS_STRICT is on (read on the fallback path only, so tests can set it)."""
    return env_flag(STRICT)


def _check_operator_settings() -> list[LoadFailure]:
    """Read TILEOPS_DENY / _PIN / _PREFER once every backend is in, and report entries that
    cannot parse or name nothing installed, as unknown backend names are reported (the loader
    calls it once the backends are loaded)."""
    problems = RULES.load_environment()
    keys = lambda op: set(op.kernel_types) | set(REGISTRY.kernel_types(op))  # noqa: E731
    problems += [(p.split(" ", 1)[0], p) for p in RULES.unmatched(REGISTRY.known_ops, keys)]
    if RULES.rules:
        REGISTRY.bump()  # tables built before the rules were read must not stand
    return [LoadFailure(origin, "operator setting", problem) for origin, problem in problems]


def _apply_target_setting() -> list[LoadFailure]:
    """Make TILEOPS_TARGET the process default target once every backend is in, unless the
    program set one already (`set_default_target` wins: it is in the code); a name that no
    backend registered is reported, with the close match, and ignored."""
    name = os.environ.get(TARGET, "").strip()
    if not name or REGISTRY.default is not None:
        return []
    known = REGISTRY.targets()
    if name != BUILTIN and name not in known:
        problem = (
            f"{TARGET}={name!r} names no registered target; known targets: "
            f"{', '.join(known) or 'none'} (and {str(BUILTIN)!r} for the ops' own kernels)"
        )
        return [LoadFailure(TARGET, "operator setting", problem + _did_you_mean(name, known))]
    REGISTRY.set_default_target(name, TARGET_SOURCE)
    return []


LOADER.on_loaded(_check_operator_settings)
LOADER.on_loaded(_apply_target_setting)
