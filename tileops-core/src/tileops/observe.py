"""What the dispatcher decides and builds, for people and for telemetry, off the hot path.

Both reports come from the miss path only: the decision from `KernelTable.resolve`, the build
from `_shared_entry` (table.py). A hit is one dict lookup and never reaches this module.

People read the `tileops.dispatch` logger: `TILEOPS_LOG=dispatch` prints one line per decision
on stderr (configuring the logger at INFO does the same; DEBUG adds every build and its time).
A name that is no log is reported in `tileops.backend.load_failures()` when the backends load.
Programs implement the pluggy hooks `tileops_dispatch_decided` and `tileops_entry_built`
(declared in `tileops.plugins.BackendHooks`) with `tileops.backend.hookimpl`, in a
backend module (loaded through its entry point) or in any object passed to `add_observer`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any

from .errors import AmbiguousDispatchError, NoImplementationError, OpNotAvailableError
from .plugins import LOADER
from .selection import Candidate

LOG_VARIABLE = "TILEOPS_LOG"
LOGGERS = {"dispatch": "tileops.dispatch"}
"""Names `TILEOPS_LOG` accepts (comma-separated) -> the logger each turns on at INFO."""

logger = logging.getLogger("tileops.dispatch")

DISPATCH_ERRORS = (AmbiguousDispatchError, NoImplementationError, OpNotAvailableError)
"""What a miss decision raises when no key serves the call."""

clock = time.perf_counter
"""Build times are measured with this clock."""


def add_observer(plugin: object) -> None:
    """Register `plugin` (a module or object with `@hookimpl` methods) for the dispatch hooks.

    pluggy checks its hook names at once: a misspelt hook raises here rather than never firing.
    """
    LOADER.manager.register(plugin)
    try:
        LOADER.manager.check_pending()
    except Exception:
        LOADER.manager.unregister(plugin)
        raise


def remove_observer(plugin: object) -> None:
    """Stop calling `plugin`'s hooks."""
    LOADER.manager.unregister(plugin)


def decided(
    op: str, interface: str, call: Any, winner: Candidate | None, error: Exception | None
) -> None:
    """Report one miss decision: a log line at INFO and the `tileops_dispatch_decided` hook."""
    if logger.isEnabledFor(logging.INFO):
        if winner is not None:
            logger.info("%s.%s: %s [%s] serves %r", op, interface, winner.key, winner.source, call)
        else:
            first = str(error).splitlines()[0]
            logger.info("%s.%s: nothing serves %r: %s", op, interface, call, first)
    _fire(
        "tileops_dispatch_decided",
        op=op,
        interface=interface,
        call=call,
        key=winner and winner.key,
        source=winner and winner.source,
        error=error,
    )


def built(op: str, interface: str, winner: Candidate, identity: Any, seconds: float) -> None:
    """Report one entry build: a log line at DEBUG and the `tileops_entry_built` hook."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s.%s: built %s [%s] for identity %r in %.3f s",
            op,
            interface,
            winner.key,
            winner.source,
            identity,
            seconds,
        )
    _fire(
        "tileops_entry_built",
        op=op,
        interface=interface,
        key=winner.key,
        source=winner.source,
        identity=identity,
        seconds=seconds,
    )


def _fire(name: str, **kwargs: Any) -> None:
    """Call hook `name` if anyone implements it. An observer that raises is reported, never
    allowed to fail the call it observes: telemetry must not break a model."""
    hook = getattr(LOADER.manager.hook, name)
    if not hook.get_hookimpls():
        return
    try:
        hook(**kwargs)
    except Exception as exc:
        warnings.warn(
            f"a tileops observer's {name} raised {type(exc).__name__}: {exc}; dispatch goes on",
            RuntimeWarning,
            stacklevel=3,
        )


def _log_names() -> list[str]:
    return [n.strip() for n in os.environ.get(LOG_VARIABLE, "").split(",") if n.strip()]


def unknown_log_names() -> list[str]:
    """The names in `TILEOPS_LOG` that are no tileops log (reported when the backends load)."""
    return list(dict.fromkeys(n for n in _log_names() if n not in LOGGERS))


def configure_from_environment() -> list[str]:
    """Turn on the loggers `TILEOPS_LOG` names, printing to stderr; returns unknown names."""
    names = _log_names()
    unknown = unknown_log_names()
    for name in dict.fromkeys(n for n in names if n in LOGGERS):
        target = logging.getLogger(LOGGERS[name])
        if not any(getattr(h, "_tileops", False) for h in target.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("tileops: %(message)s"))
            handler._tileops = True  # so a second call adds no second handler
            target.addHandler(handler)
        if target.getEffectiveLevel() > logging.INFO:
            target.setLevel(logging.INFO)
        target.propagate = False
    return unknown


configure_from_environment()
