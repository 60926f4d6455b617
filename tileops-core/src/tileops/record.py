"""A record of what ran: `with tileops.record() as r:` counts every op call inside (hits too)
by op, interface, call spec, key and distribution; `r.summary()` prints a table per op.

While no record (or pin) is active anywhere, op instances read their plain hit cache, so the
hit path costs what it costs without this module (see scope.Scopes).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .callspec import CallSpec
from .scope import SCOPE, SCOPES

if TYPE_CHECKING:
    from .table import KernelTable


@dataclass(frozen=True)
class Served:
    """One kind of call that ran: which op and interface, the call spec, the key and where the
    key came from."""

    op: str
    interface: str
    call: CallSpec
    key: str
    distribution: str


class Record:
    def __init__(self) -> None:
        self._counts: Counter[tuple] = Counter()  # Served's fields -> calls
        self._lock = threading.Lock()

    def add(self, fields: tuple) -> None:
        with self._lock:
            self._counts[fields] += 1

    @property
    def counts(self) -> dict[Served, int]:
        """Calls per kind of call that ran."""
        with self._lock:
            return {Served(*fields): count for fields, count in self._counts.items()}

    def rows(self) -> list[tuple[Served, int]]:
        return sorted(self.counts.items(), key=lambda item: (item[0].op, -item[1]))

    def summary(self) -> str:
        """One table per op: interface, key, distribution, calls, call spec."""
        lines: list[str] = []
        current = None
        for served, count in self.rows():
            if served.op != current:
                current = served.op
                lines += [*([""] if lines else []), current, _HEADER]
            lines.append(
                f"  {served.interface:<22} {served.key:<22} {served.distribution:<26} "
                f"{count:>7}  {_short(served.call)}"
            )
        return "\n".join(lines) if lines else "(no op calls recorded)"


_HEADER = f"  {'interface':<22} {'key':<22} {'distribution':<26} {'calls':>7}  call"


def _short(call: CallSpec) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in vars(call).items() if k != "device")
    return f"{call.device}: {fields}".replace("torch.", "")


@contextlib.contextmanager
def record() -> Iterator[Record]:
    """Count every op call inside the block (in this thread or task), and the backward calls
    of those, wherever autograd runs them."""
    collected = Record()
    with SCOPES.enter(records=(collected,)):
        yield collected


def record_call(table: KernelTable, interface: str, call: CallSpec, key: str | None) -> None:
    """Count one call in the records of the current context, if any."""
    scope = SCOPE.get()
    if scope is None or not scope.records or key is None:
        return
    fields = (table.op, interface, call, key, table.sources[interface][key])
    for collected in scope.records:
        collected.add(fields)
