"""The protocol backend authors use. Everything here is public; see docs/backends.md."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ..callspec import CallSpec
from ..control import env_flag
from ..errors import (
    AmbiguousDispatchError,
    AmbiguousTargetError,
    BackendError,
    CallSpecFieldError,
    KernelDeclarationError,
    NoImplementationError,
    OpInputError,
    OpNotAvailableError,
    TileOpsError,
    UnknownOpError,
    UnknownTargetError,
)
from ..kernel import Build, Kernel, KernelInterface
from ..kernel_sets import check_registration, key_aliases
from ..ops.norm.rms_norm import DEFAULT_EPS as RMS_NORM_DEFAULT_EPS
from ..plugins import LOADER, PROTOCOL_VERSION, BackendInfo, LoadFailure, failure_note, hookimpl
from ..provenance import caller_source
from ..registry import (
    BUILTIN,
    REGISTRY,
    Builder,
    Detector,
    Registration,
    RegistrationHandle,
    kernel_owner,
)
from ..selection import unavailability
from ..signature import TensorSpec

__all__ = [
    "BUILTIN",
    "PROTOCOL_VERSION",
    "RMS_NORM_DEFAULT_EPS",
    "AmbiguousDispatchError",
    "AmbiguousTargetError",
    "BackendError",
    "BackendInfo",
    "Build",
    "CallSpec",
    "CallSpecFieldError",
    "Kernel",
    "KernelDeclarationError",
    "KernelInterface",
    "LoadFailure",
    "NoImplementationError",
    "OpInputError",
    "OpNotAvailableError",
    "RegistrationHandle",
    "Target",
    "TensorSpec",
    "TileOpsError",
    "UnknownOpError",
    "UnknownTargetError",
    "backends",
    "default_target",
    "env_flag",
    "hookimpl",
    "key_serves",
    "load_failures",
    "register_detector",
    "register_kernel_builder",
    "register_kernel_type",
    "registered_targets",
    "set_default_target",
]


Target = str | None
"""What `target=` and `set_default_target` accept: a target name, BUILTIN (also a str, see
`tileops.BUILTIN`), or None to decide from the call's device (upstream's `Target`)."""


def register_kernel_type(op: type | str, key: str, cls: type) -> RegistrationHandle:
    """Add `cls` to `op` under `key`; op instances constructed afterwards can select it.

    The registration is checked whole before it lands (a kernel class implementing one of the
    op's interfaces, a key the op does not have, preferences without cycles), so a broken one
    fails here, in the backend that made it, and never at a later op construction. The handle
    returned undoes it (`.remove()`, or the end of a `with` block) for op instances
    constructed afterwards.
    """
    LOADER.ensure_loaded(wait=False)
    op_cls = kernel_owner(REGISTRY.op_class(op))
    if not isinstance(key, str) or not key:
        raise BackendError(f"register_kernel_type: key must be a non-empty str, got {key!r}")
    if not isinstance(cls, type):
        raise BackendError(f"register_kernel_type: cls must be a class, got {cls!r}")
    registration = Registration(op_cls, key, cls, caller_source())
    with REGISTRY.lock:
        registered = REGISTRY.kernel_types(op_cls)
        if key in registered:
            raise _key_taken(registration, registered[key])
        check_registration(op_cls, registration, registered)
        return REGISTRY.add(
            ("kernel", op_cls, key), registration, partial(_key_taken, registration)
        )


def _key_taken(new: Registration, existing: Registration) -> BackendError:
    return BackendError(
        f"kernel key {new.key!r} of {new.op.op_name} is registered twice: by {existing.source} "
        f"({existing.cls.__qualname__}) and by {new.source} ({_qualname(new.cls)}); keys must be "
        "unique per op, so one backend must rename its key",
        op=new.op.op_name,
        key=new.key,
        source=new.source,
    )


def register_detector(target: str, detect: Callable[[torch.device], bool]) -> RegistrationHandle:
    """Declare target `target`; `detect(device)` says whether it claims a device. The handle
    returned undoes it."""
    LOADER.ensure_loaded(wait=False)
    _check_target_name(target)
    if not callable(detect):
        raise BackendError(f"register_detector: detect must be callable, got {detect!r}")
    detector = Detector(target, detect, caller_source())
    return REGISTRY.add(
        ("detector", target),
        detector,
        lambda existing: BackendError(
            f"target {target!r} already has a detector, registered by {existing.source}; "
            f"{detector.source} cannot register a second one",
            target=target,
            source=detector.source,
        ),
    )


def register_kernel_builder(
    op: type | str, target: str, build_kernel: Callable[..., Callable[..., Any]]
) -> RegistrationHandle:
    """Serve every call of `op` instances settled on `target` with kernels from `build_kernel`.
    The handle returned undoes it."""
    LOADER.ensure_loaded(wait=False)
    op_cls = REGISTRY.op_class(op)
    _check_target_name(target)
    if not callable(build_kernel):
        raise BackendError(
            f"register_kernel_builder: build_kernel must be callable, got {build_kernel!r}"
        )
    builder = Builder(op_cls, target, build_kernel, caller_source())
    return REGISTRY.add(
        ("builder", op_cls, target),
        builder,
        lambda existing: BackendError(
            f"target {target!r} already has a builder for {op_cls.op_name}, registered by "
            f"{existing.source}; {builder.source} cannot register another",
            op=op_cls.op_name,
            target=target,
            source=builder.source,
        ),
    )


def set_default_target(target: str | None) -> None:
    """Make `target` (or BUILTIN, or None to detect again) the process default for new settles."""
    LOADER.ensure_loaded(wait=False)
    if target is not None and target != BUILTIN and target not in REGISTRY.targets():
        raise UnknownTargetError(
            f"set_default_target: unknown target {target!r}; known targets: "
            f"{', '.join(REGISTRY.targets()) or 'none'} (and {BUILTIN!r}). {failure_note()}",
            target=target,
        )
    REGISTRY.set_default_target(target, caller_source())


def default_target() -> str | None:
    LOADER.ensure_loaded()
    return REGISTRY.default_target


def registered_targets(op: type | str | None = None) -> list[str]:
    """Names of every target that registered a detector or a builder, sorted; given `op` (its
    class or name), only the targets that registered a builder for it (upstream's meaning)."""
    LOADER.ensure_loaded()
    if op is None:
        return REGISTRY.targets()
    op_cls = REGISTRY.op_class(op)
    return sorted(b.target for b in REGISTRY.builders() if b.op is op_cls)


def key_serves(op: type | str, key: str, call: CallSpec) -> bool:
    """Whether `op`'s kernel under `key` (its own or a backend's) is installed, available on
    the call's device and does not refuse `call`: for a backend whose kernel steps aside where
    another backend's serves, without knowing that backend's classes."""
    LOADER.ensure_loaded()
    op_cls = REGISTRY.op_class(op)
    registered = REGISTRY.kernel_types(op_cls)
    if key not in registered and key not in op_cls.kernel_types:
        key = key_aliases(op_cls).get(key, key)  # upstream's name of the op's own kernel
    registration = registered.get(key)
    cls = op_cls.kernel_types.get(key) or (registration and registration.cls)
    if cls is None:
        return False
    return unavailability(cls, call) is None and cls.refusal(call) is None


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
        raise BackendError(
            f"{str(BUILTIN)!r} (BUILTIN) is reserved for ops' own kernels; choose another name"
        )


def _qualname(cls: object) -> str:
    return getattr(cls, "__qualname__", repr(cls))
