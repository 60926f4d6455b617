"""The base of every tileops.nn module: a subclass of its torch.nn counterpart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ..errors import OpConfigError
from ._ops import dtype_refusal


class TileModule:
    """Mixin put first in the bases of a tileops.nn module, its torch.nn counterpart last.

    torch's constructor runs unchanged, so arguments, defaults, parameters, buffers, state_dict
    keys, `reset_parameters` and `extra_repr` are torch's own for the installed torch; only
    `forward` differs. Being a subclass keeps `isinstance(m, nn.LayerNorm)` checks in user code
    (weight init, weight-decay groups) working. Such a module holds no state of its own, which
    is what lets `kernelize` swap the class of an existing torch module in place.
    """

    torch_type: ClassVar[type[torch.nn.Module]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if issubclass(cls.__bases__[-1], torch.nn.Module):  # not for mixins such as _BatchNorm
            cls.torch_type = cls.__bases__[-1]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reason = type(self).refusal(self)
        if reason is not None:
            raise OpConfigError(f"tileops.nn.{type(self).__name__}: {reason}")

    @classmethod
    def refusal(cls, module: torch.nn.Module) -> str | None:
        """Why this class cannot serve `module`'s configuration (a `torch_type` instance), or
        None. The constructor raises it; kernelize skips the module with it."""
        return dtype_refusal(module)


def config_refusal(build: Callable[[], object]) -> str | None:
    """The op's own message when constructing it with a module's configuration fails."""
    try:
        build()
    except OpConfigError as exc:
        return str(exc)
    return None
