"""Every exception tileops raises, in one place.

Each message says what happened, why, and what to do. Dispatch errors also mention recorded
backend load failures, because a missing kernel is often a backend that failed to import.
Errors about a dispatch, a kernel, a target or a registration also carry what they are about
as fields (as pluggy's errors carry `.plugin`), so code reads them instead of the message.
"""

from __future__ import annotations

from typing import Any

FIELDS = ("op", "interface", "call", "key", "source", "target", "verdicts")


class TileOpsError(Exception):
    """Base of every tileops error.

    Fields, None (`verdicts`: empty) where they do not apply:

    - `op`: the op's unique name (`tileops::RMSNormFwdOp`);
    - `interface`: the kernel interface;
    - `call`: the call spec of the call concerned;
    - `key`: the kernel key concerned (the one that failed, or that a registration names);
    - `source`: the distribution (and entry point) of that key, target or registration;
    - `target`: the target concerned;
    - `verdicts`: every key's verdict on the call, in key order (`status` is one of denied,
      unavailable, refused, outranked, tied, chosen; `reason` says why; `source` as above).
    """

    op: str | None = None
    interface: str | None = None
    call: Any = None
    key: str | None = None
    source: str | None = None
    target: str | None = None
    verdicts: tuple[Any, ...] = ()

    def __init__(self, *args: Any, **fields: Any) -> None:
        super().__init__(*args)
        for name, value in fields.items():
            if name not in FIELDS:
                raise TypeError(f"{type(self).__name__} has no field {name!r}; fields: {FIELDS}")
            if value is not None:
                setattr(self, name, str(value) if name == "source" else value)


class BackendError(TileOpsError):
    """A backend, kernel class or registration is wrong, or a backend failed."""


class KernelDeclarationError(BackendError, TypeError):
    """A kernel class declares something the dispatcher cannot accept (found at op construction)."""


class OpNotAvailableError(BackendError):
    """No installed kernel runs on the call's device type, or the settled target has no builder."""


class NoImplementationError(TileOpsError, ValueError):
    """Some kernel runs on the device, but none is both available and applicable to this call."""


class AmbiguousDispatchError(TileOpsError, ValueError):
    """Several implementations remain and no `preferred_over` decides between them."""


class AmbiguousTargetError(BackendError):
    """Several targets' detectors claim the call's device."""


class UnknownTargetError(BackendError, ValueError):
    """A target name that no backend registered."""


class UnknownOpError(BackendError, ValueError):
    """A registration names an op that does not exist."""


class OpDefinitionError(TileOpsError, TypeError):
    """An op class cannot be defined as written (its unique name is taken by another module)."""


class ControlError(TileOpsError, ValueError):
    """An operator control (pin, prefer, deny) names an op, interface or key that is not there."""


class CallSpecFieldError(TileOpsError, TypeError):
    """A call spec field holds a value that cannot key a cache."""


class OpInputError(TileOpsError, ValueError):
    """An op was called with a tensor or argument its signature does not allow."""


class OpConfigError(TileOpsError, ValueError):
    """An op was constructed with a parameter it cannot accept."""


class ArgumentError(TileOpsError, TypeError):
    """A tileops function was passed an argument of a kind it does not take."""


def add_note(exc: BaseException, note: str) -> None:
    """Attach `note` (where the failure came from) to `exc`, keeping its type and message."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: the attribute traceback printing reads from 3.11 on
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]
