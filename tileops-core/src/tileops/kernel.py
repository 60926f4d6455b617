"""Kernel interfaces and the declarations every implementation carries.

An interface fixes one call contract (its `forward`). An implementation inherits `Kernel` and
one or more interfaces, and declares where it runs (`devices`, `supported_archs`), which calls
it serves (`refusal`) and whom it beats (`general`, `preferred_over`). The defaults make a lone
implementation need nothing but the inheritance.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .call import CallSpec

Build = Callable[[], Callable[..., Any]]


class KernelInterface:
    """A place where an op calls a kernel. Subclasses declare `forward(...)`: the contract."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")


class Kernel:
    """Base of implementations. Calling a kernel calls its `forward`."""

    devices: ClassVar[frozenset[str]] = frozenset({"cuda"})
    supported_archs: ClassVar[frozenset[int] | None] = None
    general: ClassVar[bool] = False
    preferred_over: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("devices", "supported_archs", "preferred_over"):
            value = cls.__dict__.get(name)
            if isinstance(value, (set, list, tuple)):
                setattr(cls, name, frozenset(value))
            elif isinstance(value, str):
                setattr(cls, name, frozenset({value}))
        # Entries are called on the hot path: skip the `__call__` -> `forward` hop.
        if "forward" in cls.__dict__:
            cls.__call__ = cls.__dict__["forward"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    @classmethod
    def refusal(cls, call: CallSpec) -> str | None:
        """None if this implementation serves `call`, else a sentence saying why not."""
        return None

    @classmethod
    def entry_for(cls, call: CallSpec) -> tuple[Hashable, Build]:
        """The build identity for `call` and a function that builds the entry.

        The identity alone decides sharing: put in it exactly what changes the built code.
        The default builds one instance of the class, shared by every call that picks it.
        """
        return (), cls
