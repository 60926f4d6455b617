"""Every exception tileops raises, in one place.

Each message says what happened, why, and what to do. Dispatch errors also mention recorded
backend load failures, because a missing kernel is often a backend that failed to import.
"""

from __future__ import annotations


class TileOpsError(Exception):
    """Base of every tileops error."""


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
