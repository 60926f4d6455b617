"""Small interfaces, kernels, call specs and ops that the dispatcher tests build inline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from tileops import CallSpec, Kernel, KernelInterface, Op

INTERFACE = "unary"


class Unary(KernelInterface):
    def forward(self, x): ...


class Binary(KernelInterface):
    def forward(self, x, y): ...


class ShapeCall(CallSpec):
    n: int


def call(device: str = "cuda:0", n: int = 1) -> ShapeCall:
    return ShapeCall(device=torch.device(device), n=n)


def kernel(
    name: str,
    *,
    base: type[KernelInterface] | tuple[type[KernelInterface], ...] = Unary,
    refuse: Callable[[Any], str | None] | None = None,
    identity: Callable[[Any], Hashable] = lambda call: (),
    on_build: Callable[[Any], None] | None = None,
    **declarations: Any,
) -> type[Kernel]:
    """A kernel class `name` inheriting `base` (one interface or several); forward returns `name`.

    `refuse(call)` is its refusal, `identity(call)` its build identity, `on_build(call)` runs
    inside its build. `cls.counts` counts refusal, entry_for and build calls.
    """
    counts: Counter[str] = Counter()

    def refusal(cls, call):
        counts["refusal"] += 1
        return refuse(call) if refuse else None

    def entry_for(cls, call):
        counts["entry_for"] += 1

        def build():
            counts["build"] += 1
            if on_build:
                on_build(call)
            return cls()

        return identity(call), build

    def forward(self, *args, **kwargs):
        return name

    namespace = {
        "counts": counts,
        "refusal": classmethod(refusal),
        "entry_for": classmethod(entry_for),
        "forward": forward,
        **declarations,
    }
    bases = base if isinstance(base, tuple) else (base,)
    return type(name, (Kernel, *bases), namespace)


def make_op(
    kernel_types: Mapping[str, type],
    *,
    interfaces: Mapping[str, type[KernelInterface]] | None = None,
    name: str = "TestOp",
) -> type[Op]:
    """An op class with these kernels (in this order) and, by default, one interface `unary`."""
    namespace = {
        "interfaces": dict(interfaces or {INTERFACE: Unary}),
        "kernel_types": dict(kernel_types),
    }
    return type(name, (Op,), namespace)
