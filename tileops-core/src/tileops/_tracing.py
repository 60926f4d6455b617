"""Whether tensors are being traced (torch.compile, torch.export): fake or functional tensors,
whose shapes may be symbolic and whose data no kernel can read."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch._subclasses.fake_tensor import is_fake


def is_traced(*groups: Iterable[torch.Tensor | None]) -> bool:
    """True while torch.compile traces, or when any tensor in `groups` is a fake one (what
    AOTAutograd traces a backward with)."""
    if torch.compiler.is_compiling():
        return True
    return any(t is not None and is_fake(t) for group in groups for t in group)
