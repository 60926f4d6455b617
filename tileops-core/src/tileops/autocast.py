"""What autocast does to an op: whatever it does to the op's torch counterpart.

Autocast's casting lists differ by device type and torch version (CUDA runs layer_norm and
softmax in float32, the CPU leaves them alone, both run matmuls in the lower precision). Rather
than copy those lists, each op asks torch once per autocast state: it runs its torch definition
under the current autocast and reads the result's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .op import Op

_policies: dict[tuple, torch.dtype | None] = {}


def autocast_policy(
    op: Op, device_type: str, tensors: tuple[torch.Tensor | None, ...]
) -> torch.dtype | None:
    """The dtype to cast the op's floating inputs to, or None to leave them as they are."""
    dtypes = tuple(None if t is None else t.dtype for t in tensors)
    key = (type(op), device_type, torch.get_autocast_dtype(device_type), dtypes)
    if key not in _policies:
        _policies[key] = _probe(op, tensors)
    return _policies[key]


def _probe(op: Op, tensors: tuple[torch.Tensor | None, ...]) -> torch.dtype | None:
    written = [spec.written for spec in op.signature.inputs]
    copies = [
        t.clone() if t is not None and w else t for t, w in zip(tensors, written, strict=True)
    ]
    with torch.no_grad():
        out = op.reference_forward(*copies)
    out = out[0] if isinstance(out, tuple) else out
    first = next(t for t in tensors if t is not None)
    return None if out.dtype == first.dtype else out.dtype
