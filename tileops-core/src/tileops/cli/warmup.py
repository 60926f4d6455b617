"""`tileops warmup`: build (compile) the entries some calls need, before the first real call.

A first call pays for selection and for its kernel's build, which for a compiled kernel takes
seconds. Warmup makes those calls' requests (the op's own, found as `explain` finds them) and
builds their entries through the dispatcher, so backends' disk caches are filled and a server
starts hot. It runs no kernel. Build times come from the `tileops_entry_built` hook: the same
one telemetry uses. Every call is checked before any is built: a shape or dtype the op cannot
take is a usage error (exit 2), a build that fails is reported (exit 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import observe
from ..errors import TileOpsError
from ..plugins import hookimpl
from ..registry import REGISTRY
from . import devices, explain_command, probe
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
    explain_command.add_device_options(parser)
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
    device = explain_command.parse_device(args.device)
    facts = explain_command.simulated_facts(args, device)
    params = probe.parse_params(args.param)
    builds, failures = Builds(), []
    observe.add_observer(builds)
    started = time.perf_counter()
    try:
        with devices.simulated(device, facts):
            # Every request first: a usage error stops the command before anything is built.
            requests = [prepare(*job, params, device) for job in _jobs(args)]
            for done, (what, req) in enumerate(requests, 1):
                failure = warm(what, req)
                if failure:
                    failures.append(failure)
                _progress(done, len(requests), what)
    finally:
        observe.remove_observer(builds)
    summary = _summary(builds, failures, len(requests), time.perf_counter() - started)
    return Outcome(summary, 1 if failures else 0)


def _jobs(args: argparse.Namespace) -> list[tuple[type, str, torch.dtype]]:
    """(op class, shape text, dtype) for every combination the flags name."""
    dtypes = [probe.parse_dtype(d.strip()) for d in args.dtype.split(",")]
    ops = [REGISTRY.op_class(op) for op in args.op]
    return [(op, text, d) for op in ops for text in args.shapes.split(";") for d in dtypes]


def prepare(
    op_cls: type, text: str, dtype: torch.dtype, params: dict, device: torch.device
) -> tuple[str, probe.Request]:
    """The request one call makes, or a usage error (exit 2) naming the flag or the call."""
    try:
        shape = probe.parse_shape(text)
        op = probe.make_op(op_cls, shape, params)
        inputs = probe.make_inputs(op, shape, dtype, torch.device("meta"))
    except probe.ShapeError as exc:
        raise ValueError(f"--shapes {text}: {exc}") from None
    what = _what(op_cls, shape, dtype)
    try:
        return what, probe.request(op, inputs, device)
    except (TileOpsError, ValueError) as exc:  # the op's own input checks
        raise ValueError(f"{what}: {exc}") from None


def warm(what: str, req: probe.Request) -> str | None:
    """Build the entry one call needs; returns why it failed, or None."""
    try:
        req.op.kernel_for(req.interface, req.call)
    except Exception as exc:  # report every failure and go on with the other calls
        return f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def _what(op_cls: type, shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{op_cls.__name__} {'x'.join(map(str, shape))} {probe.dtype_name(dtype)}"


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
