"""Same-run device copies: the baseline every memory-bound figure is a share of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .timing import bench


def copy_moving(nbytes: int) -> Callable[[], Any]:
    """A device-to-device copy that moves `nbytes` in all (half read, half written)."""
    src = torch.empty(nbytes // 4, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_gbps(nbytes: int, rounds: int) -> float:
    """Device-to-device copy bandwidth on `nbytes` (read + write counted), GB/s."""
    return 2 * nbytes / bench(copy_moving(2 * nbytes), rounds) / 1e6
