"""What a kernel needs from the machine before its first launch, and whether the machine has it.

A backend declares `requires = Requirements(modules=("tilelang",), torch=(2, 4), cuda=(12, 1))`
on its kernel classes (a shared base class is enough). A kernel whose needs the machine lacks
is unavailable, with the missing piece as its reason in every error, `explain` and `tileops
doctor`, instead of crashing at its first launch.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass

import torch

Version = tuple[int, ...]


@dataclass(frozen=True)
class Requirements:
    """`modules` importable (not imported), torch at least `torch` and below `torch_below`, a
    CUDA runtime (torch.version.cuda) of at least `cuda`, and a driver that supports CUDA
    `driver` or later (what cudaDriverGetVersion reports)."""

    modules: tuple[str, ...] = ()
    torch: Version | None = None
    torch_below: Version | None = None
    cuda: Version | None = None
    driver: Version | None = None

    def unmet(self) -> str | None:
        """A sentence naming the first need this machine does not meet, or None."""
        return _unmet(self)


@functools.cache
def _unmet(needs: Requirements) -> str | None:
    for module in needs.modules:
        if importlib.util.find_spec(module) is None:
            return f"needs the Python module {module!r}, which is not installed"
    have = _version(torch.__version__)
    if needs.torch is not None and have < needs.torch:
        return f"needs torch >= {_text(needs.torch)}, this is {torch.__version__}"
    if needs.torch_below is not None and have >= needs.torch_below:
        return f"needs torch < {_text(needs.torch_below)}, this is {torch.__version__}"
    if needs.cuda is not None:
        runtime = torch.version.cuda
        if runtime is None or _version(runtime) < needs.cuda:
            return f"needs a CUDA runtime >= {_text(needs.cuda)}, torch has {runtime or 'none'}"
    if needs.driver is not None:
        driver = driver_version()
        if driver is None or driver < needs.driver:
            shown = _text(driver) if driver else "none"
            return f"needs a driver for CUDA >= {_text(needs.driver)}, this machine's is {shown}"
    return None


def driver_version() -> Version | None:
    """The CUDA driver's version as (major, minor), or None without one."""
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None or not torch.cuda.is_available():
        return None
    code = get()
    return (code // 1000, code % 1000 // 10)


def _version(text: str) -> Version:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _text(version: Version) -> str:
    return ".".join(map(str, version))
