"""`tileops audit`: sweep every op's calls on simulated devices for gaps and ambiguities.

Kernels split an interface's calls between them by refusals, and a split is easy to get wrong
at its edges: `n <= 1024` in one class and `n > 1025` in the next leaves a gap, `n >= 1024` in
both an ambiguity. So the probe grid holds, per integer field of the call spec, every power of
two from 1 to 2**20 and its neighbours (n - 1, n + 1), plus every boundary a kernel class
declares (`boundaries = {"n": (1000,)}` on the class, optional, read only here) and its
neighbours; every dtype; both values of every flag. Several integer fields are swept one at a
time, the others held at 1, 64 and 4096. Interfaces whose kernels never refuse are judged once
per device: no field can matter to them.

Devices: the CPU and `cuda:0` simulated as each `--arch` (see devices.py). A gap is a call that
some key could run on that device yet none serves; a device no key runs on is listed, not a gap.
A target whose detector claims one of these devices while it has no builder for an audited op
is a finding too (every call of that op there would raise), as is a detector that breaks.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import hints, numerics
from ..callspec import CallSpec
from ..device import DeviceFacts
from ..errors import KernelDeclarationError
from ..kernel import Kernel
from ..plugins import LOADER
from ..registry import REGISTRY
from ..selection import TIED, Candidate, Judgement
from ..signature import FLOAT_DTYPES
from ..table import KernelTable, table_for
from . import claims, devices, probe
from .output import Outcome

BASES = (1, 64, 4096)
"""Values of the integer fields not being swept."""

EXAMPLES = 3
"""Calls shown per finding."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("audit", help="probe every op for gaps and ambiguities")
    parser.add_argument("ops", nargs="*", metavar="OP", help="ops to audit (default: all)")
    parser.add_argument(
        "--arch",
        default=",".join(map(str, devices.AUDIT_ARCHS)),
        help="simulated compute capabilities, comma-separated (default 80,86,89,90)",
    )
    parser.add_argument(
        "--numerics",
        action="store_true",
        help="instead, run every installed key on this machine's device (GPU if present) over "
        "its op's sample calls against the op in float64; exit 1 on any error over tolerance",
    )
    parser.set_defaults(run=run)


@dataclass
class Finding:
    """Calls of one op interface on one device that dispatch cannot serve, of one kind."""

    kind: str  # "gap" or "ambiguity"
    where: str
    device: str
    calls: list[Judgement] = field(default_factory=list)
    message: str = ""  # set instead of calls when the op cannot even be constructed

    def text(self) -> str:
        if self.message:
            return f"{self.kind.upper()} {self.where}: {self.message}"
        first = self.calls[0]
        lines = [f"{self.kind.upper()} {self.where} on {self.device}: {len(self.calls)} call(s)"]
        lines += [f"  e.g. {j.call!r}" for j in self.calls[:EXAMPLES]]
        lines += [f"  {v.line().strip()}" for v in first.verdicts]
        return "\n".join(lines)


@dataclass
class Audit:
    findings: dict[tuple[str, str, str], Finding] = field(default_factory=dict)
    chosen: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    keys: dict[str, list[Candidate]] = field(default_factory=dict)
    unserved_devices: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    notes: list[str] = field(default_factory=list)
    probes: int = 0

    def record(self, where: str, device: str, judgement: Judgement) -> None:
        self.probes += 1
        if judgement.winner is not None:
            self.chosen[where].add(judgement.winner.key)
            return
        if not judgement.device_served:
            self.unserved_devices[where].add(device)
            return
        kind = "ambiguity" if any(v.status == TIED for v in judgement.verdicts) else "gap"
        slot = (kind, where, device)
        self.findings.setdefault(slot, Finding(kind, where, device)).calls.append(judgement)

    def never_chosen(self) -> list[str]:
        return [
            f"{where}: {c.key} [{c.source}] is never chosen on any probed call; check its "
            "devices, supported_archs, refusal and the preferences around it"
            for where, cands in self.keys.items()
            for c in cands
            if c.key not in self.chosen[where]
        ]


def parse_archs(text: str) -> list[int]:
    """`80,90` -> [80, 90]; only archs with a typical board (devices.PROFILES) can be probed."""
    known = ", ".join(map(str, devices.PROFILES))
    archs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) not in devices.PROFILES:
            raise ValueError(
                f"audit --arch {text}: {part!r} is no arch audit simulates; it knows {known}"
            )
        archs.append(int(part))
    return archs


def run(args: argparse.Namespace) -> Outcome:
    LOADER.ensure_loaded()
    archs = parse_archs(args.arch)
    names = args.ops or sorted(REGISTRY.known_ops)
    op_classes = [REGISTRY.op_class(name) for name in names]
    if args.numerics:
        return run_numerics([c for c in op_classes if c.interfaces and c.signature is not None])
    audit = Audit()
    targets = [(torch.device("cpu"), None)]
    targets += [(torch.device("cuda:0"), devices.facts_for(arch)) for arch in archs]
    for op_cls in op_classes:
        audit_op(op_cls, targets, audit)
    selected = {op_cls.op_name for op_cls in op_classes}
    audit_claims(targets, selected, audit)
    audit.notes += [str(h) for h in hints.installed_hints(table_for) if h.op in selected]
    return Outcome(render(audit, len(op_classes), targets), 1 if audit.findings else 0)


def run_numerics(op_classes: list[type]) -> Outcome:
    """`audit --numerics`: see tileops.numerics; on the GPU when there is one."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = numerics.audit_numerics(op_classes, device)
    status = 0 if all(r.ok for r in results) else 1
    return Outcome(numerics.report(results, device), status)


def audit_op(
    op_cls: type, targets: list[tuple[torch.device, DeviceFacts | None]], audit: Audit
) -> None:
    """Judge every probe call of every interface of `op_cls` on every device."""
    try:
        table = table_for(op_cls)
    except KernelDeclarationError as exc:
        message = f"cannot be constructed: {exc}"
        audit.findings[("broken", op_cls.op_name, "-")] = Finding(
            "broken", op_cls.op_name, "-", [], message
        )
        return
    for interface, cands in table.candidates.items():
        where = f"{op_cls.op_name}.{interface}"
        call_cls = getattr(op_cls.interfaces[interface], "call_spec", None)
        if call_cls is None:
            audit.notes.append(f"{where}: its interface declares no call_spec; not probed")
            continue
        audit.keys[where] = list(cands)
        try:
            grid = list(probe_fields(call_cls, cands))
        except TypeError as exc:
            audit.notes.append(f"{where}: not probed: {exc}")
            continue
        for device, facts in targets:
            label = devices.label(device, facts)
            with devices.simulated(device, facts):
                for fields in grid:
                    judge(table, interface, call_cls(device=device, **fields), where, label, audit)


def audit_claims(
    targets: list[tuple[torch.device, DeviceFacts | None]], ops: set[str], audit: Audit
) -> None:
    """Targets claiming a probed device without builders for some audited op, and detectors
    that raise or answer no bool."""
    found = claims.check(targets, ops)
    for claim in found.unserved:
        slot = ("unserved claim", claim.owner, "-")
        audit.findings[slot] = Finding(*slot, [], claim.consequence())
    for target, error in found.broken.items():
        slot = ("broken", f"target {target!r}", "-")
        audit.findings[slot] = Finding(*slot, [], error)


def judge(
    table: KernelTable, interface: str, call: CallSpec, where: str, device: str, audit: Audit
) -> None:
    audit.record(where, device, table.judge(interface, call))


def probe_fields(call_cls: type[CallSpec], cands: Iterable[Candidate]) -> Iterator[dict]:
    """The field values of every probe call of `call_cls`, for kernels `cands`."""
    cands = list(cands)
    types = probe.field_types(call_cls)
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(call_cls)
        if f.default is not dataclasses.MISSING
    }
    if not any(_refuses(c.cls) for c in cands):
        yield {name: defaults.get(name, _placeholder(hint)) for name, hint in types.items()}
        return
    sweep = {
        n: sorted(_sizes(n, cands)) for n, h in types.items() if h is int and n not in defaults
    }
    choices = {
        n: [defaults[n]] if n in defaults else _choices(n, h)
        for n, h in types.items()
        if n not in sweep
    }
    categorical = [dict(zip(choices, combo, strict=True)) for combo in _product(choices)]
    for sizes in _size_grid(sweep):
        for other in categorical:
            yield {**sizes, **other}


def _refuses(cls: type[Kernel]) -> bool:
    return cls.refusal.__func__ is not Kernel.refusal.__func__


def _sizes(name: str, cands: list[Candidate]) -> set[int]:
    """Powers of two up to 2**20 and their neighbours, and the kernels' declared boundaries."""
    points = {2**p for p in range(21)}
    for cand in cands:
        points |= set(getattr(cand.cls, "boundaries", {}).get(name, ()))
    return {max(p + d, 1) for p in points for d in (-1, 0, 1)}


def _size_grid(sweep: dict[str, list[int]]) -> Iterator[dict[str, int]]:
    """One field at a time over its sizes, the others held at each of BASES."""
    if not sweep:
        yield {}
        return
    seen = set()
    for name, sizes in sweep.items():
        others = [n for n in sweep if n != name]
        for size, base in itertools.product(sizes, BASES if others else (BASES[0],)):
            point = {**dict.fromkeys(others, base), name: size}
            key = tuple(sorted(point.items()))
            if key not in seen:
                seen.add(key)
                yield point


def _choices(name: str, hint: Any) -> list[Any]:
    if hint is torch.dtype:
        return list(FLOAT_DTYPES)
    if hint is bool:
        return [True, False]
    if hint is float:
        return [1e-5]
    raise TypeError(f"field {name!r} ({hint}) has no probe values; only int, float, bool, dtype")


def _placeholder(hint: Any) -> Any:
    """Any value of the field's type: no kernel of the interface reads the fields."""
    for kind, value in ((bool, True), (int, 1), (float, 1e-5), (str, ""), (tuple, ())):
        if hint is kind or getattr(hint, "__origin__", None) is kind:
            return value
    return torch.float32 if hint is torch.dtype else None


def _product(choices: dict[str, list[Any]]) -> Iterator[tuple]:
    return itertools.product(*choices.values())


def render(audit: Audit, ops: int, targets: list[tuple[torch.device, Any]]) -> str:
    where = ", ".join(devices.label(d, f) for d, f in targets)
    lines = [f"audit: {ops} op(s), {len(audit.keys)} interface(s), {audit.probes} calls on {where}"]
    lines += [finding.text() for finding in audit.findings.values()]
    for iface, devs in sorted(audit.unserved_devices.items()):
        lines.append(f"note: {iface} has no kernel for {', '.join(sorted(devs))} (not a gap)")
    lines += [f"warning: {note}" for note in [*audit.notes, *audit.never_chosen()]]
    kinds = [f.kind for f in audit.findings.values()]
    if kinds:
        counts = ", ".join(f"{kinds.count(k)} {k}(s)" for k in dict.fromkeys(kinds))
        lines.append(f"FAILED: {counts}")
    else:
        lines.append("OK: every probed call is served by exactly one kernel")
    return "\n".join(lines)
