"""`tileops list`: what is installed, as text or JSON.

Backends as they describe themselves, every op with its interfaces (and their call specs), every
key with its declarations and distribution, the targets with the ops each serves, and the
backends that failed to load. The JSON form carries the same facts for tools.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .. import backend
from ..errors import KernelDeclarationError
from ..registry import REGISTRY
from ..selection import Candidate
from ..table import table_for
from .output import Outcome


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("list", help="backends, ops, interfaces, keys, targets, failures")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> Outcome:
    facts = installed()
    return Outcome.of_json(facts) if args.json else Outcome(render(facts))


def installed() -> dict[str, Any]:
    """Everything `tileops list` shows, as plain data."""
    infos = backend.backends()
    return {
        "backends": [dataclasses.asdict(info) for info in infos],
        "ops": [_op(name, op_cls) for name, op_cls in sorted(REGISTRY.known_ops.items())],
        "targets": targets(),
        "default_target": REGISTRY.default_target,
        "load_failures": backend.load_failures(),
    }


def targets() -> list[dict[str, Any]]:
    """Each target: who registered its detector, and the ops it has builders for."""
    detectors = REGISTRY.detectors
    found = []
    for name in backend.registered_targets():
        builders = sorted((b for b in REGISTRY.builders() if b.target == name), key=_op_of)
        detector = detectors.get(name)
        found.append(
            {
                "name": name,
                "detector": str(detector.source) if detector else None,
                "serves": {b.op.op_name: str(b.source) for b in builders},
            }
        )
    return found


def _op_of(builder: Any) -> str:
    return builder.op.op_name


def _op(name: str, op_cls: type) -> dict[str, Any]:
    try:
        candidates = table_for(op_cls).candidates
    except KernelDeclarationError as exc:  # show the rest; this op cannot be constructed
        return {"name": name, "error": str(exc), "interfaces": []}
    interfaces = []
    for interface, cands in candidates.items():
        iface_cls = op_cls.interfaces[interface]
        call_cls = getattr(iface_cls, "call_spec", None)
        interfaces.append(
            {
                "name": interface,
                "class": iface_cls.__name__,
                "call_spec": call_cls.__name__ if call_cls else None,
                "call_fields": [f.name for f in dataclasses.fields(call_cls)][1:]
                if call_cls
                else [],
                "keys": [_key(c) for c in cands],
            }
        )
    return {"name": name, "error": None, "interfaces": interfaces}


def _key(cand: Candidate) -> dict[str, Any]:
    cls = cand.cls
    archs = cls.supported_archs
    return {
        "key": cand.key,
        "source": cand.source,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "devices": sorted(cls.devices),
        "supported_archs": None if archs is None else sorted(archs),
        "general": cls.general,
        "preferred_over": sorted(cls.preferred_over),
    }


def render(facts: dict[str, Any]) -> str:
    """The text form of `installed()`."""
    lines = ["Backends:"]
    lines += [
        f"  {b['entry_point']} ({b['distribution']} {b['version']}, protocol "
        f"{b['protocol'] or 'undeclared'}) devices: {', '.join(b['devices']) or '-'}"
        for b in facts["backends"]
    ] or ["  none"]
    lines.append("Ops:")
    for op in facts["ops"]:
        if op["error"]:
            lines.append(f"  {op['name']}: cannot be constructed: {op['error']}")
        for iface in op["interfaces"]:
            fields = ", ".join(iface["call_fields"])
            lines.append(
                f"  {op['name']}.{iface['name']}  ({iface['class']}; call spec "
                f"{iface['call_spec']}: {fields})"
            )
            lines += [_key_line(k) for k in iface["keys"]]
    lines.append("Targets:" if facts["targets"] else "Targets: none")
    for target in facts["targets"]:
        served = ", ".join(n.rpartition("::")[2] for n in target["serves"]) or "no op"
        lines.append(
            f"  {target['name']}: serves {served}; detector from {target['detector'] or 'nobody'}"
        )
    lines.append(f"Default target: {facts['default_target'] or 'none (detectors decide)'}")
    failures = facts["load_failures"]
    lines.append("Load failures:" if failures else "Load failures: none")
    lines += [f"  {f}" for f in failures]
    return "\n".join(lines)


def _key_line(key: dict[str, Any]) -> str:
    where = ",".join(key["devices"])
    if key["supported_archs"] is not None:
        where += " sm_" + "/".join(map(str, key["supported_archs"]))
    rank = "general" if key["general"] else ""
    if key["preferred_over"]:
        rank = "over " + ",".join(key["preferred_over"])
    return f"    {key['key']:<20} {where:<24} {key['source']:<44} {rank}".rstrip()
