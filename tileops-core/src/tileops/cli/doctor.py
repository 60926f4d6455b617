"""`tileops doctor`: is this environment in shape, and what to do about each problem.

Facts first (versions, GPUs, operator settings), then findings, each with a remedy. Problems
that break dispatch for someone (a backend that failed to load, an op that cannot be
constructed, a target claiming a device of this machine for ops it cannot build, a broken
detector) make the exit status 1; suspicious declarations are warnings.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from .. import backend, hints
from ..errors import KernelDeclarationError
from ..plugins import LOADER
from ..registry import REGISTRY
from ..table import table_for
from . import audit, claims, devices
from .output import Outcome

PACKAGES = ("torch", "triton", "tilelang", "pluggy")
"""Third-party packages whose versions matter to tileops (read from metadata, not imported)."""

SETTINGS_PREFIX = "TILEOPS_"
"""Every environment variable of this prefix is shown: backends lists, logs, operator rules."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("doctor", help="versions, GPUs, load failures, settings, advice")
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class Problem:
    severe: bool
    text: str
    remedy: str

    def render(self) -> str:
        return f"  {'ERROR' if self.severe else 'warning'}: {self.text}\n    -> {self.remedy}"


def run(args: argparse.Namespace) -> Outcome:
    LOADER.ensure_loaded()
    problems = [*load_problems(), *op_problems(), *claim_problems(), *audit_problems()]
    problems += hint_problems()
    lines = ["Versions:", *versions(), "GPUs:", *gpus(), "Settings:", *settings()]
    lines.append("Problems:" if problems else "Problems: none")
    lines += [p.render() for p in problems]
    return Outcome("\n".join(lines), 1 if any(p.severe for p in problems) else 0)


def versions() -> list[str]:
    lines = [f"  python {platform.python_version()} ({platform.platform()})"]
    for name in PACKAGES:
        lines.append(f"  {name} {_version(name)}")
    dists = sorted(
        {d.metadata["Name"] for d in importlib.metadata.distributions()}
        & ({"tileops-core"} | {b.distribution for b in backend.backends()})
    )
    lines += [f"  {name} {_version(name)}" for name in dists]
    return lines


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gpus() -> list[str]:
    build = f"torch built with CUDA {torch.version.cuda or '-'}, ROCm {torch.version.hip or '-'}"
    if not torch.cuda.is_available():
        return [f"  none visible ({build}); ops run on the CPU through the reference kernels"]
    lines = [f"  {build}"]
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        smem = getattr(props, "shared_memory_per_block_optin", 0)
        lines.append(
            f"  cuda:{index} {props.name}: sm_{props.major}{props.minor}, "
            f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
            f"{smem} B shared memory per block"
        )
    return lines


def settings() -> list[str]:
    lines = [
        f"  {name}={value!r}"
        for name, value in sorted(os.environ.items())
        if name.startswith(SETTINGS_PREFIX)
    ]
    lines.append(f"  default target: {REGISTRY.default_target or 'none (detectors decide)'}")
    return lines if len(lines) > 1 else ["  no TILEOPS_* variable set", *lines]


def load_problems() -> list[Problem]:
    found = []
    for failure in LOADER.failures:
        if failure.distribution == "operator setting":
            remedy = "fix or remove the entry the message names in that TILEOPS_* variable"
        elif failure.distribution == "not installed":
            remedy = "fix the name in the variable, or install the backend that provides it"
        elif "protocol" in failure.error:
            remedy = "upgrade the side the message names, so both speak one protocol"
        else:
            remedy = (
                f"reinstall or fix {failure.distribution}; meanwhile "
                f"TILEOPS_DISABLE_BACKENDS={failure.entry_point} skips it without this warning"
            )
        what = (
            "operator setting ignored"
            if failure.distribution == "operator setting"
            else ("backend not loaded")
        )
        text = failure.error if failure.distribution == "operator setting" else str(failure)
        found.append(Problem(True, f"{what}: {text}", remedy))
    return found


def op_problems() -> list[Problem]:
    found = []
    for name, op_cls in sorted(REGISTRY.known_ops.items()):
        try:
            table_for(op_cls)
        except KernelDeclarationError as exc:
            remedy = "fix the kernel class the message names, or uninstall its backend"
            found.append(Problem(True, f"{name} cannot be constructed: {exc}", remedy))
    return found


def claim_problems() -> list[Problem]:
    """Targets claiming a device of this machine for ops they cannot build, and detectors
    that break: calls settled there raise for everyone."""
    here = [torch.device("cpu")]
    if torch.cuda.is_available():
        here += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    found = claims.check([(device, None) for device in here])
    remedy = (
        "its backend must register builders for those ops or claim only devices it serves; "
        "meanwhile construct such ops with target=BUILTIN, or call "
        "tileops.backend.set_default_target(BUILTIN)"
    )
    problems = [Problem(True, f"{c.owner} {c.consequence()}", remedy) for c in found.unserved]
    fix = "fix the detector (its backend's maintainers can); it must return True or False"
    return problems + [Problem(True, error, fix) for error in found.broken.values()]


def audit_problems() -> list[Problem]:
    """`tileops audit`'s sweep (the CPU and the simulated GPUs it probes): a call two kernels
    serve with no preference between them, or that no kernel serves, fails dispatch for
    whoever makes it, so doctor says so as audit does."""
    sweep = audit.Audit()
    targets = [(torch.device("cpu"), None)]
    targets += [(torch.device("cuda:0"), devices.facts_for(a)) for a in devices.AUDIT_ARCHS]
    for name in sorted(REGISTRY.known_ops):
        audit.audit_op(REGISTRY.known_ops[name], targets, sweep)
    remedy = (
        "for an ambiguity, declare `preferred_over` on one of the kernels (or settle it with "
        "TILEOPS_PREFER); for a gap, widen a refusal; `tileops audit OP` lists the calls"
    )
    return [Problem(True, f.text(), remedy) for f in sweep.findings.values() if not f.message]


def hint_problems() -> list[Problem]:
    remedy = "fix the declaration on the kernel class (its backend's maintainers can)"
    return [Problem(False, str(hint), remedy) for hint in hints.installed_hints(table_for)]
