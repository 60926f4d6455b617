"""Launching a Triton program at less host cost than `program[grid](*args, **options)`.

Triton's own launch binds the arguments, specializes each, hashes the specialization into its
cache key and builds launch metadata on every call: host time that a decode step, where every
kernel is a few microseconds of GPU work, pays in full (TUNING.md#launch). `launch`
remembers the compiled kernel under a key that decides Triton's specialization (each tensor's
dtype and whether its address is 16-byte aligned, every other argument's and option's value and
type, the current device) and launches it directly when the key comes again. A new key, the
interpreter, launch hooks (profilers) and a program's pre-run hooks take Triton's own path.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .declare import INTERPRETING

KEYS_PER_PROGRAM = 256
"""Compiled kernels remembered per program; beyond it the program's keys start over."""

_direct: dict[Any, dict[tuple, tuple]] = {}
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)  # C, no Python


def launch(program: Any, grid: Sequence[int], *args: Any, **options: Any) -> None:
    """`program[grid](*args, **options)`: positional runtime arguments, constexprs and
    Triton's options (num_warps, ...) by keyword."""
    if INTERPRETING or _hooked(program):
        program[grid](*args, **options)
        return
    device = _current_device()
    # what Triton specializes an argument on: a tensor's dtype and 16-byte alignment; any
    # other argument's value and type (1, 1.0 and True are equal keys, not one signature)
    facts = [  # ints first: most arguments are (sizes, strides), and isinstance costs more
        a if type(a) is int else (a.dtype, not a.data_ptr() & 15) if isinstance(a, Tensor) else a
        for a in args
    ]
    types = (*map(type, args), *map(type, options.values()))
    key = (device, *facts, *options.items(), *types)
    kernels = _direct.get(program)
    direct = None if kernels is None else kernels.get(key)
    if direct is None:
        _remember(program, key, program[grid](*args, **options), len(args), options)
        return
    run, function, metadata, tail = direct
    stream = torch._C._cuda_getCurrentRawStream(device)
    x, y, z = (*grid, 1, 1)[:3]
    run(x, y, z, stream, function, metadata, None, None, None, *args, *tail)  # no hook to call


def _remember(program: Any, key: tuple, kernel: Any, given: int, options: dict) -> None:
    """Keep what launches `kernel` (the one Triton compiled for `key`) without Triton's path:
    its launcher, function, packed metadata and the values of the parameters after the
    positional ones (constexprs by keyword, else their defaults). Nothing is kept where this
    Triton's compiled kernel lacks those parts."""
    tail = _later_params(program, given, options)
    try:
        direct = (kernel.run, kernel.function, kernel.packed_metadata, tail)
    except AttributeError:
        return
    if tail is None or not callable(direct[0]):
        return
    kernels = _direct.setdefault(program, {})
    if len(kernels) >= KEYS_PER_PROGRAM:
        kernels.clear()
    kernels[key] = direct


def _later_params(program: Any, given: int, options: dict) -> tuple | None:
    """The values of `program`'s parameters after the first `given`, as Triton binds them."""
    try:
        params = list(inspect.signature(program.fn).parameters.values())[given:]
    except (AttributeError, TypeError, ValueError):
        return None
    values = []
    for param in params:
        if param.name in options:
            values.append(options[param.name])
        elif param.default is not inspect.Parameter.empty:
            values.append(param.default)
        else:
            return None
    return tuple(values)


def _hooked(program: Any) -> bool:
    """Whether Triton's own path must run: launch hooks set (a chain of them in newer Triton,
    one callable or None in older), pre-run hooks on the program, or a Triton without knobs."""
    runtime = _runtime()
    return (
        runtime is None
        or _active(runtime.launch_enter_hook)
        or _active(runtime.launch_exit_hook)
        or bool(getattr(program, "pre_run_hooks", None))
    )


@functools.cache
def _runtime() -> Any:
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs.runtime


def _active(hook: Callable[..., Any] | None) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))
