"""Backend discovery: entry points in group `tileops.backends`, held by a pluggy PluginManager.

Backends load once per process, in entry-point name order, the first time an op is constructed
or the backend API is queried. An entry point names a module (imported) or a callable in one
(`pkg:setup`: imported, then called). Each load runs inside a registry transaction: a backend
whose load fails, or that was written for another protocol, leaves no registration of its own
behind (what another backend's module registered meanwhile stays), registers nothing
afterwards, and is recorded in `load_failures()`. Operators steer loading with
TILEOPS_BACKENDS (allow list) and TILEOPS_DISABLE_BACKENDS (deny list), both comma-separated
entry-point names.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pluggy
from importlib_metadata import EntryPoint, entry_points

from .errors import BackendError
from .provenance import Source, loading_source, remember_entry_point
from .registry import REGISTRY, describe_slot

GROUP = "tileops.backends"
PROTOCOL_VERSION = 1
"""The backend protocol this core speaks. A backend declares the one it was written for as a
module attribute `TILEOPS_PROTOCOL = 1`; one that declares none is taken as compatible."""

hookspec = pluggy.HookspecMarker("tileops")
hookimpl = pluggy.HookimplMarker("tileops")


class BackendHooks:
    """Hooks the core declares; a backend module implements them with `@hookimpl`."""

    @hookspec(firstresult=True)
    def tileops_backend_info(self) -> dict[str, Any]:
        """Describe this backend: {"name": str, "version": str, "devices": [device types]}."""

    @hookspec
    def tileops_dispatch_decided(
        self,
        op: str,
        interface: str,
        call: Any,
        key: str | None,
        source: str | None,
        error: Exception | None,
    ) -> None:
        """A dispatch miss was decided: `key` (registered by `source`, a distribution and
        entry point) serves `call`, or no key does and dispatch raises `error`. Called on the
        miss path only, never on a hit; see `tileops.observe`."""

    @hookspec
    def tileops_entry_built(
        self, op: str, interface: str, key: str, source: str, identity: Any, seconds: float
    ) -> None:
        """The entry of `key` for build identity `identity` was built (compiled) in `seconds`.
        Called once per build; entries reused from an earlier build do not call it."""


@dataclass(frozen=True)
class LoadFailure:
    entry_point: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return f"{self.entry_point} ({self.distribution}): {self.error}"


@dataclass(frozen=True)
class BackendInfo:
    """What a loaded backend says about itself, completed from its distribution's metadata."""

    entry_point: str
    distribution: str
    version: str
    devices: tuple[str, ...]
    protocol: int | None


class BackendLoader:
    def __init__(self) -> None:
        self.manager = pluggy.PluginManager("tileops")
        self.manager.add_hookspecs(BackendHooks)
        self.failures: list[LoadFailure] = []
        self.infos: dict[str, BackendInfo] = {}
        self._lock = threading.RLock()
        self._loaded = False
        self._loader_thread: int | None = None
        self._attempted: set[str] = set()
        self._direct: dict[str, tuple[EntryPoint, Source]] = {}  # imports still in progress
        self._on_loaded: list[Callable[[], Iterable[LoadFailure]]] = []

    def ensure_loaded(self, *, wait: bool = True) -> None:
        """Load every backend once. `wait=False` (registrations) never blocks on a load that
        another thread is running: a backend may register from worker threads while its
        import runs, and those registrations must not wait for that import to end."""
        if self._loaded and not self._direct:
            return
        if not wait and self._loader_thread not in (None, threading.get_ident()):
            return
        with self._lock:
            if self._loader_thread is not None:  # re-entered from a backend's import
                return
            self._loader_thread = threading.get_ident()
            try:
                if not self._loaded:
                    self._load_all()
                    self._loaded = True
                    self._run_loaded_checks()
                self._settle_direct_imports()
            finally:
                self._loader_thread = None

    def _load_all(self) -> None:
        found = sorted(entry_points(group=GROUP), key=lambda ep: (ep.name, _dist_name(ep)))
        allow = _names_from_env("TILEOPS_BACKENDS")
        deny = _names_from_env("TILEOPS_DISABLE_BACKENDS") or set()
        if not self._attempted:
            self._report_unknown_names(allow, deny, {ep.name for ep in found})
        for ep in found:  # before any import: a backend may import another's module
            remember_entry_point(ep.module, Source(_dist_name(ep), ep.name))
        for ep in found:
            if (ep.name, ep.value) in self._attempted:
                continue  # resuming after a KeyboardInterrupt: this one was dealt with
            self._attempted.add((ep.name, ep.value))
            if ep.name in deny or (allow is not None and ep.name not in allow):
                self.manager.set_blocked(ep.name)
            elif not self.manager.is_blocked(ep.name):
                self._load(ep)

    def _report_unknown_names(
        self, allow: set[str] | None, deny: set[str], found: set[str]
    ) -> None:
        for variable, names in (
            ("TILEOPS_BACKENDS", allow or set()),
            ("TILEOPS_DISABLE_BACKENDS", deny),
        ):
            for name in sorted(names - found):
                self._fail(
                    name,
                    "not installed",
                    f"{variable} names {name!r}, but no installed distribution provides an "
                    f"entry point of that name in group {GROUP!r} (installed: "
                    f"{', '.join(sorted(found)) or 'none'})",
                )

    def _load(self, ep: EntryPoint) -> None:
        source = Source(_dist_name(ep), ep.name)
        taken = self.infos.get(ep.name)
        if taken is not None:
            self._fail(
                ep.name,
                source.distribution,
                f"BackendError: entry point name {ep.name!r} is taken by {taken.distribution}, "
                "which loaded first; one of the two distributions must rename its entry point",
            )
            return
        if _importing(ep.module):  # imported directly, and that import has not ended yet
            self._direct[ep.name] = (ep, source)
            return
        self._load_module(ep, source)

    def _load_module(self, ep: EntryPoint, source: Source) -> None:
        """Import (or take the imported) module of `ep`, call its callable if it names one, and
        register the module with pluggy; on any failure undo what this backend registered."""
        token = loading_source.set(source)
        try:
            with REGISTRY.transaction(source=source):
                module = _enter(ep)
                protocol = _check_protocol(module, source)
                self._register(ep, module, protocol)
        except BaseException as exc:  # SystemExit too: it must not stop the other backends
            self._undo(ep, source, f"{type(exc).__name__}: {exc}")
            if isinstance(exc, KeyboardInterrupt):
                raise  # the registry is consistent; loading resumes with the next backend
        finally:
            loading_source.reset(token)

    def on_loaded(self, check: Callable[[], Iterable[LoadFailure]]) -> None:
        """Call `check()` once every backend is loaded (for settings that name what backends
        install: the operator rules); each failure it returns is recorded as a load failure."""
        self._on_loaded.append(check)

    def _run_loaded_checks(self) -> None:
        for check in self._on_loaded:
            for failure in check():
                self._fail(failure.entry_point, failure.distribution, failure.error)

    def _settle_direct_imports(self) -> None:
        """Finish the backends a user imported before tileops loaded them: once their import
        has ended they are loaded as usual; if it failed, what they registered is undone."""
        for name, (ep, source) in list(self._direct.items()):
            module = sys.modules.get(ep.module)
            if module is not None and _importing(ep.module):
                continue
            del self._direct[name]
            if module is None:
                failed = f"importing {ep.module} (directly, before tileops loaded it) failed"
                self._undo(ep, source, f"BackendError: {failed}")
            else:
                self._load_module(ep, source)

    def _undo(self, ep: EntryPoint, source: Source, error: str) -> None:
        """Withdraw what a failed backend registered, from whichever thread, refuse what it
        registers later, and record it."""

        def refusal(slot: tuple) -> BackendError:
            refused = BackendError(
                f"{source} failed to load ({error}); its later registration of "
                f"{describe_slot(slot)} is refused: a backend that failed leaves nothing "
                "behind, also from its threads",
                source=source,
            )
            self._fail(ep.name, source.distribution, f"BackendError: {refused}")
            return refused

        REGISTRY.close_source(source, refusal)  # atomic with registrations from its threads
        self._fail(ep.name, source.distribution, error)

    def _register(self, ep: EntryPoint, module: Any, protocol: int | None) -> None:
        """Hand `module` to pluggy, which validates its hooks; take it back if anything fails."""
        self.manager.register(module, name=ep.name)
        try:
            self.manager.check_pending()  # a @hookimpl for no hook the core declares: a typo
            self.infos[ep.name] = self._describe(ep, module, protocol)
        except Exception:
            self.manager.unregister(module, name=ep.name)
            raise

    def _describe(self, ep: EntryPoint, module: Any, protocol: int | None) -> BackendInfo:
        others = [p for p in self.manager.get_plugins() if p is not module]
        info = self.manager.subset_hook_caller("tileops_backend_info", others)() or {}
        if not isinstance(info, dict):
            raise BackendError(f"tileops_backend_info() must return a dict, got {info!r}")
        dist = ep.dist
        return BackendInfo(
            entry_point=ep.name,
            distribution=_dist_name(ep),
            version=str(info.get("version") or (dist.version if dist else "unknown")),
            devices=tuple(info.get("devices", ())),
            protocol=protocol,
        )

    def _fail(self, entry_point: str, distribution: str, error: str) -> None:
        failure = LoadFailure(entry_point, distribution, error)
        self.failures.append(failure)
        if distribution == "operator setting":  # the operator's typo, no backend's failure
            message = f"tileops: an operator setting is ignored: {error}"
        else:
            message = f"tileops backend not loaded: {failure}"
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _enter(ep: EntryPoint) -> Any:
    """The module of `ep`, imported; an entry point naming a callable (`pkg:setup`) has it
    called with no arguments, as the backend's registration step."""
    target = ep.load()
    if ep.attr is None:
        return target
    if not callable(target):
        raise BackendError(
            f"entry point {ep.name!r} = {ep.value!r} names {ep.attr}, a "
            f"{type(target).__name__}, which tileops cannot call; name the module "
            f"({ep.module!r}) or a function in it that registers the backend"
        )
    target()
    return sys.modules[ep.module]


def _check_protocol(module: Any, source: Source) -> int | None:
    declared = getattr(module, "TILEOPS_PROTOCOL", None)
    if declared is None or declared == PROTOCOL_VERSION:
        return declared
    if not isinstance(declared, int):
        raise BackendError(f"TILEOPS_PROTOCOL must be an int, got {declared!r}", source=source)
    upgrade = "tileops-core" if declared > PROTOCOL_VERSION else source.distribution
    raise BackendError(
        f"{source.distribution} was written for tileops backend protocol {declared}, but this "
        f"tileops-core speaks protocol {PROTOCOL_VERSION}; upgrade {upgrade}",
        source=source,
    )


def _importing(module: str) -> bool:
    """True while `module` is in the middle of being imported (by anyone)."""
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _names_from_env(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _dist_name(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "unknown distribution"


LOADER = BackendLoader()


def failure_note() -> str:
    """One sentence for dispatch errors when backends failed to load, else ''."""
    if not LOADER.failures:
        return ""
    return (
        f"Note: {len(LOADER.failures)} tileops backend(s) failed to load; "
        "see tileops.backend.load_failures()."
    )


def distributions_serving(device_type: str) -> list[str]:
    return sorted({i.distribution for i in LOADER.infos.values() if device_type in i.devices})
