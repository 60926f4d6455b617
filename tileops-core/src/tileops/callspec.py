"""Call specs: the immutable facts of one call that selection and building depend on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from .device import DeviceFacts, device_facts
from .errors import CallSpecFieldError


@dataclass(frozen=True, kw_only=True)
class CallSpec:
    """Base of call specs. Subclasses declare fields; they become frozen keyword dataclasses.

    A call spec keys the dispatch cache, so every field must be a hashable value (no lists,
    dicts or tensors). Decorating a subclass with `@dataclass(frozen=True)` as well is allowed
    and changes nothing. Device facts are properties read from `device` on demand: on the hit
    path nobody asks, so no device is queried.

    `device=None` (or left out) means the current device, as upstream TileOPs has it: the
    current CUDA device where torch sees one, else the CPU; it is resolved when the call spec
    is made, so the spec always names a device. Device facts may also be stated
    (`arch=90, sm_count=132`, plus `calibration`, `smem_budget`): selection then reads those
    instead of the device's, which `explain` / `key_for` use to ask about a device the process
    is not on; `kernel_for` refuses such a call spec, since what it builds is kept per device
    (use `tileops.testing.simulate_device` to dispatch as another device).
    """

    device: torch.device | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True, kw_only=True)(cls)
        cls.__init__ = _fast_init(cls)
        cls.__eq__ = _same_fields
        # Frozenness comes from the base's methods below. Leaving the subclass's own generated
        # ones in place would make a user's `@dataclass(frozen=True)` refuse to overwrite them.
        del cls.__setattr__, cls.__delattr__

    @property
    def facts(self) -> DeviceFacts:
        stated = self.__dict__.get(_STATED)
        if stated is None:
            return device_facts(self.device)
        if len(stated) == len(DEVICE_FACTS):
            return DeviceFacts(**stated)
        return dataclasses.replace(device_facts(self.device), **stated)

    @property
    def stated_device_facts(self) -> frozenset[str]:
        """The device facts this call spec states rather than reads from its device."""
        return frozenset(self.__dict__.get(_STATED, ()))

    @property
    def arch(self) -> int | None:
        return self.facts.arch

    @property
    def sm_count(self) -> int:
        return self.facts.sm_count

    @property
    def calibration(self) -> str | None:
        return self.facts.calibration

    @property
    def smem_budget(self) -> int:
        return self.facts.smem_budget


DEVICE_FACTS = tuple(f.name for f in dataclasses.fields(DeviceFacts))
_STATED = "_stated_device_facts"


def current_device() -> torch.device:
    """What `device=None` names: the current CUDA device where torch sees one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _state_facts(call: CallSpec, stated: dict[str, object]) -> None:
    unknown = sorted(set(stated) - set(DEVICE_FACTS))
    if unknown:
        raise TypeError(
            f"{type(call).__name__}() got unexpected keyword argument(s) {', '.join(unknown)}; "
            f"its fields are {', '.join(f.name for f in dataclasses.fields(call))}, and the "
            f"device facts it may state are {', '.join(DEVICE_FACTS)}"
        )
    call.__dict__[_STATED] = stated


def _frozen(self: CallSpec, name: str, *value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot change field {name!r}: call specs are frozen")


CallSpec.__setattr__ = CallSpec.__delattr__ = _frozen  # one for every subclass (see above)


def _same_fields(self: CallSpec, other: object) -> bool:
    """Dataclass equality, compared in C: a hit with a fresh call spec compares it once."""
    if self.__class__ is not other.__class__:
        return NotImplemented
    return self.__dict__ == other.__dict__


def _fast_init(cls: type) -> Callable[..., None]:
    """A keyword-only `__init__` that fills `__dict__` directly.

    Call specs are built on every call; the frozen dataclass `__init__` goes through
    `object.__setattr__` per field and costs about twice as much.
    """
    fields = dataclasses.fields(cls)
    namespace: dict[str, object] = {"_current": current_device, "_state": _state_facts}
    params = []
    for field in fields:
        if field.default_factory is not dataclasses.MISSING:
            return cls.__init__  # keep dataclass semantics for factories
        if field.default is dataclasses.MISSING:
            params.append(field.name)
        else:
            namespace[f"_default_{field.name}"] = field.default
            params.append(f"{field.name}=_default_{field.name}")
    body = [f"    fields[{f.name!r}] = {f.name}" for f in fields]
    body += ["    if device is None:", "        fields['device'] = _current()"]
    body += ["    if stated:", "        _state(self, stated)"]
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join([*params, "**stated"])
    source = f"def __init__(self, *, {signature}):\n    fields = self.__dict__\n"
    exec(source + "\n".join(body), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def check_fields(call: CallSpec) -> None:
    """Raise `CallSpecFieldError` naming the first field that cannot key a cache."""
    if not isinstance(call, CallSpec):
        raise CallSpecFieldError(
            f"expected a CallSpec instance as the call, got {type(call).__name__}"
        )
    for field in dataclasses.fields(call):
        value = getattr(call, field.name)
        if isinstance(value, torch.Tensor) or not _hashable(value):
            raise CallSpecFieldError(
                f"{type(call).__name__}.{field.name} is a {type(value).__name__}, which cannot "
                "key the dispatch cache; use a hashable value (int, float, str, tuple, "
                "torch.dtype, torch.device)"
            )


def _hashable(value: object) -> bool:
    if not isinstance(value, Hashable):
        return False
    if isinstance(value, tuple):
        return all(_hashable(item) and not isinstance(item, torch.Tensor) for item in value)
    return True
