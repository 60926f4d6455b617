"""`tileops demo`: the main job. Every op of the catalogue, run here, and what served it.

Runs on the best device present (the first GPU, else the CPU, where the reference kernels
serve), over a few shapes and dtypes per op. Each row names the key that served the call and
its distribution, the largest error against the op's torch definition computed in float64 on
the CPU, and the median time of a call. Then one `explain`; with no GPU here, also the same
call on a simulated H200, to show the GPU kernels that would compete for it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import backend
from ..errors import TileOpsError
from ..op import Op
from ..registry import BUILTIN, REGISTRY
from . import devices, explain_command, probe
from .output import Outcome, table

RUNS: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("LayerNormFwdOp", {}, (8, 1024)),
    ("LayerNormFwdOp", {}, (4, 64, 4096)),
    ("RMSNormFwdOp", {}, (8, 1024)),
    ("RMSNormFwdOp", {}, (4, 64, 4096)),
    ("SoftmaxFwdOp", {}, (8, 1000)),
    ("SoftmaxFwdOp", {}, (256, 4096)),
    ("BatchNormFwdOp", {"training": False}, (8, 32, 16, 16)),
    ("BatchNormFwdOp", {"training": True}, (16, 64, 64)),
    ("GemmOp", {}, (128, 256, 512)),
    ("GemmOp", {}, (1, 4096, 1024)),
]
"""(op, constructor params beyond those the shape implies, first-input shape; GemmOp: M,N,K)."""

DTYPES = (torch.float32, torch.bfloat16)
TIMED_CALLS = 5
EXPLAINED = ("RMSNormFwdOp", (4, 64, 4096), torch.bfloat16)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run every op here: serving kernel, error, time")
    parser.add_argument("--device", help="run here instead (default: cuda if present, else cpu)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> Outcome:
    device = explain_command.parse_device(args.device or best_device())
    check_runnable(device)
    backends = ", ".join(f"{b.distribution} {b.version}" for b in backend.backends()) or "none"
    version = importlib.metadata.version("tileops-core")
    head = [
        f"tileops {version} on {_device_name(device)}; torch {torch.__version__}",
        f"backends: {backends}",
        "",
    ]
    rows = [row(*run_spec, dtype, device) for run_spec in RUNS for dtype in DTYPES]
    headers = ["op", "shape", "dtype", "device", "served by", "max |error|", "time"]
    return Outcome("\n".join([*head, table(headers, rows), "", *explanations(device)]))


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_runnable(device: torch.device) -> None:
    """Refuse, in one line, a device the demo cannot run on: it runs ops on real data."""
    where = f"demo --device {device}"
    if device.type == "meta":
        raise ValueError(
            f"{where}: meta tensors hold no data, so nothing can run or be checked; "
            "pass cpu or cuda"
        )
    missing = devices.missing(device)
    if missing:
        raise ValueError(f"{where}: {missing}; leave --device out to run on the best device here")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:  # torch's message may be a paragraph
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{where}: torch cannot make a tensor there: {first}") from None


def row(
    name: str, params: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype, device: Any
) -> list[str]:
    """One table row: run the op on random inputs here, and say who served it and how well."""
    op_cls = REGISTRY.op_class(name)
    op = probe.make_op(op_cls, shape, params)
    inputs = probe.make_inputs(op, shape, dtype, device)
    label = [name, "x".join(map(str, shape)), str(dtype).replace("torch.", ""), str(device)]
    try:
        expected = _expected(op_cls, op, inputs)
        got = op(*_fresh(inputs))
        served = _served_by(op, inputs, device)
        error = (got.double().cpu() - expected).abs().max().item()
        seconds = _median_time(lambda: op(*_fresh(inputs)), device)
    except TileOpsError as exc:
        return [*label, f"not served: {type(exc).__name__}", "-", "-"]
    return [*label, served, f"{error:.1e}", _duration(seconds)]


def _expected(op_cls: type[Op], op: Op, inputs: tuple) -> torch.Tensor:
    """The op's torch definition in float64 on the CPU: what every kernel is measured against."""
    reference = op_cls(**op.params(), target=BUILTIN)
    doubles = tuple(None if t is None else t.detach().cpu().double() for t in inputs)
    return reference.reference_forward(*doubles)


def _served_by(op: Op, inputs: tuple, device: Any) -> str:
    """The key (and distribution) that served the op's last call, or its target."""
    target = op.settled_target
    if target not in (None, BUILTIN):
        builder = REGISTRY.builder(type(op), target)
        return f"target {target} [{explain_command.distribution_of(str(builder.source))}]"
    req = probe.request(op, tuple(_meta(t) for t in inputs), torch.device(device))
    explanation = op.explain(req.interface, req.call)
    return f"{explanation.chosen} [{explain_command.distribution_of(explanation.winner_source)}]"


def _median_time(call: Callable[[], Any], device: Any) -> float:
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    times = []
    for _ in range(TIMED_CALLS):
        synchronize()
        started = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _fresh(inputs: tuple) -> tuple:
    """Copies, so that ops writing their inputs (BatchNorm's running stats) start alike."""
    return tuple(None if t is None else t.clone() for t in inputs)


def _meta(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def explanations(device: Any) -> list[str]:
    """`explain` for one call here, and on a simulated H200 when there is no GPU."""
    name, shape, dtype = EXPLAINED
    where = [(torch.device(device), None)]
    if torch.device(device).type != "cuda":
        where.append((torch.device("cuda:0"), devices.facts_for(90)))
    lines = []
    for target_device, facts in where:
        with devices.simulated(target_device, facts):
            op = probe.make_op(REGISTRY.op_class(name), shape, {})
            inputs = probe.make_inputs(op, shape, dtype, torch.device("meta"))
            req = probe.request(op, inputs, target_device)
            what = devices.describe(target_device, facts)
            lines += [f"Why this kernel? {req.describe()} {dtype} on {what}:"]
            lines += [str(op.explain(req.interface, req.call)), ""]
    lines.append("More: tileops explain OP --shape ... --dtype ... [--arch 90]; tileops list.")
    return lines


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} (no GPU found)" if not torch.cuda.is_available() else str(device)
