"""kernelize's fused swaps in transformers models: gated MLPs through `GLUFwdOp`, and the
attention's rotary call through `RotaryFwdOp`, by structure and declared semantics.

As for declared norms (see `declared`), a module's class is swapped in place for a subclass
generated per class, named as the class, that keeps its parameters. A gated MLP's subclass
computes `down_proj(glu(gate_proj(x), up_proj(x), act))`, the activation read per call from
the type of the instance's `act_fn`. An attention class's subclass runs the class's own forward
code, unchanged, with its global `apply_rotary_pos_emb` resolved to tileops' (the function is a
module-level name of the modeling file: rebinding the same code object to other globals serves
it per class, with no copy of the model's code and nothing patched in transformers' modules).

Before a swap, a probe checks that the class's forward (the MLP's, on a small stand-in) or the
declared function (rotary's) still computes what is declared.

The residual add + RMSNorm of a decoder layer is not reached: its adds are written inline in
each decoder layer's forward, which only a copy of that code could change; `AddRMSNorm` and
`add_rms_norm` serve code written for them.
"""

from __future__ import annotations

import copyreg
import functools
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from ..ops.fused.rotary import HEADS_DIM
from ._base import TileModule
from ._ops import SERVED_DTYPES
from ._transformers import GATED_MLPS, ROTARY_FUNCTIONS
from .fused import apply_rotary_pos_emb, glu
from .semantics import dotted_path

ROTARY_NAME = "apply_rotary_pos_emb"
_ACTIVATIONS = "transformers.activations"
_GLU_ACTIVATIONS = {
    f"{_ACTIVATIONS}.SiLUActivation": "silu",
    f"{_ACTIVATIONS}.GELUActivation": "gelu",  # F.gelu, or its erf formula in Python
    f"{_ACTIVATIONS}.GELUTanh": "gelu_tanh",  # F.gelu(approximate="tanh"), or in Python
    f"{_ACTIVATIONS}.NewGELUActivation": "gelu_tanh",
}


def glu_activation(act_fn: object) -> str | None:
    """The GLU activation (`GLUFwdOp`'s `act`) `act_fn` computes, or None (read per call of
    a fused MLP: its class decides, but for torch's GELU, whose `approximate` may change)."""
    cls = type(act_fn)
    if cls is nn.GELU:
        return "gelu_tanh" if act_fn.approximate == "tanh" else "gelu"
    if cls not in _CLASS_ACTIVATIONS:  # a plain dict: Dynamo traces it without a warning
        found = "silu" if cls is nn.SiLU else _GLU_ACTIVATIONS.get(dotted_path(cls))
        _CLASS_ACTIVATIONS[cls] = found
    return _CLASS_ACTIVATIONS[cls]


_CLASS_ACTIVATIONS: dict[type, str | None] = {}


class _Fused(TileModule):
    """Mixin first in the bases of a generated class; the model's class comes last."""

    kind: ClassVar[str]
    computes: ClassVar[str]  # what the generated class runs through which op, for reports

    def __reduce_ex__(self, protocol: int) -> tuple:
        reduced = super().__reduce_ex__(protocol)
        if reduced[0] not in (copyreg.__newobj__, copyreg._reconstructor):
            return reduced
        return (_new_fused, (self.torch_type, self.kind), *reduced[2:])


class FusedMLP(_Fused):
    """A gated MLP whose activation and product run as one `GLUFwdOp`."""

    kind = "gated_mlp"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = glu_activation(self.act_fn)
        if act is None:  # act_fn changed since kernelize: the class's own forward serves it
            return super().forward(x)
        return self.down_proj(glu(self.gate_proj(x), self.up_proj(x), act))

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not isinstance(getattr(module, name, None), nn.Module):
                return f"it has no module {name!r}, as a gated MLP has"
        act = getattr(module, "act_fn", None)
        if glu_activation(act) is None:
            return (
                f"its act_fn is {type(act).__qualname__}, which is none of the GLU activations "
                "(SiLU, GELU, GELU tanh)"
            )
        return super().refusal(module) or _mlp_probe(cls.torch_type, act)


class RotaryAttention(_Fused):
    """An attention class whose forward's `apply_rotary_pos_emb` runs `RotaryFwdOp`."""

    kind = "rotary_attention"

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        function = _rotary_function(cls.torch_type)
        if not _rotary_probe(function):
            return (
                f"its {rotary_path(function)} differs from the op on a probe input: the "
                "function no longer computes what is declared for it"
            )
        return super().refusal(module)


def _mlp_probe(cls: type[nn.Module], act: nn.Module) -> str | None:
    """Why `cls.forward` does not compute the gated MLP with `act` on a probe, or None.

    A declaration names a class, and a library may change what it computes between versions;
    the probe runs the class's forward on a small stand-in holding the same attributes (small
    projections, the instance's act_fn), in float32 on the CPU, once per class and act."""
    key = (cls, type(act), getattr(act, "approximate", None))
    if key not in _MLP_PROBES:
        _MLP_PROBES[key] = _probe_mlp(cls, act)
    return _MLP_PROBES[key]


_MLP_PROBES: dict[tuple, str | None] = {}


def _probe_mlp(cls: type[nn.Module], act: nn.Module) -> str | None:
    generator = torch.Generator().manual_seed(0)
    stand_in = nn.Module()
    for name, (n_in, n_out) in {
        "gate_proj": (8, 12),
        "up_proj": (8, 12),
        "down_proj": (12, 8),
    }.items():
        linear = nn.Linear(n_in, n_out, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n_out, n_in, generator=generator))
        setattr(stand_in, name, linear)
    stand_in.act_fn = act
    x = torch.randn(3, 8, generator=generator)
    with torch.no_grad():
        try:
            theirs = cls.forward(stand_in, x)
        except Exception as exc:  # it reads more than a gated MLP holds
            return (
                f"its forward fails on a plain gated MLP's attributes ({type(exc).__name__}: {exc})"
            )
        ours = stand_in.down_proj(
            glu(stand_in.gate_proj(x), stand_in.up_proj(x), glu_activation(act))
        )
    if not (
        isinstance(theirs, torch.Tensor) and torch.allclose(theirs, ours, rtol=1e-5, atol=1e-5)
    ):
        return (
            "its forward differs from down_proj(act_fn(gate_proj(x)) * up_proj(x)) on a probe "
            "input: the class no longer computes what is declared for it"
        )
    return None


def fused_class(cls: type[nn.Module]) -> type[_Fused] | None:
    """The generated class for `cls`, or None where no fused op applies to it."""
    path = dotted_path(cls)
    if path in GATED_MLPS:
        return _generated(cls, "gated_mlp")
    if _rotary_function(cls) is not None:
        return _generated(cls, "rotary_attention")
    return None


@functools.cache
def _generated(cls: type[nn.Module], kind: str) -> type[_Fused]:
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": cls.__qualname__}
    if kind == "gated_mlp":
        base, what = FusedMLP, "act_fn(gate_proj(x)) * up_proj(x) through GLUFwdOp"
    else:
        base, what = RotaryAttention, f"{ROTARY_NAME} through RotaryFwdOp"
        original = _rotary_function(cls)
        partial = ROTARY_FUNCTIONS[rotary_path(original)]
        replacement = _tileops_rotary(original, partial)
        namespace["forward"] = _rebound(cls.forward, ROTARY_NAME, replacement)
    namespace["__doc__"] = f"`{cls.__qualname__}` computing {what}."
    namespace["computes"] = what
    return type(cls.__name__, (base, cls), namespace)


def _new_fused(cls: type[nn.Module], kind: str) -> _Fused:
    """An empty instance of the generated class, for unpickling."""
    generated = _generated(cls, kind)
    return generated.__new__(generated)


def _rotary_function(cls: type) -> Callable[..., Any] | None:
    """The declared `apply_rotary_pos_emb` `cls.forward` calls by its global name, or None."""
    forward = cls.__dict__.get("forward")
    inner = _innermost(forward)
    if inner is None or ROTARY_NAME not in inner.__code__.co_names:
        return None
    found = inner.__globals__.get(ROTARY_NAME)
    if rotary_path(found) not in ROTARY_FUNCTIONS:
        return None
    return found


def rotary_path(found: object) -> str | None:
    """The dotted path of the function `found` is or calls (`plain_function`), or None."""
    function = plain_function(found)
    return None if function is None else dotted_path(function)


def plain_function(found: object) -> types.FunctionType | None:
    """`found` if it is a function; the function a hub-kernel wrapper calls if it is one (from
    transformers 5.25 a module-level function marked `use_kernel_forward_from_hub` is an
    `nn.Module` instance of the `kernels` package whose forward calls the function held in its
    closure as `func`); else None."""
    if isinstance(found, types.FunctionType):
        return found
    forward = getattr(type(found), "forward", None)
    if not isinstance(found, nn.Module) or not isinstance(forward, types.FunctionType):
        return None
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True))
    held = cells["func"].cell_contents if "func" in cells else None
    return held if isinstance(held, types.FunctionType) else None


@functools.cache
def _rotary_probe(function: Callable[..., Any]) -> bool:
    """Whether the declared `function` computes the op on a probe (float32, GQA heads, tables
    whose halves differ; narrower tables too where it is declared partial): a library may
    change what a function computes between versions."""
    generator = torch.Generator().manual_seed(0)
    widths = (8, 4) if ROTARY_FUNCTIONS[rotary_path(function)] else (8,)
    q, k = (
        torch.randn(2, 4, 3, 8, generator=generator),
        torch.randn(2, 2, 3, 8, generator=generator),
    )
    for rot in widths:
        cos, sin = (
            torch.randn(2, 3, rot, generator=generator),
            torch.randn(2, 3, rot, generator=generator),
        )
        try:
            theirs = function(q, k, cos, sin)
        except Exception:
            return False
        ours = apply_rotary_pos_emb(q, k, cos, sin)
        if not all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(theirs, ours, strict=True)
        ):
            return False
    return True


def _innermost(func: object) -> types.FunctionType | None:
    """The function under `func`'s decorators, where each holds the one it wraps in a closure
    cell (so that `_rebound` can rebuild it around another); else None."""
    while isinstance(func, types.FunctionType) and hasattr(func, "__wrapped__"):
        if not any(_holds(cell, func.__wrapped__) for cell in func.__closure__ or ()):
            return None
        func = func.__wrapped__
    return func if isinstance(func, types.FunctionType) else None


def _rebound(func: types.FunctionType, name: str, value: object) -> types.FunctionType:
    """`func` with global `name` resolved to `value`; through decorators made with
    functools.wraps that hold the function they wrap in a closure cell (`_innermost` checked
    that they all do), rebuilt around it."""
    wrapped = getattr(func, "__wrapped__", None)
    if wrapped is None:
        scope = _scope_module(func, name, value).__dict__
        new = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__,
                                 func.__closure__)  # fmt: skip
    else:
        inner = _rebound(wrapped, name, value)
        cells = tuple(
            types.CellType(inner) if _holds(cell, wrapped) else cell for cell in func.__closure__
        )
        new = types.FunctionType(func.__code__, func.__globals__, func.__name__,
                                 func.__defaults__, cells)  # fmt: skip
    functools.update_wrapper(new, func, updated=())
    new.__kwdefaults__ = func.__kwdefaults__
    new.__dict__.update({k: v for k, v in func.__dict__.items() if k != "__wrapped__"})
    if wrapped is not None:
        new.__wrapped__ = inner
    return new


def _holds(cell: types.CellType, value: object) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _scope_module(func: types.FunctionType, name: str, value: object) -> types.ModuleType:
    """A module of its own holding `func`'s globals with `name` bound to `value`, in
    sys.modules: torch.compile guards a global by importing the module its function's globals
    name, which must hold what the function sees (not the library's own module)."""
    module_name = f"{__name__}.rebound.{func.__module__}.{func.__qualname__}"
    module = types.ModuleType(module_name)
    module.__dict__.update(func.__globals__)
    module.__dict__.update({"__name__": module_name, name: value})
    sys.modules[module_name] = module
    return module


def _tileops_rotary(original: Callable[..., Any], partial: bool) -> Callable[..., Any]:
    """`apply_rotary_pos_emb` through `RotaryFwdOp` where the op serves the call exactly as
    `original` computes it (tables of the inputs' dtype, full-width unless `original` rotates
    partially), else `original`."""

    def rotary(q, k, cos, sin, unsqueeze_dim=1):  # noqa: ANN001, ANN202 (transformers' names)
        if _served(q, k, cos, sin, unsqueeze_dim, partial):
            return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    rotary.__name__ = rotary.__qualname__ = ROTARY_NAME
    rotary.__wrapped__ = original
    return rotary


def _served(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any, partial: bool) -> bool:
    """Whether RotaryFwdOp computes this call as transformers' function does (read per call,
    attribute by attribute: a decode step makes one per layer)."""
    if not (
        isinstance(q, torch.Tensor)
        and isinstance(k, torch.Tensor)
        and isinstance(cos, torch.Tensor)
        and isinstance(sin, torch.Tensor)
        and unsqueeze_dim in HEADS_DIM
    ):
        return False
    dtype, q_shape, k_shape, table = q.dtype, q.shape, k.shape, cos.shape
    if not (k.dtype == cos.dtype == sin.dtype == dtype and dtype in SERVED_DTYPES):
        return False
    if not (len(q_shape) == len(k_shape) == 4 and len(table) == 3 and sin.shape == table):
        return False
    heads = HEADS_DIM[unsqueeze_dim]
    seq, batch = q_shape[3 - heads], q_shape[0]
    rot, head_dim = table[-1], q_shape[-1]
    return (
        (rot == head_dim or (partial and 2 <= rot < head_dim))
        and rot % 2 == 0
        and k_shape[-1] == head_dim
        and k_shape[0] == batch
        and k_shape[3 - heads] == seq
        and table[0] in (1, batch)
        and table[1] in (1, seq)
    )
