"""Declared semantics: which classes of other libraries compute a norm that tileops serves.

Model libraries define their own norm classes (transformers' `LlamaRMSNorm`, `GemmaRMSNorm`,
...) instead of using `torch.nn.RMSNorm`. Their type says nothing about what they compute, and
neither does the layer name transformers gives them for hub kernels (`"RMSNorm"` names classes
that round to the input dtype at different points). A declaration states it, in terms of the
class's own attributes, so that `kernelize` can serve the class by its semantics: which norm,
where eps and the affine parameters live, and where the result is rounded to the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

from torch import nn

from ..errors import ArgumentError
from ._base import TileModule
from ._transformers import BUILTIN

KINDS = ("rms_norm", "layer_norm")
ORDERS = ("cast_then_scale", "scale_then_cast")

# Layer names transformers gives norm classes for hub kernels (kernels'
# `use_kernel_forward_from_hub(name)` records one on the class as `kernel_layer_name`). Such a
# class without a declaration is reported by kernelize instead of passed over in silence.
HUB_NORM_LAYERS = frozenset({"LayerNorm", "RMSNorm", "RMSNormZeroCentered"})


@dataclass(frozen=True)
class ModuleSemantics:
    """What a declared class computes over the last dim of its one input `x`, in terms of its
    attributes (see `register_module_semantics` for each field)."""

    kind: Literal["rms_norm", "layer_norm"]
    eps: str | float
    weight: str | None = None
    bias: str | None = None
    weight_offset: float = 0.0
    order: Literal["cast_then_scale", "scale_then_cast"] | None = None

    def __str__(self) -> str:
        fields = [f"eps={_source(self.eps)}"]
        fields += [f"{f}=.{getattr(self, f)}" for f in ("weight", "bias") if getattr(self, f)]
        if self.weight_offset:
            fields.append(f"weight_offset={self.weight_offset:g}")
        if self.order:
            fields.append(self.order)
        return f"{self.kind}({', '.join(fields)})"


_DECLARED: dict[type[nn.Module] | str, ModuleSemantics] = {}


def register_module_semantics(
    cls: type[nn.Module] | str,
    kind: str,
    *,
    eps: str | float,
    weight: str | None = None,
    bias: str | None = None,
    weight_offset: float = 0.0,
    order: str | None = None,
) -> ModuleSemantics:
    """Declare that instances of `cls` compute the norm `kind` over the last dim of their one
    input, so that `kernelize` swaps them (a later declaration for `cls` replaces this one).

    - `cls`: the module class, or its dotted path `"package.module.QualName"` (declares it
      without importing it).
    - `kind`: `"rms_norm"` (`x / sqrt(mean(x**2) + eps)`) or `"layer_norm"` (mean removed,
      biased variance).
    - `eps`: the name of the attribute holding eps (`"variance_epsilon"`), or a number.
    - `weight`, `bias`: names of the attributes holding the affine parameters (1-D, the last
      dim's size; bias only for layer_norm), or None. An attribute set to None means none.
    - `weight_offset`: the scale is `weight_offset + weight` (Gemma stores `weight` around 0
      and scales by `1 + weight`).
    - `order`, where the result is rounded to the input's dtype (required with a weight):
      `"cast_then_scale"`: `scale * norm(x.float()).to(x.dtype)` (+ bias), in the promoted
      dtype of the scale and x (Llama, Mistral, Qwen2/3, Phi-3); `"scale_then_cast"`:
      `(scale.float() * norm(x.float()) + bias).to(x.dtype)` (Gemma, OLMo 2, torch.nn).
    """
    key = _key(cls)
    semantics = ModuleSemantics(
        kind=_choice("kind", kind, KINDS),
        eps=_eps(eps),
        weight=_attribute("weight", weight),
        bias=_attribute("bias", bias),
        weight_offset=_number("weight_offset", weight_offset),
        order=None if order is None else _choice("order", order, ORDERS),
    )
    _check_consistent(semantics)
    _DECLARED[key] = semantics
    return semantics


def declared_semantics(cls: type) -> ModuleSemantics | None:
    """The semantics declared for exactly `cls` (by class, else by dotted path), or None."""
    declared = _DECLARED.get(cls)
    return declared if declared is not None else _DECLARED.get(dotted_path(cls))


def hub_layer_name(cls: type) -> str | None:
    """The hub kernel layer name transformers marks `cls` with, when it is a norm's."""
    name = getattr(cls, "kernel_layer_name", None)
    return name if name in HUB_NORM_LAYERS else None


def dotted_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _key(cls: object) -> type[nn.Module] | str:
    if isinstance(cls, str):
        module, _, name = cls.rpartition(".")
        if module and name.isidentifier():
            return cls
    elif isinstance(cls, type) and issubclass(cls, nn.Module):
        if cls.__module__.split(".")[0] == "torch" or issubclass(cls, TileModule):
            raise ArgumentError(
                f"register_module_semantics(): argument 'cls' is {dotted_path(cls)}, a torch or "
                "tileops.nn class: kernelize serves torch.nn's own types by type"
            )
        return cls
    raise ArgumentError(
        "register_module_semantics(): argument 'cls' takes a torch.nn.Module subclass or its "
        f"dotted path ('package.module.ClassName'), got {cls!r}"
    )


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ArgumentError(
            f"register_module_semantics(): argument {name!r} must be one of "
            f"{', '.join(map(repr, allowed))}, got {value!r}"
        )
    return value


def _eps(eps: object) -> str | float:
    if isinstance(eps, str) and eps.isidentifier():
        return eps
    if _is_real(eps) and math.isfinite(eps) and eps >= 0:
        return float(eps)
    raise ArgumentError(
        "register_module_semantics(): argument 'eps' takes the name of the attribute holding "
        f"eps or a finite number >= 0, got {eps!r}"
    )


def _attribute(name: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.isidentifier()):
        return value
    raise ArgumentError(
        f"register_module_semantics(): argument {name!r} takes the name of the attribute "
        f"holding the {name}, or None, got {value!r}"
    )


def _number(name: str, value: object) -> float:
    if _is_real(value) and math.isfinite(value):
        return float(value)
    raise ArgumentError(
        f"register_module_semantics(): argument {name!r} must be a finite number, got {value!r}"
    )


def _check_consistent(semantics: ModuleSemantics) -> None:
    problem = None
    if semantics.bias is not None and semantics.kind == "rms_norm":
        problem = "argument 'bias' is for kind='layer_norm'; an RMSNorm has no bias"
    elif semantics.weight is None and semantics.weight_offset:
        problem = "argument 'weight_offset' needs a 'weight' to offset"
    elif (semantics.weight or semantics.bias) and semantics.order is None:
        problem = (
            "argument 'order' is required with affine parameters: 'cast_then_scale' "
            "(scale * norm(x).to(x.dtype), as Llama) or 'scale_then_cast' "
            "((scale * norm(x)).to(x.dtype), as Gemma)"
        )
    if problem:
        raise ArgumentError(f"register_module_semantics(): {problem}")


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _source(eps: str | float) -> str:
    return f".{eps}" if isinstance(eps, str) else f"{eps:g}"


def _declare_builtins() -> None:
    for path, declaration in BUILTIN.items():
        register_module_semantics(path, **declaration)


_declare_builtins()
