"""The `tileops` command: what is installed, and why a call would get the kernel it gets.

tileops list                         ops, interfaces, keys, backends, targets, failures
tileops explain OP INTERFACE [FIELD=VALUE ...] [--device cuda:0 --arch 90 --sm-count 132]
tileops --version                    tileops-core's version

Exit status: 0 on success; 1 when `explain` finds that dispatch would fail (the verdicts are
still printed); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import typing
from collections.abc import Sequence

import torch

from . import backend
from .backend.registry import REGISTRY
from .errors import KernelDeclarationError, TileOpsError
from .explain import Explanation
from .table import table_for
from .testing import simulate_device


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result = args.run(args)
    except (TileOpsError, KeyError, ValueError, TypeError) as exc:
        print(f"tileops: {exc}", file=sys.stderr)
        return 2
    print(result)
    return 1 if isinstance(result, Explanation) and result.error is not None else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tileops", description=__doc__.splitlines()[0])
    version = importlib.metadata.version("tileops-core")
    parser.add_argument("--version", action="version", version=f"tileops-core {version}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    listing = sub.add_parser("list", help="ops, their kernels, backends, targets, load failures")
    listing.set_defaults(run=_list)
    explain = sub.add_parser("explain", help="every kernel's verdict on one call")
    explain.add_argument("op", help="op class name, e.g. RMSNormFwdOp")
    explain.add_argument("interface", help="kernel interface name, e.g. rms_norm")
    explain.add_argument("fields", nargs="*", metavar="FIELD=VALUE", help="call-spec fields")
    explain.add_argument("--device", default="cpu", help="call device (default cpu)")
    explain.add_argument("--arch", type=int, help="simulate this compute capability, e.g. 90")
    explain.add_argument("--sm-count", type=int, default=132, help="simulated SM count")
    explain.add_argument("--calibration", help="simulated board model, e.g. 'NVIDIA H200'")
    explain.add_argument("--smem-budget", type=int, default=232448, help="simulated bytes/block")
    explain.set_defaults(run=_explain)
    return parser


def _list(args: argparse.Namespace) -> str:
    infos = backend.backends()
    lines = ["Ops:"]
    for name, op_cls in sorted(REGISTRY.known_ops.items()):
        if not op_cls.interfaces:
            continue
        try:
            candidates = table_for(op_cls).candidates
        except KernelDeclarationError as exc:  # show the rest; this op cannot be constructed
            lines.append(f"  {name}: cannot be constructed: {exc}")
            continue
        for interface, cands in candidates.items():
            lines.append(f"  {name}.{interface}")
            for c in cands:
                devices = ",".join(sorted(c.cls.devices))
                lines.append(f"    {c.key:<20} {devices:<12} {c.source}")
    lines.append("Backends:")
    lines += [
        f"  {b.entry_point} ({b.distribution} {b.version}) devices: {', '.join(b.devices) or '-'}"
        for b in infos
    ] or ["  none"]
    lines.append(f"Targets: {', '.join(backend.registered_targets()) or 'none'}")
    failures = backend.load_failures()
    lines.append("Load failures:" if failures else "Load failures: none")
    lines += [f"  {f}" for f in failures]
    return "\n".join(lines)


def _explain(args: argparse.Namespace) -> Explanation:
    backend.backends()  # load backends before reading tables
    op_cls = REGISTRY.op_class(args.op)
    interface_cls = op_cls.interfaces.get(args.interface)
    if interface_cls is None:
        raise KeyError(
            f"{op_cls.op_name} has no interface {args.interface!r}; "
            f"it has {', '.join(op_cls.interfaces)}"
        )
    call_cls = getattr(interface_cls, "call_spec", None)
    if call_cls is None:
        raise TypeError(f"{interface_cls.__name__} declares no call_spec class to build")
    device = _device(args.device)
    call = call_cls(device=device, **_parse_fields(call_cls, args.fields))
    table = table_for(op_cls)
    if args.arch is None and device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"this machine has no {device}; pass --arch (and --sm-count) to simulate")
    if args.arch is None:
        return table.explain(args.interface, call)
    with simulate_device(
        device,
        arch=args.arch,
        sm_count=args.sm_count,
        calibration=args.calibration,
        smem_budget=args.smem_budget,
    ):
        return table.explain(args.interface, call)


def _device(text: str) -> torch.device:
    try:
        return torch.device(text)
    except RuntimeError:  # torch's message is a paragraph; one line is enough here
        raise ValueError(
            f"--device {text!r} is not a torch device (e.g. cpu, cuda, cuda:0)"
        ) from None


def _parse_fields(call_cls: type, fields: Sequence[str]) -> dict[str, object]:
    hints = typing.get_type_hints(call_cls, vars(sys.modules[call_cls.__module__]) | vars(typing))
    values: dict[str, object] = {}
    for item in fields:
        name, sep, text = item.partition("=")
        if not sep or name not in hints or name == "device":
            known = ", ".join(n for n in hints if n != "device")
            raise ValueError(f"expected FIELD=VALUE with FIELD one of {known}, got {item!r}")
        values[name] = _convert(name, hints[name], text)
    return values


BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _convert(name: str, hint: object, text: str) -> object:
    if hint is torch.dtype:
        dtype = getattr(torch, text, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(
                f"field {name!r}: {text!r} is not a torch dtype (e.g. float16, bfloat16, float32)"
            )
        return dtype
    if hint is bool:
        if text.lower() not in BOOLS:
            raise ValueError(f"field {name!r} expects a bool ({', '.join(BOOLS)}), got {text!r}")
        return BOOLS[text.lower()]
    for kind in (int, float):
        if hint is kind or kind in typing.get_args(hint):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(
                    f"field {name!r} expects {'an int' if kind is int else 'a float'}, got {text!r}"
                ) from None
    return text


if __name__ == "__main__":
    sys.exit(main())
