"""`kernelize`: swap the modules of an existing model for versions that run through tileops.

The swap is in place, by class: each matching module object becomes an instance of a subclass
of its class that holds no state of its own. So the parameters, buffers, hooks, train/eval
mode, device and dtype are the module's own, untouched: optimizers, tied weights and references
held elsewhere keep working, and a module shared by two parents is swapped once.

Two kinds of module are swapped: torch.nn's own types (exactly those of `KERNELIZED`, for their
tileops.nn versions), and the classes of other libraries whose semantics are declared
(`register_module_semantics`; transformers' RMSNorm families are built in), for a subclass
generated per class (see `declared`). With `attention=True`, transformers models also get
`attn_implementation="tileops"` (see `hf_attention`). A subclass of either may override forward
(or its owner may bypass it, as `nn.MultiheadAttention` does with its `out_proj`), so it is
skipped with that reason; so is a module whose configuration the op cannot serve, whose forward
was replaced on the instance (accelerate's hooks do that), or a class transformers names a hub
norm layer that has no declaration. With `fused=True` (the default) transformers' gated MLPs and
the attention's rotary call run through the fused ops too (see `fused_layers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import nn

from ..errors import ArgumentError
from . import hf_attention
from ._base import TileModule
from .activation import Softmax
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .declared import declared_class
from .fused_layers import fused_class
from .linear import Linear
from .normalization import LayerNorm, RMSNorm
from .semantics import ModuleSemantics, declared_semantics, hub_layer_name

KERNELIZED: dict[type[nn.Module], type[TileModule]] = {
    cls.torch_type: cls
    for cls in (RMSNorm, LayerNorm, Softmax, BatchNorm1d, BatchNorm2d, BatchNorm3d, Linear)
}


class Swapped(NamedTuple):
    name: str
    source: type[nn.Module]
    target: type[nn.Module]
    semantics: ModuleSemantics | None = None  # the declaration, for a declared class


class Skipped(NamedTuple):
    name: str
    type: type[nn.Module]
    reason: str


@dataclass
class KernelizeReport:
    """What `kernelize` did: modules swapped and modules of a kernelizable kind left alone."""

    swapped: list[Swapped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    attention: list[str] = field(default_factory=list)  # transformers models set to tileops
    fused: list[Swapped] = field(default_factory=list)  # modules now running fused ops

    def __str__(self) -> str:
        rows = [
            (s.name, _qualname(s.source), _qualname(s.target), str(s.semantics or "type"))
            for s in self.swapped
        ]
        header = ("module", "from", "to", "by")
        text = _table(header, rows, f"swapped {len(rows)} module(s)")
        if self.fused:
            rows = [(s.name, _qualname(s.source), s.target.computes) for s in self.fused]
            text += "\n\n" + _table(("module", "class", "now"), rows, f"fused {len(rows)}")
        if self.skipped:
            rows = [(s.name, _qualname(s.type), s.reason) for s in self.skipped]
            text += "\n\n" + _table(("module", "type", "reason"), rows, f"skipped {len(rows)}")
        if self.attention:
            text += f"\n\nattn_implementation {hf_attention.NAME!r}: {', '.join(self.attention)}"
        return text


def kernelize(
    model: nn.Module,
    *,
    modules: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
    attention: bool = False,
    fused: bool = True,
) -> KernelizeReport:
    """Swap, in place, every module of `model` (itself included) whose class is exactly one of
    `modules` (one class or several; default: every key of `KERNELIZED` and every declared
    class) for its tileops version, and with `attention=True` every transformers model in it to
    `attn_implementation="tileops"` (a process that loads such a model saved must call
    `register_transformers_attention()` before running it, as for any attention function
    registered with transformers); with `fused` (and no `modules` selection), transformers'
    gated MLPs and rotary calls to the fused ops (`report.fused`); return a report of what was
    swapped and what was not."""
    selected = _selected(modules)
    report = KernelizeReport()
    if attention:
        report.attention = _set_attention(model)
    if fused and selected is None:
        _fuse(model, report)
    for name, module in model.named_modules():
        planned = _plan(type(module), selected)
        if planned is None:
            continue
        name = name or "(root)"
        target, reason = planned
        if target is not None and "forward" in module.__dict__:
            reason = "its forward is replaced on the instance (by hooks such as accelerate's)"
        reason = reason or target.refusal(module)
        if reason is None:
            semantics = getattr(target, "semantics", None)
            report.swapped.append(Swapped(name, type(module), target, semantics))
            module.__class__ = target
        else:
            report.skipped.append(Skipped(name, type(module), reason))
    return report


def _fuse(model: nn.Module, report: KernelizeReport) -> None:
    """Swap the modules a fused op serves (transformers' gated MLPs and rotary attention)."""
    for name, module in model.named_modules():
        target = None if isinstance(module, TileModule) else fused_class(type(module))
        if target is None:
            continue
        name = name or "(root)"
        reason = target.refusal(module)
        if reason is None and "forward" in module.__dict__:
            reason = "its forward is replaced on the instance (by hooks such as accelerate's)"
        if reason is None:
            report.fused.append(Swapped(name, type(module), target))
            module.__class__ = target
        else:
            report.skipped.append(Skipped(name, type(module), reason))


def _set_attention(model: nn.Module) -> list[str]:
    """Set the outermost transformers models in `model` (those with `set_attn_implementation`
    whose attention goes through transformers' AttentionInterface) to "tileops"; their
    sub-models follow. Returns their names."""
    done: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") or outer == "" for outer in done):
            continue
        can_set = getattr(module, "_can_set_attn_implementation", None)
        if callable(getattr(module, "set_attn_implementation", None)) and can_set and can_set():
            module.set_attn_implementation(hf_attention.register_transformers_attention())
            done.append(name)
    return [name or "(root)" for name in done]


def _selected(modules: object) -> frozenset[type[nn.Module]] | None:
    """The classes `modules` selects, or None for every class kernelize can serve."""
    if modules is None:
        return None
    chosen = frozenset(_classes(modules))
    unknown = [m for m in chosen if m not in KERNELIZED and declared_semantics(m) is None]
    if unknown:
        names = ", ".join(sorted(_qualname(m) for m in KERNELIZED))
        raise ValueError(
            f"kernelize(): argument 'modules' holds {', '.join(map(repr, unknown))}, which "
            f"tileops.nn cannot replace; pick from {names}, or a class whose semantics are "
            "declared with tileops.nn.register_module_semantics"
        )
    return chosen


def _classes(modules: object) -> list[type]:
    """`modules` as a list of classes: one class, or an iterable of them (a str is neither,
    though it iterates: its letters would name no module)."""
    if isinstance(modules, type):
        return [modules]
    items = None
    if not isinstance(modules, (str, bytes)):
        try:
            items = list(modules)
        except TypeError:
            pass
    if items is None or not all(isinstance(m, type) for m in items):
        raise ArgumentError(
            "kernelize(): argument 'modules' takes a torch.nn module class or an iterable of "
            f"them (e.g. modules=[nn.LayerNorm, nn.Linear]), got {modules!r}"
        )
    return items


def _plan(
    cls: type[nn.Module], selected: frozenset[type[nn.Module]] | None
) -> tuple[type[TileModule] | None, str | None] | None:
    """What to do with a module of class `cls`: (the class to swap it to, None), (None, why it
    is skipped), or None when kernelize has nothing to say about it."""
    if issubclass(cls, TileModule):
        return None  # swapped already
    if selected is None or cls in selected:
        if cls in KERNELIZED:
            return KERNELIZED[cls], None
        semantics = declared_semantics(cls)
        if semantics is not None:
            return declared_class(cls, semantics), None
    base = next((b for b in cls.__mro__[1:] if _served(b, selected)), None)
    if base is not None:
        return None, (
            f"a subclass of {_qualname(base)}: only exact types are swapped (a subclass may "
            "override forward, or its owner may not call it)"
        )
    hub_name = hub_layer_name(cls)
    if hub_name is not None and selected is None:
        return None, (
            f"transformers names it hub kernel layer {hub_name!r}, but no semantics are "
            "declared for it (classes under that name differ in where they round to the input "
            "dtype): declare them with tileops.nn.register_module_semantics"
        )
    return None


def _served(cls: type, selected: frozenset[type[nn.Module]] | None) -> bool:
    """Whether kernelize swaps exactly `cls` under this selection."""
    if selected is not None and cls not in selected:
        return False
    return cls in KERNELIZED or declared_semantics(cls) is not None


def _qualname(cls: type) -> str:
    module = cls.__module__
    if module.startswith("torch.nn"):
        module = "torch.nn"
    elif cls in KERNELIZED.values():
        module = "tileops.nn"
    return f"{module}.{cls.__qualname__}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], title: str) -> str:
    widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
    lines = [title, *(_line(r, widths) for r in (header, tuple("-" * w for w in widths), *rows))]
    return "\n".join(lines)


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
