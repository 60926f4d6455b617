"""The protocol backend authors use. Everything here is public; see docs/backends.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import AmbiguousTargetError, BackendError, UnknownTargetError
from ..provenance import caller_source
from ..signature import TensorSpec
from .plugins import LOADER, PROTOCOL_VERSION, BackendInfo, LoadFailure, failure_note, hookimpl
from .registry import BUILTIN, REGISTRY, Builder, Detector, Registration

__all__ = [
    "BUILTIN",
    "PROTOCOL_VERSION",
    "AmbiguousTargetError",
    "BackendError",
    "BackendInfo",
    "LoadFailure",
    "TensorSpec",
    "UnknownTargetError",
    "backends",
    "default_target",
    "hookimpl",
    "load_failures",
    "register_detector",
    "register_kernel_builder",
    "register_kernel_type",
    "registered_targets",
    "set_default_target",
]


def register_kernel_type(op: type | str, key: str, cls: type) -> None:
    """Add `cls` to `op` under `key`; op instances constructed afterwards can select it."""
    LOADER.ensure_loaded()
    name = REGISTRY.op_name(op)
    if not isinstance(key, str) or not key:
        raise BackendError(f"register_kernel_type: key must be a non-empty str, got {key!r}")
    if not isinstance(cls, type):
        raise BackendError(f"register_kernel_type: cls must be a class, got {cls!r}")
    REGISTRY.add_kernel_type(Registration(name, key, cls, caller_source()))


def register_detector(target: str, detect: Callable[[torch.device], bool]) -> None:
    """Declare target `target`; `detect(device)` says whether it claims a device."""
    LOADER.ensure_loaded()
    _check_target_name(target)
    if not callable(detect):
        raise BackendError(f"register_detector: detect must be callable, got {detect!r}")
    REGISTRY.add_detector(Detector(target, detect, caller_source()))


def register_kernel_builder(
    op: type | str, target: str, build_kernel: Callable[..., Callable[..., Any]]
) -> None:
    """Serve every call of `op` instances settled on `target` with kernels from `build_kernel`."""
    LOADER.ensure_loaded()
    name = REGISTRY.op_name(op)
    _check_target_name(target)
    if not callable(build_kernel):
        raise BackendError(
            f"register_kernel_builder: build_kernel must be callable, got {build_kernel!r}"
        )
    REGISTRY.add_builder(Builder(name, target, build_kernel, caller_source()))


def set_default_target(target: str | None) -> None:
    """Make `target` (or BUILTIN, or None to detect again) the process default for new settles."""
    LOADER.ensure_loaded()
    if target is not None and target != BUILTIN and target not in REGISTRY.targets():
        raise UnknownTargetError(
            f"set_default_target: unknown target {target!r}; known targets: "
            f"{', '.join(REGISTRY.targets()) or 'none'} (and {BUILTIN!r}). {failure_note()}"
        )
    REGISTRY.set_default_target(target)


def default_target() -> str | None:
    LOADER.ensure_loaded()
    return REGISTRY.default_target


def registered_targets() -> list[str]:
    """Names of every target that registered a detector or a builder, sorted."""
    LOADER.ensure_loaded()
    return REGISTRY.targets()


def load_failures() -> list[str]:
    """One line per backend that failed to load: entry point, distribution, exception."""
    LOADER.ensure_loaded()
    return [str(f) for f in LOADER.failures]


def backends() -> list[BackendInfo]:
    """The loaded backends, as they describe themselves, in load order."""
    LOADER.ensure_loaded()
    return list(LOADER.infos.values())


def _check_target_name(target: object) -> None:
    if not isinstance(target, str) or not target:
        raise BackendError(f"target must be a non-empty str, got {target!r}")
    if target == BUILTIN:
        raise BackendError(f"{BUILTIN!r} is reserved for ops' own kernels; choose another name")
