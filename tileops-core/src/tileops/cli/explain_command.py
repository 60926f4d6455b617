"""`tileops explain`: every key's verdict on one call, the winner, and the target that serves it.

Two ways to name the call. By inputs (`--shape 8,4096 --dtype bfloat16`): the op builds the call
spec it would build for those inputs (see probe.py). By call-spec fields (`rms_norm n=4096
dtype=float16 ...`): any interface of any op, third parties' included. Either way on the real
device or a simulated one (`--arch 90` stands for an H200; see devices.py).
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import backend
from ..callspec import CallSpec
from ..device import DeviceFacts
from ..errors import TileOpsError
from ..explanation import Explanation
from ..op import Op
from ..plugins import LOADER
from ..registry import BUILTIN, REGISTRY
from ..table import table_for
from ..targets import choose_target
from . import devices, probe
from .output import Outcome


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "explain",
        help="every key's verdict on one call, and the target",
        description="Every key's verdict on one call. Name the call by its inputs (--shape, "
        "--dtype) or by its call-spec fields (INTERFACE FIELD=VALUE ...).",
    )
    parser.add_argument("op", help="op class name, e.g. RMSNormFwdOp")
    parser.add_argument("interface", nargs="?", help="kernel interface, for the FIELD=VALUE form")
    parser.add_argument("fields", nargs="*", metavar="FIELD=VALUE", help="call-spec fields")
    parser.add_argument("--shape", help="the first input's shape, e.g. 8,4096 (GemmOp: M,N,K)")
    parser.add_argument("--dtype", default="float32", help="the inputs' dtype (default float32)")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor argument of the op, e.g. training=False",
    )
    parser.add_argument(
        "--omit",
        action="append",
        default=[],
        metavar="INPUT",
        help="leave this optional input out, e.g. bias",
    )
    parser.add_argument("--target", help="construct the op with target=TARGET")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_device_options(parser)
    parser.set_defaults(run=run)


def add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="call device (default cpu)")
    parser.add_argument("--arch", type=int, help="simulate this compute capability, e.g. 90")
    parser.add_argument("--sm-count", type=int, help="simulated SM count (default: the arch's)")
    parser.add_argument("--calibration", help="simulated board model, e.g. h200")
    parser.add_argument("--smem-budget", type=int, help="simulated shared memory bytes/block")


@dataclass(frozen=True)
class TargetVerdict:
    """Which target an op instance settles on for the device, why, and whether it serves."""

    name: str | None
    text: str
    serves: bool
    source: str | None = None


@dataclass
class Report:
    op: str
    device_line: str
    explanation: Explanation
    target: TargetVerdict
    request: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        failed = self.explanation.error is not None and self.target.name in (None, BUILTIN)
        return 1 if failed or not self.target.serves else 0

    def text(self) -> str:
        head = [f"call: {self.request}"] if self.request else []
        head += [f"device: {self.device_line}", f"target: {self.target.text}"]
        return "\n".join([*head, self.explanation.text])

    def data(self) -> dict[str, Any]:
        judgement, error = self.explanation.judgement, self.explanation.error
        source = self.explanation.winner_source
        return {
            "op": self.op,
            "interface": judgement.interface,
            "call": repr(judgement.call),
            "request": self.request,
            "device": self.device_line,
            "winner": self.explanation.chosen,
            "winner_source": source,
            "winner_distribution": source and distribution_of(source),
            "verdicts": self.explanation.verdicts(),
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "target": self.target.name,
            "target_text": self.target.text,
            "target_serves": self.target.serves,
            "notes": self.explanation.notes(),
        }


def run(args: argparse.Namespace) -> Outcome:
    backend.backends()  # load backends before reading tables
    op_cls = REGISTRY.op_class(args.op)
    device = parse_device(args.device)
    facts = simulated_facts(args, device)
    with devices.simulated(device, facts):
        if args.shape is not None:
            if args.interface or args.fields:
                raise ValueError("pass either --shape (and --dtype) or INTERFACE FIELD=VALUE ...")
            report = by_inputs(op_cls, args, device)
        else:
            report = by_fields(op_cls, args, device)
    report.device_line = devices.describe(device, facts)
    if args.json:
        return Outcome.of_json(report.data(), report.status)
    return Outcome(report.text(), report.status)


SIMULATED_FACTS = ("sm_count", "calibration", "smem_budget")


def simulated_facts(args: argparse.Namespace, device: torch.device) -> DeviceFacts | None:
    """The facts to simulate, or None for the real device (which must then exist). Facts
    describe a GPU: they need --arch and a cuda device, never a device they cannot apply to."""
    if args.arch is None:
        given = [name for name in SIMULATED_FACTS if getattr(args, name) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(
                f"{flag} is a simulated GPU fact: pass --arch (and --device cuda) with it"
            )
        missing = devices.missing(device)
        if missing:
            raise ValueError(f"{missing}; pass --arch (and --sm-count) to simulate")
        return None
    if device.type != "cuda":
        raise ValueError(
            f"--arch simulates a GPU: pass --device cuda (or cuda:N) with it, not --device {device}"
        )
    return devices.facts_for(args.arch, args.sm_count, args.calibration, args.smem_budget)


def by_inputs(op_cls: type[Op], args: argparse.Namespace, device: torch.device) -> Report:
    dtype = probe.parse_dtype(args.dtype)
    try:
        shape = probe.parse_shape(args.shape)
        op = probe.make_op(op_cls, shape, probe.parse_params(args.param), args.target)
        inputs = probe.make_inputs(op, shape, dtype, torch.device("meta"), args.omit)
    except probe.ShapeError as exc:
        raise ValueError(f"--shape {args.shape}: {exc}") from None
    req = probe.request(op, inputs, device)
    explanation = op.explain(req.interface, req.call)
    return Report(op_cls.op_name, "", explanation, settle(op, device), req.describe())


def by_fields(op_cls: type[Op], args: argparse.Namespace, device: torch.device) -> Report:
    if args.interface is None:
        raise ValueError("name the call: --shape (and --dtype), or INTERFACE FIELD=VALUE ...")
    interface_cls = op_cls.interfaces.get(args.interface)
    if interface_cls is None:
        raise KeyError(
            f"{op_cls.op_name} has no interface {args.interface!r}; "
            f"it has {', '.join(op_cls.interfaces)}"
        )
    call_cls = getattr(interface_cls, "call_spec", None)
    if call_cls is None:
        raise TypeError(f"{interface_cls.__name__} declares no call_spec class to build")
    call = call_cls(device=device, **parse_fields(call_cls, args.fields))
    explanation = table_for(op_cls).explain(args.interface, call)
    try:
        op = op_cls(**probe.parse_params(args.param), target=args.target)
    except TypeError:  # the op needs constructor arguments the field form does not give
        text = "not shown: pass --shape, or the op's arguments with --param, to see it"
        return Report(op_cls.op_name, "", explanation, TargetVerdict(None, text, True))
    return Report(op_cls.op_name, "", explanation, settle(op, device))


def settle(op: Op, device: torch.device) -> TargetVerdict:
    """The target `op` would settle on for a call on `device`, and whether it serves the call."""
    try:
        name = choose_target(op, device)
    except TileOpsError as exc:
        return TargetVerdict(None, f"{type(exc).__name__}: {exc}", False)
    why = _why(op, name, device)
    if name == BUILTIN:
        return TargetVerdict(BUILTIN, f"{BUILTIN} ({why}): the op's own kernels serve", True)
    builder = REGISTRY.builder(type(op), name)
    if builder is None:
        text = (
            f"{name} ({why}), which registered no builder for {type(op).op_name}: the call "
            "raises OpNotAvailableError"
        )
        return TargetVerdict(name, text, False)
    text = (
        f"{name} [{builder.source}] ({why}): its builder serves every call of this op "
        "instance; the op's own kernels, judged below, would not run"
    )
    return TargetVerdict(name, text, True, str(builder.source))


def _why(op: Op, name: str, device: torch.device) -> str:
    if op.target is not None:
        return "asked for with target="
    if REGISTRY.default_target is not None:
        return "the process default, set_default_target"
    if name == BUILTIN:
        return f"no target's detector claims {device}"
    return f"its detector claims {device}"


def distribution_of(source: str) -> str:
    """`tileops-cuda, entry point 'cuda'` -> `tileops-cuda`."""
    return source.split(", entry point ", 1)[0]


def parse_device(text: str) -> torch.device:
    """`text` as a torch device. A device kind of its own (`vendorx`) reaches torch as
    privateuse1 under the name its backend gives it with
    `torch.utils.rename_privateuse1_backend`; a backend that declares that device type in its
    info but has not renamed privateuse1 gets it renamed here, so `explain` can ask about it."""
    try:
        return torch.device(text)
    except RuntimeError:  # torch's message is a paragraph; one line is enough here
        pass
    LOADER.ensure_loaded()  # a backend may rename privateuse1 when imported
    kind = text.partition(":")[0]
    declared = {d for info in LOADER.infos.values() for d in info.devices}
    unnamed = torch._C._get_privateuse1_backend_name() == "privateuseone"
    if kind in declared and unnamed:
        torch.utils.rename_privateuse1_backend(kind)
    try:
        return torch.device(text)
    except RuntimeError:
        raise ValueError(
            f"--device {text!r} is not a torch device (e.g. cpu, cuda, cuda:0); a device kind "
            "of its own reaches torch as privateuse1, once its backend names it with "
            f"torch.utils.rename_privateuse1_backend({kind!r}) (docs/backends.md)"
        ) from None


def parse_fields(call_cls: type[CallSpec], fields: Sequence[str]) -> dict[str, object]:
    """`FIELD=VALUE` texts -> call-spec field values, converted by the fields' annotations."""
    hints = probe.field_types(call_cls)
    values: dict[str, object] = {}
    for item in fields:
        name, sep, text = item.partition("=")
        if not sep or name not in hints:
            known = ", ".join(hints)
            raise ValueError(f"expected FIELD=VALUE with FIELD one of {known}, got {item!r}")
        values[name] = convert(name, hints[name], text)
    return values


BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def convert(name: str, hint: object, text: str) -> object:
    """One field's text as the type its annotation names (dtype, bool, int, float, str)."""
    if hint is torch.dtype or torch.dtype in typing.get_args(hint):
        try:
            return probe.parse_dtype(text)
        except ValueError as exc:
            raise ValueError(f"field {name!r}: {exc}") from None
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
