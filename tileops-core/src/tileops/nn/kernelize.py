"""`kernelize`: swap the torch.nn modules of an existing model for their tileops.nn versions.

The swap is in place, by class: each matching module object becomes an instance of its
tileops.nn subclass (which holds no state of its own). So the parameters, buffers, hooks,
train/eval mode, device and dtype are the module's own, untouched: optimizers, tied weights
and references held elsewhere keep working, and a module shared by two parents is swapped once.

Only modules of exactly the listed torch.nn types are swapped. A subclass may override forward
(or its owner may bypass it, as `nn.MultiheadAttention` does with its `out_proj`), so it is
skipped with that reason; so is a module whose configuration the op cannot serve, or whose
forward was replaced on the instance (accelerate's hooks do that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import nn

from ..errors import ArgumentError
from ._base import TileModule
from .activation import Softmax
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .linear import Linear
from .normalization import LayerNorm, RMSNorm

KERNELIZED: dict[type[nn.Module], type[TileModule]] = {
    cls.torch_type: cls
    for cls in (RMSNorm, LayerNorm, Softmax, BatchNorm1d, BatchNorm2d, BatchNorm3d, Linear)
}


class Swapped(NamedTuple):
    name: str
    source: type[nn.Module]
    target: type[nn.Module]


class Skipped(NamedTuple):
    name: str
    type: type[nn.Module]
    reason: str


@dataclass
class KernelizeReport:
    """What `kernelize` did: modules swapped and modules of a kernelizable kind left alone."""

    swapped: list[Swapped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def __str__(self) -> str:
        rows = [(s.name, _qualname(s.source), _qualname(s.target)) for s in self.swapped]
        text = _table(("module", "from", "to"), rows, f"swapped {len(rows)} module(s)")
        if self.skipped:
            rows = [(s.name, _qualname(s.type), s.reason) for s in self.skipped]
            text += "\n\n" + _table(("module", "type", "reason"), rows, f"skipped {len(rows)}")
        return text


def kernelize(
    model: nn.Module,
    *,
    modules: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
) -> KernelizeReport:
    """Swap, in place, every module of `model` (itself included) whose type is exactly one of
    `modules` (one class or several; default: every key of `KERNELIZED`) for its tileops.nn
    version; return a report."""
    selected = _selected(modules)
    report = KernelizeReport()
    for name, module in model.named_modules():
        kind = _kind(type(module), selected)
        if kind is None:
            continue
        name = name or "(root)"
        reason = _refusal(module, kind)
        if reason is None:
            report.swapped.append(Swapped(name, type(module), KERNELIZED[kind]))
            module.__class__ = KERNELIZED[kind]
        else:
            report.skipped.append(Skipped(name, type(module), reason))
    return report


def _selected(modules: object) -> frozenset[type[nn.Module]]:
    if modules is None:
        return frozenset(KERNELIZED)
    chosen = frozenset(_classes(modules))
    unknown = [m for m in chosen if m not in KERNELIZED]
    if unknown:
        names = ", ".join(sorted(_qualname(m) for m in KERNELIZED))
        raise ValueError(
            f"kernelize(): argument 'modules' holds {', '.join(map(repr, unknown))}, which "
            f"tileops.nn cannot replace; pick from {names}"
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


def _kind(cls: type[nn.Module], selected: frozenset[type[nn.Module]]) -> type[nn.Module] | None:
    """The selected torch.nn type `cls` is, or derives from (tileops.nn's own excluded)."""
    if cls in selected:
        return cls
    if issubclass(cls, TileModule):
        return None
    return next((kind for kind in selected if issubclass(cls, kind)), None)


def _refusal(module: nn.Module, kind: type[nn.Module]) -> str | None:
    if type(module) is not kind:
        return (
            f"a subclass of {_qualname(kind)}: only exact types are swapped (a subclass may "
            "override forward, or its owner may not call it)"
        )
    if "forward" in module.__dict__:
        return "its forward is replaced on the instance (by hooks such as accelerate's)"
    return KERNELIZED[kind].refusal(module)


def _qualname(cls: type) -> str:
    module = cls.__module__
    if module.startswith("torch.nn"):
        module = "torch.nn"
    elif module.startswith("tileops.nn"):
        module = "tileops.nn"
    return f"{module}.{cls.__qualname__}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], title: str) -> str:
    widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
    lines = [title, *(_line(r, widths) for r in (header, tuple("-" * w for w in widths), *rows))]
    return "\n".join(lines)


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
