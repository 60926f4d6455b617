"""Kernel interfaces, the declarations every implementation carries, and their validation.

An interface fixes one call contract (its `forward`). An implementation inherits `Kernel` and
one or more interfaces, and declares where it runs (`devices`, `supported_archs`), which calls
it serves (`refusal`) and whom it beats (`general`, `preferred_over`). The defaults make a lone
implementation need nothing but the inheritance.

Declarations are checked where they are declared: a malformed one fails when the class is
defined, and what depends on the op (which interfaces, `forward`'s arguments) fails when the
class is registered for an op or the op's kernel table is built, before anything lands.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import KernelDeclarationError
from .requirements import Requirements

if TYPE_CHECKING:
    from .callspec import CallSpec

Build = Callable[[], Callable[..., Any]]
_SET_DECLARATIONS = ("devices", "supported_archs", "preferred_over")


class KernelInterface:
    """A place where an op calls a kernel. Subclasses declare `forward(...)`: the contract, and
    `call_spec`: the class of the call specs it is dispatched with. Upstream TileOPs names that
    class `request`; either spelling may be declared, and both read the same class."""

    call_spec: ClassVar[type | None] = None
    request: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_spec, own_request = cls.__dict__.get("call_spec"), cls.__dict__.get("request")
        if own_spec is not None and own_request is not None and own_spec is not own_request:
            raise KernelDeclarationError(
                f"kernel interface {cls.__qualname__!r} declares call_spec = "
                f"{own_spec.__name__} and request = {own_request.__name__}; they name one "
                "class (request is upstream's spelling of call_spec): declare one of them"
            )
        spec = own_spec or own_request or cls.call_spec or cls.request
        cls.call_spec = cls.request = spec

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")


class Kernel:
    """Base of implementations. Calling a kernel calls its `forward`."""

    devices: ClassVar[frozenset[str]] = frozenset({"cuda"})
    supported_archs: ClassVar[frozenset[int] | None] = None
    general: ClassVar[bool] = False
    preferred_over: ClassVar[frozenset[str]] = frozenset()
    deterministic: ClassVar[bool] = True  # False: atomics or split reductions of varying order
    requires: ClassVar[Requirements | None] = None  # what the machine must have to launch it
    torch_native: ClassVar[bool] = False
    """True: `forward` computes its call with torch's own differentiable function, the one the
    op's `native_lane_for` calls on the caller's tensors (cuBLAS through torch.mm, cuDNN
    through torch.batch_norm), and torch's backward of it is as fast as the op's backward
    kernels. Eager autograd calls this kernel serves then run that function under torch's
    autograd: torch's own nodes, no node or backward kernel of the op's (what eager torch
    pays on the host); so do plain calls of ops without a lane of their own. On a backward
    kernel: it computes torch's own backward, so native lanes may pass over it; an op with
    any other backward kernel that is not general (a backend's) takes no native lane, unless
    its forward selection weighs the backward itself (`Op.weighs_backward`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _SET_DECLARATIONS:
            value = cls.__dict__.get(name)
            if isinstance(value, (set, list, tuple)):
                setattr(cls, name, frozenset(value))
            elif isinstance(value, str) and name != "supported_archs":
                setattr(cls, name, frozenset({value}))
        check_declarations(cls, f"kernel class {cls.__qualname__!r}")
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
        The default follows the class's constructor: one that takes the call
        (`__init__(self, call)`, upstream TileOPs' default) is built from each call, the call
        itself its identity; one that takes no argument is built once and shared by every
        call that picks it, identity `()`.
        """
        if takes_the_call(cls):
            return call, lambda: cls(call)
        return (), cls


def takes_the_call(cls: type) -> bool:
    """Whether `cls(call)` is how `cls` is built: its `__init__` takes one positional argument
    besides self (what upstream's default `entry_for` builds with), rather than none."""
    init = cls.__init__
    if init is object.__init__:
        return False
    try:
        params = list(inspect.signature(init).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return len(required) == 1


def check_declarations(cls: type, where: str) -> None:
    """Raise `KernelDeclarationError` (saying `where`) if a declaration of `cls` is malformed."""
    devices = cls.devices
    if not (isinstance(devices, frozenset) and all(isinstance(d, str) for d in devices)):
        raise KernelDeclarationError(
            f"{where}: devices must be a set of device type names such as {{'cuda'}}, "
            f"got {devices!r}"
        )
    archs = cls.supported_archs
    if archs is not None and not (
        isinstance(archs, frozenset)
        and all(isinstance(a, int) and not isinstance(a, bool) for a in archs)
    ):
        raise KernelDeclarationError(
            f"{where}: supported_archs must be None or a set of integers such as {{80, 90}}, "
            f"got {archs!r}"
        )
    preferred = cls.preferred_over
    if not (isinstance(preferred, frozenset) and all(isinstance(k, str) for k in preferred)):
        raise KernelDeclarationError(
            f"{where}: preferred_over must be a set of kernel keys, got {preferred!r}"
        )
    for flag in ("general", "deterministic", "torch_native"):
        if not isinstance(getattr(cls, flag), bool):
            raise KernelDeclarationError(
                f"{where}: {flag} must be True or False, got {getattr(cls, flag)!r}"
            )
    if cls.requires is not None and not isinstance(cls.requires, Requirements):
        raise KernelDeclarationError(
            f"{where}: requires must be a tileops.Requirements or None, got {cls.requires!r}"
        )
    if cls.general and preferred:
        raise KernelDeclarationError(
            f"{where} is general and declares preferred_over {sorted(preferred)}; a general "
            "implementation ranks below every other, so it cannot be preferred over any"
        )
    for method in ("entry_for", "refusal"):
        if not isinstance(inspect.getattr_static(cls, method), classmethod):
            raise KernelDeclarationError(f"{where}: {method} must be a classmethod")


def interfaces_implemented(
    interfaces: dict[str, type[KernelInterface]], cls: Any, where: str
) -> list[str]:
    """The names of `interfaces` that `cls` implements, after checking it can serve them."""
    if not (isinstance(cls, type) and issubclass(cls, Kernel)):
        raise KernelDeclarationError(f"{where} is not a subclass of tileops.Kernel")
    check_declarations(cls, where)  # again: a class may have been changed since its definition
    implemented = [name for name, iface in interfaces.items() if issubclass(cls, iface)]
    if not implemented:
        raise KernelDeclarationError(
            f"{where} implements none of the op's interfaces "
            f"({', '.join(i.__name__ for i in interfaces.values())}); inherit one of them"
        )
    for name in implemented:
        _check_forward(where, cls, interfaces[name])
    return implemented


def _check_forward(where: str, cls: type, interface: type[KernelInterface]) -> None:
    contract = inspect.signature(interface.forward)
    actual = inspect.signature(cls.forward)
    params = list(contract.parameters.values())[1:]  # drop self
    positional = [
        object() for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    by_keyword = {
        p.name: object() for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    keyword_only = {p.name: object() for p in params if p.kind == p.KEYWORD_ONLY}
    for args, kwargs in ((positional, keyword_only), ([], by_keyword)):
        if any(p.kind == p.POSITIONAL_ONLY for p in params) and not args:
            continue
        try:
            actual.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise KernelDeclarationError(
                f"{where}: forward{actual} does not take the arguments of "
                f"{interface.__name__}.forward{contract} ({exc})"
            ) from None
