"""Call specs: the immutable facts of one call that selection and building depend on."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .device import DeviceFacts, device_facts
from .errors import CallSpecFieldError


@dataclass(frozen=True, kw_only=True)
class CallSpec:
    """Base of call specs. Subclasses just declare fields; they become frozen keyword dataclasses.

    A call spec keys the dispatch cache, so every field must be a hashable value (no lists,
    dicts or tensors). Device facts are properties read from `device` on demand: on the hit path
    nobody asks, so no device is queried.
    """

    device: torch.device

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__dataclass_fields__" not in cls.__dict__ or "__annotations__" in cls.__dict__:
            dataclass(frozen=True, kw_only=True)(cls)

    @property
    def facts(self) -> DeviceFacts:
        return device_facts(self.device)

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
