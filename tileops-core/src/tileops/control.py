"""The operator's say over selection: deny keys, add preferences, pin keys, strict fallbacks.

Process-wide rules come from the environment, read once after the backends load:

    TILEOPS_DENY="RMSNormFwdOp.rms_norm=acme,GemmOp=triton"   (no interface: every interface)
    TILEOPS_PREFER="RMSNormFwdOp.rms_norm=fastnorm_rms>acme"
    TILEOPS_PIN="RMSNormFwdOp.rms_norm=tilelang_block_row"   (no interface: where the key is)
    TILEOPS_STRICT=1   (a GPU call that only a `general` fallback serves raises; booleans
                        read by `env_flag`: 1/true/yes/on, 0/false/no/off, empty)

and from `prefer(...)` at run time. Like registrations, they shape the kernel tables of op
instances constructed after them. Names that match nothing, and pins that conflict, are
recorded in `tileops.backend.load_failures()` with a warning, as unknown backend names are.

`pinned(...)` pins a key for the calls inside a `with` block only (per thread and task, through
a context variable), as `record()` records and `tileops.testing.simulate_device` simulates a
device. While no such block is active anywhere, op instances read their plain hit cache: the
hit path pays nothing for pins, records or simulations that nobody uses.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import weakref
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .device import NO_SIMULATIONS, SIMULATED
from .errors import ControlError

if TYPE_CHECKING:
    from .op import Op

DENY, PREFER, PIN = "TILEOPS_DENY", "TILEOPS_PREFER", "TILEOPS_PIN"


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
        from .backend.registry import REGISTRY

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
                problems.append(f"{rule} names op {rule.op!r}, which no installed op has")
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
        return f"{rule} names key {missing[0]!r}, which no installed kernel of {op_cls.op_name} has"
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


def _keys_on(op_cls: type, interface: str) -> set[str]:
    """The installed keys of `op_cls` whose classes implement its `interface`."""
    from .backend.registry import REGISTRY

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


def prefer(op: type | str, interface: str, winner: str, loser: str) -> None:
    """Make `winner` preferred over `loser` on `op`'s `interface`: the operator settles an
    ambiguity between two backends that cannot know each other's keys. Reaches op instances
    constructed afterwards; a cycle with the declared preferences is refused then."""
    op_cls = _check_target(op, interface, "prefer")
    keys = _installed_keys(op_cls)
    for key in (winner, loser):
        if key not in keys:
            raise ControlError(
                f"tileops.prefer: {op_cls.op_name} has no kernel {key!r}; it has "
                f"{', '.join(sorted(keys))}"
            )
    from .backend.registry import REGISTRY
    from .provenance import caller_source

    rule = Rule("tileops.prefer()", op_cls.op_name, interface, (winner, loser), caller_source())
    # Kept in the registry: a transaction (isolated_registry) undoes it like a registration.
    REGISTRY.add(("rule", rule), rule, lambda existing: ControlError(f"{rule} is set already"))


# -- scoped pins and records ----------------------------------------------------------------


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
        before = torch._C._get_deterministic_algorithms()
        original(*args, **kwargs)
        if torch._C._get_deterministic_algorithms() != before:  # Dynamo re-sets it per frame
            SCOPES.refresh()  # it compiles, some inside SCOPES.lock: only a flip may take it

    use_deterministic_algorithms._tileops_watched = True
    torch.use_deterministic_algorithms = use_deterministic_algorithms


_watch_determinism()


@contextlib.contextmanager
def pinned(op: type | str, interface: str, key: str) -> Iterator[None]:
    """Inside the block, calls of `op`'s `interface` use kernel `key` (in this thread or task
    only). A pinned key that is unavailable or refuses a call raises the `no implementation
    serves this call` error with its own reason: a pin never falls back."""
    op_cls = _check_target(op, interface, "pinned")
    if key not in _installed_keys(op_cls):
        raise ControlError(
            f"tileops.pinned: {op_cls.op_name} has no kernel {key!r}; it has "
            f"{', '.join(sorted(_installed_keys(op_cls)))}"
        )
    with SCOPES.enter(pins={(op_cls, interface): key}):
        yield


def current_pin(op_cls: type, interface: str) -> str | None:
    scope = _scope.get()
    return None if scope is None else scope.pins.get((op_cls, interface))


def _check_target(op: type | str, interface: str, api: str) -> type:
    from .backend.plugins import LOADER
    from .backend.registry import REGISTRY

    LOADER.ensure_loaded()
    op_cls = REGISTRY.op_class(op)
    if interface not in op_cls.interfaces:
        raise ControlError(
            f"tileops.{api}: {op_cls.op_name} has no interface {interface!r}; it has "
            f"{', '.join(op_cls.interfaces)}"
        )
    return op_cls


def _installed_keys(op_cls: type) -> set[str]:
    from .backend.registry import REGISTRY

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
    from . import observe

    known = ", ".join(observe.LOGGERS)
    for name in observe.unknown_log_names():
        problem = f"{observe.LOG_VARIABLE} names {name!r}, which is no tileops log; use one of: "
        problems.append((observe.LOG_VARIABLE, problem + known))
    return problems


def strict() -> bool:
    """Whether TILEOPS_STRICT is on (read on the fallback path only, so tests can set it)."""
    return env_flag(STRICT)
