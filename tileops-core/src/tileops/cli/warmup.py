"""`tileops warmup`: build (compile) the entries some calls need, before the first real call.

A first call pays for selection and for its kernel's build, which for a compiled kernel takes
seconds. Warmup makes those calls' requests (the op's own, found as `explain` finds them) and
builds their entries through the dispatcher, so backends' disk caches are filled and a server
starts hot. It runs no kernel. Build times come from the `tileops_entry_built` hook: the same
one telemetry uses.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import observe
from ..backend.plugins import hookimpl
from ..backend.registry import REGISTRY
from . import calls, devices, explaining
from .output import Outcome, table

BAR = 24


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("warmup", help="build the entries some calls need, ahead of time")
    parser.add_argument("--op", action="append", required=True, help="op name (repeatable)")
    parser.add_argument(
        "--shapes", required=True, help="first-input shapes, ';'-separated: 8,4096;1,4096"
    )
    parser.add_argument("--dtype", default="float32", help="dtypes, comma-separated")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    explaining.add_device_options(parser)
    parser.set_defaults(run=run)


@dataclass(eq=False)  # pluggy keeps plugins in sets: hashed by identity
class Builds:
    """Collects `tileops_entry_built` reports while warmup runs."""

    seen: list[tuple[str, str, str, float]] = field(default_factory=list)

    @hookimpl
    def tileops_entry_built(
        self, op: str, interface: str, key: str, source: str, identity: Any, seconds: float
    ) -> None:
        self.seen.append((f"{op.rpartition('::')[2]}.{interface}", key, source, seconds))


def run(args: argparse.Namespace) -> Outcome:
    device = explaining.parse_device(args.device)
    facts = explaining.simulated_facts(args, device)
    jobs = [
        (REGISTRY.op_class(op), calls.parse_shape(shape), calls.parse_dtype(dtype.strip()))
        for op in args.op
        for shape in args.shapes.split(";")
        for dtype in args.dtype.split(",")
    ]
    params = calls.parse_params(args.param)
    builds, failures = Builds(), []
    observe.add_observer(builds)
    started = time.perf_counter()
    try:
        with devices.simulated(device, facts):
            for done, (op_cls, shape, dtype) in enumerate(jobs, 1):
                failure = warm(op_cls, shape, dtype, device, params)
                if failure:
                    failures.append(failure)
                _progress(done, len(jobs), _what(op_cls, shape, dtype))
    finally:
        observe.remove_observer(builds)
    summary = _summary(builds, failures, len(jobs), time.perf_counter() - started)
    return Outcome(summary, 1 if failures else 0)


def warm(
    op_cls: type, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, params: dict
) -> str | None:
    """Build the entry one call needs; returns why it failed, or None."""
    what = _what(op_cls, shape, dtype)
    try:
        op = calls.make_op(op_cls, shape, params)
        inputs = calls.make_inputs(op, shape, dtype, torch.device("meta"))
        req = calls.request(op, inputs, device)
        op.kernel_for(req.interface, req.call)
    except Exception as exc:  # report every failure and go on with the other calls
        return f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def _what(op_cls: type, shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{op_cls.__name__} {'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')}"


def _progress(done: int, total: int, what: str) -> None:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, else one line each."""
    filled = BAR * done // total
    line = f"[{'#' * filled}{'.' * (BAR - filled)}] {done}/{total} {what}"
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r{line:<100}", end=end, file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _summary(builds: Builds, failures: list[str], calls_: int, seconds: float) -> str:
    total = sum(s for *_, s in builds.seen)
    rows = [[where, key, source, f"{s:.3f}"] for where, key, source, s in builds.seen]
    lines = [
        f"warmup: {calls_} call(s), {len(builds.seen)} entr(ies) built in {total:.2f} s "
        f"({seconds:.2f} s in all; entries built before were reused)"
    ]
    if rows:
        lines.append(table(["interface", "key", "distribution", "build s"], rows))
    lines += [f"FAILED {f}" for f in failures]
    return "\n".join(lines)
