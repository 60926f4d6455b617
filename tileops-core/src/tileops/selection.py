"""The selection algorithm: candidates + call -> one winner, or a reasoned failure.

Pure: it reads only the candidates' declarations and the call (device facts come through the
call, lazily). The same judgement drives dispatch, its errors and `Op.explain`, so what a user
reads is exactly what the dispatcher did. Candidates are judged in key order and preference is
a relation, so the outcome never depends on declaration order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .call import CallSpec
from .errors import (
    AmbiguousDispatchError,
    BackendError,
    KernelDeclarationError,
    NoImplementationError,
    OpNotAvailableError,
)
from .kernel import Kernel

UNAVAILABLE, REFUSED, OUTRANKED, TIED, CHOSEN = (
    "unavailable",
    "refused",
    "outranked",
    "tied",
    "chosen",
)


@dataclass(frozen=True)
class Candidate:
    """One installed implementation of an interface, with where it came from."""

    key: str
    cls: type[Kernel]
    source: str


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

    def error(self, notes: Iterable[str] = ()) -> Exception:
        """The exception that dispatching this call must raise (only when there is no winner)."""
        tail = "".join(f"\n{note}" for note in notes if note)
        if not self.device_served:
            return OpNotAvailableError(
                f"{self.op}.{self.interface}: in-tree kernels do not run on "
                f"{self.call.device.type!r}.\n{self.text()}{tail}"
            )
        tied = [v.key for v in self.verdicts if v.status == TIED]
        if tied:
            return AmbiguousDispatchError(
                f"{self.op}.{self.interface}: dispatch is ambiguous between "
                f"{', '.join(map(repr, tied))}; none is preferred over the others. Declare "
                f"`preferred_over` on one of them.\n{self.text()}{tail}"
            )
        return NoImplementationError(
            f"{self.op}.{self.interface}: no implementation serves this call.\n{self.text()}{tail}"
        )


def outranking(candidates: Iterable[Candidate]) -> dict[str, frozenset[str]]:
    """For each key, every key it is preferred over, directly or transitively."""
    direct = {c.key: set(c.cls.preferred_over) for c in candidates}
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


def find_cycle(candidates: Iterable[Candidate]) -> list[str] | None:
    """A preference cycle among `candidates` as a list of keys (first repeated last), or None."""
    direct = {c.key: sorted(c.cls.preferred_over) for c in candidates}
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
) -> Judgement:
    """Availability, then applicability, then preference, exactly as the spec orders them."""
    ordered = sorted(candidates, key=lambda c: c.key)
    verdicts: dict[str, Verdict] = {}
    device_type = call.device.type
    device_served = any(device_type in c.cls.devices for c in ordered)
    remaining = []
    for cand in ordered:
        reason = unavailability(cand.cls, call) or _refusal(op, cand, call)
        if reason:
            verdicts[cand.key] = Verdict(cand.key, *reason, cand.source)
        else:
            remaining.append(cand)
    winner = _rank(remaining, outranks, verdicts)
    return Judgement(
        op, interface, call, tuple(verdicts[c.key] for c in ordered), winner, device_served
    )


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
    return None


def _refusal(op: str, cand: Candidate, call: CallSpec) -> tuple[str, str] | None:
    try:
        reason = cand.cls.refusal(call)
    except Exception as exc:
        raise BackendError(
            f"{op}: refusal() of kernel {cand.key!r} [{cand.source}] raised "
            f"{type(exc).__name__}: {exc}; a refusal must return None or a sentence"
        ) from exc
    if reason is None:
        return None
    if not isinstance(reason, str) or not reason.strip():
        raise KernelDeclarationError(
            f"{op}: refusal() of kernel {cand.key!r} ({cand.cls.__qualname__} from "
            f"{cand.source}) returned {reason!r} for {call!r}; a refusal must return None "
            "(serves the call) or a non-empty sentence saying why it does not"
        )
    return REFUSED, reason


def _rank(
    remaining: list[Candidate],
    outranks: Mapping[str, frozenset[str]],
    verdicts: dict[str, Verdict],
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
            verdicts[cand.key] = Verdict(
                cand.key, OUTRANKED, f"{', '.join(above)} preferred over it", cand.source
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
