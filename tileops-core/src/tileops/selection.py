"""The selection algorithm: candidates + call -> one winner, or a reasoned failure.

Pure: it reads only the candidates' declarations and the call (device facts come through the
call, lazily). The same judgement drives dispatch, its errors and `Op.explain`, so what a user
reads is exactly what the dispatcher did. Candidates are judged in key order and preference is
a relation, so the outcome never depends on declaration order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .callspec import CallSpec
from .errors import (
    AmbiguousDispatchError,
    BackendError,
    KernelDeclarationError,
    NoImplementationError,
    OpNotAvailableError,
)
from .kernel import Kernel

DENIED, UNAVAILABLE, REFUSED, OUTRANKED, TIED, CHOSEN = (
    "denied",
    "unavailable",
    "refused",
    "outranked",
    "tied",
    "chosen",
)
NO_EDGES: Mapping[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Policy:
    """What the operator adds to the declarations for one judgement: denied keys (key -> by
    what), a pinned key and by what, whether only deterministic kernels may run, and the
    operator's own preference edges ((winner, loser) -> by what)."""

    denied: Mapping[str, str]
    pin: tuple[str, str] | None
    deterministic: bool
    edges: Mapping[tuple[str, str], str]


NO_POLICY = Policy({}, None, False, NO_EDGES)


@dataclass(frozen=True)
class Candidate:
    """One installed implementation of an interface, with where it came from."""

    key: str
    cls: type[Kernel]
    source: str
    aliases: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Other names of the op's own keys (see `kernel_sets.key_aliases`)."""

    @property
    def preferred(self) -> frozenset[str]:
        """The keys this one is declared preferred over, aliases resolved."""
        return frozenset(self.aliases.get(k, k) for k in self.cls.preferred_over)


@dataclass(frozen=True)
class Verdict:
    key: str
    status: str
    reason: str
    source: str

    def line(self) -> str:
        return f"  {self.key} [{self.source}]: {self.status}: {self.reason}"


@dataclass(frozen=True)
class Judgement:
    """Every candidate's verdict on one call, and the winner if there is exactly one."""

    op: str
    interface: str
    call: CallSpec
    verdicts: tuple[Verdict, ...]
    winner: Candidate | None
    device_served: bool

    def text(self) -> str:
        head = f"{self.op}.{self.interface} for {self.call!r}:"
        lines = [v.line() for v in self.verdicts] or ["  (no implementations installed)"]
        return "\n".join([head, *lines])

    def _ways_out(self, tied: list[Verdict]) -> str:
        """The three ways an operator settles an ambiguity, spelled out for these keys."""
        short = self.op.rpartition("::")[2]
        first, second = tied[0].key, tied[1].key
        return (
            "Settle it without editing either package: prefer one, "
            f"TILEOPS_PREFER='{short}.{self.interface}={first}>{second}' (or "
            f"tileops.prefer({short}, {self.interface!r}, {first!r}, {second!r})); or deny one, "
            f"TILEOPS_DENY='{short}.{self.interface}={second}'; or disable a backend, "
            "TILEOPS_DISABLE_BACKENDS=<entry point>. Backend authors can declare "
            "`preferred_over` on one of them."
        )

    def error(self, notes: Iterable[str] = ()) -> Exception:
        """The exception that dispatching this call must raise (only when there is no winner)."""
        tail = "".join(f"\n{note}" for note in notes if note)
        fields = {"op": self.op, "interface": self.interface, "call": self.call}
        fields["verdicts"] = self.verdicts
        if not self.device_served:
            return OpNotAvailableError(
                f"{self.op}.{self.interface}: the installed kernels do not run on "
                f"{self.call.device.type!r}.\n{self.text()}{tail}",
                **fields,
            )
        tied = [v for v in self.verdicts if v.status == TIED]
        if tied:
            return AmbiguousDispatchError(
                f"{self.op}.{self.interface}: dispatch is ambiguous between "
                f"{', '.join(f'{v.key!r} [{v.source}]' for v in tied)}; none is preferred over "
                f"the others. {self._ways_out(tied)}\n{self.text()}{tail}",
                **fields,
            )
        return NoImplementationError(
            f"{self.op}.{self.interface}: no implementation serves this call.\n{self.text()}{tail}",
            **fields,
        )


def _direct(
    candidates: Iterable[Candidate], edges: Mapping[tuple[str, str], str]
) -> dict[str, set[str]]:
    """Each key's declared `preferred_over`, plus the operator's edges between installed keys."""
    direct = {c.key: set(c.preferred) for c in candidates}
    for winner, loser in edges:
        if winner in direct:
            direct[winner].add(loser)
    return direct


def outranking(
    candidates: Iterable[Candidate], edges: Mapping[tuple[str, str], str] = NO_EDGES
) -> dict[str, frozenset[str]]:
    """For each key, every key it is preferred over, directly or transitively."""
    direct = _direct(candidates, edges)
    closure: dict[str, frozenset[str]] = {}
    for key in direct:
        seen: set[str] = set()
        stack = list(direct[key])
        while stack:
            other = stack.pop()
            if other not in seen:
                seen.add(other)
                stack.extend(direct.get(other, ()))
        closure[key] = frozenset(seen)
    return closure


def find_cycle(
    candidates: Iterable[Candidate], edges: Mapping[tuple[str, str], str] = NO_EDGES
) -> list[str] | None:
    """A preference cycle among `candidates` as a list of keys (first repeated last), or None."""
    direct = {key: sorted(others) for key, others in _direct(candidates, edges).items()}
    state: dict[str, int] = {}

    def visit(key: str, path: list[str]) -> list[str] | None:
        state[key] = 1
        for other in direct[key]:
            if other not in direct:
                continue
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state:
                found = visit(other, [*path, other])
                if found:
                    return found
        state[key] = 2
        return None

    for key in sorted(direct):
        if key not in state:
            found = visit(key, [key])
            if found:
                return found
    return None


def judge(
    op: str,
    interface: str,
    candidates: Iterable[Candidate],
    call: CallSpec,
    outranks: Mapping[str, frozenset[str]],
    policy: Policy = NO_POLICY,
) -> Judgement:
    """The operator's denials, then availability, then applicability, then the operator's pin
    or else preference, exactly as the spec orders them."""
    ordered = sorted(candidates, key=lambda c: c.key)
    verdicts: dict[str, Verdict] = {}
    device_type = call.device.type
    device_served = any(device_type in c.cls.devices for c in ordered)
    remaining = []
    for cand in ordered:
        reason = (
            _denial(cand, policy)
            or unavailability(cand.cls, call)
            or _nondeterminism(cand, policy)
            or _refusal(op, interface, cand, call)
        )
        if reason:
            verdicts[cand.key] = Verdict(cand.key, *reason, cand.source)
        else:
            remaining.append(cand)
    if policy.pin is not None:
        winner = _pinned(remaining, policy.pin, verdicts, ordered)
    else:
        winner = _rank(remaining, outranks, verdicts, policy.edges)
    return Judgement(op, interface, call, _in_order(verdicts, ordered), winner, device_served)


def _denial(cand: Candidate, policy: Policy) -> tuple[str, str] | None:
    origin = policy.denied.get(cand.key)
    return None if origin is None else (DENIED, f"denied by {origin}")


def _nondeterminism(cand: Candidate, policy: Policy) -> tuple[str, str] | None:
    if not policy.deterministic or cand.cls.deterministic:
        return None
    return UNAVAILABLE, (
        "not deterministic (its reductions' order varies between runs), and "
        "torch.use_deterministic_algorithms(True) is on"
    )


def _pinned(
    remaining: list[Candidate],
    pin: tuple[str, str],
    verdicts: dict[str, Verdict],
    ordered: list[Candidate],
) -> Candidate | None:
    """The pinned key wins if it serves the call; else nothing does (its verdict says why)."""
    key, origin = pin
    for cand in remaining:
        if cand.key == key:
            verdicts[key] = Verdict(key, CHOSEN, f"pinned by {origin}", cand.source)
        else:
            verdicts[cand.key] = Verdict(
                cand.key, OUTRANKED, f"{key!r} is pinned by {origin}", cand.source
            )
    if key in verdicts and verdicts[key].status == CHOSEN:
        return next(c for c in remaining if c.key == key)
    if key not in {c.key for c in ordered}:
        verdicts[key] = Verdict(key, UNAVAILABLE, f"pinned by {origin}, but not installed", "-")
    return None


def unavailability(cls: type[Kernel], call: CallSpec) -> tuple[str, str] | None:
    """(UNAVAILABLE, why) if `cls` cannot run on the call's device, else None."""
    devices = cls.devices
    if call.device.type not in devices:
        return UNAVAILABLE, f"runs on {', '.join(sorted(devices))}, not {call.device.type}"
    archs = cls.supported_archs
    if archs is not None and call.arch not in archs:
        have = "no architecture" if call.arch is None else f"sm_{call.arch}"
        need = ", ".join(f"sm_{a}" for a in sorted(archs))
        return UNAVAILABLE, f"supports {need}; {call.device} has {have}"
    unmet = cls.requires.unmet() if cls.requires is not None else None
    return None if unmet is None else (UNAVAILABLE, unmet)


def _refusal(op: str, interface: str, cand: Candidate, call: CallSpec) -> tuple[str, str] | None:
    fields = {"op": op, "interface": interface, "call": call, "key": cand.key}
    try:
        reason = cand.cls.refusal(call)
    except Exception as exc:
        raise BackendError(
            f"{op}: refusal() of kernel {cand.key!r} [{cand.source}] raised "
            f"{type(exc).__name__}: {exc}; a refusal must return None or a sentence",
            source=cand.source,
            **fields,
        ) from exc
    if reason is None:
        return None
    if not isinstance(reason, str) or not reason.strip():
        raise KernelDeclarationError(
            f"{op}: refusal() of kernel {cand.key!r} ({cand.cls.__qualname__} from "
            f"{cand.source}) returned {reason!r} for {call!r}; a refusal must return None "
            "(serves the call) or a non-empty sentence saying why it does not",
            source=cand.source,
            **fields,
        )
    return REFUSED, reason


def _in_order(verdicts: dict[str, Verdict], ordered: list[Candidate]) -> tuple[Verdict, ...]:
    """Verdicts in key order, then any for keys not installed (a pinned one)."""
    installed = [c.key for c in ordered]
    return tuple(verdicts[k] for k in installed) + tuple(
        v for k, v in verdicts.items() if k not in installed
    )


def _rank(
    remaining: list[Candidate],
    outranks: Mapping[str, frozenset[str]],
    verdicts: dict[str, Verdict],
    edges: Mapping[tuple[str, str], str] = NO_EDGES,
) -> Candidate | None:
    specific = [c for c in remaining if not c.cls.general]
    generals = [c for c in remaining if c.cls.general]
    contenders = specific or generals
    for cand in generals if specific else []:
        others = ", ".join(c.key for c in specific)
        verdicts[cand.key] = Verdict(
            cand.key, OUTRANKED, f"general; ranks below {others}", cand.source
        )
    top = []
    for cand in contenders:
        above = [o.key for o in contenders if cand.key in outranks.get(o.key, ())]
        if above:
            by = sorted({edges[(o, cand.key)] for o in above if (o, cand.key) in edges})
            operator = f" (the operator's preference: {', '.join(by)})" if by else ""
            verdicts[cand.key] = Verdict(
                cand.key,
                OUTRANKED,
                f"{', '.join(above)} preferred over it{operator}",
                cand.source,
            )
        else:
            top.append(cand)
    if len(top) == 1:
        winner = top[0]
        verdicts[winner.key] = Verdict(
            winner.key, CHOSEN, _why_chosen(winner, remaining), winner.source
        )
        return winner
    for cand in top:
        verdicts[cand.key] = Verdict(
            cand.key, TIED, "available and applicable; no preference decides", cand.source
        )
    return None


def _why_chosen(winner: Candidate, remaining: list[Candidate]) -> str:
    rivals = [c.key for c in remaining if c is not winner]
    if not rivals:
        return "the only available implementation that serves this call"
    return f"available, serves this call, and ranks above {', '.join(rivals)}"
