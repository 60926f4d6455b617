"""Autotuning shared by every kernel family: each build identity is tuned once per process.

A family hands `tuned` its candidate configs and a function that launches one of them on the
caller's tensors; the fastest (median of `triton.testing.do_bench`) is remembered under
(family, build identity), so every entry with that identity, in any op instance, reuses it.
Configs that do not fit the device (too much shared memory, too many registers) are skipped.
Under the interpreter, or with TILEOPS_TRITON_AUTOTUNE=0 (a boolean like every TILEOPS_* flag:
0/false/no/off; a value that is no boolean fails the backend's load, naming the variable),
nothing is timed: the first candidate is taken, which is why families list their rule-based
default first. Triton's own compile cache keeps the binaries on disk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from tileops.backend import env_flag

from .declare import INTERPRETING

Config = TypeVar("Config")

AUTOTUNE = env_flag("TILEOPS_TRITON_AUTOTUNE", default=True)

_best: dict[tuple[str, Hashable], Any] = {}
_lock = threading.Lock()


def tuned(
    family: str, identity: Hashable, configs: Sequence[Config], run: Callable[[Config], Any]
) -> Config:
    """The fastest of `configs` for `identity`, timed with `run` on first need."""
    slot = (family, identity)
    best = _best.get(slot)
    if best is not None:
        return best
    with _lock:
        best = _best.get(slot)
        if best is None:
            timing = AUTOTUNE and not INTERPRETING and len(configs) > 1
            best = _fastest(configs, run) if timing else configs[0]
            _best[slot] = best
    return best


def _fastest(configs: Sequence[Config], run: Callable[[Config], Any]) -> Config:
    from triton.runtime.errors import OutOfResources
    from triton.testing import do_bench

    timed = []
    for config in configs:
        try:
            ms = do_bench(lambda c=config: run(c), warmup=5, rep=25, return_mode="median")
            timed.append((ms, config))
        except OutOfResources:
            continue
    if not timed:
        raise RuntimeError(f"no Triton config fits this device among {list(configs)}")
    return min(timed, key=lambda pair: pair[0])[1]


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def chosen(family: str, identity: Hashable) -> Any:
    """The config `tuned` settled on for `identity`, or None before its first call."""
    return _best.get((family, identity))
